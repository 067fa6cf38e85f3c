"""Failures in the middle of a job: a worker process SIGKILLed (local processes and a dask
LocalCluster), the client process SIGKILLed; the job finishes, or the same call again does,
with every key once and the bytes of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fpipe.dataset import ShardedReader
from fpipe.prepare import from_generator, verify_dataset, write_dataset

from . import jobs
from .jobs import identities, tree

PARTITIONS = 6
AT = 3


def _keys(out: Path) -> list[str]:
    return [sample["key"] for sample in ShardedReader(str(out / "dataset.shards"))]


def _expected_keys() -> list[str]:
    return [sample["key"] for p in range(PARTITIONS) for sample in jobs.rows(p)]


def _uninterrupted(folder: Path, out: Path) -> dict[str, bytes]:
    """The files of the same job run through in one process (the stop marker exists by
    then, so the same generator, with the same fingerprint, runs through)."""
    assert (folder / f"stopped-{AT}").exists()
    write_dataset(from_generator(jobs.Stopping(str(folder), AT), range(PARTITIONS)), out,
                  jobs.noisy, shard_size=15, n_workers=1)
    return tree(out)


class Killer(threading.Thread):
    """Kills the process that stops at partition ``AT`` once it has announced itself."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.error, self.killed = folder, None, None

    def run(self) -> None:
        try:
            self.killed = jobs.wait_for_stop(self.folder, AT)
            os.kill(self.killed, signal.SIGKILL)
        except BaseException as error:  # reported by the test
            self.error = error


@pytest.mark.slow
def test_a_local_worker_process_killed_mid_job_and_the_job_finishes(tmp_path):
    killer = Killer(tmp_path)
    killer.start()
    report = write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT), range(PARTITIONS)),
                           tmp_path / "out", jobs.noisy, shard_size=15, n_workers=2)
    killer.join(60)
    assert killer.error is None and killer.killed not in (None, os.getpid())
    assert report.written == PARTITIONS and report.swept >= 1  # the killed attempt's staging
    assert _keys(tmp_path / "out") == _expected_keys()
    assert tree(tmp_path / "out") == _uninterrupted(tmp_path, tmp_path / "one")
    verify_dataset(tmp_path / "out")


@pytest.mark.slow
def test_a_dask_worker_killed_mid_job_and_the_job_finishes(tmp_path):
    from distributed import Client, LocalCluster

    killer = Killer(tmp_path)
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        killer.start()
        report = write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT), range(PARTITIONS)),
                               tmp_path / "out", jobs.noisy, shard_size=15, cluster=client)
        killer.join(60)
        worker_pids = set(client.run(os.getpid).values())
    assert killer.error is None and killer.killed not in worker_pids | {os.getpid()}
    assert report.written == PARTITIONS and report.swept == 1
    assert _keys(tmp_path / "out") == _expected_keys()
    assert tree(tmp_path / "out") == _uninterrupted(tmp_path, tmp_path / "one")


@pytest.mark.slow
def test_the_client_killed_half_way_then_the_same_call_finishes_the_job(tmp_path):
    out = tmp_path / "out"
    root = str(Path(__file__).resolve().parents[2])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    # the job's generator must be tests.prepare.jobs.Stopping (not __main__'s) in both runs
    call = (f"from tests.prepare.jobs import run_stopping_job; "
            f"run_stopping_job({str(out)!r}, {str(tmp_path)!r}, {AT}, {PARTITIONS})")
    client = subprocess.Popen([sys.executable, "-c", call], env=environment, cwd=root)
    try:
        assert jobs.wait_for_stop(tmp_path, AT) == client.pid
    finally:
        client.kill()
        client.wait(60)
    assert client.returncode == -signal.SIGKILL
    committed = sorted(name for name in os.listdir(out) if name.startswith("part-"))
    assert committed == [f"part-{p:06d}" for p in range(AT)]
    assert os.listdir(out / ".attempts")  # the killed attempt's staging folder
    before = identities(out)
    report = write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT), range(PARTITIONS)),
                           out, jobs.noisy, shard_size=15, n_workers=2)
    assert (report.written, report.skipped, report.swept) == (PARTITIONS - AT, AT, 1)
    after = identities(out)
    untouched = {name: identity for name, identity in before.items() if name.startswith("part-")}
    assert untouched and {name: after[name] for name in untouched} == untouched
    assert not (out / ".attempts").exists()
    assert tree(out) == _uninterrupted(tmp_path, tmp_path / "one")


@pytest.mark.slow
def test_ctrl_c_in_the_client_abandons_its_attempt_and_the_same_call_finishes(tmp_path):
    out = tmp_path / "out"
    root = str(Path(__file__).resolve().parents[2])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    call = (f"from tests.prepare.jobs import run_stopping_job; "
            f"run_stopping_job({str(out)!r}, {str(tmp_path)!r}, {AT}, {PARTITIONS})")
    client = subprocess.Popen([sys.executable, "-c", call], env=environment, cwd=root,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert jobs.wait_for_stop(tmp_path, AT) == client.pid
        client.send_signal(signal.SIGINT)
        _, stderr = client.communicate(timeout=60)
    finally:
        client.kill()
    assert "KeyboardInterrupt" in stderr
    assert sorted(os.listdir(out)) == [f"part-{p:06d}" for p in range(AT)]  # nothing staged left
    report = write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT), range(PARTITIONS)),
                           out, jobs.noisy, shard_size=15, n_workers=1)
    assert (report.written, report.skipped, report.swept) == (PARTITIONS - AT, AT, 0)
    assert tree(out) == _uninterrupted(tmp_path, tmp_path / "one")


def _client(out: Path, folder: Path, cluster: str | None = None) -> subprocess.Popen:
    """A client process running the stopping job into ``out``."""
    root = str(Path(__file__).resolve().parents[2])
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    call = (f"from tests.prepare.jobs import run_stopping_job; "
            f"run_stopping_job({str(out)!r}, {str(folder)!r}, {AT}, {PARTITIONS}, {cluster!r})")
    return subprocess.Popen([sys.executable, "-c", call], env=environment, cwd=root)


@pytest.mark.slow
def test_a_second_client_on_the_same_out_is_refused_while_the_first_runs(tmp_path):
    from fpipe.prepare.writer import JobRunning

    out = tmp_path / "out"
    client = _client(out, tmp_path)
    try:
        assert jobs.wait_for_stop(tmp_path, AT) == client.pid
        before = identities(out)
        with pytest.raises(JobRunning, match=rf"{out} is being prepared by another job "
                                             rf"\(process {client.pid} on .*run one job at a time"):
            write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT), range(PARTITIONS)),
                          out, jobs.noisy, shard_size=15, n_workers=1)
        assert identities(out) == before  # the refused client touched nothing
    finally:
        client.kill()
        client.wait(60)
    report = write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT), range(PARTITIONS)),
                           out, jobs.noisy, shard_size=15, n_workers=1)  # the lock died with it
    assert (report.written, report.skipped) == (PARTITIONS - AT, AT)
    assert not (out / ".fpipe-prepare.lock").exists()
    assert tree(out) == _uninterrupted(tmp_path, tmp_path / "one")


@pytest.mark.slow
def test_a_dask_client_killed_mid_job_then_the_same_call_finishes(tmp_path):
    from distributed import Client, LocalCluster

    out = tmp_path / "out"
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        client = _client(out, tmp_path, cluster.scheduler_address)
        try:
            stopped = jobs.wait_for_stop(tmp_path, AT)  # a worker, in partition AT's task
        finally:
            client.kill()
            client.wait(60)
        assert client.returncode == -signal.SIGKILL
        with Client(cluster) as rerun:
            assert stopped in set(rerun.run(os.getpid).values())
            os.kill(stopped, signal.SIGKILL)  # the orphaned task would wait out its minutes
            report = write_dataset(from_generator(jobs.Stopping(str(tmp_path), AT),
                                                  range(PARTITIONS)),
                                   out, jobs.noisy, shard_size=15, cluster=rerun)
    assert report.written + report.skipped == PARTITIONS and report.skipped >= 1
    assert _keys(out) == _expected_keys()
    assert tree(out) == _uninterrupted(tmp_path, tmp_path / "one")
    verify_dataset(out)
