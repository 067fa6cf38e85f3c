"""Large arrays on their way to worker processes leave nothing behind in ``/dev/shm``: items
are pickled by fpipe (not memory-mapped by loky), and the files that loky maps a run's call's
large arrays into go once the run is over. Each case runs in a fresh interpreter, which
reports the files of its own pid and then exits."""

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

MAPPED = """
import functools, glob, os, tempfile, time
import numpy as np
from toolz import pipe
import fpipe as fp

def folders():
    return [folder for root in ("/dev/shm", tempfile.gettempdir())
            for folder in glob.glob(os.path.join(root, f"joblib_memmapping_folder_{os.getpid()}_*"))]

def mapped_bytes():
    # the files joblib memory-maps arrays into, for this process
    return sum(os.path.getsize(name) for folder in folders()
               for name in glob.glob(os.path.join(folder, "*")))

MIB = 2**20
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", MAPPED + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)


def _leftovers(pid: int) -> list[str]:
    return [name for root in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(root)
            for name in os.listdir(root) if name.startswith(f"joblib_memmapping_folder_{pid}_")]


def _check_quiet_exit(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stderr
    assert "leaked" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    pid = int(result.stdout.split()[0])
    assert _leftovers(pid) == []
    return pid


@pytest.mark.slow
def test_a_stream_of_large_items_keeps_nothing_in_shared_memory():
    result = run("""
        def first(a):
            a += 1  # writable, as any array a worker gets
            return float(a[0])

        items = (np.full(MIB, i, np.float32) for i in range(40))  # 4 MiB each
        firsts = list(pipe(items, fp.processes(first, n_workers=2,
                                                options=fp.ParallelOptions(chunk_size=1))))
        assert firsts == [i + 1.0 for i in range(40)], firsts
        print(os.getpid(), mapped_bytes())
        """)
    _check_quiet_exit(result)
    assert int(result.stdout.split()[1]) == 0, result.stdout  # 160 MiB before


@pytest.mark.slow
def test_runs_whose_calls_hold_new_large_arrays_do_not_pile_up():
    # each run's table is a new array of 2 MiB, memory-mapped for the workers into a folder of
    # its run; a worker keeps the calls of its last four runs, and with them their maps
    result = run("""
        def look_up(i, table):
            return int(table[i])

        for run in range(20):
            table = np.arange(MIB // 4, dtype=np.int64) + run
            stage = fp.processes(functools.partial(look_up, table=table), n_workers=2,
                                 options=fp.ParallelOptions(chunk_size=1))
            assert list(pipe(range(8), stage)) == [i + run for i in range(8)]
        deadline = time.monotonic() + 60  # the workers' unmaps reach joblib's tracker
        while mapped_bytes() > 8 * 2 * MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        print(os.getpid(), mapped_bytes(), len(folders()))
        """)
    _check_quiet_exit(result)
    pid, mapped, folders = map(int, result.stdout.split())
    assert mapped <= 8 * 2 * 2**20, result.stdout  # 40 MiB before
    assert folders <= 10, result.stdout  # the runs' folders go too, once their files have
