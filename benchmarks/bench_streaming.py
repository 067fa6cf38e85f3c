"""Workloads of the streaming stages: P1-P5 against dpipe and serial loops, P6 (a new process
stage's first result) and M2 (memory).

The P1 variants: P1 against dpipe's ``Infinite``, P1s against a plain serial loop, P1p with
a background ``prefetch`` (as ``Infinite`` runs in the background) against dpipe, and P1st, the
cost of the per-stage stats (the same pipeline with the stats switched off is the reference).
"""

from __future__ import annotations

import gc
import itertools
import time

import numpy as np
from toolz import partition_all, pipe

import fpipe as fp

from .harness import Pair, Value, workload

P1_BATCHES, P1_SIZE = 2000, 32
WORK_ITEMS = 1024  # P2, P3: items of about 1 ms each
P4_ITEMS = 200_000
M2_BATCHES = 100_000


def _drain(iterable) -> None:
    for _ in iterable:
        pass


def _dpipe():
    import dpipe.batch_iter as dpipe  # a reference library: imported only when used

    return dpipe


def _infinite(*transformers, batches: int, **kwargs):
    """A started dpipe ``Infinite`` over ``(i,)`` items; each call of the result is one epoch."""
    pipeline = _dpipe().Infinite(zip(itertools.count()), *transformers, batch_size=P1_SIZE,
                                 batches_per_epoch=batches, **kwargs)
    pipeline.__enter__()
    return pipeline


def _p1(*extra) -> fp.Stream:
    return pipe(zip(itertools.count()), fp.stream.map(fp.identity), fp.batch(P1_SIZE),
                fp.stream.map(fp.combine_to_arrays), *extra, fp.take(P1_BATCHES))


@workload("P1", description="count source, identity, batch 32, combine_to_arrays, 2000 batches, "
          "as a toolz.pipe", reference="dpipe Infinite", target=">= 20")
def p1_dpipe() -> Pair:
    theirs = _infinite(fp.identity, batches=P1_BATCHES)
    return Pair(fpipe=lambda: _drain(_p1()), reference=lambda: _drain(theirs()),
                items=P1_BATCHES * P1_SIZE, teardown=theirs.close)


@workload("P1p", description="P1 with prefetch(64) after the combiner (a background thread, "
          "as in Infinite)", reference="dpipe Infinite", target=">= 20")
def p1_prefetch_dpipe() -> Pair:
    theirs = _infinite(fp.identity, batches=P1_BATCHES)

    def ours() -> None:
        with _p1(fp.prefetch(64)) as stream:
            _drain(stream)
    return Pair(fpipe=ours, reference=lambda: _drain(theirs()), items=P1_BATCHES * P1_SIZE,
                teardown=theirs.close)


def _p1_serial() -> None:
    source = zip(itertools.count())
    for _ in range(P1_BATCHES):
        fp.combine_to_arrays([fp.identity(next(source)) for _ in range(P1_SIZE)])


@workload("P1s", description="P1 as a toolz.pipe", reference="a plain serial loop doing the "
          "same work", target=">= 0.3")
def p1_serial() -> Pair:
    return Pair(fpipe=lambda: _drain(_p1()), reference=_p1_serial, items=P1_BATCHES * P1_SIZE)


def _pull_without_stats(self: fp.Stream, n: int, full: bool = False) -> list:
    if self._buffer or self._error is not None or self._closed:
        items = self._pull_held(n)
        if items or self._closed:
            return items
    try:
        return self._pull_full(n) if full else self._pull(n)
    except BaseException as error:
        self._fail(error)
        raise


def _p1_times(times: int) -> None:
    for _ in range(times):
        _drain(_p1())


@workload("P1st", description="P1 as a toolz.pipe (ten runs per timing, for steadier figures), "
          "with the per-stage stats (always on)", reference="the same with the stats switched off",
          target=">= 0.95")
def p1_stats_cost() -> Pair:
    with_stats = fp.Stream._pull_in_turn

    def without() -> None:
        fp.Stream._pull_in_turn = _pull_without_stats
        try:
            _p1_times(10)
        finally:
            fp.Stream._pull_in_turn = with_stats
    return Pair(fpipe=lambda: _p1_times(10), reference=without, items=10 * P1_BATCHES * P1_SIZE)


def _seconds(work, argument) -> float:
    best = float("inf")  # the fastest of several runs: other processes only slow a run down
    for _ in range(9):
        start = time.perf_counter()
        work(argument)
        best = min(best, time.perf_counter() - start)
    return best


def _calibrated(work, make_argument, target: float = 1e-3) -> int:
    """The size for which ``work(make_argument(size))`` takes about ``target`` seconds."""
    size = 1000
    for _ in range(20):
        seconds = _seconds(work, make_argument(size))
        if abs(seconds - target) < target / 20:
            break
        size = max(1, int(size * min(4.0, target / seconds)))
    return size


def python_work(n: int) -> int:
    """Pure-Python work (it holds the GIL)."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


class PythonItem:
    """``python_work`` of a calibrated size, whatever the item (picklable)."""

    def __init__(self) -> None:
        self.n = _calibrated(python_work, int)

    def __call__(self, item) -> tuple:
        return item, python_work(self.n)


class NumpyItem:
    """numpy work that releases the GIL, on a calibrated array."""

    def __init__(self) -> None:
        size = _calibrated(lambda array: np.sqrt(array).sum(), np.ones)
        self.array = np.random.default_rng(0).random(size)

    def __call__(self, item) -> tuple:
        return item, float(np.sqrt(self.array).sum())


def _serial_map(func) -> None:
    for chunk in partition_all(P1_SIZE, map(func, zip(range(WORK_ITEMS)))):
        fp.combine_batches(chunk)


def _parallel(stage) -> None:
    with pipe(zip(range(WORK_ITEMS)), stage, fp.batch(P1_SIZE), fp.stream.map(fp.combine_batches)) as s:
        _drain(s)


@workload("P2", description="process stage, 2 workers, pure-Python work of about 1 ms per "
          "item, batch 32", reference="serial map", target=">= 1.9")
def p2_serial() -> Pair:
    work = PythonItem()
    stage = fp.processes(work, n_workers=2)
    return Pair(fpipe=lambda: _parallel(stage), reference=lambda: _serial_map(work),
                items=WORK_ITEMS, teardown=stage.close)


@workload("P2d", description="P2", reference="dpipe Loky(n_workers=2)", target=">= 2")
def p2_dpipe() -> Pair:
    work = PythonItem()
    stage = fp.processes(work, n_workers=2)
    theirs = _infinite(_dpipe().Loky(work, n_workers=2), batches=WORK_ITEMS // P1_SIZE,
                       combiner=fp.combine_batches)

    def teardown() -> None:
        stage.close()
        theirs.close()
    # A started dpipe pipeline goes on filling its buffers after an epoch; the pause lets that
    # work end before the next timed run instead of slowing it (it took ~0.1 s of CPU).
    return Pair(fpipe=lambda: _parallel(stage), reference=lambda: _drain(theirs()),
                items=WORK_ITEMS, teardown=teardown, settle=lambda: time.sleep(0.5))


@workload("P3", description="thread stage, 2 workers, numpy work of about 1 ms per item that "
          "releases the GIL, batch 32", reference="serial map", target=">= 1.6")
def p3_serial() -> Pair:
    work = NumpyItem()
    return Pair(fpipe=lambda: _parallel(fp.threads(work, n_workers=2)),
                reference=lambda: _serial_map(work), items=WORK_ITEMS)


@workload("P3d", description="P3, each run a new pipeline (a started dpipe pipeline would go on "
          "working in the background while fpipe is timed)", reference="dpipe Threads(n_workers=2)",
          target=">= 1.0")
def p3_dpipe() -> Pair:
    work = NumpyItem()
    dpipe = _dpipe()

    def theirs() -> None:
        with dpipe.Infinite(zip(range(WORK_ITEMS)), dpipe.Threads(work, n_workers=2),
                            batch_size=P1_SIZE, batches_per_epoch=WORK_ITEMS // P1_SIZE,
                            combiner=fp.combine_batches) as pipeline:
            _drain(pipeline())
    return Pair(fpipe=lambda: _parallel(fp.threads(work, n_workers=2)), reference=theirs,
                items=WORK_ITEMS)


@workload("P4", description="expiration pool, pool_size 1,000, repetitions 4, over 200,000 items",
          reference="dpipe expiration_pool", target=">= 5")
def p4_pool() -> Pair:
    dpipe = _dpipe()
    return Pair(fpipe=lambda: _drain(fp.expiration_pool(range(P4_ITEMS), 1000, 4)),
                reference=lambda: _drain(dpipe.expiration_pool(range(P4_ITEMS), 1000, 4)),
                items=4 * P4_ITEMS)


def _first_batch_seconds(make) -> float:
    start = time.perf_counter()
    with make() as pipeline:
        next(iter(pipeline))
    return time.perf_counter() - start


@workload("P5", description="time from the first next() to the first batch of a process "
          "pipeline (2 workers, 1 ms items, batch 32), second epoch: warm workers",
          reference="dpipe Loky restart", target="<= 0.5", kind="time")
def p5_restart() -> Pair:
    work = PythonItem()
    stage = fp.processes(work, n_workers=2)
    dpipe = _dpipe()

    def ours() -> fp.Stream:
        return pipe(zip(itertools.count()), stage, fp.batch(P1_SIZE), fp.stream.map(fp.combine_batches))

    def theirs():
        return dpipe.Infinite(zip(itertools.count()), dpipe.Loky(work, n_workers=2),
                              batch_size=P1_SIZE, batches_per_epoch=1, combiner=fp.combine_batches)
    _first_batch_seconds(ours)  # the first epoch starts the workers
    return Pair(fpipe=lambda: _first_batch_seconds(ours),
                reference=lambda: _first_batch_seconds(theirs), teardown=stage.close)


def small_item(i: int) -> tuple:
    return np.full(16, i, dtype=np.float32), i


@workload("M2", description="a process pipeline (2 workers, batch 8, combine_to_arrays) running "
          "100,000 batches: growth of the main process's resident memory after the first 1,000",
          reference="-", target="<= 50", kind="value")
def m2_memory() -> Value:
    import psutil

    process = psutil.Process()
    with pipe(itertools.count(), fp.prefetch(256), fp.processes(small_item, n_workers=2),
              fp.batch(8), fp.stream.map(fp.combine_to_arrays), fp.take(M2_BATCHES)) as stream:
        _drain(itertools.islice(stream, 1000))
        gc.collect()
        before = process.memory_info().rss
        _drain(stream)
        gc.collect()
        grown = process.memory_info().rss - before
    return Value(grown / 2**20, "MiB")


def _first_result_seconds(work) -> float:
    start = time.perf_counter()
    with pipe(range(400), fp.processes(work, n_workers=2)) as stream:
        next(stream)
    return time.perf_counter() - start


@workload("P6", description="a new process stage (2 workers, 0.5 ms items) on warm workers: "
          "milliseconds from the first next() to the first result, median of 9 new stages",
          reference="-", target="<= 10", kind="value")
def p6_new_stage() -> Value:
    work = PythonItem()
    work.n //= 2
    _drain(pipe(range(100), fp.processes(work, n_workers=2)))  # warm workers
    times = [_first_result_seconds(work) for _ in range(9)]
    return Value(1e3 * float(np.median(times)), "ms")
