"""Load: eight threads hammering one reader, pipelines built and closed over and over, and a
long run of batches through worker processes.

Every get returns the right sample; after the cycles, threads, child processes and open file
descriptors are back to where they were and resident memory has not grown; through the long
run, resident memory grows by at most 50 MiB (benchmark M2's bound).
"""

from __future__ import annotations

import gc
import itertools
import threading
import time

import numpy as np
import pytest
from toolz import pipe

import fpipe as fp
from fpipe.dataset import MsgpackReader, unpack_sample

from .conftest import Resources, psutil, settle
from .files import same, write_dataset
from .workers import small_item

pytestmark = pytest.mark.timeout(1800)

MiB = 2**20


def _soak(default: int, soak: int) -> list:
    return [pytest.param(default, id="default"), pytest.param(soak, id="soak", marks=pytest.mark.soak)]


# --- eight threads, one reader ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """400 samples from 30 bytes to 150 KiB: reads of both sides of the reader's copy limit."""
    rng = np.random.default_rng(7)
    sizes = rng.choice([8, 300, 5000, 150_000], size=400, p=[0.5, 0.3, 0.15, 0.05])
    samples = [{"key": f"m{i:04d}", "blob": rng.bytes(int(size)),
                "x": rng.normal(size=int(size) % 7).astype("<f8")} for i, size in enumerate(sizes)]
    return samples, write_dataset(tmp_path_factory.mktemp("mixed") / "mixed.msgpack", samples)


def _hammer(reader: MsgpackReader, samples: list, seed: int, calls: int, errors: list) -> None:
    rng = np.random.default_rng(seed)
    try:
        for i in rng.integers(-len(samples), len(samples), calls).tolist():
            way = i % 4
            if way == 0:
                ok = same(reader.get(i), samples[i])
            elif way == 1:
                key, sample = reader.get(i, yield_key=True)
                ok = key == samples[i]["key"] and same(sample, samples[i])
            elif way == 2:
                ok = same(unpack_sample(reader.get(i, raw=True)), samples[i]) and \
                    same(reader[i], samples[i])
            else:
                ok = same(reader.get_many([i, i - 1]), [samples[i], samples[i - 1]])
            if not ok:
                errors.append(f"wrong sample {i}")
    except Exception as error:  # any exception in a thread is a failure
        errors.append(repr(error))


@pytest.mark.parametrize("calls", _soak(10_000, 100_000))
def test_eight_threads_doing_random_gets_on_one_reader(mixed, calls, record):
    samples, path = mixed
    reader, errors = MsgpackReader(path), []
    workers = [threading.Thread(target=_hammer, args=(reader, samples, seed, calls, errors))
               for seed in range(8)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    assert errors == []
    record(f"8 threads x {calls:,} random get calls on one reader", tried=8 * calls,
           failures=len(errors), gets_per_second=round(8 * calls / seconds))


# --- build, iterate, close ----------------------------------------------------------------------


def cycle(number: int) -> None:
    """Build a pipeline of new stages (threads and processes), take five batches, close it.
    Every 25th cycle leaves the process stage's joblib generator to end when the dropped stage
    is garbage-collected; the others end it with ``stage.close()``."""
    workers = fp.processes(small_item, n_workers=2, options=fp.ParallelOptions(chunk_size=16))
    with pipe(range(10**6), fp.stream.map(int), fp.threads(abs, n_workers=2), fp.prefetch(16),
              workers, fp.batch(8), fp.stream.map(fp.combine_to_arrays)) as stream:
        batches = list(itertools.islice(stream, 5))
    assert [labels.tolist() for _, labels in batches] == [list(range(8 * b, 8 * b + 8))
                                                         for b in range(5)]
    if number % 25:
        workers.close()


@pytest.mark.parametrize("cycles", _soak(50, 1000))
def test_build_iterate_close_cycles_leave_nothing_behind(cycles, record):
    for number in range(10):  # warm: loky's workers and executor threads stay for later runs
        cycle(number)
    baseline = _settled_baseline()
    started, rss = time.perf_counter(), []
    for number in range(cycles):
        cycle(number)
        if number % max(1, cycles // 10) == 0:
            rss.append(psutil.Process().memory_info().rss)
    seconds = time.perf_counter() - started
    left = settle(baseline)
    gc.collect()
    grown = (psutil.Process().memory_info().rss - baseline.rss) / MiB
    assert not left, f"left behind after {cycles} cycles: {left}"
    assert grown <= 16, f"resident memory grew by {grown:.1f} MiB"
    record(f"{cycles:,} build/iterate/close cycles (threads, prefetch, processes)", tried=cycles,
           failures=int(bool(left)), rss_growth_mib=round(grown, 2),
           ms_per_cycle=round(1000 * seconds / cycles, 1))


def _settled_baseline() -> Resources:
    """Threads, children, descriptors and memory once the warm-up's generators have ended."""
    time.sleep(1.5)
    gc.collect()
    return Resources()


# --- a long run of batches -----------------------------------------------------------------------


@pytest.mark.parametrize("batches", _soak(5_000, 100_000))
def test_a_long_run_of_batches_through_worker_processes(batches, record):
    """Benchmark M2's pipeline, checked batch by batch; resident memory is measured after
    the first 1,000 batches and then every 1,000."""
    process, growth = psutil.Process(), []
    with pipe(itertools.count(), fp.prefetch(256), fp.processes(small_item, n_workers=2),
              fp.batch(8), fp.stream.map(fp.combine_to_arrays), fp.take(batches)) as stream:
        for number, (arrays, labels) in enumerate(stream):
            first = 8 * number
            assert labels[0] == first and labels[-1] == first + 7 and arrays.shape == (8, 16)
            assert arrays[-1, 0] == (first + 7) % 251
            if number % 1000 == 0:
                gc.collect()
                growth.append(process.memory_info().rss)
    assert number == batches - 1
    grown = (max(growth[1:]) - growth[1]) / MiB
    assert grown <= 50, f"resident memory grew by {grown:.1f} MiB"
    record(f"{batches:,} batches through a process pipeline (M2)", tried=batches,
           rss_growth_mib=round(grown, 2))
