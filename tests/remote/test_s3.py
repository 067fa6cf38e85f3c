"""Readers at s3:// URLs against a real S3 server (SeaweedFS, started by the fixture): the same
samples as the local file, in DataLoader workers and gloo ranks, and through an outage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from fpipe.dataset import MsgpackReader, ShardedReader, ShardedWriter
from fpipe.orderings import IndexShuffler, Shuffler
from fpipe.remote import RemoteOptions
from fpipe.torch import Dataset, IterableDataset, Samples, Shards

from .conftest import BLOCK, N, sample

ROOT = Path(__file__).resolve().parents[2]
KEYS = [sample(i)["key"] for i in range(N)]


def s3_reader(s3, cache, **options) -> MsgpackReader:
    return MsgpackReader("s3://data/train.msgpack",
                         remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache,
                                              block_size=BLOCK, **options))


def test_an_s3_url_reads_like_the_local_file(s3, served, cache):
    remote, local = s3_reader(s3, cache), MsgpackReader(served / "train.msgpack")
    assert len(remote) == N and remote[::7] == local[::7]
    assert remote.find_index("001234") == 1234 and remote.verify_data()
    assert sorted(s["key"] for s in Shuffler(remote, seed=0)) == KEYS


def test_a_sharded_reader_globs_an_s3_pattern(s3, cache):
    shards = ShardedReader("s3://data/*.msgpack",
                           remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache,
                                                block_size=BLOCK))
    assert [r.url for r in shards.readers] == ["s3://data/shard-1.msgpack",
                                                       "s3://data/train.msgpack"]
    assert len(shards) == N + 500 and shards.get(500) == sample(0)


def test_a_shard_index_at_an_s3_url_opens_only_the_shards_read(s3, cache, tmp_path):
    import s3fs

    with ShardedWriter(tmp_path / "many", shard_size=10) as writer:
        for i in range(400):
            writer.write(sample(i))
    fs = s3fs.S3FileSystem(**s3.storage_options, skip_instance_cache=True)
    fs.put([str(p) for p in tmp_path.iterdir()], "data/many/")
    shards = ShardedReader("s3://data/many/many.shards",
                           remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache,
                                                block_size=BLOCK))
    assert len(shards) == 400 and not list(cache.glob("*/.complete"))
    assert shards.get(123) == sample(123)
    assert len(list(cache.glob("*/.complete"))) == 1  # one shard's index files fetched
    order = [s["key"] for s in IndexShuffler(shards, seed=2)]
    assert sorted(order) == [sample(i)["key"] for i in range(400)]


def _keys(batches) -> list[str]:
    return [key for batch in batches for key in batch["key"]]


def test_two_dataloader_workers_read_every_sample_once(s3, cache):
    iterable = IterableDataset(s3_reader(s3, cache), layout=Shards(shuffle=True), samples=Samples(seed=0))
    assert sorted(_keys(DataLoader(iterable, batch_size=64, num_workers=2))) == KEYS
    mapped = Dataset(s3_reader(s3, cache))
    loader = DataLoader(mapped, batch_size=64, num_workers=2, shuffle=True)
    assert sorted(_keys(loader)) == KEYS


def test_two_gloo_ranks_read_every_sample_once(s3, cache, tmp_path):
    port = subprocess.check_output([sys.executable, "-c", "import socket; s = socket.socket(); "
                                    "s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"])
    env = {**os.environ, **s3.env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port.decode().strip(),
           "WORLD_SIZE": "2", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    reports = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    ranks = [subprocess.Popen([sys.executable, "-m", "tests.remote._rank", str(rank),
                               "s3://data/train.msgpack", str(cache), str(report)], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank, report in enumerate(reports)]
    try:
        outputs = [rank.communicate(timeout=240)[0] for rank in ranks]
    except subprocess.TimeoutExpired:
        for rank in ranks:
            rank.kill()
        pytest.fail("a rank hangs")
    assert all(rank.returncode == 0 for rank in ranks), outputs
    seen = [json.loads(report.read_text()) for report in reports]
    assert seen[0] and seen[1] and sorted(seen[0] + seen[1]) == KEYS


@pytest.mark.slow
def test_an_s3_server_that_restarts_mid_epoch_costs_time_not_samples(s3, cache):
    remote = s3_reader(s3, cache, read_ahead=2, retries=20)  # a minute: weed restarts slowly
    seen, restarted = [], []
    for index, item in enumerate(remote.iter(chunk_size=64)):
        seen.append(item["key"])
        if index == N // 3:
            s3.stop()
            restart = threading.Thread(target=lambda: restarted.append(s3.start()))
            restart.start()
    restart.join(120)
    assert restarted and sorted(seen) == KEYS
