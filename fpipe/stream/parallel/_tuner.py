"""The tuner of a background stage: how many workers, how much buffer and how large its chunks,
within its budgets of cores and bytes (``n_workers="auto"``, ``buffer_size="auto"``,
``cpu_budget=``, ``memory_budget=``), from what its run measures while it runs.

What it measures, per window of results: each chunk's time in a worker, split into CPU time,
time waiting for a core (the run queue, where Linux tells) and the rest (waiting for IO); the
pace at which the consumer takes the results, and how long it waited for them; how long the
feeder read the upstream; the bytes of an item on its way in and out.

What it decides (:meth:`Tuner.decide`):

- workers: while the consumer waits for the stage (and the upstream is not what it waits
  for), as many as the cores of the budget can run (a worker that waits for IO takes a
  fraction of a core); otherwise as many as keep up with the consumer's pace, with a margin,
  shrinking by at most half at a time;
- buffer: doubled (up to 8 chunks) while the consumer waits and the workers wait for room;
- bytes: with a memory budget, the chunks held (in work, waiting, being handed out) and their
  size fit in it, counting each item's input, its output, and a copy of the output on its way.

>>> tuner = Tuner(Limits(workers=None, buffer=None, cpu=2.0, memory=None, most=64, per_worker=1))
>>> tuner.setting.workers
1
>>> window = Window(seconds=0.1, delivered=50, chunks=5, worked=50, work=1.0, cpu=0.01,
...                 queued=0.0, starved=0.08, reading=0.0, waited_room=0.0, item_bytes=100)
>>> tuner.decide(window).workers  # IO-bound work, a waiting consumer: grown to the most
64
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

__all__: list[str] = []  # private: the background stages and the planner are its users

MOST_THREADS = 64  # of an n_workers="auto" thread stage
MOST_BUFFER = 8  # chunks of an buffer_size="auto" stage
WINDOW_SECONDS = 0.05  # a decision measures at least this long and this many chunks ...
WINDOW_CHUNKS = 4
LONGEST_WINDOW = 0.5  # ... or this long, whatever came
STARVED = 0.1  # the consumer waits for results more than this share of a window: grow
FEEDER_BOUND = 0.8  # the feeder reads more than this share: more workers would not help
MARGIN = 1.25  # workers beyond what the consumer's pace needs
PAYS = 1.1  # a growth of the workers that does not raise the rate this much is undone ...
CEILING_DECISIONS = 10  # ... and not tried again for this many decisions
HISTORY = 8  # decisions that explain() shows


@dataclass(frozen=True)
class Limits:
    """What a stage asks for: fixed ``workers`` and ``buffer`` (None: "auto"), its budgets of
    cores and bytes (None: no byte budget), the most workers it may have, the chunks each
    worker holds (one in work, and for processes one waiting), and how many items' worth of
    memory the budget leaves besides the chunks (the consumer's last, the workers' free
    shared memory)."""

    workers: int | None
    buffer: int | None
    cpu: float
    memory: int | None
    most: int
    per_worker: int
    held: float = 1.0


@dataclass(frozen=True)
class Setting:
    """What the stage runs with: workers, buffer (chunks waiting beyond the workers'), the
    chunks it may hold in all, and the most items in a chunk (None: as the stage sizes them)."""

    workers: int
    buffer: int
    slots: int
    chunk: int | None = None


@dataclass(frozen=True)
class Window:
    """What a run measured since the last decision (seconds are sums over the chunks)."""

    seconds: float
    delivered: int  # items handed to the consumer
    chunks: int  # chunks of results received
    worked: int  # the items of those chunks
    work: float  # their seconds in the workers ...
    cpu: float  # ... of which on a core ...
    queued: float  # ... and waiting for one
    starved: float  # the consumer's seconds waiting for results
    reading: float  # the feeder's seconds reading the upstream
    waited_room: float  # the feeder's seconds waiting for room
    item_bytes: int  # of an item in the stage (its input, its output, a copy on its way)

    def per_item(self) -> tuple[float, float]:
        """A worker's seconds per item without waiting for a core, and the share of a core it
        takes meanwhile."""
        worked = max(self.worked, 1)
        cpu = self.cpu / worked
        alone = max(self.work / worked - self.queued / worked, cpu, 1e-9)
        return alone, min(1.0, cpu / alone)


@dataclass(frozen=True)
class Decision:
    """A setting the tuner chose, why, and the window it chose it on."""

    setting: Setting
    reason: str
    window: Window | None


class Tuner:
    """Decides a stage's setting from windows of measurements; holds the last decisions."""

    def __init__(self, limits: Limits, start: Setting | None = None) -> None:
        self.limits = limits
        workers = limits.workers or 1
        buffer = limits.buffer or 2
        first = start or Setting(workers, buffer, limits.per_worker * workers + buffer)
        if limits.memory is not None and start is None:
            # nothing is known of the items' sizes yet: one item at a time until it is
            first = replace(first, slots=1, chunk=1)
        self.history: list[Decision] = [Decision(first, self._first_reason(start), None)]
        self.decisions = 0
        self._growth: tuple[int, float] | None = None  # workers and rate before a growth
        self._ceiling: tuple[int | None, int] = (None, 0)  # most workers, until decision

    def _first_reason(self, start: Setting | None) -> str:
        if start is not None:
            return "as the stage's last run ended"
        if self.limits.memory is not None:
            return "one item at a time until the first results tell their size"
        return "the start" if self.limits.workers is None else "fixed"

    @property
    def setting(self) -> Setting:
        return self.history[-1].setting

    @property
    def auto(self) -> bool:
        """Whether there is anything to decide."""
        limits = self.limits
        return limits.workers is None or limits.buffer is None or limits.memory is not None

    def decide(self, window: Window) -> Setting:
        """The setting for the next window, given the last one's measurements."""
        self.decisions += 1
        workers, why = self._workers(window)
        buffer = self._buffer(window)
        setting = self._within_memory(workers, buffer, window)
        reason = why if setting.workers == workers else \
            f"{why}; {setting.workers} fit the memory budget"
        self.history.append(Decision(setting, reason, window))
        del self.history[:-HISTORY]
        return setting

    def _workers(self, window: Window) -> tuple[int, str]:
        limits, current = self.limits, self.setting.workers
        if limits.workers is not None:
            return limits.workers, "fixed"
        alone, share = window.per_item()
        most = max(1, min(limits.most, math.floor(limits.cpu / max(share, 1e-3) + 1e-9)))
        starved = window.starved / window.seconds
        if starved > STARVED and window.reading / window.seconds < FEEDER_BOUND:
            return self._grown(window, current, most, starved, share)
        self._growth = None
        pace = window.delivered / window.seconds
        needed = max(1, min(most, math.ceil(pace * alone * MARGIN)))
        if needed < current:
            needed = max(needed, current // 2)
        why = "the upstream is slower" if starved > STARVED else \
            f"{pace:.4g} items/s keep {pace * alone:.2f} workers busy"
        return needed, why

    def _grown(self, window: Window, current: int, most: int, starved: float,
               share: float) -> tuple[int, str]:
        """Workers for a consumer that waits: as many as the cores run, unless the last
        growth did not pay (work that holds the GIL in threads, a shared resource)."""
        rate = window.worked / window.seconds
        if self._growth is not None:
            before, before_rate = self._growth
            self._growth = None
            if rate < PAYS * before_rate:
                self._ceiling = (before, self.decisions + CEILING_DECISIONS)
                return before, (f"{current} workers made {rate:.4g} items/s, not more than "
                                f"{before} did ({before_rate:.4g}): back to {before}")
        ceiling, until = self._ceiling
        bound = "the most there may be" if most == self.limits.most else \
            f"what {self.limits.cpu:g} cores run at {share:.0%} of a core each"
        if ceiling is not None and self.decisions < until and ceiling < most:
            most, bound = ceiling, (f"as more did not pay (tried again in "
                                    f"{until - self.decisions} decisions)")
        if most > current:
            self._growth = (current, rate)
        return most, f"the consumer waited {starved:.0%} of the time: {most}, {bound}"

    def _buffer(self, window: Window) -> int:
        limits, current = self.limits, self.setting.buffer
        if limits.buffer is not None:
            return limits.buffer
        starved = window.starved / window.seconds
        if starved > STARVED and window.waited_room / window.seconds > STARVED:
            return min(MOST_BUFFER, 2 * current)
        return current

    def _within_memory(self, workers: int, buffer: int, window: Window) -> Setting:
        """The setting with the chunks it holds (and their size) within the memory budget:
        the consumer's last chunk, the workers' chunks and the buffer's."""
        per_worker = self.limits.per_worker
        budget = self.limits.memory
        if budget is None:
            return Setting(workers, buffer, per_worker * workers + buffer)
        item, held = max(window.item_bytes, 1), self.limits.held
        chunk = max(1, int(budget // ((per_worker * workers + buffer + held) * item)))
        slots = min(per_worker * workers + buffer, max(1, int(budget // (chunk * item) - held)))
        workers = max(1, min(workers, slots))
        return Setting(workers, max(0, slots - per_worker * workers), slots, chunk)


# --- what the workers measure -----------------------------------------------------------

_clock = threading.local()


def work_clock() -> tuple[float, float]:
    """The calling thread's CPU seconds so far, and its seconds waiting for a core (0.0 where
    the system does not say: Linux's schedstat does, in about 3 microseconds)."""
    fd = getattr(_clock, "fd", None)
    if fd is None:
        fd = _clock.fd = _SchedStat.open()
    if fd.number < 0:
        return time.thread_time(), 0.0
    try:
        cpu, queued = os.pread(fd.number, 64, 0).split()[:2]
    except (OSError, ValueError):
        return time.thread_time(), 0.0
    return int(cpu) * 1e-9, int(queued) * 1e-9


class _SchedStat:
    """This thread's ``/proc/thread-self/schedstat``, open while the thread lives."""

    def __init__(self, number: int) -> None:
        self.number = number

    @classmethod
    def open(cls) -> _SchedStat:
        try:
            return cls(os.open("/proc/thread-self/schedstat", os.O_RDONLY))
        except OSError:
            return cls(-1)

    def __del__(self) -> None:
        if self.number >= 0:
            os.close(self.number)


def measured(run: Any, chunk: list, start: int) -> tuple[list, Any, float, float, float]:
    """``run(chunk, start)`` (a call's outputs, error and seconds), with the CPU seconds and
    the seconds waiting for a core that it took in this thread."""
    cpu, queued = work_clock()
    outputs, error, seconds = run(chunk, start)
    cpu_after, queued_after = work_clock()
    return outputs, error, seconds, cpu_after - cpu, queued_after - queued


# --- what the run measures --------------------------------------------------------------

_SAMPLED = 4  # items of a chunk whose sizes are looked at


def nbytes(value: Any, depth: int = 3) -> int:
    """About how many bytes ``value`` holds: arrays, tensors and bytes by their size, the
    containers by what they hold (a few of their items, scaled), other objects by
    ``sys.getsizeof``.

    >>> import numpy as np
    >>> nbytes((np.zeros(1000), b"abc"))
    8003
    """
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if depth and isinstance(value, (list, tuple, dict)):
        items = list(value.values() if isinstance(value, dict) else value)
        if not items:
            return 0
        sample = items[:_SAMPLED]
        return sum(nbytes(item, depth - 1) for item in sample) * len(items) // len(sample)
    return sys.getsizeof(value)


def chunk_bytes(chunk: list) -> int:
    """The bytes of the largest of a few items of ``chunk``."""
    step = max(1, len(chunk) // _SAMPLED)
    return max((nbytes(item) for item in chunk[::step][:_SAMPLED]), default=0)


class Gauge:
    """What a run measures, summed since it began (the tuner takes differences): written by
    the consumer (results) and by the feeder (reading, waiting for room, input sizes)."""

    def __init__(self, clock: Any = time.perf_counter) -> None:
        self.clock = clock
        self.began = clock()
        self.chunks = self.worked = 0
        self.work = self.cpu = self.queued = self.starved = 0.0
        self.in_bytes = self.out_bytes = 0  # of the largest item seen

    def received(self, outputs: list, seconds: float, cpu: float, queued: float) -> None:
        self.chunks += 1
        self.worked += len(outputs)
        self.work, self.cpu, self.queued = self.work + seconds, self.cpu + cpu, self.queued + queued
        self.out_bytes = max(self.out_bytes, chunk_bytes(outputs))

    def submitted(self, chunk: list) -> None:
        self.in_bytes = max(self.in_bytes, chunk_bytes(chunk))

    def item_bytes(self) -> int:
        """An item's bytes in the stage: its input, its output, and a copy of the output on
        its way (in shared memory, or pickled)."""
        return self.in_bytes + 2 * self.out_bytes


class Watch:
    """The gauge of a run, read into windows for its tuner; applies the tuner's settings
    through ``apply(setting)``."""

    def __init__(self, tuner: Tuner, gauge: Gauge, apply: Any, delivered: Any, feeder: Any) -> None:
        self.tuner, self.gauge, self._apply = tuner, gauge, apply
        self._delivered, self._feeder = delivered, feeder  # () -> items; () -> (reading, room)
        self._mark = self._snapshot()
        self._first = True

    def _snapshot(self) -> tuple:
        gauge = self.gauge
        return (gauge.clock(), self._delivered(), gauge.chunks, gauge.worked, gauge.work,
                gauge.cpu, gauge.queued, gauge.starved, *self._feeder())

    def received(self, outputs: list, seconds: float, cpu: float, queued: float) -> None:
        """A chunk of results came in: measure it, and decide when a window is full."""
        self.gauge.received(outputs, seconds, cpu, queued)
        if not self.tuner.auto:
            return
        seconds = self.gauge.clock() - self._mark[0]
        chunks = self.gauge.chunks - self._mark[2]
        if self._first or seconds >= LONGEST_WINDOW or (seconds >= WINDOW_SECONDS
                                                        and chunks >= WINDOW_CHUNKS):
            self._decide()

    def _decide(self) -> None:
        mark, now = self._mark, self._snapshot()
        if now[0] <= mark[0]:
            return
        differences = [b - a for a, b in zip(mark, now)]
        window = Window(*differences, item_bytes=self.gauge.item_bytes())
        self._mark, self._first = now, False
        before = self.tuner.setting
        setting = self.tuner.decide(window)
        if setting != before:
            self._apply(setting)

    def last_window(self) -> Window | None:
        """The measurements of the latest decision, or of the run so far if none was made."""
        for decision in reversed(self.tuner.history):
            if decision.window is not None:
                return decision.window
        now = self._snapshot()
        start = (self.gauge.began, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        return Window(*[b - a for a, b in zip(start, now)], item_bytes=self.gauge.item_bytes())


def default_cpu_budget() -> float:
    """The cores this process may use: those it may run on, shared between the DataLoader's
    workers when this is one of them (torch is looked up, never imported)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    data = sys.modules.get("torch.utils.data")
    info = getattr(data, "get_worker_info", lambda: None)()
    workers = getattr(info, "num_workers", 1) or 1
    return max(1.0, cores / workers)
