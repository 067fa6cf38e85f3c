"""Readers that decode a block at a time say so (``blocks``), and BlockShuffler walks their
blocks: each read once an epoch, in groups mixed whole, resumable from any position."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fpipe.dataset import BlockShuffler, FileWriter, ListReader, ShardedReader, block_bounds
from fpipe.formats import ArrowFileReader, ParquetFileReader, ParquetReader
from fpipe.orderings import Range


class Blocked(ListReader):
    """A list whose samples come in blocks of 10 (the last one of 5), counting block reads."""

    blocks = np.array([0, 10, 20, 30, 40, 45])

    def __init__(self, samples):
        super().__init__(samples)
        self.reads = []

    def get_slice(self, start, stop, yield_key=False, raw=False, copy=True):
        self.reads.append((start, stop))
        return super().get_slice(start, stop, yield_key, raw, copy)


def blocked() -> Blocked:
    return Blocked([{"key": i} for i in range(45)])


def test_parquet_and_arrow_readers_give_their_row_groups_and_record_batches(tmp_path):
    table = pa.table({"n": list(range(10))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    pq.write_table(table.slice(0, 3), tmp_path / "b.parquet", row_group_size=2)
    with pa.ipc.new_file(str(tmp_path / "c.arrow"), table.schema) as writer:
        writer.write_table(table, max_chunksize=6)
    assert ParquetFileReader(tmp_path / "a.parquet").blocks.tolist() == [0, 4, 8, 10]
    assert ArrowFileReader(tmp_path / "c.arrow").blocks.tolist() == [0, 6, 10]
    both = ParquetReader([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert both.blocks.tolist() == [0, 4, 8, 10, 12, 13]


def test_readers_of_samples_that_cost_the_same_anywhere_have_no_blocks(tmp_path):
    path = str(tmp_path / "n.msgpack")
    with FileWriter(path) as writer:
        writer.write({"key": "a"})
    assert ListReader([{"key": 0}]).blocks is None
    assert ShardedReader([path]).blocks is None
    assert block_bounds(Range(ListReader([{"key": 0}]))) is None


def test_a_window_cuts_the_blocks_at_its_edges():
    assert block_bounds(Range(blocked(), 15, 42)).tolist() == [0, 5, 15, 25, 27]
    assert block_bounds(Range(blocked(), 20, 20)).tolist() == [0]


def test_a_block_shuffler_reads_each_block_once_in_groups_mixed_whole():
    reader = blocked()
    shuffler = BlockShuffler(reader, blocks_held=2, seed=4)
    keys = [s["key"] for s in shuffler]
    assert sorted(keys) == list(range(45))
    assert sorted(reader.reads) == [(a, b) for a, b in zip(reader.blocks, reader.blocks[1:])]
    # the first group is two whole blocks, their samples mixed
    first = {key // 10 for key in keys[:20]}
    assert len(first) == 2 and sorted(keys[:20]) != keys[:20]


def test_buf_size_makes_the_groups_larger():
    shuffler = BlockShuffler(blocked(), buf_size=25, blocks_held=1, seed=0)
    keys = [s["key"] for s in shuffler]
    assert shuffler.buffer_size == 25
    assert len({key // 10 for key in keys[:25]}) == 3


def test_a_block_shuffler_starts_anywhere_reading_only_the_groups_from_there():
    reader = blocked()
    shuffler = BlockShuffler(reader, blocks_held=2, seed=1)
    keys = [s["key"] for s in shuffler]
    shuffler.set_epoch(0)
    reader.reads.clear()
    assert [s["key"] for s in shuffler.iter(25)] == keys[25:]
    assert len(reader.reads) < 5
    assert [s["key"] for s in shuffler.iter(3, 30)] == keys[3:30]


def test_a_block_shuffler_resumes_from_its_state_and_differs_by_epoch():
    shuffler = BlockShuffler(blocked(), blocks_held=2)
    stream = iter(shuffler)
    head = [next(stream)["key"] for _ in range(17)]
    restored = BlockShuffler(blocked(), blocks_held=2)
    restored.load_state_dict(shuffler.state_dict())
    whole = [s["key"] for s in BlockShuffler(blocked(), blocks_held=2, seed=shuffler.seed)]
    assert head + [s["key"] for s in restored] == whole
    with pytest.raises(ValueError, match="blocks_held=2"):
        BlockShuffler(blocked(), blocks_held=3).load_state_dict(shuffler.state_dict())
    assert [s["key"] for s in restored] != whole  # the next epoch


def test_a_block_shuffler_needs_blocks_and_checks_its_arguments():
    with pytest.raises(TypeError, match="BlockShuffler needs a reader that says its blocks"):
        BlockShuffler(ListReader([{"key": 0}]))
    with pytest.raises(ValueError, match="blocks_held must be >= 1; got blocks_held=0"):
        BlockShuffler(blocked(), blocks_held=0)
    with pytest.raises(ValueError, match="buf_size"):
        BlockShuffler(blocked(), buf_size=1.5)
    assert repr(BlockShuffler(blocked(), seed=2)).endswith("blocks_held=4, seed=2)")


def test_a_block_shuffler_mixes_the_row_groups_of_files_whose_columns_differ(tmp_path):
    pq.write_table(pa.table({"n": list(range(6))}), tmp_path / "a.parquet", row_group_size=2)
    pq.write_table(pa.table({"n": list(range(6, 9)), "extra": ["x"] * 3}), tmp_path / "b.parquet",
                   row_group_size=2)
    reader = ParquetReader([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    shuffler = BlockShuffler(reader, blocks_held=5, seed=0)
    samples = list(shuffler)
    assert sorted(s["n"] for s in samples) == list(range(9))
    assert all(("extra" in s) == (s["n"] >= 6) for s in samples)
    shuffler.set_epoch(0)
    keyed = list(shuffler.iter(yield_key=True))
    assert [sample for _, sample in keyed] == samples
    assert [key for key, _ in keyed] == [reader.find_key(s["n"]) for s in samples]
