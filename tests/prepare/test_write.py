"""write_dataset on one machine: the partitions' samples in order, the same bytes on any
number of processes, exactly one commit a partition, resume, refused reruns, damaged
manifests, and every argument checked before anything is created."""

from __future__ import annotations

import json
import os

import pytest

from fpipe.dataset import MsgpackReader, ShardedReader
from fpipe.errors import FormatError
from fpipe.prepare import (
    SettingsChanged,
    from_generator,
    from_sources,
    verify_dataset,
    write_dataset,
)
from fpipe.prepare.writer import Job, _checked_job, write_partition

from . import jobs
from .jobs import SAMPLES, identities, tree


def prepared(out) -> list[dict]:
    return list(ShardedReader(os.path.join(out, "dataset.shards")))


def test_the_samples_are_the_partitions_in_order_through_the_transform(tmp_path):
    report = write_dataset(from_generator(jobs.rows, [2, 0, 1]), tmp_path / "out", jobs.doubled,
                           shard_size=15, n_workers=1)
    expected = [jobs.doubled(s) for p in (2, 0, 1) for s in jobs.rows(p)]
    assert prepared(tmp_path / "out") == expected
    assert (report.partitions, report.written, report.skipped, report.samples) == (3, 3, 0, 3 * SAMPLES)
    # 40 samples in shards of 15: 15, 15, 10 in each partition's folder
    assert [len(MsgpackReader(tmp_path / "out" / "part-000001" / f"0000{n}.msgpack"))
            for n in range(3)] == [15, 15, 10]
    assert sorted(os.listdir(tmp_path / "out")) == ["dataset.shards", "part-000000",
                                                     "part-000001", "part-000002"]


def test_two_processes_write_the_bytes_one_writes(tmp_path):
    partitions = from_generator(jobs.rows, range(5))
    write_dataset(partitions, tmp_path / "one", jobs.noisy, shard_size=7, seed=3, n_workers=1)
    write_dataset(partitions, tmp_path / "two", jobs.noisy, shard_size=7, seed=3, n_workers=2)
    assert tree(tmp_path / "one") == tree(tmp_path / "two")
    noise = [s["noise"] for s in prepared(tmp_path / "one")]
    assert len(set(noise)) == len(noise)  # each sample drew from its own generator


def test_the_draws_depend_on_seed_partition_and_index_only(tmp_path):
    from fpipe.random import item_rng

    write_dataset(from_generator(jobs.rows, [0, 1]), tmp_path / "out", jobs.noisy, seed=9,
                  n_workers=1)
    got = [s["noise"] for s in prepared(tmp_path / "out")]
    assert got == [float(item_rng(9, p, i).random()) for p in (0, 1) for i in range(SAMPLES)]


def test_a_transform_returning_none_leaves_the_sample_out(tmp_path):
    report = write_dataset(from_generator(jobs.rows, [0, 1]), tmp_path / "out", jobs.odd_only,
                           n_workers=1)
    assert report.samples == SAMPLES
    assert all(s["x"] % 2 for s in prepared(tmp_path / "out"))


def test_an_empty_partition_commits_no_shard(tmp_path):
    def some(partition):
        return jobs.rows(partition) if partition else []

    write_dataset(from_generator(some, [0, 1]), tmp_path / "out", n_workers=1)
    manifest = json.loads((tmp_path / "out" / "part-000000" / "manifest.json").read_text())
    assert manifest["shards"] == [] and len(prepared(tmp_path / "out")) == SAMPLES


def _job(out, transform=None) -> Job:
    job, _ = _checked_job(from_generator(jobs.rows, range(3)), out, transform, 10, 0, 1, None,
                          False, None, False)
    job.store().prepare()
    return job


def test_a_partition_task_run_twice_commits_once(tmp_path):
    job = _job(tmp_path / "out")
    first = write_partition(job, 1)
    files = identities(tmp_path / "out")
    second = write_partition(job, 1)
    assert first == {"partition": 1, "samples": SAMPLES, "written": True}
    assert second == {"partition": 1, "samples": SAMPLES, "written": False}
    assert identities(tmp_path / "out") == files  # the commit is left as it was
    assert not (tmp_path / "out" / ".attempts").exists()  # the second attempt removed its own


def test_two_attempts_racing_commit_one_and_the_other_deletes_its_files(tmp_path):
    job = _job(tmp_path / "out")
    store = job.store()
    first, second = store.begin(2), store.begin(2)
    for attempt in (first, second):  # both write all their shards before either commits
        from fpipe.prepare.writer import _write_shards

        attempt.shards = _write_shards(job, 2, attempt)
    from fpipe.prepare._manifest import manifest_text

    assert first.commit(manifest_text(2, "", first.shards, job.fingerprint(2)))
    assert not second.commit(manifest_text(2, "", second.shards, job.fingerprint(2)))
    assert not second.staging.exists()
    assert sorted(os.listdir(tmp_path / "out" / "part-000002")) == sorted(
        ["manifest.json"] + [f"0000{n}.msgpack{suffix}" for n in range(4)
                             for suffix in ("", ".offsets", ".keys", ".key_hashes", ".filter",
                                            ".key_index", ".md5")])


def test_a_rerun_skips_committed_partitions_and_leaves_their_files(tmp_path):
    partitions = from_generator(jobs.rows, range(4))
    write_dataset(partitions, tmp_path / "whole", jobs.noisy, shard_size=9, n_workers=1)
    job = _job(tmp_path / "out", jobs.noisy)
    job.shard_size, job.settings["shard_size"] = 9, 9
    for partition in (0, 2):  # a run that committed these two, then died
        write_partition(job, partition)
    before = identities(tmp_path / "out")
    report = write_dataset(partitions, tmp_path / "out", jobs.noisy, shard_size=9, n_workers=2)
    assert (report.written, report.skipped) == (2, 2)
    after = identities(tmp_path / "out")
    assert {name: after[name] for name in before} == before
    assert tree(tmp_path / "out") == tree(tmp_path / "whole")


@pytest.mark.parametrize("change, named", [
    ({"transform": jobs.doubled}, "transform (was 'noisy#"),
    ({"seed": 1}, "seed (was 0, now 1)"),
    ({"shard_size": 5}, "shard_size (was 10000, now 5)"),
    ({"partitions": from_generator(jobs.rows, [0, 7])}, "argument (was '1', now '7')"),
])
def test_a_rerun_with_other_settings_is_refused_naming_what_changed(tmp_path, change, named):
    settings = {"partitions": from_generator(jobs.rows, [0, 1]), "transform": jobs.noisy}
    write_dataset(settings["partitions"], tmp_path / "out", settings["transform"], n_workers=1)
    before = tree(tmp_path / "out")
    arguments = {**settings, **change}
    with pytest.raises(SettingsChanged, match="restart=True") as raised:
        write_dataset(arguments.pop("partitions"), tmp_path / "out", arguments.pop("transform"),
                      n_workers=1, **arguments)
    assert named in str(raised.value), raised.value
    assert tree(tmp_path / "out") == before
    write_dataset(from_generator(jobs.rows, [0, 1]) if "partitions" not in change else change["partitions"],
                  tmp_path / "out", change.get("transform", jobs.noisy), n_workers=1,
                  restart=True, **{k: v for k, v in change.items() if k not in ("partitions", "transform")})
    verify_dataset(tmp_path / "out")


def test_a_job_of_fewer_partitions_than_committed_is_refused(tmp_path):
    write_dataset(from_generator(jobs.rows, range(3)), tmp_path / "out", n_workers=1)
    with pytest.raises(SettingsChanged, match="holds partition 2, and this job has 2 partitions"):
        write_dataset(from_generator(jobs.rows, range(2)), tmp_path / "out", n_workers=1)


@pytest.mark.parametrize("content, says", [
    (b"{not json", "a partition manifest that is not JSON"),
    (b'{"format": "mosaic-index", "shards": []}', "not a partition manifest of fpipe"),
    (b'{"format": "fpipe-partition", "version": 9}', "of version 9"),
])
def test_a_damaged_or_foreign_manifest_is_a_format_error_naming_it(tmp_path, content, says):
    write_dataset(from_generator(jobs.rows, range(2)), tmp_path / "out", n_workers=1)
    manifest = tmp_path / "out" / "part-000001" / "manifest.json"
    manifest.write_bytes(content)
    for call in (lambda: write_dataset(from_generator(jobs.rows, range(2)), tmp_path / "out",
                                       n_workers=1),
                 lambda: verify_dataset(tmp_path / "out")):
        with pytest.raises(FormatError, match=says) as raised:
            call()
        assert str(manifest) in str(raised.value)


def test_a_manifest_with_impossible_shards_is_a_format_error(tmp_path):
    write_dataset(from_generator(jobs.rows, range(1)), tmp_path / "out", n_workers=1)
    manifest = tmp_path / "out" / "part-000000" / "manifest.json"
    content = json.loads(manifest.read_text())
    for field, value, says in (("samples", -1, "samples=-1"), ("md5", "xyz", "which is no MD5"),
                               ("name", "../../etc/passwd", "which no shard of fpipe has")):
        broken = {**content, "shards": [{**content["shards"][0], field: value}]}
        manifest.write_text(json.dumps(broken))
        with pytest.raises(FormatError, match=f"{manifest}: shard 0 of the manifest .*{says}"):
            verify_dataset(tmp_path / "out")


def test_verify_names_a_damaged_shard_and_a_missing_index(tmp_path):
    write_dataset(from_generator(jobs.rows, range(2)), tmp_path / "out", shard_size=25, n_workers=1)
    assert verify_dataset(tmp_path / "out")["samples"] == 2 * SAMPLES
    shard = tmp_path / "out" / "part-000001" / "00001.msgpack"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(FormatError, match=f"{shard}: its MD5 is"):
        verify_dataset(tmp_path / "out")
    shard.write_bytes(data[:-1])
    with pytest.raises(FormatError, match=f"{shard}: .* bytes, its manifest says"):
        verify_dataset(tmp_path / "out")
    (tmp_path / "out" / "dataset.shards").unlink()
    with pytest.raises(FileNotFoundError, match="no shard index"):
        verify_dataset(tmp_path / "out")


def test_dead_attempts_are_swept_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    attempts = out / ".attempts"
    dead = attempts / "part-000001.0123456789ab"
    dead.mkdir(parents=True)
    (dead / "00000.msgpack").write_bytes(b"half")
    (attempts / "notes.txt").write_text("mine")
    (out / "README").write_text("mine too")
    report = write_dataset(from_generator(jobs.rows, range(2)), out, n_workers=1)
    assert report.swept == 1 and not dead.exists()
    assert (attempts / "notes.txt").read_text() == "mine" and (out / "README").exists()


def test_an_error_in_the_transform_commits_nothing_and_a_fixed_rerun_finishes(tmp_path):
    def failing(sample):
        if sample["x"] == 1005:
            raise ValueError("bad sample")
        return sample

    with pytest.raises(ValueError, match="bad sample"):
        write_dataset(from_generator(jobs.rows, range(3)), tmp_path / "out", failing, n_workers=1)
    assert sorted(os.listdir(tmp_path / "out")) == ["part-000000"]  # no staging left
    with pytest.raises(SettingsChanged, match="transform"):
        write_dataset(from_generator(jobs.rows, range(3)), tmp_path / "out", n_workers=1)
    write_dataset(from_generator(jobs.rows, range(3)), tmp_path / "out", n_workers=1, restart=True)
    assert len(prepared(tmp_path / "out")) == 3 * SAMPLES


def test_a_transform_that_returns_no_sample_is_a_type_error_naming_where(tmp_path):
    with pytest.raises(TypeError, match="partition 0, sample 0: the transform must return a dict"):
        write_dataset(from_generator(jobs.rows, [0]), tmp_path / "out", lambda s: [s], n_workers=1)


def test_an_error_in_a_worker_process_reaches_the_caller(tmp_path):
    with pytest.raises(KeyError):
        write_dataset(from_generator(jobs.rows, range(3)), tmp_path / "out", _needs_label,
                      n_workers=2)


def _needs_label(sample):
    return {**sample, "y": sample["label"]}


def test_sources_split_by_file_write_what_fpipe_write_writes(tmp_path):
    from fpipe.cli import main
    from fpipe.formats import TFRecordWriter

    for part in range(3):
        with TFRecordWriter(tmp_path / f"r-{part}.tfrecord") as writer:
            for i in range(5):
                writer.write({"x": [part * 10 + i], "name": [b"n%d" % i]})
    pattern = str(tmp_path / "r-*.tfrecord")
    report = write_dataset(pattern, tmp_path / "out", n_workers=1)
    assert report.partitions == 3
    assert main(["write", pattern, str(tmp_path / "all.msgpack"), "-q"]) == 0
    whole = list(MsgpackReader(tmp_path / "all.msgpack"))
    assert [s["key"] for s in prepared(tmp_path / "out")] == [s["key"] for s in whole]
    assert all(a["x"] == b["x"] for a, b in zip(prepared(tmp_path / "out"), whole))


def test_from_sources_refuses_what_it_cannot_split(tmp_path):
    (tmp_path / "photos").mkdir()
    with pytest.raises(ValueError, match="sources must be WebDataset, Parquet/Arrow, TFRecord"):
        from_sources(str(tmp_path / "photos"))
    with pytest.raises(TypeError, match="sources must be paths"):
        from_sources([3])
    with pytest.raises(ValueError, match="arguments must hold one argument a partition"):
        from_generator(jobs.rows, [])


@pytest.mark.parametrize("options, error, says", [
    ({"shard_size": 0}, ValueError, "shard_size"),
    ({"shard_size": 2.5}, TypeError, "shard_size"),
    ({"seed": -1}, ValueError, "seed"),
    ({"n_workers": 0}, ValueError, "n_workers"),
    ({"restart": "yes"}, TypeError, "restart"),
    ({"progress": 1}, TypeError, "progress"),
    ({"storage_options": {"anon": True}}, ValueError, "storage_options"),
    ({"storage_options": "anon"}, TypeError, "storage_options"),
    ({"cluster": 3}, TypeError, "cluster"),
    ({"cluster": "tcp://127.0.0.1:1", "n_workers": 2}, ValueError, "n_workers"),
    ({"transform": 5}, TypeError, "transform"),
    ({"partitions": [1, 2]}, TypeError, "partitions"),
    ({"out": 3}, TypeError, "out"),
    ({"shard_sise": 3}, TypeError, "shard_sise"),
])
def test_every_argument_is_checked_before_anything_exists(tmp_path, options, error, says):
    arguments = {"partitions": from_generator(jobs.rows, [0]), "out": tmp_path / "out", **options}
    with pytest.raises(error, match=says):
        write_dataset(**arguments)
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "out").write_text("a file")
    with pytest.raises(NotADirectoryError, match="out is the folder"):
        write_dataset(from_generator(jobs.rows, [0]), tmp_path / "out", n_workers=1)


def test_a_job_extended_by_new_partitions_appends_them_and_keeps_the_others(tmp_path):
    write_dataset(from_generator(jobs.rows, range(2)), tmp_path / "out", jobs.noisy, n_workers=1)
    before = identities(tmp_path / "out")
    report = write_dataset(from_generator(jobs.rows, range(4)), tmp_path / "out", jobs.noisy,
                           n_workers=2)
    assert (report.written, report.skipped, report.samples) == (2, 2, 4 * SAMPLES)
    after = identities(tmp_path / "out")
    kept = {name: identity for name, identity in before.items() if name.startswith("part-")}
    assert {name: after[name] for name in kept} == kept
    write_dataset(from_generator(jobs.rows, range(4)), tmp_path / "whole", jobs.noisy, n_workers=1)
    assert tree(tmp_path / "out") == tree(tmp_path / "whole")


def test_new_partitions_given_without_the_old_ones_are_refused(tmp_path):
    write_dataset(from_generator(jobs.rows, range(2)), tmp_path / "out", n_workers=1)
    with pytest.raises(SettingsChanged, match=r"argument \(was '0', now '2'\) in partition 0"):
        write_dataset(from_generator(jobs.rows, [2, 3]), tmp_path / "out", n_workers=1)


def test_a_source_file_given_twice_is_refused(tmp_path):
    from fpipe.formats import TFRecordWriter

    with TFRecordWriter(tmp_path / "a.tfrecord") as writer:
        writer.write({"x": [1]})
    with pytest.raises(ValueError, match=r"a.tfrecord is partition 0 and partition 1"):
        from_sources([str(tmp_path / "a.tfrecord"), str(tmp_path / "." / "a.tfrecord")])


def test_files_beside_the_output_survive_a_job_a_rerun_and_a_restart(tmp_path):
    # the user's files in OUT and beside it, named like what a job writes: only the job's own
    # names (part-NNNNNN, dataset.shards, attempts in .attempts) are ever the job's to remove
    out = tmp_path / "out"
    (out / ".attempts" / "mine").mkdir(parents=True)
    (out / ".attempts" / "mine" / "keep.txt").write_text("keep")
    (out / "part-notes").mkdir()
    (out / "part-notes" / "keep.txt").write_text("keep")
    (out / "dataset.shards.bak").write_text("keep")
    (out / "README").write_text("keep")
    (tmp_path / "out.msgpack").write_text("keep")
    ours = {path.relative_to(tmp_path): path.read_text() for path in tmp_path.rglob("*")
            if path.is_file()}
    for restart in (False, False, True):
        write_dataset(from_generator(jobs.rows, range(2)), out, n_workers=1, restart=restart)
        assert {path: (tmp_path / path).read_text() for path in ours} == ours
    assert len(list(ShardedReader(str(out / "dataset.shards")))) == 2 * SAMPLES
