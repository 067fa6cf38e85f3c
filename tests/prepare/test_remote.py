"""A dataset prepared into object storage (SeaweedFS's S3 on loopback): the manifest written
last commits a partition, a second attempt leaves the commit alone, dead attempts' shards are
swept, a damaged or foreign manifest is a FormatError naming its URL."""

from __future__ import annotations

import json

import pytest

from fpipe.dataset import ShardedReader
from fpipe.errors import FormatError
from fpipe.prepare import from_generator, verify_dataset, write_dataset
from fpipe.prepare._manifest import manifest_text
from fpipe.prepare.writer import _checked_job, _write_shards, write_partition
from fpipe.remote import RemoteOptions

from . import jobs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    import s3fs

    from tests.remote.servers import SeaweedS3

    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    try:
        s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True).mkdir("prep")
        yield server
    finally:
        server.stop()


def _fs(s3):
    import s3fs

    return s3fs.S3FileSystem(**s3.storage_options, skip_instance_cache=True)


def _manifests(read) -> list[dict]:
    return [json.loads(read(p)) for p in range(3)]


def test_a_dataset_prepared_into_object_storage_reads_as_the_local_one(s3, tmp_path):
    url = "s3://prep/whole"
    partitions = from_generator(jobs.rows, range(3))
    report = write_dataset(partitions, url, jobs.noisy, shard_size=15, n_workers=2,
                           storage_options=s3.storage_options)
    write_dataset(partitions, tmp_path / "local", jobs.noisy, shard_size=15, n_workers=1)
    assert report.index == f"{url}/dataset.shards" and report.samples == 3 * jobs.SAMPLES
    remote = list(ShardedReader(report.index, remote=RemoteOptions(storage_options=s3.storage_options)))
    assert remote == list(ShardedReader(str(tmp_path / "local" / "dataset.shards")))
    fs = _fs(s3)
    remote_manifests = _manifests(lambda p: fs.cat(f"prep/whole/part-{p:06d}/manifest.json"))
    local_manifests = _manifests(
        lambda p: (tmp_path / "local" / f"part-{p:06d}" / "manifest.json").read_bytes())
    for far, near in zip(remote_manifests, local_manifests):  # the same shard bytes
        assert [(s["md5"], s["size"], s["samples"]) for s in far["shards"]] == \
               [(s["md5"], s["size"], s["samples"]) for s in near["shards"]]
        assert all(s["name"].startswith(f"a-{far['attempt']}/") for s in far["shards"])
    assert verify_dataset(url, storage_options=s3.storage_options)["samples"] == 3 * jobs.SAMPLES
    again = write_dataset(partitions, url, jobs.noisy, shard_size=15, n_workers=1,
                          storage_options=s3.storage_options)
    assert (again.written, again.skipped) == (0, 3)


def test_a_second_attempt_leaves_the_commit_and_dead_attempts_are_swept(s3):
    url = "s3://prep/attempts"
    job, _ = _checked_job(from_generator(jobs.rows, range(2)), url, None, 25, 0, 1, None, False,
                          s3.storage_options, False)
    store = job.store()
    dead = store.begin(1)  # an attempt that uploaded its shards and died before its commit
    _write_shards(job, 1, dead)
    racing = store.begin(0)  # an attempt that loses the race for partition 0
    shards = _write_shards(job, 0, racing)
    assert write_partition(job, 0)["written"]
    assert not racing.commit(manifest_text(0, racing.token, shards, job.fingerprint(0)))
    fs = _fs(s3)
    assert not fs.exists(f"prep/attempts/part-000000/a-{racing.token}")
    assert write_partition(job, 0) == {"partition": 0, "samples": jobs.SAMPLES, "written": False}
    report = write_dataset(from_generator(jobs.rows, range(2)), url, shard_size=25,
                           n_workers=1, storage_options=s3.storage_options)
    assert (report.written, report.skipped, report.swept) == (1, 1, 1)
    assert not fs.exists(f"prep/attempts/part-000001/a-{dead.token}")
    kept = json.loads(fs.cat("prep/attempts/part-000001/manifest.json"))["attempt"]
    assert {p.split("/")[3] for p in fs.find("prep/attempts/part-000001")} == \
        {f"a-{kept}", "manifest.json"}


@pytest.mark.parametrize("content, says", [
    (b"\x00\x01 not json", "not JSON"),
    (b'{"format": "litdata-index", "chunks": []}', "not a partition manifest of fpipe"),
])
def test_a_damaged_or_foreign_manifest_in_object_storage_is_named(s3, content, says):
    url = f"s3://prep/damaged-{len(content)}"
    write_dataset(from_generator(jobs.rows, range(2)), url, n_workers=1,
                  storage_options=s3.storage_options)
    _fs(s3).pipe(f"{url[5:]}/part-000001/manifest.json", content)
    with pytest.raises(FormatError, match=says) as raised:
        write_dataset(from_generator(jobs.rows, range(2)), url, n_workers=1,
                      storage_options=s3.storage_options)
    assert f"{url}/part-000001/manifest.json" in str(raised.value)
    with pytest.raises(FormatError, match=says):
        verify_dataset(url, storage_options=s3.storage_options)


def test_secrets_stay_out_of_the_messages(s3):
    options = {**s3.storage_options}
    with pytest.raises(FormatError) as raised:
        url = "s3://prep/secret"
        write_dataset(from_generator(jobs.rows, [0]), url, n_workers=1, storage_options=options)
        _fs(s3).pipe("prep/secret/part-000000/manifest.json", b"{}")
        write_dataset(from_generator(jobs.rows, [0]), url, n_workers=1, storage_options=options)
    assert s3.SECRET not in str(raised.value)


def test_a_live_lease_of_another_client_is_refused_and_a_lapsed_one_taken_over(s3):
    import time

    from fpipe.prepare import JobRunning

    url, fs = "s3://prep/leased", _fs(s3)
    partitions = from_generator(jobs.rows, range(2))
    lease = {"pid": 4242, "host": "elsewhere", "since": time.time(), "owner": "0" * 12}
    fs.pipe_file("prep/leased/.fpipe-prepare.lease",
                 json.dumps({**lease, "expires": time.time() + 60}).encode())
    with pytest.raises(JobRunning, match=r"prep/leased is being prepared by another job "
                                         r"\(process 4242 on elsewhere.*lapses in \d+ s"):
        write_dataset(partitions, url, shard_size=15, n_workers=1, storage_options=s3.storage_options)
    assert not fs.exists("prep/leased/part-000000")
    fs.pipe_file("prep/leased/.fpipe-prepare.lease",
                 json.dumps({**lease, "expires": time.time() - 1}).encode())
    report = write_dataset(partitions, url, shard_size=15, n_workers=1,
                           storage_options=s3.storage_options)
    assert report.written == 2
    assert not _fs(s3).exists("prep/leased/.fpipe-prepare.lease")  # gone with the job
