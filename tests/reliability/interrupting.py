"""Run the ``fpipe`` command with a signal sent to itself just before its Nth change of a name
in one folder: run as ``python -m tests.reliability.interrupting N SIGNAL FOLDER ARGS...``.

Each ``os.replace``, ``os.rename`` or ``os.unlink`` (``pathlib`` calls them too) whose
resulting name lies directly in FOLDER counts; just before the Nth, the process sends itself
SIGNAL (``INT``, ``TERM``, ``KILL``), so the signal lands at the same step of a commit in every
run, with no timing. With N = 0 nothing is sent, and the number of counted calls is printed
on stderr as ``renames: K`` when the process exits.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

from fpipe.cli import main


def _counting(real, wanted: int, folder: str, which: int, state: dict):
    def call(*args, **kwargs):
        if "dir_fd" not in kwargs and os.path.dirname(os.path.abspath(args[which])) == folder:
            state["count"] += 1
            if state["count"] == wanted:
                os.kill(os.getpid(), state["signal"])
        return real(*args, **kwargs)
    return call


def _install(wanted: int, number: int, folder: str) -> dict:
    state = {"count": 0, "signal": number}
    os.replace = _counting(os.replace, wanted, folder, 1, state)
    os.rename = _counting(os.rename, wanted, folder, 1, state)
    os.unlink = _counting(os.unlink, wanted, folder, 0, state)
    os.remove = os.unlink
    return state


if __name__ == "__main__":
    wanted, name, folder = int(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
    state = _install(wanted, getattr(signal, f"SIG{name}"), folder)
    atexit.register(lambda: print(f"renames: {state['count']}", file=sys.stderr))
    sys.exit(main(sys.argv[4:]))
