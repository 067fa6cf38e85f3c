"""The background stages: :func:`prefetch` reads ahead in a thread, :func:`threads` and
:func:`processes` compute a function in worker threads or processes. Each application is a
*run*: a feeder thread reads the upstream in chunks (sized by the work they take) into the
room the stage has, an executor works on them, and the stream delivers the results in input
order (or as they complete). The run's machinery is the private ``_background``; this module
holds the stages, their checks and their executors.

The stages take their function alone (give it its arguments with ``functools.partial``) and
their options as keywords; the rarely changed ones (chunk size, budgets, shared memory) come
together in a :class:`ParallelOptions`.

>>> from toolz import pipe
>>> with pipe(range(-3, 4), prefetch(4), threads(abs, n_workers=2)) as stream:
...     list(stream)
[3, 2, 1, 0, 1, 2, 3]
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from fpipe.errors import (
    check_auto,
    check_bool,
    check_callable,
    check_integer,
    check_positive,
    check_workers,
)
from fpipe.functional import call_repr
from fpipe.random import Seed, optional_entropy
from fpipe.skipping import OnError, SkipLog, check_max_errors, check_on_error
from fpipe.stream.core import Stage, Stream, as_stream
from fpipe.stream.parallel._background import Background, Inline, Run, Sizer
from fpipe.stream.parallel._joblib import ShippedCall, ShippedItems, process_pool
from fpipe.stream.parallel._messages import Message
from fpipe.stream.parallel._shm import Transport, end_run
from fpipe.stream.parallel._shm import available as shared_memory_available
from fpipe.stream.parallel._tuner import MOST_THREADS, Limits, Tuner, default_cpu_budget, measured
from fpipe.stream.parallel.planner import plan_parallel
from fpipe.stream.simple import (
    ItemCall,
    at_epoch,
    check_call,
    error_options,
    shown_name,
    stage_repr,
)

__all__ = ["ParallelOptions", "prefetch", "processes", "threads"]

_THREAD_CHUNK_SECONDS = 2e-3  # work per chunk handed to a thread ...
_PROCESS_CHUNK_SECONDS = 2e-2  # ... or to a process, where a round trip costs about 0.3 ms
_LEAST_MEMORY = 1 << 20  # bytes: a smaller budget is a mistake (a unit missed, say)


@dataclasses.dataclass(frozen=True)
class ParallelOptions:
    """The rarely changed options of :func:`threads` and :func:`processes`, as one value
    (``options=``); each is checked when the value is made, and a misspelled one is a
    ``TypeError`` that names it.

    - ``chunk_size``: the most items in one chunk (None: 64 for threads, 256 for processes);
    - ``cpu_budget``: the cores that ``n_workers="auto"`` may use (default: those this process
      may use); it bounds nothing else, so it goes with ``"auto"`` alone;
    - ``memory_budget``: the bytes the stage may hold, its chunks in work and those waiting;
    - ``shared_memory``: whether the results of processes come back in shared memory;
    - ``shared_memory_budget``: the bytes of shared memory each worker process may hold.

    The last two are of :func:`processes` alone.

    >>> options = ParallelOptions(chunk_size=8, memory_budget=2**30)
    >>> options
    ParallelOptions(chunk_size=8, memory_budget=1 GiB)
    >>> with threads(abs, n_workers=2, options=options)(range(-2, 3)) as stream:
    ...     list(stream)
    [2, 1, 0, 1, 2]
    """

    chunk_size: int | None = None
    cpu_budget: float | None = None
    memory_budget: int | None = None
    shared_memory: bool = True
    shared_memory_budget: int | None = None

    def __post_init__(self) -> None:
        checks = {"chunk_size": lambda value: check_integer("chunk_size", value, 1),
                  "cpu_budget": lambda value: check_positive("cpu_budget", value),
                  "memory_budget": lambda value: check_integer("memory_budget", value,
                                                               _LEAST_MEMORY),
                  "shared_memory_budget": lambda value: check_integer("shared_memory_budget",
                                                                      value, 0)}
        for name, check in checks.items():
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check(value))
        check_bool("shared_memory", self.shared_memory)

    def changed(self) -> dict:
        """The options that differ from their defaults, by name.

        >>> ParallelOptions(shared_memory=False).changed()
        {'shared_memory': False}
        """
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if getattr(self, field.name) != field.default}

    def __repr__(self) -> str:
        return call_repr("ParallelOptions", (), self.changed())


def _checked_options(options: Any, kind: str) -> ParallelOptions:
    if options is None:
        return ParallelOptions()
    if not isinstance(options, ParallelOptions):
        raise TypeError(f"options must be a ParallelOptions; got options={options!r:.80}")
    if kind == "threads":
        process_only = {"shared_memory", "shared_memory_budget"} & options.changed().keys()
        if process_only:
            raise TypeError(f"{', '.join(sorted(process_only))} of ParallelOptions are options "
                            f"of processes: threads share this process's memory already; "
                            f"got options={options!r}")
    return options


# the keywords that threads() and processes() took once, and what replaces them
_MOVED = {"buffer_size": "buffer_chunks={value!r} (the same count, in chunks)",
          **{name: f"options=ParallelOptions({name}={{value!r}})"
             for name in ("chunk_size", "cpu_budget", "memory_budget", "shared_memory",
                          "shared_memory_budget")}}


def _function_alone(stage_function: Callable) -> Callable:
    """``stage_function`` (:func:`threads` or :func:`processes`), whose ``TypeError`` for an
    argument it does not take says what to pass instead: the function's own arguments go in
    with ``functools.partial``, and the options that moved have their new place."""
    name = stage_function.__name__
    options = [option for option in inspect.signature(stage_function).parameters
               if option != "func"]

    @functools.wraps(stage_function)
    def checked(*args: Any, **kwargs: Any) -> Stage:
        if len(args) > 1:
            raise TypeError(_positional_message(name, args))
        for key, value in kwargs.items():
            if key in _MOVED:
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r}: pass "
                                f"{_MOVED[key].format(value=value)}")
            if key not in options and key != "func":
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r}: its "
                                f"options are {', '.join(options)}; the function's own "
                                f"keywords go in with functools.partial(func, {key}=...)")
        return stage_function(*args, **kwargs)
    return checked


def _positional_message(name: str, args: tuple) -> str:
    func, rest = args[0], args[1:]
    func_text = shown_name(func) if callable(func) else repr(func)
    hint = ""
    if isinstance(rest[0], int) and not isinstance(rest[0], bool):
        hint = f", or did you mean {name}({func_text}, n_workers={rest[0]})?"
    given = ", ".join(repr(arg) for arg in rest)
    return (f"{call_repr(name, args, {})}: {name} takes the function alone: give it its "
            f"arguments with functools.partial({func_text}, {given}){hint}")


class _PrefetchStage(Stage):
    def __init__(self, n: int) -> None:
        self.n = check_integer("n", n, 1)
        self._sizer = Sizer(_THREAD_CHUNK_SECONDS, self.n)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        def make_run(upstream: Stream) -> Run:
            return Run(upstream, Inline(), self.n, True, self._sizer, start)
        return Background(as_stream(iterable), repr(self), make_run, True, 0)

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
    default_chunk_size = 64
    one_to_one = True

    def __init__(self, func: Callable, args: tuple, kwargs: dict, *, n_workers: int | str = 1,
                 buffer_chunks: int | str = 2, ordered: bool = True, seed: Seed | None = None,
                 on_error: OnError = "raise", max_errors: int | None = None,
                 options: ParallelOptions | None = None) -> None:
        self.func, self.args, self.kwargs = check_callable("func", func), args, kwargs
        check_call(self.kind, func, args, kwargs, workers=True)
        self.ordered = check_bool("ordered", ordered)
        self.n_workers = check_auto("n_workers", n_workers, check_workers)
        self.buffer_chunks = check_auto("buffer_chunks", buffer_chunks,
                                        lambda size: check_integer("buffer_chunks", size, 1))
        self.options = _checked_options(options, self.kind)
        self.cpu_budget, self.memory_budget = _checked_budgets(self.n_workers, self.options)
        self.workers = self._most_workers()
        self.chunk_size = self.options.chunk_size or self.default_chunk_size
        self.seed = optional_entropy(seed)
        self.on_error, self.max_errors = check_on_error(on_error), check_max_errors(max_errors)
        self._sizer = Sizer(self.chunk_seconds, self.chunk_size,
                             self.measure_first or self.memory_budget is not None)
        self._group_sizers: dict[int, Sizer] = {}  # of fused runs, by batch size
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

        def make_run(upstream: Stream) -> Run:
            latest = self._latest
            tuner = self._latest = Tuner(self._limits(), None if latest is None else latest.setting)
            setting = tuner.setting
            sizer.limit(setting.chunk)
            return Run(upstream, self._executor(call, setting.workers), setting.slots, False,
                        sizer, start, tuner)
        stream = Background(upstream, name, make_run, self.ordered, self.workers)
        if self.on_error != "raise":
            stream.skips = SkipLog(self.max_errors)
        return stream

    def _group_sizer(self, size: int) -> Sizer:
        sizer = self._group_sizers.get(size)
        if sizer is None:
            sizer = self._group_sizers[size] = Sizer(self.chunk_seconds,
                                                      max(1, self.chunk_size // size), True)
        return sizer

    def _limits(self) -> Limits:
        auto = self.n_workers == "auto"
        return Limits(workers=None if auto else self.workers,
                      buffer=None if self.buffer_chunks == "auto" else self.buffer_chunks,
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
                "buffer_chunks": self.buffer_chunks if self.buffer_chunks == "auto" else None,
                "ordered": None if self.ordered else False, "seed": self.seed,
                **error_options(self), "options": self.options if self.options.changed() else None}

    def __repr__(self) -> str:
        return stage_repr(self.kind, self.func, self.args, {**self._options(), **self.kwargs})


def _checked_budgets(n_workers: int | str,
                     options: ParallelOptions) -> tuple[float | None, int | None]:
    """The budgets of ``options``, cores and bytes, once they fit ``n_workers``: a core budget
    bounds ``n_workers="auto"`` and nothing else; a byte budget bounds any stage."""
    if options.cpu_budget is not None and n_workers != "auto":
        raise ValueError(f"cpu_budget bounds the workers that n_workers='auto' chooses; "
                         f"with n_workers={n_workers!r} it has nothing to bound: pass one "
                         f"of the two; got options={options!r}")
    return options.cpu_budget, options.memory_budget


class _ThreadStage(_ParallelStage):
    kind, chunk_seconds = "threads", _THREAD_CHUNK_SECONDS

    def _executor(self, call: Any, workers: int) -> _ThreadWorkers:
        return _ThreadWorkers(call, workers)


@_function_alone
def threads(func: Callable, *, n_workers: int | str = 1, buffer_chunks: int | str = 2,
            ordered: bool = True, seed: Seed | None = None, epoch: int = 0,
            on_error: OnError = "raise", max_errors: int | None = None,
            options: ParallelOptions | None = None) -> Stage:
    """The stage that computes ``func(item)`` in ``n_workers`` threads (-1: one per core). Use
    it for work that releases the GIL (numpy, IO, decoding).

    ``n_workers="auto"`` lets the stage choose, while it runs, as many threads as keep up with
    its consumer, within ``options.cpu_budget`` cores (default: those this process may use)
    and at most 64: work that waits for IO takes a fraction of a core per thread, so it gets
    more. ``buffer_chunks="auto"`` grows the buffer while the consumer waits and the threads
    wait for room. ``options.memory_budget`` (bytes) bounds what the stage holds, its chunks in
    work and those waiting, with any setting. The docs' Tuning page says more;
    :func:`fpipe.explain` shows the choices.

    Items travel to the threads in chunks of at most ``options.chunk_size`` (64 by default;
    fewer while items are slow, so the first results come quickly). At most
    ``n_workers + buffer_chunks`` chunks are in the stage at once, so it reads at most that
    many chunks ahead of its consumer. Results keep the input order unless ``ordered=False``.
    With ``seed``, each item's generator (from ``(seed, epoch, index)``) is active while
    ``func`` runs, so the output does not depend on ``n_workers`` or on the order of
    completion; ``epoch`` is the epoch of the first application, as in
    :func:`fpipe.stream.map`.

    An exception in ``func`` reaches the consumer with its type, message and the worker's
    traceback, after the results of the items before it. With ``on_error="skip"`` (or a
    callable, which runs in the worker), the items on which ``func`` raises are left out,
    counted and recorded for :func:`fpipe.stats`; ``max_errors`` bounds how many may fail
    (see :mod:`fpipe.skipping`). Closing the stream stops and joins the threads.

    The stage takes ``func`` alone: give it its arguments with ``functools.partial``
    (``threads(partial(load, root=path), n_workers=4)``). Any other keyword is a
    ``TypeError`` that names it, before any thread starts.

    >>> with threads(abs, n_workers=2)(range(-3, 4)) as stream:
    ...     list(stream)
    [3, 2, 1, 0, 1, 2, 3]
    """
    return thread_stage(func, (), {}, n_workers=n_workers, buffer_chunks=buffer_chunks,
                        ordered=ordered, seed=seed, epoch=epoch, on_error=on_error,
                        max_errors=max_errors, options=options)


def thread_stage(func: Callable, args: tuple, kwargs: dict, *, epoch: int = 0,
                 **options: Any) -> Stage:
    """:func:`threads` of ``func(item, *args, **kwargs)``: for dpipe's ``Threads`` and
    ``Iterator``, which pass their arguments on to the function (not in ``__all__``)."""
    return at_epoch(_ThreadStage(func, args, kwargs, **options), epoch)


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
            self._pool.submit(self._token, (self._call, self._token, seq, index,
                                            ShippedItems(chunk), slots, os.getpid(),
                                            self._transport))
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

    default_chunk_size = 256

    def __init__(self, *args: Any, backend: Any = "loky", **options: Any) -> None:
        super().__init__(*args, **options)
        self.backend = _check_backend(backend)
        self.shared_memory = self.options.shared_memory
        self.shared_memory_budget = self.options.shared_memory_budget
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
        n_workers, *rest = super()._options().items()
        return dict([n_workers, ("backend", None if self.backend == "loky" else self.backend),
                     *rest])


@_function_alone
def processes(func: Callable, *, n_workers: int | str = 1, backend: Any = "loky",
              buffer_chunks: int | str = 2, ordered: bool = True, seed: Seed | None = None,
              epoch: int = 0, on_error: OnError = "raise", max_errors: int | None = None,
              options: ParallelOptions | None = None) -> Stage:
    """The stage that computes ``func(item)`` in ``n_workers`` worker
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
    memory-maps them into files that go once the run is over and no worker keeps it. Items
    are pickled by fpipe (their arrays' bytes beside the pickle, copied once into the pipe),
    not memory-mapped, so a stream of large items leaves nothing behind in ``/dev/shm``, and
    every item array a worker gets is writable if it was writable here. Results are pickled
    in the worker: one that does not pickle ends the
    stream with a ``TypeError`` naming its item, after the items before it. Items travel
    in chunks of at most ``options.chunk_size`` (256 by default; about 20 ms of work
    each); at most ``2 * n_workers + buffer_chunks`` chunks are in the stage at once (two per worker: one in
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
    ``options.shared_memory_budget`` bytes of segments (default: a quarter of ``/dev/shm`` shared
    between the workers, at most 256 MiB each, as loky restarts a worker whose memory grew by
    300 MB); past it, or when ``/dev/shm`` is full, results go through the pipe with one
    ``RuntimeWarning``. ``options=ParallelOptions(shared_memory=False)`` sends everything
    through the pipe, as do the other backends (``dask``'s workers may be on other machines).

    Inside a worker, :func:`fpipe.combine_to_arrays` stacks a batch straight into a slab, so a
    batch made in the workers crosses without any copy. Workers of this machine's pool keep
    the memory they free for their next task (glibc's ``mallopt``: arrays up to 32 MiB come
    from the heap, which gives memory back past 64 MiB free), as page-faulting every new batch
    in anew costs image pipelines a quarter of their time on virtual machines.

    Order, seeds, ``epoch``, errors, ``on_error`` and ``func``'s arguments (through
    ``functools.partial``) behave as in :func:`threads` (a callable ``on_error`` runs in the
    worker process, so it must pickle). So do ``n_workers="auto"``, ``buffer_chunks="auto"``
    and the budgets of :class:`ParallelOptions`, but ``"auto"`` chooses at
    most one process per core of ``cpu_budget`` (the pool has that many; the stage runs as
    many chunks at once as it chose), and with ``memory_budget`` each worker's shared memory is
    its share of the budget.

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
    return process_stage(func, (), {}, n_workers=n_workers, backend=backend,
                         buffer_chunks=buffer_chunks, ordered=ordered, seed=seed, epoch=epoch,
                         on_error=on_error, max_errors=max_errors, options=options)


def process_stage(func: Callable, args: tuple, kwargs: dict, *, epoch: int = 0,
                  **options: Any) -> Stage:
    """:func:`processes` of ``func(item, *args, **kwargs)``: for dpipe's ``Loky``, which
    passes its arguments on to the function (not in ``__all__``)."""
    return at_epoch(_ProcessStage(func, args, kwargs, **options), epoch)
