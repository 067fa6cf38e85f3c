"""An epoch order for datasets of any size: :class:`IndexShuffler`.

A :class:`~fpipe.orderings.order.Shuffler` draws its permutation whole, once an epoch: 4 bytes a
sample and about a second per million samples, in every process that reads the epoch. An
:class:`IndexShuffler` computes the sample at each position when the position is read, with a
keyed bijection of the indices (:class:`Permutation`), so an epoch of any length starts at
once, holds a few numbers, and resumes from its position alone:

>>> from fpipe.dataset import ListReader
>>> reader = ListReader([{"key": i} for i in range(10)])
>>> shuffler = IndexShuffler(reader, seed=0)
>>> sorted(s["key"] for s in shuffler) == list(range(10))
True
>>> shuffler.set_epoch(0)
>>> [s["key"] for s in shuffler.iter(3, 6)] == [s["key"] for s in shuffler][3:6]
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from fpipe.orderings.order import (
    BLOCK,
    IndexableOrdering,
    ReadOptions,
    SeededOrdering,
    prefetch_indices,
    random_access,
    source_getter,
)
from fpipe.random import Seed, order_keys

__all__ = ["IndexShuffler"]

ROUNDS = 8
# Up to this many samples the permutation is a table drawn by numpy (every order equally
# likely); a Feistel network over a power of two reaches even permutations of it only.
TABLE_MAX = 1 << 16
_MASK = (1 << 64) - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's finaliser
_NM1, _NM2 = np.uint64(_M1), np.uint64(_M2)


class Permutation:
    """A bijection of ``range(n)`` keyed by ``(seed, epoch)``: :meth:`index` gives the index at
    a position, :meth:`take` the indices at an array of positions, :meth:`positions` the
    inverse (where indices go). It holds a few numbers: the positions are computed.

    Above :data:`TABLE_MAX` it is a Feistel network of :data:`ROUNDS` rounds over the next
    power of two (at least 4) whose round function is SplitMix64's finaliser of the half plus
    a round key from ``fpipe.random.order_keys``, restricted to ``range(n)`` by cycle
    walking (a value at or past ``n`` goes through the network again; the power of two is less
    than ``2 n``, so less than two passes on average). Up to it, a table that numpy draws.

    >>> permutation = Permutation(100_000, seed=0, epoch=0)
    >>> order = permutation.take(np.arange(100_000))
    >>> bool((np.sort(order) == np.arange(100_000)).all()), permutation.index(5) == int(order[5])
    (True, True)
    >>> bool((permutation.positions(order) == np.arange(100_000)).all())
    True
    """

    __slots__ = ("_keys", "_left", "_right", "_table", "n")

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        self.n = n
        words = order_keys(seed, epoch, ROUNDS)
        self._keys = words.tolist()
        self._table = np.random.default_rng(words).permutation(n) if n <= TABLE_MAX else None
        bits = max(2, (n - 1).bit_length())
        self._left, self._right = bits // 2, bits - bits // 2

    def index(self, position: int) -> int:
        """The index at ``position`` (``0 <= position < n``), in pure Python: about as fast
        for one as numpy is for a block of 30."""
        if self._table is not None:
            return int(self._table[position])
        value = _network(position, self._keys, self._left, self._right)
        while value >= self.n:
            value = _network(value, self._keys, self._left, self._right)
        return value

    def take(self, positions: np.ndarray) -> np.ndarray:
        """The indices at ``positions`` (each in ``range(n)``), as int64."""
        if self._table is not None:
            return self._table[positions]
        return self._walk(np.asarray(positions, dtype=np.uint64), _forward)

    def positions(self, indices: np.ndarray) -> np.ndarray:
        """Where ``indices`` go: the positions whose indices they are (the inverse of
        :meth:`take`), as int64."""
        if self._table is not None:
            return np.argsort(self._table)[indices]
        return self._walk(np.asarray(indices, dtype=np.uint64), _backward)

    def _walk(self, values: np.ndarray, network: Callable) -> np.ndarray:
        keys, n = np.array(self._keys, dtype=np.uint64), np.uint64(self.n)
        values = network(values, keys, self._left, self._right)
        outside = np.flatnonzero(values >= n)
        while outside.size:
            values[outside] = network(values[outside], keys, self._left, self._right)
            outside = outside[values[outside] >= n]
        return values.astype(np.int64)


def _mixed(half: int, key: int) -> int:
    value = (half + key) & _MASK
    value = ((value ^ (value >> 30)) * _M1) & _MASK
    value = ((value ^ (value >> 27)) * _M2) & _MASK
    return value ^ (value >> 31)


def _network(value: int, keys: list, left_bits: int, right_bits: int) -> int:
    """One pass of the Feistel network over ``left_bits + right_bits`` bits: each round the
    halves trade places, the new right one xored with the round function of the new left one
    (so the halves trade sizes too, and an even number of rounds brings them back)."""
    left, right = value >> right_bits, value & ((1 << right_bits) - 1)
    for key in keys:
        left, right = right, left ^ (_mixed(right, key) & ((1 << left_bits) - 1))
        left_bits, right_bits = right_bits, left_bits
    return (left << right_bits) | right


def _mixed_array(half: np.ndarray, key: np.uint64) -> np.ndarray:
    value = half + key  # uint64 arrays wrap around, as the finaliser wants
    value ^= value >> np.uint64(30)
    value *= _NM1
    value ^= value >> np.uint64(27)
    value *= _NM2
    value ^= value >> np.uint64(31)
    return value


def _forward(values: np.ndarray, keys: np.ndarray, left_bits: int, right_bits: int) -> np.ndarray:
    """:func:`_network` of each of ``values``."""
    left, right = values >> np.uint64(right_bits), values & np.uint64((1 << right_bits) - 1)
    for key in keys:
        left, right = right, left ^ (_mixed_array(right, key) & np.uint64((1 << left_bits) - 1))
        left_bits, right_bits = right_bits, left_bits
    return (left << np.uint64(right_bits)) | right


def _backward(values: np.ndarray, keys: np.ndarray, left_bits: int, right_bits: int) -> np.ndarray:
    """The inverse of :func:`_forward`: the rounds undone, last first."""
    left, right = values >> np.uint64(right_bits), values & np.uint64((1 << right_bits) - 1)
    for key in keys[::-1]:
        # before this round the left half had right_bits bits and was the right half's key
        left, right = right ^ (_mixed_array(left, key) & np.uint64((1 << right_bits) - 1)), left
        left_bits, right_bits = right_bits, left_bits
    return (left << np.uint64(right_bits)) | right


class IndexShuffler(SeededOrdering, IndexableOrdering):
    """A true shuffle of ``reader`` per epoch for datasets of any size, read sample by sample
    with ``get``, that holds no permutation.

    Position ``k`` of epoch ``e`` reads the sample that a keyed bijection of the indices
    (:class:`Permutation`, keyed by ``(seed, e)``) maps it to, computed when ``k`` is read: an
    epoch starts at once, whatever its length, costs a few numbers of memory in every process
    and DataLoader worker, and a state's position is all it takes to resume. The order depends
    on ``(seed, e)`` and ``len(reader)`` alone, and is not datadings's: port with
    :class:`~fpipe.orderings.order.Shuffler`, which keeps it. ``seed=None`` draws fresh entropy,
    kept in ``seed``. The shufflers' page says which order to pick.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"key": i} for i in range(6)])
    >>> shuffler = IndexShuffler(reader, seed=3)
    >>> [shuffler.get(i) for i in range(6)] == list(shuffler)
    True
    >>> shuffler.state_dict()
    {'type': 'IndexShuffler', 'version': 1, 'length': 6, 'seed': 3, 'reader': None, 'epoch': 1, 'position': 0}
    """

    def __init__(self, reader: Any, seed: Seed = None) -> None:
        super().__init__(reader, seed)
        if not random_access(reader):
            raise TypeError(f"IndexShuffler needs a reader with random access (get); got "
                            f"reader={reader!r}")
        self._length = len(reader)

    def __len__(self) -> int:
        return self._length

    def _permutation(self, epoch: int) -> Permutation:
        return self._cached(epoch, lambda e: Permutation(self._length, self.seed, e))

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        get, permutation = source_getter(self.reader, epoch, options), self._permutation(epoch)
        ahead = permutation.take(np.arange(start, min(stop, start + BLOCK)))
        while len(ahead):
            block, high = ahead, start + len(ahead)
            ahead = permutation.take(np.arange(high, min(stop, high + BLOCK)))
            # the next block too, so that its first samples are on their way at a URL
            prefetch_indices(self.reader, np.concatenate((block, ahead)))
            yield from map(get, block.tolist())
            start = high

    def _getter(self, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
        get, permutation = source_getter(self.reader, epoch, options), self._permutation(epoch)
        return lambda index: get(permutation.index(index))

    def _random_access(self) -> bool:
        return True
