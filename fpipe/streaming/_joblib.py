"""The one module that touches joblib (imported when a process stage first runs) and the
private APIs its shutdown needs: joblib's ``Parallel._abort`` and threading's
``_register_atexit``. It keeps one joblib generator per process stage, the size of joblib's
shared loky pool, and the exit hook that ends the generators before loky's executor stops.
Worker processes send large arrays back through :mod:`._shm` (shared memory), and watch that
their consumer is alive.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CapturedError, capture
from ._core import JOIN_SECONDS
from ._messages import Message
from ._shm import Transport, encode, sweep, watch_owner
from .simple import ItemCall

_IDLE_SECONDS = (1e-3, 2e-2)  # an idle task sleeps this long, doubling up to the maximum
_KEEP_ALIVE = 1.0  # the joblib generator ends after this long without a task
_EXIT_SECONDS = 1.0  # at exit, running tasks get this long before their workers are killed
_STOP = object()
_POOLS: weakref.WeakSet = weakref.WeakSet()
_exit_hook = threading.Lock()


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


_FALLBACKS = {"budget": "each worker's shared_memory_budget is used",
              "full": "/dev/shm is full"}


def _run_task(call: ItemCall, token: int, seq: int, index: int, chunk: list, slots: int,
              owner: int, transport: Transport | None) -> tuple:
    watch_owner(owner)  # a worker whose consumer is killed exits, not idles for minutes
    outputs, error, seconds = call.run(chunk, index)
    fallback = None
    if transport is not None:
        outputs, fallback = encode(transport, outputs)
    return token, seq, outputs, error, seconds, slots, fallback


def _idle(seconds: float) -> None:
    time.sleep(seconds)


class ProcessPool:
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
            results.put(Message(*entry))

    def _fail(self, error: CapturedError, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._feeding = False
            routes = list(self._routes.values())
        sweep(os.getpid())  # the names that a worker killed on its way made
        for results in routes:
            results.put(Message.failure(error))

    def release(self) -> None:
        """End the joblib generator as soon as no task is waiting, and wait for it."""
        with self._lock:
            self._last_task = -_KEEP_ALIVE
            pump = self._pump
        if pump is not None and pump is not threading.current_thread():
            pump.join(JOIN_SECONDS)

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
