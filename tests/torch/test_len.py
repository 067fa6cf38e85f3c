"""``len(DataLoader)`` is the number of batches the DataLoader yields, for every adapter,
with any number of workers: each worker batches its own shard, so the workers' short last
batches must add up to what the DataLoader computes from ``len(dataset)``."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from fpipe.dataset import ListReader
from fpipe.torch import Dataset, Elastic, ElasticBatchSampler, IterableDataset, Samples, Shards

MODES = {
    "plain": {"layout": Shards(rank=1, world_size=2)},
    "shuffle": {"layout": Shards(rank=1, world_size=2, shuffle=True, buffer_samples=4),
                "samples": Samples(seed=0), "chunk_size": 2},
    "even-drop": {"layout": Shards(rank=2, world_size=3, even="drop")},
    "even-pad": {"layout": Shards(rank=2, world_size=3, even="pad")},
    "elastic": {"layout": Elastic(rank=1, world_size=2)},
    "elastic-pad": {"layout": Elastic(rank=2, world_size=3, even="pad")},
}


def _reader(n: int) -> ListReader:
    return ListReader([{"x": i} for i in range(n)])


def _loader(dataset, workers: int, batch_size: int, drop_last: bool = False) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, drop_last=drop_last,
                      multiprocessing_context="fork" if workers else None)


def _counted(loader: DataLoader) -> tuple[int, int]:
    """``len(loader)``, then the batches it yields."""
    return len(loader), sum(1 for _ in loader)


# 46 samples: rank shards of 23 (16 with even over 3 ranks, 15 or 16 by pad/drop); with batch
# size 4 no shard divides, with 23 samples and a batch size that cuts the shards into whole
# batches some do
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", MODES)
def test_len_of_a_loader_over_an_iterable_dataset_is_the_batches_it_yields(mode, workers):
    for n, batch_size in ((46, 4), (46, 5), (24, 3), (13, 2)):
        for known in (True, False) if "elastic" not in mode else (True,):
            options = {**MODES[mode], "batch_size": batch_size if known else None}
            dataset = IterableDataset(_reader(n), **options)
            for drop_last in (False, True):
                lengths = _counted(_loader(dataset, workers, batch_size, drop_last))
                assert lengths[0] == lengths[1], (n, batch_size, known, drop_last)


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("known", [True, False])
def test_len_counts_the_batches_a_resumed_pass_has_left(workers, known):
    dataset = IterableDataset(_reader(46), batch_size=4 if known else None,
                              layout=Shards(rank=1, world_size=2, shuffle=True), samples=Samples(seed=0))
    whole = _counted(_loader(dataset, workers, 4))
    dataset.set_epoch(0)
    dataset.resume(2, batch_size=4)
    assert _counted(_loader(dataset, workers, 4)) == (whole[0] - 2, whole[1] - 2)


def test_the_issues_loader_has_the_len_it_yields():
    # 2,000 samples, batch size 32, two workers: torch computed 63 batches, the workers made 64
    dataset = IterableDataset(_reader(2000), layout=Shards(shuffle=True), samples=Samples(seed=0))
    assert _counted(_loader(dataset, 2, 32)) == (64, 64)
    cut = IterableDataset(_reader(2000), batch_size=32, layout=Shards(shuffle=True),
                          samples=Samples(seed=0))
    assert _counted(_loader(cut, 2, 32)) == (63, 63)
    assert len(dataset) == len(cut) == 2000  # asked directly: the rank's samples


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_len_of_a_loader_over_a_map_style_dataset_is_the_batches_it_yields(workers):
    data = Dataset(_reader(23))
    for batch_size in (4, 23, 1):
        for drop_last in (False, True):
            assert _counted(_loader(data, workers, batch_size, drop_last)) == (
                (23 // batch_size, 23 // batch_size) if drop_last else
                (-(-23 // batch_size), -(-23 // batch_size)))
    sampler = ElasticBatchSampler(data, batch_size=4, rank=1, world_size=2)
    loader = DataLoader(data, batch_sampler=sampler, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    assert _counted(loader) == (3, 3)
