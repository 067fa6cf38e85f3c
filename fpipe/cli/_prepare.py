"""``fpipe write SOURCE... OUT --processes N`` or ``--cluster ADDRESS``: prepare a dataset
from sources in another format, one file a partition (or ``--ranges N`` of its samples), on
local processes or a dask cluster, each partition exactly once and resumable
(:mod:`fpipe.prepare`); and ``fpipe verify`` of such a dataset against its manifests.

>>> import argparse
>>> prepares(argparse.Namespace(processes=None, cluster=None))
False
"""

from __future__ import annotations

import argparse
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fpipe.cli._common import UsageError, refuse_options, say
from fpipe.cli._formats import source_format

__all__ = ["ENTRIES_A_PARTITION", "add_prepare_options", "is_prepared", "prepares",
           "refuse_prepare_options", "verify_prepared", "write_prepared"]

_NOT_WITH = ("field", "classes", "origin", "download", "base_url", "splits", "append",
             "shuffle", "seed", "overwrite")
_ENTRY_OPTIONS = ("separator", "include", "exclude", "strict", "resize", "encode", "quality",
                  "check", "skip_bad")


#: Entries a partition of a folder, pattern, list file or JSON-lines file without --ranges.
ENTRIES_A_PARTITION = 10_000


def add_prepare_options(group: argparse._ArgumentGroup) -> None:
    """The options of ``fpipe write`` that prepare a dataset by partitions."""
    where = group.add_mutually_exclusive_group()
    where.add_argument("--processes", type=_positive, metavar="N",
                       help="prepare OUT (a folder or URL) from the sources, one file a "
                            "partition, on N local processes: each partition is committed "
                            "once, and the same command again resumes a job that stopped")
    where.add_argument("--cluster", metavar="ADDRESS",
                       help="as --processes, on the dask cluster whose scheduler is at ADDRESS "
                            "(tcp://host:8786)")
    group.add_argument("--ranges", type=_positive, metavar="N",
                       help="with --processes or --cluster: cut each source file into N "
                            "partitions, ranges of its samples (default: one file a "
                            "partition), or a folder, list or JSON-lines file into N ranges of "
                            f"its entries (default: one a {ENTRIES_A_PARTITION:,} entries)")
    group.add_argument("--shard-size", type=_positive, default=10_000, metavar="N",
                       help="samples a shard with --processes or --cluster (default 10000)")
    group.add_argument("--restart", action="store_true",
                       help="with --processes or --cluster: delete the partitions prepared "
                            "before (with other settings) and start over")


def _positive(text: str) -> int:
    from fpipe.cli._common import positive_int

    return positive_int(text)


def prepares(args: argparse.Namespace) -> bool:
    """Whether ``fpipe write`` was asked to prepare by partitions."""
    return args.processes is not None or args.cluster is not None


def write_prepared(args: argparse.Namespace,
                   entry_partitions: Callable[[list[str], int | None], Any],
                   images: Callable[[dict], dict | None] | None) -> int:
    """Prepare OUT from the SOURCE files, one a partition (or ``--ranges``), or from a folder,
    pattern, list or JSON-lines file by ranges of entries (``entry_partitions(sources,
    ranges)``, from ``fpipe write``, which lists them and makes the samples); ``images`` is the
    transform that --resize, --encode, --check and --skip-bad ask for, run in the workers.
    Progress on stderr, a summary line."""
    from fpipe.prepare import from_sources, write_dataset

    refuse_options({f"--{name.replace('_', '-')}": getattr(args, name, None)
                    for name in _NOT_WITH}, "with --processes or --cluster, which prepare OUT "
                   "by partitions (a rerun resumes; --restart starts over)")
    if args.workers != 1:
        raise UsageError("--workers has no effect with --processes or --cluster: give the "
                         "number of processes with --processes")
    if source_format(args.source) is None:
        partitions = entry_partitions(args.source, args.ranges)
    else:
        refuse_options({f"--{name.replace('_', '-')}": getattr(args, name, None)
                        for name in _ENTRY_OPTIONS}, "on WebDataset, Parquet/Arrow or TFRecord "
                       "files, whose samples are prepared as they are (a transform of your own "
                       "does more: fpipe.prepare.write_dataset)")
        partitions = from_sources(args.source, ranges=args.ranges)
    report = write_dataset(partitions, args.out, images,
                           shard_size=args.shard_size,
                           n_workers=args.processes, cluster=args.cluster,
                           restart=args.restart, progress=not args.quiet)
    say(args, str(report))
    return 0


def refuse_prepare_options(args: argparse.Namespace) -> None:
    """Refuse ``--shard-size``, ``--ranges`` and ``--restart`` without ``--processes`` or
    ``--cluster``."""
    refuse_options({"--restart": args.restart, "--ranges": args.ranges,
                    "--shard-size": args.shard_size if args.shard_size != 10_000 else None},
                   "without --processes or --cluster")


# the suffixes of the files a dataset command reads: a URL ending so names a file, not a prefix
_FILE_SUFFIXES = {".msgpack", ".shards", ".tar", ".parquet", ".arrow", ".feather", ".tfrecord",
                  ".json", ".jsonl", ".txt"}


def is_prepared(location: str) -> bool:
    """Whether ``location`` is a dataset that ``fpipe write --processes`` prepared (or began
    to): a folder, or a URL prefix, with a shard index ``dataset.shards`` or a partition's
    manifest.

    >>> import tempfile
    >>> is_prepared(tempfile.mkdtemp())
    False
    """
    if "://" in location:
        parts = urllib.parse.urlsplit(location)
        if parts.query or Path(parts.path).suffix in _FILE_SUFFIXES:
            return False  # one object (a presigned URL names one), never a prefix
        from fpipe.remote.urls import filesystem

        try:
            fs, root = filesystem(location.rstrip("/"))
            return bool(fs.exists(f"{root}/dataset.shards")
                        or fs.glob(f"{root}/part-*/manifest.json"))
        except Exception:  # not reachable as a prefix: the dataset check says why
            return False
    folder = Path(location)
    return folder.is_dir() and ((folder / "dataset.shards").is_file()
                                or any(folder.glob("part-*/manifest.json")))


def verify_prepared(location: str, args: argparse.Namespace) -> list[str]:
    """The problems of the prepared dataset ``location`` (its manifests against its index and
    shards); prints the totals when there are none."""
    from fpipe.errors import FormatError
    from fpipe.prepare import verify_dataset

    try:
        totals = verify_dataset(location)
    except (FormatError, FileNotFoundError) as error:
        return [str(error)]
    say(args, f"{location}: ok ({totals['partitions']} partitions, {totals['shards']} shards, "
              f"{totals['samples']:,} samples, checked against their manifests)")
    return []
