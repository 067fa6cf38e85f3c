"""Workload S6: one epoch of QuasiShuffler and of Shuffler over `large`, against datadings's,
and of IndexShuffler against datadings's Shuffler (information: the new order has no
datadings counterpart); S6qc, what any reader that never maps its file can reach at most."""

from __future__ import annotations

import os
import random

import numpy as np

from fpipe.dataset import MsgpackReader
from fpipe.orderings import IndexShuffler, QuasiShuffler, Shuffler

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


@workload("S6qc", description="the ceiling of S6q for a reader that never maps its file: each "
          "sample's bytes copied once, by one bare os.pread into its own bytes, chunk by chunk in "
          "a shuffled order, through a buffer of QuasiShuffler's size; nothing decoded",
          reference="datadings QuasiShuffler", target="-")
def quasi_shuffler_ceiling() -> Pair:
    from datadings.reader import MsgpackReader as DatadingsReader
    from datadings.reader import QuasiShuffler as DatadingsQuasiShuffler

    path = data.large_path()
    offsets = np.fromfile(path + ".offsets", dtype=">u8").tolist()
    n, chunk = len(offsets) - 1, 16
    firsts = np.random.default_rng(0).permutation(range(0, n, chunk)).tolist()
    slots = QuasiShuffler(DatadingsReader(path), seed=0).buffer_size

    def bare_epoch() -> None:
        buffer: list = [None] * slots
        pick = random.Random(0).randrange
        with open(path, "rb", buffering=0) as file:
            fd = file.fileno()
            for first in firsts:
                for index in range(first, min(n, first + chunk)):
                    buffer[pick(slots)] = os.pread(fd, offsets[index + 1] - offsets[index],
                                                   offsets[index])
    reference = DatadingsReader(path)
    return Pair(fpipe=bare_epoch, reference=lambda: _epoch(DatadingsQuasiShuffler(reference, seed=0)),
                items=n)
