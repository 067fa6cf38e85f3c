"""The ``fpipe`` command.

Each subcommand is a function ``run(args) -> int`` registered with a parser by
:func:`build_parser`; :func:`main` maps user mistakes to exit status 2 and data errors to 1,
printing one clear line instead of a traceback.

>>> main(["--version"])  # doctest: +ELLIPSIS
fpipe ...
0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._version import __version__

__all__ = ["build_parser", "main"]

EXIT_DATA_ERROR = 1
EXIT_USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fpipe`` command, with one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="fpipe",
        description="Packed datasets and batch pipelines for machine-learning training.",
        epilog="Run 'fpipe COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_subparsers(dest="command", metavar="COMMAND")
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
        return args.run(args)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        print(f"fpipe {args.command}: {error}", file=sys.stderr)
        return EXIT_DATA_ERROR


if __name__ == "__main__":
    sys.exit(main())
