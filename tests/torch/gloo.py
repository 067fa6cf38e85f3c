"""Run a module as the ranks of a real gloo process group on this machine, one interpreter a
rank, with a deadline: a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(module: str, args: list[list[str]], reports: list[Path], what: str) -> list[dict]:
    """Run ``python -m module *args[rank]`` for each rank and return the JSON each wrote to
    ``reports[rank]``; ``what`` names the run in the failure of a rank that hangs."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": str(len(args)), "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    ranks = [subprocess.Popen([sys.executable, "-m", module, *rank_args], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank_args in args]
    try:
        outputs = [rank.communicate(timeout=TIMEOUT)[0] for rank in ranks]
    except subprocess.TimeoutExpired:
        for rank in ranks:
            rank.kill()
        pytest.fail(f"{what} did not finish in {TIMEOUT} s: a rank hangs")
    for rank, output in zip(ranks, outputs):
        assert rank.returncode == 0, output
    return [json.loads(report.read_text()) for report in reports]
