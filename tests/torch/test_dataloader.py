"""fpipe.torch on real DataLoaders: workers forked and spawned, persistent or not.

Spawned workers import torch (about a second each), so the spawn cases use few epochs and
tiny datasets.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import toolz
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

import fpipe
from fpipe.dataset import FileWriter, ListReader, MsgpackReader
from fpipe.image import ImageDecodeError
from fpipe.stream.parallel import _tuner
from fpipe.torch import (
    Compose,
    CompressedToPIL,
    Dataset,
    IterableDataset,
    Samples,
    Shards,
    dict2tuple,
    worker_range,
)

from .conftest import encode, pixels, write_numbers

LOADERS = [
    pytest.param(0, None, False, id="no-workers"),
    pytest.param(2, "fork", False, id="fork"),
    pytest.param(2, "fork", True, id="fork-persistent"),
    pytest.param(2, "spawn", False, id="spawn", marks=pytest.mark.slow),  # 6 worker starts
    pytest.param(2, "spawn", True, id="spawn-persistent"),
]


def loader(dataset, workers: int, context: str | None = None, persistent: bool = False,
           batch_size: int = 4, **options) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                      multiprocessing_context=context if workers else None,
                      persistent_workers=persistent, **options)


def pass_of(data_loader) -> list[int]:
    return [int(x) for batch in data_loader for x in batch["x"]]


def rank_positions(n: int, rank: int, world_size: int, workers: int, epoch: int, even=None) -> list[int]:
    return sorted(i for w in range(max(1, workers))
                  for i in worker_range(n, rank, world_size, w, max(1, workers), epoch, even))


@pytest.mark.parametrize("workers, context, persistent", LOADERS)
def test_every_pass_reads_the_ranks_shard_once_and_epochs_rotate(tmp_path, workers, context, persistent):
    reader = MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 23))
    assert reader.get(5)["x"] == 5 and len(list(reader)) == 23  # the parent reads first
    dataset = IterableDataset(reader, batch_size=4, layout=Shards(rank=1, world_size=2))
    data_loader = loader(dataset, workers, context, persistent)
    epochs = [0, 1, 0]  # two passes advance by themselves, then set_epoch(0) goes back
    for pass_number, epoch in enumerate(epochs):
        if pass_number == 2:
            dataset.set_epoch(0)
        expected = rank_positions(23, 1, 2, workers, epoch)
        assert len(dataset) == len(expected)
        seen = pass_of(data_loader)
        assert sorted(seen) == expected, (pass_number, epoch)


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_across_ranks_every_sample_comes_once_per_epoch(tmp_path, workers, persistent):
    path = write_numbers(tmp_path / "numbers.msgpack", 37)
    ranks = [IterableDataset(MsgpackReader(path), layout=Shards(rank=r, world_size=2)) for r in range(2)]
    loaders = [loader(rank, workers, "fork", persistent, batch_size=5) for rank in ranks]
    for epoch in range(3):
        for rank in ranks:
            rank.set_epoch(epoch)
        passes = [pass_of(each) for each in loaders]
        assert sorted(passes[0] + passes[1]) == list(range(37))
        assert [sorted(p) for p in passes] == [rank_positions(37, r, 2, workers, epoch) for r in range(2)]


def test_a_map_style_dataset_works_in_workers_after_the_parent_has_read(tmp_path):
    reader = MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 200))
    assert [reader.get(i)["x"] for i in (3, 150, 7)] == [3, 150, 7]
    dataset = Dataset(reader, transforms={"x": Compose(abs)})
    for context in ("fork", "spawn"):
        seen = pass_of(loader(dataset, 2, context, shuffle=True, batch_size=16))
        assert sorted(seen) == list(range(200)) and seen != list(range(200))


def _params_by_key(data_loader) -> dict:
    return {key: float(p) for batch in data_loader
            for key, p in zip(batch["key"], batch["__params__"]["p"])}


def draw(_sample) -> dict:
    return {"p": float(fpipe.current_rng().random())}


@pytest.mark.parametrize("kind", ["map", "iterable", "iterable-shuffled"])
def test_seeded_parameters_do_not_depend_on_the_workers(tmp_path, kind):
    reader = MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 40))
    transforms = {"x": Compose(abs)}

    def dataset():
        if kind == "map":
            return Dataset(reader, transforms, draw, samples=Samples(seed=5))
        return IterableDataset(reader, transforms, draw, chunk_size=2,
                               layout=Shards(shuffle=kind.endswith("shuffled"), buffer_samples=4),
                               samples=Samples(seed=5))

    alone = _params_by_key(loader(dataset(), 0))
    shared = _params_by_key(loader(dataset(), 2, "fork", shuffle=kind == "map" or None))
    assert len(alone) == 40 and alone == shared


def test_set_epoch_reaches_persistent_workers_of_a_map_style_dataset(tmp_path):
    reader = MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 24))
    dataset = Dataset(reader, {"x": Compose(abs)}, draw, samples=Samples(seed=9))
    data_loader = loader(dataset, 2, "fork", persistent=True)
    epoch0 = _params_by_key(data_loader)
    dataset.set_epoch(1)
    epoch1 = _params_by_key(data_loader)
    reference = Dataset(reader, {"x": Compose(abs)}, draw, epoch=1, samples=Samples(seed=9))
    assert epoch1 == _params_by_key(loader(reference, 0))
    assert set(epoch0.values()).isdisjoint(epoch1.values())


def _batch_counts(path: str, even, workers: int = 2, batch_size: int = 2) -> list[int]:
    counts = []
    for rank in range(2):
        dataset = IterableDataset(MsgpackReader(path), layout=Shards(rank=rank, world_size=2, even=even))
        counts.append(sum(1 for _ in loader(dataset, workers, "fork", batch_size=batch_size)))
    return counts


def test_even_gives_every_rank_the_same_number_of_batches(tmp_path):
    path = write_numbers(tmp_path / "numbers.msgpack", 43)
    assert _batch_counts(path, None) == [12, 11]  # what would hang DistributedDataParallel
    assert _batch_counts(path, "drop") == [11, 11]
    assert _batch_counts(path, "pad") == [12, 12]


def test_a_workers_error_names_the_sample(tmp_path):
    reader = ListReader([{"key": f"k{i}", "image": b"not an image", "x": i} for i in range(4)])
    dataset = IterableDataset(reader, {"image": Compose(CompressedToPIL())})
    with pytest.raises(ImageDecodeError, match=r"sample \d \(key 'k\d'\), field 'image'"):
        next(iter(loader(dataset, 2, "fork")))


def test_dict2tuple_over_a_data_loader_gives_collated_fields(tmp_path):
    reader = MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 10))
    batches = list(dict2tuple(loader(Dataset(reader), 0), keys=("x", "key")))
    assert [tuple(x.tolist()) for x, _ in batches][:2] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert batches[0][1] == ["0000", "0001", "0002", "0003"]
    assert isinstance(batches[0][0], torch.Tensor)
    assert collections.Counter(map(len, (x for x, _ in batches))) == {4: 2, 2: 1}


class ToTensor:
    """A stand-in for torchvision's ToTensor (torchvision is not a dependency)."""

    def __call__(self, picture):
        return torch.from_numpy(np.array(picture)).permute(2, 0, 1).float().div(255)


def center(picture):
    return picture.crop((1, 1, 7, 7))


@pytest.fixture
def images_path(tmp_path) -> str:
    path = tmp_path / "train.msgpack"
    with FileWriter(path) as writer:
        for i in range(40):
            writer.write({"key": f"{i:03d}", "image": encode(pixels(8, 8, seed=i), "PNG"), "label": i % 4})
    return str(path)


def test_the_dataset_dataloader_example_runs_with_only_the_imports_changed(images_path):
    # datadings.torch.Dataset's example, verbatim but for the imports, the path and the "..."
    path = images_path
    batch_size = 256
    reader = MsgpackReader(path)
    transforms = {'image': Compose(
        CompressedToPIL(),
        center,
        ToTensor(),
    )}
    ds = Dataset(reader, transforms=transforms)
    train = DataLoader(dataset=ds, batch_size=batch_size)
    for epoch in range(3):  # noqa: B007
        for x, y in dict2tuple(tqdm(train)):  # noqa: B007
            pass

    assert x.shape == (40, 3, 6, 6) and y.tolist() == [i % 4 for i in range(40)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
def test_the_iterable_dataset_dataloader_example_runs_with_only_the_imports_changed(images_path):
    # datadings.torch.IterableDataset's example, verbatim but for the imports, the path and "..."
    path = images_path
    batch_size = 256
    reader = MsgpackReader(path)
    transforms = {'image': Compose(
        CompressedToPIL(),
        center,
        ToTensor(),
    )}
    ds = IterableDataset(
        reader,
        transforms=transforms,
        batch_size=batch_size,
    )
    train = DataLoader(
        dataset=ds,
        batch_size=batch_size,
        num_workers=4,
        persistent_workers=True,
    )
    for epoch in range(3):
        print('Epoch', epoch)
        for x, y in dict2tuple(tqdm(train)):  # noqa: B007
            pass

    labels = sorted(int(label) for _, y in dict2tuple(train) for label in y)
    assert labels == sorted(i % 4 for i in range(40)) and x.shape[1:] == (3, 6, 6)


def triple(sample: dict) -> int:
    return 3 * int(sample["x"])


class _TunedPipeline(torch.utils.data.IterableDataset):
    """fpipe's IterableDataset read through an fpipe pipeline of tuned stages, in each
    DataLoader worker; each worker ends with the cores its stages may use."""

    def __init__(self, reader) -> None:
        self.samples = IterableDataset(reader)

    def __iter__(self):
        bounded = fpipe.ParallelOptions(memory_budget=1 << 24)
        stream = toolz.pipe(self.samples, fpipe.threads(triple, n_workers="auto",
                                                        buffer_chunks="auto", options=bounded),
                            fpipe.processes(abs, n_workers="auto",
                                            options=fpipe.ParallelOptions(cpu_budget=1)))
        with stream:
            yield from stream
        yield {"cores": _tuner.default_cpu_budget()}


@pytest.mark.filterwarnings("ignore:.*daemon process")
def test_an_fpipe_pipeline_in_the_workers_takes_auto_and_shares_the_cores(tmp_path):
    reader = MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 40))
    outputs = list(DataLoader(_TunedPipeline(reader), batch_size=None, num_workers=2,
                              multiprocessing_context="fork"))
    values = sorted(int(value) for value in outputs if not isinstance(value, dict))
    assert values == [3 * i for i in range(40)]
    cores = [value["cores"] for value in outputs if isinstance(value, dict)]
    assert cores == [max(1.0, _tuner.default_cpu_budget() / 2)] * 2
