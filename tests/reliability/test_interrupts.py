"""Ctrl-C during an ``Infinite`` loop, during a DataLoader loop, and before a process stage's
first result, in a fresh interpreter each.

The victim runs a pipeline with threads and worker processes. It starts with SIGINT at its
default disposition whatever this process ignores (a background job of a shell script ignores
SIGINT), and the test checks that it catches SIGINT before sending it. Once it is running it gets
SIGINT, either alone (``kill -INT``) or with its whole process group (what Ctrl-C in a terminal
does). The target: it exits within 2 s, and so does every process it started. The tests fail
on a hang (a process still running 20 s after the signal) and record the times, which the
reliability page reports against the target (a busy machine slows an interpreter's exit, so no
timing is asserted). The soak (``-m soak``) repeats each trial ``FPIPE_SOAK_TRIALS`` times
beside two CPU burners.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from ..signals import check_interruptible, start_interruptible
from .conftest import psutil
from .files import write_dataset

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
TARGET = 2.0  # seconds from SIGINT until the victim and its children have exited
HANG = 20.0

# every victim dumps all its threads' stacks on SIGUSR1, so that a hang shows where it hangs
STACKS_ON_SIGUSR1 = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1)\n"

INFINITE = """
import itertools
import fpipe as fp
from tests.reliability.workers import slow_identity

batch_iter = fp.Infinite(itertools.count(), fp.Threads(slow_identity, n_workers=2),
                         fp.Loky(slow_identity, n_workers=2), batch_size=8,
                         batches_per_epoch=10**9, combiner=list)
for number, batch in enumerate(batch_iter()):
    if number == 20:
        print("running", flush=True)
"""

DATALOADER = """
import sys
import torch
import fpipe.torch as ft
from fpipe.dataset import MsgpackReader

def slow(x):
    import time
    time.sleep(0.001)
    return x

dataset = ft.Dataset(MsgpackReader(sys.argv[1]), transforms={"x": ft.Compose(slow)})
loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=2, shuffle=True)
for epoch in range(10**9):
    for number, batch in enumerate(loader):
        if epoch == 0 and number == 20:
            print("running", flush=True)
"""


BEFORE_THE_FIRST_RESULT = """
import fpipe as fp
from tests.reliability.workers import announced_sleep

for item in fp.processes(announced_sleep, n_workers=2)(range(10)):
    pass
"""


def interrupt(code: str, args: list[str], group: bool) -> dict:
    """Start ``code``, wait until it prints "running", send SIGINT; measure the exit."""
    victim = start_interruptible([sys.executable, "-c", STACKS_ON_SIGUSR1 + textwrap.dedent(code),
                                  *args], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert victim.stdout.readline().strip() == "running", victim.stderr.read()
        check_interruptible(victim.pid)
        time.sleep(np.random.default_rng().uniform(0.05, 0.5))
        descendants = psutil.Process(victim.pid).children(recursive=True)
        sent = time.monotonic()
        if group:
            os.killpg(victim.pid, signal.SIGINT)
        else:
            victim.send_signal(signal.SIGINT)
        try:
            victim.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the victim still ran 60 s after SIGINT; its stacks:\n"
                        f"{_stacks(victim, descendants)}")
        exited = time.monotonic() - sent
        alive = _wait_dead(descendants, sent + HANG)
        if alive:
            pytest.fail(f"processes still ran {HANG:.0f} s after SIGINT; their stacks:\n"
                        f"{_stacks(victim, alive)}")
        all_gone = time.monotonic() - sent
        stderr = victim.stderr.read()
    finally:
        if victim.poll() is None:  # the check failed: end the victim and what it started
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
    return {"exit": exited, "all_gone": all_gone, "strays": [p.pid for p in alive],
            "children": len(descendants), "returncode": victim.returncode, "stderr": stderr}


def _stacks(victim: subprocess.Popen, processes: list) -> str:
    """Every thread's stack of the victim and of ``processes`` (forked workers keep the
    victim's SIGUSR1 handler), read from the victim's stderr after it is killed."""
    pids = [victim.pid, *(process.pid for process in processes)]
    for pid in pids:
        _send(pid, signal.SIGUSR1)
    try:
        victim.wait(timeout=5)  # the dumps are written at once; this only lets them land
    except subprocess.TimeoutExpired:
        pass
    for pid in pids:
        _send(pid, signal.SIGKILL)
    return victim.communicate(timeout=60)[1]


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _dead(process) -> bool:
    """Whether ``process`` has ended. (An orphan stays a zombie until the machine's init
    reaps it, which some container inits do only every second or two.)"""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_dead(processes: list, deadline: float) -> list:
    """Wait until every process has ended, or the deadline; return the ones still running."""
    while True:
        alive = [p for p in processes if not _dead(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def _check(outcomes: list[dict], tracebacks: int | None = None) -> None:
    """Every victim was interrupted and left nothing running; with ``tracebacks``, its stderr
    holds that many tracebacks (the interrupt's own, nothing of its libraries')."""
    for outcome in outcomes:
        assert outcome["returncode"] != 0 and "KeyboardInterrupt" in outcome["stderr"], outcome
        assert outcome["children"] >= 2, "the victim had no worker processes to leave behind"
        assert not outcome["strays"] and outcome["all_gone"] < HANG, outcome
        assert tracebacks in (None, outcome["stderr"].count("Traceback")), outcome


def _report(record, check: str, outcomes: list[dict]) -> None:
    record(check, tried=len(outcomes),
           within_target=sum(o["all_gone"] < TARGET for o in outcomes),
           slowest_exit_seconds=round(max(o["exit"] for o in outcomes), 3),
           slowest_all_gone_seconds=round(max(o["all_gone"] for o in outcomes), 3))


def _trials() -> list:
    """One trial on an idle machine by default; the soak repeats it ``FPIPE_SOAK_TRIALS``
    times (default 25) beside two CPU burners."""
    soak = int(os.environ.get("FPIPE_SOAK_TRIALS", "25"))
    return [pytest.param(1, 0, id="default"),
            pytest.param(soak, 2, id="soak", marks=pytest.mark.soak)]


@contextmanager
def cpu_load(burners: int) -> Iterator[None]:
    """``burners`` processes that spin on a core each while the block runs."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(burners)]
    try:
        yield
    finally:
        for burner in spinning:
            burner.kill()
            burner.wait()


@pytest.mark.parametrize("group", [False, True], ids=["process", "process group"])
@pytest.mark.parametrize(("trials", "burners"), _trials())
def test_ctrl_c_during_an_infinite_loop(group, trials, burners, record):
    with cpu_load(burners):
        outcomes = [interrupt(INFINITE, [], group) for _ in range(trials)]
    _check(outcomes)
    target = "the process group" if group else "the process"
    _report(record, f"SIGINT to {target} during an Infinite loop", outcomes)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    rng = np.random.default_rng(0)
    samples = [{"key": f"k{i}", "x": rng.normal(size=(3, 8, 8)).astype("<f4"), "label": i % 10}
               for i in range(2000)]
    return str(write_dataset(tmp_path_factory.mktemp("loader") / "set.msgpack", samples))


@pytest.mark.parametrize("group", [False, True], ids=["process", "process group"])
@pytest.mark.parametrize(("trials", "burners"), _trials())
def test_ctrl_c_during_a_dataloader_loop(images, group, trials, burners, record):
    pytest.importorskip("torch")
    with cpu_load(burners):
        outcomes = [interrupt(DATALOADER, [images], group) for _ in range(trials)]
    _check(outcomes)
    target = "the process group" if group else "the process"
    _report(record, f"SIGINT to {target} during a DataLoader loop (2 workers)", outcomes)


@pytest.mark.parametrize("group", [False, True], ids=["process", "process group"])
@pytest.mark.parametrize(("trials", "burners"), _trials())
def test_ctrl_c_before_a_process_stages_first_result(group, trials, burners, record):
    with cpu_load(burners):
        outcomes = [interrupt(BEFORE_THE_FIRST_RESULT, [], group) for _ in range(trials)]
    _check(outcomes, tracebacks=1)
    target = "the process group" if group else "the process"
    _report(record, f"SIGINT to {target} before a process stage's first result (30 s items)",
            outcomes)
