"""The machinery of a background stage (:mod:`fpipe.stream.parallel.stages`): a *run* per
application, in which a feeder thread reads the upstream in chunks (sized by the work they
take, :class:`Sizer`) into the room the stage has (:class:`Slots`), an executor works on them,
and the stream (:class:`Background`) delivers the results in input order, or as they
complete; with a tuner, what the run measures goes to its :class:`~fpipe.stream.parallel._tuner.Watch`.

>>> from toolz import pipe
>>> import fpipe
>>> with pipe(range(-3, 4), fpipe.prefetch(4), fpipe.threads(abs, n_workers=2)) as stream:
...     list(stream)
[3, 2, 1, 0, 1, 2, 3]
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from fpipe.errors import capture
from fpipe.stream.core import JOIN_SECONDS, Stream, next_chunk_size
from fpipe.stream.parallel._messages import Message
from fpipe.stream.parallel._tuner import Gauge, Setting, Tuner, Watch

__all__: list[str] = []  # private: the background stages of parallel are its users


class Slots:
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


class Handover:
    """The chunk a feeder is filling from an upstream that ``waits``, and its hand-over to the
    executor: when it is full, or at once when the consumer waits for it, so that an item read
    is never held back while the feeder waits for the next one (a source may wait for what the
    consumer does with the items it has). The feeder and the consumer hand over under one lock,
    so chunks go out in order.

    ``reserved`` counts the slots held for the items and for the read under way: one per item
    (``per_item``, prefetch), or one for the chunk (threads, processes)."""

    def __init__(self, executor: Any, results: queue.SimpleQueue, per_item: bool, start: int,
                 sizer: Sizer) -> None:
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


class Run:
    """The threads of one application of a background stage. They hold this object, never the
    stream, so that a forgotten stream is garbage-collected and its finalizer stops them."""

    def __init__(self, upstream: Stream, executor: Any, slots: int, per_item: bool,
                 sizer: Sizer, start: int, tuner: Tuner | None = None) -> None:
        self.upstream, self.executor, self.sizer, self.tuner = upstream, executor, sizer, tuner
        self.slot_count = slots
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.slots, self.per_item, self.start = Slots(slots), per_item, start
        # an upstream that does not wait fills each chunk in one pull, without the consumer
        self.handover = (Handover(executor, self.results, per_item, start, sizer)
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


class Sizer:
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


class Background(Stream):
    """The consumer side of a background stage: results come back through a queue and leave
    in input order (or as they complete)."""

    waits = True

    def __init__(self, upstream: Stream, name: str, make_run: Callable[[Stream], Run],
                 ordered: bool, workers: int) -> None:
        super().__init__(upstream, name)
        self._make_run, self._ordered, self._workers = make_run, ordered, workers
        self._run: Run | None = None
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
            # the watch reads this stream's count through a weak reference: a forgotten
            # stream must not be kept alive by its own watch, or its finalizer waits for gc
            stream = weakref.ref(self)
            self.watch = Watch(run.tuner, Gauge(), run.apply, lambda: _delivered(stream),
                               lambda: (run.reading, run.slots.waited))
        run.begin()

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


def _delivered(stream: weakref.ref) -> int:
    """The items that the stream behind ``stream`` handed out (0 once it is gone)."""
    alive = stream()
    return 0 if alive is None else alive.measure(0.0)[0]


class Inline:
    """The executor of prefetch: chunks go straight to the consumer."""

    def begin(self, results: queue.SimpleQueue) -> None:
        self._results = results

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        self._results.put(Message(seq, chunk, None, 0.0, slots))

    def stop(self) -> None:
        pass

    def join(self, deadline: float) -> None:
        pass
