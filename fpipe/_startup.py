"""Ctrl-C while the ``fpipe`` command starts: exit status 130 and one line, not a traceback.

The command spends its first quarter of a second importing numpy, the storage and streaming
layers and the subcommands, before :func:`fpipe.cli.main` can catch ``KeyboardInterrupt``. So
``fpipe/__init__.py`` calls :func:`guard_command_start` before it imports anything else: when
this process is the command (``python -m fpipe``, ``python -m fpipe.cli`` or the ``fpipe``
console script), Ctrl-C from then on prints ``fpipe: interrupted`` and exits with 130 at once;
:func:`release` (called by ``main`` when the command begins its work) hands Ctrl-C back to
Python, and ``main`` turns the ``KeyboardInterrupt`` into the same status. In any other
process (a program or a test that imports fpipe) nothing changes: Ctrl-C is the program's.

Only modules that the interpreter has loaded before ``import fpipe`` are imported here.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["EXIT_INTERRUPTED", "guard_command_start", "release"]

EXIT_INTERRUPTED = 130
_COMMAND_MODULES = frozenset(("fpipe", "fpipe.__main__", "fpipe.cli"))
_SCRIPT_NAMES = frozenset(("fpipe", "fpipe.exe", "fpipe-script.py", "fpipe-script.pyw"))
_SCRIPT_CALL = b"from fpipe.cli import main"  # what pip's console script of fpipe runs
_OPTIONS_WITH_VALUES = frozenset("WX")  # interpreter options that take the next word


def guard_command_start() -> None:
    """Make Ctrl-C exit quietly with status 130 if this process is the fpipe command starting."""
    if _is_command_start():
        signal.signal(signal.SIGINT, _interrupted)


def release() -> None:
    """Hand Ctrl-C back to Python (``KeyboardInterrupt``) if the start-up guard holds it."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted(signum: int, frame: object) -> None:
    # Nothing has been written or started yet, so there is nothing to flush or undo.
    os.write(2, b"fpipe: interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def _is_command_start() -> bool:
    argv = getattr(sys, "argv", None) or [""]
    if argv[0] == "-m":  # python -m: runpy imports the package while argv[0] is "-m"
        return _module_run(getattr(sys, "orig_argv", [])) in _COMMAND_MODULES
    return _is_console_script(argv[0])


def _module_run(argv: list[str]) -> str | None:
    """The module that ``python -m MODULE`` runs, from the interpreter's own command line.

    >>> _module_run(["python", "-W", "ignore", "-Bm", "fpipe", "info"])
    'fpipe'
    >>> _module_run(["python", "-Xdev", "-mfpipe.cli"]), _module_run(["python", "script.py"])
    ('fpipe.cli', None)
    """
    words = iter(argv[1:])
    for word in words:
        if not word.startswith("-") or word.startswith("--") or word == "-":
            return None  # a script, a long option, or stdin: not a module run
        for at, letter in enumerate(word[1:], 2):
            if letter == "m":
                return word[at:] or next(words, None)
            if letter == "c":
                return None  # python -c CODE runs no module
            if letter in _OPTIONS_WITH_VALUES:
                if at == len(word):
                    next(words, None)
                break
    return None


def _is_console_script(path: str) -> bool:
    """Whether ``path``, the script that runs as ``__main__``, is fpipe's console script."""
    main = sys.modules.get("__main__")
    if os.path.basename(path) not in _SCRIPT_NAMES or getattr(main, "__file__", None) != path:
        return False
    try:
        with open(path, "rb") as script:
            return _SCRIPT_CALL in script.read(4096)
    except OSError:
        return False
