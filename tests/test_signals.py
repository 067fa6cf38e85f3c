"""The guard of ``tests/signals.py``: a test that leaves a signal handled differently fails,
and the disposition is put back for the next test."""

import signal
from pathlib import Path

import pytest

CHANGES_SIGINT = """
import signal

def test_leaves_sigint_changed():
    signal.signal(signal.SIGINT, lambda signum, frame: None)

def test_changes_sigterm_and_puts_it_back():
    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, before)
"""

TORCH_SIGCHLD = """
import torch

def test_a_dataloader_with_workers():
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, num_workers=2)
    assert [batch.tolist() for batch in loader][0] == [0, 1]
"""


def test_a_test_that_leaves_a_signal_changed_fails_and_the_signal_is_put_back(pytester):
    before = signal.getsignal(signal.SIGINT)
    pytester.makepyfile(CHANGES_SIGINT)
    result = pytester.runpytest("-p", "tests.signals")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*the test changed how this process handles signals: SIGINT: *"])
    assert signal.getsignal(signal.SIGINT) is before


def test_torchs_own_sigchld_handler_is_allowed(pytester, monkeypatch):
    pytest.importorskip("torch")
    pytester.makepyfile(TORCH_SIGCHLD)
    # a fresh interpreter, where torch has not set its handler yet
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    result = pytester.runpytest_subprocess("-p", "tests.signals")
    result.assert_outcomes(passed=1)
