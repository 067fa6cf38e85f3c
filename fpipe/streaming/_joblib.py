"""The one module that touches joblib (imported when a process stage first runs), with the
private APIs it needs: ``Parallel._initialize_backend`` and ``Parallel._backend._workers``
(joblib's own configuration of its shared loky executor), ``Parallel._abort`` and threading's
``_register_atexit`` (for the shutdown). On loky (the default backend) a process stage sends
its tasks straight to that executor; on any other backend it keeps one joblib generator per
stage. It also keeps the size of the loky pool, and the exit hook that ends the stages' work
before loky's executor stops. A run's function reaches each worker once
(:class:`ShippedCall`). Worker processes send large arrays back through :mod:`._shm`
(shared memory), keep the memory they free for their next task, and watch that their
consumer is alive.
"""

from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import functools
import itertools
import os
import queue
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import CapturedError, capture
from ._core import JOIN_SECONDS
from ._messages import Message
from ._shm import Transport, encode, lending, sweep, watch_owner
from .simple import ItemCall

_IDLE_SECONDS = (1e-3, 2e-2)  # an idle task sleeps this long, doubling up to the maximum
_KEEP_ALIVE = 1.0  # the joblib generator ends after this long without a task
_EXIT_SECONDS = 1.0  # at exit, running tasks get this long before their workers are killed
_STOP = object()
_POOLS: weakref.WeakSet = weakref.WeakSet()
_exit_hook = threading.Lock()


_loky: dict[str, Any] = {"executor": None, "size": 0, "running": 0}
_loky_lock = threading.Lock()
_exiting = False


def _loky_submit(n_workers: int, task: tuple) -> tuple[concurrent.futures.Future, Any]:
    """Submit ``task`` to joblib's loky executor. Its size follows the stage while no stage
    has a task running there; then a stage that starts adopts the size it has, because a
    resize waits for every running task. No lock is held while loky works: its thread runs
    the futures' callbacks, which take the lock."""
    for renew in (False, True):
        executor = _reserve_executor(n_workers, renew)
        try:
            future = executor.submit(_run_task, *task)
            break
        except BaseException as error:
            _task_ended()
            # shut down, or broken by a killed worker: joblib makes another, once
            if renew or _exiting or not isinstance(error, RuntimeError):
                raise
    _set_exit_hook()  # loky sets its own at the first submit (see there)
    future.add_done_callback(_task_ended)
    return future, executor


def _reserve_executor(n_workers: int, renew: bool) -> Any:
    """The executor to submit to, counted as running one more task."""
    with _loky_lock:
        executor = _loky["executor"]
        size = _loky["size"] if _loky["running"] else n_workers
        if not renew and executor is not None and size == _loky["size"]:
            _loky["running"] += 1
            return executor
    executor = _loky_executor(size)  # joblib's own lock keeps it one executor
    with _loky_lock:
        _loky["executor"], _loky["size"] = executor, size
        _loky["running"] += 1
    return executor


def _task_ended(_future: concurrent.futures.Future | None = None) -> None:
    """One task fewer runs on the executor (a future's callback, or a submit that failed)."""
    with _loky_lock:
        _loky["running"] -= 1


def _loky_executor(n_workers: int) -> Any:
    """joblib's shared loky executor, sized and configured as a ``Parallel(n_jobs=n_workers)``
    call would (thread limits for BLAS in the workers, large arguments memory-mapped), so
    stages and the user's own ``Parallel`` calls keep the same workers."""
    from joblib import Parallel, parallel_config

    with parallel_config(backend="loky", n_jobs=n_workers):
        parallel = Parallel()
    parallel._initialize_backend()  # joblib's own configuration of the executor
    return parallel._backend._workers


class ShippedCall:
    """A run's call as its tasks carry it: pickled once in the consumer (at the first task),
    its bytes sent with every task, unpickled once in each worker, which keeps it for the run's
    later tasks. A function that holds a reader, a table or a model is then rebuilt once per
    worker and run, not once per chunk; like a DataLoader's dataset in its workers, it keeps
    its state between chunks. A call that pickles to more than 1 MiB goes with every task
    through loky's own pickler instead, as joblib memory-maps the large arrays in it; the
    worker still keeps its first copy."""

    __slots__ = ("call", "key", "_sent")

    def __init__(self, call: ItemCall) -> None:
        # random, not a count: a dask worker may serve clients on other machines
        self.call, self.key, self._sent = call, secrets.token_bytes(16), None

    def __reduce__(self):
        if self._sent is None:  # in loky's (one) feeder thread: at worst pickled twice
            import cloudpickle

            pickled = cloudpickle.dumps(self.call)
            self._sent = ((self.key, pickled) if len(pickled) <= _SHIPPED_BYTES
                          else (self.key, None, self.call))
        return _unshipped, self._sent


_SHIPPED_BYTES = 1 << 20  # joblib memory-maps arrays from 1 MB: larger calls go its way
_KEPT_CALLS = 4  # runs whose calls a worker keeps (stages running at once, epochs in turn)
_calls: collections.OrderedDict = collections.OrderedDict()


def _unshipped(key: bytes, pickled: bytes | None, call: ItemCall | None = None) -> ItemCall:
    """In a worker: the call that ``key`` names, kept from its first task (unpickled from
    ``pickled`` then, or ``call`` as loky's pickler sent it)."""
    kept = _calls.get(key)
    if kept is None:
        if call is None:
            import pickle

            call = pickle.loads(pickled)
        kept = _calls[key] = call
        while len(_calls) > _KEPT_CALLS:
            _calls.popitem(last=False)
    _calls.move_to_end(key)
    return kept


_FALLBACKS = {"budget": "each worker's shared_memory_budget is used",
              "full": "/dev/shm is full"}


def _run_task(call: ItemCall | ShippedCall, token: int, seq: int, index: int, chunk: list,
              slots: int, owner: int, transport: Transport | None) -> tuple:
    if isinstance(call, ShippedCall):  # a backend that runs tasks in this process
        call = call.call
    watch_owner(owner)  # a worker whose consumer is killed exits, not idles for minutes
    if not _kept and os.getppid() == owner:  # a worker of this machine's pool, not dask's
        _keep_freed_memory()
    fallback = None
    with lending(transport):  # fpipe's combiners make large arrays in shared memory at once
        outputs, error, seconds = call.run(chunk, index)
        if transport is not None:
            outputs, fallback = encode(transport, outputs)
    return token, seq, outputs, error, seconds, slots, fallback


_MALLOPT = {-1: 64 << 20, -2: 16 << 20, -3: 32 << 20}  # glibc's trim, top pad, mmap threshold
_kept: list[bool] = []


def _keep_freed_memory() -> None:
    """In a worker process, once: keep the memory that Python frees for reuse (glibc's
    malloc), instead of handing it back to the system at once. A worker makes and drops the
    same large arrays task after task; handed back, every one is page-faulted in anew, which
    cost an image pipeline a quarter of its time on a virtual machine. Arrays up to 32 MiB
    then come from the heap, which gives memory back once 64 MiB of its top is free (loky
    restarts a worker whose memory grew by 300 MB, taking it for a leak)."""
    if _kept:
        return
    _kept.append(True)
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # not glibc: nothing to tune
        return
    for option, value in _MALLOPT.items():
        mallopt(option, value)


def _idle(seconds: float) -> None:
    time.sleep(seconds)


class _Pool:
    """What both pools keep: the runs of a stage, each with its results queue under a token,
    and whether the pipe fallback was announced."""

    def __init__(self, n_workers: int) -> None:
        self.n_workers = n_workers
        self._lock = threading.Lock()
        self._routes: dict[int, queue.SimpleQueue] = {}
        self._tokens = itertools.count()
        self._warned = False
        _POOLS.add(self)

    def open(self, results: queue.SimpleQueue) -> int:
        with self._lock:
            token = next(self._tokens)
            self._routes[token] = results
            return token

    def close_run(self, token: int) -> None:
        with self._lock:
            self._routes.pop(token, None)

    def _route(self, result: tuple) -> None:
        """Put a task's result on its run's queue (dropped if the run is closed); warn once
        that results went through the pipe for want of shared memory."""
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


class ProcessPool(_Pool):
    """One joblib generator that serves every run of a process stage.

    joblib kills its workers when an unfinished generator is closed, and runs far ahead of
    its consumer. So the pool keeps one generator alive while there is work, feeds it from a
    queue that never blocks (an idle task when there is nothing to do, since joblib asks for
    the next task while holding its own lock), and routes each result to its run by token.
    Results of a closed run are dropped; the workers stay warm for the next run.
    """

    def __init__(self, n_workers: int, backend: Any) -> None:
        super().__init__(n_workers)
        self.backend = backend
        self._tasks: collections.deque = collections.deque()
        self._pump: threading.Thread | None = None
        self._parallel: Any = None  # the joblib call of the newest generator
        self._generation = 0  # of the joblib generator now fed; older ones only finish
        self._feeding = self._closed = False
        self._last_task = time.monotonic()

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

        try:
            # parallel_config, not Parallel(backend=), registers external backends like dask;
            # pre_dispatch: at most n_workers tasks of this stage run at once, whatever n_jobs
            with parallel_config(backend=self.backend, n_jobs=self.n_workers):
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


def process_pool(n_workers: int, backend: Any) -> ProcessPool | LokyPool:
    """The pool that runs a process stage's tasks: straight on loky's executor where joblib
    would use it (``loky``, more than one worker), else through a joblib generator."""
    if backend == "loky" and n_workers != 1:  # joblib runs one job in-process
        return LokyPool(n_workers)
    return ProcessPool(n_workers, backend)


class LokyPool(_Pool):
    """The tasks of a process stage on loky, submitted to joblib's executor one by one.

    Each result reaches its run through the future's callback, as soon as it is done: no
    generator to keep alive, no polling, so a new stage on warm workers has its first result
    in about a round trip. Results of a closed run are dropped; the workers stay warm.
    """

    def __init__(self, n_workers: int) -> None:
        super().__init__(n_workers)
        self._running: dict[int, set] = {}  # each run's futures that are not done
        self._closed = False

    def submit(self, token: int, task: tuple) -> None:
        if self._closed:
            return
        future, executor = _loky_submit(self.n_workers, task)
        with self._lock:
            self._running.setdefault(token, set()).add(future)
        future.add_done_callback(functools.partial(self._done, token, executor))

    def close_run(self, token: int) -> None:
        """Drop the run's results, and its tasks that no worker has taken yet: a stage that
        starts next gets the workers at once."""
        super().close_run(token)
        with self._lock:
            futures = list(self._running.get(token, ()))
        for future in futures:
            future.cancel()

    def _done(self, token: int, executor: Any, future: concurrent.futures.Future) -> None:
        # runs in loky's thread, or in submit's if the task is done already
        with self._lock:
            futures = self._running.get(token)
            futures.discard(future)
            if not futures:
                del self._running[token]
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            self._route(future.result())
            return
        with self._lock:
            results = self._routes.get(token)
        if results is None:
            return
        if isinstance(error, concurrent.futures.BrokenExecutor):  # a worker died
            # loky fails the tasks first and kills the other workers after: wait for that
            # (not here, in loky's thread) before removing the names they made
            threading.Thread(target=_fail_broken, args=(executor, results, capture(error)),
                             name="fpipe-broken-pool", daemon=True).start()
        else:
            results.put(Message.failure(capture(error)))

    def running(self) -> int:
        """How many of the stage's tasks are not done (running, or waiting for a worker)."""
        return len(self._futures())

    def release(self) -> None:
        """Nothing to end: the stage holds no joblib call between its tasks."""

    def shutdown(self) -> None:
        """Submit no more tasks and drop those that have not started."""
        self._closed = True  # one store, atomic: this is also a finalizer (see ProcessPool)
        for future in self._futures():
            future.cancel()

    def wait(self, deadline: float) -> None:
        """Wait for the running tasks; past ``deadline``, kill the workers that run them."""
        running = self._futures()
        if not running:
            return
        _, late = concurrent.futures.wait(running, max(0.0, deadline - time.monotonic()))
        if late and _loky["executor"] is not None:
            _loky["executor"].shutdown(wait=False, kill_workers=True)

    def _futures(self) -> list:
        # no lock (see shutdown): a copy of each set, taken while it may change, is enough
        return [future for futures in list(self._running.values()) for future in list(futures)]


def _fail_broken(executor: Any, results: queue.SimpleQueue, error: CapturedError) -> None:
    executor.shutdown(wait=True)  # broken: returns once loky has killed its workers
    sweep(os.getpid())
    results.put(Message.failure(error))


def _shutdown_pools() -> None:
    # at exit: stop every pool, give running tasks a moment, then kill what still runs
    global _exiting
    _exiting = True  # no new executor for a submit that loky refuses now
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
