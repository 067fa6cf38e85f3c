"""``shuffle=True`` picks the order the reader affords: Parquet's row groups walked (each
decoded about once an epoch), a true permutation where random access is cheap, and both mix
well (few next samples near the previous one)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fpipe.dataset import ListReader, MsgpackReader
from fpipe.formats import ParquetReader
from fpipe.orderings import QuasiShuffler, Range
from fpipe.orderings.order import Indexed
from fpipe.torch import IterableDataset, Samples, Shards

from .conftest import write_numbers

ROWS, GROUP = 20_000, 500


@pytest.fixture(scope="module")
def parquet_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("shuffle") / "rows.parquet"
    pq.write_table(pa.table({"n": np.arange(ROWS), "text": [f"row {i}" for i in range(ROWS)]}),
                   path, row_group_size=GROUP)
    return path


def counted(reader: ParquetReader) -> list[int]:
    """The row groups that ``reader``'s files decode from now on, as they decode them."""
    decoded: list[int] = []
    for file in reader.readers:
        def read_part(handle, part, columns=None, read=file._read_part):
            decoded.append(part)
            return read(handle, part, columns)
        file._read_part = read_part
    return decoded


def near(indices: list[int], distance: int = 16) -> float:
    """The fraction of next samples within ``distance`` positions of the previous one."""
    steps = np.abs(np.diff(np.asarray(indices)))
    return float(np.mean(steps <= distance))


def test_a_shuffled_parquet_epoch_decodes_each_row_group_once(parquet_path):
    reader = ParquetReader(parquet_path)
    decoded = counted(reader)
    data = IterableDataset(reader, layout=Shards(shuffle=True), samples=Samples(seed=0))
    for epoch in range(2):
        data.set_epoch(epoch)
        assert sorted(s["n"] for s in data) == list(range(ROWS))
        assert sorted(decoded) == list(range(ROWS // GROUP))
        decoded.clear()


def test_each_rank_decodes_the_row_groups_of_its_shard_about_once(parquet_path):
    reader = ParquetReader(parquet_path)
    decoded = counted(reader)
    seen = []
    for rank in range(3):
        seen += [s["n"] for s in IterableDataset(reader,
                                                 layout=Shards(rank=rank, world_size=3, shuffle=True),
                                                 samples=Samples(seed=0))]
    assert sorted(seen) == list(range(ROWS))
    # a row group that two shards share is decoded by both
    assert len(decoded) <= ROWS // GROUP + 2


def test_a_resumed_shuffled_parquet_pass_decodes_only_what_is_left(parquet_path):
    reader = ParquetReader(parquet_path)
    data = IterableDataset(reader, layout=Shards(shuffle=True), samples=Samples(seed=3))
    whole = [s["n"] for s in data]
    decoded = counted(reader)
    data.set_epoch(0)
    data.resume(int(0.9 * ROWS) // 100, batch_size=100)
    assert [s["n"] for s in data] == whole[int(0.9 * ROWS):]
    # the last tenth of the pass and the rest of the group of row groups it begins in
    assert len(decoded) <= ROWS // GROUP // 10 + 4


def test_a_quasi_shuffler_over_an_indexed_parquet_shard_goes_through_the_row_group_cache(
        parquet_path):
    reader = ParquetReader(parquet_path)
    decoded = counted(reader)
    shuffler = QuasiShuffler(Range(Indexed(reader), 0, ROWS), seed=0)
    assert sorted(index for index, _ in shuffler) == list(range(ROWS))
    assert len(decoded) <= ROWS // GROUP  # the file fits in the reader's cache


def test_the_default_shuffle_of_a_parquet_file_mixes_across_row_groups(parquet_path):
    order = [s["n"] for s in IterableDataset(ParquetReader(parquet_path), layout=Shards(shuffle=True),
                                             samples=Samples(seed=0))]
    # groups of 4 row groups: about 1 / 4 * 33 / 500, 1.6 %
    assert near(order) < 0.03
    assert len({n // GROUP for n in order[:200]}) >= 4


@pytest.mark.parametrize("reader_kind", ["list", "msgpack"])
def test_the_default_shuffle_is_a_true_permutation_where_random_access_is_cheap(
        reader_kind, tmp_path):
    n = 2000
    reader = (ListReader([{"x": i} for i in range(n)]) if reader_kind == "list"
              else MsgpackReader(write_numbers(tmp_path / "n.msgpack", n)))
    fractions = []
    for seed in range(3):
        order = [s["x"] for s in IterableDataset(reader, layout=Shards(shuffle=True),
                                                 samples=Samples(seed=seed))]
        assert sorted(order) == list(range(n))
        fractions.append(near(order))
    # a true shuffle: 33 / 2000 = 1.65 %; a buffer of 1 % of the data gave 23 %
    assert np.mean(fractions) < 0.03
