"""processes on joblib: order, seeds, errors, warm workers across epochs, early closes,
leftovers, and leaks. Every loky stage here uses two workers, so joblib's one pool of workers
is never resized."""

import functools
import gc
import itertools
import os
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import psutil
import pytest
from toolz import pipe

import fpipe as fp
from fpipe.stream.parallel import _joblib

from .helpers import (
    Tally,
    TallyWithTable,
    double,
    exit_worker,
    fail_at,
    jitter,
    lock_at,
    logged_sleep,
    noisy,
    pid,
    slow_double,
)
from .test_shm import ROOT


def loky(func, **options):
    """The process stage of ``func`` on two loky workers."""
    return fp.processes(func, n_workers=2, **options)


def test_results_keep_the_input_order_and_lambdas_work():
    assert list(loky(lambda x: x * 3)(range(500))) == [3 * x for x in range(500)]
    assert list(loky(functools.partial(slow_double, seconds=0.0))(range(5))) == [0, 2, 4, 6, 8]


def test_unordered_results_are_every_result_once():
    out = list(loky(jitter, ordered=False, options=fp.ParallelOptions(chunk_size=2))(range(40)))
    assert Counter(out) == Counter(range(40))


def test_workers_are_other_processes_and_stay_warm_across_epochs():
    stage = loky(pid)
    first = set(stage(range(200)))
    assert os.getpid() not in first
    second = set(stage(range(200)))
    assert second <= first | second and len(first | second) <= 2  # the same two workers


def _items_and_last_counts(calls: list) -> tuple[Counter, dict]:
    """From a Tally's results: the items each worker ran, and the last count its copy gave."""
    items = Counter(worker for worker, n, *_ in calls)
    return items, {worker: max(n for w, n, *_ in calls if w == worker) for worker in items}


def test_a_worker_keeps_the_function_for_the_run_and_gets_a_fresh_one_next_run():
    stage = loky(Tally(), options=fp.ParallelOptions(chunk_size=4))
    for _ in range(2):  # each run starts from the consumer's copy again
        calls = list(stage(range(200)))
        items, last_counts = _items_and_last_counts(calls)
        # one copy per worker saw every item that worker ran, across its chunks of 4
        assert last_counts == items
        assert sorted(n for _, n in calls) == sorted(n for c in items.values() for n in range(1, c + 1))


def test_a_function_with_a_large_array_gets_it_memory_mapped_and_is_kept_too():
    calls = list(loky(TallyWithTable(), options=fp.ParallelOptions(chunk_size=4))(range(100)))
    assert all(mapped for _, _, mapped in calls)  # joblib's memory map, not 2 MB a chunk
    items, last_counts = _items_and_last_counts(calls)
    assert last_counts == items


def test_an_early_close_keeps_the_workers_and_leaves_no_leftovers():
    stage = loky(functools.partial(slow_double, seconds=0.001))
    assert list(loky(pid)(range(100)))  # the workers are started
    # the workers that exist now, not the ones that ran those tasks: one may have run them all
    workers = {child.pid for child in psutil.Process().children(recursive=True)}
    for _ in range(5):
        with stage(itertools.count()) as stream:
            assert list(itertools.islice(stream, 3)) == [0, 2, 4]  # the rest is dropped
    assert list(stage(range(10))) == [2 * x for x in range(10)]
    assert set(loky(pid)(range(100))) <= workers  # none was killed and replaced


def test_two_runs_of_one_stage_at_once_get_their_own_results():
    stage = loky(double)
    a, b = stage(range(0, 300)), stage(range(1000, 1300))
    out_a, out_b = [], []
    for x, y in zip(a, b):
        out_a.append(x)
        out_b.append(y)
    assert out_a == [2 * x for x in range(300)] and out_b == [2 * x for x in range(1000, 1300)]


@pytest.mark.parametrize("backend", ["loky", "threading"])
@pytest.mark.parametrize("n_workers", [1, 2])
def test_seeded_results_do_not_depend_on_workers_or_backend(backend, n_workers):
    reference = list(fp.stream.map(noisy, seed=5)(range(60)))
    stage = fp.processes(noisy, n_workers=n_workers, backend=backend, seed=5,
                         options=fp.ParallelOptions(chunk_size=7))
    assert list(stage(range(60))) == reference
    unordered = fp.processes(noisy, n_workers=n_workers, backend=backend, seed=5,
                             ordered=False, options=fp.ParallelOptions(chunk_size=3))
    assert sorted(unordered(range(60))) == sorted(reference)


def test_a_worker_error_arrives_whole_after_the_items_before_it():
    got = []
    with pytest.raises(KeyError, match="bad item 7") as raised:
        for x in loky(fail_at, options=fp.ParallelOptions(chunk_size=2))(range(30)):
            got.append(x)
    assert got == list(range(7))
    assert "in fail_at" in str(raised.value.__cause__)  # the worker's traceback


def test_a_worker_traceback_shows_the_file_line_and_source_of_a_function_sent_by_value():
    def local(x):  # pickled by value, as lambdas and the functions of __main__ are
        return x if x < 3 else {}["no such key"]

    with pytest.raises(KeyError) as raised:
        list(loky(local)(range(5)))
    worker = str(raised.value.__cause__)
    line = local.__code__.co_firstlineno + 1
    assert f'File "{__file__}", line {line}, in local' in worker
    assert 'return x if x < 3 else {}["no such key"]' in worker and "<dynamic-code>" not in worker


def test_a_result_that_does_not_pickle_ends_the_results_after_those_before_it():
    got = []
    with pytest.raises(TypeError, match="result for item 20 .*does not pickle.*lock"):
        for x in loky(lock_at, options=fp.ParallelOptions(chunk_size=64))(range(100)):
            got.append(x)
    assert got == list(range(20))


def test_an_exception_that_does_not_pickle_arrives_as_a_worker_error():
    def unpicklable(x):
        error = ValueError("with a lock")
        error.lock = threading.Lock()
        raise error

    with pytest.raises(fp.WorkerError, match="ValueError: with a lock"):
        list(loky(unpicklable)(range(3)))


def test_a_dead_worker_is_reported_and_the_stage_recovers():
    with pytest.raises(Exception, match="(?i)terminated|killed|exit"):
        list(loky(exit_worker)(range(4)))
    assert list(loky(double)(range(5))) == [0, 2, 4, 6, 8]


def test_no_thread_or_process_leaks_after_100_cycles():
    stage = loky(double)
    me = psutil.Process()

    def cycle():
        with pipe(range(1000), fp.prefetch(8), stage, fp.batch(8)) as stream:
            next(stream)

    cycle()
    threads, children = threading.active_count(), len(me.children())
    for _ in range(100):
        cycle()
    assert threading.active_count() <= threads and len(me.children()) <= children


def on_threads(func, **kwargs):
    # other backends than loky go through one joblib generator per stage
    return fp.processes(func, n_workers=2, backend="threading", **kwargs)


def test_the_joblib_generator_ends_after_the_last_task_and_restarts():
    stage = on_threads(double)
    assert list(stage(range(3))) == [0, 2, 4]
    pump = stage._pool._pump
    pump.join(10)
    assert not pump.is_alive()
    assert list(stage(range(3))) == [0, 2, 4]


def test_a_forgotten_stage_ends_its_joblib_generator_at_once(monkeypatch):
    # The keep-alive is an hour here: only the end of the stage can end its generator. Before,
    # every stage built for a short pipeline and dropped kept feeding idle tasks to the shared
    # workers for a second, and the stages after it waited behind them.
    monkeypatch.setattr(_joblib, "_KEEP_ALIVE", 3600.0)
    kept, dropped = on_threads(double), on_threads(double)
    pools = [kept._pool, dropped._pool]
    for stage in (kept, dropped):
        stream = pipe(range(10**6), stage, fp.take(5))
        assert [next(stream) for _ in range(5)] == [0, 2, 4, 6, 8]
        del stream  # forgotten, not closed
    del stage, dropped
    gc.collect()
    kept_pump, dropped_pump = (pool._pump for pool in pools)
    dropped_pump.join(60)  # a bound for a hang, not a timing: it ends as soon as joblib asks
    assert not dropped_pump.is_alive()
    assert kept_pump.is_alive()  # a stage that can still be used keeps its workers fed
    kept.close()
    assert not kept_pump.is_alive()


def test_backend_is_checked_and_shown():
    with pytest.raises(TypeError, match="backend must be a joblib backend"):
        fp.processes(double, backend=3)
    from joblib.parallel import MultiprocessingBackend

    for backend in ["multiprocessing", MultiprocessingBackend()]:  # joblib does not stream it
        with pytest.raises(ValueError, match="backend=.*ultiprocessing.* cannot run a process "
                                             "stage.*'loky'.*'threading'.*'dask'"):
            fp.processes(double, n_workers=2, backend=backend)
    assert repr(fp.processes(double, n_workers=2, backend="threading")) == (
        "processes(double, n_workers=2, backend='threading')")


def test_a_closed_run_drops_the_tasks_that_no_worker_took(tmp_path):
    # 24 chunks of one item are sent at once; loky hands a worker its task, and holds one
    # more in its queue: closing the run after the first result cancels the rest, so a stage
    # that starts next has the workers at once instead of after the forgotten work
    log = tmp_path / "done"
    stage = loky(functools.partial(logged_sleep, log=log), buffer_chunks=20,
                 options=fp.ParallelOptions(chunk_size=1))
    stream = stage(range(10**6))
    next(stream)
    stream.close()
    deadline = time.monotonic() + 60  # a bound for a hang, not a timing
    while stage._pool.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not stage._pool.running()
    assert len(log.read_text().split()) < 12


def test_a_slow_consumer_is_not_flooded():
    counter = [0]

    def source():
        for i in itertools.count():
            counter[0] = i + 1
            yield i

    stream = loky(double, buffer_chunks=1, options=fp.ParallelOptions(chunk_size=4))(source())
    taken = len(stream.pull(1))
    time.sleep(0.3)
    assert counter[0] - taken <= (2 * 2 + 1) * 4  # (2 n_workers + buffer_size) chunks
    stream.close()


def test_all_cores_and_a_closed_stage_that_is_used_again():
    stage = fp.processes(double, n_workers=-1, backend="threading")
    assert list(stage(range(20))) == [2 * x for x in range(20)]
    stage.close()
    assert not stage._pool._pump.is_alive()
    assert list(stage(range(3))) == [0, 2, 4]
    stage.close()


def freed_memory_kept(_):
    """In a worker: whether 32 MiB of arrays, freed, stay in the process for reuse."""
    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    arrays = [np.ones(2**21) for _ in range(2)]  # 16 MiB each: below the mmap threshold
    held = resident()
    del arrays
    return held - resident() < 2**24  # less than half of it went back to the system


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_workers_keep_freed_memory_for_the_next_task():
    # glibc hands freed arrays back to the system by default, and a worker that makes the
    # same arrays task after task page-faults them in anew each time
    assert all(loky(freed_memory_kept)(range(4)))


KEPT_FOR_A_BLOCK = """
import os, tempfile
import numpy as np
from fpipe.prepare import from_generator, write_dataset
from fpipe.stream.parallel._joblib import freed_memory_kept
from tests.streaming.test_processes import freed_memory_kept as kept_here

def checked(sample):
    return {**sample, "kept": kept_here(None)}

before = kept_here(None)
with freed_memory_kept():
    inside = kept_here(None)
after = kept_here(None)
out = os.path.join(tempfile.mkdtemp(dir=os.environ["SCRATCH"]), "out")
write_dataset(from_generator(lambda n: ({"key": str(i)} for i in range(n)), [2]), out, checked,
              n_workers=1, progress=False)
from fpipe.dataset import ShardedReader
print(before, inside, after, [s["kept"] for s in ShardedReader(os.path.join(out, "dataset.shards"))])
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_a_process_of_a_dask_nanny_keeps_freed_memory_while_it_prepares_a_partition(tmp_path):
    # a dask worker's nanny sets MALLOC_TRIM_THRESHOLD_=65536: every freed buffer goes back to
    # the system, and a partition of image work page-faulted them in again (half as long again)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MALLOC_TRIM_THRESHOLD_": "65536",
           "SCRATCH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", KEPT_FOR_A_BLOCK], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "False True False [True, True]\n", result.stdout


def test_a_process_whose_environment_sets_no_malloc_option_keeps_glibcs_own(monkeypatch):
    # glibc adapts its thresholds to the program unless an option is set; once set, they stay
    calls = []

    class Glibc:
        def mallopt(self, option, value):
            calls.append((option, value))

    monkeypatch.setattr(_joblib.ctypes, "CDLL", lambda _: Glibc())
    monkeypatch.setattr(_joblib, "_kept", [])
    for variable in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.delenv(variable, raising=False)
    with _joblib.freed_memory_kept():
        pass
    assert calls == []
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with _joblib.freed_memory_kept():
        assert calls == list(_joblib._MALLOPT.items())
    assert calls[3:] == [(-1, 65536), (-2, 128 << 10), (-3, 128 << 10)]
