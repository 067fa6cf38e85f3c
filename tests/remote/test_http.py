"""A reader at an http:// URL does what a local reader does, through the block cache, and
survives a hostile server: retries, clear errors, never a wrong record, never a hang."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from fpipe.dataset import MsgpackReader, ShardedReader
from fpipe.errors import FormatError
from fpipe.orderings import IndexShuffler, QuasiShuffler, Range, Shuffler
from fpipe.remote import RemoteOptions
from fpipe.remote.urls import RemoteError, _HttpFetcher

from .conftest import BLOCK, N, sample


def reader(http, cache, name="train.msgpack", **options) -> MsgpackReader:
    options = {"cache_dir": cache, "block_size": BLOCK, **options}
    return MsgpackReader(http.url(name), remote=RemoteOptions(**options))


def block_files(cache) -> list:
    return [p for p in cache.glob("*/blocks/*") if not p.name.startswith(".")]


def held_bytes(cache) -> int:
    """The bytes of the finished block files (a file evicted while we look counts nothing)."""
    total = 0
    for path in block_files(cache):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def test_a_url_reads_like_the_local_file(http, served, cache):
    remote, local = reader(http, cache), MsgpackReader(served / "train.msgpack")
    assert len(remote) == len(local) == N
    assert remote.get(17) == local.get(17) == sample(17)
    assert remote.get(-1, yield_key=True) == local.get(-1, yield_key=True)
    assert remote.get(5, raw=True) == local.get(5, raw=True)
    assert remote[100:140:3] == local[100:140:3]
    assert remote.get_many([2999, 0, 1500, 0]) == local.get_many([2999, 0, 1500, 0])
    assert list(remote.iter(10, 2000, yield_key=True)) == list(local.iter(10, 2000, yield_key=True))
    assert "002500" in remote and "x" not in remote
    assert remote.find_index("002500") == 2500 and remote.find_key(7) == "000007"
    assert remote.verify_data() and remote.verify_index()
    assert repr(remote) == f"MsgpackReader({http.url('train.msgpack')!r})"


def test_a_url_reader_pickles_and_reads_in_the_copy(http, cache):
    remote = reader(http, cache)
    remote.get(0)
    copy = pickle.loads(pickle.dumps(remote))
    assert copy.get(2999) == sample(2999) and len(copy) == N


def test_a_random_get_costs_one_block(http, cache):
    remote = reader(http, cache, read_ahead=0)
    before = http.faults.ranged_gets
    assert remote.get(1234) == sample(1234)
    assert http.faults.ranged_gets - before == 1
    assert remote.get(1235) == sample(1235)  # the same block, already here
    assert http.faults.ranged_gets - before == 1


def test_every_block_is_fetched_once_for_an_epoch_and_never_for_the_next(http, cache):
    remote = reader(http, cache)
    shuffler = Shuffler(remote, seed=0)
    assert sorted(s["key"] for s in shuffler) == [sample(i)["key"] for i in range(N)]
    fetched = http.faults.ranged_gets
    assert fetched == len(block_files(cache))  # one ranged GET a block (index files: whole)
    again = reader(http, cache)  # a new reader on the same cache (another worker, say)
    assert [s["key"] for s in again] == [sample(i)["key"] for i in range(N)]
    assert http.faults.ranged_gets == fetched


def test_an_index_shuffler_reads_a_url_as_the_local_file_fetching_each_block_once(
        http, served, cache):
    remote, local = reader(http, cache, read_ahead=4), MsgpackReader(served / "train.msgpack")
    order = [s["key"] for s in IndexShuffler(remote, seed=5)]
    assert order == [s["key"] for s in IndexShuffler(local, seed=5)]
    assert sorted(order) == [sample(i)["key"] for i in range(N)]
    assert http.faults.ranged_gets == len(block_files(cache))  # hinted ahead, fetched once


@pytest.mark.parametrize("fault", ["500", "short", "shifted", "whole"])
def test_a_bad_response_is_retried_and_never_decoded(http, cache, fault):
    remote = reader(http, cache, read_ahead=0)
    http.faults.add(fault, fault)
    before = http.faults.ranged_gets
    assert remote.get(2000) == sample(2000)
    assert http.faults.ranged_gets - before == 3


def test_a_stalled_response_times_out_and_is_retried(http, cache):
    remote = reader(http, cache, read_ahead=0, timeout=0.5)
    http.faults.add("stall")
    before = http.faults.ranged_gets
    assert remote.get(2000) == sample(2000)
    assert http.faults.ranged_gets - before == 2


def test_after_the_retries_the_error_names_the_url_the_samples_and_the_bytes(http, cache):
    remote = reader(http, cache, read_ahead=0, retries=2)
    http.faults.add("500", "500", "500")
    with pytest.raises(RemoteError) as caught:
        remote.get(2000)
    error = caught.value
    assert error.url == http.url("train.msgpack") and error.samples[0] <= 2000 < error.samples[1]
    assert f"bytes {error.start} to {error.stop}" in str(error) and "HTTP 500" in str(error)
    assert "3 attempts" in str(error)
    assert remote.get(2000) == sample(2000)  # the server is fine again: so is the reader


def test_a_damaged_cache_block_is_fetched_again(http, cache):
    remote = reader(http, cache, read_ahead=0)
    remote.get(0)
    (block,) = block_files(cache)
    damaged = bytearray(block.read_bytes())
    damaged[10] ^= 0xFF
    block.write_bytes(bytes(damaged))
    before = http.faults.ranged_gets
    assert reader(http, cache, read_ahead=0).get(3) == sample(3)
    assert http.faults.ranged_gets == before + 1
    block.write_bytes(bytes(damaged[:100]))  # torn: too short
    assert reader(http, cache, read_ahead=0).get(3) == sample(3)
    assert http.faults.ranged_gets == before + 2


def test_the_cache_stays_within_its_budget(http, cache):
    limit = 5 * BLOCK
    remote = reader(http, cache, cache_bytes=limit)
    for index, sample_read in enumerate(Shuffler(remote, seed=1)):
        assert sample_read["data"][:4] != b""  # decoded
        if index % 50 == 0:
            held = held_bytes(cache)
            # the limit, plus the block being written and those read ahead in flight
            assert held <= limit + BLOCK + 4, (index, held)
    assert int((cache / ".usage").read_text()) <= limit


def test_orderings_read_every_sample_once_with_read_ahead(http, cache):
    remote = reader(http, cache, read_ahead=4)
    expected = sorted(sample(i)["key"] for i in range(N))
    assert sorted(s["key"] for s in QuasiShuffler(remote, buf_size=0.05, seed=3)) == expected
    assert [s["key"] for s in Range(remote, 10, 20)] == expected[10:20]


def test_a_server_that_goes_away_mid_epoch_costs_time_not_samples(http, cache, monkeypatch):
    failures = []
    read = _HttpFetcher.read

    def recorded(self, start, stop):
        try:
            return read(self, start, stop)
        except Exception as error:
            failures.append(error)
            raise

    monkeypatch.setattr(_HttpFetcher, "read", recorded)
    remote = reader(http, cache, read_ahead=0, retries=8)
    seen = []
    for index, item in enumerate(QuasiShuffler(remote, buf_size=0.01, chunk_size=64, seed=2)):
        seen.append(item["key"])
        if index == N // 2:
            http.stop()
            threading.Timer(0.3, http.start).start()  # the outage lasts a while
    assert sorted(seen) == sorted(sample(i)["key"] for i in range(N))
    assert failures, "the reader met the outage"


def test_a_sharded_reader_reads_urls(http, cache):
    shards = ShardedReader([http.url("train.msgpack"), http.url("shard-1.msgpack")],
                           remote=RemoteOptions(cache_dir=cache, block_size=BLOCK))
    assert len(shards) == N + 500
    assert shards.get(N + 10) == sample(10) and shards.find_index("000499") == 499
    assert sorted(s["key"] for s in Shuffler(shards, seed=0))[-1] == "002999"


def test_an_index_file_that_does_not_match_the_md5_file_is_an_error(http, served, cache, tmp_path):
    damaged = served / "damaged.msgpack"
    for path in served.glob("shard-1.msgpack*"):
        data = path.read_bytes()
        if path.name.endswith(".keys"):
            data = data[:-1] + bytes([data[-1] ^ 1])
        (served / path.name.replace("shard-1", "damaged")).write_bytes(data)
    (served / "damaged.msgpack.md5").write_text(
        (served / "shard-1.msgpack.md5").read_text().replace("shard-1", "damaged"))
    try:
        with pytest.raises(FormatError, match=r"damaged\.msgpack\.keys does not match"):
            MsgpackReader(http.url(damaged.name), remote=RemoteOptions(cache_dir=cache))
    finally:
        for path in served.glob("damaged.msgpack*"):
            path.unlink()


def test_a_data_file_of_the_wrong_size_is_an_error(http, served, cache):
    for path in served.glob("shard-1.msgpack*"):
        (served / path.name.replace("shard-1", "longer")).write_bytes(path.read_bytes())
    with open(served / "longer.msgpack", "ab") as file:
        file.write(b"\0")
    try:
        with pytest.raises(FormatError, match="has 2 bytes more|the index ends at byte"):
            MsgpackReader(http.url("longer.msgpack"), remote=RemoteOptions(cache_dir=cache)).get(0)
    finally:
        for path in served.glob("longer.msgpack*"):
            path.unlink()


def test_a_missing_dataset_is_file_not_found(http, cache):
    with pytest.raises(FileNotFoundError):
        MsgpackReader(http.url("absent.msgpack"), remote=RemoteOptions(cache_dir=cache))


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"storage_options": []}, TypeError, "storage_options must be a dict; got a list"),
    ({"storage_options": {"anon": True}}, ValueError, r"storage_options keys \['anon'\]"),
    ({"block_size": 0}, ValueError, "block_size must be >= 1; got block_size=0"),
    ({"block_size": 1.5}, TypeError, "block_size"),
    ({"cache_bytes": 100, "block_size": 1000}, ValueError, "cache_bytes must hold at least one block"),
    ({"read_ahead": -1}, ValueError, "read_ahead must be >= 0"),
    ({"retries": "3"}, TypeError, "retries"),
    ({"timeout": 0}, ValueError, "timeout must be > 0 seconds; got timeout=0"),
    ({"timeout": "1"}, TypeError, "timeout must be a number"),
])
def test_bad_remote_options_are_refused_at_construction(http, cache, options, error, match):
    with pytest.raises(error, match=match):
        MsgpackReader(http.url("train.msgpack"), remote=RemoteOptions(cache_dir=cache, **options))


def test_remote_options_on_a_local_path_are_refused(served):
    with pytest.raises(ValueError, match=r"remote=RemoteOptions\(retries=3\) only applies to URLs"):
        MsgpackReader(served / "train.msgpack", remote=RemoteOptions(retries=3))


@pytest.mark.parametrize("old", ["cache_limit", "cache_dir", "storage_options", "block_size",
                                 "read_ahead", "retries", "timeout"])
def test_the_old_remote_keywords_say_what_replaces_them(served, old):
    new = "cache_bytes" if old == "cache_limit" else old
    with pytest.raises(TypeError, match=rf"^MsgpackReader got an unexpected keyword argument "
                                        rf"'{old}': .* remote=RemoteOptions\({new}=\.\.\.\)"):
        MsgpackReader(served / "train.msgpack", **{old: 10})
    with pytest.raises(TypeError, match=rf"ShardedReader got an unexpected keyword argument '{old}'"):
        ShardedReader([served / "train.msgpack"], **{old: 10})


def test_a_url_must_name_a_file(cache):
    with pytest.raises(ValueError, match="the URL must name a data file"):
        MsgpackReader("http://127.0.0.1:1/", remote=RemoteOptions(cache_dir=cache))


def test_prefetch_ignores_indices_out_of_range(http, cache):
    remote = reader(http, cache)
    remote.prefetch(np.array([-5, N + 3]))
    remote.prefetch([])
    assert remote.get(0) == sample(0)


def test_dataloader_workers_share_the_cache_and_fetch_each_block_once(http, cache):
    from torch.utils.data import DataLoader

    from fpipe.torch import Dataset

    dataset = Dataset(reader(http, cache))
    after_index = http.faults.ranged_gets
    keys = [k for batch in DataLoader(dataset, batch_size=50, num_workers=2, shuffle=True)
            for k in batch["key"]]
    assert sorted(keys) == [sample(i)["key"] for i in range(N)]
    assert http.faults.ranged_gets - after_index == len(block_files(cache))


def test_an_index_file_that_cannot_be_fetched_is_a_remote_error_naming_it(http, cache):
    http.faults.whole_pending.extend(["500"] * 10)
    with pytest.raises(RemoteError, match=r"train\.msgpack\.\w+: gave up after 2 attempts; "
                                          r"last: HTTP 500"):
        reader(http, cache, retries=1)
    http.faults.whole_pending.clear()
    assert reader(http, cache, retries=1).get(0) == sample(0)
