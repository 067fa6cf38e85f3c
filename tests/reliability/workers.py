"""Module-level work for the fault checks, so that it pickles to worker processes."""

from __future__ import annotations

import os
import time

import numpy as np


class Boom(Exception):
    """The exception the faults inject: a class of the tests' own, so that a stage that
    replaced it (by a generic error, say) is caught."""


def raise_boom(where: str, item) -> None:
    raise Boom(f"{where} failed at item {item!r}")


class FailAt:
    """The identity, except that item ``bad`` raises Boom (in whatever stage runs it)."""

    def __init__(self, bad: int, where: str) -> None:
        self.bad, self.where = bad, where

    def __call__(self, x: int) -> int:
        if x == self.bad:
            raise_boom(self.where, x)
        return x


class PredicateFailAt:
    """A batch predicate (batches of up to three) that raises Boom when asked about ``bad``,
    or about an item to join a batch that ``bad`` begins (a predicate is not asked about the
    first item of a batch)."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, batch: list, item: int) -> bool:
        if item == self.bad or batch[0] == self.bad:
            raise_boom("the batch predicate", self.bad)
        return len(batch) < 3


class CombineFailAt:
    """A combiner that raises Boom on the batch that holds ``bad``; others become tuples."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, batch: list) -> tuple:
        if self.bad in batch:
            raise_boom("the combiner", self.bad)
        return tuple(batch)


def tagged(x: int) -> tuple[int, int]:
    """``(x, pid)`` after about 2 ms: which worker process made the item."""
    time.sleep(0.002)
    return x, os.getpid()


def slow_identity(x):
    time.sleep(0.001)
    return x


def announced_sleep(x, seconds=30.0):
    """Say "running" (from the worker process that runs it), then sleep: a slow item (the
    issue saw Ctrl-C hang with items of 3 to 30 s)."""
    # one write of the whole line: two workers' prints could interleave ("runningrunning")
    os.write(1, b"running\n")
    time.sleep(seconds)
    return x


def small_item(i: int) -> tuple[np.ndarray, int]:
    """A small array and a label, made in a worker process (the soak's work)."""
    return np.full(16, i % 251, dtype=np.uint8), i


def written_sample(i: int) -> dict:
    """Sample ``i`` of what the writers under fault write (20 to 700 bytes each)."""
    return {"key": f"k{i:07d}", "payload": bytes([i % 256]) * (i * 37 % 700), "i": i}
