"""The one module that touches joblib (imported when a process stage first runs), with the
private APIs it needs: ``Parallel._initialize_backend`` and ``Parallel._backend._workers``
(joblib's own configuration of its shared loky executor), the executor's
``_pending_work_items``, ``_processes`` and ``_executor_manager_thread`` (whether it is busy,
its workers, whether it runs), ``Parallel._abort``, threading's ``_register_atexit`` and
``_SHUTTING_DOWN`` and the thread registries of ``concurrent.futures`` and loky (for the
exit), the module state of joblib's reusable executor (dropped in a forked child, whose
parent's executor is not its own), and the executor's ``_temp_folder_manager``
(``set_current_context``, ``_clean_temporary_resources``, ``_cached_temp_folders``: the
memory-mapped arrays of each run, released when it is over, as joblib does at the end of a
``Parallel`` call). On loky (the default backend) a process stage sends its
tasks straight to that executor; on any other backend it keeps one joblib generator per
stage. It also keeps the size of the loky pool, and the exit hook that lets the user's
threads finish and then ends the stages' work before loky's executor stops. A run's function
reaches each worker once (:class:`ShippedCall`); its items are pickled by fpipe, not
memory-mapped (:class:`ShippedItems`). Worker processes pickle their results
themselves (so that an item whose result does not pickle is found, and the items before it
are delivered), send large arrays back through :mod:`._shm` (shared memory), keep the memory
they free for their next task, and watch that their consumer is alive.

Where joblib runs no worker processes — in a daemon process (a DataLoader worker, say), or
once the interpreter exits — a stage runs its tasks in its own thread, in this process.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import contextlib
import ctypes
import functools
import io
import itertools
import marshal
import multiprocessing
import multiprocessing.util
import os
import pickle
import queue
import secrets
import sys
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fpipe.errors import CapturedError, capture
from fpipe.stream.core import JOIN_SECONDS
from fpipe.stream.parallel._messages import Message
from fpipe.stream.parallel._shm import Transport, encode, lending, sweep, watch_owner
from fpipe.stream.parallel._tuner import measured
from fpipe.stream.simple import ItemCall

_IDLE_SECONDS = (1e-3, 2e-2)  # an idle task sleeps this long, doubling up to the maximum
_KEEP_ALIVE = 1.0  # the joblib generator ends after this long without a task
_EXIT_SECONDS = 0.25  # at exit, running tasks get this long before their workers are killed
_STOP = object()
_POOLS: weakref.WeakSet = weakref.WeakSet()
_exit_hook = threading.Lock()


_loky: dict[str, Any] = {"executor": None, "size": 0, "running": 0, "here": False}
_loky_lock = threading.Lock()
_sizing = threading.Lock()  # held while a thread decides the size and configures the executor
_exiting = False
_stale: list = []  # a forked child's copies of its parent's executors, never collected there


def _loky_submit(n_workers: int, task: tuple) -> tuple[concurrent.futures.Future, Any] | None:
    """Submit ``task`` to joblib's loky executor; None if this process runs its tasks itself
    (see :func:`_runs_here`). The executor's size follows the stage while it is idle; while it
    has tasks, a stage that starts adopts the size it has, because a resize waits for every
    task. No lock is held while loky works: its thread runs the futures' callbacks, which
    take the lock."""
    if _runs_here():
        return None
    for renew in (False, True):
        executor = _reserve_executor(n_workers, renew)
        if executor is None:
            return None
        started = executor._executor_manager_thread is not None
        try:
            future = executor.submit(_run_task, *task)
            break
        except BaseException as error:
            _task_ended()
            if _threads_ending() and isinstance(error, RuntimeError):
                _end_unhooked(executor, started)
                return None
            # shut down, or broken by a killed worker: joblib makes another, once
            if renew or _exiting or not isinstance(error, RuntimeError):
                raise
    _set_exit_hook()  # loky sets its own at the first submit (see there)
    future.add_done_callback(_task_ended)
    return future, executor


def _runs_here() -> bool:
    """Whether this process runs the stages' tasks itself, as joblib would: a daemon process
    cannot start worker processes (warned once), and once the interpreter exits, loky takes
    no new work (and a new executor could not stop at exit)."""
    if _exiting or _loky["here"]:
        return True
    if multiprocessing.current_process().daemon:
        _loky["here"] = True
        warnings.warn("processes(): this is a daemon process (a DataLoader worker, say), which "
                      "cannot start worker processes; process stages run their function here, "
                      "in the stage's thread", RuntimeWarning, stacklevel=1)
        return True
    return _threads_ending() and _loky["executor"] is None


def _threads_ending() -> bool:
    """Whether threading runs its exit hooks (or ran them): the main thread has returned."""
    return getattr(threading, "_SHUTTING_DOWN", False)


def _end_unhooked(executor: Any, started: bool) -> None:
    """An executor whose first submit started its thread just as the interpreter began to
    exit could not register loky's exit hook: end it now, or its thread keeps the
    interpreter alive."""
    if not started and executor._executor_manager_thread is not None:
        executor.shutdown(wait=False, kill_workers=True)


def _reserve_executor(n_workers: int, renew: bool) -> Any:
    """The executor to submit to, counted as running one more task; None if joblib runs no
    loky workers here (it warned why)."""
    with _sizing:  # one thread at a time sizes the executor, and only when it is idle
        executor = None if renew else _loky["executor"]
        if executor is None or (_loky["size"] != n_workers and not _busy(executor)):
            executor = _loky_executor(n_workers)  # joblib's own lock keeps it one executor
            if executor is None:
                _loky["here"] = True
                return None
            _loky["executor"], _loky["size"] = executor, n_workers
        with _loky_lock:
            _loky["running"] += 1
        return executor


def _busy(executor: Any) -> bool:
    """Whether a task waits or runs on the executor: one of a stage (also one reserved and not
    yet submitted), of the user's own joblib call, or one that a closed run cancelled and
    loky has not dropped yet. A resize would wait for them."""
    return _loky["running"] > 0 or bool(executor._pending_work_items)


def _task_ended(_future: concurrent.futures.Future | None = None) -> None:
    """One task fewer runs on the executor (a future's callback, or a submit that failed)."""
    with _loky_lock:
        _loky["running"] -= 1


def _loky_executor(n_workers: int) -> Any:
    """joblib's shared loky executor, sized and configured as a ``Parallel(n_jobs=n_workers)``
    call would (thread limits for BLAS in the workers, large arguments memory-mapped), so
    stages and the user's own ``Parallel`` calls keep the same workers; None where joblib would
    run the call in this process instead (it warns why)."""
    from joblib import Parallel, parallel_config

    with parallel_config(backend="loky", n_jobs=n_workers):
        parallel = Parallel()
    parallel._initialize_backend()  # joblib's own configuration of the executor
    executor = getattr(parallel._backend, "_workers", None)
    if executor is not None:
        _watch_from_the_start(executor)
    return executor


def _watch_from_the_start(executor: Any) -> None:
    """Each worker that loky starts for ``executor`` from now on watches this process from
    its start (:func:`~fpipe.stream.parallel._shm.watch_owner`), not from its first task: a
    worker that never ran one (it may still have been starting) would idle for joblib's
    ``idle_worker_timeout`` (five minutes) after this process ended without shutting the
    executor down (killed, or a forked child's ``os._exit``), holding what it inherited, the
    terminal's pipes among them. Set on the
    executor itself, not through joblib's arguments, which would make the user's own
    ``Parallel`` calls replace it."""
    initializer = executor._initializer
    if isinstance(initializer, functools.partial) and initializer.func is _start_worker:
        return
    executor._initializer = functools.partial(_start_worker, os.getpid(), initializer)


def _start_worker(owner: int, initializer: Callable | None, *initargs: Any) -> None:
    if os.getppid() != owner:  # the consumer ended while this worker started: no task comes
        os._exit(0)
    watch_owner(owner)
    _keep_freed_memory()  # also for coarse tasks outside any stage (fpipe.prepare's)
    if initializer is not None:
        initializer(*initargs)


def shared_executor(n_workers: int) -> Any:
    """joblib's shared loky executor with ``n_workers`` workers, configured as the process
    stages' (for coarse tasks outside any stage: the partitions of :mod:`fpipe.prepare`);
    None where joblib runs no worker processes here (it warned why)."""
    if _runs_here():
        return None
    return _loky_executor(n_workers)


def _forget_parent_pool() -> None:
    """In a forked child: none of the parent's threads runs here, and the parent's executor
    and workers are not the child's. Start afresh: the locks, the pools' runs, and joblib's
    own reusable executor (else the child's first ``Parallel`` call waits for ever on the
    parent's, or fails on resizing it). The parent's executors are kept, never collected
    here: collected, they would wake their thread, which is the parent's."""
    global _loky_lock, _sizing, _exit_hook, _release_lock
    _loky_lock, _sizing, _exit_hook = threading.Lock(), threading.Lock(), threading.Lock()
    _release_lock = threading.Lock()
    _unremoved.clear()
    if _loky["executor"] is not None:
        _stale.append(_loky["executor"])
    _loky.update(executor=None, size=0, running=0)
    for pool in list(_POOLS):
        pool.forget_runs()
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    if reusable is not None and reusable._executor is not None:
        _stale.append(reusable._executor)
        reusable._executor = reusable._executor_kwargs = None
        reusable._executor_lock = threading.RLock()
        sys.modules["joblib.executor"]._executor_args = None
        sys.modules["joblib.externals.loky.process_executor"]._threads_wakeups.clear()


os.register_at_fork(after_in_child=_forget_parent_pool)


# --- what crosses to and from the workers: a task's items and a chunk's results, pickled by
# fpipe (with the item whose result does not pickle named), and a run's call ---------------


class ShippedItems:
    """A task's items as they travel to a worker: pickled by fpipe, not by loky. loky's
    pickler memory-maps each numpy array of more than 1 MiB into a file under ``/dev/shm``,
    which joblib removes only when a ``Parallel`` call ends; a stage makes no such call, so
    each large item stayed in memory until the interpreter exited (400 items of 4 MiB kept
    1.6 GB there, and loky warned of "leaked" files at exit)."""

    __slots__ = ("items",)

    def __init__(self, items: list) -> None:
        self.items = items

    def __reduce__(self):
        # the arrays' bytes go beside the pickle, as buffers that loky's pickler copies into
        # its stream once (not into these bytes first), and that the arrays then view
        buffers: list[pickle.PickleBuffer] = []
        return _loaded, (dumps(self.items, buffers), buffers)


def _loaded(pickled: bytes, buffers: list) -> list:
    return pickle.loads(pickled, buffers=buffers)


def pickled_results(outputs: list, error: CapturedError | None, index: int,
                    transport: Transport | None) -> tuple[bytes, CapturedError | None, str | None]:
    """``outputs`` pickled (their large arrays in shared memory, with ``transport``), the
    error, and why shared memory was not used. An output that does not pickle ends them: the
    outputs before it are sent, with a ``TypeError`` that names its item."""
    try:
        sent, reason = _encoded(outputs, transport)
        return sent, error, reason
    except Exception as failure:  # whatever pickling raises
        bad = next((i for i, output in enumerate(outputs) if not _pickles(output)), 0)
        sent, reason = _encoded(outputs[:bad], transport)
        return sent, _unpicklable(outputs[bad], index + bad, failure), reason


def _encoded(outputs: list, transport: Transport | None) -> tuple[bytes, str | None]:
    return (dumps(outputs), None) if transport is None else encode(transport, outputs, dumps)


def dumps(value: Any, buffers: list[pickle.PickleBuffer] | None = None) -> bytes:
    """``value`` pickled, as loky would (cloudpickle, where plain pickle cannot); with
    ``buffers``, its arrays' bytes are appended there instead (pickle's protocol 5)."""
    callback = None if buffers is None else buffers.append
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL, buffer_callback=callback)
    except Exception:  # a lambda, a class made at run time...
        import cloudpickle

        if buffers is not None:
            buffers.clear()  # those of the failed attempt
        return cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL, buffer_callback=callback)


def _pickles(value: Any) -> bool:
    try:
        dumps(value)
    except Exception:
        return False
    return True


def _unpicklable(output: Any, item: int, failure: Exception) -> CapturedError:
    try:
        raise TypeError(f"processes(): the result for item {item} (of type "
                        f"{type(output).__name__}) does not pickle, so it cannot leave the "
                        f"worker process: {failure}") from failure
    except TypeError as error:
        return capture(error)


class ShippedCall:
    """A run's call as its tasks carry it: pickled once in the consumer (at the first task),
    its bytes sent with every task, unpickled once in each worker, which keeps it for the run's
    later tasks. A function that holds a reader, a table or a model is then rebuilt once per
    worker and run, not once per chunk; like a DataLoader's dataset in its workers, it keeps
    its state between chunks. The numpy arrays of 1 MiB or more in it go beside those bytes,
    through loky's own pickler, as joblib memory-maps large arrays; the worker still keeps its
    first copy. Functions pickled by value keep their file's name, so a worker's traceback
    shows their file, line and source."""

    __slots__ = ("call", "key", "_sent")

    def __init__(self, call: ItemCall) -> None:
        # random, not a count: a dask worker may serve clients on other machines
        self.call, self.key, self._sent = call, secrets.token_bytes(16), None

    def __reduce__(self):
        if self._sent is None:  # in loky's (one) feeder thread: at worst pickled twice
            file = io.BytesIO()
            pickler = _call_pickler()(file)
            pickler.dump(self.call)
            self._sent = (self.key, file.getvalue(), tuple(pickler.arrays))
        if self._sent[2]:
            _memmap_for_run(self.key)
        return _unshipped, self._sent


def _memmap_for_run(key: bytes) -> None:
    """Have joblib memory-map the arrays pickled next (a run's call's) into a folder of the
    run ``key``, which :func:`release_memmaps` lets go of when the run is over (as
    joblib's own ``Parallel`` calls do with theirs, whose arrays it maps the same way)."""
    manager = getattr(_loky["executor"], "_temp_folder_manager", None)
    if manager is not None:
        manager.set_current_context(key.hex())


def release_memmaps(key: bytes) -> None:
    """Let joblib remove the files of run ``key``'s memory-mapped arrays: at once, or when
    the last worker that keeps the run's call drops it. Without this, every run whose call
    held a new array of more than 1 MiB left a copy of it in ``/dev/shm`` until the
    interpreter exited."""
    manager = getattr(_loky["executor"], "_temp_folder_manager", None)
    if manager is None or _exiting:  # at exit, joblib removes them all itself
        return
    with _release_lock:
        manager._clean_temporary_resources(context_id=key.hex(), force=False)
        _unremoved.add(key.hex())
        # the folders of runs released earlier whose files are gone since (a second release
        # of a folder that still holds files would count its maps down twice)
        for context in list(_unremoved):
            folder = manager._cached_temp_folders.get(context)
            if folder is not None and os.path.isdir(folder) and not os.listdir(folder):
                manager._clean_temporary_resources(context_id=context, force=False)
                folder = manager._cached_temp_folders.get(context)
            if folder is None or not os.path.isdir(folder):
                _unremoved.discard(context)


#: runs released while a worker still mapped their files (a worker keeps four runs' calls):
#: their folders go at a later release
_unremoved: set[str] = set()
_release_lock = threading.Lock()


_SHIPPED_BYTES = 1 << 20  # joblib memory-maps arrays from 1 MiB: those go its way
_KEPT_CALLS = 4  # runs whose calls a worker keeps (stages running at once, epochs in turn)
_calls: collections.OrderedDict = collections.OrderedDict()


def _code_reduce(code: types.CodeType) -> tuple:
    # cloudpickle names every code object it pickles "<dynamic-code>"; marshal keeps its file
    return marshal.loads, (marshal.dumps(code),)


@functools.cache
def _call_pickler() -> type:
    import cloudpickle  # joblib's dependency, imported once a stage runs

    class CallPickler(cloudpickle.Pickler):
        """cloudpickle, with each function's file name kept, and with the large numpy arrays
        left out (in :attr:`arrays`, for the task's own pickler to send)."""

        dispatch_table = collections.ChainMap({types.CodeType: _code_reduce},
                                              cloudpickle.Pickler.dispatch_table)

        def __init__(self, file: io.BytesIO) -> None:
            super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
            self.arrays: list[np.ndarray] = []

        def persistent_id(self, obj: Any) -> int | None:
            if type(obj) in (np.ndarray, np.memmap) and obj.nbytes >= _SHIPPED_BYTES \
                    and not obj.dtype.hasobject:
                self.arrays.append(obj)
                return len(self.arrays) - 1
            return None

    return CallPickler


def _unshipped(key: bytes, pickled: bytes, arrays: tuple) -> ItemCall:
    """In a worker: the call that ``key`` names, kept from its first task (unpickled from
    ``pickled`` then, with ``arrays`` in their places)."""
    kept = _calls.get(key)
    if kept is None:
        unpickler = pickle.Unpickler(io.BytesIO(pickled))
        unpickler.persistent_load = arrays.__getitem__
        kept = _calls[key] = unpickler.load()
        while len(_calls) > _KEPT_CALLS:
            _calls.popitem(last=False)
    _calls.move_to_end(key)
    return kept


_FALLBACKS = {"budget": "each worker's shared_memory_budget is used",
              "full": "/dev/shm is full"}


def _run_task(call: ItemCall | ShippedCall, token: int, seq: int, index: int,
              chunk: list | ShippedItems,
              slots: int, owner: int, transport: Transport | None) -> tuple:
    if isinstance(call, ShippedCall):  # a backend that runs tasks in this process
        call, chunk = call.call, chunk.items
    watch_owner(owner)  # a worker whose consumer is killed exits, not idles for minutes
    if not _kept and os.getppid() == owner:  # a worker of this machine's pool, not dask's
        _keep_freed_memory()
    fallback = None
    with lending(transport):  # fpipe's combiners make large arrays in shared memory at once
        outputs, error, seconds, cpu, queued = measured(call.run, chunk, index)
        if os.getpid() != owner:  # the outputs leave this process: pickled here
            outputs, error, fallback = pickled_results(outputs, error, index, transport)
    return token, seq, outputs, error, seconds, slots, fallback, cpu, queued


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
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return
    for option, value in _MALLOPT.items():
        mallopt(option, value)


def _glibc_mallopt() -> Callable | None:
    """glibc's ``mallopt``; None where the C library has none (nothing to tune there)."""
    try:
        return ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return None


#: The environment's names of the options in :data:`_MALLOPT`, and glibc's own settings of them
_MALLOC_VARIABLES = {-1: ("MALLOC_TRIM_THRESHOLD_", 128 << 10),
                     -2: ("MALLOC_TOP_PAD_", 128 << 10), -3: ("MALLOC_MMAP_THRESHOLD_", 128 << 10)}


@contextlib.contextmanager
def freed_memory_kept() -> Iterator[None]:
    """While the block runs, keep freed memory for reuse as fpipe's own workers do
    (:func:`_keep_freed_memory`), in a process whose environment told glibc to hand it back:
    a dask worker, whose nanny sets ``MALLOC_TRIM_THRESHOLD_=65536``, so that a task that
    decodes and encodes images spent half as long again page-faulting its buffers in anew.
    After the block, the environment's settings come back (glibc's own for the options it
    leaves out: any one of them set turns off glibc's adaptive thresholds). A process whose
    environment sets none keeps glibc's adaptive behaviour, untouched, and fpipe's workers
    keep theirs; so does a system without glibc.

    >>> with freed_memory_kept():
    ...     buffers = [bytearray(1 << 20) for _ in range(4)]
    """
    given = {option: os.environ.get(variable, "") for option, (variable, _) in
             _MALLOC_VARIABLES.items()}
    mallopt = None if _kept or not any(given.values()) else _glibc_mallopt()
    if mallopt is None:
        yield
        return
    for option, value in _MALLOPT.items():
        mallopt(option, value)
    try:
        yield
    finally:
        for option, (_, default) in _MALLOC_VARIABLES.items():
            mallopt(option, int(given[option]) if given[option].isdigit() else default)


def _idle(seconds: float) -> None:
    time.sleep(seconds)


class _Pool(abc.ABC):
    """What both pools keep: the runs of a stage, each with its results queue under a token,
    and whether the pipe fallback was announced."""

    def __init__(self, n_workers: int) -> None:
        self.n_workers = n_workers
        self.forget_runs()
        self._tokens = itertools.count()
        self._warned = False
        _POOLS.add(self)

    def forget_runs(self) -> None:
        """Hold no run (also in a forked child, whose parent's runs are not its own)."""
        # reentrant: a stream's finalizer closes its run, and the garbage collector may run it
        # in a thread that holds the lock
        self._lock = threading.RLock()
        self._routes: dict[int, queue.SimpleQueue] = {}

    def open(self, results: queue.SimpleQueue) -> int:
        """A new run, whose results go to ``results``."""
        with self._lock:
            token = next(self._tokens)
            self._routes[token] = results
            return token

    def close_run(self, token: int) -> None:
        with self._lock:
            self._routes.pop(token, None)

    def submit(self, token: int, task: tuple) -> None:
        """Send ``task`` of run ``token`` to the workers (not if the run is closed), or run it
        in this thread where there are none to send it to (see :func:`_runs_here`)."""
        if token in self._routes and not self._send(token, task):
            self._route(_run_task(*task))

    @abc.abstractmethod
    def _send(self, token: int, task: tuple) -> bool:
        """Send ``task`` to the workers; False if there are none to send it to (each backend's
        pool, ProcessPool or LokyPool, says how)."""

    def _route(self, result: tuple) -> None:
        """Put a task's result on its run's queue (dropped unread if the run is closed); warn
        once that results went through the pipe for want of shared memory. It runs in
        joblib's or loky's threads, so it raises nothing: an error goes to the run."""
        token, seq, outputs, error, seconds, slots, fallback, cpu, queued = result
        with self._lock:
            results = self._routes.get(token)
        if results is None:
            return
        if fallback is not None and not self._warned:
            self._warned = True
            warnings.warn(f"processes(): no room in shared memory ({_FALLBACKS[fallback]}): "
                          "results go through the pipe until there is", RuntimeWarning,
                          stacklevel=1)
        if isinstance(outputs, bytes):  # pickled by the worker (see _run_task)
            try:
                outputs = pickle.loads(outputs)
            except Exception as failure:  # say, a class that this process cannot import
                outputs, error = [], capture(failure)
        results.put(Message(seq, outputs, error, seconds, slots, cpu, queued))


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
        self._generation = 0  # of the joblib generator now fed; older ones only finish
        self._closed = False
        self._last_task = time.monotonic()

    def forget_runs(self) -> None:
        super().forget_runs()
        self._tasks: collections.deque = collections.deque()
        self._pump: threading.Thread | None = None
        self._parallel: Any = None  # the joblib call of the newest generator
        self._feeding = False

    def _send(self, token: int, task: tuple) -> bool:
        if _exiting:  # the pools are stopped: a thread that starts now runs its tasks itself
            return False
        with self._lock:
            self._tasks.append((token, task))
            self._last_task = time.monotonic()
            if not self._feeding and not self._closed:
                self._feeding = True
                self._generation += 1
                self._pump = threading.Thread(target=self._pump_results, name="fpipe-joblib",
                                              args=(self._generation,), daemon=True)
                self._pump.start()
        return True

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

    def forget_runs(self) -> None:
        super().forget_runs()
        self._running: dict[int, set] = {}  # each run's futures that are not done
        self._calls: dict[int, bytes] = {}  # each run's call's key, until the run is over

    def _send(self, token: int, task: tuple) -> bool:
        placed = _loky_submit(self.n_workers, task)
        if placed is None:
            return False
        future, executor = placed
        with self._lock:
            self._running.setdefault(token, set()).add(future)
            self._calls.setdefault(token, task[0].key)
        future.add_done_callback(functools.partial(self._done, token, executor))
        return True

    def _release_if_over(self, token: int) -> None:
        """Once run ``token`` is closed and none of its tasks runs, release its memory-mapped
        arrays (see :func:`release_memmaps`)."""
        with self._lock:
            if token in self._routes or token in self._running:
                return
            key = self._calls.pop(token, None)
        if key is not None:
            release_memmaps(key)

    def close_run(self, token: int) -> None:
        """Drop the run's results, and its tasks that no worker has taken yet: a stage that
        starts next gets the workers at once."""
        super().close_run(token)
        with self._lock:
            futures = list(self._running.get(token, ()))
        for future in futures:
            future.cancel()
        self._release_if_over(token)

    def _done(self, token: int, executor: Any, future: concurrent.futures.Future) -> None:
        # runs in loky's thread, or in submit's if the task is done already
        with self._lock:
            futures = self._running.get(token)
            futures.discard(future)
            if not futures:
                del self._running[token]
        self._release_if_over(token)
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
        if isinstance(error, concurrent.futures.BrokenExecutor) and not _exiting:  # a worker died
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
        """Drop the tasks that have not started (the stage is collected, or at exit)."""
        # no lock: this is also a finalizer (see ProcessPool)
        for future in self._futures():
            future.cancel()

    def wait(self, deadline: float) -> None:
        """Wait for the running tasks; past ``deadline``, kill the workers that run them."""
        running = self._futures()
        if not running:
            return
        _, late = concurrent.futures.wait(running, max(0.0, deadline - time.monotonic()))
        if late and _loky["executor"] is not None:
            _kill_workers(_loky["executor"])

    def _futures(self) -> list:
        # no lock (see shutdown): a copy of each set, taken while it may change, is enough
        return [future for futures in list(self._running.values()) for future in list(futures)]


def _kill_workers(executor: Any) -> None:
    """Kill the executor's workers and what they started. loky then finds its executor broken
    and ends it. (Its own ``shutdown(kill_workers=True)`` fails in loky's thread on a task that
    a closed run cancelled, and leaves the workers running: the interpreter then waits for
    them at exit.)"""
    from joblib.externals.loky.backend.utils import kill_process_tree

    for process in list(executor._processes.values()):
        kill_process_tree(process)


def _fail_broken(executor: Any, results: queue.SimpleQueue, error: CapturedError) -> None:
    executor.shutdown(wait=True)  # broken: returns once loky has killed its workers
    sweep(os.getpid())
    results.put(Message.failure(error))


def _at_exit() -> None:
    """threading's exit hook (see :func:`_set_exit_hook`). Python waits for its non-daemon
    threads only after the exit hooks, one of which stops loky's executor: a training loop in
    a thread of its own would find its workers gone under it (also through an ``Infinite``
    or a ``prefetch``, whose daemon threads read the process stage for it). So first wait for
    those threads, as Python would. Then stop every pool, give the running tasks a moment,
    and kill the workers of those that still run (of closed or forgotten streams, or of daemon
    threads); a stage that starts after that runs its tasks itself."""
    if _exiting:  # set twice (see _set_exit_hook)
        return
    try:
        _wait_for_user_threads()
    finally:
        _shutdown_pools()


def _wait_for_user_threads() -> None:
    """Join the live non-daemon threads, but for those that end only at the exit hooks (the
    workers of ``concurrent.futures``' thread pools, the threads that manage its and loky's
    process pools), until none is left."""
    while True:
        waiting = set(threading.enumerate()) - _ended_by_exit_hooks() - {threading.current_thread()}
        waiting = [thread for thread in waiting if not thread.daemon and thread.is_alive()]
        if not waiting:
            return
        for thread in waiting:
            thread.join()


def _ended_by_exit_hooks() -> set[threading.Thread]:
    ended: set[threading.Thread] = set()
    for module, threads in (("concurrent.futures.thread", "_threads_queues"),
                            ("concurrent.futures.process", "_threads_wakeups"),
                            ("joblib.externals.loky.process_executor", "_threads_wakeups")):
        loaded = sys.modules.get(module)
        if loaded is not None:
            ended.update(list(getattr(loaded, threads, {}).keys()))
    return ended


def _shutdown_pools() -> None:
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
        if _finalized.get("pid") != os.getpid():  # once per process (and forked child)
            _finalized["pid"] = os.getpid()
            multiprocessing.util.Finalize(None, _at_child_exit, exitpriority=20)
        hooks = getattr(threading, "_threading_atexits", [])
        if hooks and getattr(hooks[-1], "func", None) is _at_exit:
            return
        try:
            threading._register_atexit(_at_exit)
        except RuntimeError:  # the hooks run now: too late (see _runs_here)
            pass


_finalized: dict[str, int] = {}


def _at_child_exit() -> None:
    """multiprocessing's exit hook: in a child process that multiprocessing started, it runs
    instead of threading's exit hooks (which it skips), and before it waits for the child's
    own children, loky's workers among them. So end the stages, then loky's executor (what its
    own threading hook would do), and its temporary folders (joblib removes them at exit,
    which such a child skips too): else the child waits for ever for its idle workers."""
    if _exiting:  # threading's exit hooks ran: this is not such a child
        return
    _shutdown_pools()  # the child's other threads are not waited for there
    if _loky["executor"] is not None:
        _loky["executor"].terminate()
