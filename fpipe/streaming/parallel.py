"""The background stages: :func:`prefetch` reads ahead in a thread, :func:`threads` and
:func:`processes` compute a function in worker threads or processes. Each application is a
*run*: a feeder thread reads the upstream in chunks (sized by the work they take) into the
room the stage has, an executor works on them, and the stream delivers the results in input
order (or as they complete).

>>> from toolz import pipe
>>> with pipe(range(-3, 4), prefetch(4), threads(abs, n_workers=2)) as stream:
...     list(stream)
[3, 2, 1, 0, 1, 2, 3]
"""

from __future__ import annotations

import abc
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import (
    capture,
    check_auto,
    check_bool,
    check_callable,
    check_integer,
    check_positive,
    check_workers,
)
from ..random import Seed, optional_entropy
from ..skipping import OnError, SkipLog, check_max_errors, check_on_error
from ._core import JOIN_SECONDS, Stage, Stream, as_stream, next_chunk_size
from ._joblib import ShippedCall, process_pool
from ._messages import Message
from ._shm import Transport, end_run
from ._shm import available as shared_memory_available
from ._tuner import (
    MOST_THREADS,
    Gauge,
    Limits,
    Setting,
    Tuner,
    Watch,
    default_cpu_budget,
    measured,
)
from .planner import plan_parallel
from .simple import ItemCall, at_epoch, check_call, error_options, stage_repr

__all__ = ["prefetch", "processes", "threads"]

_THREAD_CHUNK_SECONDS = 2e-3  # work per chunk handed to a thread ...
_PROCESS_CHUNK_SECONDS = 2e-2  # ... or to a process, where a round trip costs about 0.3 ms


# --- the machinery of a background stage ----------------------------------------------


class _Slots:
    """Room for what a background stage holds; the feeder waits for room, close() wakes it."""

    def __init__(self, count: int) -> None:
        self.count, self._free, self._shut = count, count, False
        self._condition = threading.Condition()
        self.waited = 0.0  # seconds the feeder waited for room

    def acquire(self, most: int, least: int = 1) -> int:
        """Reserve between ``least`` and ``most`` slots, waiting for ``least`` (0: no waiting);
        0 once closed, or when ``least`` is 0 and none is free."""
        with self._condition:
            if self._free < least and not self._shut:
                began = time.perf_counter()
                while self._free < least and not self._shut:
                    self._condition.wait()
                self.waited += time.perf_counter() - began
            if self._shut or self._free <= 0:
                return 0
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def release(self, count: int) -> None:
        with self._condition:
            self._free += count
            self._condition.notify()

    def resize(self, change: int) -> None:
        """Hold ``change`` slots more (fewer, if negative: the feeder then waits until the
        chunks held beyond the new count are handed out)."""
        with self._condition:
            self.count += change
            self._free += change
            self._condition.notify()

    def close(self) -> None:
        with self._condition:
            self._shut = True
            self._condition.notify_all()


class _Handover:
    """The chunk a feeder is filling from an upstream that ``waits``, and its hand-over to the
    executor: when it is full, or at once when the consumer waits for it, so that an item read
    is never held back while the feeder waits for the next one (a source may wait for what the
    consumer does with the items it has). The feeder and the consumer hand over under one lock,
    so chunks go out in order.

    ``reserved`` counts the slots held for the items and for the read under way: one per item
    (``per_item``, prefetch), or one for the chunk (threads, processes)."""

    def __init__(self, executor: Any, results: queue.SimpleQueue, per_item: bool, start: int,
                 sizer: _Sizer) -> None:
        self._executor, self._results, self._per_item = executor, results, per_item
        self._sizer = sizer
        self.failed = False  # the executor refused a chunk: the consumer has been told
        self._lock = threading.Lock()
        self.items: list = []
        self.reserved = 0
        self.seq, self._index = 0, start  # the number of the next chunk, its first item's index
        self._seconds = 0.0  # spent reading the items
        self._hungry = False  # the consumer waits for the chunk being filled

    def room(self) -> int:
        """How many more items the feeder may read now without reserving more slots."""
        if self._per_item:
            return self.reserved - len(self.items)
        return self._sizer.size - len(self.items) if self.reserved else 0

    def reserve(self, slots: int) -> None:
        """The feeder holds ``slots`` more."""
        with self._lock:
            self.reserved += slots
            self._hand_over_if_due()

    def read(self, chunk: list, seconds: float) -> int:
        """The feeder read ``chunk``; returns the slots it reserved that are not needed now."""
        with self._lock:
            self.items += chunk
            self._seconds += seconds
            self._hand_over_if_due()
            return self._spare()

    def flush(self) -> None:
        """Hand over the items held, if it can."""
        with self._lock:
            if self.items and self.reserved >= self._slots():
                self._hand_over()

    def ended(self, marker: Callable[[int, int], Message]) -> Message:
        """The input ended (or failed): hand over what is left, and the marker that follows it,
        ``marker(seq, slots)``."""
        with self._lock:
            if self.items:
                self._hand_over()
            message, self.reserved = marker(self.seq, self.reserved), 0
            return message

    def awaits(self, received: int) -> None:
        """The consumer, which has had the chunks before number ``received``, is about to wait
        for the next: if that is the one being filled, it goes now (while the feeder may be
        waiting for the item after it), or as soon as it has an item."""
        with self._lock:
            if received < self.seq:
                return  # it is on its way
            self._hungry = True
            self._hand_over_if_due()

    def _hand_over_if_due(self) -> None:
        due = self._hungry or len(self.items) >= self._sizer.size
        if self.items and due and self.reserved >= self._slots():
            self._hand_over()

    def _slots(self) -> int:
        return len(self.items) if self._per_item else 1

    def _spare(self) -> int:
        # per item, the slots beyond the chunk's target go back (the target may have shrunk)
        if not self._per_item:
            return 0
        spare = max(0, self.reserved - max(len(self.items), self._sizer.size))
        self.reserved -= spare
        return spare

    def _hand_over(self) -> None:
        chunk, slots, self.items = self.items, self._slots(), []
        self.reserved -= slots
        if len(chunk) >= self._sizer.size:  # a chunk handed over early says nothing of sizes
            self._sizer.pulled(len(chunk), self._seconds)
        if not self.failed:
            try:
                self._executor.submit(self.seq, self._index, chunk, slots)
            except BaseException as error:  # the consumer hears of it after what came before
                self._results.put(Message(self.seq, [], capture(error), 0.0, slots))
                self.failed = True
        self.seq, self._index = self.seq + 1, self._index + len(chunk)
        self._seconds, self._hungry = 0.0, False


class _Run:
    """The threads of one application of a background stage. They hold this object, never the
    stream, so that a forgotten stream is garbage-collected and its finalizer stops them."""

    def __init__(self, upstream: Stream, executor: Any, slots: int, per_item: bool,
                 sizer: _Sizer, start: int, tuner: Tuner | None = None) -> None:
        self.upstream, self.executor, self.sizer, self.tuner = upstream, executor, sizer, tuner
        self.slot_count = slots
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.slots, self.per_item, self.start = _Slots(slots), per_item, start
        # an upstream that does not wait fills each chunk in one pull, without the consumer
        self.handover = (_Handover(executor, self.results, per_item, start, sizer)
                         if upstream.waits else None)
        self.stopping, self.reading = False, 0.0  # seconds the feeder spent reading
        self.close_error: BaseException | None = None  # of the upstream's close()
        self._closed_upstream = False
        self._lock = threading.Lock()
        self.feeder = threading.Thread(target=self._feed, name="fpipe-feeder", daemon=True)

    def begin(self) -> None:
        self.executor.begin(self.results)
        self.feeder.start()

    def _feed(self) -> None:
        try:
            if self.handover is None:
                self._feed_chunks()
                return
            while not self.stopping and not self.handover.failed:
                room = self._room()
                if not room or self.stopping or not self._read(room):
                    return
        finally:
            if self.stopping:
                self.close_upstream()

    def _feed_chunks(self) -> None:
        """From an upstream that does not wait: a chunk is what one pull gives into the room
        held for it."""
        seq, index = 0, self.start
        while True:
            reserved = self.slots.acquire(self.sizer.size if self.per_item else 1)
            if not reserved or self.stopping:
                return
            chunk = self._read_chunk(seq, reserved)
            if chunk is None or not self._submit(seq, index, chunk, reserved):
                return
            seq, index = seq + 1, index + len(chunk)

    def _read_chunk(self, seq: int, reserved: int) -> list | None:
        """The next chunk; on the end or an error, tell the consumer and return None."""
        began = time.perf_counter()
        try:
            chunk = self.upstream.pull(reserved if self.per_item else self.sizer.size)
        except BaseException as error:
            self.results.put(Message(seq, [], capture(error), 0.0, reserved))
            return None
        if not chunk:
            self.results.put(Message.end(seq, reserved))
            return None
        seconds = time.perf_counter() - began
        self.reading += seconds
        self.sizer.pulled(len(chunk), seconds)
        if self.per_item and len(chunk) < reserved:
            self.slots.release(reserved - len(chunk))
        return chunk

    def _submit(self, seq: int, index: int, chunk: list, reserved: int) -> bool:
        """Hand the chunk to the executor; on an error, tell the consumer and return False."""
        try:
            self.executor.submit(seq, index, chunk, reserved)
        except BaseException as error:
            self.results.put(Message(seq, [], capture(error), 0.0, reserved))
            return False
        return True

    def _room(self) -> int:
        """How many items to read next, once the slots for them are held (waiting for room);
        0 once the run stops. (A consumer that hands the chunk over takes its slots: the
        feeder then reserves again.)"""
        handover = self.handover
        room = handover.room()
        while room <= 0:
            got = self._more_slots()
            if not got:
                return 0
            handover.reserve(got)
            room = handover.room()
        return room

    def _more_slots(self) -> int:
        if not self.per_item:
            return self.slots.acquire(1)
        handover = self.handover
        wanted = max(1, self.sizer.size - len(handover.items))
        if handover.items:  # the chunk grows by what is free now, or goes as it is
            got = self.slots.acquire(wanted, least=0)
            if got:
                return got
            handover.flush()
        # a new chunk waits for half the room, not the first slot freed, or the chunks would
        # stay as small as the gap that the last one left
        return self.slots.acquire(wanted, least=min(wanted, max(1, self.slots.count // 2)))

    def _read(self, room: int) -> bool:
        """Read up to ``room`` items into the chunk being filled (the upstream gives what it
        has); False at the end or on an error, which follows the items before."""
        handover, began = self.handover, time.perf_counter()
        try:
            chunk = self.upstream.pull(room)
        except BaseException as error:
            captured = capture(error)
            self.results.put(handover.ended(lambda seq, slots: Message(seq, [], captured, 0.0,
                                                                       slots)))
            return False
        if not chunk:
            self.results.put(handover.ended(Message.end))
            return False
        seconds = time.perf_counter() - began
        self.reading += seconds
        spare = handover.read(chunk, seconds)
        if spare:
            self.slots.release(spare)
        return True

    def apply(self, setting: Setting) -> None:
        """Run with ``setting`` from now on (the tuner's): workers, room and chunk size."""
        change, self.slot_count = setting.slots - self.slot_count, setting.slots
        self.slots.resize(change)
        self.executor.resize(setting.workers)
        self.sizer.limit(setting.chunk)

    def close_upstream(self) -> None:
        with self._lock:
            if self._closed_upstream:
                return
            self._closed_upstream = True
        try:
            self.upstream.close()
        except BaseException as error:  # raised by the stream's close(), not in this thread
            self.close_error = error

    def stop(self, join: bool) -> None:
        self.stopping = True
        self.slots.close()
        self.executor.stop()
        self.results.put(Message.wake())
        if join and self.feeder is not threading.current_thread():
            deadline = time.monotonic() + JOIN_SECONDS
            if self.feeder.ident is not None:
                self.feeder.join(max(0.0, deadline - time.monotonic()))
            self.executor.join(deadline)
        if not self.feeder.is_alive():
            self.close_upstream()  # else the feeder closes it on its way out


class _Sizer:
    """Chunk sizes for a background stage: about ``target`` seconds of reading plus work per
    chunk, at most ``cap`` items. Kept by the stage, so a second run starts at a good size."""

    def __init__(self, target: float, cap: int, measure_first: bool = False) -> None:
        self.target, self.cap, self.size = target, cap, 1
        self.most = cap  # the stage's chunk_size; cap may be lower (a memory budget)
        self.work_per_item: float | None = None  # until the first results come back
        self.measure_first = measure_first

    def pulled(self, items: int, seconds: float) -> None:
        if self.work_per_item is None and self.measure_first:
            # chunks a worker process holds cannot be taken back: sent before any result
            # comes back, they would grow to many times their target, and a stage closed
            # early would leave that much work in front of the next one
            return
        total = seconds + (self.work_per_item or 0.0) * items
        self.size = next_chunk_size(items, total, self.target, self.cap)

    def worked(self, items: int, seconds: float) -> None:
        if items:
            self.work_per_item = seconds / items

    def limit(self, items: int | None) -> None:
        """At most ``items`` per chunk from now on (None: the stage's own ``chunk_size``)."""
        self.cap = self.most if items is None else max(1, min(self.most, items))
        self.size = min(self.size, self.cap)


class _Background(Stream):
    """The consumer side of a background stage: results come back through a queue and leave
    in input order (or as they complete)."""

    waits = True

    def __init__(self, upstream: Stream, name: str, make_run: Callable[[Stream], _Run],
                 ordered: bool, workers: int) -> None:
        super().__init__(upstream, name)
        self._make_run, self._ordered, self._workers = make_run, ordered, workers
        self._run: _Run | None = None
        self._finalizer: Any = None
        self._pending: dict = {}
        self._next_seq, self._received, self._total = 0, 0, None
        self._ready: list = []
        self._handed = 0  # how many of the ready results are handed out
        self._ready_slots, self._ready_error = 0, None
        self._work = 0.0
        self.watch: Watch | None = None  # what the run measures, and its tuner

    @property
    def started(self) -> bool:
        """Whether the run has begun (by :meth:`start` or the first pull)."""
        return self._run is not None

    def start(self) -> Stream:
        if self._run is None and not self.closed:
            self._begin()
        return self

    def _begin(self) -> None:
        run = self._run = self._make_run(self.upstream)
        self._finalizer = weakref.finalize(self, run.stop, False)
        if run.tuner is not None:
            self.watch = Watch(run.tuner, Gauge(), run.apply, self._delivered,
                               lambda: (run.reading, run.slots.waited))
        run.begin()

    def _delivered(self) -> int:
        return self.measure(0.0)[0]

    def _pull(self, n: int) -> list:
        if self._run is None:
            self._begin()
        if not self._ready and not self._next_chunk():
            self.close()
            return []
        items, handed = self._ready, self._handed
        if len(items) - handed > n:
            self._handed += n
            return items[handed:handed + n]
        self._ready, self._handed = [], 0
        if handed:
            items = items[handed:]
        if self._ready_error is not None:
            self.defer_error(self._ready_error, items)  # raised after the chunk's results
        self._run.slots.release(self._ready_slots)
        return items

    def _next_chunk(self) -> bool:
        """Make the next chunk of results ready; False at the end."""
        while True:
            began = time.perf_counter()
            message = self._next_message()
            watch = self.watch
            if watch is not None:
                watch.gauge.starved += time.perf_counter() - began
            if message is None:
                return False
            outputs, error, seconds, slots = message.outputs, message.error, message.seconds, message.slots
            self._work += seconds
            self._run.sizer.worked(len(outputs), seconds)
            if watch is not None:
                watch.received(outputs, seconds, message.cpu, message.queued)
            if self.skips is not None:
                self.skips.keep(outputs, 0)  # on_error: the workers' Skipped records
            if outputs:
                self._ready, self._ready_slots, self._ready_error = outputs, slots, error
                return True
            self._run.slots.release(slots)
            if error is not None:
                error.reraise()
            # else every item of the chunk was skipped

    def _next_message(self) -> Message | None:
        """The next message with results, in order if asked; None at the end."""
        results = self._run.results
        while True:
            if self._ordered and self._next_seq in self._pending:
                message = self._pending.pop(self._next_seq)
                self._next_seq += 1
                return None if message.is_end else message
            if self._total is not None and self._received == self._total:
                return None
            message = self._take(results)
            if self.closed or message.is_wake:
                return None
            if message.is_failure:  # of the process pool, for every run
                return message
            if self._ordered:
                self._pending[message.seq] = message
            elif message.is_end:
                self._total = message.seq
            else:
                self._received += 1
                return message

    def _take(self, results: queue.SimpleQueue) -> Message:
        handover = self._run.handover
        if handover is not None and results.empty():
            # about to wait: the chunk waited for must not stay with a feeder that may be
            # waiting for the item after it
            handover.awaits(self._next_seq if self._ordered else self._received)
        return results.get()

    def _close(self) -> None:
        if self._run is None:
            super()._close()
            return
        self._finalizer.detach()
        self._run.stop(join=True)
        error, self._run.close_error = self._run.close_error, None
        if error is not None:
            raise error

    def shares(self, wall: float) -> tuple[float, float, float]:
        # the workers are busy, or wait for the feeder to read, or wait for room downstream
        workers = self._workers if self.watch is None else self.watch.tuner.setting.workers
        busy = self._work / (wall * workers) if workers else 0.0
        reading = (self._run.reading if self._run is not None else 0.0) / wall
        return busy, reading, max(1.0 - busy - reading, 0.0)


class _Inline:
    """The executor of prefetch: chunks go straight to the consumer."""

    def begin(self, results: queue.SimpleQueue) -> None:
        self._results = results

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        self._results.put(Message(seq, chunk, None, 0.0, slots))

    def stop(self) -> None:
        pass

    def join(self, deadline: float) -> None:
        pass


class _PrefetchStage(Stage):
    def __init__(self, n: int) -> None:
        self.n = check_integer("n", n, 1)
        self._sizer = _Sizer(_THREAD_CHUNK_SECONDS, self.n)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        def make_run(upstream: Stream) -> _Run:
            return _Run(upstream, _Inline(), self.n, True, self._sizer, start)
        return _Background(as_stream(iterable), repr(self), make_run, True, 0)

    def __repr__(self) -> str:
        return f"prefetch({self.n})"


def prefetch(n: int) -> Stage:
    """The stage that reads its upstream in a background thread, keeping up to ``n`` items
    ready. The thread starts at the first ``next()`` and is joined when the stream is closed.

    >>> with prefetch(4)(range(10)) as stream:
    ...     list(stream)
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    return _PrefetchStage(n)


class _ThreadWorkers:
    """The executor of :func:`threads`: n threads taking chunks from a queue; the tuner may
    add threads or retire some (each retires once the chunks before its notice are done)."""

    def __init__(self, call: ItemCall, n_workers: int) -> None:
        self._call, self._tasks = call, queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._count, self._stopped = n_workers, False
        self._lock = threading.Lock()

    def begin(self, results: queue.SimpleQueue) -> None:
        self._results = results
        with self._lock:
            self._add(self._count)

    def _add(self, count: int) -> None:
        self._threads = [thread for thread in self._threads if thread.is_alive()]
        for _ in range(count):
            thread = threading.Thread(target=self._work, name="fpipe-worker", daemon=True)
            self._threads.append(thread)
            thread.start()

    def resize(self, workers: int) -> None:
        with self._lock:
            if self._stopped:
                return
            change, self._count = workers - self._count, workers
            self._add(max(0, change))
            for _ in range(-change):
                self._tasks.put(_RETIRE)

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        self._tasks.put((seq, index, chunk, slots))

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None or task is _RETIRE or self._stopped:
                return
            seq, index, chunk, slots = task
            outputs, error, seconds, cpu, queued = measured(self._call.run, chunk, index)
            self._results.put(Message(seq, outputs, error, seconds, slots, cpu, queued))

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for _ in self._threads:
                self._tasks.put(None)

    def join(self, deadline: float) -> None:
        for thread in list(self._threads):
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


_RETIRE = object()  # a thread that takes it ends (the tuner chose fewer)


class _ParallelStage(Stage):
    """What :func:`threads` and :func:`processes` share: the checks, the repr, the runs."""

    kind, chunk_seconds, per_worker, measure_first = "", 0.0, 1, False
    one_to_one = True

    def __init__(self, func: Callable, args: tuple, kwargs: dict, n_workers: int | str,
                 buffer_size: int | str, ordered: bool, seed: Seed | None, chunk_size: int, *,
                 on_error: OnError = "raise", max_errors: int | None = None,
                 cpu_budget: float | None = None, memory_budget: int | None = None) -> None:
        self.func, self.args, self.kwargs = check_callable("func", func), args, kwargs
        check_call(self.kind, func, args, kwargs, workers=True)
        self.ordered = check_bool("ordered", ordered)
        self.n_workers = check_auto("n_workers", n_workers, check_workers)
        self.buffer_size = check_auto("buffer_size", buffer_size,
                                      lambda size: check_integer("buffer_size", size, 1))
        self.cpu_budget, self.memory_budget = _checked_budgets(self.n_workers, cpu_budget,
                                                               memory_budget)
        self.workers = self._most_workers()
        self.chunk_size = check_integer("chunk_size", chunk_size, 1)
        self.seed = optional_entropy(seed)
        self.on_error, self.max_errors = check_on_error(on_error), check_max_errors(max_errors)
        self._sizer = _Sizer(self.chunk_seconds, self.chunk_size,
                             self.measure_first or self.memory_budget is not None)
        self._group_sizers: dict[int, _Sizer] = {}  # of fused runs, by batch size
        self._latest: Tuner | None = None  # of the latest run: the next one starts where it stands

    def _most_workers(self) -> int:
        """The fixed number of workers, or the most that ``"auto"`` may choose."""
        if self.n_workers == "auto":
            return MOST_THREADS
        return (os.cpu_count() or 1) if self.n_workers == -1 else self.n_workers

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        call = ItemCall(self.func, self.args, self.kwargs, self.seed, epoch, self.on_error)
        return plan_parallel(self, as_stream(iterable), call, start)

    def stream(self, upstream: Stream, call: Any, start: int, name: str,
               group: int | None = None) -> Stream:
        """The stream of a run of ``call`` over ``upstream`` (numbered from ``start``), named
        ``name``: what :func:`fpipe.explain`'s planner builds, the call possibly fused
        (``group``: the upstream gives groups of that many items, one batch's worth)."""
        sizer = self._sizer if group is None else self._group_sizer(group)

        def make_run(upstream: Stream) -> _Run:
            latest = self._latest
            tuner = self._latest = Tuner(self._limits(), None if latest is None else latest.setting)
            setting = tuner.setting
            sizer.limit(setting.chunk)
            return _Run(upstream, self._executor(call, setting.workers), setting.slots, False,
                        sizer, start, tuner)
        stream = _Background(upstream, name, make_run, self.ordered, self.workers)
        if self.on_error != "raise":
            stream.skips = SkipLog(self.max_errors)
        return stream

    def _group_sizer(self, size: int) -> _Sizer:
        sizer = self._group_sizers.get(size)
        if sizer is None:
            sizer = self._group_sizers[size] = _Sizer(self.chunk_seconds,
                                                      max(1, self.chunk_size // size), True)
        return sizer

    def _limits(self) -> Limits:
        auto = self.n_workers == "auto"
        return Limits(workers=None if auto else self.workers,
                      buffer=None if self.buffer_size == "auto" else self.buffer_size,
                      cpu=self.cpu_budget or default_cpu_budget(), memory=self.memory_budget,
                      most=self.workers, per_worker=self.per_worker, held=self._held())

    def _held(self) -> float:
        """Items' worth of memory outside the chunks the stage holds: the consumer's last."""
        return 1.0

    @abc.abstractmethod
    def _executor(self, call: Any, workers: int) -> Any:
        """The executor of one run: ``begin(results)``, ``submit(seq, index, chunk, slots)``,
        ``resize(workers)``, ``stop()`` and ``join(deadline)``, as :class:`_ThreadWorkers`
        has them."""

    def _options(self) -> dict:
        return {"n_workers": self.n_workers,
                "buffer_size": self.buffer_size if self.buffer_size == "auto" else None,
                "cpu_budget": self.cpu_budget, "memory_budget": self.memory_budget,
                "ordered": None if self.ordered else False, "seed": self.seed,
                **error_options(self)}

    def __repr__(self) -> str:
        return stage_repr(self.kind, self.func, self.args, {**self._options(), **self.kwargs})


def _checked_budgets(n_workers: int | str, cpu_budget: Any,
                     memory_budget: Any) -> tuple[float | None, int | None]:
    """``cpu_budget`` (cores) and ``memory_budget`` (bytes), once they are checked: a core
    budget bounds ``n_workers="auto"`` and nothing else; a byte budget bounds any stage."""
    if cpu_budget is not None:
        cpu_budget = check_positive("cpu_budget", cpu_budget)
        if n_workers != "auto":
            raise ValueError(f"cpu_budget bounds the workers that n_workers='auto' chooses; "
                             f"with n_workers={n_workers!r} it has nothing to bound: pass one "
                             f"of the two; got cpu_budget={cpu_budget!r}")
    if memory_budget is not None:
        memory_budget = check_integer("memory_budget", memory_budget, _LEAST_MEMORY)
    return cpu_budget, memory_budget


_LEAST_MEMORY = 1 << 20  # bytes: a smaller budget is a mistake (a unit missed, say)


class _ThreadStage(_ParallelStage):
    kind, chunk_seconds = "threads", _THREAD_CHUNK_SECONDS

    def _executor(self, call: Any, workers: int) -> _ThreadWorkers:
        return _ThreadWorkers(call, workers)


def threads(func: Callable, *args: Any, n_workers: int | str = 1, buffer_size: int | str = 2,
            ordered: bool = True, seed: Seed | None = None, epoch: int = 0, chunk_size: int = 64,
            on_error: OnError = "raise", max_errors: int | None = None,
            cpu_budget: float | None = None, memory_budget: int | None = None,
            **kwargs: Any) -> Stage:
    """The stage that computes ``func(item, *args, **kwargs)`` in ``n_workers`` threads (-1:
    one per core). Use it for work that releases the GIL (numpy, IO, decoding).

    ``n_workers="auto"`` lets the stage choose, while it runs, as many threads as keep up with
    its consumer, within ``cpu_budget`` cores (default: those this process may use) and at
    most 64: work that waits for IO takes a fraction of a core per thread, so it gets more.
    ``buffer_size="auto"`` grows the buffer while the consumer waits and the threads wait for
    room. ``memory_budget`` (bytes) bounds what the stage holds, its chunks in work and those
    waiting, with any setting. The docs' Tuning page says more; :func:`fpipe.explain` shows
    the choices.

    Items travel to the threads in chunks of at most ``chunk_size`` (fewer while items are
    slow, so the first results come quickly). At most ``n_workers + buffer_size`` chunks are in
    the stage at once, so it reads at most that many chunks ahead of its consumer. Results keep
    the input order unless ``ordered=False``. With ``seed``, each item's generator (from
    ``(seed, epoch, index)``) is active while ``func`` runs, so the output does not depend on
    ``n_workers`` or on the order of completion; ``epoch`` is the epoch of the first
    application, as in :func:`fpipe.map`.

    An exception in ``func`` reaches the consumer with its type, message and the worker's
    traceback, after the results of the items before it. With ``on_error="skip"`` (or a
    callable, which runs in the worker), the items on which ``func`` raises are left out,
    counted and recorded for :func:`fpipe.stats`; ``max_errors`` bounds how many may fail
    (see :mod:`fpipe.skipping`). Closing the stream stops and joins the threads.

    >>> with threads(abs, n_workers=2)(range(-3, 4)) as stream:
    ...     list(stream)
    [3, 2, 1, 0, 1, 2, 3]
    """
    return at_epoch(_ThreadStage(func, args, kwargs, n_workers, buffer_size, ordered, seed,
                                 chunk_size, on_error=on_error, max_errors=max_errors,
                                 cpu_budget=cpu_budget, memory_budget=memory_budget), epoch)


class _ProcessWorkers:
    """The executor of one run of :func:`processes`: its tasks go to the stage's pool. With
    ``gated``, at most ``workers`` of them run at once (two per worker when the pool has no
    other worker to run the second), so a tuned stage on a larger pool uses what it chose."""

    def __init__(self, pool: Any, call: Any, transport: Transport | None, workers: int,
                 gated: bool) -> None:
        self._pool, self._call, self._token = pool, ShippedCall(call), None
        self._transport, self._gated = transport, gated
        self._room = threading.Condition()
        self._running, self._stopped = 0, False
        self._limit = self._limit_for(workers)

    def _limit_for(self, workers: int) -> int:
        return 2 * workers if workers >= self._pool.n_workers else workers

    def begin(self, results: queue.SimpleQueue) -> None:
        self._token = self._pool.open(_Counted(results, self._finished) if self._gated else results)

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        if self._gated:
            with self._room:
                while self._running >= self._limit and not self._stopped:
                    self._room.wait()
                self._running += 1
        try:
            self._pool.submit(self._token, (self._call, self._token, seq, index, chunk, slots,
                                            os.getpid(), self._transport))
        except BaseException:
            if self._gated:
                self._finished()
            raise

    def _finished(self) -> None:
        with self._room:
            self._running -= 1
            self._room.notify()

    def resize(self, workers: int) -> None:
        with self._room:
            self._limit = self._limit_for(workers)
            self._room.notify_all()

    def stop(self) -> None:
        with self._room:
            self._stopped = True
            self._room.notify_all()
        if self._token is not None:
            self._pool.close_run(self._token)
        if self._transport is not None:
            end_run(self._transport)

    def join(self, deadline: float) -> None:
        pass


class _Counted:
    """A run's results queue that tells ``finished()`` of each chunk's results as they come."""

    def __init__(self, results: queue.SimpleQueue, finished: Callable[[], None]) -> None:
        self._results, self._finished = results, finished

    def put(self, message: Message) -> None:
        if message.seq is not None:
            self._finished()
        self._results.put(message)


_STREAMING_BACKENDS = "'loky' (the default: worker processes on this machine), 'threading', 'dask'"


def _check_backend(backend: Any) -> Any:
    """``backend``, once joblib can stream through it; else an error that names the ones
    that work. (joblib's multiprocessing backend hands back no result before its whole call
    ends, and loses the task of a worker that dies.)"""
    if not isinstance(backend, str) and not hasattr(backend, "apply_async"):
        raise TypeError(f"backend must be a joblib backend name or instance; "
                        f"got backend={backend!r}")
    if backend == "multiprocessing" or getattr(backend, "supports_return_generator", True) is False:
        raise ValueError(f"backend={backend!r} cannot run a process stage: joblib returns its "
                         f"results only once the whole call has ended; use {_STREAMING_BACKENDS}"
                         " or another backend that joblib streams")
    return backend


class _ProcessStage(_ParallelStage):
    # two chunks per worker: joblib hands a worker its next task only when one completes, so
    # the next chunk must already be waiting then
    kind, chunk_seconds, per_worker = "processes", _PROCESS_CHUNK_SECONDS, 2
    measure_first = True

    def __init__(self, *args: Any, backend: Any, shared_memory: bool,
                 shared_memory_budget: int | None, **on_error: Any) -> None:
        super().__init__(*args, **on_error)
        self.backend = _check_backend(backend)
        self.shared_memory = check_bool("shared_memory", shared_memory)
        self.shared_memory_budget = (None if shared_memory_budget is None else
                                     check_integer("shared_memory_budget", shared_memory_budget, 0))
        self._pool = process_pool(self.workers if self.n_workers == "auto" else self.n_workers,
                                  backend)
        # a stage that nobody can use again stops now: a forgotten stage's joblib generator
        # would keep feeding idle tasks for a second to the workers that every stage shares,
        # and on loky its tasks that no worker took yet are cancelled
        weakref.finalize(self, self._pool.shutdown)

    def _most_workers(self) -> int:
        # processes work on a core each: "auto" chooses at most one per core of the budget
        if self.n_workers == "auto":
            return max(1, math.floor(self.cpu_budget or default_cpu_budget()))
        return super()._most_workers()

    def _held(self) -> float:
        # and each worker's free slab, an output's worth (half of what an item counts)
        return 1.0 + self.workers / 2

    def _executor(self, call: Any, workers: int) -> _ProcessWorkers:
        return _ProcessWorkers(self._pool, call, self._transport(), workers,
                               gated=self.n_workers == "auto")

    def _transport(self) -> Transport | None:
        """How this run's results come back in shared memory; None: through the pipe."""
        if not self.shared_memory or self.backend != "loky" or not shared_memory_available():
            return None
        if self.memory_budget is None:
            return Transport.for_consumer(self.workers, budget=self.shared_memory_budget)
        # the slabs count in the memory budget, which bounds the chunks held, and so the
        # slabs in use (any worker may hold them all); a worker keeps one free slab besides
        budget = self.shared_memory_budget or self.memory_budget
        return Transport.for_consumer(self.workers, budget=budget, keep=1)

    def close(self) -> None:
        """On other backends than loky, end the joblib generator now, not a second after the
        last task (say, before a dask cluster is closed); the stage starts a new one when it
        is used again. On loky there is nothing to end."""
        self._pool.release()

    def _options(self) -> dict:
        backend = None if self.backend == "loky" else self.backend
        return {**super()._options(), "backend": backend,
                "shared_memory": None if self.shared_memory else False,
                "shared_memory_budget": self.shared_memory_budget}


def processes(func: Callable, *args: Any, n_workers: int | str = 1, backend: Any = "loky",
              ordered: bool = True, seed: Seed | None = None, epoch: int = 0,
              buffer_size: int | str = 2, chunk_size: int = 256, on_error: OnError = "raise",
              max_errors: int | None = None, shared_memory: bool = True,
              shared_memory_budget: int | None = None, cpu_budget: float | None = None,
              memory_budget: int | None = None, **kwargs: Any) -> Stage:
    """The stage that computes ``func(item, *args, **kwargs)`` in ``n_workers`` worker
    processes (-1: one per core), on joblib. Use it for pure-Python work that holds the GIL.

    ``backend`` is passed to joblib: ``"loky"`` (the default), ``"threading"``, ``"dask"``
    (with a ``dask.distributed`` client), or any registered joblib backend that streams its
    results (not ``"multiprocessing"``, which joblib does not stream: it is refused). Functions
    travel with cloudpickle, so lambdas work, and a worker's traceback shows their file and
    line. ``func`` is pickled once per run; its bytes go with every chunk, and each worker
    unpickles them once and keeps that copy for the run's chunks. As a DataLoader's dataset in
    its workers, it keeps its state (an open file, a cache) from chunk to chunk, and each run
    starts again from the consumer's copy (a worker keeps the functions of its last four runs).
    Its numpy arrays of 1 MiB or more go beside those bytes through joblib's pickler, which
    memory-maps them. Results are pickled in the worker: one that does not pickle ends the
    stream with a ``TypeError`` naming its item, after the items before it. Items travel
    in chunks of at most ``chunk_size`` (about 20 ms of work each); at most
    ``2 * n_workers + buffer_size`` chunks are in the stage at once (two per worker: one in
    work, one waiting, as joblib sends a worker its next task only when one completes).

    The workers are started at the first ``next()`` and kept for every later run of this stage
    object (epochs, other pipelines). On ``loky`` each chunk goes straight to joblib's shared
    loky executor (the one every ``joblib.Parallel`` call uses) and its result comes back
    through the future's callback: a new stage on warm workers has its first result in a few
    milliseconds. Closing a stream does not kill the workers: its results still on their way
    are dropped, and its chunks that no worker has taken are cancelled, so the next run has the
    workers at once. Until the first results come back, chunks hold one item, as a chunk a
    worker has taken cannot be taken back. On other backends the stage keeps one joblib
    generator running while it has work, and ends it about a second after its last task, or
    as soon as the stage object is garbage-collected; ``stage.close()`` ends it at once
    (before closing a dask cluster, say), and the stage starts a new one if it is used again.

    Results come back in shared memory where that pays: on ``loky`` (whose workers run on
    this machine, on Linux), the numpy arrays of at least 16 KiB in a result (also inside
    tuples, lists, dicts and named tuples, and torch tensors once :mod:`fpipe.torch` is
    imported) are written once into a segment of ``/dev/shm`` about their size, and the
    consumer gets arrays that view it, without a copy. A segment is reused within the run once
    every array of its chunk of results is garbage-collected, and given up when the run ends
    (its memory goes once no array views it). Each worker holds at most
    ``shared_memory_budget`` bytes of segments (default: a quarter of ``/dev/shm`` shared
    between the workers, at most 256 MiB each, as loky restarts a worker whose memory grew by
    300 MB); past it, or when ``/dev/shm`` is full, results go through the pipe
    with one ``RuntimeWarning``. ``shared_memory=False`` sends everything through the pipe, as
    do the other backends (``dask``'s workers may be on other machines).

    Inside a worker, :func:`fpipe.combine_to_arrays` stacks a batch straight into a slab, so a
    batch made in the workers crosses without any copy. Workers of this machine's pool keep
    the memory they free for their next task (glibc's ``mallopt``: arrays up to 32 MiB come
    from the heap, which gives memory back past 64 MiB free), as page-faulting every new batch
    in anew costs image pipelines a quarter of their time on virtual machines.

    Order, seeds, ``epoch``, errors and ``on_error`` behave as in :func:`threads` (a callable
    ``on_error`` runs in the worker process, so it must pickle). So do ``n_workers="auto"``,
    ``buffer_size="auto"``, ``cpu_budget`` and ``memory_budget``, but ``"auto"`` chooses at most
    one process per core of ``cpu_budget`` (the pool has that many; the stage runs as many
    chunks at once as it chose), and with ``memory_budget`` each worker's shared memory is its
    share of the budget.

    Followed by :func:`fpipe.batch` of a size and one of fpipe's combiners
    (``map(combine_to_arrays)``, say), the stage makes whole batches in its workers, which
    cross in shared memory as one piece; a ``map(..., in_workers=True)`` just before it runs in
    its workers too (see :func:`fpipe.explain`).

    Where joblib can start no worker process, the stage runs ``func`` in its own thread, in
    this process: in a daemon process (every DataLoader worker), with one ``RuntimeWarning``,
    and for a thread that starts a stage while the interpreter exits. A forked child starts a
    pool of its own. At exit, fpipe waits for the live non-daemon threads (as Python would)
    before it stops the workers; the tasks of closed or abandoned streams get a quarter of a
    second, then their workers are killed, so Ctrl-C ends the program at once, even before the
    first result.

    >>> with processes(abs, n_workers=2, backend="threading")(range(-2, 3)) as stream:
    ...     list(stream)
    [2, 1, 0, 1, 2]
    """
    return at_epoch(_ProcessStage(func, args, kwargs, n_workers, buffer_size, ordered, seed,
                                  chunk_size, backend=backend, on_error=on_error,
                                  max_errors=max_errors, shared_memory=shared_memory,
                                  shared_memory_budget=shared_memory_budget,
                                  cpu_budget=cpu_budget, memory_budget=memory_budget), epoch)
