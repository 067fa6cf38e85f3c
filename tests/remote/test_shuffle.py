"""``shuffle=True`` over a dataset at a URL walks the blocks of the cache: each block is
fetched once an epoch, whatever the cache holds."""

from __future__ import annotations

import numpy as np

from fpipe.dataset import MsgpackReader
from fpipe.remote import RemoteOptions
from fpipe.torch import IterableDataset, Samples, Shards

from .conftest import BLOCK, N, sample


def test_a_url_reader_gives_the_blocks_of_its_cache(http, cache, served):
    remote = MsgpackReader(http.url("train.msgpack"), remote=RemoteOptions(cache_dir=cache, block_size=BLOCK))
    bounds = remote.blocks
    assert bounds[0] == 0 and bounds[-1] == N and (np.diff(bounds) > 0).all()
    offsets = np.fromfile(served / "train.msgpack.offsets", dtype=">u8")
    # each bound is the first sample of a block
    assert (offsets[bounds[1:-1]] // BLOCK > offsets[bounds[1:-1] - 1] // BLOCK).all()
    assert MsgpackReader(served / "train.msgpack").blocks is None


def test_a_shuffled_epoch_at_a_url_fetches_each_block_once_with_a_small_cache(
        http, cache, served):
    remote = MsgpackReader(http.url("train.msgpack"),
                           remote=RemoteOptions(cache_dir=cache, block_size=BLOCK, cache_bytes=2 * BLOCK,
                                                read_ahead=0))
    offsets = np.fromfile(served / "train.msgpack.offsets", dtype=">u8")
    blocks = len(np.unique(offsets[:-1] // BLOCK))
    before = http.faults.ranged_gets
    order = [s["key"] for s in IterableDataset(remote, layout=Shards(shuffle=True),
                                               samples=Samples(seed=0))]
    assert sorted(order) == [sample(i)["key"] for i in range(N)]
    assert http.faults.ranged_gets - before == blocks
    # groups of 4 blocks of about 115 samples: about 1 / 4 * 33 / 115, 7 %
    steps = np.abs(np.diff([int(key) for key in order]))
    assert np.mean(steps <= 16) < 0.12
