"""Parquet, Arrow IPC and Hugging Face datasets folders, written by pyarrow and datasets."""

import pickle

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import fpipe.torch
from fpipe.errors import FormatError
from fpipe.formats import ArrowFileReader, ParquetFileReader, ParquetReader
from fpipe.orderings import Shuffler

N = 1000


def _table(first: int = 0, n: int = N) -> pa.Table:
    return pa.table({"key": [f"r{i:05d}" for i in range(first, first + n)],
                     "text": [f"row {i} " * (i % 4) for i in range(first, first + n)],
                     "n": list(range(first, first + n)),
                     "blob": [bytes([i % 256]) * (i % 7) for i in range(first, first + n)],
                     "tags": [[i, i + 1] if i % 3 else None for i in range(first, first + n)]})


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pq") / "train.parquet"
    pq.write_table(_table(), path, row_group_size=128)
    return path


def test_rows_match_pyarrow(parquet_file):
    reader = ParquetFileReader(parquet_file)
    rows = _table().to_pylist()
    assert len(reader) == N and list(reader) == rows
    assert list(reader.iter(100, 300, chunk_size=7)) == rows[100:300]
    order = np.random.default_rng(0).permutation(N)[:100].tolist()
    assert [reader[i] for i in order] == [rows[i] for i in order]
    assert reader.get_many([999, 0, 128, 127]) == [rows[999], rows[0], rows[128], rows[127]]
    assert reader[-1] == rows[-1] and reader[5:1:-2] == [rows[5], rows[3]]


def test_keys_columns_and_raw(parquet_file):
    reader = ParquetFileReader(parquet_file, columns=["n", "key"])
    assert reader[3] == {"n": 3, "key": "r00003"}
    assert reader.find_index("r00777") == 777 and "r00001" in reader and "x" not in reader
    assert reader.get(4, yield_key=True) == ("r00004", {"n": 4, "key": "r00004"})
    assert list(reader.iter(0, 2, yield_key=True))[1] == ("r00001", {"n": 1, "key": "r00001"})
    assert fpipe.dataset.unpack_sample(reader.get(9, raw=True)) == reader[9]
    numbered = ParquetFileReader(parquet_file, columns=["n"], key="n")
    assert numbered.find_key(5) == "5" and numbered.find_index("6") == 6
    with pytest.raises(FormatError, match=r"train\.parquet: has no column 'nope' \(columns=\['nope'\]"):
        ParquetFileReader(parquet_file, columns=["nope"])
    with pytest.raises(FormatError, match="has no key column 'id'"):
        ParquetFileReader(parquet_file, key="id")
    with pytest.raises(TypeError, match="columns must be a list"):
        ParquetFileReader(parquet_file, columns="n")


def test_without_a_key_column_rows_are_numbered(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    reader = ParquetFileReader(path)
    assert reader.find_key(2) == "plain.parquet:2" and reader.find_index("plain.parquet:1") == 1
    assert "plain.parquet:3" not in reader


def test_cache_bytes_bounds_the_decoded_row_groups(parquet_file):
    reader = ParquetFileReader(parquet_file, cache_bytes=0)
    for i in range(0, N, 100):
        reader[i]
    assert len(reader._parts) == 1
    reading = ParquetFileReader(parquet_file)
    assert sum(1 for _ in reading) == N and len(reading._parts) == 0  # a pass keeps nothing


def test_folders_patterns_and_hugging_face_save_to_disk(tmp_path):
    for part in range(3):
        pq.write_table(_table(part * 100, 100), tmp_path / f"train-{part:05d}-of-00003.parquet")
    rows = [row for part in range(3) for row in _table(part * 100, 100).to_pylist()]
    assert list(ParquetReader(tmp_path)) == rows
    assert list(ParquetReader(str(tmp_path / "train-{00000..00002}-of-00003.parquet"))) == rows
    assert ParquetReader(str(tmp_path / "train-*.parquet")).find_index("r00250") == 250
    saved = tmp_path / "saved"
    hf = datasets.Dataset.from_parquet(str(tmp_path / "train-*.parquet"), cache_dir=str(tmp_path / "hf"))
    hf.save_to_disk(str(saved), num_shards=2)
    reader = ParquetReader(saved)
    assert len(reader) == len(hf) == 300
    assert all(reader[i] == hf[i] for i in (0, 149, 150, 299))


def test_arrow_ipc_file_and_stream(tmp_path):
    table = _table(0, 50)
    with pa.ipc.new_file(tmp_path / "t.arrow", table.schema) as writer:
        for batch in table.to_batches(max_chunksize=16):
            writer.write_batch(batch)
    with pa.ipc.new_stream(tmp_path / "s.arrow", table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    for name in ("t.arrow", "s.arrow"):
        reader = ArrowFileReader(tmp_path / name)
        assert list(reader) == table.to_pylist() and reader[33] == table.to_pylist()[33]
        assert pickle.loads(pickle.dumps(reader))[49] == reader[49]


def test_fixed_shape_tensors_read_as_arrays(tmp_path):
    arrays = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(arrays)}), path)
    reader = ParquetFileReader(path)
    assert np.array_equal(reader[2]["x"], arrays[2]) and reader[2]["x"].flags.writeable
    assert all(np.array_equal(row["x"], a) for row, a in zip(reader, arrays))


def test_bad_footer_names_the_file(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(_table(0, 10), path)
    data = path.read_bytes()
    path.write_bytes(data[:-3] + b"XYZ")
    with pytest.raises(FormatError, match=r"bad\.parquet: not a readable Parquet file"):
        ParquetFileReader(path)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match=r"bad\.parquet: not a readable Parquet file"):
        ParquetReader(str(path))


def _corrupt_row_group(path, group, column=1):
    metadata = pq.ParquetFile(path).metadata
    chunk = metadata.row_group(group).column(column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    for offset in range(start, start + chunk.total_compressed_size):
        data[offset] ^= 0xA5
    path.write_bytes(bytes(data))


def test_a_damaged_row_group_names_file_and_sample_and_loses_nothing_else(tmp_path):
    path = tmp_path / "damaged.parquet"
    pq.write_table(_table(0, 300), path, row_group_size=100)
    _corrupt_row_group(path, 1)
    reader = ParquetFileReader(path)
    assert reader[99]["n"] == 99 and reader[200]["n"] == 200
    with pytest.raises(FormatError, match=r"damaged\.parquet: sample 150: row group 1 does not decode"):
        reader[150]
    got = []
    with pytest.raises(FormatError, match="sample 100"):
        for row in reader:
            got.append(row["n"])
    assert got == list(range(100))
    dataset = fpipe.torch.IterableDataset(reader, transforms=lambda row: row["n"],
                                          samples=fpipe.torch.Samples(on_error="skip"))
    assert list(dataset) == [*range(100), *range(200, 300)] and dataset.skipped == 100


def test_a_damaged_key_column_loses_only_its_own_keys(tmp_path):
    path = tmp_path / "keys.parquet"
    pq.write_table(_table(0, 300), path, row_group_size=100)
    _corrupt_row_group(path, 1, column=0)
    reader = ParquetFileReader(path)
    assert reader.get(250, yield_key=True) == ("r00250", _table(250, 1).to_pylist()[0])
    assert [key for key, _ in reader.iter(0, 100, yield_key=True)] == [f"r{i:05d}" for i in range(100)]
    with pytest.raises(FormatError, match=r"keys\.parquet: sample 150: row group 1 does not decode"):
        reader.find_key(150)
    for _ in range(2):  # a lookup by key needs every key: it names the part that fails
        with pytest.raises(FormatError, match=r"keys\.parquet: sample 100: row group 1 does not"):
            reader.find_index("r00005")


def n_of(row):
    return row["n"]


def test_pickles_into_dataloader_workers(parquet_file):
    dataset = fpipe.torch.Dataset(Shuffler(ParquetFileReader(parquet_file), seed=0), transforms=n_of)
    loader = torch.utils.data.DataLoader(dataset, batch_size=50, num_workers=2,
                                         multiprocessing_context="spawn")
    assert sorted(int(n) for batch in loader for n in batch) == list(range(N))


def test_export_takes_a_column_type_that_shows_only_after_nones_and_empty_lists(tmp_path):
    from fpipe.formats import write_parquet

    samples = [{"key": f"k{i}", "ids": [] if i < 5 else [i], "note": None if i < 7 else "x"}
               for i in range(10)]
    names = write_parquet(samples, str(tmp_path / "p-%d.parquet"), row_group_size=2)
    assert list(ParquetReader(names)) == samples
    with pytest.raises(TypeError, match="field 'n' holds int and str"):
        write_parquet([{"key": "a", "n": 1}, {"key": "b", "n": "1"}], str(tmp_path / "q-%d.parquet"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".p-%d.parquet.shards.json", "p-0.parquet"]


def _write_arrow(path, table, stream: bool, rows_per_batch: int, **options) -> None:
    new = pa.ipc.new_stream if stream else pa.ipc.new_file
    with new(path, table.schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        writer.write_table(table, max_chunksize=rows_per_batch)


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
def test_a_damaged_record_batch_names_file_batch_and_sample_and_loses_nothing_else(tmp_path,
                                                                                   stream):
    table = pa.table({"text": [f"row {i}" if i != 15 else "MARKER" for i in range(30)]})
    path = tmp_path / "damaged.arrow"
    _write_arrow(path, table, stream, rows_per_batch=10)
    data = path.read_bytes()
    path.write_bytes(data.replace(b"MARKER", b"\xff" * 6))  # no longer UTF-8
    reader = ArrowFileReader(path)
    assert reader[9] == {"text": "row 9"} and reader[29] == {"text": "row 29"}
    with pytest.raises(FormatError, match=r"damaged\.arrow: sample 12: record batch 1 does not "
                                          r"decode \(.*Invalid UTF8"):
        reader[12]
    got = []
    with pytest.raises(FormatError, match="sample 10: record batch 1"):
        got.extend(row["text"] for row in reader)
    assert got == [f"row {i}" for i in range(10)]


@pytest.mark.parametrize("stream, deltas", [(False, True), (True, True), (True, False)],
                         ids=["file", "stream with deltas", "stream with replacements"])
def test_arrow_dictionary_columns_read_batch_by_batch(tmp_path, stream, deltas):
    words = [["cat", "dog"], ["cat", "dog", "owl", "emu"]]  # the second extends the first
    parts = [pa.table({"label": pa.DictionaryArray.from_arrays(pa.array(indices, pa.int8()), pa.array(w)),
                       "n": range(3 * k, 3 * k + 3)})
             for k, (indices, w) in enumerate(zip([[0, 1, 0], [2, 0, 3]], words))]
    path = tmp_path / "labels.arrow"
    new = pa.ipc.new_stream if stream else pa.ipc.new_file
    with new(path, parts[0].schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=deltas)) as writer:
        for part in parts:
            writer.write_table(part)
    rows = [row for part in parts for row in part.to_pylist()]
    assert [row["label"] for row in rows] == ["cat", "dog", "cat", "owl", "cat", "emu"]
    reader = ArrowFileReader(path, cache_bytes=0)
    assert [reader[i] for i in (5, 0, 3, 2)] == [rows[i] for i in (5, 0, 3, 2)]
    assert list(reader) == rows and reader.blocks.tolist() == [0, 3, 6]


def test_a_value_without_a_python_equivalent_raises_format_error(tmp_path):
    days = pa.array([0, 1, 2**31 - 1, 3], pa.int32()).view(pa.date32())  # the last day of 5.9M AD
    path = tmp_path / "dates.parquet"
    pq.write_table(pa.table({"day": days}), path, row_group_size=2)
    reader = ParquetFileReader(path)
    assert reader[0]["day"].isoformat() == "1970-01-01" and reader[3]["day"].day == 4
    with pytest.raises(FormatError, match=r"dates\.parquet: sample 2: row group 1 holds a value "
                                          r"that does not convert to Python"):
        reader[2]
    with pytest.raises(FormatError, match=r"dates\.parquet: row group 1 \(samples 2 to 3\) holds"):
        list(reader)
    with pytest.raises(FormatError, match=r"dates\.parquet: row group 1 holds"):
        reader.block_rows(2, 4).take(np.array([1, 0]))


def test_a_damaged_hugging_face_folder_names_its_file(tmp_path):
    saved = tmp_path / "saved"
    hf = datasets.Dataset.from_dict({"text": [f"row {i}" if i != 13 else "MARKER" for i in range(20)]})
    hf.save_to_disk(str(saved), num_shards=2)
    second = sorted(saved.glob("*.arrow"))[1]
    second.write_bytes(second.read_bytes().replace(b"MARKER", b"\xfe" * 6))  # not UTF-8
    reader = ParquetReader(saved)
    assert reader[9] == {"text": "row 9"}  # the first file reads
    with pytest.raises(FormatError, match=rf"{second.name}: sample 3: record batch 0 does not "
                                          r"decode \(.*Invalid UTF8"):
        reader[13]
    (saved / "state.json").write_bytes(b'{"_data_files": [{"file": 1}]}')
    with pytest.raises(FormatError, match=r"state\.json: not a Hugging Face datasets state file"):
        ParquetReader(saved)


@pytest.mark.parametrize("stream", [False, True], ids=["file", "stream"])
@pytest.mark.parametrize("options", [{"use_legacy_format": True}, {"compression": "zstd"}],
                         ids=["legacy prefixes", "zstd bodies"])
def test_arrow_files_of_every_writer_option_and_empty_ones(tmp_path, stream, options):
    table = _table(0, 40)
    _write_arrow(tmp_path / "t.arrow", table, stream, rows_per_batch=16, **options)
    reader = ArrowFileReader(tmp_path / "t.arrow")
    assert list(reader) == table.to_pylist() and reader.blocks.tolist() == [0, 16, 32, 40]
    _write_arrow(tmp_path / "empty.arrow", table.slice(0, 0), stream, rows_per_batch=16, **options)
    assert len(ArrowFileReader(tmp_path / "empty.arrow")) == 0
