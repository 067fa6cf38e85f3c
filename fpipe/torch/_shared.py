"""What the torch adapters keep in shared memory, so that every copy of a dataset in the
DataLoader's workers sees it: the epoch clock (epochs, resumes, the pass under way) and the
board of skipped samples. Private: :mod:`fpipe.torch` uses it, and imports torch; this module
imports torch only where it makes a tensor.

>>> clock = EpochClock(3)
>>> clock.peek(0), clock.base
((3, None), 3)
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

__all__ = ["EpochClock", "Resume", "SkipBoard", "current_worker"]

# Pass counters kept in shared memory: one per DataLoader worker id below this bound.
_SLOTS = 1024
# where the clock's tensor keeps the pending-resume flags (one per worker id), the resume, the
# latest pass begun (whether there is one since the epoch or resume was set, its epoch and
# its elastic position), how many passes of it are under way, and whether the resume is a
# loaded state
_PENDING, _RESUME = _SLOTS + 1, 2 * _SLOTS + 1
_LATEST = _RESUME + 4
_RUNNING, _LOADED = _LATEST + 3, _LATEST + 4
# per worker id, the items the latest elastic pass handed out, then the number of workers of
# the latest pass and whether a pass was read by something other than the DataLoader itself
_HANDED = _LOADED + 1
_WORKERS, _WRAPPED = _HANDED + _SLOTS, _HANDED + _SLOTS + 1
_KEPT_INDICES = 32  # indices of skipped samples recorded per worker id (the count is exact)
_ADDING = threading.Lock()  # the threads of one process add their skips in turn


class Resume(NamedTuple):
    """Where the next pass of a worker begins: after ``batches`` batches of ``batch_size``
    (a DataLoader's, with ``drop_last``), or at ``position`` of an elastic epoch."""

    batches: int
    batch_size: int
    drop_last: int
    position: int  # where an elastic pass begins in the epoch's order


def current_worker() -> tuple[int, int]:
    """The DataLoader worker id of this process and the number of workers; ``(0, 1)``
    outside a worker."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class EpochClock:
    """The epoch of a dataset, shared with every copy of it in DataLoader workers.

    One shared-memory tensor holds the epoch last set, per worker id the number of passes
    begun since and whether a resumed pass is pending, the resume (batches, batch size,
    drop_last, elastic position), the epoch and position of the latest pass begun, how many
    workers' elastic passes are under way, and whether the resume is a loaded state. Forked
    workers inherit it and spawned ones receive it (torch shares tensors when it pickles a
    worker's arguments), so ``set_epoch`` and ``resume`` in the main process reach persistent
    workers too; a plain ``pickle`` copies it instead.
    """

    __slots__ = ("_counts", "_tensor")

    def __init__(self, epoch: int, tensor: torch.Tensor | None = None) -> None:
        if tensor is None:
            import torch

            tensor = torch.zeros(_WRAPPED + 1, dtype=torch.int64)
            tensor[0] = epoch
            tensor.share_memory_()
        self._tensor, self._counts = tensor, tensor.numpy()

    def __reduce__(self):
        return EpochClock, (0, self._tensor)

    def set(self, epoch: int) -> None:
        self._counts[1:_PENDING] = 0
        self._counts[_LATEST] = self._counts[_RUNNING] = 0
        self._counts[0] = epoch

    def adopt(self, slot: int, epoch: int, position: int) -> None:
        """Make the pass under way in worker ``slot`` one of ``epoch`` (a loaded pass state's)
        from elastic ``position``: that worker's next pass reads the epoch after it."""
        self._counts[slot + 1] = epoch + 1 - self._counts[0]
        self._counts[_LATEST:_RUNNING] = 1, epoch, position

    def handed(self, slot: int) -> None:
        """Count one more item handed out by the elastic pass of worker ``slot``."""
        self._counts[_HANDED + slot] += 1

    def wrapped(self) -> None:
        """Record that a pass is read by something other than the DataLoader's own fetcher
        (a dataset of the user's around this one): the DataLoader's batches do not count its
        samples."""
        self._counts[_WRAPPED] = 1

    def handed_out(self) -> tuple[list[int], bool]:
        """The items each worker of the latest elastic pass handed out, and whether a pass was
        read by something other than the DataLoader (see :meth:`wrapped`)."""
        counts = self._counts
        workers = max(1, int(counts[_WORKERS]))
        return counts[_HANDED:_HANDED + workers].tolist(), bool(counts[_WRAPPED])

    def drop_resume(self) -> None:
        """Make the next passes whole again."""
        self._counts[_PENDING:_RESUME] = 0
        self._counts[_LOADED] = 0

    @property
    def base(self) -> int:
        return int(self._counts[0])

    def resume(self, batches: int, batch_size: int, drop_last: bool, position: int = 0,
               loaded: bool = False) -> None:
        """Make the next pass of every worker id a resumed one; ``loaded``: the resume of a
        loaded elastic state (of the epoch set)."""
        self._counts[_RESUME:_LATEST] = batches, batch_size, drop_last, position
        self._counts[_PENDING:_RESUME] = 1
        self._counts[_LATEST] = self._counts[_RUNNING] = 0
        self._counts[_LOADED] = loaded

    def loaded(self) -> tuple[int, int] | None:
        """The epoch and position of a loaded elastic state that no pass has begun to read."""
        counts = self._counts
        if not (counts[_LOADED] and counts[_PENDING:_RESUME].any()):
            return None
        return int(counts[0]), int(counts[_RESUME + 3])

    def peek(self, slot: int) -> tuple[int, Resume | None]:
        """The epoch of the next pass of worker ``slot``, and its resume if it has one."""
        if slot >= _SLOTS:
            raise RuntimeError(f"fpipe datasets support at most {_SLOTS} DataLoader workers; "
                               f"got worker id {slot}")
        counts = self._counts
        resume = Resume(*counts[_RESUME:_LATEST].tolist()) if counts[_PENDING + slot] else None
        return int(counts[0] + counts[slot + 1]), resume

    def begin(self, slot: int, workers: int) -> tuple[int, Resume | None]:
        """Begin a pass of worker ``slot`` of ``workers``: its epoch and resume. Worker ids
        from ``workers`` on take no part in it, so their pending resumes go."""
        epoch, resume = self.peek(slot)
        self._counts[slot + 1] += 1
        self._counts[_PENDING + slot] = 0
        self._counts[_PENDING + workers:_RESUME] = 0
        self._counts[_LATEST:_RUNNING] = 1, epoch, 0 if resume is None else resume.position
        self._counts[_HANDED + slot] = 0
        self._counts[_WORKERS] = workers
        return epoch, resume

    def latest(self) -> tuple[int, int]:
        """The epoch and elastic position of the latest pass begun since the epoch or the resume
        was set; if none has begun, of the next pass of this process."""
        counts = self._counts
        if counts[_LATEST]:
            return int(counts[_LATEST + 1]), int(counts[_LATEST + 2])
        epoch, resume = self.peek(0)
        return epoch, 0 if resume is None else resume.position

    def under_way(self, passes: int) -> None:
        """Count ``passes`` (1 or -1) more elastic passes of a worker as under way."""
        self._counts[_RUNNING] = max(0, int(self._counts[_RUNNING]) + passes)

    def running(self) -> int | None:
        """The elastic position of the pass under way (in some worker), or None."""
        counts = self._counts
        return int(counts[_LATEST + 2]) if counts[_LATEST] and counts[_RUNNING] else None


class SkipBoard:
    """The samples a dataset skipped (``on_error``), counted in shared memory like the epoch:
    per worker id, a count of the skips and the first distinct indices, so that the main
    process sees what every DataLoader worker skipped and ``max_errors`` holds across them.
    A row is ``[skips, distinct indices kept, index, index, ...]``."""

    __slots__ = ("_rows", "_tensor")

    def __init__(self, tensor: torch.Tensor | None = None) -> None:
        if tensor is None:
            import torch

            tensor = torch.zeros((_SLOTS, 2 + _KEPT_INDICES), dtype=torch.int64).share_memory_()
        self._tensor, self._rows = tensor, tensor.numpy()

    def __reduce__(self):
        return SkipBoard, (self._tensor,)

    def add(self, index: int) -> int:
        """Record sample ``index`` as skipped by this worker; the count over every worker."""
        row = self._rows[current_worker()[0]]
        with _ADDING:  # a worker's transforms may run in threads (Samples(n_threads=...))
            kept = row[1]
            if kept < _KEPT_INDICES and index not in row[2:2 + kept]:  # once, whatever the epochs
                row[2 + kept] = index
                row[1] += 1
            row[0] += 1
        return self.count

    @property
    def count(self) -> int:
        return int(self._rows[:, 0].sum())

    @property
    def indices(self) -> list[int]:
        return sorted({int(i) for row in self._rows for i in row[2:2 + row[1]]})
