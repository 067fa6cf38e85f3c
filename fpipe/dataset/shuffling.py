"""Shuffles that follow what random access costs: :class:`BlockShuffler`, which walks the
blocks of a reader that decodes a block at a time (the row groups of Parquet, the record
batches of Arrow), and :func:`shuffled_shard`, the shuffle of a shard that picks the order
for the reader: the torch adapters' ``shuffle=True``.

A reader says what its random access costs with ``blocks`` (see
:class:`~fpipe.dataset.base.Reader`): None when a sample costs the same wherever it is read,
else the bounds of the blocks that decode as a whole. :func:`block_bounds` finds them through
the windows that wrap a reader.

>>> import numpy as np
>>> from fpipe.dataset import ListReader
>>> class Blocked(ListReader):                       # blocks of 4 samples
...     blocks = np.array([0, 4, 8, 10])
>>> shuffler = BlockShuffler(Blocked([{"key": i} for i in range(10)]), blocks_held=2, seed=0)
>>> sorted(s["key"] for s in shuffler) == list(range(10))
True
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from fpipe.dataset.base import HeldRows
from fpipe.errors import check_integer
from fpipe.orderings.order import (
    Indexed,
    QuasiShuffler,
    Range,
    ReadOptions,
    SeededOrdering,
    buffer_samples,
    prefetch_indices,
    random_access,
    read_source,
)
from fpipe.orderings.permutation import IndexShuffler
from fpipe.random import Seed

__all__ = ["BlockShuffler", "block_bounds", "shuffled_shard"]

# the third number of the spawn keys of the block walk's draws: no other draw's (an item's
# generator has 2 numbers, a shard's seed ends in 1, an IndexShuffler's round keys in 2)
_WALK = 3
_TAKE = 1024  # samples made from the held blocks at a time


def block_bounds(source: Any) -> np.ndarray | None:
    """The bounds of the blocks of ``source`` (a reader, or windows of one: :class:`Range`,
    :class:`Indexed`), in its own positions, or None when its reader has none (its random
    access costs the same everywhere). Blocks cut by a window's edges become the pieces inside
    it; the bounds run from 0 to ``len(source)``, without empty blocks.

    >>> from fpipe.dataset import ListReader
    >>> from fpipe.orderings import Range
    >>> class Blocked(ListReader):
    ...     blocks = np.array([0, 4, 8, 10])
    >>> reader = Blocked([{"key": i} for i in range(10)])
    >>> block_bounds(Range(reader, 2, 9)).tolist(), block_bounds(ListReader([{"key": 0}]))
    ([0, 2, 6, 7], None)
    """
    n = len(source)
    source, offset, _ = _unwrapped(source)
    bounds = getattr(source, "blocks", None)
    if bounds is None:
        return None
    inside = np.clip(np.asarray(bounds, dtype=np.int64) - offset, 0, n)
    return np.unique(np.concatenate(([0, n], inside)))


class _Walk(NamedTuple):
    """One epoch of a BlockShuffler: the blocks in ``order``, taken ``cuts[g]`` to
    ``cuts[g + 1]`` into group ``g``, whose positions are ``starts[g]`` to ``starts[g + 1]``."""

    order: np.ndarray
    cuts: list[int]
    starts: list[int]


def _draws(seed: int, epoch: int, group: int) -> np.random.Generator:
    """The generator of the block order (``group`` -1) or of group ``group``'s shuffle."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(epoch, group + 1, _WALK)))


class BlockShuffler(SeededOrdering):
    """Shuffle a reader that decodes its samples a block at a time (a Parquet file's row
    groups, an Arrow file's record batches: its ``blocks``, see
    :class:`~fpipe.dataset.base.Reader`), reading each block once an epoch.

    Per epoch the blocks are taken in a random order, in groups of at least ``blocks_held``
    blocks and at least ``buf_size`` samples (below 1 a fraction of the dataset, from 1 up a
    number of samples); each group is read, a block at a time in one contiguous read, and its
    samples go out in a random order of the whole group, then the next group's. So at most a
    group (and the block being read) is held, and the next sample comes from the same block
    about once in ``blocks_held`` (for blocks of equal size). Starting at position ``k`` reads
    only the group that holds it and those after. The order depends on ``(seed, epoch)`` and
    the blocks alone. ``seed=None`` draws fresh entropy, kept in ``seed``.

    >>> import numpy as np
    >>> from fpipe.dataset import ListReader
    >>> class Blocked(ListReader):                     # blocks of 10 samples
    ...     blocks = np.arange(0, 101, 10)
    >>> shuffler = BlockShuffler(Blocked([{"key": i} for i in range(100)]), blocks_held=3, seed=1)
    >>> keys = [s["key"] for s in shuffler]
    >>> sorted(keys) == list(range(100)), len({key // 10 for key in keys[:30]})  # 3 blocks first
    (True, 3)
    >>> shuffler.set_epoch(0)
    >>> [s["key"] for s in shuffler.iter(57)] == keys[57:]
    True
    """

    def __init__(self, reader: Any, buf_size: float = 0.01, blocks_held: int = 4,
                 seed: Seed = None) -> None:
        super().__init__(reader, seed)
        bounds = block_bounds(reader)
        if bounds is None:
            raise TypeError(f"BlockShuffler needs a reader that says its blocks (a Parquet or "
                            f"Arrow reader); got reader={reader!r:.80}")
        self.blocks_held = check_integer("blocks_held", blocks_held, 1)
        self.buffer_size = buffer_samples(buf_size, len(reader))
        self._bounds = bounds

    def __len__(self) -> int:
        return int(self._bounds[-1])

    def _arguments(self) -> str:
        return f", buf_size={self.buffer_size}, blocks_held={self.blocks_held}, seed={self.seed}"

    def _settings(self) -> dict[str, Any]:
        return {"buffer_size": self.buffer_size, "blocks_held": self.blocks_held,
                "blocks": len(self._bounds) - 1}

    def _walk_of(self, epoch: int) -> _Walk:
        return self._cached(epoch, self._draw_walk)

    def _draw_walk(self, epoch: int) -> _Walk:
        sizes = np.diff(self._bounds)
        order = _draws(self.seed, epoch, -1).permutation(len(sizes))
        cuts, starts, blocks, held = [0], [0], 0, 0
        for size in sizes[order].tolist():
            blocks, held = blocks + 1, held + size
            if blocks >= self.blocks_held and held >= self.buffer_size:
                cuts.append(cuts[-1] + blocks)
                starts.append(starts[-1] + held)
                blocks, held = 0, 0
        if blocks:
            cuts.append(cuts[-1] + blocks)
            starts.append(starts[-1] + held)
        return _Walk(order, cuts, starts)

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        walk = self._walk_of(epoch)
        group = int(np.searchsorted(walk.starts, start, side="right")) - 1
        self._hint(walk, group)
        while start < stop:
            low, high = walk.starts[group], walk.starts[group + 1]
            slots = _draws(self.seed, epoch, group).permutation(high - low)[
                start - low:min(stop, high) - low]
            held = self._group(self._pieces(walk, group), slots, epoch, options)
            self._hint(walk, group + 1)
            for first in range(0, len(slots), _TAKE):
                yield from held.take(slots[first:first + _TAKE])
            start, group = min(stop, high), group + 1

    def _pieces(self, walk: _Walk, group: int) -> list[tuple[int, int]]:
        bounds = self._bounds
        return [(int(bounds[block]), int(bounds[block + 1]))
                for block in walk.order[walk.cuts[group]:walk.cuts[group + 1]].tolist()]

    def _group(self, pieces: list[tuple[int, int]], slots: np.ndarray, epoch: int,
               options: ReadOptions) -> _Group:
        """The blocks ``pieces`` of a group, read and held; those that hold none of ``slots``
        (a pass that starts within the group) are not read. Each block is read once, and not
        kept by the reader: it is not read again this epoch."""
        ends = np.cumsum([stop - first for first, stop in pieces])
        wanted = set(np.searchsorted(ends, slots, side="right").tolist())
        reader, offset, indexed = _unwrapped(self.reader)
        if indexed:  # an Indexed pairs samples, as they are, with their positions
            options = options._replace(yield_key=False, raw=False)
        block_rows = getattr(reader, "block_rows", None)
        held: list = []
        for piece, (first, stop) in enumerate(pieces):
            if piece not in wanted:
                held.append(None)
            elif block_rows is None or options.yield_key or options.raw:
                held.append(HeldRows(list(read_source(reader, epoch, offset + first,
                                                     offset + stop, options))))
            else:  # held as the reader keeps it (Arrow columns), made samples when taken
                held.append(block_rows(offset + first, offset + stop))
        firsts = np.array([first for first, _ in pieces], dtype=np.int64) + offset
        return _Group(held, firsts, ends, indexed)

    def _hint(self, walk: _Walk, group: int) -> None:
        """Tell a reader at a URL which blocks group ``group`` reads (a sample of each)."""
        if group < len(walk.cuts) - 1:
            firsts = [first for first, _ in self._pieces(walk, group)]
            prefetch_indices(self.reader, np.array(firsts, dtype=np.int64))


def _unwrapped(source: Any) -> tuple[Any, int, bool]:
    """The reader under the windows ``source`` (:class:`Range`, :class:`Indexed`), the
    position in it of ``source``'s first, and whether an :class:`Indexed` pairs the samples
    with their positions."""
    offset, indexed = 0, False
    while isinstance(source, (Range, Indexed)):
        offset += source.start if isinstance(source, Range) else 0
        indexed = indexed or isinstance(source, Indexed)
        source = source.reader
    return source, offset, indexed


class _Group:
    """The blocks of a group, held (None for a block not read): ``take(slots)`` gives the
    samples at positions ``slots`` of the blocks one after the other (with their positions
    in the reader, if ``indexed``). Blocks that join (Arrow tables of one schema) are taken
    from at once."""

    def __init__(self, held: list, firsts: np.ndarray, ends: np.ndarray, indexed: bool) -> None:
        self.held, self.firsts, self.ends, self.indexed = held, firsts, ends, indexed
        self.starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        join = getattr(held[0], "join", None) if held and None not in held else None
        self.joined = join(held) if join is not None else None

    def take(self, slots: np.ndarray) -> list:
        blocks = np.searchsorted(self.ends, slots, side="right")
        rows = slots - self.starts[blocks]
        samples = self.joined.take(slots) if self.joined is not None else self._gathered(blocks, rows)
        if not self.indexed:
            return samples
        return list(zip((self.firsts[blocks] + rows).tolist(), samples))

    def _gathered(self, blocks: np.ndarray, rows: np.ndarray) -> list:
        samples: list = [None] * len(rows)
        for block in np.unique(blocks).tolist():
            places = np.flatnonzero(blocks == block)
            for place, sample in zip(places.tolist(), self.held[block].take(rows[places])):
                samples[place] = sample
        return samples


def shuffled_shard(reader: Any, start: int, stop: int, *, seed: int, epoch: int, skip: int = 0,
                   buf_size: float = 0.01, chunk_size: int = 16,
                   copy: bool = True) -> Iterator[tuple[int, Any]]:
    """Positions ``[start, stop)`` of ``reader`` shuffled, as ``(index, sample)`` pairs from
    position ``skip`` of the shuffled pass on, without reading the samples before it (where
    the order allows): the shuffle of the torch adapters' ``shuffle=True``. The order is a
    permutation of the window that depends on ``(seed, epoch)`` alone, and the strongest the
    reader affords:

    - a reader that decodes blocks (``reader.blocks``: Parquet, Arrow): a
      :class:`BlockShuffler`, each block read once, ``buf_size`` the least number of samples
      mixed at once (and 4 blocks);
    - else a reader with random access (``get``: packed datasets, lists, folders, tar and
      TFRecord files): an :class:`~fpipe.orderings.permutation.IndexShuffler`, a true
      permutation of the window, which starts at ``skip`` at once;
    - else (an ordering without ``get``) a :class:`~fpipe.orderings.order.QuasiShuffler` of
      ``buf_size`` in chunks of ``chunk_size``, which reads up to ``skip``.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"x": i} for i in range(20)])
    >>> pairs = list(shuffled_shard(reader, 5, 15, seed=0, epoch=0))
    >>> sorted(i for i, _ in pairs) == list(range(5, 15)), all(s["x"] == i for i, s in pairs)
    (True, True)
    >>> list(shuffled_shard(reader, 5, 15, seed=0, epoch=0, skip=4)) == pairs[4:]
    True
    """
    shard = Range(Indexed(reader), start, stop)
    if block_bounds(shard) is not None:
        walk = BlockShuffler(shard, buf_size=buf_size, seed=seed)
        if skip >= len(walk):
            return iter(())
        # read straight from the walk: a generator less for every sample
        return walk._read(epoch, skip, len(walk), ReadOptions(False, False, bool(copy), chunk_size))
    if random_access(reader):
        order: SeededOrdering = IndexShuffler(shard, seed=seed)
    else:
        order = QuasiShuffler(shard, buf_size=buf_size, chunk_size=chunk_size, seed=seed)
        order.set_epoch(epoch)
        # refilling the buffer at `skip` takes random reads: without them, read up to it
        return itertools.islice(order.iter(0, copy=copy, chunk_size=chunk_size), skip, None)
    order.set_epoch(epoch)
    return order.iter(skip, copy=copy, chunk_size=chunk_size)
