"""Datasets served over HTTP (Range requests, with faults on demand) and by a real S3 server
(SeaweedFS), started by the tests themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from fpipe.dataset import FileWriter

from .servers import HttpServer, SeaweedS3

N = 3000
BLOCK = 16 * 1024  # small blocks: a dataset of ~430 KiB makes about 27 of them


def sample(i: int) -> dict:
    return {"key": f"{i:06d}", "data": i.to_bytes(4, "big") * 32, "label": i % 10}


def write_dataset(path: Path, n: int = N) -> Path:
    with FileWriter(path, overwrite=True) as writer:
        for i in range(n):
            writer.write(sample(i))
    return path


@pytest.fixture(scope="session")
def served(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("served")
    write_dataset(root / "train.msgpack")
    write_dataset(root / "shard-1.msgpack", 500)
    return root


@pytest.fixture(scope="session")
def _http_server(served):
    server = HttpServer(served)
    server.start()
    yield server
    server.faults.release.set()
    server.stop()


@pytest.fixture
def http(_http_server):
    """The HTTP server, with no faults pending and its counters at zero."""
    _http_server.faults.pending.clear()
    _http_server.faults.whole_pending.clear()
    _http_server.faults.release.clear()
    _http_server.faults.ranged_gets = 0
    if _http_server._server is None:
        _http_server.start()
    yield _http_server
    _http_server.faults.release.set()
    _http_server.faults.pending.clear()


@pytest.fixture(scope="session")
def s3(tmp_path_factory, served):
    """A SeaweedFS S3 server on loopback holding bucket ``data`` with the served datasets."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True)
        fs.mkdir("data")
        for path in sorted(served.iterdir()):
            fs.put_file(str(path), f"data/{path.name}")
        yield server
    finally:
        server.stop()


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"
