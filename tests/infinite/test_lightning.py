"""Infinite.closing_callback with a real Lightning Trainer, for ``lightning`` and for
``pytorch_lightning``, each in a fresh interpreter where it is the only one imported."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..signals import default_sigint

SCRIPT = Path(__file__).with_name("_lightning_fit.py")
ROOT = Path(__file__).parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_a_trainer_fits_two_epochs_from_an_infinite_and_the_callback_closes_it(package):
    pytest.importorskip(package)
    # SIGINT at its default disposition, so that the fit starts with Python's handler
    result = subprocess.run([sys.executable, str(SCRIPT), package], capture_output=True,
                            text=True, timeout=600, cwd=ROOT, preexec_fn=default_sigint)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    fit = report["fit"]
    assert fit["is_callback"] and fit["error"] is None
    assert fit["epochs"] == 2 and fit["steps"] == 10 and fit["seen"] == [8] * 10
    assert fit["threads_after"] == []  # teardown closed it
    failed = report["failed"]
    assert failed["error"] == "training failed" and failed["threads_after"] == []
    # without the callback the pipeline would still be running at that point
    assert report["without_callback"]["threads_after"] != []
    assert report["both"]
    # a Ctrl-C during setup (before the trainer keeps the signal handlers to put back):
    # Lightning ignores SIGINT and exits; the callback closes the pipeline and lets Ctrl-C
    # through again, where without it the process stays deaf to Ctrl-C
    interrupted = report["interrupted"]
    assert interrupted["error"] == "SystemExit(1)" and interrupted["threads_after"] == []
    assert interrupted["sigint"] == "default_int_handler", interrupted
    assert report["interrupted_without_callback"]["sigint"] == "SIG_IGN"
