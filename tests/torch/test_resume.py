"""IterableDataset.resume on real DataLoaders: a pass resumed after ``done`` batches gives the
uninterrupted pass's batches from ``done`` on, reads none of the skipped samples, and the pass
after it is whole."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import fpipe
from fpipe.dataset import ListReader
from fpipe.torch import Compose, IterableDataset, Samples, Shards


class Counted:
    """A reader that counts, in shared memory, how often each position is read."""

    def __init__(self, n: int, random_access: bool = True) -> None:
        self.reader = ListReader([{"x": i} for i in range(n)])
        self.reads = torch.zeros(n, dtype=torch.int64).share_memory_()
        if random_access:
            self.get = self._get

    def __len__(self) -> int:
        return len(self.reader)

    def iter(self, start=None, stop=None, copy=True, chunk_size=16, **options):
        window = range(len(self))[start:stop]
        samples = self.reader.iter(window.start, window.stop, copy=copy, chunk_size=chunk_size)
        for index, sample in zip(window, samples):
            self.reads[index] += 1
            yield sample

    def _get(self, index, **options):
        self.reads[index] += 1
        return self.reader.get(index)


def draw(_sample) -> dict:
    return {"p": float(fpipe.current_rng().random())}


def batches_of(data_loader) -> list[tuple]:
    return [(tuple(batch["x"].tolist()), tuple(batch["__params__"]["p"].tolist()))
            for batch in data_loader]


def make(reader, shuffle: bool, even) -> IterableDataset:
    # rank 1 of 2 holds 25 samples: 12 and 13 for 2 workers, uneven batch counts for 4
    return IterableDataset(reader, {"x": Compose(abs)}, draw, chunk_size=3,
                           layout=Shards(rank=1, world_size=2, even=even, shuffle=shuffle, buffer_samples=5),
                           samples=Samples(seed=5))


LOADERS = [
    pytest.param(0, False, id="no-workers"),
    pytest.param(1, False, id="1-worker"),
    pytest.param(2, False, id="2-workers"),
    pytest.param(2, True, id="2-workers-persistent"),
]
# every pair of values of (shuffle, drop_last, even) in four combinations
OPTIONS = [(False, False, None), (True, True, None), (False, True, "drop"), (True, False, "drop")]


@pytest.mark.parametrize("shuffle, drop_last, even", OPTIONS)
@pytest.mark.parametrize("workers, persistent", LOADERS)
def test_a_resumed_pass_gives_the_rest_of_the_epoch_and_reads_only_that(
        workers, persistent, shuffle, drop_last, even):
    reader = Counted(51 if even else 50)
    dataset = make(reader, shuffle, even)
    data_loader = DataLoader(dataset, batch_size=4, drop_last=drop_last, num_workers=workers,
                             multiprocessing_context="fork" if workers else None,
                             persistent_workers=persistent)
    original, following = batches_of(data_loader), batches_of(data_loader)   # epochs 0 and 1
    total = len(original)
    for done in (3, 0, total - 1, total, total + 2):
        dataset.set_epoch(0)
        dataset.resume(done, batch_size=4, drop_last=drop_last)
        reader.reads.zero_()
        assert batches_of(data_loader) == original[done:], done
        skipped = [x for xs, _ in original[:done] for x in xs]
        assert reader.reads[skipped].sum() == 0 and reader.reads.max() <= 1
        if done == 3:
            assert batches_of(data_loader) == following       # the next pass is whole
    assert batches_of(data_loader) == following


def test_the_resume_reaches_spawned_persistent_workers():
    dataset = make(Counted(50), shuffle=True, even=None)
    data_loader = DataLoader(dataset, batch_size=3, num_workers=2, multiprocessing_context="spawn",
                             persistent_workers=True)
    original = batches_of(data_loader)
    dataset.set_epoch(0)
    dataset.resume(5, batch_size=3)
    assert batches_of(data_loader) == original[5:]
    dataset.set_epoch(0)
    assert batches_of(data_loader) == original


def test_len_in_the_main_process_is_what_it_yields_in_the_resumed_pass():
    dataset = IterableDataset(ListReader([{"x": i} for i in range(10)]))
    dataset.resume(2, batch_size=4)
    assert len(dataset) == 2 == len(list(dataset))
    dataset.resume(3, batch_size=4)
    assert len(dataset) == 0 == len(list(dataset))
    assert len(dataset) == 10


def test_a_shuffled_reader_without_random_access_reads_up_to_the_resume():
    reader = Counted(50, random_access=False)
    dataset = make(reader, shuffle=True, even=None)
    original = batches_of(DataLoader(dataset, batch_size=4))
    dataset.set_epoch(0)
    dataset.resume(3, batch_size=4)
    assert batches_of(DataLoader(dataset, batch_size=4)) == original[3:]


def test_resume_checks_its_arguments_eagerly():
    dataset = IterableDataset(ListReader([{"x": 1}]))
    with pytest.raises(ValueError, match="batches must be >= 0; got batches=-1"):
        dataset.resume(-1, 4)
    with pytest.raises(TypeError, match="batches must be an integer"):
        dataset.resume(1.0, 4)
    with pytest.raises(ValueError, match="batch_size must be >= 1; got batch_size=0"):
        dataset.resume(1, 0)
    with pytest.raises(TypeError, match="drop_last must be True or False; got drop_last='yes'"):
        dataset.resume(1, 4, drop_last="yes")
