"""Shuffles that follow what random access costs: :class:`BlockShuffler`, which walks the
blocks of a reader that decodes a block at a time (the row groups of Parquet, the record
batches of Arrow), and :func:`shuffled_shard`, the shuffle of a shard that picks the order
for the reader: the torch adapters' ``shuffle=True``.

A reader says what its random access costs with ``blocks`` (see
:class:`~fpipe.storage.base.Reader`): None when a sample costs the same wherever it is read,
else the bounds of the blocks that decode as a whole. :func:`block_bounds` finds them through
the windows that wrap a reader.

>>> import numpy as np
>>> from fpipe.storage import ListReader
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

from ..errors import check_integer
from ..random import Seed
from ._plans import buffer_samples
from .order import (
    Indexed,
    QuasiShuffler,
    Range,
    ReadOptions,
    SeededOrdering,
    prefetch_indices,
    random_access,
    read_source,
)
from .permutation import IndexShuffler

__all__ = ["BlockShuffler", "block_bounds", "shuffled_shard"]

# the third number of the spawn keys of the block walk's draws: no other draw's (an item's
# generator has 2 numbers, a shard's seed ends in 1, an IndexShuffler's round keys in 2)
_WALK = 3


def block_bounds(source: Any) -> np.ndarray | None:
    """The bounds of the blocks of ``source`` (a reader, or windows of one: :class:`Range`,
    :class:`Indexed`), in its own positions, or None when its reader has none (its random
    access costs the same everywhere). Blocks cut by a window's edges become the pieces inside
    it; the bounds run from 0 to ``len(source)``, without empty blocks.

    >>> from fpipe.storage import ListReader, Range
    >>> class Blocked(ListReader):
    ...     blocks = np.array([0, 4, 8, 10])
    >>> reader = Blocked([{"key": i} for i in range(10)])
    >>> block_bounds(Range(reader, 2, 9)).tolist(), block_bounds(ListReader([{"key": 0}]))
    ([0, 2, 6, 7], None)
    """
    offset, n = 0, len(source)
    while isinstance(source, (Range, Indexed)):
        offset += source.start if isinstance(source, Range) else 0
        source = source.reader
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
    :class:`~fpipe.storage.base.Reader`), reading each block once an epoch.

    Per epoch the blocks are taken in a random order, in groups of at least ``blocks_held``
    blocks and at least ``buf_size`` samples (below 1 a fraction of the dataset, from 1 up a
    number of samples); each group is read, a block at a time in one contiguous read, and its
    samples go out in a random order of the whole group, then the next group's. So at most a
    group (and the block being read) is held, and the next sample comes from the same block
    about once in ``blocks_held`` (for blocks of equal size). Starting at position ``k`` reads
    only the group that holds it and those after. The order depends on ``(seed, epoch)`` and
    the blocks alone. ``seed=None`` draws fresh entropy, kept in ``seed``.

    >>> import numpy as np
    >>> from fpipe.storage import ListReader
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
            samples = self._group(walk, group, epoch, slots, options)
            self._hint(walk, group + 1)
            for slot in slots.tolist():
                # a sample gone out is not held here any longer
                sample, samples[slot] = samples[slot], None
                yield sample
            start, group = min(stop, high), group + 1

    def _pieces(self, walk: _Walk, group: int) -> list[tuple[int, int]]:
        bounds = self._bounds
        return [(int(bounds[block]), int(bounds[block + 1]))
                for block in walk.order[walk.cuts[group]:walk.cuts[group + 1]].tolist()]

    def _group(self, walk: _Walk, group: int, epoch: int, slots: np.ndarray,
               options: ReadOptions) -> list:
        """The samples of group ``group``, in the order of its blocks; of the blocks that
        hold none of ``slots`` (a pass that starts within the group), None."""
        pieces = self._pieces(walk, group)
        ends = np.cumsum([stop - first for first, stop in pieces])
        wanted = set(np.searchsorted(ends, slots, side="right").tolist())
        samples: list = []
        for piece, (first, stop) in enumerate(pieces):
            # each block in one read that does not keep it: it is not read again this epoch
            samples += (read_source(self.reader, epoch, first, stop, options) if piece in wanted
                        else itertools.repeat(None, stop - first))
        return samples

    def _hint(self, walk: _Walk, group: int) -> None:
        """Tell a reader at a URL which blocks group ``group`` reads (a sample of each)."""
        if group < len(walk.cuts) - 1:
            firsts = [first for first, _ in self._pieces(walk, group)]
            prefetch_indices(self.reader, np.array(firsts, dtype=np.int64))


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
      TFRecord files): an :class:`~fpipe.storage.permutation.IndexShuffler`, a true
      permutation of the window, which starts at ``skip`` at once;
    - else (an ordering without ``get``) a :class:`~fpipe.storage.order.QuasiShuffler` of
      ``buf_size`` in chunks of ``chunk_size``, which reads up to ``skip``.

    >>> from fpipe.storage import ListReader
    >>> reader = ListReader([{"x": i} for i in range(20)])
    >>> pairs = list(shuffled_shard(reader, 5, 15, seed=0, epoch=0))
    >>> sorted(i for i, _ in pairs) == list(range(5, 15)), all(s["x"] == i for i, s in pairs)
    (True, True)
    >>> list(shuffled_shard(reader, 5, 15, seed=0, epoch=0, skip=4)) == pairs[4:]
    True
    """
    shard = Range(Indexed(reader), start, stop)
    if block_bounds(shard) is not None:
        order: SeededOrdering = BlockShuffler(shard, buf_size=buf_size, seed=seed)
    elif random_access(reader):
        order = IndexShuffler(shard, seed=seed)
    else:
        order = QuasiShuffler(shard, buf_size=buf_size, chunk_size=chunk_size, seed=seed)
        order.set_epoch(epoch)
        # refilling the buffer at `skip` takes random reads: without them, read up to it
        return itertools.islice(order.iter(0, copy=copy, chunk_size=chunk_size), skip, None)
    order.set_epoch(epoch)
    return order.iter(skip, copy=copy, chunk_size=chunk_size)
