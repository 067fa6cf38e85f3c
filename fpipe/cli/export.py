"""``fpipe export DATASET OUT``: write a dataset out as WebDataset tar shards or Parquet files."""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from fpipe.cli._common import UsageError, add_command, open_dataset, positive_int, progress_bar, say
from fpipe.cli._formats import open_source, source_files, source_format
from fpipe.dataset._staging import dataset_files
from fpipe.errors import FpipeError

__all__ = ["add_parsers", "shard_size"]

_DESCRIPTION = """\
Write DATASET (a packed dataset, its path or URL; or WebDataset, Parquet/Arrow or TFRecord
files, as 'fpipe write' takes them) out as WebDataset tar shards or Parquet files, in order and
in bounded memory.

OUT names the shards: a pattern with one %d-style field for the shard number
(out/train-%06d.tar), or a folder, which gets DATASET's name followed by -%06d and the
format's suffix. --format is taken from OUT's suffix when OUT is a pattern. --shard-size
starts a new shard after that many samples, or, with a unit (500MB, 1GiB), once a shard
holds that many bytes.

WebDataset members are bytes: each sample becomes members <key>.<field> (dots in the key's
file name become _), and a field that is not bytes must be named with an extension that
encodes its type (.cls an int, .txt a str, .json, .npy an array, .msgpack anything): rename
it with --rename label=label.cls. Parquet columns hold one type each; numpy arrays of one
shape become tensor columns. A field that a format cannot carry stops the run, naming the
field. Nothing appears under OUT's names unless every shard is written; then all are renamed
into place together (Ctrl-C waits until they are), and a manifest beside them,
.PATTERN.shards.json, lists them. An export killed outright while it renamed them leaves a
journal in its hidden folder, by which the next export to the pattern finishes that commit
first. -y replaces shards, and removes those of an earlier, longer
export that its manifest lists, and no other file. A pattern that names one of the inputs is
refused."""

_EXAMPLE = """\
  fpipe export train.msgpack 'shards/train-%06d.tar' --shard-size 1GB --rename label=cls
  fpipe export train.msgpack parquet/ --format parquet --shard-size 100000
  fpipe export 'shards-{000..099}.tar' 'parquet/train-%05d.parquet'"""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10,
          "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SUFFIXES = {"webdataset": ".tar", "parquet": ".parquet"}


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe export``."""
    parser = add_command(commands, "export", "write a dataset out as WebDataset shards or Parquet",
                         _DESCRIPTION, _EXAMPLE, _run_export)
    parser.add_argument("dataset", metavar="DATASET", help="the dataset to export")
    parser.add_argument("out", metavar="OUT", help="a shard name pattern (with %%d) or a folder")
    parser.add_argument("--format", choices=sorted(_SUFFIXES),
                        help="the output format (default: from OUT's suffix)")
    parser.add_argument("--shard-size", type=shard_size, default=(None, 1 << 30), metavar="SIZE",
                        help="samples per shard, or bytes with a unit (500MB, 1GiB; default 1GiB)")
    parser.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                        help="rename a field (repeatable)")
    parser.add_argument("--row-group-size", type=positive_int, default=1000, metavar="ROWS",
                        help="Parquet: samples per row group (default 1000; smaller makes random "
                             "access cheaper)")
    parser.add_argument("-y", "--overwrite", action="store_true",
                        help="replace shards that exist (and remove those of an earlier, longer "
                             "export to the same names that its manifest lists)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")


def shard_size(text: str) -> tuple[int | None, int | None]:
    """An argparse type: ``(samples, None)`` for a number, ``(None, bytes)`` for a size with a
    unit.

    >>> shard_size("5000"), shard_size("1.5GB"), shard_size("64MiB")
    ((5000, None), (None, 1500000000), (None, 67108864))
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"must be a number of samples or a size such as 500MB; "
                                         f"got {text!r}")
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1 or (not match.group(2) and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"must be >= 1 (samples) or a size; got {text!r}")
    return (int(value), None) if not match.group(2) else (None, int(value))


def _renames(pairs: list[str]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise UsageError(f"--rename takes OLD=NEW; got {pair!r}")
        renames[old] = new
    return renames


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """The output format and shard name pattern."""
    out = args.out
    if "%" in out:
        try:
            distinct = out % 0 != out % 1
        except (TypeError, ValueError):
            distinct = False
        if not distinct:
            raise UsageError(f"OUT must hold one %d-style field for the shard number, as in "
                             f"'train-%06d.tar'; got {out!r}")
        kind = args.format or next((k for k, s in _SUFFIXES.items() if out.lower().endswith(s)), None)
        if kind is None:
            raise UsageError(f"--format is needed: OUT {out!r} ends in neither .tar nor .parquet")
        return kind, out
    if out.lower().endswith(tuple(_SUFFIXES.values())):
        raise UsageError(f"OUT must hold one %d-style field for the shard number, as in "
                         f"'train-%06d.tar'; got {out!r}")
    if args.format is None:
        raise UsageError(f"OUT {out!r} is a folder: pass --format, or give a pattern such as "
                         f"{os.path.join(out, 'train-%06d.tar')!r}")
    name = re.sub(r"\.msgpack$", "", Path(args.dataset.rstrip("/")).name) or "data"
    name = re.sub(r"[{}*?\[\]%]", "_", name)
    return args.format, os.path.join(out, f"{name}-%06d{_SUFFIXES[args.format]}")


def _reader(dataset: str) -> Any:
    kind = source_format([dataset])
    return open_source(kind, [dataset]) if kind is not None else open_dataset(dataset)


def _inputs(dataset: str) -> list:
    """The files the export reads, which no shard may replace."""
    if source_format([dataset]) is not None:
        return list(source_files([dataset]))
    return [] if "://" in dataset else dataset_files(dataset)


def _samples(reader: Any, bar: Any) -> Any:
    for key, sample in reader.iter(yield_key=True, chunk_size=256):
        sample.setdefault("key", key)
        yield sample
        bar.update(1)


def _run_export(args: argparse.Namespace) -> int:
    from fpipe.formats import write_parquet, write_webdataset

    kind, pattern = _target(args)
    renames = _renames(args.rename)
    samples, size = args.shard_size
    reader = _reader(args.dataset)
    options: dict = {"shard_size": samples, "shard_bytes": size, "rename": renames,
                     "overwrite": args.overwrite}
    if kind == "parquet":
        options["row_group_size"] = args.row_group_size
    write = write_parquet if kind == "parquet" else write_webdataset
    with progress_bar(args, total=len(reader), desc=Path(pattern).name, unit=" samples") as bar, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        try:
            names = write(_samples(reader, bar), pattern, inputs=_inputs(args.dataset), **options)
        except TypeError as error:  # a field the format cannot carry: the message names it
            raise FpipeError(str(error)) from None
    for warning in caught:
        print(f"fpipe export: warning: {warning.message}", file=sys.stderr)
    say(args, f"wrote {len(reader)} samples to {len(names)} {kind} shard(s): "
              + (f"{names[0]} ... {names[-1]}" if len(names) > 1 else ", ".join(names) or "none"))
    return 0
