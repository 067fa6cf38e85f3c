"""Partitions of streams and of index ranges, for distributed ranks and data-loader workers.

Two forms cover the two kinds of input:

* :func:`shard` is a stage over any iterable: shard ``index`` of ``count`` takes every
  ``count``-th element, starting at element ``index``. It is lazy and needs no length.
* :func:`shard_range` splits ``range(n)`` into ``count`` contiguous pieces, for sized readers
  that read contiguous runs fastest; :func:`worker_range` splits it over ranks and their
  DataLoader workers (what :class:`fpipe.torch.IterableDataset` reads), without torch.
* :func:`elastic_batches` deals the batches of an epoch's order from a position on to ranks and
  workers, so that a run can stop on one grid and carry on on another;
  :func:`elastic_position` is where it stands after some batches.

Across all indices the shards partition their input: every element lands in exactly one shard,
order is kept within a shard, and shard sizes differ by at most one:

>>> [list(shard(i, 3)(range(8))) for i in range(3)]
[[0, 3, 6], [1, 4, 7], [2, 5]]
>>> [shard_range(8, i, 3) for i in range(3)]
[range(0, 3), range(3, 6), range(6, 8)]

Distributed ranks must see the same number of items, or a collective operation waits forever
for the rank that ran out. ``even="drop"`` cuts every shard to the shortest length and
``even="pad"`` fills the short ones up to the longest by repeating elements:

>>> [list(shard(i, 3, even="drop")(range(8))) for i in range(3)]
[[0, 3], [1, 4], [2, 5]]
>>> [list(shard(i, 3, even="pad")(range(8))) for i in range(3)]
[[0, 3, 6], [1, 4, 7], [2, 5, 0]]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any

from fpipe.errors import check_bool, check_choice, check_integer, check_state, state_header

__all__ = ["elastic_batches", "elastic_position", "loader_batches", "loader_length", "shard",
           "shard_range", "worker_range"]

_EVEN = (None, "drop", "pad")
_ROUNDING = ("balanced", "datadings")


def check_even(even: Any) -> str | None:
    """``even``, once it is one of the choices of ``even=``: None, ``"drop"`` or ``"pad"``.
    Not in ``__all__``: the torch adapters check their ``even=`` with it."""
    return check_choice("even", even, _EVEN)


def _check_shard(index: Any, count: Any, even: Any) -> tuple[int, int]:
    count = check_integer("count", count)
    index = check_integer("index", index)
    if count < 1:
        raise ValueError(f"count must be >= 1; got count={count}")
    if not 0 <= index < count:
        raise ValueError(f"index must be in [0, count); got index={index} with count={count}")
    check_even(even)
    return index, count


class _Shard:
    """The stage that :func:`shard` returns (a class, so that it pickles)."""

    __slots__ = ("count", "even", "index")

    def __init__(self, index: int, count: int, even: str | None) -> None:
        self.index, self.count, self.even = index, count, even

    def __call__(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return _closing(iter(iterable), self._select)

    def _select(self, iterator: Iterator[Any]) -> Iterator[Any]:
        if self.even is None:
            return itertools.islice(iterator, self.index, None, self.count)
        if self.even == "drop":
            # zip stops at the first incomplete round, which is exactly what is dropped
            return map(itemgetter(self.index), zip(*[iterator] * self.count))
        return _padded(iterator, self.index, self.count)

    def __reduce__(self):
        return _Shard, (self.index, self.count, self.even)

    def __repr__(self) -> str:
        even = "" if self.even is None else f", even={self.even!r}"
        return f"shard({self.index}, {self.count}{even})"


def _closing(upstream: Iterator[Any], select) -> Iterator[Any]:
    # a generator, so that closing the shard closes its upstream (house rule 1)
    try:
        yield from select(upstream)
    finally:
        close = getattr(upstream, "close", None)
        if close is not None:
            close()


def _padded(iterator: Iterator[Any], index: int, count: int) -> Iterator[Any]:
    # The padded stream is ``xs + xs[:pad]`` (cycled when pad > len(xs)), as in torch's
    # DistributedSampler; only the first round is needed to build the pad.
    head: tuple = ()
    seen = 0
    while True:
        group = tuple(itertools.islice(iterator, count))
        if not group:
            return
        head = head or group
        seen += len(group)
        if index < len(group):
            yield group[index]
        else:
            yield head[(index - len(group)) % seen]
        if len(group) < count:
            return


def shard(index: int, count: int, even: str | None = None) -> _Shard:
    """The stage that keeps shard ``index`` of ``count`` of a stream: every ``count``-th element,
    starting at element ``index``.

    ``even=None`` keeps all elements, so shard sizes differ by at most one; ``"drop"`` drops
    the incomplete last round, so that every shard has ``len // count`` elements; ``"pad"``
    completes the last round by starting over from the first elements, so that every shard has
    ``ceil(len / count)`` elements (as torch's ``DistributedSampler`` pads). The stage reads
    lazily and holds at most one round of ``count`` elements; closing it closes its input.

    Sharding twice is sharding once with the strides multiplied:
    ``shard(j, b)(shard(i, a)(xs)) == shard(i + a * j, a * b)(xs)``.

    >>> list(shard(1, 4)("abcdefghij"))
    ['b', 'f', 'j']
    >>> list(shard(3, 4, even="pad")("abcdefghij"))
    ['d', 'h', 'b']
    >>> shard(4, 4)
    Traceback (most recent call last):
    ...
    ValueError: index must be in [0, count); got index=4 with count=4
    """
    index, count = _check_shard(index, count, even)
    return _Shard(index, count, even)


def _bounds(n: int, index: int, count: int, rounding: str) -> tuple[int, int]:
    if rounding == "balanced":
        size, extra = divmod(n, count)
        start = index * size + min(index, extra)
        return start, start + size + (index < extra)
    # datadings' IterableDataset: round-half-even of the float n / count times the index,
    # with the last shard ending at n; computed the same way so the bounds agree bit for bit
    step = n / count
    start = max(0, round(step * index))
    stop = n if index + 1 == count else min(n, round(step * (index + 1)))
    return start, stop


def shard_range(n: int, index: int, count: int, *, even: str | None = None,
                rounding: str = "balanced") -> range:
    """The contiguous range of indices that shard ``index`` of ``count`` takes of ``range(n)``.

    ``rounding="balanced"`` gives the first ``n % count`` shards one index more than the rest
    (like :func:`numpy.array_split`); ``rounding="datadings"`` gives datadings'
    ``IterableDataset`` bounds ``[round(n / count * index), round(n / count * (index + 1)))``
    (round half to even, the last shard ending at ``n``). Both partition ``range(n)`` into
    pieces whose sizes differ by at most one.

    ``even="drop"`` keeps the first ``n // count`` indices of each shard; ``even="pad"`` widens
    a short shard to ``ceil(n / count)`` indices by taking in its neighbour's (the range ending
    at its stop, or starting at 0). Either way the result stays a contiguous range in
    ``[0, n)``, ready for ``reader.iter(r.start, r.stop)``.

    >>> [shard_range(10, i, 4) for i in range(4)]
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    >>> [shard_range(10, i, 4, rounding="datadings") for i in range(4)]
    [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    >>> [shard_range(10, i, 4, even="pad") for i in range(4)]
    [range(0, 3), range(3, 6), range(5, 8), range(7, 10)]
    >>> shard_range(10, 0, 0)
    Traceback (most recent call last):
    ...
    ValueError: count must be >= 1; got count=0
    """
    n = check_integer("n", n, 0)
    index, count = _check_shard(index, count, even)
    check_choice("rounding", rounding, _ROUNDING)
    start, stop = _bounds(n, index, count, rounding)
    if even == "drop":
        return range(start, start + n // count)
    if even == "pad":
        low = max(0, stop - math.ceil(n / count))
        return range(low, low + math.ceil(n / count))
    return range(start, stop)


# --- DataLoader workers: their ranges, and where a resumed loader stands -----------------


def _round_half_even(numerator: int, denominator: int) -> int:
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    return quotient + (twice > denominator or (twice == denominator and quotient & 1))


def worker_range(n: int, rank: int = 0, world_size: int = 1, worker: int = 0,
                 num_workers: int = 1, epoch: int = 0, even: str | None = None,
                 batch_size: int | None = None) -> range:
    """The positions that DataLoader worker ``worker`` of rank ``rank`` reads in ``epoch``.

    ``range(n)`` is cut into ``S = world_size * num_workers`` contiguous shards as datadings
    cuts it, shard ``j`` being ``[n·j/S, n·(j+1)/S)`` rounded half to even (in exact integer
    arithmetic, so a rank's shards join up to the same range for any ``num_workers``). Ranks
    rotate with the epoch: rank ``r`` reads the shards of rank ``(r + epoch) % world_size``.

    ``even="drop"`` or ``"pad"`` first cuts or pads each rank's range to ``n // world_size``
    or ``ceil(n / world_size)`` positions (see :func:`fpipe.sharding.shard_range`), then splits it among
    the workers, so that every rank reads the same number of samples in the same pieces and
    makes the same number of batches.

    ``batch_size`` (the DataLoader's) splits a rank's range among its workers on whole batches
    instead: the range is cut into batches (the last may be short), and worker ``w`` takes
    batches ``[b·w/W, b·(w+1)/W)`` of the ``b``, rounded half to even. So only one worker
    ends on a short batch, and the workers together make ``ceil(len / batch_size)`` batches (or
    ``len // batch_size`` without the short one) — what ``len(DataLoader)`` computes from the
    rank's length, whatever ``num_workers`` (:func:`loader_batches` counts them). The rank's
    range is the same with and without ``batch_size``.

    >>> [worker_range(10, r, 2, w, 2) for r in range(2) for w in range(2)]
    [range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    >>> [worker_range(10, r, 2, w, 2, epoch=1) for r in range(2) for w in range(2)]
    [range(5, 8), range(8, 10), range(0, 2), range(2, 5)]
    >>> [worker_range(11, r, 2, w, 2, even="drop") for r in range(2) for w in range(2)]
    [range(0, 2), range(2, 5), range(6, 8), range(8, 11)]
    >>> [worker_range(10, 0, 1, w, 3, batch_size=3) for w in range(3)]   # batches 3 3 3 1
    [range(0, 3), range(3, 9), range(9, 10)]
    """
    n = check_integer("n", n, 0)
    world_size = check_integer("world_size", world_size, 1)
    num_workers = check_integer("num_workers", num_workers, 1)
    rank, worker = check_integer("rank", rank, 0), check_integer("worker", worker, 0)
    if rank >= world_size or worker >= num_workers:
        raise ValueError(f"need rank < world_size and worker < num_workers; got rank={rank}, "
                         f"world_size={world_size}, worker={worker}, num_workers={num_workers}")
    check_even(even)
    batch_size = None if batch_size is None else check_integer("batch_size", batch_size, 1)
    slot = (rank + check_integer("epoch", epoch, 0)) % world_size
    if even is None and batch_size is None:
        shards, shard = world_size * num_workers, slot * num_workers + worker
        return range(_round_half_even(n * shard, shards), _round_half_even(n * (shard + 1), shards))
    if even is None:  # the rank's block of the shards above
        outer = range(_round_half_even(n * slot, world_size), _round_half_even(n * (slot + 1), world_size))
    else:
        outer = shard_range(n, slot, world_size, even=even, rounding="datadings")
    return _split(outer, worker, num_workers, batch_size or 1)


def _split(outer: range, worker: int, num_workers: int, unit: int) -> range:
    """Piece ``worker`` of ``num_workers`` of ``outer``, cut between units of ``unit``
    positions (the last unit may be short)."""
    units = -(-len(outer) // unit)
    start, stop = (outer.start + unit * _round_half_even(units * w, num_workers)
                   for w in (worker, worker + 1))
    return range(min(start, outer.stop), min(stop, outer.stop))


def loader_batches(lengths: Iterable[int], batch_size: int, drop_last: bool = False) -> int:
    """How many batches a DataLoader makes of workers that yield ``lengths`` samples each:
    every worker batches its own samples, so each may end on a short batch (dropped with
    ``drop_last``).

    >>> loader_batches([5, 5], 4), loader_batches([8, 2], 4), loader_batches([5, 5], 4, drop_last=True)
    (4, 3, 2)
    """
    batch_size = check_integer("batch_size", batch_size, 1)
    if check_bool("drop_last", drop_last):
        return sum(length // batch_size for length in lengths)
    return sum(-(-length // batch_size) for length in lengths)


def loader_length(lengths: list[int], batch_size: int, drop_last: bool = False) -> int:
    """The length a dataset whose workers yield ``lengths`` samples each reports to a
    DataLoader, so that the DataLoader's ``len`` — the length divided by its batch size, as if
    one worker batched every sample — is the number of batches the workers make
    (:func:`loader_batches`): the number of samples where that division is already exact, else
    that number of batches times ``batch_size``.

    >>> loader_length([5, 5], 4), loader_length([8, 2], 4)   # 4 batches, not ceil(10 / 4) = 3
    (16, 10)
    """
    batches = loader_batches(lengths, batch_size, drop_last)
    total = sum(lengths)
    exact = total // batch_size if drop_last else -(-total // batch_size)
    return total if exact == batches else batches * batch_size


def resume_plan(counts: list[int], done: int) -> tuple[list[int], int]:
    """How many of its ``counts[w]`` batches each worker ``w`` has made when a DataLoader has
    handed out ``done`` batches, and which worker's batch comes next (0 once all are out).

    The DataLoader takes one batch from each worker in turn, passing over the workers that
    have run out. ``done`` past the end counts as the end.
    """
    rounds = _full_rounds(counts, done)
    made = [min(count, rounds) for count in counts]
    # the workers with a batch in the round under way, in the order they hand it out
    behind = [worker for worker, count in enumerate(counts) if count > rounds]
    extra = min(done, sum(counts)) - sum(made)
    for worker in behind[:extra]:
        made[worker] += 1
    return made, behind[extra] if extra < len(behind) else 0


def _full_rounds(counts: list[int], done: int) -> int:
    """The most rounds (one batch from each worker that has one left) within ``done`` batches."""
    low, high = 0, max(counts, default=0)
    while low < high:
        middle = (low + high + 1) // 2
        if sum(min(count, middle) for count in counts) <= done:
            low = middle
        else:
            high = middle - 1
    return low


# --- elastic layout: an epoch's order dealt out in global batches, from any position ----------


def _check_elastic(n: Any, position: Any, batch_size: Any, world_size: Any) -> tuple[int, int, int, int]:
    n, position = check_integer("n", n, 0), check_integer("position", position, 0)
    if position > n:
        raise ValueError(f"position must be in [0, n]; got position={position} with n={n}")
    return n, position, check_integer("batch_size", batch_size, 1), check_integer("world_size", world_size, 1)


def elastic_position(n: int, position: int, batches: int, batch_size: int, world_size: int = 1) -> int:
    """Where the epoch's order stands after every rank of ``world_size`` made ``batches`` more
    batches of :func:`elastic_batches` from ``position`` on: each step takes one global batch of
    ``world_size * batch_size`` samples, and the step that takes the last (short) batches ends
    the epoch, at ``n``.

    >>> elastic_position(100, 0, 3, batch_size=4, world_size=2)
    24
    >>> elastic_position(100, 96, 1, batch_size=4, world_size=2)   # the short last step
    100
    """
    n, position, batch_size, world_size = _check_elastic(n, position, batch_size, world_size)
    return min(n, position + check_integer("batches", batches, 0) * batch_size * world_size)


def elastic_batches(n: int, position: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    worker: int = 0, num_workers: int = 1, even: str | None = None) -> Iterator[range]:
    """The batches that DataLoader worker ``worker`` of rank ``rank`` makes of an epoch whose
    first ``position`` samples (in the epoch's order, ``0 .. n-1``) are done: ranges of
    positions in that order.

    The rest of the epoch is dealt out in global batches of ``world_size * batch_size``
    samples: rank ``r`` takes the ``r``-th run of ``batch_size`` positions of each, so global
    step ``t`` takes positions ``position + t·G`` to ``position + (t+1)·G``, whatever the grid.
    What is left at the end, fewer than ``G``, is split among the ranks: ``even=None`` in
    pieces that differ by at most one sample (a rank may get none), ``"drop"`` into equal
    pieces, dropping fewer than ``world_size`` samples, ``"pad"`` into equal pieces that run
    past ``n``, where position ``p`` stands for ``p % n`` (the epoch's first samples again).
    Within a rank, batch ``t`` belongs to worker ``t % num_workers``, so a DataLoader taking one
    batch from each worker in turn hands out the rank's batches in order.

    So a run stopped after any number of steps, at ``elastic_position(...)``, carries on on any
    other grid from there: the samples before and after the switch make the epoch, each once.

    >>> [list(elastic_batches(10, 0, 2, rank=r, world_size=2)) for r in range(2)]
    [[range(0, 2), range(4, 6), range(8, 9)], [range(2, 4), range(6, 8), range(9, 10)]]
    >>> [list(elastic_batches(10, 4, 3, worker=w, num_workers=2)) for w in range(2)]
    [[range(4, 7)], [range(7, 10)]]
    >>> [list(elastic_batches(10, 8, 2, rank=r, world_size=3, even="pad")) for r in range(3)]
    [[range(8, 9)], [range(9, 10)], [range(10, 11)]]
    """
    n, position, batch_size, world_size = _check_elastic(n, position, batch_size, world_size)
    check_even(even)
    _check_member("rank", rank, "world_size", world_size)
    _check_member("worker", worker, "num_workers", check_integer("num_workers", num_workers, 1))
    return _elastic(n, position, batch_size, rank, world_size, even, range(worker, _count(
        n, position, batch_size, rank, world_size, even), num_workers))


def _check_member(name: str, value: Any, count_name: str, count: int) -> int:
    value = check_integer(name, value, 0)
    if value >= count:
        raise ValueError(f"{name} must be < {count_name}; got {name}={value} with {count_name}={count}")
    return value


def _tail(n: int, base: int, batch_size: int, rank: int, world_size: int, even: str | None) -> range:
    """Rank ``rank``'s piece of what is left from ``base`` on, fewer than a global batch."""
    left = n - base
    if even is None:
        piece = shard_range(left, rank, world_size)
        return range(base + piece.start, base + piece.stop)
    size = left // world_size if even == "drop" else -(-left // world_size)
    return range(base + rank * size, base + (rank + 1) * size)


def _count(n: int, position: int, batch_size: int, rank: int, world_size: int, even: str | None) -> int:
    full = (n - position) // (batch_size * world_size)
    base = position + full * batch_size * world_size
    return full + bool(_tail(n, base, batch_size, rank, world_size, even))


def _elastic(n: int, position: int, batch_size: int, rank: int, world_size: int, even: str | None,
             steps: range) -> Iterator[range]:
    step_size = batch_size * world_size
    full = (n - position) // step_size
    for step in steps:
        start = position + step * step_size
        if step < full:
            yield range(start + rank * batch_size, start + (rank + 1) * batch_size)
        else:
            yield _tail(n, start, batch_size, rank, world_size, even)


ELASTIC_STATE = "ElasticEpoch"  # the type of the states of an elastic layout


def elastic_state_dict(epoch: int, position: int, n: int) -> dict[str, Any]:
    """The state of an elastic epoch ``epoch`` of ``n`` samples whose first ``position`` are
    done, as the torch adapters save it (not in ``__all__``).

    >>> elastic_state_dict(1, 96, 256)
    {'type': 'ElasticEpoch', 'version': 1, 'length': 256, 'epoch': 1, 'position': 96}
    """
    return {**state_header(ELASTIC_STATE), "length": n, "epoch": epoch, "position": position}


def elastic_state(state: Any, n: int) -> tuple[int, int]:
    """The epoch and position of an elastic ``state`` for a dataset of ``n`` samples, once
    it is one (a state of fpipe 0.1.0, without type and version, too)."""
    check_state(state, ELASTIC_STATE, ("epoch", "position"), {"length": n},
                old_keys=("epoch", "position", "length"))
    position = check_integer("state['position']", state["position"], 0)
    if position > n:
        raise ValueError(f"state['position'] must be at most the length {n}; got {position}")
    return check_integer("state['epoch']", state["epoch"], 0), position


def loaded_state_stands(loaded: tuple[int, int] | None, epoch: int, n: int) -> bool:
    """Whether a loaded elastic state, ``(epoch, position)`` of ``n``, that no pass has begun
    to read yet, still stands when ``set_epoch(epoch)`` is called: the one rule of the torch
    adapters (not in ``__all__``).

    The state's own epoch keeps it, so a loop that calls ``set_epoch`` at the start of every
    epoch, the resumed one too, finishes that epoch. The next epoch, after a state at the end of
    its epoch, finds nothing left of it: the state is done, and the epoch begins whole. Any
    other epoch would drop what the state has left, or read it in another epoch's order: a
    ``ValueError``.

    >>> loaded_state_stands((1, 16), 1, 40), loaded_state_stands((1, 40), 2, 40)
    (True, False)
    >>> loaded_state_stands((1, 16), 2, 40)
    Traceback (most recent call last):
    ...
    ValueError: set_epoch(2) after load_state_dict() of a state of epoch 1 at position 16 of 40, \
before a pass has read it: epoch 1 has 24 samples left; call set_epoch(1) (or nothing) to \
finish it, or load a state of epoch 2
    """
    if loaded is None:
        return False
    saved, position = loaded
    if epoch == saved:
        return True
    if epoch == saved + 1 and position >= n:
        return False
    advice = (f"call set_epoch({saved + 1}): it is done" if position >= n else
              f"epoch {saved} has {n - position} samples left; call set_epoch({saved}) (or "
              f"nothing) to finish it")
    raise ValueError(f"set_epoch({epoch}) after load_state_dict() of a state of epoch {saved} at "
                     f"position {position} of {n}, before a pass has read it: {advice}, or "
                     f"load a state of epoch {epoch}")


def wrapped_runs(batch: range, n: int) -> Iterator[range]:
    """The runs of positions in ``[0, n)`` that ``batch`` stands for, position ``p`` being
    ``p % n`` (a padded batch runs past the end of the epoch's order)."""
    start = batch.start
    while start < batch.stop:
        offset = start % n
        stop = min(batch.stop, start + n - offset)
        yield range(offset, offset + stop - start)
        start = stop
