"""Generators and transforms of the prepare tests: in a module of their own, so that worker
processes (loky's, dask's) import them by name, and so that a test can stop a worker at a
partition of its choice: the worker announces itself in a file and waits for its end, and the
test kills it (no sleep decides anything: the worker polls for a file that never comes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import fpipe as fp

SAMPLES = 40  # a partition's samples
WAIT = 120.0  # seconds a stopped worker waits to be killed before it fails the test


def rows(partition: int) -> list[dict]:
    """The samples of ``partition``: keys unique across partitions."""
    return [{"key": f"{partition:03d}-{i:03d}", "x": partition * 1000 + i} for i in range(SAMPLES)]


def noisy(sample: dict) -> dict:
    """A seeded transform: each sample draws from its own generator."""
    return {**sample, "noise": float(fp.current_rng().random())}


def doubled(sample: dict) -> dict:
    return {**sample, "x": 2 * sample["x"]}


def odd_only(sample: dict) -> dict | None:
    return sample if sample["x"] % 2 else None


class Stopping:
    """A generator that, at partition ``at`` and in its first attempt only, writes its process
    id to ``folder/stopped-<at>`` (the test kills that process) and waits; every other call
    yields :func:`rows`. After ``emitted`` samples of the partition, so that the killed
    attempt has written some of them."""

    def __init__(self, folder: str, at: int, emitted: int = SAMPLES // 2) -> None:
        self.folder, self.at, self.emitted = folder, at, emitted

    def __call__(self, partition: int):
        samples = rows(partition)
        if partition != self.at:
            yield from samples
            return
        marker = Path(self.folder) / f"stopped-{partition}"
        try:
            descriptor = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:  # a later attempt: run through
            yield from samples
            return
        yield from samples[:self.emitted]
        os.write(descriptor, str(os.getpid()).encode())
        os.close(descriptor)
        (Path(self.folder) / f"stopped-{partition}.ready").touch()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            time.sleep(0.05)  # waits to be killed; the test never sleeps on it
        raise RuntimeError(f"partition {partition}: the test did not kill this worker")


def wait_for_stop(folder: Path, at: int, deadline: float = WAIT) -> int:
    """The process id that :class:`Stopping` announced at partition ``at``, once it has."""
    ready = folder / f"stopped-{at}.ready"
    end = time.monotonic() + deadline
    while not ready.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"no worker reached partition {at} within {deadline} s")
        time.sleep(0.02)
    return int((folder / f"stopped-{at}").read_text())


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes."""
    return {str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def identities(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder``: its inode and modification time (ns)."""
    return {str(path.relative_to(folder)): (path.stat().st_ino, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


def run_stopping_job(out: str, folder: str, at: int, partitions: int,
                     cluster: str | None = None) -> None:
    """The job a client process runs (and is killed in): in this process, partition by
    partition, stopping at partition ``at``; or on the dask scheduler at ``cluster``."""
    from fpipe.prepare import from_generator, write_dataset

    where = {"n_workers": 1} if cluster is None else {"cluster": cluster}
    write_dataset(from_generator(Stopping(folder, at), range(partitions)), out, noisy,
                  shard_size=15, **where)

