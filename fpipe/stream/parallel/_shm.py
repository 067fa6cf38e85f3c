"""Shared memory for the results of worker processes: large arrays cross without a pipe.

A worker writes the large numpy arrays of a result (also inside tuples, lists, dicts and
named tuples, and any type registered with :func:`register`, such as torch tensors) into a
*slab*, a shared-memory segment it keeps and reuses, and the pipe carries only small
references. Unpickling a reference in the consumer maps the slab (once per slab) and returns an
array that views it: no copy on the way in.

Lifetime (reference counting). Every array of one result holds the result's *lease*; the slab
stays reserved while any of them (or a view of one, or a tensor made from one) is alive, and is
free for the worker to reuse once the last is garbage-collected. The worker never waits for a
slab: when none is free it makes another, within its byte budget; past the budget, or when
``/dev/shm`` is full, the result goes through the pipe as before.

Names. A slab is named ``fpipe-shm-<uid>-<owner>-<worker>-<serial>-<token>`` (the owner is the
consumer's pid, the uid the user's). The consumer unlinks the name as soon as it has mapped the
slab, so a slab in use has no name: the kernel frees it when the last process that maps it
exits, whatever kills them. A name exists only between the worker making the slab and the
consumer mapping it; :func:`sweep` removes the names whose processes died in that window, and
runs when a consumer starts, when a worker dies and when the consumer exits. It looks only at
the names of this user (``/dev/shm`` is shared by every user, and only its owner may remove a
name there), and skips a name it cannot remove.

Runs. The slabs belong to the run of a stage that the transport serves (:meth:`Transport.for_consumer`
starts one): while the run lasts, a worker reuses them from chunk to chunk; once it ends
(:func:`end_run`), the consumer lets go of them as soon as no array of theirs is alive, and the
workers unmap them at their next task or within about half a second. A run is marked by an
empty file, ``fpipe-run-<uid>-<owner>-<token>``, which the consumer removes when the run ends.

This module imports neither torch nor joblib; :mod:`fpipe.torch` registers torch tensors.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib
import itertools
import math
import mmap
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__: list[str] = []  # private: the process stage is its user

DIRECTORY = "/dev/shm"
PREFIX = "fpipe-shm-"
RUN_PREFIX = "fpipe-run-"
THRESHOLD = 16 * 1024  # smaller arrays go through the pipe (measured: docs/concepts.md)
_HEADER = 64  # the slab's first bytes: its state, 0 (free) or the generation handed out
_ALIGN = 64
_MIN_SLAB = 1 << 20
_ROOM = 4 << 20  # a new slab is this much larger than its result at most (chunks vary)
_WATCH_SECONDS = 0.5  # how often a worker checks that its consumer is alive
_MAX_BUDGET = 256 << 20
# map every page at once: faulting in a fresh slab page by page cost 50 ms per 19 MB
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def available() -> bool:
    """Whether this machine has POSIX shared memory as files (Linux's ``/dev/shm``)."""
    return os.path.isdir(DIRECTORY) and os.access(DIRECTORY, os.W_OK)


def default_budget(workers: int) -> int:
    """Bytes of slabs each of ``workers`` workers may hold: a quarter of ``/dev/shm`` shared
    between them, at most 256 MiB each. (A slab's pages count in its worker's resident memory,
    and loky restarts a worker whose memory grew by 300 MB, taking it for a leak.)"""
    stat = os.statvfs(DIRECTORY)
    return max(_MIN_SLAB, min(_MAX_BUDGET, stat.f_blocks * stat.f_frsize // (4 * max(workers, 1))))


# --- types that travel as arrays ----------------------------------------------------------

_KINDS: dict[str, str] = {}  # "module.Type" -> "module:codec", filled by register()
_CODECS: dict[str, Any] = {}


def register(type_name: str, codec: str) -> None:
    """Let objects of type ``type_name`` (``"module.QualName"``) travel in shared memory.

    ``codec`` names, as ``"module:attribute"``, an object with ``to_array(obj)`` (an array that
    shares the object's memory, or None to pickle the object as usual) and
    ``from_array(array)``. It is imported only where such an object is met, so a worker never
    imports a module for a type it does not return.
    """
    _KINDS[type_name] = codec


def _codec(path: str) -> Any:
    codec = _CODECS.get(path)
    if codec is None:
        module, _, attribute = path.partition(":")
        codec = _CODECS[path] = getattr(importlib.import_module(module), attribute)
    return codec


@dataclass(frozen=True)
class Transport:
    """What a worker needs to send its results through shared memory: the consumer's pid,
    the size below which arrays stay in the pipe, its byte budget, the registered types, the
    run whose slabs these are ("": slabs that last as long as the worker), and how many free
    slabs it keeps for reuse (None: as many as its budget holds)."""

    owner: int
    threshold: int = THRESHOLD
    budget: int = 1 << 30
    kinds: tuple = ()
    run: str = ""
    keep: int | None = None

    @classmethod
    def for_consumer(cls, workers: int, threshold: int = THRESHOLD,
                     budget: int | None = None, keep: int | None = None) -> Transport:
        """The transport of a new run of this process's stage (end it with :func:`end_run`);
        the first one removes what killed runs left."""
        _sweep_once()
        budget = default_budget(workers) if budget is None else budget
        run = secrets.token_hex(8)
        os.close(os.open(_run_path(os.getpid(), run), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        _reader().start_run(run)
        return cls(os.getpid(), threshold, budget, tuple(sorted(_KINDS.items())), run, keep)


def end_run(transport: Transport) -> None:
    """In the consumer: the run is over. Its slabs are let go of here once no array of theirs
    is alive, and by the workers soon (see the module's docstring)."""
    if transport.run:
        _unlink(os.path.basename(_run_path(transport.owner, transport.run)))
        _reader().forget_run(transport.run)


# --- names --------------------------------------------------------------------------------


def _name(owner: int, serial: int) -> str:
    return f"{PREFIX}{os.getuid()}-{owner}-{os.getpid()}-{serial}-{secrets.token_hex(4)}"


def _run_path(owner: int, run: str) -> str:
    return os.path.join(DIRECTORY, f"{RUN_PREFIX}{os.getuid()}-{owner}-{run}")


def _pids(name: str) -> tuple[int, int] | None:
    """``(owner, worker)`` of this user's slab name (a run's name: ``(owner, owner)``), or
    None for any other name."""
    # a slab: uid, owner, worker, serial, token; a run: uid, owner, token
    prefix, count = (PREFIX, 5) if name.startswith(PREFIX) else (RUN_PREFIX, 3)
    parts = name[len(prefix):].split("-")
    if not name.startswith(prefix) or len(parts) != count \
            or not all(part.isdigit() for part in parts[:-1]) or parts[0] != str(os.getuid()):
        return None
    owner = int(parts[1])
    return (owner, int(parts[2])) if prefix == PREFIX else (owner, owner)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink(name: str) -> bool:
    """Remove ``name`` from ``/dev/shm``; False if it is gone, or not ours to remove."""
    try:
        os.unlink(os.path.join(DIRECTORY, name))
    except (FileNotFoundError, PermissionError):
        return False
    return True


def _names(owner: int | None, runs: bool) -> list[str]:
    try:
        found = os.listdir(DIRECTORY)
    except OSError:
        return []
    prefixes = (PREFIX, RUN_PREFIX) if runs else (PREFIX,)
    return sorted(name for name in found if name.startswith(prefixes)
                  and (pids := _pids(name)) is not None and owner in (None, pids[0]))


def names(owner: int | None = None) -> list[str]:
    """This user's slab names now in ``/dev/shm`` (of ``owner`` only, if given)."""
    return _names(owner, runs=False)


def sweep(owner: int | None = None) -> list[str]:
    """Remove this user's names that nobody will map: those whose consumer died, and, if
    ``owner`` is given, the slabs of ``owner`` whose worker died. Returns the names removed."""
    removed = []
    for name in _names(None, runs=True):
        consumer, worker = _pids(name)
        orphan = not _alive(consumer) or (consumer == owner and not _alive(worker))
        if orphan and _unlink(name):
            removed.append(name)
    return removed


_swept: set[int] = set()


def _sweep_once() -> None:
    if os.getpid() not in _swept and available():
        _swept.add(os.getpid())
        sweep()


def release_owner() -> None:
    """Remove every name this process owns: at exit nobody will map them any more."""
    for name in _names(os.getpid(), runs=True):
        _unlink(name)


atexit.register(lambda: release_owner() if os.getpid() in _swept else None)


# --- the worker's side --------------------------------------------------------------------


class _Slab:
    """One shared-memory segment: a header (the state) and the data."""

    __slots__ = ("capacity", "data", "key", "mm", "name", "state", "unnamed")

    def __init__(self, key: tuple, name: str, mm: mmap.mmap) -> None:
        self.key, self.name, self.mm = key, name, mm
        self.unnamed = False  # once a result in it was sent: the consumer removes the name
        self.data = np.frombuffer(mm, np.uint8)
        self.state = self.data[:8].view(np.int64)
        self.capacity = len(mm) - _HEADER


class _Writer:
    """A worker's slabs for one run of a consumer."""

    def __init__(self, owner: int, run: str) -> None:
        self.owner, self.run, self.slabs = owner, run, []
        self.generation = 0
        self.closed = False  # the run ended: no new slab (set holding _naming)
        self.retired: list[tuple] = []  # slabs the consumer may unmap, told with the next result
        self.open: list[tuple[_Slab, int]] = []  # slabs lent to this task's arrays, generation
        self.sent: set[tuple] = set()  # of those, the (key, generation) that a result holds

    def lend(self, nbytes: int) -> tuple[_Slab, int] | None:
        """A free slab of at least ``nbytes``, reserved for an array that the running task
        makes; None if there is none. Only slabs that have carried a result are lent: their
        names are gone, so a lent slab that the task does not send leaves nothing in
        ``/dev/shm``. (The first results of a worker make its slabs, with a copy.)"""
        fitting = [slab for slab in self.slabs
                   if slab.unnamed and slab.state[0] == 0 and slab.capacity >= nbytes]
        if not fitting:
            return None
        slab = min(fitting, key=lambda slab: slab.capacity)
        self.generation += 1
        slab.state[0] = self.generation  # taken: slab_for passes it by
        self.open.append((slab, self.generation))
        return slab, self.generation

    def lent_slab(self, array: np.ndarray) -> tuple[_Slab, int, int] | None:
        """``(slab, offset, generation)`` if ``array`` lies whole in a slab lent to this task."""
        if not self.open or not array.flags.c_contiguous:
            return None
        start = array.__array_interface__["data"][0]
        for slab, generation in self.open:
            base = slab.data.__array_interface__["data"][0]
            if base + _HEADER <= start and start + array.nbytes <= base + len(slab.data):
                return slab, start - base, generation
        return None

    def close_task(self) -> None:
        """The task ended: its lent slabs whose arrays were not sent are free again."""
        for slab, generation in self.open:
            if (slab.key, generation) not in self.sent:
                slab.state[0] = 0
        self.open, self.sent = [], set()

    def slab_for(self, nbytes: int, budget: int, keep: int | None = None) -> _Slab | str:
        """A free slab of at least ``nbytes``, or why there is none (``"budget"``, ``"full"``).
        Free slabs are given up while the worker holds more than ``budget`` for the consumer
        (its runs share the budget, and may have different ones), or more than ``keep`` free
        ones besides the one it takes (a stage with a memory budget keeps one), or to make
        room."""
        free = sorted((slab for slab in self.slabs if slab.state[0] == 0),
                      key=lambda slab: slab.capacity)
        held = _held(self.owner)
        while free and held > budget:
            held -= self._retire(free.pop())
        while keep is not None and len(free) > keep + 1:
            held -= self._retire(free.pop(0))
        fitting = [slab for slab in free if slab.capacity >= nbytes]
        if fitting:
            return fitting[0]
        for slab in free:  # all too small for the results of now: keep none of them
            held -= self._retire(slab)
        # a little room to grow (chunks vary in size, and a new slab costs both sides its page
        # faults), but no more: a slab's pages are resident in both processes
        size = _HEADER + max(_MIN_SLAB, -(-(nbytes + min(nbytes, _ROOM)) // mmap.PAGESIZE)
                             * mmap.PAGESIZE)
        if held + size > budget:
            return "budget"
        return self._create(size)

    def _create(self, size: int) -> _Slab | str:
        with _naming:  # the watchdog must not exit between the name and the list of slabs
            if self.closed:  # the run ended while its last task ran: its result is not wanted
                return "budget"
            serial = next(_serials)
            name = _name(self.owner, serial)
            fd = os.open(os.path.join(DIRECTORY, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # reserve the pages now: a full tmpfs is
                mm = mmap.mmap(fd, size, flags=_FLAGS)  # ENOSPC, not a bus error later
            except OSError as error:
                _unlink(name)
                if error.errno in (errno.ENOSPC, errno.ENOMEM):
                    return "full"
                raise
            finally:
                os.close(fd)
            slab = _Slab((os.getpid(), serial, self.run), name, mm)
            self.slabs.append(slab)
            return slab

    def _retire(self, slab: _Slab) -> int:
        """Give ``slab`` up (the consumer hears of it with the next result); its size."""
        self.slabs.remove(slab)
        _unlink(slab.name)
        self.retired.append(slab.key)
        return len(slab.mm)

    def unlink_all(self) -> None:
        for slab in self.slabs:
            _unlink(slab.name)

    def run_ended(self) -> bool:
        """Whether the consumer ended this writer's run (a run's file is gone)."""
        return bool(self.run) and not os.path.exists(_run_path(self.owner, self.run))


_writers: dict[tuple[int, int, str], _Writer] = {}  # (this pid, owner, run) -> writer
_naming = threading.Lock()  # held while a slab is named and not yet listed, or writers dropped
_serials = itertools.count(1)  # of this process's slabs: a slab's key is (pid, serial, run)


def _writer(transport: Transport) -> _Writer:
    key = (os.getpid(), transport.owner, transport.run)
    writer = _writers.get(key)
    if writer is None:
        with _naming:
            writer = _writers[key] = _Writer(transport.owner, transport.run)
    return writer


def _held(owner: int) -> int:
    """Bytes of the slabs this worker holds for ``owner``, in all its runs."""
    return sum(len(slab.mm) for key, writer in list(_writers.items())
               if key[:2] == (os.getpid(), owner) for slab in writer.slabs)


def drop_ended_runs() -> None:
    """In a worker: let go of the slabs of the runs that their consumer ended (their names
    removed; the memory goes once no lent array of theirs is alive here either)."""
    with _naming:
        for key, writer in list(_writers.items()):
            if key[0] == os.getpid() and writer.run_ended():
                writer.closed = True
                writer.unlink_all()
                del _writers[key]


class _Ref:
    """An array on its way to a slab; pickles as the reference the consumer maps."""

    __slots__ = ("array", "kind", "offset", "slab", "generation", "retired")

    def __init__(self, array: np.ndarray, kind: str | None) -> None:
        self.array, self.kind = array, kind
        self.offset, self.slab, self.generation, self.retired = 0, None, 0, ()

    def __reduce__(self):
        array = self.array
        return _attach, (self.slab.key, self.slab.name, self.generation, self.offset,
                         array.dtype, array.shape, self.kind, self.retired)


def encode(transport: Transport, value: Any,
           dumps: Callable[[Any], bytes] | None = None) -> tuple[Any, str | None]:
    """``value`` with its large arrays moved to a slab, and None; or ``value`` unchanged and
    why it could not be (``"budget"`` or ``"full"``). In the consumer's own process (a thread
    backend), ``value`` stays as it is. With ``dumps``, what comes out is ``dumps`` of that
    value, and the slab is reserved for the result only once ``dumps`` returned (an error
    that it raises leaves the slabs free)."""
    if os.getpid() == transport.owner:
        return value, None
    dumps = dumps or _same
    refs: list[_Ref] = []
    swapped = _swap(value, refs, transport)
    if not refs:
        return dumps(value), None
    writer = _writer(transport)
    lent = [ref for ref in refs if _in_lent_slab(writer, ref)]
    copied = [ref for ref in refs if ref.slab is None]
    if copied:
        offsets, total = _layout(copied)
        slab = writer.slab_for(total, transport.budget, transport.keep)
        if isinstance(slab, str):
            return dumps(value), slab  # the lent slabs are freed when the task ends
        _fill(writer, slab, copied, offsets)
    refs[0].retired = tuple(writer.retired)
    sent = dumps(swapped)
    if copied:
        copied[0].slab.state[0] = copied[0].generation  # reserved until the consumer lets go
    writer.sent.update((ref.slab.key, ref.generation) for ref in lent)
    for ref in refs:
        ref.slab.unnamed = True  # the consumer removes the name when it maps the slab
    writer.retired = []
    return sent, None


def _same(value: Any) -> Any:
    return value


def _in_lent_slab(writer: _Writer, ref: _Ref) -> bool:
    """Point ``ref`` at its array's place if the array was made in a lent slab (no copy)."""
    place = writer.lent_slab(ref.array)
    if place is None:
        return False
    ref.slab, ref.offset, ref.generation = place
    return True


def _layout(refs: list[_Ref]) -> tuple[list[int], int]:
    offsets, end = [], 0
    for ref in refs:
        offsets.append(end)
        end += -(-ref.array.nbytes // _ALIGN) * _ALIGN
    return offsets, end


def _fill(writer: _Writer, slab: _Slab, refs: list[_Ref], offsets: list[int]) -> None:
    writer.generation += 1
    data = slab.data
    for ref, offset in zip(refs, offsets):
        array = ref.array
        start = _HEADER + offset
        target = data[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        np.copyto(target, array, casting="no")
        ref.slab, ref.offset, ref.generation = slab, start, writer.generation


def _swap(value: Any, refs: list, transport: Transport) -> Any:
    """``value`` with each large array replaced by a :class:`_Ref` (the same object where
    nothing inside it was)."""
    kind = type(value)
    if kind is np.ndarray:
        if value.nbytes >= transport.threshold and not value.dtype.hasobject:
            refs.append(ref := _Ref(value, None))
            return ref
        return value
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple or (isinstance(value, tuple) and hasattr(value, "_fields")):
        return _swap_sequence(value, refs, transport)
    if kind is dict:
        count = len(refs)
        items = {key: _swap(item, refs, transport) for key, item in value.items()}
        return items if len(refs) > count else value
    return _swap_registered(value, refs, transport)


_SCALARS = frozenset({int, float, str, bytes, bool, type(None), complex, bytearray})


def _swap_sequence(value: Any, refs: list, transport: Transport) -> Any:
    count = len(refs)
    items = [_swap(item, refs, transport) for item in value]
    if len(refs) == count:
        return value
    kind = type(value)
    if kind is list:
        return items
    return tuple(items) if kind is tuple else kind(*items)


def _swap_registered(value: Any, refs: list, transport: Transport) -> Any:
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    for registered, codec in transport.kinds:
        if registered == name:
            array = _codec(codec).to_array(value)
            if array is not None and array.nbytes >= transport.threshold:
                refs.append(ref := _Ref(array, codec))
                return ref
    return value


# --- arrays made in place by the task ----------------------------------------------------

_task: list[Transport] = []  # the transport of the task this worker runs, while it runs


@contextlib.contextmanager
def lending(transport: Transport | None) -> Iterator[None]:
    """While a worker runs a task (and encodes its outputs) for ``transport``, :func:`empty`
    lends it slabs; at the end, the lent slabs that no sent array lies in are free again.
    The slabs of the runs that ended are let go of first."""
    if transport is None or os.getpid() == transport.owner:
        yield
        return
    drop_ended_runs()
    _task.append(transport)
    try:
        yield
    finally:
        _task.pop()
        _writer(transport).close_task()


def empty(shape: Any, dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)``; in a process stage's worker whose results come back in
    shared memory, the array lies in a slab already, so returning it costs no copy."""
    dtype = np.dtype(dtype)
    transport = _task[-1] if _task else None
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if transport is None or nbytes < transport.threshold or dtype.hasobject:
        return np.empty(shape, dtype)
    lent = _writer(transport).lend(nbytes)
    if lent is None:
        return np.empty(shape, dtype)
    slab, _ = lent
    return slab.data[_HEADER:_HEADER + nbytes].view(dtype).reshape(shape)


# --- a worker whose consumer died --------------------------------------------------------

_watched: set[int] = set()


def watch_owner(owner: int) -> None:
    """In a worker whose parent is the consumer ``owner``: exit within about half a second
    of the consumer's death (its slabs' names removed first), instead of idling for minutes
    as an orphan; meanwhile, let go of the slabs of the runs that ended as soon as they do,
    not at the next task only."""
    if owner in _watched or os.getpid() == owner or os.getppid() != owner:
        return
    _watched.add(owner)
    threading.Thread(target=_watch, args=(owner,), name="fpipe-watch-owner", daemon=True).start()


def _watch(owner: int) -> None:
    while os.getppid() == owner:
        time.sleep(_WATCH_SECONDS)
        drop_ended_runs()
    _naming.acquire()  # held until the exit: no slab is named after this
    for key, writer in list(_writers.items()):
        if key[:2] == (os.getpid(), owner):
            writer.unlink_all()
            if writer.run:
                _unlink(os.path.basename(_run_path(owner, writer.run)))
    os._exit(0)


# --- the consumer's side ------------------------------------------------------------------


class _Lease:
    """The memory of one result in a slab; every array of the result keeps it alive (it is
    their ``base``), and the slab is free again once it is collected."""

    __slots__ = ("__array_interface__", "__weakref__", "slab")

    def __init__(self, slab: np.ndarray) -> None:
        self.slab = slab
        self.__array_interface__ = {"shape": slab.shape, "typestr": "|u1", "version": 3,
                                    "data": (slab.ctypes.data, False)}


def _release(state: np.ndarray, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child that inherited the arrays
        state[0] = 0


class _Reader:
    """The slabs this consumer has mapped for the runs that have not ended, and the leases
    now alive (a lease keeps its slab mapped, also once the reader has let go of it)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slabs: dict[tuple, np.ndarray] = {}  # (worker pid, serial, run) -> the slab
        self.runs: set[str] = {""}  # the runs that have not ended ("": slabs with no run)
        self.leases: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.lock = threading.RLock()  # a finalizer may end a run in a thread that holds it

    def lease(self, key: tuple, name: str, generation: int, retired: tuple) -> _Lease:
        with self.lock:
            for old in retired:
                self.slabs.pop(old, None)
            lease = self.leases.get((key, generation))
            if lease is None:
                slab = self.slabs.get(key)
                if slab is None:
                    slab = self._map(key, name)
                    if key[2] in self.runs:  # else a late result of a run that ended
                        self.slabs[key] = slab
                lease = self.leases[(key, generation)] = _Lease(slab)
                weakref.finalize(lease, _release, slab[:8].view(np.int64), self.pid)
            return lease

    def _map(self, key: tuple, name: str) -> np.ndarray:
        self._forget_dead()
        path = os.path.join(DIRECTORY, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise RuntimeError(f"the shared memory {path} of a worker's result is gone: was "
                               "it removed by hand, or does the worker run on another "
                               "machine? (processes(..., options=ParallelOptions(shared_memory=False)) "
                               "uses the pipe)"
                               ) from None
        try:
            mm = mmap.mmap(fd, os.fstat(fd).st_size, flags=_FLAGS)
        finally:
            os.close(fd)
        _unlink(name)  # mapped by both sides now: the kernel frees it when both are gone
        return np.frombuffer(mm, np.uint8)

    def _forget_dead(self) -> None:
        for key in [key for key in self.slabs if not _alive(key[0])]:
            del self.slabs[key]

    def forget_dead(self) -> None:
        with self.lock:
            self._forget_dead()

    def start_run(self, run: str) -> None:
        with self.lock:
            self.runs.add(run)

    def forget_run(self, run: str) -> None:
        """Let go of the slabs of ``run``: each is unmapped once no array views it."""
        with self.lock:
            self.runs.discard(run)
            for key in [key for key in self.slabs if key[2] == run]:
                del self.slabs[key]


_readers: dict[int, _Reader] = {}


def _reader() -> _Reader:
    reader = _readers.get(os.getpid())
    if reader is None:
        reader = _readers[os.getpid()] = _Reader()
    return reader


def _attach(key: tuple, name: str, generation: int, offset: int, dtype: np.dtype,
            shape: tuple, codec: str | None, retired: tuple) -> Any:
    """The array (or registered object) that a worker put in a slab, viewing it."""
    lease = _reader().lease(key, name, generation, retired)
    count = math.prod(shape)
    array = np.asarray(lease)[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)
    return array if codec is None else _codec(codec).from_array(array)


def is_shared(array: np.ndarray) -> bool:
    """Whether ``array`` views a slab (for tests and for users who wonder)."""
    base = getattr(array, "base", None)
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, _Lease)
