"""Process stages in the contexts where joblib runs no worker processes, or not the usual way:
daemon processes (DataLoader workers), forked children, user threads at interpreter exit,
Ctrl-C before the first result. Each scenario runs in a fresh interpreter with a generous
deadline: these are hang checks, and a busy machine must pass them."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import fpipe as fp
from fpipe.stream.parallel import _joblib

from ..signals import check_interruptible, start_interruptible

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 300.0  # only catches a hang: each scenario takes a few seconds (minutes on a loaded machine)


def run(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, with this checkout's fpipe and tests importable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=DEADLINE)


DAEMON = """
import multiprocessing, os, sys
from tests.streaming.helpers import stage_in_a_child

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    results = context.Queue()
    child = context.Process(target=stage_in_a_child, args=(results, 2), daemon=True)
    child.start()
    outputs, warnings, pid = results.get(timeout=100)
    child.join(100)
    print(repr((outputs, warnings, pid, child.exitcode)))
"""


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_in_a_daemon_process_the_stage_runs_there_with_one_warning(method):
    result = run(DAEMON, method)
    assert result.returncode == 0, result.stderr
    outputs, warnings, pid, exitcode = eval(result.stdout)
    assert exitcode == 0
    assert outputs == [[(2 * x, pid) for x in range(20)]] * 2  # made in the daemon itself
    assert len(warnings) == 1 and "daemon process" in warnings[0]


LOADER = """
import sys, torch
from tests.streaming.loader_work import DoubledByProcesses

if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(DoubledByProcesses(40), batch_size=None,
                                         num_workers=2, multiprocessing_context=sys.argv[1])
    for epoch in range(2):
        items = list(loader)
        print(sorted(int(doubled) for doubled, _, _ in items))
        print(all(int(made_by) == int(worker) for _, made_by, worker in items))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataloader_whose_dataset_uses_a_process_stage(method):
    pytest.importorskip("torch")
    result = run(LOADER, method)
    assert result.returncode == 0, result.stderr
    expected = f"{[2 * x for x in range(40)]}\nTrue\n"
    assert result.stdout == expected * 2
    assert "Traceback" not in result.stderr


FORKED = """
import multiprocessing, os, sys
import fpipe as fp
from tests.streaming.helpers import doubled_here, stage_in_a_child

if __name__ == "__main__":
    assert list(fp.processes(doubled_here, n_workers=2)(range(3)))  # the parent's pool
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=stage_in_a_child, args=(results, int(sys.argv[1])))
    child.start()
    outputs, warnings, pid = results.get(timeout=100)
    child.join(100)
    print(repr((outputs, warnings, pid, child.exitcode)))
"""


@pytest.mark.parametrize("n_workers", [2, 3])
def test_a_forked_child_of_a_process_that_used_the_pool_gets_its_own(n_workers):
    result = run(FORKED, str(n_workers))
    assert result.returncode == 0, result.stderr
    outputs, warnings, pid, exitcode = eval(result.stdout)
    assert exitcode == 0 and not warnings
    for output in outputs:  # made by the child's own worker processes
        assert [doubled for doubled, _ in output] == [2 * x for x in range(20)]
        assert pid not in {made_by for _, made_by in output}
    assert "Traceback" not in result.stderr and "leaked" not in result.stderr


OS_FORKED = """
import faulthandler, os
import fpipe as fp
from tests.streaming.helpers import doubled_here

assert list(fp.processes(doubled_here, n_workers=2)(range(3)))  # the parent's pool
pid = os.fork()
# a hang shows where each process waits (the child's stacks, then the parent's) before the
# deadline; armed after the fork (a child that inherits an armed one waits on its thread for ever)
faulthandler.dump_traceback_later(200 if pid == 0 else 220, exit=True)
if pid == 0:  # no multiprocessing hook prepares this child; it ends the way such children do
    doubled = [x for x, _ in fp.processes(doubled_here, n_workers=3)(range(5))]
    os._exit(0 if doubled == [0, 2, 4, 6, 8] else 1)
print(os.waitpid(pid, 0)[1])
"""


def test_a_child_of_a_plain_fork_gets_its_own_pool_too():
    result = run(OS_FORKED)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0\n", result.stderr


THREAD = """
import functools, sys, threading
from toolz import pipe
import fpipe as fp
from tests.streaming.helpers import slow_double

def train(shape, started):
    # chunks wait in loky
    stage = fp.processes(functools.partial(slow_double, seconds=0.05), n_workers=2, buffer_chunks=8)
    if shape == "alone":
        items = pipe(range(100), stage)
    elif shape == "prefetched":  # a daemon thread of fpipe's reads the process stage
        items = pipe(range(100), stage, fp.prefetch(4))
    else:  # so does Infinite's
        batches = fp.Infinite(range(100), stage, batch_size=10, batches_per_epoch=10,
                              combiner=list)
        items = (x for batch in batches() for x in batch)
    out = []
    for x in items:
        out.append(x)
        started.set()  # the main thread returns now, with chunks in the workers
    print("done", out == [2 * x for x in range(100)], flush=True)

if sys.argv[1] == "warm":
    list(fp.processes(slow_double, n_workers=2)(range(4)))
started = threading.Event()
threading.Thread(target=train, args=(sys.argv[2], started)).start()
started.wait()
"""


@pytest.mark.parametrize("shape", ["alone", "prefetched", "Infinite"])
@pytest.mark.parametrize("pool", ["cold", "warm"])
def test_a_user_thread_finishes_its_process_stage_after_the_main_thread_returns(pool, shape):
    result = run(THREAD, pool, shape)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done True\n" and "Traceback" not in result.stderr


BEFORE_THE_FIRST_RESULT = """
import functools
import sys
import fpipe as fp
from tests.streaming.helpers import announced_sleep

work = functools.partial(announced_sleep, seconds=30.0, flag=sys.argv[1])
for item in fp.processes(work, n_workers=2)(range(10)):
    print(item)
"""


@pytest.mark.timeout(300)
def test_ctrl_c_before_the_first_result_ends_the_program(tmp_path):
    flag = tmp_path / "started"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    victim = start_interruptible([sys.executable, "-c", BEFORE_THE_FIRST_RESULT, str(flag)],
                                 cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(flag.exists, victim)
        check_interruptible(victim.pid)
        workers = psutil.Process(victim.pid).children(recursive=True)
        victim.send_signal(signal.SIGINT)
        _, stderr = victim.communicate(timeout=DEADLINE)
    finally:
        if victim.poll() is None:  # a hang: end it and what it started
            for process in psutil.Process(victim.pid).children(recursive=True):
                process.kill()
            victim.kill()
            victim.communicate()
    assert victim.returncode != 0 and stderr.rstrip().endswith("KeyboardInterrupt"), stderr
    assert stderr.count("Traceback") == 1, stderr  # the interrupt's own, nothing of loky's
    assert not psutil.wait_procs(workers, timeout=DEADLINE)[1]


def _wait_for(predicate, victim: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline, "the victim's workers never started"
        time.sleep(0.05)


@pytest.mark.timeout(DEADLINE)
def test_an_error_in_handing_a_chunk_to_the_pool_reaches_the_consumer(monkeypatch):
    def refused(*args):
        raise RuntimeError("the pool refused the chunk")

    monkeypatch.setattr(_joblib, "_loky_submit", refused)
    with pytest.raises(RuntimeError, match="the pool refused the chunk"):
        list(fp.processes(abs, n_workers=2)(range(10)))


RESIZED = """
import functools, threading, warnings
import fpipe as fp
from tests.streaming.helpers import slow_double

def consume(n_workers, barrier, out):
    barrier.wait()
    work = functools.partial(slow_double, seconds=0.002)
    out[n_workers] = list(fp.processes(work, n_workers=n_workers)(range(100)))

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for trial in range(5):
        barrier, out = threading.Barrier(2), {}
        threads = [threading.Thread(target=consume, args=(n, barrier, out)) for n in (2, 3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert out == {n: [2 * x for x in range(100)] for n in (2, 3)}
print([str(warning.message) for warning in caught])
"""


def test_stages_of_two_sizes_started_at_once_from_two_threads_share_the_pool_unresized():
    result = run(RESIZED)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"
