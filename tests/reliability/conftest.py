"""Shared by the reliability checks: measured figures for the report, and resource counts.

Each check calls ``record(check, tried=..., failures=..., **figures)``. With the environment
variable ``FPIPE_RELIABILITY_REPORT`` set to a path, the figures of the run are appended there
as JSON lines (``docs/reliability.md`` is written from them); otherwise they are dropped.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

psutil = pytest.importorskip("psutil")


@pytest.fixture
def record(request):
    """``record(check, tried, failures, **figures)``: note a check's measured result."""
    started = time.perf_counter()

    def note(check: str, tried: int, failures: int = 0, **figures) -> None:
        target = os.environ.get("FPIPE_RELIABILITY_REPORT")
        if not target:
            return
        row = {"check": check, "test": request.node.nodeid, "tried": tried,
               "failures": failures, "seconds": round(time.perf_counter() - started, 2),
               **figures}
        with open(target, "a", encoding="utf-8") as file:
            file.write(json.dumps(row) + "\n")
    return note


class Resources:
    """Threads, child processes, open file descriptors and resident memory of this process."""

    def __init__(self) -> None:
        me = psutil.Process()
        self.threads = {t for t in threading.enumerate() if t.is_alive()}
        self.children = {p.pid for p in me.children(recursive=True)}
        self.fds = me.num_fds()
        self.rss = me.memory_info().rss

    def leftovers(self, baseline: Resources, ignore: str | None = None) -> dict:
        """What is alive now and was not at ``baseline`` (empty when back to it); threads
        whose names begin with ``ignore`` do not count."""
        extra = {}
        threads = {t.name for t in self.threads - baseline.threads
                   if ignore is None or not t.name.startswith(ignore)}
        if threads:
            extra["threads"] = sorted(threads)
        if self.children - baseline.children:
            extra["children"] = sorted(self.children - baseline.children)
        if self.fds > baseline.fds:
            extra["fds"] = self.fds - baseline.fds
        return extra


def settle(baseline: Resources, seconds: float = 15.0, ignore: str | None = None) -> dict:
    """Wait (up to ``seconds``) until no thread, child or descriptor is left over from after
    ``baseline``; return what is still left over. (A process stage ends its joblib generator
    about a second after its last task, so a pipeline's threads may outlive it briefly.)"""
    deadline = time.monotonic() + seconds
    while True:
        left = Resources().leftovers(baseline, ignore)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)
