"""Workloads of datasets in object storage (R1-R3): ``small`` read in random order from a local
S3 server (SeaweedFS, started here on loopback and stopped at exit).

R1 compares fpipe's first epoch with the loaders users would pick instead, Mosaic Streaming
(MDS shards) and litdata (its optimized chunks), on the same samples from the same server,
each at its documented defaults with a shuffle. They are not in the ``bench`` extra (their
dependencies pull in another numpy and a tree of cloud SDKs); install them beside it to run
R1: ``pip install mosaicml-streaming litdata``. R2 and R3 need only fpipe.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from fpipe.dataset import MsgpackReader
from fpipe.orderings import Shuffler
from fpipe.remote import RemoteOptions

from . import data
from .harness import Pair, workload
from .s3server import DelayProxy, SeaweedS3

BUCKET = "bench"
URL = f"s3://{BUCKET}/small/small.msgpack"
_state: dict = {}


def _server() -> SeaweedS3:
    """The S3 server, started once per run, holding ``small`` under :data:`URL`."""
    if "server" not in _state:
        folder = Path(tempfile.mkdtemp(prefix="fpipe-bench-s3-"))
        server = SeaweedS3(folder)
        server.start()
        atexit.register(shutil.rmtree, folder, True)
        atexit.register(server.stop)
        # a run stopped with SIGTERM (timeout, kill) exits through atexit too: no stray server
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        fs = _filesystem(server.storage_options)
        fs.mkdir(BUCKET)
        source = Path(data.small_path())
        for path in sorted(source.parent.glob(source.name + "*")):
            fs.put_file(str(path), f"{BUCKET}/small/{path.name}")
        _state["server"] = server
    return _state["server"]


def _filesystem(options: dict):
    import s3fs

    return s3fs.S3FileSystem(**options, skip_instance_cache=True)


def _options(endpoint: str) -> dict:
    server = _server()
    return {"key": server.ACCESS, "secret": server.SECRET,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


class _ColdCache:
    """A new, empty cache folder before every timed run (``settle``), so each is a first epoch."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fpipe-bench-cache-"))
        self.current = self.root / "0"
        self.count = 0

    def renew(self) -> None:
        shutil.rmtree(self.current, ignore_errors=True)
        self.count += 1
        self.current = self.root / str(self.count)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _epoch(reader: MsgpackReader) -> int:
    count = 0
    for _ in Shuffler(reader, seed=0):
        count += 1
    return count


def _first_epoch(endpoint: str, cache: _ColdCache) -> Callable[[], int]:
    def run() -> int:
        return _epoch(MsgpackReader(URL,
                                    remote=RemoteOptions(storage_options=_options(endpoint),
                                                         cache_dir=cache.current)))
    return run


@workload("R2", description="second (cached) epoch of `small` in random order, read from S3",
          reference="fpipe on local disk", target=">= 0.9")
def cached_epoch() -> Pair:
    server = _server()
    cache = _ColdCache()
    remote = MsgpackReader(URL,
                           remote=RemoteOptions(storage_options=_options(server.endpoint),
                                                cache_dir=cache.current))
    _epoch(remote)  # the first epoch fills the cache
    local = MsgpackReader(data.small_path())
    return Pair(fpipe=lambda: _epoch(remote), reference=lambda: _epoch(local), items=len(local),
                teardown=cache.remove)


@workload("R3", description="first epoch of `small` in random order from S3, 20 ms added to "
          "every request", reference="the same without the added latency", target=">= 0.8")
def latency_epoch() -> Pair:
    server = _server()
    proxy = DelayProxy(server.port, 0.020)
    cache = _ColdCache()

    def teardown() -> None:
        proxy.close()
        cache.remove()
    return Pair(fpipe=_first_epoch(f"http://127.0.0.1:{proxy.port}", cache),
                reference=_first_epoch(server.endpoint, cache), items=100_000,
                settle=cache.renew, teardown=teardown)


# --- R1: against Mosaic Streaming and litdata ------------------------------------------------

def _peer_environment() -> None:
    """Point the peers' S3 clients (boto3, obstore) at the local server."""
    server = _server()
    os.environ.update(server.env)
    os.environ["S3_ENDPOINT_URL"] = server.endpoint  # Mosaic Streaming's own variable
    os.environ["AWS_ALLOW_HTTP"] = "true"  # obstore refuses plain http otherwise


def _mds_upload() -> str:
    """``small`` as MDS shards in the bucket (written once per run)."""
    if "mds" not in _state:
        from streaming import MDSWriter

        folder = Path(tempfile.mkdtemp(prefix="fpipe-bench-mds-"))
        columns = {"key": "str", "data": "bytes", "label": "int"}
        with MDSWriter(out=str(folder), columns=columns) as writer:
            for sample in MsgpackReader(data.small_path()):
                writer.write(sample)
        _filesystem(_options(_server().endpoint)).put(str(folder) + "/", f"{BUCKET}/mds/",
                                                      recursive=True)
        shutil.rmtree(folder)
        _state["mds"] = f"s3://{BUCKET}/mds"
    return _state["mds"]


def _litdata_upload() -> str:
    """``small`` as litdata chunks in the bucket (written once per run)."""
    if "litdata" not in _state:
        from litdata import optimize

        folder = Path(tempfile.mkdtemp(prefix="fpipe-bench-litdata-"))
        reader = MsgpackReader(data.small_path())
        optimize(fn=reader.get, inputs=list(range(len(reader))), output_dir=str(folder),
                 chunk_bytes="64MB", num_workers=1)
        _filesystem(_options(_server().endpoint)).put(str(folder) + "/", f"{BUCKET}/litdata/",
                                                      recursive=True)
        shutil.rmtree(folder)
        _state["litdata"] = f"s3://{BUCKET}/litdata"
    return _state["litdata"]


def _mosaic_epoch(remote: str, cache: _ColdCache) -> Callable[[], int]:
    def run() -> int:
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = StreamingDataset(remote=remote, local=str(cache.current), shuffle=True,
                                   shuffle_seed=0, batch_size=1)
        return sum(1 for _ in dataset)
    return run


def _litdata_epoch(remote: str, cache: _ColdCache) -> Callable[[], int]:
    from litdata.streaming import downloader

    # litdata gives obstore client options of its own, which leave out the environment's
    # AWS_ALLOW_HTTP; a local server speaks plain http (cloud endpoints are https)
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}

    def run() -> int:
        from litdata import StreamingDataset
        from litdata.streaming.cache import Dir

        dataset = StreamingDataset(Dir(path=str(cache.current), url=remote), shuffle=True, seed=0)
        return sum(1 for _ in dataset)
    return run


def _against(peer: Callable[[str, _ColdCache], Callable[[], int]],
             upload: Callable[[], str]) -> Pair:
    _peer_environment()
    remote = upload()
    ours, theirs = _ColdCache(), _ColdCache()

    def settle() -> None:
        ours.renew()
        theirs.renew()

    def teardown() -> None:
        ours.remove()
        theirs.remove()
    return Pair(fpipe=_first_epoch(_server().endpoint, ours), reference=peer(remote, theirs),
                items=100_000, settle=settle, teardown=teardown)


@workload("R1m", description="first epoch of `small` in random order from S3 (SeaweedFS)",
          reference="Mosaic Streaming (MDS shards, shuffle)", target=">= 1.3")
def first_epoch_mosaic() -> Pair:
    return _against(_mosaic_epoch, _mds_upload)


@workload("R1l", description="first epoch of `small` in random order from S3 (SeaweedFS)",
          reference="litdata (optimized chunks, shuffle)", target=">= 1.3")
def first_epoch_litdata() -> Pair:
    return _against(_litdata_epoch, _litdata_upload)
