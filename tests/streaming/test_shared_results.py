"""processes() hands large arrays back in shared memory: on by default on loky, off by an
argument and on backends whose workers may be elsewhere; faults leave no segment in /dev/shm
(counted before and after) and no worker behind a killed consumer."""

from __future__ import annotations

import functools
import gc
import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
from toolz import pipe

import fpipe as fp
from fpipe.stream.parallel import _shm

from .helpers import exit_worker, large
from .test_shm import ROOT, alive, settled_names, wait_until

pytestmark = [pytest.mark.skipif(not _shm.available(), reason="no /dev/shm on this system"),
              pytest.mark.timeout(300)]


def picture(i: int) -> tuple:
    return np.full((128, 128, 3), i % 256, np.uint8), {"label": i, "tiny": np.arange(3)}


def picture_batch(ids: list) -> tuple:
    return np.stack([picture(i)[0] for i in ids]).astype(np.float32), np.asarray(ids)


def own_names() -> list[str]:
    return _shm.names(os.getpid())


def test_large_arrays_come_back_as_views_and_equal_the_pipes():
    shared = list(fp.processes(picture, n_workers=2)(range(100)))
    piped = list(fp.processes(picture, n_workers=2,
                              options=fp.ParallelOptions(shared_memory=False))(range(100)))
    assert all(_shm.is_shared(image) for image, _ in shared)
    assert not any(_shm.is_shared(image) for image, _ in piped)
    assert not any(_shm.is_shared(fields["tiny"]) for _, fields in shared)
    for (a, fa), (b, fb) in zip(shared, piped):
        np.testing.assert_array_equal(a, b)
        assert fa["label"] == fb["label"]
    del shared
    assert own_names() == []


def test_whole_batches_made_in_the_workers_cross_in_shared_memory():
    batches = list(pipe(range(96), fp.batch(32), fp.processes(picture_batch, n_workers=2)))
    assert [labels.tolist() for _, labels in batches] == [list(range(i, i + 32))
                                                          for i in (0, 32, 64)]
    assert all(_shm.is_shared(images) and images.shape == (32, 128, 128, 3)
               for images, _ in batches)


def test_the_threading_backend_hands_over_the_objects_themselves():
    source = [np.ones((256, 256))]
    [out] = list(fp.processes(lambda x: x, n_workers=2, backend="threading")(source))
    assert out is source[0]


def test_a_small_budget_falls_back_to_the_pipe_with_one_warning():
    stage = fp.processes(picture_batch, n_workers=2, options=fp.ParallelOptions(shared_memory_budget=1 << 20))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(pipe(range(320), fp.batch(32), stage))
    fallbacks = [w for w in caught if "shared memory" in str(w.message)]
    assert len(fallbacks) == 1 and issubclass(fallbacks[0].category, RuntimeWarning)
    assert "budget" in str(fallbacks[0].message)
    assert [int(labels[0]) for _, labels in batches] == list(range(0, 320, 32))
    assert not any(_shm.is_shared(images) for images, _ in batches)
    assert own_names() == []


def test_a_dead_worker_leaves_no_segment():
    before = settled_names()
    with pytest.raises(Exception, match="(?i)terminated|killed|exit"):
        list(fp.processes(_picture_then_exit, n_workers=2)(range(8)))
    assert own_names() == before == []
    assert len(list(fp.processes(picture, n_workers=2)(range(10)))) == 10


def _picture_then_exit(i: int):
    if i == 5:
        exit_worker(i)
    return picture(i)


def test_torch_tensors_come_back_as_tensors_viewing_shared_memory():
    torch = pytest.importorskip("torch")
    import fpipe.torch  # noqa: F401

    with fp.processes(_tensor, n_workers=2)(range(6)) as stream:
        out = [next(stream) for _ in range(6)]
        slabs = list(_shm._reader().slabs.values())  # the run's slabs, until it ends
    assert all(isinstance(t, torch.Tensor) and t.shape == (3, 64, 64) for t in out)
    assert [int(t[0, 0, 0]) for t in out] == list(range(6))
    assert all(any(s.ctypes.data <= t.data_ptr() < s.ctypes.data + s.nbytes for s in slabs)
               for t in out)


def _tensor(i: int):
    import torch

    return torch.full((3, 64, 64), float(i))


@pytest.mark.parametrize("options, error", [
    ({"shared_memory": "yes"}, TypeError),
    ({"shared_memory": 1}, TypeError),
    ({"shared_memory_budget": -1}, ValueError),
    ({"shared_memory_budget": 1.5}, TypeError),
])
def test_bad_shared_memory_arguments_are_refused_at_construction(options, error):
    name = next(iter(options))
    with pytest.raises(error, match=name):
        fp.ParallelOptions(**options)


def test_the_repr_names_a_switched_off_transport():
    switched_off = fp.processes(picture, options=fp.ParallelOptions(shared_memory=False))
    assert "options=ParallelOptions(shared_memory=False)" in repr(switched_off)
    assert "shared_memory" not in repr(fp.processes(picture))


KILLED = """
import itertools
import psutil
import fpipe as fp
from tests.streaming.test_shared_results import picture

stream = fp.processes(picture, n_workers=2)(itertools.count())
held = [next(stream) for _ in range(50)]
print(" ".join(str(child.pid) for child in psutil.Process().children()), flush=True)
for item in stream:
    held = held[-50:] + [item]
"""


def test_a_killed_consumers_workers_exit_within_seconds_and_leave_no_segment(record_property):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED)], cwd=ROOT,
                               env=env, stdout=subprocess.PIPE, text=True)
    children = [int(pid) for pid in process.stdout.readline().split()]
    assert children, "the consumer started no worker"
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdout.close()
    seconds = wait_until(lambda: not any(alive(pid) for pid in children))
    record_property("workers_gone_seconds", round(seconds, 2))
    assert _shm.names(process.pid) == []


IDLE_WORKERS = """
import os, sys
import fpipe as fp
from fpipe.stream.parallel import _joblib
from tests.streaming.helpers import doubled_here

assert list(fp.processes(doubled_here, n_workers=3)(range(1)))  # one task for three workers
print(" ".join(str(pid) for pid in _joblib._loky["executor"]._processes), flush=True)
if sys.argv[1] == "early":  # ends while the idle workers may still be starting
    os._exit(0)
sys.stdin.readline()  # killed here, once each worker has started
"""


@pytest.mark.parametrize("when", ["early", "started"])
def test_workers_that_ran_no_task_exit_with_their_consumer(when):
    # joblib's idle workers wait five minutes for a task that cannot come; these watch their
    # consumer from their start (or exit at once if it died while they started)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(IDLE_WORKERS), when],
                               cwd=ROOT, env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    workers = [int(pid) for pid in process.stdout.readline().split()]
    assert len(workers) == 3
    if when == "started":
        wait_until(lambda: all(_watching(pid) for pid in workers), deadline=120)
        process.send_signal(signal.SIGKILL)
    process.wait()
    process.stdin.close()
    process.stdout.close()
    wait_until(lambda: not any(alive(pid) for pid in workers), deadline=120)  # not 300 s


def _watching(pid: int) -> bool:
    """Whether the worker ``pid`` has started a thread besides its main one: an idle loky
    worker runs none until it sends a result, so this is fpipe's thread watching the consumer."""
    try:
        return psutil.Process(pid).num_threads() >= 2
    except psutil.NoSuchProcess:
        return True  # exited: nothing left to watch for


def test_dpipe_style_loky_and_infinite_get_shared_memory_with_no_change():
    images = list(pipe(range(8), fp.Loky(picture, n_workers=2)))
    assert all(_shm.is_shared(image) for image, _ in images)
    with fp.Infinite(iter(range(64)), fp.Loky(picture, n_workers=2), batch_size=8,
                     batches_per_epoch=2, combiner=list) as batch_iter:
        batches = list(batch_iter())
    assert [len(b) for b in batches] == [8, 8]
    assert all(_shm.is_shared(image) for batch in batches for image, _ in batch)


def _mapped_slabs(pid: int, owner: int) -> list[str]:
    """The slabs of consumer ``owner`` that process ``pid`` maps (none if it has exited)."""
    mark = f"/{_shm.PREFIX}{os.getuid()}-{owner}-"
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return []
    return [line.split()[-2] for line in lines if mark in line]


def _wait_unmapped(processes: list[int], slabs: set[str]) -> None:
    """Wait until none of ``processes`` maps one of ``slabs``; say which still do."""
    def mapped() -> dict[int, list[str]]:
        return {pid: names for pid in processes
                if (names := sorted(slabs.intersection(_mapped_slabs(pid, os.getpid()))))}
    try:
        wait_until(lambda: not mapped())
    except AssertionError:
        still = {pid: (psutil.Process(pid).cmdline()[-1:], names) for pid, names in mapped().items()}
        raise AssertionError(f"slabs still mapped (pid: command, slabs): {still}") from None


def test_slabs_fit_their_results_and_are_let_go_of_when_the_run_ends():
    nbytes = 20 << 20
    stage = fp.processes(functools.partial(large, nbytes=nbytes), n_workers=2,
                         options=fp.ParallelOptions(chunk_size=1, shared_memory_budget=400 << 20))
    # the slabs of this run: earlier tests' arrays that are still alive keep theirs mapped
    before = set(_mapped_slabs(os.getpid(), os.getpid()))
    with stage(range(8)) as stream:
        out = [next(stream) for _ in range(8)]
        sizes = [slab.nbytes for slab in _shm._reader().slabs.values()]
        ours = set(_mapped_slabs(os.getpid(), os.getpid())) - before
    assert [int(x[0]) for x in out] == list(range(8)) and all(_shm.is_shared(x) for x in out)
    # room for a slightly larger result, but not twice the size
    assert sizes and all(nbytes < size <= nbytes + (4 << 20) + (1 << 16) for size in sizes)
    assert ours
    del out
    gc.collect()
    processes = [os.getpid()] + [child.pid for child in psutil.Process().children(recursive=True)]
    _wait_unmapped(processes, ours)
    assert _shm.names(os.getpid()) == []
