"""Orderings: which sample comes next, for an epoch of any size, resumable from any position.

The datadings orderings (``Range``, ``Repeater``, ``Cycler``, ``Shuffler``, ``QuasiShuffler``
in ``order``) wrap a reader; ``IndexShuffler`` (``permutation``) draws a permutation of a
billion indexes without holding it. Both are seeded per epoch, so an epoch's order depends on
the seed and the epoch alone. Nothing here knows a file format. Every public name is
re-exported here.

>>> from fpipe.dataset import ListReader
>>> from fpipe.orderings import IndexShuffler
>>> order = IndexShuffler(ListReader([{"key": i} for i in range(10)]), seed=0)
>>> sorted(sample["key"] for sample in order) == list(range(10))
True
"""

from fpipe.orderings import order, permutation
from fpipe.orderings.order import *
from fpipe.orderings.permutation import *

_PUBLIC_MODULES = (order, permutation)

__all__ = sorted({name for module in _PUBLIC_MODULES for name in module.__all__})  # noqa: PLE0605
