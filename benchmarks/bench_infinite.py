"""Workloads of ``Infinite`` and the dpipe stage classes against dpipe's, in the same run.

P1i is P1 through ``Infinite`` (the count source, an identity function, batch 32, 2,000
batches per epoch; one timed run is one epoch of a started iterator); P3i is P3 with
``Threads(work, n_workers=2)`` in an ``Infinite``; P5i is the time to the first batch of the
next epoch after ``close()``, of an ``Infinite`` with ``Loky(work, n_workers=2)``: fpipe's
workers stay warm, dpipe starts a new process pool (each timed run includes the ``close()``
before it; dpipe's returns at once, fpipe's joins its threads).

In P1i and P3i both iterators stay started between timed runs, as in a training loop: while
the other one is timed, each fills its bounded buffers (a few batches) and then waits.
"""

from __future__ import annotations

import itertools

import fpipe as fp

from .bench_streaming import P1_BATCHES, P1_SIZE, WORK_ITEMS, NumpyItem, PythonItem
from .harness import Pair, workload


def _drain(iterable) -> None:
    for _ in iterable:
        pass


def _pair(ours: fp.Infinite, theirs, items: int) -> Pair:
    """One epoch of each started iterator per timed run."""
    ours.__enter__()
    theirs.__enter__()

    def teardown() -> None:
        ours.close()
        theirs.close()
    return Pair(fpipe=lambda: _drain(ours()), reference=lambda: _drain(theirs()), items=items,
                teardown=teardown)


def _dpipe():
    import dpipe.batch_iter as dpipe  # a reference library: imported only when used

    return dpipe


@workload("P1i", description="P1 through Infinite: count source, identity, batch 32, "
          "combine_to_arrays, one epoch of 2000 batches", reference="dpipe Infinite",
          target=">= 20")
def p1_infinite() -> Pair:
    def make(module):
        return module.Infinite(zip(itertools.count()), fp.identity, batch_size=P1_SIZE,
                               batches_per_epoch=P1_BATCHES)
    return _pair(make(fp), make(_dpipe()), P1_BATCHES * P1_SIZE)


@workload("P3i", description="P3 through Infinite: Threads(work, n_workers=2), numpy work of "
          "about 1 ms per item that releases the GIL, batch 32",
          reference="dpipe Infinite with Threads(work, n_workers=2)", target=">= 1.0")
def p3_infinite() -> Pair:
    work = NumpyItem()

    def make(module):
        return module.Infinite(zip(itertools.count()), module.Threads(work, n_workers=2),
                               batch_size=P1_SIZE, batches_per_epoch=WORK_ITEMS // P1_SIZE,
                               combiner=fp.combine_batches)
    return _pair(make(fp), make(_dpipe()), WORK_ITEMS)


@workload("P5i", description="Infinite with Loky(work, n_workers=2), 1 ms items, batch 32: "
          "close(), then the time to the first batch of the next epoch (fpipe: warm workers)",
          reference="dpipe Infinite's Loky restart", target="<= 0.5", kind="time")
def p5_infinite() -> Pair:
    work = PythonItem()

    def make(module):
        return module.Infinite(zip(itertools.count()), module.Loky(work, n_workers=2),
                               batch_size=P1_SIZE, batches_per_epoch=1,
                               combiner=fp.combine_batches)
    ours, theirs = make(fp), make(_dpipe())
    _drain(ours())  # the first epoch starts the workers

    def restart(batch_iter) -> None:
        batch_iter.close()
        next(iter(batch_iter()))

    def teardown() -> None:
        ours.close()
        theirs.close()
    return Pair(fpipe=lambda: restart(ours), reference=lambda: restart(theirs),
                teardown=teardown)
