"""fpipe.torch in one process: datadings's API and examples, transforms, seeds, shards, epochs.

DataLoader workers are simulated here by patching ``get_worker_info``; test_dataloader.py runs
real ones.
"""

from __future__ import annotations

import functools
import pickle
import random
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.utils.data

import fpipe
import fpipe.functional
from fpipe.dataset import ListReader
from fpipe.orderings.order import QuasiShuffler, Range, Shuffler
from fpipe.torch import (
    Compose,
    CompressedToPIL,
    Dataset,
    DatasetBase,
    IterableDataset,
    Samples,
    Shards,
    dict2tuple,
    no_rng,
    worker_range,
)


@pytest.fixture
def as_worker(monkeypatch):
    """``as_worker(w, k)`` makes this process look like DataLoader worker ``w`` of ``k``."""
    def pretend(worker: int, workers: int) -> None:
        info = SimpleNamespace(id=worker, num_workers=workers)
        monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
    return pretend


def xs(stream) -> list[int]:
    return [sample["x"] for sample in stream]


def number_reader(n: int) -> ListReader:
    return ListReader([{"key": f"{i:04d}", "x": i} for i in range(n)])


# --- datadings's API and the examples of its documentation --------------------------------------

def test_the_compose_dataset_example_runs_with_only_the_imports_changed(capsys):
    # datadings.torch.Compose's example, verbatim but for the imports
    from fpipe.dataset import ListReader
    from fpipe.torch import Compose, Dataset

    def add(v, number):
        return v + number

    def sub(x, value):
        return x - value

    def rng(_):
        return {
            'number': random.randrange(1, 10),
            'value': random.randrange(1, 10),
        }

    samples = [{'a': 0, 'b': 0, 'c': 0} for _ in range(10)]
    reader = ListReader(samples)
    transforms = {
        'a': Compose(add),
        'b': Compose(sub),
        'c': Compose((add, sub)),
    }
    dataset = Dataset(reader, transforms=transforms, rng=rng)
    for i in range(len(dataset)):
        print(dataset[i])

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10
    for i, line in enumerate(lines):
        sample = eval(line)
        params = sample["__params__"]
        assert sample["key"] == i
        assert (sample["a"], sample["b"], sample["c"]) == (
            params["number"], -params["value"], params["number"] - params["value"])


def test_compose_is_the_functional_compose_and_its_prefix_works_in_a_dataset():
    assert Compose is fpipe.functional.Compose

    def resize(value, size):
        return value * size

    reader = ListReader([{"image": 1, "mask": 1}])
    transforms = {"image": Compose(resize), "mask": Compose(resize, prefix="mask_")}
    dataset = Dataset(reader, transforms, rng=lambda _: {"size": 3, "mask_size": 5})
    assert (dataset[0]["image"], dataset[0]["mask"]) == (3, 5)


def test_a_missing_parameter_is_a_key_error_naming_it_and_the_sample():
    dataset = Dataset(ListReader([{"key": "only", "a": 1}]), {"a": Compose(lambda v, number: v)})
    with pytest.raises(KeyError, match="number") as raised:
        dataset[0]
    assert "raised while transforming sample 0 (key 'only'), field 'a'" in raised.value.__notes__


def test_transforms_can_be_one_callable_over_the_sample():
    def double(sample):
        return {**sample, "x": sample["x"] * 2}

    dataset = Dataset(number_reader(3), transforms=double)
    assert dataset[2] == {"key": "0002", "x": 4}
    assert xs(IterableDataset(number_reader(3), transforms=double)) == [0, 2, 4]


def test_without_transforms_samples_pass_unchanged():
    assert Dataset(number_reader(3))[1] == {"key": "0001", "x": 1}
    assert no_rng({"anything": 1}) == {}


def test_dict2tuple_picks_the_fields_of_each_sample():
    samples = [{"image": "i0", "label": 0, "key": "a"}, {"image": "i1", "label": 1, "key": "b"}]
    assert list(dict2tuple(samples)) == [("i0", 0), ("i1", 1)]
    assert list(dict2tuple(samples, keys=("key",))) == [("a",), ("b",)]


def test_dataset_base_is_a_base_of_both_datasets():
    assert issubclass(Dataset, DatasetBase) and issubclass(IterableDataset, DatasetBase)
    assert issubclass(Dataset, torch.utils.data.Dataset)
    assert issubclass(IterableDataset, torch.utils.data.IterableDataset)
    assert len(DatasetBase(number_reader(4))) == 4


@pytest.mark.parametrize("bad, error, message", [
    ({"transforms": 3}, TypeError, "transforms must be a dict of callables"),
    ({"transforms": {"x": 3}}, TypeError, r"transforms\['x'\] must be callable"),
    ({"rng": "nope"}, TypeError, "rng must be callable"),
    ({"epoch": -1}, ValueError, "epoch must be >= 0"),
    ({"samples": {"seed": 1}}, TypeError, r"samples must be Samples\(...\); got samples=\{'seed': 1\}"),
])
def test_bad_arguments_of_both_datasets_fail_at_construction(bad, error, message):
    for cls in (Dataset, IterableDataset):
        with pytest.raises(error, match=message):
            cls(number_reader(2), **bad)


@pytest.mark.parametrize("bad, error, message", [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    ({"chunk_size": 0}, ValueError, "chunk_size must be >= 1"),
    ({"layout": True}, TypeError, r"layout must be Shards\(...\) or Elastic\(...\); got layout=True"),
])  # the options' own checks: tests/torch/test_options.py
def test_bad_arguments_of_the_iterable_dataset_fail_at_construction(bad, error, message):
    with pytest.raises(error, match=message):
        IterableDataset(number_reader(2), **bad)


def test_readers_without_the_needed_access_are_refused():
    with pytest.raises(TypeError, match="Dataset needs random access"):
        Dataset(QuasiShuffler(number_reader(5), seed=0))
    with pytest.raises(TypeError, match="with iter"):
        IterableDataset([1, 2, 3])


@pytest.mark.parametrize("path", ["train.msgpack", b"train.msgpack", Path("train.msgpack"),
                                  "s3://bucket/train.msgpack"])
def test_a_path_for_the_reader_says_to_pass_a_msgpack_reader(path):
    """Regression: ``Dataset("train.msgpack")`` suggested IterableDataset, and
    ``IterableDataset("train.msgpack")`` said only that a reader needs ``iter``."""
    for cls in (Dataset, IterableDataset, DatasetBase):
        with pytest.raises(TypeError, match=rf"{cls.__name__} takes a reader, not a path; "
                                            rf"pass MsgpackReader\({re.escape(repr(path))}\)"):
            cls(path)


def _one_argument(value):
    return value


@pytest.mark.parametrize("transform", [_one_argument, abs, lambda value: value,
                                       functools.partial(divmod, 7), CompressedToPIL()])
def test_a_field_transform_of_the_value_alone_is_refused_at_construction(transform):
    """Regression: it failed at the first sample with "takes 1 positional argument but 2 were
    given"; the message now says how field transforms are called, and to wrap in Compose."""
    for cls in (Dataset, IterableDataset):
        with pytest.raises(TypeError, match=r"transforms\['x'\] is called as f\(value, params\), "
                                            r"but .* takes .*; wrap .* in Compose"):
            cls(number_reader(2), transforms={"x": transform})
    assert Dataset(number_reader(2), transforms={"x": Compose(transform)}) is not None


def test_a_field_transform_without_a_signature_gets_the_hint_when_its_call_fails():
    """``int`` has no signature to check: its call fails at the first sample, and the error
    says how field transforms are called; an error inside a transform's body gets no hint."""
    with pytest.raises(TypeError) as raised:
        Dataset(number_reader(2), transforms={"x": int})[0]
    assert "transforms['x'] is called as f(value, params); wrap" in "\n".join(raised.value.__notes__)

    def broken(value, params):
        return int(value, params)
    with pytest.raises(TypeError) as raised:
        Dataset(number_reader(2), transforms={"x": broken})[0]
    assert not any("is called as" in note for note in raised.value.__notes__)


def test_get_worker_info_is_torch_s_as_datadings_re_exports_it():
    from fpipe.torch import get_worker_info

    assert get_worker_info is torch.utils.data.get_worker_info and get_worker_info() is None


def test_importing_without_torch_names_the_extra_to_install():
    code = "import sys; sys.modules['torch'] = None; import fpipe.torch"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "pip install 'fpipe[torch]'" in result.stderr


def test_datasets_pickle_and_a_pickled_copy_keeps_its_own_epoch():
    dataset = IterableDataset(number_reader(6), transforms={"x": Compose(abs)}, epoch=2,
                              layout=Shards(rank=0, world_size=2))
    copy = pickle.loads(pickle.dumps(dataset))
    copy.set_epoch(5)
    assert (dataset.epoch, copy.epoch) == (2, 5)
    assert xs(copy) == [3, 4, 5]
    assert repr(dataset) == "IterableDataset(ListReader, layout=Shards(rank=0, world_size=2))".replace(
        "ListReader", repr(dataset.reader))


# --- seeds: parameters reproducible per sample -----------------------------------------------------

def draw(_sample) -> dict:
    return {"p": float(fpipe.current_rng().random())}


def keep_params(sample):
    return sample["__params__"]["p"]


def test_a_seeded_dataset_draws_the_same_parameters_per_index_in_any_order():
    first = Dataset(number_reader(8), {"x": Compose(abs)}, draw, samples=Samples(seed=7))
    again = Dataset(number_reader(8), {"x": Compose(abs)}, draw, samples=Samples(seed=7))
    forward = [keep_params(first[i]) for i in range(8)]
    assert [keep_params(again[i]) for i in reversed(range(8))] == forward[::-1]
    assert [keep_params(s) for s in again.__getitems__([5, 1, 2])] == [forward[i] for i in (5, 1, 2)]
    assert len(set(forward)) == 8
    again.set_epoch(1)
    assert [keep_params(again[i]) for i in range(8)] != forward


def test_an_unseeded_dataset_draws_fresh_parameters():
    dataset = Dataset(number_reader(2), {"x": Compose(abs)}, draw)
    assert keep_params(dataset[0]) != keep_params(dataset[0])


def test_seeded_transforms_draw_from_the_item_generator_too():
    flip = fpipe.random_apply(0.5, lambda x: -x)
    dataset = Dataset(number_reader(64), {"x": Compose(lambda x: x + 1, flip)}, samples=Samples(seed=3))
    signs = [dataset[i]["x"] > 0 for i in range(64)]
    assert signs == [dataset[i]["x"] > 0 for i in range(64)]
    assert 0 < sum(signs) < 64


def test_an_iterable_dataset_gives_each_sample_its_parameters_whatever_the_sharding(as_worker):
    def params_by_key(workers: int, world_size: int, shuffle: bool) -> dict:
        found = {}
        for rank in range(world_size):
            for worker in range(workers):
                as_worker(worker, workers)
                layout = Shards(rank=rank, world_size=world_size, shuffle=shuffle,
                                buffer_samples=8)
                dataset = IterableDataset(number_reader(30), {"x": Compose(abs)}, draw, chunk_size=4,
                                          layout=layout, samples=Samples(seed=11))
                found.update((s["key"], keep_params(s)) for s in dataset)
        return found

    reference = params_by_key(1, 1, False)
    assert len(reference) == 30
    assert params_by_key(3, 2, False) == reference
    assert params_by_key(2, 2, True) == reference


# --- map-style dataset over readers and orderings -------------------------------------------------

def test_getitems_reads_runs_and_scattered_indices_alike():
    dataset = Dataset(number_reader(20))
    for indices in ([3, 4, 5, 6], [9, 2, 2, 17], [0, 2, 1, 3], [-1, 0], [7]):
        assert dataset.__getitems__(indices) == [dataset[i] for i in indices]


def test_a_negative_index_counts_from_the_end_and_seeds_as_its_position():
    dataset = Dataset(number_reader(5), {"x": Compose(abs)}, draw, samples=Samples(seed=1))
    assert keep_params(dataset[-1]) == keep_params(dataset[4])


def test_a_map_style_dataset_reads_an_ordering_at_its_epoch():
    shuffler = Shuffler(number_reader(10), seed=4)
    dataset = Dataset(shuffler)
    epoch0 = [dataset[i]["x"] for i in range(10)]
    dataset.set_epoch(1)
    epoch1 = [dataset[i]["x"] for i in range(10)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 == xs(Shuffler(number_reader(10), seed=4))
    assert epoch0 != epoch1
    assert [s["x"] for s in Dataset(Range(number_reader(10), 6)).__getitems__([0, 1, 3])] == [6, 7, 9]


# --- sharding: the layout of worker_range ---------------------------------------------------------

def test_worker_ranges_partition_every_epoch_and_a_rank_reads_the_same_for_any_worker_count():
    for n in (0, 1, 5, 23, 100):
        for world_size in (1, 2, 3):
            for workers in (1, 2, 4):
                for epoch in (0, 1, 2):
                    ranges = [worker_range(n, r, world_size, w, workers, epoch)
                              for r in range(world_size) for w in range(workers)]
                    assert sorted(i for r in ranges for i in r) == list(range(n))
                    for rank in range(world_size):
                        joined = [i for w in range(workers)
                                  for i in worker_range(n, rank, world_size, w, workers, epoch)]
                        assert joined == list(worker_range(n, rank, world_size, 0, 1, epoch))


def test_worker_ranges_are_datadings_shards_computed_exactly(monkeypatch):
    import datadings.torch

    def exact(numerator, denominator):
        q, r = divmod(numerator, denominator)
        return q + (2 * r > denominator or (2 * r == denominator and q % 2 == 1))

    agreed = 0
    for n in (0, 1, 7, 10, 15, 98, 1000, 1001):
        for world_size in (1, 2, 3):
            for workers in (1, 2, 3, 4):
                shards = world_size * workers
                for rank in range(world_size):
                    for worker in range(workers):
                        info = SimpleNamespace(id=worker, num_workers=workers)
                        monkeypatch.setattr(datadings.torch, "get_worker_info", lambda info=info: info)
                        theirs = datadings.torch.IterableDataset(number_reader(1))
                        theirs.reader, theirs.rank, theirs.world_size = range(n), rank, world_size
                        for epoch in (0, 1):
                            theirs.epoch = epoch
                            ours = worker_range(n, rank, world_size, worker, workers, epoch)
                            start, stop = theirs._start_stop()
                            # datadings multiplies the float n / S, which can miss an exact half
                            j = ((rank + epoch) % world_size) * workers + worker
                            floats = [round(n / shards * k) for k in (j, j + 1)]
                            if floats == [exact(n * j, shards), exact(n * (j + 1), shards)]:
                                assert (ours.start, ours.stop) == (start, stop)
                                agreed += 1
    assert agreed > 500


def test_the_notes_examples_of_the_shard_layout():
    assert [worker_range(10, r, 2, w, 2) for r in range(2) for w in range(2)] == [
        range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    assert [worker_range(10, r, 2, w, 2, epoch=1) for r in range(2) for w in range(2)] == [
        range(5, 8), range(8, 10), range(0, 2), range(2, 5)]
    assert [worker_range(10, 0, 1, w, 3) for w in range(3)] == [range(0, 3), range(3, 7), range(7, 10)]


@pytest.mark.parametrize("even", ["drop", "pad"])
def test_even_gives_every_rank_the_same_pieces(even):
    for n in (0, 1, 5, 23, 101):
        for world_size in (1, 2, 3, 4):
            for workers in (1, 2, 3):
                lengths = {tuple(len(worker_range(n, r, world_size, w, workers, 1, even))
                                 for w in range(workers)) for r in range(world_size)}
                assert len(lengths) == 1
                per_rank = sum(lengths.pop())
                assert per_rank == (n // world_size if even == "drop" else -(-n // world_size))
                covered = {i for r in range(world_size) for w in range(workers)
                           for i in worker_range(n, r, world_size, w, workers, 0, even)}
                assert covered <= set(range(n))
                if even == "pad":
                    assert covered == set(range(n))


def test_worker_range_checks_its_arguments():
    with pytest.raises(ValueError, match="need rank < world_size"):
        worker_range(10, 2, 2)
    with pytest.raises(ValueError, match="worker < num_workers"):
        worker_range(10, 0, 1, 3, 3)
    with pytest.raises(TypeError, match="n must be an integer"):
        worker_range(1.5)
    with pytest.raises(ValueError, match="even must be"):
        worker_range(10, even="both")


# --- the iterable dataset: shards, epochs, length, the guard ---------------------------------------

def test_ranks_rotate_through_the_shards_from_pass_to_pass():
    ranks = [IterableDataset(number_reader(11), layout=Shards(rank=r, world_size=2)) for r in range(2)]
    first = [xs(rank) for rank in ranks]
    second = [xs(rank) for rank in ranks]
    assert first == [list(range(0, 6)), list(range(6, 11))]
    assert second == first[::-1]
    assert [rank.epoch for rank in ranks] == [0, 0]  # the epoch last set; passes count on top


def test_set_epoch_chooses_the_epoch_of_the_next_pass():
    dataset = IterableDataset(number_reader(11), epoch=1, layout=Shards(rank=0, world_size=2))
    assert xs(dataset) == list(range(6, 11))
    dataset.set_epoch(0)
    assert len(dataset) == 6
    assert xs(dataset) == list(range(0, 6))
    dataset.set_epoch(3)
    assert xs(dataset) == xs(IterableDataset(number_reader(11), epoch=3,
                                             layout=Shards(rank=0, world_size=2)))
    dataset.epoch = 0  # datadings code sets the attribute
    assert xs(dataset) == list(range(0, 6))


def test_len_is_what_the_calling_process_yields_next(as_worker):
    dataset = IterableDataset(number_reader(23), layout=Shards(rank=1, world_size=2))
    for _ in range(3):
        expected = len(dataset)
        assert len(xs(dataset)) == expected
    as_worker(1, 3)
    worker = IterableDataset(number_reader(23), layout=Shards(rank=1, world_size=2))
    assert len(worker) == len(xs(worker)) == len(worker_range(23, 1, 2, 1, 3))


def test_empty_shards_yield_nothing(as_worker):
    seen = []
    for worker in range(4):
        as_worker(worker, 4)
        dataset = IterableDataset(number_reader(2), layout=Shards(rank=0, world_size=1))
        seen.append(xs(dataset))
    assert sorted(x for shard in seen for x in shard) == [0, 1]
    assert [] in seen
    assert xs(IterableDataset(number_reader(0))) == []


@pytest.mark.parametrize("n", [98, 100, 96])
def test_batch_size_cuts_the_worker_shards_on_whole_batches(as_worker, n):
    # datadings refuses n=98 with 3 workers and batch size 8 (its guard: a worker would make a
    # batch more than len(DataLoader) counts); cut on whole batches, every n works, and the
    # workers together make the ceil(n / 8) batches that the DataLoader computes
    shards = []
    for worker in range(3):
        as_worker(worker, 3)
        shards.append(xs(IterableDataset(number_reader(n), batch_size=8)))
    assert sum(shards, []) == list(range(n))
    assert sum(-(-len(shard) // 8) for shard in shards) == -(-n // 8)
    assert [len(shard) % 8 for shard in shards[:-1]] == [0, 0]
    evened = IterableDataset(number_reader(n), batch_size=8, layout=Shards(even="drop"))
    assert len(xs(evened)) == len(worker_range(n, 0, 1, 2, 3, even="drop", batch_size=8))


def test_an_ordering_gives_decoded_samples_read_at_the_datasets_epoch(as_worker):
    reader = number_reader(20)
    for ordering in (Shuffler(reader, seed=5), QuasiShuffler(reader, buf_size=4, chunk_size=2, seed=5)):
        for epoch in (0, 1):
            reference = type(ordering)(**_same_arguments(ordering))
            reference.set_epoch(epoch)
            expected = xs(reference)
            parts = []
            for worker in range(3):
                as_worker(worker, 3)
                parts.append(xs(IterableDataset(ordering, epoch=epoch)))
            assert sum(parts, []) == expected
            assert sorted(expected) == list(range(20))


def _same_arguments(ordering) -> dict:
    if isinstance(ordering, QuasiShuffler):
        return {"reader": ordering.reader, "buf_size": ordering.buffer_size,
                "chunk_size": ordering.chunk_size, "seed": ordering.seed}
    return {"reader": ordering.reader, "seed": ordering.seed}


def test_shuffle_permutes_each_shard_differently_every_epoch_and_reproducibly(as_worker):
    def shards(epoch: int, seed: int) -> list[list[int]]:
        found = []
        for worker in range(2):
            as_worker(worker, 2)
            found.append(xs(IterableDataset(number_reader(40), chunk_size=3, epoch=epoch,
                                            layout=Shards(shuffle=True, buffer_samples=6),
                                            samples=Samples(seed=seed))))
        return found

    epoch0, epoch1 = shards(0, seed=1), shards(1, seed=1)
    for shard, window in zip(epoch0, (range(0, 20), range(20, 40))):
        assert sorted(shard) == list(window) and shard != list(window)
    assert [sorted(s) for s in epoch1] == [sorted(s) for s in epoch0]
    assert epoch1 != epoch0
    assert shards(0, seed=1) == epoch0
    assert shards(0, seed=2) != epoch0
