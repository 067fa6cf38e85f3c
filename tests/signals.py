"""Signal dispositions in the test suite: victims that Ctrl-C can reach, and a guard that fails
any test after which the test process handles a signal differently.

A background job of a non-interactive shell starts with SIGINT and SIGQUIT ignored (POSIX), and
an ignored signal stays ignored in every program it starts. Python then installs no
KeyboardInterrupt handler, so a victim started from such a shell cannot be interrupted at all.
:func:`start_interruptible` starts victims with SIGINT at its default disposition, whatever the
test process ignores, and :func:`check_interruptible` proves, before a test sends the signal,
that the victim will see it.

The guard (the autouse fixture :func:`signal_dispositions_kept`, loaded for every test by the
root ``conftest.py``) catches the opposite mistake: a test, or an fpipe path under test, that
leaves the test process deaf to Ctrl-C (Lightning sets ``SIG_IGN`` for SIGINT in places).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGCHLD)


def default_sigint() -> None:
    """``preexec_fn`` for ``subprocess``: SIGINT at its default disposition in the child (it
    runs between fork and exec; an ignored signal would survive the exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_interruptible(argv: list[str], **options: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **options)``, with SIGINT at its default disposition in the
    child, so that a Python child installs its KeyboardInterrupt handler."""
    return subprocess.Popen(argv, preexec_fn=default_sigint, **options)


def _signal_masks(pid: int) -> dict[str, int]:
    """The kernel's signal masks of process ``pid``: ignored, caught and blocked."""
    masks = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("SigIgn", "SigCgt", "SigBlk"):
            masks[name] = int(value, 16)
    return masks


def check_interruptible(pid: int) -> None:
    """Fail the test, saying why, unless process ``pid`` catches SIGINT (as a Python process
    does with its KeyboardInterrupt handler). Without ``/proc`` (not Linux) there is nothing
    to read, and the test goes on."""
    if sys.platform != "linux":
        return
    masks = _signal_masks(pid)
    bit = 1 << (signal.SIGINT - 1)
    if masks["SigIgn"] & bit:
        pytest.fail(f"the victim (pid {pid}) ignores SIGINT (SigIgn {masks['SigIgn']:016x}): "
                    "it inherited SIG_IGN, so sending SIGINT would test nothing")
    if not masks["SigCgt"] & bit:
        pytest.fail(f"the victim (pid {pid}) has no SIGINT handler (SigCgt {masks['SigCgt']:016x}): "
                    "Python did not install its KeyboardInterrupt handler")


def dispositions() -> dict[signal.Signals, Any]:
    """The current disposition of each watched signal."""
    return {signum: signal.getsignal(signum) for signum in WATCHED}


def _torch_sigchld_handler(handler: Any) -> bool:
    # torch's DataLoader installs this SIGCHLD handler once per process, on purpose (it reports
    # workers that die, then calls the handler it replaced) and never again: it is kept
    return getattr(handler, "__module__", "") == "torch.utils.data._utils.signal_handling"


def _changes(before: dict, after: dict) -> dict:
    changed = {}
    for signum, handler in after.items():
        kept_by_design = signum == signal.SIGCHLD and _torch_sigchld_handler(handler)
        if handler is not before[signum] and not kept_by_design:
            changed[signum] = (before[signum], handler)
    return changed


def _describe(handler: Any) -> str:
    names = {signal.SIG_DFL: "SIG_DFL", signal.SIG_IGN: "SIG_IGN",
             signal.default_int_handler: "Python's KeyboardInterrupt handler",
             None: "a handler not set from Python"}
    for known, name in names.items():
        if handler is known:
            return name
    return repr(handler)


def _restore(before: dict, changed: dict) -> None:
    for signum in changed:
        if before[signum] is not None:  # a handler set outside Python cannot be put back
            signal.signal(signum, before[signum])


@pytest.fixture(autouse=True)
def signal_dispositions_kept():
    """Fail the test if it leaves a watched signal handled differently than before it, and
    put the disposition back so the next test starts as this one did."""
    before = dispositions()
    yield
    changed = _changes(before, dispositions())
    _restore(before, changed)
    if changed:
        described = "; ".join(f"{signal.Signals(signum).name}: {_describe(old)} -> {_describe(new)}"
                              for signum, (old, new) in changed.items())
        pytest.fail(f"the test changed how this process handles signals: {described}")
