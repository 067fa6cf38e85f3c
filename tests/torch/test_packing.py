"""Packed rows through a torch DataLoader: each worker packs its own shard of the samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from toolz import pipe
from torch.utils.data import DataLoader

import fpipe


class PackedShards(torch.utils.data.IterableDataset):
    """Worker ``i`` of ``n`` packs shard ``i`` of ``n`` of the samples into rows."""

    def __init__(self, samples: list, length: int) -> None:
        self.samples, self.length = samples, length

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        index, count = (info.id, info.num_workers) if info is not None else (0, 1)
        return iter(pipe(self.samples, fpipe.shard(index, count),
                         fpipe.pack(self.length, buffer_size=4)))


@pytest.mark.parametrize("workers, context", [
    (0, None), (2, "fork"), pytest.param(2, "spawn", marks=pytest.mark.slow)])  # spawn: ~10 s
def test_workers_pack_their_shards_and_every_token_arrives_once(workers, context):
    lengths = np.random.default_rng(0).integers(1, 40, 50)
    samples = [np.arange(n) + 1000 * i for i, n in enumerate(lengths)]
    loader = DataLoader(PackedShards(samples, 32), batch_size=4, num_workers=workers,
                        multiprocessing_context=context)
    batches = list(loader)
    tokens = torch.cat([tokens[ids > 0] for tokens, ids, _ in batches])
    assert sorted(tokens.tolist()) == sorted(np.concatenate(samples).tolist())
    for tokens, ids, positions in batches:
        assert tokens.shape == ids.shape == positions.shape and tokens.shape[1] == 32
        assert ids.dtype == positions.dtype == torch.int32
        # within a segment, a token's position is its offset from the segment's first token
        starts = tokens - positions
        same = ids[:, 1:] == ids[:, :-1]
        assert torch.equal(starts[:, 1:][same & (ids[:, 1:] > 0)],
                           starts[:, :-1][same & (ids[:, 1:] > 0)])


class PackedReads(torch.utils.data.IterableDataset):
    """Packs what an fpipe.torch.IterableDataset reads, in the worker that reads it."""

    def __init__(self, samples, length: int) -> None:
        self.samples, self.length = samples, length

    def __iter__(self):
        return iter(fpipe.pack(self.length, fields=["tokens"], buffer_size=4)(self.samples))


def test_a_packing_stage_packs_the_shard_that_fpipe_torch_reads_in_each_worker():
    from fpipe.dataset import ListReader
    from fpipe.torch import IterableDataset, Samples, Shards

    lengths = np.random.default_rng(1).integers(1, 30, 64)
    reader = ListReader([{"key": f"{i:03d}", "tokens": np.arange(n) + 1000 * i}
                         for i, n in enumerate(lengths)])
    reads = IterableDataset(reader, chunk_size=4, layout=Shards(shuffle=True, buffer_samples=8),
                            samples=Samples(seed=0))
    loader = DataLoader(PackedReads(reads, 32), batch_size=2, num_workers=2,
                        persistent_workers=True)
    for epoch in range(2):
        reads.set_epoch(epoch)
        tokens = [batch["tokens"][batch["segment_ids"] > 0] for batch in loader]
        assert sorted(torch.cat(tokens).tolist()) == sorted(
            t for sample in reader for t in sample["tokens"].tolist())
