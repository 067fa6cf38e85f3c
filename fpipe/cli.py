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
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:
    from .sets import KnownDataset

__all__ = ["build_parser", "main"]

EXIT_DATA_ERROR = 1
EXIT_USAGE_ERROR = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fpipe`` command, with one subparser per subcommand."""
    parser = argparse.ArgumentParser(
        prog="fpipe",
        description="Packed datasets and batch pipelines for machine-learning training.",
        epilog="Run 'fpipe COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_write_command(commands)
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


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {value}")
    return value


def _add_write_command(commands: argparse._SubParsersAction) -> None:
    """``fpipe write SOURCE OUT``; SOURCE is a well-known dataset's name (see :mod:`fpipe.sets`).

    The options shared by every kind of SOURCE come first; those of the well-known datasets
    are in their own group, added by :func:`_add_known_set_options`.
    """
    from .sets import names

    known_sets = ", ".join(names())
    write = commands.add_parser(
        "write", help="write packed datasets", description="Write packed datasets. SOURCE is a "
        f"well-known dataset ({known_sets}): its official archives, found in --from DIR "
        "(default OUT) or downloaded there with --download, become OUT/<split>.msgpack with the "
        "class names in OUT/<split>.msgpack.classes.json.")
    write.add_argument("source", metavar="SOURCE", help=f"what to write: {known_sets}")
    write.add_argument("out", metavar="OUT", help="output folder")
    write.add_argument("-y", "--overwrite", action="store_true",
                       help="replace datasets that already exist in OUT")
    write.add_argument("--workers", type=_positive_int, default=1, metavar="N",
                       help="threads that encode images (the output order does not change)")
    write.add_argument("--shuffle", action="store_true", help="shuffle each split by --seed")
    write.add_argument("--seed", type=_non_negative_int, default=0, metavar="N",
                       help="seed of --shuffle (0)")
    write.add_argument("-q", "--quiet", action="store_true", help="no progress bars or summary")
    _add_known_set_options(write.add_argument_group("well-known datasets"))
    write.set_defaults(run=_run_write)


def _add_known_set_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--from", dest="origin", metavar="DIR",
                       help="folder holding the official archives (default OUT)")
    group.add_argument("--download", action="store_true",
                       help="download missing archives into --from DIR (md5 checked)")
    group.add_argument("--base-url", metavar="URL", help="download from this mirror instead")
    group.add_argument("--no-verify", dest="verify", action="store_false",
                       help="skip the md5 check of archives already present")
    group.add_argument("--split", dest="splits", action="append", metavar="NAME",
                       help="write only this split (repeatable; default all)")


def _run_write(args: argparse.Namespace) -> int:
    from . import sets

    if args.source in sets.names():
        return _write_known_set(sets.get(args.source), args)
    return _fail(EXIT_USAGE_ERROR, f"unknown dataset {args.source!r}; known: {', '.join(sets.names())}")


def _fail(status: int, error: object) -> int:
    print(f"fpipe write: {error}", file=sys.stderr)
    return status


def _write_known_set(dataset: KnownDataset, args: argparse.Namespace) -> int:
    from .sets import ArchiveError, DownloadError

    unknown = [split for split in args.splits or () if split not in dataset.splits]
    if unknown:
        return _fail(EXIT_USAGE_ERROR, f"--split must be one of {', '.join(dataset.splits)} for "
                                       f"{dataset.name}; got {', '.join(unknown)}")
    try:
        written = dataset.write(
            args.out, args.origin, splits=args.splits, download=args.download,
            base_url=args.base_url, verify=args.verify, overwrite=args.overwrite,
            workers=args.workers, shuffle=args.shuffle, seed=args.seed,
            progress=False if args.quiet else None)
    except (ArchiveError, DownloadError, ModuleNotFoundError) as error:
        return _fail(EXIT_DATA_ERROR, error)
    except (FileExistsError, FileNotFoundError, ValueError) as error:
        return _fail(EXIT_USAGE_ERROR, error)
    except OSError as error:
        return _fail(EXIT_DATA_ERROR, error)
    except KeyboardInterrupt:
        return _fail(EXIT_INTERRUPTED, "interrupted; nothing was written")
    if not args.quiet:
        _print_written(written)
    return 0


def _print_written(written: dict) -> None:
    from .storage import MsgpackReader

    for split, path in written.items():
        with MsgpackReader(path) as reader:
            print(f"{split}: {path} ({len(reader)} samples)")


if __name__ == "__main__":
    sys.exit(main())
