"""The ``fpipe`` command.

Each subcommand lives in a private module of :mod:`fpipe._commands` that registers it with
the parser that :func:`build_parser` makes; :func:`main` runs it and turns exceptions into one
clear line on stderr and an exit status, instead of a traceback:

- 0: success;
- 1: a data error (corrupt or truncated input, duplicate keys, an image that does not decode);
- 2: a usage error (bad option value, missing input file, an output that exists without
  ``-y/--overwrite``, an output that is one of the inputs);
- 130: interrupted (Ctrl-C, also while the command is still starting: see
  :mod:`fpipe._startup`); 141: stdout was closed early (``fpipe cat X | head``), silently.

Anything else is a bug in fpipe and keeps its traceback.

>>> main(["--version"])  # doctest: +ELLIPSIS
fpipe ...
0
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence

from fpipe._startup import EXIT_INTERRUPTED, release
from fpipe._version import __version__
from fpipe.cli import bench, demo, export, inspect, move, reorder, repair, transfer, write
from fpipe.cli._common import UsageError
from fpipe.errors import FpipeError, redacted_url

__all__ = ["build_parser", "main"]

EXIT_DATA_ERROR = 1
EXIT_USAGE_ERROR = 2
EXIT_BROKEN_PIPE = 141

# Checked in this order: the first class an exception is an instance of decides its status.
_STATUSES = (
    (UsageError, EXIT_USAGE_ERROR),
    ((FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
      shutil.SameFileError), EXIT_USAGE_ERROR),
    ((FpipeError, ValueError, OSError, KeyError), EXIT_DATA_ERROR),
)

COMMAND_MODULES = (write, export, inspect, repair, move, reorder, transfer, bench, demo)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fpipe`` command, with one subparser per subcommand.

    >>> build_parser().parse_args(["cat", "x.msgpack"]).command
    'cat'
    """
    parser = argparse.ArgumentParser(
        prog="fpipe",
        description="Packed datasets and batch pipelines for machine-learning training.",
        epilog="Run 'fpipe COMMAND --help' for the options of a command, and 'fpipe demo' "
               "to see fpipe at work.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_parsers(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``fpipe`` command with ``argv`` (default: ``sys.argv[1:]``); return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(f"fpipe {__version__}")
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE_ERROR
    try:
        release()  # Ctrl-C is a KeyboardInterrupt from here on, caught below
        status = args.run(args)
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as error:  # its message says what it waited for, if anything
        print(f"fpipe {args.command}: interrupted" + (f" ({error})" if str(error) else ""),
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except MemoryError as error:
        detail = f" ({error})" if str(error) else ""
        print(f"fpipe {args.command}: out of memory{detail}", file=sys.stderr)
        return EXIT_DATA_ERROR
    except Exception as error:
        status = _status(error)
        if status is None:
            raise
        print(f"fpipe {args.command}: {redacted_url(_message(error))}", file=sys.stderr)
        return status


def _status(error: BaseException) -> int | None:
    for kinds, status in _STATUSES:
        if isinstance(error, kinds):
            return status
    return None


def _message(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    return str(error) or type(error).__name__


def _silence_stdout() -> None:
    # The reader went away: point stdout at /dev/null so that the interpreter's final flush
    # does not fail again with a second BrokenPipeError.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
