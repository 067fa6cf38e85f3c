"""WebDataset shards, TFRecord and Parquet files at URLs: the same samples as the local files,
through the block cache, over loopback HTTP and a real S3 server (SeaweedFS)."""

from __future__ import annotations

import io
import pickle
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fpipe.formats import (
    ArrowFileReader,
    ParquetFileReader,
    TarReader,
    TFRecordFileReader,
    TFRecordWriter,
    WebDatasetReader,
)
from fpipe.orderings import Shuffler
from fpipe.remote import RemoteOptions

from .servers import HttpServer

BLOCK = 16 * 1024


def _tar(path, first, n):
    with tarfile.open(path, "w") as tar:
        for i in range(first, first + n):
            for extension, data in (("jpg", bytes([i % 256]) * (100 + i)), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{i:05d}.{extension}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("formats")
    for shard in range(2):
        _tar(root / f"fmt-{shard}.tar", shard * 300, 300)
    with TFRecordWriter(root / "train.tfrecord") as writer:
        for i in range(500):
            writer.write({"i": i, "pad": bytes(i % 200)})
    pq.write_table(pa.table({"key": [f"k{i}" for i in range(2000)], "x": list(range(2000))}),
                   root / "train.parquet", row_group_size=250)
    table = pa.table({"key": [f"a{i}" for i in range(600)], "text": [f"row {i}" for i in range(600)]})
    for name, new in (("file.arrow", pa.ipc.new_file), ("stream.arrow", pa.ipc.new_stream)):
        with new(root / name, table.schema) as writer:
            writer.write_table(table, max_chunksize=100)
    return root


@pytest.fixture(scope="module")
def server(files):
    server = HttpServer(files)
    server.start()
    yield server
    server.faults.release.set()
    server.stop()


def _options(cache, **options):
    return {"remote": RemoteOptions(cache_dir=cache, block_size=BLOCK, **options)}


def test_a_tar_shard_at_a_url_reads_like_the_local_file(server, files, cache):
    remote = TarReader(server.url("fmt-0.tar"), **_options(cache))
    local = TarReader(files / "fmt-0.tar", remote=RemoteOptions(cache_dir=cache))
    assert len(remote) == 300 and list(remote) == list(local)
    order = list(Shuffler(remote, seed=0))
    assert sorted(s["key"] for s in order) == sorted(s["key"] for s in local)
    assert list(cache.glob("*/blocks/*")), "the bytes came through the block cache"
    again = pickle.loads(pickle.dumps(remote))
    assert again[123] == local[123] and again.find_index("00200") == 200


def test_the_index_of_a_url_is_built_once(server, cache):
    TarReader(server.url("fmt-1.tar"), **_options(cache))
    before = server.faults.ranged_gets
    reader = TarReader(server.url("fmt-1.tar"), **_options(cache))
    assert server.faults.ranged_gets == before, "a second open read the shard again"
    assert reader[0]["key"] == "00300"


def test_tfrecord_and_parquet_at_urls(server, files, cache):
    remote = TFRecordFileReader(server.url("train.tfrecord"), **_options(cache))
    assert [int(s["i"][0]) for s in remote.iter(490)] == list(range(490, 500))
    assert remote[77]["pad"] == bytes(77)
    table = ParquetFileReader(server.url("train.parquet"), **_options(cache))
    local = ParquetFileReader(files / "train.parquet")
    assert len(table) == 2000 and table[1999] == local[1999]
    assert table.find_index("k1500") == 1500
    table.prefetch(np.arange(1000, 1100))
    assert list(table.iter(0, 600)) == list(local.iter(0, 600))
    assert pickle.loads(pickle.dumps(table))[700] == local[700]


@pytest.mark.parametrize("name", ["file.arrow", "stream.arrow"])
def test_arrow_ipc_files_at_urls(server, files, cache, name):
    remote = ArrowFileReader(server.url(name), **_options(cache))
    local = ArrowFileReader(files / name)
    assert len(remote) == 600 and remote[599] == local[599] and remote.find_index("a350") == 350
    assert list(remote.iter(150, 420)) == list(local.iter(150, 420))
    assert pickle.loads(pickle.dumps(remote))[99] == local[99]


def test_shards_glob_an_s3_pattern(s3, files, cache):
    import s3fs

    fs = s3fs.S3FileSystem(**s3.storage_options, skip_instance_cache=True)
    for name in ("fmt-0.tar", "fmt-1.tar"):
        fs.put_file(str(files / name), f"data/{name}")
    reader = WebDatasetReader("s3://data/fmt-*.tar",
                              **_options(cache, storage_options=s3.storage_options))
    assert len(reader) == 600 and [r.source.path for r in reader.readers] == [
        "s3://data/fmt-0.tar", "s3://data/fmt-1.tar"]
    assert reader[450] == TarReader(files / "fmt-1.tar", remote=RemoteOptions(cache_dir=cache))[150]


def test_credentials_in_a_url_never_reach_a_message_or_repr(server, files, cache):
    url = server.url("fmt-0.tar").replace("http://", "http://ann:s3cret@")
    reader = WebDatasetReader(url, **_options(cache))
    assert "s3cret" not in repr(reader) and "s3cret" not in repr(reader.readers[0])
    assert reader.readers[0].source.path == url.replace("ann:s3cret@", "***@")
    bad = TarReader(url, fields=["nope"], **_options(cache))
    with pytest.raises(Exception) as error:
        bad[0]
    assert "s3cret" not in str(error.value) and "***@" in str(error.value)
