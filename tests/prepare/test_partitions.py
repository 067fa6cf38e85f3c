"""Partitions from a dask.bag and a dask.dataframe (one a dask partition), and source files
cut into ranges of their samples: the same input gives the same partitions and the same
bytes, the partitioning is in the fingerprint, and bad arguments are refused naming them."""

from __future__ import annotations

import pytest

from fpipe.cli import main
from fpipe.dataset import ShardedReader
from fpipe.formats import TFRecordWriter
from fpipe.prepare import SettingsChanged, from_dask, from_sources, verify_dataset, write_dataset

from .jobs import noisy, tree

dask_bag = pytest.importorskip("dask.bag")
dd = pytest.importorskip("dask.dataframe")
pd = pytest.importorskip("pandas")


def prepared(out) -> list[dict]:
    return list(ShardedReader(str(out / "dataset.shards")))


def _bag(partitions: int = 3):
    items = [{"key": f"{i:03d}", "x": i} for i in range(20)]
    return dask_bag.from_sequence(items, npartitions=partitions)


def _frame(partitions: int = 3):
    frame = pd.DataFrame({"x": range(20), "name": [f"n{i}" for i in range(20)]})
    return dd.from_pandas(frame, npartitions=partitions)


# --- dask -------------------------------------------------------------------------------


def test_a_bag_is_one_partition_a_bag_partition_in_order(tmp_path):
    bag = _bag()
    report = write_dataset(bag, tmp_path / "out", noisy, shard_size=4, n_workers=1)
    assert report.partitions == bag.npartitions == 3
    samples = prepared(tmp_path / "out")
    assert [s["x"] for s in samples] == list(range(20))
    assert verify_dataset(tmp_path / "out")["partitions"] == 3


def test_dataframe_rows_become_dict_samples_with_keys_by_position(tmp_path):
    frame = _frame()
    write_dataset(from_dask(frame), tmp_path / "out", n_workers=1)
    samples = prepared(tmp_path / "out")
    assert [s["x"] for s in samples] == list(range(20))
    assert samples[0] == {"key": "000000-000000000", "x": 0, "name": "n0"}
    sizes = [len(part) for part in frame.partitions]
    last = len(sizes) - 1
    assert samples[-1]["key"] == f"{last:06d}-{sizes[-1] - 1:09d}"


@pytest.mark.slow
def test_a_bag_and_a_dataframe_on_a_local_cluster_write_the_bytes_of_one_process(tmp_path):
    from distributed import Client, LocalCluster

    write_dataset(_bag(), tmp_path / "bag1", noisy, shard_size=4, n_workers=1)
    write_dataset(_frame(), tmp_path / "frame1", noisy, shard_size=4, n_workers=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        write_dataset(_bag(), tmp_path / "bag2", noisy, shard_size=4, cluster=client)
        write_dataset(_frame(), tmp_path / "frame2", noisy, shard_size=4, cluster=client)
        again = write_dataset(_bag(), tmp_path / "bag2", noisy, shard_size=4, cluster=client)
    assert again.skipped == 3 and again.written == 0
    assert tree(tmp_path / "bag1") == tree(tmp_path / "bag2")
    assert tree(tmp_path / "frame1") == tree(tmp_path / "frame2")


def test_another_partitioning_of_a_bag_is_refused_on_rerun(tmp_path):
    write_dataset(_bag(3), tmp_path / "out", n_workers=1)
    with pytest.raises(SettingsChanged, match="partitions"):
        write_dataset(_bag(2), tmp_path / "out", n_workers=1)
    assert write_dataset(_bag(3), tmp_path / "out", n_workers=1).skipped == 3


def test_bag_errors_name_the_argument(tmp_path):
    with pytest.raises(TypeError, match="collection must be a dask.bag or a dask.dataframe"):
        from_dask({"x": 1})
    empty = dask_bag.Bag({}, "empty-bag", 0)
    with pytest.raises(ValueError, match="collection must have partitions; the dask.bag has none"):
        from_dask(empty)
    with pytest.raises(TypeError, match=r"partition 0 of the dask.bag: its items must be dict"):
        write_dataset(dask_bag.from_sequence([1, 2], npartitions=1), tmp_path / "out", n_workers=1)


def test_an_empty_bag_partition_commits_no_shard(tmp_path):
    report = write_dataset(dask_bag.from_sequence([], npartitions=1), tmp_path / "out", n_workers=1)
    assert (report.partitions, report.samples) == (1, 0)


# --- ranges of a file ---------------------------------------------------------------------


@pytest.fixture
def one_big_file(tmp_path):
    with TFRecordWriter(tmp_path / "big.tfrecord") as writer:
        for i in range(23):
            writer.write({"x": [i]})
    return str(tmp_path / "big.tfrecord")


def test_one_file_cut_into_ranges_gives_its_samples_in_order(one_big_file, tmp_path):
    partitions = from_sources(one_big_file, ranges=4)
    assert [argument[1:] for argument in partitions] == [(0, 6), (6, 12), (12, 18), (18, 23)]
    assert list(from_sources(one_big_file, ranges=4)) == list(partitions)  # deterministic
    write_dataset(partitions, tmp_path / "cut", shard_size=5, n_workers=2)
    write_dataset(one_big_file, tmp_path / "whole", shard_size=5, n_workers=1)
    assert ([(s["key"], s["x"]) for s in prepared(tmp_path / "cut")]
            == [(s["key"], s["x"]) for s in prepared(tmp_path / "whole")])
    assert verify_dataset(tmp_path / "cut")["partitions"] == 4


def _webdataset(path) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i in range(23):
            data = f"{i}".encode()
            member = tarfile.TarInfo(f"s{i:03d}.txt")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


@pytest.mark.parametrize("kind", ["packed", "parquet", "webdataset"])
def test_ranges_of_packed_parquet_and_webdataset_files(kind, one_big_file, tmp_path):
    suffix = {"packed": "msgpack", "parquet": "parquet", "webdataset": "tar"}[kind]
    source = str(tmp_path / f"big-000000.{suffix}")
    assert main(["write", one_big_file, str(tmp_path / "all.msgpack"), "-q"]) == 0
    if kind == "packed":
        source = str(tmp_path / "all.msgpack")
    elif kind == "parquet":
        pattern = str(tmp_path / f"big-%06d.{suffix}")
        assert main(["export", str(tmp_path / "all.msgpack"), pattern, "-q"]) == 0
    else:
        _webdataset(source)
    write_dataset(source, tmp_path / "whole", n_workers=1)
    whole = prepared(tmp_path / "whole")
    assert len(whole) == 23
    write_dataset(from_sources(source, ranges=3), tmp_path / "out", n_workers=1)
    assert prepared(tmp_path / "out") == whole


def test_more_ranges_than_samples_gives_empty_partitions(one_big_file, tmp_path):
    report = write_dataset(from_sources(one_big_file, ranges=30), tmp_path / "out", n_workers=1)
    assert (report.partitions, report.samples) == (30, 23)


def test_another_range_count_is_refused_on_rerun(one_big_file, tmp_path):
    write_dataset(from_sources(one_big_file, ranges=2), tmp_path / "out", n_workers=1)
    with pytest.raises(SettingsChanged):
        write_dataset(from_sources(one_big_file, ranges=1), tmp_path / "out", n_workers=1)


@pytest.mark.parametrize("ranges, error, says", [
    (0, ValueError, "ranges must be >= 1; got ranges=0"),
    (-2, ValueError, "ranges must be >= 1; got ranges=-2"),
    ("3", TypeError, "ranges"),
    (2.5, TypeError, "ranges"),
])
def test_a_bad_range_count_is_refused_naming_ranges(one_big_file, ranges, error, says):
    with pytest.raises(error, match=says):
        from_sources(one_big_file, ranges=ranges)


def test_write_ranges_on_the_command_line(one_big_file, tmp_path, capsys):
    status = main(["write", one_big_file, str(tmp_path / "out"), "--processes", "2",
                   "--ranges", "3", "-q"])
    assert status == 0, capsys.readouterr().err
    assert verify_dataset(tmp_path / "out")["partitions"] == 3
    status = main(["write", one_big_file, str(tmp_path / "other.msgpack"), "--ranges", "3"])
    assert status == 2
    assert "--ranges" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["write", one_big_file, str(tmp_path / "x"), "--processes", "1", "--ranges", "0"])
    assert "argument --ranges: must be >= 1" in capsys.readouterr().err
