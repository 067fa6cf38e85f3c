"""Workload S6: one epoch of QuasiShuffler and of Shuffler over `large`, against datadings's,
and of IndexShuffler against datadings's Shuffler (information: the new order has no
datadings counterpart)."""

from __future__ import annotations

from fpipe.storage import IndexShuffler, MsgpackReader, QuasiShuffler, Shuffler

from . import data
from .harness import Pair, workload


def _epoch(ordering) -> None:
    for _ in ordering:
        pass


def _pair(ours, theirs) -> Pair:
    # both ordering objects are built inside the timed call, as a training loop builds them
    path = data.large_path()
    from datadings.reader import MsgpackReader as DatadingsReader

    reader, reference = MsgpackReader(path), DatadingsReader(path)
    return Pair(fpipe=lambda: _epoch(ours(reader)), reference=lambda: _epoch(theirs(reference)),
                items=len(reader))


@workload("S6q", description="one epoch of QuasiShuffler (defaults, seed 0) over `large`",
          reference="datadings QuasiShuffler", target=">= 1.5")
def quasi_shuffler_epoch() -> Pair:
    from datadings.reader import QuasiShuffler as DatadingsQuasiShuffler

    return _pair(lambda reader: QuasiShuffler(reader, seed=0),
                 lambda reader: DatadingsQuasiShuffler(reader, seed=0))


@workload("S6s", description="one epoch of Shuffler (seed 0) over `large`",
          reference="datadings Shuffler", target=">= 1.2")
def shuffler_epoch() -> Pair:
    from datadings.reader import Shuffler as DatadingsShuffler

    return _pair(lambda reader: Shuffler(reader, seed=0),
                 lambda reader: DatadingsShuffler(reader, seed=0))


@workload("S6i", description="one epoch of IndexShuffler (seed 0) over `large`",
          reference="datadings Shuffler", target="-")
def index_shuffler_epoch() -> Pair:
    from datadings.reader import Shuffler as DatadingsShuffler

    return _pair(lambda reader: IndexShuffler(reader, seed=0),
                 lambda reader: DatadingsShuffler(reader, seed=0))
