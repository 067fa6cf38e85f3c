"""Partitions of streams and of index ranges, for distributed ranks and data-loader workers.

Two forms cover the two kinds of input:

* :func:`shard` is a stage over any iterable: shard ``index`` of ``count`` takes every
  ``count``-th element, starting at element ``index``. It is lazy and needs no length.
* :func:`shard_range` splits ``range(n)`` into ``count`` contiguous pieces, for sized readers
  that read contiguous runs fastest.

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

from .errors import check_integer

__all__ = ["shard", "shard_range"]

_EVEN = (None, "drop", "pad")
_ROUNDING = ("balanced", "datadings")


def _check_integer(name: str, value: Any) -> int:
    try:
        return check_integer(name, value)
    except TypeError as error:
        # ValueError like every other bad shard argument, so one except clause catches them all
        raise ValueError(str(error)) from None


def _check_shard(index: Any, count: Any, even: Any) -> tuple[int, int]:
    count = _check_integer("count", count)
    index = _check_integer("index", index)
    if count < 1:
        raise ValueError(f"count must be >= 1; got count={count}")
    if not 0 <= index < count:
        raise ValueError(f"index must be in [0, count); got index={index} with count={count}")
    if even not in _EVEN:
        raise ValueError(f"even must be None, 'drop' or 'pad'; got even={even!r}")
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
    n = _check_integer("n", n)
    if n < 0:
        raise ValueError(f"n must be >= 0; got n={n}")
    index, count = _check_shard(index, count, even)
    if rounding not in _ROUNDING:
        raise ValueError(f"rounding must be 'balanced' or 'datadings'; got rounding={rounding!r}")
    start, stop = _bounds(n, index, count, rounding)
    if even == "drop":
        return range(start, start + n // count)
    if even == "pad":
        low = max(0, stop - math.ceil(n / count))
        return range(low, low + math.ceil(n / count))
    return range(start, stop)
