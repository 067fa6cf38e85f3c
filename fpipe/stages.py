"""Stages: functions from a stream to a stream, and the streams they return.

A *stage* is built from its configuration and then applied to an iterable, so a pipeline is
``toolz.pipe(source, *stages)``. Applying a stage returns a :class:`Stream`: a lazy iterator
that starts nothing before its first ``next()``, closes its upstream when it is closed (also on
leaving a ``with`` block), and measures where its time goes (:func:`stats`).

>>> from toolz import pipe
>>> with pipe(range(10), map(lambda x: x * x), filter(lambda x: x % 2), take(3)) as stream:
...     list(stream)
[1, 9, 25]

Streams hand items to each other in chunks (:meth:`Stream.pull`), so a chain of cheap stages
costs about as much as a plain loop, and a hop to a thread or a process is paid once per chunk,
not once per item. :func:`threads` and :func:`processes` keep the input order unless asked not
to (``ordered=False``), and with ``seed=`` give every item its own random generator, derived
from ``(seed, epoch, index)``: the output is the same for any number of workers and any backend.

**Epochs.** The *epoch* of an application is the number of times the stage object was applied
before (0, 1, 2, ...), unless :meth:`Stage.set_epoch` set it. A seeded stage draws differently
in each epoch and identically in the same epoch of another run. :meth:`Stage.apply` takes the
epoch (and the index of the first item) explicitly, to resume a stream.
"""

from __future__ import annotations

import abc
import builtins
import collections
import itertools
import os
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import CapturedError, capture, check_integer
from .random import Seed, item_rng, seed_entropy, set_active
from .streaming._shm import Transport, encode, sweep, watch_owner
from .streaming._shm import available as shared_memory_available

__all__ = [
    "Stage",
    "StageStats",
    "Stats",
    "Stream",
    "as_stream",
    "filter",
    "map",
    "prefetch",
    "processes",
    "stats",
    "take",
    "threads",
    "transform_stream",
]

_TIMED_EVERY = 16  # a stream times one pull in 16; that keeps stats under 5 % on cheap stages
_READ_AHEAD = 64  # most items next() reads ahead of the consumer ...
READ_SECONDS = 1e-4  # ... and only while they take less than this to make (batch too)
_GENERATOR_SLICE = 1e-3  # a generator stage returns what it has after this long
_JOIN_SECONDS = 2.0  # close() waits this long for a stage's threads
_THREAD_CHUNK_SECONDS = 2e-3  # work per chunk handed to a thread ...
_PROCESS_CHUNK_SECONDS = 2e-2  # ... or to a process, where a round trip costs about 0.3 ms


# --- streams ----------------------------------------------------------------------------


class Stream(abc.ABC):
    """A lazy stream of items: what a stage returns, and what the next stage reads.

    It is an iterator (``next()``, ``for``) and a context manager that closes it. Stages read
    each other with :meth:`pull`, a chunk at a time. ``next()`` reads ahead of the consumer only
    while items are cheap: at most 64 items, and only as many as take about 0.1 ms to make.
    ``waits`` tells whether a pull may wait for other threads (a background stage upstream).

    >>> stream = as_stream(range(5))
    >>> next(stream), stream.pull(3), list(stream)
    (0, [1, 2, 3], [4])
    """

    waits = False  # whether a pull may wait for other threads (or on its upstream's)

    def __init__(self, upstream: Stream | None, name: str) -> None:
        self.upstream, self.name = upstream, name
        if upstream is not None and upstream.waits:
            self.waits = True
        self._buffer: list = []  # items next() has read, last one first
        self._read_size = 1
        self._error: BaseException | CapturedError | None = None  # raised at the next pull
        self._closed = False
        self._meter = _Meter()
        self._reader: _Meter | None = None  # the meter of the stream that reads this one
        if upstream is not None:
            upstream._reader = self._meter

    def pull(self, n: int) -> list:
        """The next items, at least one and at most ``n``; ``[]`` once the stream has ended.

        An error raised while making items is raised after the items made before it, at the
        next pull; the stream then closes itself.
        """
        if self._buffer or self._error is not None or self._closed:
            return self._pull_held(n)
        meter = self._meter
        meter.until_timed -= 1
        if not meter.until_timed:
            return self._timed_pull(n)
        try:
            items = self._pull(n)
        except BaseException:
            self.close()
            raise
        meter.items += len(items)
        return items

    def _timed_pull(self, n: int) -> list:
        meter, start = self._meter, time.perf_counter()
        if meter.started is None:
            meter.started = start
        meter.until_timed, meter.timing = _TIMED_EVERY, True
        try:
            items = self._pull(n)
        except BaseException:
            self.close()
            raise
        finally:
            meter.timing = False
        meter.seconds += time.perf_counter() - start
        meter.timed += 1
        meter.items += len(items)
        return items

    def _pull_held(self, n: int) -> list:
        if self._buffer:
            return self._unbuffer(n)
        if self._error is not None:
            self._raise_error()
        return []  # closed

    @abc.abstractmethod
    def _pull(self, n: int) -> list:
        """Make the next items, at least one and at most ``n``; ``[]`` at the end. An error
        raised here closes the stream (see :meth:`pull`)."""

    def _unbuffer(self, n: int) -> list:
        buffer = self._buffer
        items = buffer[-n:]
        del buffer[-n:]
        items.reverse()
        return items

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        self.close()
        if isinstance(error, CapturedError):
            error.reraise()
        raise error

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Any:
        buffer = self._buffer
        if buffer:
            return buffer.pop()
        start = time.perf_counter()
        items = self.pull(self._read_size)
        seconds = time.perf_counter() - start
        reader = self._reader
        if reader is not None and reader.timing:
            reader.waited += seconds
        if not items:
            raise StopIteration
        self._read_size = _chunk_size(len(items), seconds, READ_SECONDS, _READ_AHEAD)
        items.reverse()
        first = items.pop()
        self._buffer = items
        return first

    def close(self) -> None:
        """Stop this stream's work (threads are joined, process workers stay warm for the next
        run) and close its upstream. Closing twice does nothing."""
        if not self._closed:
            self._closed = True
            self._close()

    def _close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()

    def start(self) -> Stream:
        """Start the background work of this stream and of its upstream now, not at the
        first ``next()`` (a stream that works in its consumer's thread has none), and return
        the stream.

        >>> with prefetch(2)(range(3)).start() as stream:
        ...     list(stream)
        [0, 1, 2]
        """
        if self.upstream is not None and not self._closed:
            self.upstream.start()
        return self

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{self.name} stream>"

    def _upstream_pull(self, n: int) -> list:
        """``upstream.pull(n)``, timed when this stream's pull is (for :func:`stats`); hot
        callers check ``self._meter.timing`` themselves and call it only then."""
        meter = self._meter
        if not meter.timing:
            return self.upstream.pull(n)
        start = time.perf_counter()
        try:
            return self.upstream.pull(n)
        finally:
            meter.waited += time.perf_counter() - start

    def _shares(self, wall: float) -> tuple[float, float, float]:
        # between pulls, the stream waits for its consumer
        meter = self._meter
        scale = meter.scale()
        busy, waited = (meter.seconds - meter.waited) * scale, meter.waited * scale
        return busy / wall, waited / wall, max(wall - busy - waited, 0.0) / wall


class _Meter:
    """What a stream measures: the items it delivers, and for one pull in 16, the time of
    the pull and the part of it spent waiting for the upstream. (One class for every stream,
    so that the attribute access of the hot path stays specialized.)"""

    __slots__ = ("items", "seconds", "started", "timed", "timing", "until_timed", "waited")

    def __init__(self) -> None:
        self.items = self.timed = 0
        self.until_timed = 1  # the first pull is timed
        self.seconds = self.waited = 0.0
        self.started, self.timing = None, False

    def scale(self) -> float:
        """Pulls per timed pull, to scale the sampled times up to all pulls."""
        return (self.timed * _TIMED_EVERY - self.until_timed + 1) / self.timed if self.timed else 0.0


def _chunk_size(items: int, seconds: float, target: float, cap: int) -> int:
    """How many items to ask for next: about ``target`` seconds' worth, at most ``cap`` and at
    most twice the last chunk, so that a slow start stays small."""
    ideal = target * items / seconds if seconds > 0 else cap
    return max(1, min(cap, 2 * items, int(ideal)))


class _Source(Stream):
    """Any iterable as a stream; ``iter()`` is called at the first pull."""

    def __init__(self, iterable: Iterable) -> None:
        super().__init__(None, f"source({type(iterable).__name__})")
        self._iterable, self._iterator = iterable, None

    def _pull(self, n: int) -> list:
        if self._iterator is None:
            self._iterator = iter(self._iterable)
        items: list = []
        try:
            items.extend(itertools.islice(self._iterator, n))
        except Exception as error:
            if not items:
                raise
            self._error = error
        return items

    def _close(self) -> None:
        # an iterator that was never started is closed too, so that it cannot start later
        close = getattr(self._iterable if self._iterator is None else self._iterator, "close", None)
        if close is not None:
            close()


def as_stream(iterable: Iterable) -> Stream:
    """``iterable`` as a :class:`Stream` (a stream is returned as it is).

    >>> as_stream([1, 2]).pull(5)
    [1, 2]
    """
    return iterable if isinstance(iterable, Stream) else _Source(iterable)


# --- stages -----------------------------------------------------------------------------


class Stage(abc.ABC):
    """A function from an iterable to a :class:`Stream`, configured at construction.

    Each call is an application with its own epoch: the first call is epoch 0, the next epoch 1,
    and so on; :meth:`set_epoch` sets the epoch of the next call.

    ``one_to_one`` (false unless a stage class sets it) says that the stage gives exactly one
    output per input, in input order, and numbers the items from ``start``: then
    :class:`fpipe.Infinite` resumes a pipeline by skipping inputs instead of replaying outputs.

    >>> stage = map(abs)
    >>> stage.epoch, list(stage([1, -2])), stage.epoch, stage.one_to_one
    (0, [1, 2], 1, True)
    """

    _epoch = 0
    one_to_one = False

    def __call__(self, iterable: Iterable) -> Stream:
        epoch, self._epoch = self._epoch, self._epoch + 1
        return self.apply(iterable, epoch=epoch)

    @property
    def epoch(self) -> int:
        """The epoch that the next call will use."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next call epoch ``epoch`` (later calls count on from there).

        >>> stage = map(abs)
        >>> stage.set_epoch(5)
        >>> stage.epoch
        5
        """
        self._epoch = check_integer("epoch", epoch, 0)

    @abc.abstractmethod
    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        """Apply the stage as epoch ``epoch``, numbering the items from ``start`` (the index
        from which a seeded stage derives each item's generator); the epoch counter is left
        alone. This is how a stopped stream is resumed.

        >>> list(map(abs).apply([3, -4], epoch=2, start=10))
        [3, 4]
        """


def _check_workers(n_workers: Any) -> int:
    if n_workers == -1 and not isinstance(n_workers, bool):
        return -1
    if isinstance(n_workers, bool) or not isinstance(n_workers, (int, np.integer)):
        raise TypeError(f"n_workers must be an integer; got n_workers={n_workers!r}")
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1 or -1; got n_workers={n_workers!r}")
    return int(n_workers)


def _check_callable(name: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable; got {name}={value!r}")


def _entropy(seed: Seed | None) -> int | None:
    return None if seed is None else seed_entropy(seed)


def _func_name(func: Callable) -> str:
    return getattr(func, "__name__", None) or repr(func)


class _ItemCall:
    """``func(item, *args, **kwargs)`` over a chunk, each item's generator active when seeded.
    A class, not a closure, so that it pickles to worker processes."""

    __slots__ = ("func", "args", "kwargs", "seed", "epoch")

    def __init__(self, func: Callable, args: tuple, kwargs: dict, seed: int | None,
                 epoch: int) -> None:
        self.func, self.args, self.kwargs, self.seed, self.epoch = func, args, kwargs, seed, epoch

    def __reduce__(self):
        return _ItemCall, (self.func, self.args, self.kwargs, self.seed, self.epoch)

    def into(self, outputs: list, chunk: list, start: int) -> None:
        """Append the results to ``outputs``; on an error, the results before it stay there."""
        func, args, kwargs = self.func, self.args, self.kwargs
        if self.seed is None:
            calls = (builtins.map(func, chunk) if not (args or kwargs)
                     else (func(item, *args, **kwargs) for item in chunk))
            outputs.extend(calls)
            return
        for index, item in enumerate(chunk, start):
            previous = set_active(item_rng(self.seed, self.epoch, index))
            try:
                outputs.append(func(item, *args, **kwargs))
            finally:
                set_active(previous)

    def run(self, chunk: list, start: int) -> tuple[list, CapturedError | None, float]:
        """``(results, captured error or None, seconds)``: what a worker sends back."""
        began, outputs = time.perf_counter(), []
        try:
            self.into(outputs, chunk, start)
        except BaseException as error:  # a worker must report even SystemExit, not die
            return outputs, capture(error), time.perf_counter() - began
        return outputs, None, time.perf_counter() - began


def _call_repr(name: str, func: Callable, args: tuple, options: dict) -> str:
    parts = [_func_name(func), *builtins.map(repr, args)]
    parts += [f"{key}={value!r}" for key, value in options.items() if value is not None]
    return f"{name}({', '.join(parts)})"


class _MapStage(Stage):
    one_to_one = True

    def __init__(self, func: Callable, args: tuple, kwargs: dict, seed: Seed | None) -> None:
        _check_callable("func", func)
        self.func, self.args, self.kwargs, self.seed = func, args, kwargs, _entropy(seed)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        call = _ItemCall(self.func, self.args, self.kwargs, self.seed, epoch)
        return _Mapped(as_stream(iterable), repr(self), call.into, start)

    def __repr__(self) -> str:
        return _call_repr("map", self.func, self.args, {"seed": self.seed, **self.kwargs})


class _FilterStage(Stage):
    def __init__(self, predicate: Callable) -> None:
        _check_callable("predicate", predicate)
        self.predicate = predicate

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return _Mapped(as_stream(iterable), repr(self), self._into, start)

    def _into(self, outputs: list, chunk: list, start: int) -> None:
        outputs.extend(builtins.filter(self.predicate, chunk))

    def __repr__(self) -> str:
        return f"filter({_func_name(self.predicate)})"


class _Mapped(Stream):
    """A per-item stage run over whole chunks: ``into(outputs, chunk, index)``."""

    def __init__(self, upstream: Stream, name: str, into: Callable, start: int) -> None:
        super().__init__(upstream, name)
        self._into, self._index = into, start

    def _pull(self, n: int) -> list:
        outputs: list = []
        meter = self._meter
        while not outputs:
            chunk = self._upstream_pull(n) if meter.timing else self.upstream.pull(n)
            if not chunk:
                return outputs
            start, self._index = self._index, self._index + len(chunk)
            try:
                self._into(outputs, chunk, start)
            except Exception as error:
                if not outputs:
                    raise
                self._error = error
        return outputs


def map(func: Callable, *args: Any, seed: Seed | None = None, **kwargs: Any) -> Stage:
    """The stage that yields ``func(item, *args, **kwargs)`` for each item, in this thread.

    With ``seed``, each item's generator (from ``(seed, epoch, index)``) is active while
    ``func`` runs, for :func:`fpipe.random_apply`, :func:`fpipe.sample_args` and the samplers.

    >>> list(map(pow, 3)([1, 2, 3]))
    [1, 8, 27]
    >>> from fpipe import random_apply
    >>> flip = map(random_apply(0.5, lambda x: -x), seed=0)
    >>> list(flip.apply(range(1, 9))) == list(flip.apply(range(1, 9)))
    True
    """
    return _MapStage(func, args, kwargs, seed)


def filter(predicate: Callable) -> Stage:
    """The stage that keeps the items for which ``predicate(item)`` is true.

    >>> list(filter(str.isdigit)("a1b2"))
    ['1', '2']
    """
    return _FilterStage(predicate)


class _TakeStage(Stage):
    def __init__(self, n: int) -> None:
        self.n = check_integer("n", n, 0)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return _Taken(as_stream(iterable), repr(self), self.n)

    def __repr__(self) -> str:
        return f"take({self.n})"


class _Taken(Stream):
    def __init__(self, upstream: Stream, name: str, n: int) -> None:
        super().__init__(upstream, name)
        self._left = n

    def _pull(self, n: int) -> list:
        if self._left <= 0:
            return []
        items = self._upstream_pull(min(n, self._left))
        self._left -= len(items)
        return items


def take(n: int) -> Stage:
    """The stage that yields the first ``n`` items and then ends; it reads no more than ``n``
    items from its upstream (which it leaves open until it is closed itself).

    >>> list(take(2)("abc"))
    ['a', 'b']
    """
    return _TakeStage(n)


class _StreamStage(Stage):
    def __init__(self, func: Callable, args: tuple, kwargs: dict) -> None:
        _check_callable("func", func)
        self.func, self.args, self.kwargs = func, args, kwargs

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return generator_stream(iterable, repr(self), self._start)

    def _start(self, upstream: Stream) -> Iterator:
        return iter(self.func(upstream, *self.args, **self.kwargs))

    def __repr__(self) -> str:
        return _call_repr("transform_stream", self.func, self.args, self.kwargs)


class _Generated(Stream):
    """A stage written as a generator over its upstream, which it reads item by item."""

    def __init__(self, upstream: Stream, name: str, start: Callable[[Stream], Iterator]) -> None:
        super().__init__(upstream, name)
        self._start, self._iterator = start, None

    def _pull(self, n: int) -> list:
        if self._iterator is None:
            self._iterator = self._start(self.upstream)
        items: list = []
        deadline = time.perf_counter() + _GENERATOR_SLICE
        try:
            for item in self._iterator:
                items.append(item)
                if len(items) >= n or time.perf_counter() > deadline:
                    break
        except Exception as error:
            if not items:
                raise
            self._error = error
        return items

    def _close(self) -> None:
        try:
            close = getattr(self._iterator, "close", None)
            if close is not None:
                close()
        finally:
            super()._close()


def generator_stream(iterable: Iterable, name: str, start: Callable[[Stream], Iterator]) -> Stream:
    """The stream, named ``name``, of what the iterator ``start(upstream)`` yields in the
    consumer's thread, where ``upstream`` is ``iterable`` as a stream; closing it closes the
    iterator and the upstream. What :func:`transform_stream` applies; not in ``__all__``:
    fpipe's other stage modules build their streams with it.

    >>> list(generator_stream("abc", "upper", lambda upstream: (x.upper() for x in upstream)))
    ['A', 'B', 'C']
    """
    return _Generated(as_stream(iterable), name, start)


def transform_stream(func: Callable, *args: Any, **kwargs: Any) -> Stage:
    """The stage that hands the whole stream to ``func(stream, *args, **kwargs)``, which returns
    or yields any number of outputs (dpipe's ``Iterator``): for windows, pairs, flat maps and
    other stateful work. It runs in this thread; add :func:`prefetch` to run it ahead.

    >>> def pairs(items):
    ...     items = iter(items)
    ...     return zip(items, items)
    >>> list(transform_stream(pairs)(range(6)))
    [(0, 1), (2, 3), (4, 5)]
    """
    return _StreamStage(func, args, kwargs)


# --- background stages: prefetch, threads, processes ------------------------------------


class _Slots:
    """Room for what a background stage holds; the feeder waits for room, close() wakes it."""

    def __init__(self, count: int) -> None:
        self._free, self._closed = count, False
        self._condition = threading.Condition()

    def acquire(self, most: int) -> int:
        """Reserve between 1 and ``most`` slots (waiting for one); 0 once closed."""
        with self._condition:
            while not self._free and not self._closed:
                self._condition.wait()
            if self._closed:
                return 0
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def release(self, count: int) -> None:
        with self._condition:
            self._free += count
            self._condition.notify()

    def close(self) -> None:
        with self._condition:
            self._closed = True
            self._condition.notify_all()


_WAKE = (None, None, None, 0.0, 0)  # a results entry that only wakes the consumer


class _Run:
    """The threads of one application of a background stage. They hold this object, never the
    stream, so that a forgotten stream is garbage-collected and its finalizer stops them."""

    def __init__(self, upstream: Stream, executor: Any, slots: int, per_item: bool,
                 sizer: _Sizer, start: int) -> None:
        self.upstream, self.executor, self.sizer = upstream, executor, sizer
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.slots, self.per_item, self.start = _Slots(slots), per_item, start
        self.stopping, self.reading = False, 0.0  # seconds the feeder spent reading
        self._closed_upstream = False
        self._lock = threading.Lock()
        self.feeder = threading.Thread(target=self._feed, name="fpipe-feeder", daemon=True)

    def begin(self) -> None:
        self.executor.begin(self.results)
        self.feeder.start()

    def _feed(self) -> None:
        seq, index = 0, self.start
        try:
            while True:
                reserved = self.slots.acquire(self.sizer.size if self.per_item else 1)
                if not reserved or self.stopping:
                    return
                chunk = self._read(seq, reserved)
                if chunk is None:
                    return
                self.executor.submit(seq, index, chunk, reserved)
                seq, index = seq + 1, index + len(chunk)
        finally:
            if self.stopping:
                self.close_upstream()

    def _read(self, seq: int, reserved: int) -> list | None:
        """The next chunk; on the end or an error, tell the consumer and return None."""
        began = time.perf_counter()
        try:
            chunk = self.upstream.pull(reserved if self.per_item else self.sizer.size)
        except BaseException as error:
            self.results.put((seq, [], capture(error), 0.0, reserved))
            return None
        if not chunk:
            self.results.put((seq, None, None, 0.0, reserved))
            return None
        seconds = time.perf_counter() - began
        self.reading += seconds
        self.sizer.pulled(len(chunk), seconds)
        if self.per_item and len(chunk) < reserved:
            self.slots.release(reserved - len(chunk))
        return chunk

    def close_upstream(self) -> None:
        with self._lock:
            if self._closed_upstream:
                return
            self._closed_upstream = True
        self.upstream.close()

    def stop(self, join: bool) -> None:
        self.stopping = True
        self.slots.close()
        self.executor.stop()
        self.results.put(_WAKE)
        if join and self.feeder is not threading.current_thread():
            deadline = time.monotonic() + _JOIN_SECONDS
            if self.feeder.ident is not None:
                self.feeder.join(max(0.0, deadline - time.monotonic()))
            self.executor.join(deadline)
        if not self.feeder.is_alive():
            self.close_upstream()  # else the feeder closes it on its way out


class _Sizer:
    """Chunk sizes for a background stage: about ``target`` seconds of reading plus work per
    chunk, at most ``cap`` items. Kept by the stage, so a second run starts at a good size."""

    def __init__(self, target: float, cap: int) -> None:
        self.target, self.cap, self.size = target, cap, 1
        self.work_per_item = 0.0

    def pulled(self, items: int, seconds: float) -> None:
        total = seconds + self.work_per_item * items
        self.size = _chunk_size(items, total, self.target, self.cap)

    def worked(self, items: int, seconds: float) -> None:
        if items:
            self.work_per_item = seconds / items


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
        self._ready_slots, self._ready_error = 0, None
        self._work = 0.0

    def start(self) -> Stream:
        if self._run is None and not self._closed:
            self._begin()
        return self

    def _begin(self) -> None:
        self._run = self._make_run(self.upstream)
        self._finalizer = weakref.finalize(self, self._run.stop, False)
        self._run.begin()

    def _pull(self, n: int) -> list:
        if self._run is None:
            self._begin()
        if not self._ready and not self._next_chunk():
            self.close()
            return []
        items = self._ready
        if len(items) > n:
            self._ready = items[n:]
            return items[:n]
        self._ready, self._error = [], self._ready_error  # raised after the chunk's results
        self._run.slots.release(self._ready_slots)
        return items

    def _next_chunk(self) -> bool:
        """Make the next chunk of results ready; False at the end."""
        entry = self._next_entry()
        if entry is None:
            return False
        outputs, error, seconds, slots = entry
        self._work += seconds
        self._run.sizer.worked(len(outputs), seconds)
        if error is not None and not outputs:
            self._run.slots.release(slots)
            error.reraise()
        self._ready, self._ready_slots, self._ready_error = outputs, slots, error
        return True

    def _next_entry(self) -> tuple | None:
        results = self._run.results
        while True:
            if self._ordered and self._next_seq in self._pending:
                entry = self._pending.pop(self._next_seq)
                self._next_seq += 1
                return self._checked(entry)
            if self._total is not None and self._received == self._total:
                return None
            seq, *entry = results.get()
            if self._closed:
                return None
            if seq is None:  # an error of the process pool, for every run
                return self._checked(entry)
            if self._ordered:
                self._pending[seq] = entry
            elif entry[0] is None:
                self._total = seq
            else:
                self._received += 1
                return entry

    def _checked(self, entry: list) -> tuple | None:
        if entry[0] is None and entry[1] is None:
            return None  # the end of the input
        return tuple(entry)

    def _close(self) -> None:
        if self._run is None:
            super()._close()
            return
        self._finalizer.detach()
        self._run.stop(join=True)

    def _shares(self, wall: float) -> tuple[float, float, float]:
        # the workers are busy, or wait for the feeder to read, or wait for room downstream
        busy = self._work / (wall * self._workers) if self._workers else 0.0
        reading = (self._run.reading if self._run is not None else 0.0) / wall
        return busy, reading, max(1.0 - busy - reading, 0.0)


class _Inline:
    """The executor of prefetch: chunks go straight to the consumer."""

    def begin(self, results: queue.SimpleQueue) -> None:
        self._results = results

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        self._results.put((seq, chunk, None, 0.0, slots))

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
    """The executor of :func:`threads`: n threads taking chunks from a queue."""

    def __init__(self, call: _ItemCall, n_workers: int) -> None:
        self._call, self._tasks = call, queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name="fpipe-worker", daemon=True)
                         for _ in range(n_workers)]
        self._stopped = False

    def begin(self, results: queue.SimpleQueue) -> None:
        self._results = results
        for thread in self._threads:
            thread.start()

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        self._tasks.put((seq, index, chunk, slots))

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None or self._stopped:
                return
            seq, index, chunk, slots = task
            outputs, error, seconds = self._call.run(chunk, index)
            self._results.put((seq, outputs, error, seconds, slots))

    def stop(self) -> None:
        self._stopped = True
        for _ in self._threads:
            self._tasks.put(None)

    def join(self, deadline: float) -> None:
        for thread in self._threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


class _ParallelStage(Stage):
    """What :func:`threads` and :func:`processes` share: the checks, the repr, the runs."""

    kind, chunk_seconds, per_worker = "", 0.0, 1
    one_to_one = True

    def __init__(self, func: Callable, args: tuple, kwargs: dict, n_workers: int,
                 buffer_size: int, ordered: bool, seed: Seed | None, chunk_size: int) -> None:
        _check_callable("func", func)
        if not isinstance(ordered, bool):
            raise TypeError(f"ordered must be True or False; got ordered={ordered!r}")
        self.func, self.args, self.kwargs, self.ordered = func, args, kwargs, ordered
        self.n_workers = _check_workers(n_workers)
        self.workers = (os.cpu_count() or 1) if self.n_workers == -1 else self.n_workers
        self.buffer_size = check_integer("buffer_size", buffer_size, 1)
        self.chunk_size = check_integer("chunk_size", chunk_size, 1)
        self.seed = _entropy(seed)
        self._sizer = _Sizer(self.chunk_seconds, self.chunk_size)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        call = _ItemCall(self.func, self.args, self.kwargs, self.seed, epoch)
        slots = self.per_worker * self.workers + self.buffer_size

        def make_run(upstream: Stream) -> _Run:
            return _Run(upstream, self._executor(call), slots, False, self._sizer, start)
        return _Background(as_stream(iterable), repr(self), make_run, self.ordered, self.workers)

    @abc.abstractmethod
    def _executor(self, call: _ItemCall) -> Any:
        """The executor of one run: ``begin(results)``, ``submit(seq, index, chunk, slots)``,
        ``stop()`` and ``join(deadline)``, as :class:`_ThreadWorkers` has them."""

    def _options(self) -> dict:
        return {"n_workers": self.n_workers, "ordered": None if self.ordered else False,
                "seed": self.seed}

    def __repr__(self) -> str:
        return _call_repr(self.kind, self.func, self.args, {**self._options(), **self.kwargs})


class _ThreadStage(_ParallelStage):
    kind, chunk_seconds = "threads", _THREAD_CHUNK_SECONDS

    def _executor(self, call: _ItemCall) -> _ThreadWorkers:
        return _ThreadWorkers(call, self.workers)


def threads(func: Callable, *args: Any, n_workers: int = 1, buffer_size: int = 2,
            ordered: bool = True, seed: Seed | None = None, chunk_size: int = 64,
            **kwargs: Any) -> Stage:
    """The stage that computes ``func(item, *args, **kwargs)`` in ``n_workers`` threads (-1:
    one per core). Use it for work that releases the GIL (numpy, IO, decoding).

    Items travel to the threads in chunks of at most ``chunk_size`` (fewer while items are
    slow, so the first results come quickly). At most ``n_workers + buffer_size`` chunks are in
    the stage at once, so it reads at most that many chunks ahead of its consumer. Results keep
    the input order unless ``ordered=False``. With ``seed``, each item's generator (from
    ``(seed, epoch, index)``) is active while ``func`` runs, so the output does not depend on
    ``n_workers`` or on the order of completion.

    An exception in ``func`` reaches the consumer with its type, message and the worker's
    traceback, after the results of the items before it. Closing the stream stops and joins
    the threads.

    >>> with threads(abs, n_workers=2)(range(-3, 4)) as stream:
    ...     list(stream)
    [3, 2, 1, 0, 1, 2, 3]
    """
    return _ThreadStage(func, args, kwargs, n_workers, buffer_size, ordered, seed, chunk_size)


# --- processes, on joblib ---------------------------------------------------------------

_IDLE_SECONDS = (1e-3, 2e-2)  # an idle task sleeps this long, doubling up to the maximum
_KEEP_ALIVE = 1.0  # the joblib generator ends after this long without a task
_EXIT_SECONDS = 1.0  # at exit, running tasks get this long before their workers are killed
_STOP = object()
_POOLS: weakref.WeakSet = weakref.WeakSet()
_exit_hook = threading.Lock()


_FALLBACKS = {"budget": "the budget of shared_memory_budget bytes per worker is used",
              "full": "/dev/shm is full"}
_SHARED_BACKENDS = ("loky", "multiprocessing")  # whose workers run on this machine

_loky = {"size": 0, "users": 0}
_loky_lock = threading.Lock()


def _join_loky(n_workers: int) -> int:
    """The size to ask of joblib's one loky pool. joblib resizes the pool to each call's
    n_jobs, and a resize waits for every running task, so while one stage uses the pool,
    a stage that starts adopts its size instead of waiting (possibly forever)."""
    with _loky_lock:
        if not _loky["users"]:
            _loky["size"] = n_workers
        _loky["users"] += 1
        return _loky["size"]


def _leave_loky() -> None:
    with _loky_lock:
        _loky["users"] -= 1


def _run_task(call: _ItemCall, token: int, seq: int, index: int, chunk: list, slots: int,
              owner: int, transport: Transport | None) -> tuple:
    watch_owner(owner)  # a worker whose consumer is killed exits, not idles for minutes
    outputs, error, seconds = call.run(chunk, index)
    fallback = None
    if transport is not None:
        outputs, fallback = encode(transport, outputs)
    return token, seq, outputs, error, seconds, slots, fallback


def _idle(seconds: float) -> None:
    time.sleep(seconds)


class _ProcessPool:
    """One joblib generator that serves every run of a process stage.

    joblib kills its workers when an unfinished generator is closed, and runs far ahead of
    its consumer. So the pool keeps one generator alive while there is work, feeds it from a
    queue that never blocks (an idle task when there is nothing to do, since joblib asks for
    the next task while holding its own lock), and routes each result to its run by token.
    Results of a closed run are dropped; the workers stay warm for the next run.
    """

    def __init__(self, n_workers: int, backend: Any) -> None:
        self.n_workers, self.backend = n_workers, backend
        self._lock = threading.Lock()
        self._tasks: collections.deque = collections.deque()
        self._routes: dict[int, queue.SimpleQueue] = {}
        self._tokens = itertools.count()
        self._pump: threading.Thread | None = None
        self._parallel: Any = None  # the joblib call of the newest generator
        self._generation = 0  # of the joblib generator now fed; older ones only finish
        self._feeding = self._closed = self._warned = False
        self._last_task = time.monotonic()
        _POOLS.add(self)

    def open(self, results: queue.SimpleQueue) -> int:
        with self._lock:
            token = next(self._tokens)
            self._routes[token] = results
            return token

    def close_run(self, token: int) -> None:
        with self._lock:
            self._routes.pop(token, None)

    def submit(self, token: int, task: tuple) -> None:
        with self._lock:
            self._tasks.append((token, task))
            self._last_task = time.monotonic()
            if not self._feeding and not self._closed:
                self._feeding = True
                self._generation += 1
                self._pump = threading.Thread(target=self._pump_results, name="fpipe-joblib",
                                              args=(self._generation,), daemon=True)
                self._pump.start()

    def _pump_results(self, generation: int) -> None:
        from joblib import Parallel, delayed, parallel_config

        n_jobs = _join_loky(self.n_workers) if self._shares_loky() else self.n_workers
        try:
            # parallel_config, not Parallel(backend=), registers external backends like dask;
            # pre_dispatch: at most n_workers tasks of this stage run at once, whatever n_jobs
            with parallel_config(backend=self.backend, n_jobs=n_jobs):
                parallel = Parallel(batch_size=1, return_as="generator_unordered",
                                    pre_dispatch=self.n_workers if self.n_workers > 0 else "n_jobs")
                results = parallel(self._feed(delayed, generation))
                self._parallel = parallel
                _set_exit_hook()  # now that loky has set its own (see there)
                for result in results:
                    if result is not None:
                        self._route(result)
        except BaseException as error:
            self._fail(capture(error), generation)
        finally:
            if self._shares_loky():
                _leave_loky()

    def _shares_loky(self) -> bool:
        return self.backend == "loky" and self.n_workers != 1  # joblib runs 1 job in-process

    def _feed(self, delayed: Callable, generation: int) -> Iterator:
        idle = _IDLE_SECONDS[0]
        while True:
            task = self._next_task(generation)
            if task is _STOP:
                return
            if task is None:
                yield delayed(_idle)(idle)
                idle = min(2 * idle, _IDLE_SECONDS[1])
            else:
                idle = _IDLE_SECONDS[0]
                yield delayed(_run_task)(*task)

    def _next_task(self, generation: int) -> Any:
        # called by joblib in its own threads, holding its lock: it must never block
        with self._lock:
            if generation != self._generation:
                return _STOP
            while self._tasks:
                token, task = self._tasks.popleft()
                if token in self._routes:
                    return task
            if self._closed or time.monotonic() - self._last_task > _KEEP_ALIVE:
                self._feeding = False
                return _STOP
            return None

    def _route(self, result: tuple) -> None:
        token, *entry, fallback = result
        if fallback is not None and not self._warned:
            self._warned = True
            warnings.warn(f"processes(): no room in shared memory ({_FALLBACKS[fallback]}): "
                          "results go through the pipe until there is", RuntimeWarning,
                          stacklevel=1)
        with self._lock:
            results = self._routes.get(token)
        if results is not None:
            results.put(tuple(entry))

    def _fail(self, error: CapturedError, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._feeding = False
            routes = list(self._routes.values())
        sweep(os.getpid())  # the names that a worker killed on its way made
        for results in routes:
            results.put((None, [], error, 0.0, 0))

    def release(self) -> None:
        """End the joblib generator as soon as no task is waiting, and wait for it."""
        with self._lock:
            self._last_task = -_KEEP_ALIVE
            pump = self._pump
        if pump is not None and pump is not threading.current_thread():
            pump.join(_JOIN_SECONDS)

    def shutdown(self) -> None:
        """Feed no more tasks: the joblib generator ends when its running tasks are done."""
        # no lock: this is also a finalizer, which the garbage collector may run in a thread
        # that holds it; one attribute store is atomic, and the readers hold the lock
        self._closed = True

    def wait(self, deadline: float) -> None:
        """Wait for the joblib generator to end; past ``deadline``, stop it and its workers."""
        pump, parallel = self._pump, self._parallel
        if pump is None or pump is threading.current_thread():
            return
        pump.join(max(0.0, deadline - time.monotonic()))
        if pump.is_alive() and parallel is not None:
            # joblib has no public way to stop a running call: this is what it does itself
            # when a task fails, and with loky it kills the workers
            parallel._abort()
            pump.join(_EXIT_SECONDS)


def _shutdown_pools() -> None:
    # at exit: stop every pool, give running tasks a moment, then kill what still runs
    pools = list(_POOLS)
    for pool in pools:
        pool.shutdown()
    deadline = time.monotonic() + _EXIT_SECONDS
    for pool in pools:
        pool.wait(deadline)


def _set_exit_hook() -> None:
    # threading's exit hooks run in reverse order of registration, before atexit's. loky sets
    # its hook when it starts an executor; ours is set again whenever another hook came after
    # it, so that it runs first and ends our joblib generators while loky's executor works.
    with _exit_hook:
        hooks = getattr(threading, "_threading_atexits", [])
        if not hooks or getattr(hooks[-1], "func", None) is not _shutdown_pools:
            threading._register_atexit(_shutdown_pools)


class _ProcessWorkers:
    """The executor of one run of :func:`processes`: its tasks go to the stage's pool."""

    def __init__(self, pool: _ProcessPool, call: _ItemCall,
                 transport: Transport | None) -> None:
        self._pool, self._call, self._token = pool, call, None
        self._transport = transport

    def begin(self, results: queue.SimpleQueue) -> None:
        self._token = self._pool.open(results)

    def submit(self, seq: int, index: int, chunk: list, slots: int) -> None:
        self._pool.submit(self._token, (self._call, self._token, seq, index, chunk, slots,
                                        os.getpid(), self._transport))

    def stop(self) -> None:
        if self._token is not None:
            self._pool.close_run(self._token)

    def join(self, deadline: float) -> None:
        pass


class _ProcessStage(_ParallelStage):
    # two chunks per worker: joblib hands a worker its next task only when one completes, so
    # the next chunk must already be waiting then
    kind, chunk_seconds, per_worker = "processes", _PROCESS_CHUNK_SECONDS, 2

    def __init__(self, *args: Any, backend: Any, shared_memory: bool,
                 shared_memory_budget: int | None) -> None:
        super().__init__(*args)
        if not isinstance(backend, str) and not hasattr(backend, "apply_async"):
            raise TypeError(f"backend must be a joblib backend name or instance; "
                            f"got backend={backend!r}")
        if not isinstance(shared_memory, bool):
            raise TypeError(f"shared_memory must be True or False; "
                            f"got shared_memory={shared_memory!r}")
        if shared_memory_budget is not None:
            check_integer("shared_memory_budget", shared_memory_budget, 0)
        self.backend, self.shared_memory = backend, shared_memory
        self.shared_memory_budget = shared_memory_budget
        self._pool = _ProcessPool(self.n_workers, backend)
        # a stage that nobody can use again ends its joblib generator now, not a second after
        # its last task: forgotten stages' generators would keep feeding idle tasks to the
        # workers that every stage shares, and slow the stages that follow
        weakref.finalize(self, self._pool.shutdown)

    def _executor(self, call: _ItemCall) -> _ProcessWorkers:
        return _ProcessWorkers(self._pool, call, self._transport())

    def _transport(self) -> Transport | None:
        if (not self.shared_memory or self.backend not in _SHARED_BACKENDS
                or not shared_memory_available()):
            return None
        return Transport.for_consumer(self.workers, budget=self.shared_memory_budget)

    def close(self) -> None:
        """End the joblib generator now, not a second after the last task (say, before a
        dask cluster is closed). The stage starts a new one when it is used again."""
        self._pool.release()

    def _options(self) -> dict:
        backend = None if self.backend == "loky" else self.backend
        return {**super()._options(), "backend": backend,
                "shared_memory": None if self.shared_memory else False,
                "shared_memory_budget": self.shared_memory_budget}


def processes(func: Callable, *args: Any, n_workers: int = 1, backend: Any = "loky",
              ordered: bool = True, seed: Seed | None = None, buffer_size: int = 2,
              chunk_size: int = 256, shared_memory: bool = True,
              shared_memory_budget: int | None = None, **kwargs: Any) -> Stage:
    """The stage that computes ``func(item, *args, **kwargs)`` in ``n_workers`` worker
    processes (-1: one per core), on joblib. Use it for pure-Python work that holds the GIL.

    ``backend`` is passed to joblib: ``"loky"`` (the default), ``"threading"``, ``"dask"``
    (with a ``dask.distributed`` client), or any registered joblib backend. Functions travel
    with cloudpickle, so lambdas work. Items travel in chunks of at most ``chunk_size`` (about
    20 ms of work each); at most ``2 * n_workers + buffer_size`` chunks are in the stage at
    once (two per worker: one in work, one waiting, as joblib sends a worker its next task only
    when one completes).

    The workers are started at the first ``next()`` and kept for every later run of this stage
    object (epochs, other pipelines): the stage keeps one joblib generator running while it has
    work, and ends it about a second after its last task (the workers stay in joblib's pool),
    or as soon as the stage object is garbage-collected. Closing a stream does not kill the
    workers: results still on their way are dropped. ``stage.close()`` ends the joblib
    generator at once (before closing a dask cluster, say); the stage starts a new one if it is
    used again.

    Results come back in shared memory where that pays: on the ``loky`` and
    ``multiprocessing`` backends (whose workers run on this machine, on Linux), the numpy arrays
    of at least 16 KiB in a result (also inside tuples, lists, dicts and named tuples, and torch
    tensors once :mod:`fpipe.torch` is imported) are written once into a reused segment of
    ``/dev/shm``, and the consumer gets arrays that view it, without a copy. A segment is reused
    once every array of its chunk of results is garbage-collected. Each worker holds at most
    ``shared_memory_budget`` bytes of segments (default: a quarter of ``/dev/shm`` shared
    between the workers); past it, or when ``/dev/shm`` is full, results go through the pipe
    with one ``RuntimeWarning``. ``shared_memory=False`` sends everything through the pipe, as
    do the other backends (``dask``'s workers may be on other machines).

    Order, seeds and errors behave as in :func:`threads`.

    >>> with processes(abs, n_workers=2, backend="threading")(range(-2, 3)) as stream:
    ...     list(stream)
    [2, 1, 0, 1, 2]
    """
    return _ProcessStage(func, args, kwargs, n_workers, buffer_size, ordered, seed, chunk_size,
                         backend=backend, shared_memory=shared_memory,
                         shared_memory_budget=shared_memory_budget)


# --- stats ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageStats:
    """One stage of :class:`Stats`: the items it delivered, and the shares of its time spent
    working, waiting for its upstream, and waiting for room downstream (for the consumer to
    ask). For :func:`threads` and :func:`processes`: the workers' share of busy time, the
    share of time their feeder spent reading the upstream, and the rest.

    >>> StageStats("map(f)", 10, 100.0, 0.5, 0.25, 0.25).busy
    0.5
    """

    name: str
    items: int
    items_per_second: float
    busy: float
    waiting_input: float
    waiting_output: float


class Stats(tuple):
    """Per-stage figures of a pipeline, source first; ``str()`` gives a table and
    :attr:`bottleneck` names the busiest stage (or the consumer).

    >>> Stats([StageStats("load", 5, 10.0, 0.9, 0.0, 0.1)]).bottleneck
    'load'
    """

    @property
    def bottleneck(self) -> str:
        """The busiest stage, or ``"the consumer"`` when the last stage mostly waits for it."""
        if not self:
            return "nothing"
        busiest = max(self, key=lambda row: row.busy)
        if self[-1].waiting_output > busiest.busy:
            return "the consumer"
        return busiest.name

    def __str__(self) -> str:
        width = max([len(row.name) for row in self] + [5])
        lines = [f"{'stage':<{width}}  {'items':>9}  {'items/s':>9}  {'busy':>5}  "
                 f"{'wait in':>7}  {'wait out':>8}"]
        for row in self:
            lines.append(f"{row.name:<{width}}  {row.items:>9}  {row.items_per_second:>9.3g}  "
                         f"{row.busy:>5.0%}  {row.waiting_input:>7.0%}  "
                         f"{row.waiting_output:>8.0%}")
        lines.append(f"bottleneck: {self.bottleneck}")
        return "\n".join(lines)


def stats(stream: Stream) -> Stats:
    """Where a pipeline's time goes, per stage, from the source to ``stream``.

    Counts are exact; times are sampled (one pull in 16), which keeps the cost of measuring
    under 5 % even for stages that do almost nothing.

    >>> from toolz import pipe
    >>> stream = pipe(range(100), map(abs), take(10))
    >>> _ = list(stream)
    >>> report = stats(stream)
    >>> [row.items for row in report], report[1].name
    ([10, 10, 10], 'map(abs)')
    >>> print(stats(stream))  # doctest: +SKIP
    stage              items    items/s   busy  wait in  wait out
    source(range)         10    1.2e+05     3%       0%       97%
    ...
    """
    chain = []
    while stream is not None:
        chain.append(stream)
        stream = stream.upstream
    now = time.perf_counter()
    return Stats(_row(s, now) for s in reversed(chain))


def _row(stream: Stream, now: float) -> StageStats:
    meter = stream._meter
    wall = now - meter.started if meter.started is not None else 0.0
    if wall <= 0:
        return StageStats(stream.name, meter.items, 0.0, 0.0, 0.0, 0.0)
    busy, waiting_input, waiting_output = (min(share, 1.0) for share in stream._shares(wall))
    return StageStats(stream.name, meter.items, meter.items / wall, busy, waiting_input,
                      waiting_output)
