"""A writer killed with SIGKILL at a random moment, and a write that fails for want of space.

After a kill, ``fpipe index`` recovers every sample that the data file holds whole. A write
that fails with ENOSPC raises an OSError that names the file and says what it keeps; the
samples written before are intact, and ``fpipe index`` recovers them.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from itertools import accumulate
from pathlib import Path

import numpy as np
import pytest

import fpipe.dataset.writer as writer_module
from fpipe.cli import main
from fpipe.dataset import FileWriter, MsgpackReader, pack_sample

from .workers import written_sample as sample

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]


def whole_samples(size: int, count: int) -> int:
    """How many of the first ``count`` samples a data file of ``size`` bytes holds whole."""
    for i, end in enumerate(accumulate(len(pack_sample(sample(i))) for i in range(count))):
        if end > size:
            return i
    return count


def recovered(path: Path) -> list[dict]:
    assert main(["index", "-q", str(path)]) == 0
    assert main(["verify", "-q", str(path)]) == 0
    return list(MsgpackReader(path))


# --- SIGKILL ----------------------------------------------------------------------------------

VICTIM = """
import sys, time
from fpipe.dataset import FileWriter
from tests.reliability.workers import written_sample as sample

path, buffering, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
writer = FileWriter(path, buffering=buffering)
for i in range(count):
    writer.write(sample(i))
    if i == 100:
        print("running", flush=True)
writer.close()
print("closed", flush=True)
time.sleep(600)
"""


def kill_a_writer(path: Path, buffering: int, count: int, after: float) -> str:
    """Start a writer of ``count`` samples and SIGKILL it ``after`` seconds into its work;
    return how far it got ("running" or "closed")."""
    victim = subprocess.Popen([sys.executable, "-c", textwrap.dedent(VICTIM), str(path),
                               str(buffering), str(count)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert victim.stdout.readline().strip() == "running"
        time.sleep(after)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=60)
        return "closed" if victim.stdout.readline().strip() == "closed" else "running"
    finally:
        if victim.poll() is None:
            victim.kill()


@pytest.mark.parametrize("kills", [pytest.param(3, id="default"),
                                   pytest.param(40, id="soak", marks=pytest.mark.soak)])
def test_fpipe_index_recovers_every_whole_sample_of_a_killed_writer(tmp_path, kills, record):
    rng = np.random.default_rng()
    stages, samples = {"running": 0, "closed": 0}, 0
    for trial in range(kills):
        path = tmp_path / f"killed{trial}.msgpack"
        buffering = int(rng.choice([0, 4096, 1 << 20]))
        count = int(rng.choice([20_000, 2_000_000]))  # closed before the kill, or not
        stages[kill_a_writer(path, buffering, count, float(rng.uniform(0.0, 0.25)))] += 1
        whole = whole_samples(path.stat().st_size, count)
        got = recovered(path)
        assert len(got) == whole and got == [sample(i) for i in range(whole)]
        samples += whole
    record("a writer killed with SIGKILL at a random moment, then fpipe index", tried=kills,
           killed_while_writing=stages["running"], killed_after_close=stages["closed"],
           samples_recovered=samples)


# --- ENOSPC -----------------------------------------------------------------------------------


def _full_after(budget: int):
    """A ``_write_all`` for a disk that has room for ``budget`` more bytes: it writes what
    fits, then fails as a full disk does."""
    left = [budget]

    def write_all(fd: int, block) -> None:
        view = memoryview(block)
        room = min(len(view), left[0])
        if room:
            os.write(fd, view[:room])
            left[0] -= room
        if room < len(view):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_all


def write_until_full(path: Path, buffering: int) -> tuple[OSError, int]:
    """Write samples until the writer raises; return the error and the samples written."""
    count = 0
    with pytest.raises(OSError) as raised:
        with FileWriter(path, buffering=buffering) as writer:
            for count in range(10**6):
                writer.write(sample(count))
    return raised.value, count


def _check_full(path: Path, error: OSError, count: int) -> int:
    whole = whole_samples(path.stat().st_size, count + 1)
    assert error.errno == errno.ENOSPC and error.filename == str(path), error
    assert f"keeps the first {whole} samples whole" in str(error) and "fpipe index" in str(error)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "an index was written"
    assert recovered(path) == [sample(i) for i in range(whole)]
    return whole


@pytest.mark.parametrize("buffering", [0, 4096, 1 << 20])
@pytest.mark.parametrize("budget", [0, 1, 50_000, 333_333])
def test_a_write_that_finds_the_disk_full(tmp_path, monkeypatch, buffering, budget, record):
    monkeypatch.setattr(writer_module, "_write_all", _full_after(budget))
    path = tmp_path / "full.msgpack"
    error, count = write_until_full(path, buffering)
    monkeypatch.undo()
    whole = _check_full(path, error, count)
    record(f"ENOSPC (simulated) after {budget} bytes, buffering {buffering}", tried=1,
           samples_kept=whole)


def _mount_tmpfs(folder: Path, size: str) -> bool:
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"),
                    reason="mounting a tiny tmpfs needs root")
def test_a_write_that_fills_a_real_tmpfs(tmp_path, record):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "256k"):
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        for buffering in (0, 4096, 1 << 20):
            path = disk / "full.msgpack"
            error, count = write_until_full(path, buffering)
            whole = whole_samples(path.stat().st_size, count + 1)
            assert error.errno == errno.ENOSPC and f"first {whole} samples whole" in str(error)
            assert sorted(p.name for p in disk.iterdir()) == [path.name]
            # room for the index: what a user does before running fpipe index (a folder of
            # its own each time, where the cut-off incomplete sample is kept too)
            (tmp_path / f"{buffering}").mkdir()
            moved = shutil.move(path, tmp_path / f"{buffering}" / path.name)
            assert recovered(Path(moved)) == [sample(i) for i in range(whole)]
            record(f"ENOSPC on a real 256 KiB tmpfs, buffering {buffering}", tried=1,
                   samples_kept=whole)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
