"""``fpipe write SOURCE OUT``: pack a well-known dataset, a folder tree, a list file or JSON lines."""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import io
import json
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fpipe.cli._common import (
    CLASSES_SUFFIX,
    UsageError,
    add_command,
    chosen_seed,
    human_bytes,
    int_between,
    non_negative_int,
    positive_int,
    refuse_options,
    say,
    shows_progress,
    workers,
)
from fpipe.cli._formats import source_format, write_from_format
from fpipe.cli._images import checked_suffixes, image_problem
from fpipe.cli._inputs import (
    IMAGE_SUFFIXES,
    JSON_LINES,
    LIST_FILE,
    Entries,
    Entry,
    Listing,
    file_suffix,
    list_source,
)
from fpipe.cli._labels import check_matchable, class_file, class_lists
from fpipe.cli._prepare import (
    ENTRIES_A_PARTITION,
    add_prepare_options,
    prepares,
    refuse_prepare_options,
    write_prepared,
)
from fpipe.dataset._staging import dataset_files, refuse_inputs, staged_datasets
from fpipe.errors import FpipeError

if TYPE_CHECKING:
    from fpipe.cli._shuffle import ShuffledEntries
    from fpipe.sets import KnownDataset

__all__ = ["add_parsers"]

EXIT_DATA_ERROR = 1
EXIT_USAGE_ERROR = 2
EXIT_INTERRUPTED = 130

_DESCRIPTION = """\
Write a packed dataset. SOURCE is one of:

  a well-known dataset: {known};
    its official archives, found in --from DIR (default OUT) or downloaded there with
    --download, become OUT/<split>.msgpack;
  a folder: an ImageFolder tree (one sub-folder per class) or, without sub-folders,
    unlabelled files;
  a glob pattern whose path component {{LABEL}} is the class folder, e.g. 'photos/{{LABEL}}/**'
    (quote it), or without {{LABEL}} for unlabelled files;
  a list file of 'path[,label]' lines (CSV, or tab-separated; a first line starting with
    'path' is a header; paths are relative to the list file's folder);
  a JSON-lines file (.jsonl), one sample object per line, written as it is;
  datasets in other formats: WebDataset tar shards, Parquet or Arrow files (or a Hugging Face
    save_to_disk folder), TFRecord files of tf.train.Example; several, or a glob or brace
    pattern ('shards-{{000..099}}.tar'); every sample is written as it is read, with its key
    (tar member names that are not UTF-8 are read as Latin-1);
  packed fpipe datasets (X.msgpack, or any file with its .offsets): written again, with their
    keys and class names (to shuffle one with --shuffle, or merge several).

For files, OUT is the dataset's file (e.g. train.msgpack); each sample is
{{"key": the file's relative path, "image" (--field): the file's bytes, "label": number}}.
Folders and patterns are listed one folder at a time, list and JSON-lines files read a line at
a time, so that any number of files is written in the same memory; --shuffle deals them into
bucket files beside OUT, read back one at a time.
Images are stored as their original bytes unless --resize or --encode is given.
Labels are numbered in natural order of their names (digit runs compare as numbers, so
'class2' < 'class10'), or as in the class list of --classes FILE; the names are stored
beside the dataset, in OUT.classes.json. In class folders, files that are not images (by
suffix, in any case: .jpg, .JPG, .png, .webp, ...) are left out with a one-line note
(--strict: an error). --include/--exclude choose files by their key.
Every image gets a cheap look (its header, and the end of a JPEG, PNG, WebP or GIF): one
that looks damaged is named on stderr and packed as it is; --check decodes every image and
stops at one that does not decode, --skip-bad decodes every image and leaves out those that
do not, naming each. Nothing appears under OUT unless the whole run succeeds; --append adds
the samples to an existing OUT instead (its index and .md5 are replaced whole at the end; a
failed run leaves OUT as it was)."""

_EXAMPLE = """\
  fpipe write photos/ photos.msgpack --workers 4 --shuffle --seed 1
  fpipe write 'photos/{LABEL}/*.jpg' small.msgpack --resize 128 --encode jpeg
  fpipe write train.csv train.msgpack
  fpipe write photos/ photos.msgpack --exclude '*/thumbs/*' --skip-bad
  fpipe write val-photos/ val.msgpack --classes train.msgpack
  fpipe write more-photos/ photos.msgpack --append
  fpipe write cifar10 data/cifar10 --download
  fpipe write 'shards-{000..099}.tar' train.msgpack
  fpipe write data/*.parquet train.msgpack
  fpipe write 'shards-{000..999}.tar' prepared/ --processes 8
  fpipe write photos/ prepared/ --processes 8 --ranges 64 --resize 256 --encode jpeg
  fpipe write 'shards-{000..999}.tar' s3://bucket/train --cluster tcp://scheduler:8786"""

_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}
_NAMED_LABELS = 5  # label names shown in one message
_MAX_SIDE = 16384  # --resize: the largest side a JPEG or WebP image may have


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe write``."""
    from fpipe import sets

    known = ", ".join(sets.names())
    parser = add_command(commands, "write", "write packed datasets from files or well-known sets",
                         _DESCRIPTION.format(known=known), _EXAMPLE, _run_write)
    parser.add_argument("source", metavar="SOURCE", nargs="+",
                        help=f"a folder, glob pattern, list file, .jsonl file, or one of {known}; "
                             "or WebDataset (.tar), Parquet/Arrow, TFRecord files or packed "
                             "datasets (several, or a pattern)")
    parser.add_argument("out", metavar="OUT",
                        help="the dataset file to write (a folder for well-known datasets)")
    parser.add_argument("-y", "--overwrite", action="store_true",
                        help="replace datasets that already exist")
    parser.add_argument("--append", action="store_true",
                        help="add the samples to the dataset OUT (keys must be new to it; labels "
                             "must be among its classes)")
    parser.add_argument("--workers", type=workers, default=1,
                        help="threads that read and encode files, or processes that read, decode "
                             "and pack samples of other formats (the output does not change)")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the samples by --seed")
    parser.add_argument("--seed", type=non_negative_int, help="seed of --shuffle (0)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or summary")
    # how many damaged images to name (None: each); not an option: fpipe demo names a few
    parser.set_defaults(named_images=None)
    add_prepare_options(parser.add_argument_group(
        "preparing by partitions (sources in another format, one file or --ranges of it a partition)"))
    _add_file_options(parser.add_argument_group("files (folders, patterns, list files)"))
    _add_known_options(parser.add_argument_group("well-known datasets"))


def _add_file_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--field", metavar="NAME",
                       help="the field that holds a file's bytes (default image)")
    group.add_argument("--include", action="append", default=[], metavar="GLOB",
                       help="take only files whose key (relative path) matches GLOB "
                            "(repeatable; fnmatch, '*' crosses folders)")
    group.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                       help="leave out files whose key matches GLOB (repeatable)")
    group.add_argument("--classes", metavar="FILE",
                       help="number the labels as the class list FILE does (a .classes.json, "
                            "or a dataset beside which one is stored), so that these samples "
                            "share another dataset's numbering; a label not in it is an error")
    group.add_argument("--strict", action="store_true",
                       help="a file in a class folder that is not an image is an error, not "
                            "left out")
    checks = group.add_mutually_exclusive_group()
    checks.add_argument("--check", action="store_true",
                        help="decode every image before writing it; one that does not decode "
                             "stops the run, naming the file")
    checks.add_argument("--skip-bad", action="store_true",
                        help="decode every image before writing it; leave out those that do not "
                             "decode, naming each on stderr")
    group.add_argument("--separator", metavar="SEP",
                       help="column separator of a list file (default: tab if the first line "
                            "has one, else comma)")
    group.add_argument("--resize", type=int_between(1, _MAX_SIDE), metavar="SIZE",
                       help="scale images so that their shorter side is SIZE pixels")
    group.add_argument("--encode", choices=sorted(_FORMATS),
                       help="re-encode images in this format (default: keep the original bytes, "
                            "or with --resize the original format)")
    group.add_argument("--quality", type=positive_int,
                       help="JPEG/WebP quality of re-encoded images (default 90)")


def _add_known_options(group: argparse._ArgumentGroup) -> None:
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
    from fpipe import sets

    if prepares(args):
        return write_prepared(args, functools.partial(_listed_partitions, args),
                              _prepared_images(args))
    refuse_prepare_options(args)
    if not args.shuffle:
        refuse_options({"--seed": args.seed}, "without --shuffle")
    kind = source_format(args.source)
    if kind is not None:
        return write_from_format(kind, args)
    if len(args.source) > 1:
        raise UsageError("several SOURCEs are for WebDataset, Parquet/Arrow or TFRecord files; "
                         "give one folder, glob pattern or list file")
    args.source = args.source[0]
    if args.source in sets.names():
        _check_known_set_options(args)
        return _write_known_set(sets.get(args.source), args)
    if not Path(args.source).exists() and not any(c in args.source for c in "*?[{"):
        raise _missing(args.source, sets.names())
    return _write_files(args)


def _missing(source: str, known: list[str]) -> FileNotFoundError:
    """The error for a SOURCE that is no file, folder or pattern: a path, or a name that may be
    a misspelt well-known dataset."""
    if "/" in source or os.sep in source or Path(source).suffix:
        return FileNotFoundError(f"{source}: no such file or folder")
    close = difflib.get_close_matches(source, known, n=1)
    return FileNotFoundError(f"{source}: no such file or folder, and no well-known dataset of "
                             f"that name" + (f" (did you mean {close[0]}?)" if close else "")
                             + f"; known: {', '.join(known)}")


def _check_known_set_options(args: argparse.Namespace) -> None:
    refuse_options({"--append": args.append, "--field": args.field, "--include": args.include,
                    "--exclude": args.exclude, "--classes": args.classes, "--strict": args.strict,
                    "--check": args.check, "--skip-bad": args.skip_bad,
                    "--separator": args.separator, "--resize": args.resize,
                    "--encode": args.encode, "--quality": args.quality},
                   f"with the well-known dataset {args.source}, which is read from its archives")


def _fail(status: int, error: object) -> int:
    print(f"fpipe write: {error}", file=sys.stderr)
    return status


# --- well-known datasets ----------------------------------------------------------------


def _write_known_set(dataset: KnownDataset, args: argparse.Namespace) -> int:
    from fpipe.sets import ArchiveError, DownloadError

    unknown = [split for split in args.splits or () if split not in dataset.splits]
    if unknown:
        return _fail(EXIT_USAGE_ERROR, f"--split must be one of {', '.join(dataset.splits)} for "
                                       f"{dataset.name}; got {', '.join(unknown)}")
    try:
        written = dataset.write(
            args.out, args.origin, splits=args.splits, download=args.download,
            base_url=args.base_url, verify=args.verify, overwrite=args.overwrite,
            workers=args.workers, shuffle=args.shuffle, seed=chosen_seed(args),
            progress=False if args.quiet else None)
    except (ArchiveError, DownloadError, ModuleNotFoundError) as error:
        return _fail(EXIT_DATA_ERROR, error)
    except (FileExistsError, FileNotFoundError, ValueError) as error:
        return _fail(EXIT_USAGE_ERROR, error)
    except OSError as error:
        return _fail(EXIT_DATA_ERROR, error)
    except KeyboardInterrupt as error:  # with a message if the outputs were in place by then
        return _fail(EXIT_INTERRUPTED, f"interrupted ({error})" if str(error) else
                     "interrupted; nothing was written")
    if not args.quiet:
        _print_written(written)
    return 0


def _print_written(written: dict) -> None:
    from fpipe.dataset import MsgpackReader

    for split, path in written.items():
        with MsgpackReader(path) as reader:
            print(f"{split}: {path} ({len(reader)} samples)")


# --- files ------------------------------------------------------------------------------


def _write_files(args: argparse.Namespace) -> int:
    _check_file_options(args)
    listing = list_source(args.source, args.separator, args.include, args.exclude, args.strict)
    _check_source_options(listing, args)
    for note in _notes(listing, args):
        print(f"fpipe write: note: {note}", file=sys.stderr)
    out = Path(args.out)
    labels = _label_names(out, listing, args)
    screen = ImageScreen("skip" if args.skip_bad else "stop" if args.check else "look")
    make = SampleMaker(args.field or "image", {name: i for i, name in enumerate(labels)},
                       _recoder(args), screen)
    with _ordered(listing.entries, out, args) as entries:
        if args.append:  # OUT has the class list that numbers the labels (or none is needed)
            refuse_inputs(dataset_files(out), _read_files(args.source, listing.entries))
            written = _write_samples(out, entries, make, args, append=True)
        else:
            with staged_datasets([out], args.overwrite,
                                 sources=_read_files(args.source, listing.entries)) as (staged,):
                written = _write_samples(staged, entries, make, args)
                if labels:
                    _write_labels(staged, labels, args)
        _report_images(screen, entries, args)
    say(args, f"{'appended' if args.append else 'wrote'} {written} samples from "
              f"{listing.kind} {args.source} to {out} ({human_bytes(out.stat().st_size)})"
        + (f", {len(labels)} labels in {out}{CLASSES_SUFFIX}" if labels else ""))
    return 0


def _check_file_options(args: argparse.Namespace) -> None:
    refuse_options({"--from": args.origin, "--download": args.download,
                    "--base-url": args.base_url, "--no-verify": not args.verify,
                    "--split": args.splits}, "with files (only with a well-known dataset)")
    if args.append:
        _check_append(args)
    _check_entry_options(args)


def _check_entry_options(args: argparse.Namespace) -> None:
    """The checks of --separator and --quality that need no listing (with --processes too)."""
    if len(args.separator or ",") != 1:
        raise UsageError(f"--separator must be one character; got {args.separator!r}")
    if args.quality is not None:
        if args.resize is None and args.encode is None:
            refuse_options({"--quality": args.quality}, "without --encode or --resize: the "
                           "images are packed as they are")
        if args.encode == "png":
            refuse_options({"--quality": args.quality}, "with --encode png (PNG is lossless)")


def _check_append(args: argparse.Namespace) -> None:
    if args.overwrite:
        raise UsageError("--append adds to OUT, -y/--overwrite replaces it: pass one of them")
    refuse_options({"--classes": args.classes},
                   "with --append, which numbers the labels as OUT's class list does")
    if Path(args.out).is_dir():
        raise UsageError(f"--append: {args.out} is a folder, not a dataset")
    if not Path(args.out).exists():
        raise FileNotFoundError(f"--append: {args.out} does not exist; leave out --append to "
                                "write a new dataset")


def _check_source_options(listing: Listing, args: argparse.Namespace) -> None:
    if listing.kind != LIST_FILE:
        refuse_options({"--separator": args.separator}, f"on a {listing.kind}: it is for list "
                       "files")
    if listing.kind == JSON_LINES:
        refuse_options({"--field": args.field, "--resize": args.resize, "--encode": args.encode,
                        "--quality": args.quality, "--check": args.check,
                        "--skip-bad": args.skip_bad},
                       "on JSON lines: their samples are written as they are, with no files")
    if args.classes is not None and not listing.labels:
        raise UsageError(f"--classes: {args.source} has no label names to number")


def _notes(listing: Listing, args: argparse.Namespace) -> list[str]:
    """What the user should know about the listing: files left out, a header taken as one,
    and classes left without samples that the numbering skips."""
    if args.quiet:
        return []
    notes = [listing.note] if listing.note else []
    if listing.emptied and args.classes is None and not args.append:
        named = ", ".join(map(str, listing.emptied[:_NAMED_LABELS]))
        more = "..." if len(listing.emptied) > _NAMED_LABELS else ""
        notes.append(f"no sample is left in {len(listing.emptied)} class(es) ({named}{more}), so "
                     f"the labels are numbered among the {len(listing.labels)} that are; "
                     "--classes FILE keeps another dataset's numbering")
    return notes


def _label_names(out: Path, listing: Listing, args: argparse.Namespace) -> list:
    """The label names, numbered in their order: OUT's (--append), those of --classes FILE,
    or the source's."""
    if args.append:
        return _appended_labels(out, listing)
    if args.classes is not None:
        return _given_labels(args.classes, listing)
    return listing.labels


def _given_labels(source: str, listing: Listing) -> list:
    """The class list of --classes ``source``, which must hold every label of ``listing``."""
    lists = class_lists(source)
    if lists is None:
        raise FileNotFoundError(f"--classes {source}: {class_file(source)} not found")
    if "label" not in lists:
        raise UsageError(f"--classes {source}: {class_file(source)} has no class list for the "
                         f"field 'label' (it has {', '.join(lists) or 'none'})")
    names = lists["label"]
    known = set(names)
    unknown = [label for label in listing.labels if label not in known]
    if unknown:
        raise UsageError(f"--classes {source}: {len(unknown)} label(s) are not among its "
                         f"{len(names)} classes: {', '.join(map(str, unknown[:_NAMED_LABELS]))}"
                         + ("..." if len(unknown) > _NAMED_LABELS else ""))
    check_matchable(names, listing.labels, f"--classes {source}: {class_file(source)}")
    return names


def _read_files(source: str, entries: Entries) -> Iterator[str]:
    """The files that writing reads (which the output must not replace): a list or JSON
    lines file, and the files it lists."""
    if Path(source).is_file():
        yield source
    yield from (entry.path for entry in entries if entry.path is not None)


def _appended_labels(out: Path, listing: Listing) -> list:
    """The label names of dataset ``out``, which the appended samples must use."""
    stored = class_lists(out)
    if stored is None:
        if listing.labels:
            raise UsageError(f"--append: {out} has no {CLASSES_SUFFIX}, so the labels "
                             f"{', '.join(map(str, listing.labels[:3]))}... cannot be numbered "
                             "as its samples are")
        return listing.labels
    names = stored.get("label") or []
    unknown = [label for label in listing.labels if label not in names]
    if unknown:
        raise UsageError(f"--append: label(s) {', '.join(map(str, unknown[:5]))} are not among "
                         f"the classes of {out}{CLASSES_SUFFIX}")
    return names


def _ordered(entries: Entries, out: Path, args: argparse.Namespace
             ) -> AbstractContextManager[Entries | ShuffledEntries]:
    """The entries in the order to write them, for the block: as listed (read again at each
    pass), or shuffled by the seed (dealt into bucket files beside ``out`` for the block:
    see :mod:`~fpipe.cli._shuffle`)."""
    if not args.shuffle:
        return nullcontext(entries)
    from fpipe.cli._shuffle import shuffled_entries

    return shuffled_entries(entries, chosen_seed(args), out)


def _write_samples(path: Path, entries: Entries | ShuffledEntries, make: SampleMaker,
                   args: argparse.Namespace, append: bool = False) -> int:
    """Write the samples of ``entries`` to ``path``; how many were written (--skip-bad leaves
    out images that do not decode)."""
    from fpipe.dataset import FileWriter

    shown = shows_progress(args)
    samples: Any = map(make, entries)
    if args.workers > 1:
        from fpipe.stream import threads

        samples = threads(make, n_workers=args.workers)(entries)
    with FileWriter(path, append=append, progress=shown, disable=not shown, total=len(entries),
                    desc=Path(args.out).name, unit=" samples") as writer:
        try:
            return _written(samples, writer, len(entries))
        except BaseException:
            if append:  # a staged new dataset goes with its staging folder; this one is cut back
                writer.abandon()
            raise
        finally:
            getattr(samples, "close", lambda: None)()


def _written(samples: Iterable[dict | None], writer: Any, total: int) -> int:
    """Write the samples that are not None; how many were written (not none)."""
    written = 0
    for sample in samples:
        if sample is not None:
            writer.write(sample)
            written += 1
    if not written:
        raise FpipeError(f"none of the {total} images decodes (--skip-bad left out every one); "
                         "nothing was written")
    return written


def _write_labels(path: Path, labels: list, args: argparse.Namespace) -> None:
    order = "natural" if args.classes is None else f"as in {class_file(args.classes)}"
    content = {"dataset": args.source, "classes": {"label": labels}, "label_order": order}
    Path(str(path) + CLASSES_SUFFIX).write_text(
        json.dumps(content, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


class ImageScreen:
    """What becomes of image files that are damaged, found by
    :func:`~fpipe.cli._images.image_problem` (the check that ``fpipe verify --images``
    makes too). ``"look"`` (the default) gives each the cheap look, without a full decode, and
    packs it whatever it finds; ``"stop"`` (--check) decodes each as well and stops the run at
    one that does not decode; ``"skip"`` (--skip-bad) decodes each and leaves out those that
    do not. The damaged files
    are collected in ``found`` as ``(path, reason)``, and the image files that Pillow cannot
    read here in ``unchecked``; worker threads share the lists."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.found: list[tuple[str, str]] = []
        self.unchecked: list[str] = []

    def passes(self, data: bytes, path: str) -> bool:
        """Whether to pack the file ``path`` (files that are not images always pass)."""
        suffix = file_suffix(path).lower()
        if suffix not in checked_suffixes():
            if suffix in IMAGE_SUFFIXES:
                self.unchecked.append(suffix)
            return True
        reason = image_problem(data, decode=self.mode != "look")
        return reason is None or self.failed(path, reason)

    def failed(self, path: str, reason: str, packable: bool = True) -> bool:
        """Take the image ``path`` that is damaged (``reason``): whether to pack it anyway.
        One that cannot be packed as it is (not ``packable``: it was to be re-encoded) stops
        the run unless --skip-bad."""
        if self.mode == "stop" or (self.mode == "look" and not packable):
            hint = " (--check)" if self.mode == "stop" else \
                "; --skip-bad leaves out the images that do not decode"
            raise FpipeError(f"{path}: {reason}{hint}")
        self.found.append((path, reason))
        return self.mode == "look"


def _report_images(screen: ImageScreen, entries: Entries | ShuffledEntries, args: argparse.Namespace) -> None:
    """Name on stderr each damaged image that was packed or left out, in the order of the
    samples, then their count (even with --quiet); and the image files that were not checked."""
    if screen.unchecked and not args.quiet:
        kinds = ", ".join(sorted(set(screen.unchecked)))
        print(f"fpipe write: note: {len(screen.unchecked)} image file(s) ({kinds}) were not "
              "checked: Pillow cannot read them here", file=sys.stderr)
    if not screen.found:
        return
    damaged = {path for path, _ in screen.found}
    position = {entry.path: i for i, entry in enumerate(entries) if entry.path in damaged}
    found = sorted(screen.found, key=lambda item: position.get(item[0], 0))
    left_out = screen.mode == "skip"
    named = found if args.named_images is None else found[:args.named_images]
    for path, reason in named:
        print(f"fpipe write: {'left out' if left_out else 'warning:'} {path}: {reason}",
              file=sys.stderr)
    if len(named) < len(found):
        print(f"fpipe write: ... and {len(found) - len(named)} more", file=sys.stderr)
    print(f"fpipe write: left out {len(found)} image(s) that do not decode (--skip-bad)"
          if left_out else
          f"fpipe write: warning: {len(found)} image(s) look damaged and were packed as they "
          "are; --skip-bad leaves out the images that do not decode, --check stops at the first",
          file=sys.stderr)


class SampleMaker:
    """Turn an :class:`Entry` into the sample to write, or None to leave it out: read its file
    (and re-encode it, or screen it), number its label. A plain class, so that worker threads
    share nothing but it."""

    def __init__(self, field: str, labels: dict, recode: ImageRecoder | None,
                 screen: ImageScreen) -> None:
        self.field, self.labels, self.recode, self.screen = field, labels, recode, screen

    def __call__(self, entry: Entry) -> dict | None:
        if entry.sample is not None:
            sample = dict(entry.sample)
            if isinstance(sample.get("label"), str):
                sample["label"] = self.labels[sample["label"]]
            return sample
        data = self._packed_bytes(entry.path)
        if data is None:
            return None
        sample = {"key": entry.key, self.field: data}
        if entry.label is not None:
            sample["label"] = self.labels[entry.label]
        return sample

    def _packed_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as file:  # no Path for each file (see file_suffix)
                data = file.read()
        except OSError as error:
            raise FpipeError(f"cannot read {path}: {error.strerror or error}") from None
        if self.recode is None:
            return data if self.screen.passes(data, path) else None
        try:
            return self.recode(data)
        except NotAnImage as error:
            self.screen.failed(path, f"cannot re-encode as an image ({error})", packable=False)
            return None


def _recoder(args: argparse.Namespace) -> ImageRecoder | None:
    if args.resize is None and args.encode is None:
        return None
    quality = 90 if args.quality is None else args.quality
    if quality > 100:
        raise UsageError(f"--quality must be between 1 and 100; got {quality}")
    return ImageRecoder(args.resize, _FORMATS.get(args.encode), quality)


class NotAnImage(ValueError):
    """Bytes that Pillow cannot open or decode, so that :class:`ImageRecoder` cannot re-encode
    them."""


class ImageRecoder:
    """Resize (shorter side to ``size``) and re-encode image bytes with Pillow, imported here
    only when images are re-encoded."""

    def __init__(self, size: int | None, encoding: str | None, quality: int) -> None:
        self.size, self.encoding, self.quality = size, encoding, quality

    def __repr__(self) -> str:  # in a prepared dataset's fingerprint: the same each run
        return f"ImageRecoder(size={self.size}, encoding={self.encoding!r}, quality={self.quality})"

    def __call__(self, data: bytes) -> bytes:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as image:
                encoding = self.encoding or (image.format if image.format in ("JPEG", "WEBP")
                                             else "PNG")
                return self._encode(self._resized(image), encoding)
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
            raise NotAnImage(str(error)) from None

    def _resized(self, image: Any) -> Any:
        image.load()
        if self.size is None:
            return image
        from PIL import Image

        scale = self.size / min(image.size)
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        return image.resize(size, Image.Resampling.LANCZOS)

    def _encode(self, image: Any, encoding: str) -> bytes:
        if encoding == "JPEG" and image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        buffer = io.BytesIO()
        options = {"quality": self.quality} if encoding in ("JPEG", "WEBP") else {"optimize": True}
        image.save(buffer, encoding, **options)
        return buffer.getvalue()


def _prepared_images(args: argparse.Namespace) -> Any:
    """The transform of ``fpipe write --processes`` (or ``--cluster``) that --resize, --encode,
    --quality, --check and --skip-bad ask for (see :func:`screened_image`); None without them."""
    import functools

    _check_entry_options(args)
    mode = "skip" if args.skip_bad else "stop" if args.check else "look"
    recode = _recoder(args)
    if recode is None and mode == "look":
        return None
    return functools.partial(screened_image, recode=recode, mode=mode)


def screened_image(sample: dict, *, recode: ImageRecoder | None, mode: str) -> dict | None:
    """``sample`` with its image re-encoded by ``recode`` (or only decoded, to check it), in a
    worker of ``fpipe write --processes``; None to leave out a damaged image, named on the
    worker's stderr (``mode="skip"``, --skip-bad), while one that stops the job is named in
    the error. ``mode`` is :class:`ImageScreen`'s.

    >>> import functools, io
    >>> from PIL import Image
    >>> encoded = io.BytesIO()
    >>> Image.new("RGB", (40, 20)).save(encoded, "PNG")
    >>> halved = functools.partial(screened_image, recode=ImageRecoder(10, "JPEG", 90), mode="look")
    >>> Image.open(io.BytesIO(halved({"key": "a.png", "image": encoded.getvalue()})["image"])).size
    (20, 10)
    >>> screened_image({"key": "b.jpg", "image": b"no image"}, recode=None, mode="skip") is None
    True
    """
    screen = ImageScreen(mode)
    key, data = sample["key"], sample["image"]
    if recode is None:
        keep = screen.passes(data, key)
    else:
        try:
            data, keep = recode(data), True
        except NotAnImage as error:
            keep = screen.failed(key, f"cannot re-encode as an image ({error})", packable=False)
    for path, reason in screen.found:
        print(f"fpipe write: left out {path}: {reason}", file=sys.stderr)
    return {**sample, "image": data} if keep else None


def entry_partitions(sources: list[str], ranges: int | None) -> Any:
    """The partitions of a folder, glob pattern, list file or JSON-lines file: ``ranges``
    contiguous ranges of its entries, as ``fpipe write`` lists them (default: one range a
    :data:`ENTRIES_A_PARTITION` entries); each sample as ``fpipe write`` makes it (the file's
    bytes under ``"image"``, its label numbered in the source's label order). The source is
    listed here, once; each partition carries its own entries to its worker, so the files must
    be at the same paths there.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for name in "abcde":
    ...     with open(os.path.join(folder, f"{name}.txt"), "w") as file:
    ...         _ = file.write(name)
    >>> partitions = entry_partitions([folder], 2)
    >>> [p.shown for p in partitions.arguments]
    ['entries 0:3 of 5', 'entries 3:5 of 5']
    >>> [s["key"] for s in partitions.samples(1)]
    ['d.txt', 'e.txt']
    """
    return _partitions(_listing(sources), ranges)


def _listed_partitions(args: argparse.Namespace, sources: list[str], ranges: int | None) -> Any:
    """:func:`entry_partitions` of the files that --include, --exclude, --strict and
    --separator choose, checked and noted on stderr as without --processes."""
    listing = _listing(sources, args.separator, args.include or (), args.exclude or (),
                       args.strict)
    _check_source_options(listing, args)
    for note in _notes(listing, args):
        print(f"fpipe write: note: {note}", file=sys.stderr)
    return _partitions(listing, ranges)


def _listing(sources: list[str], *options: Any) -> Listing:
    if len(sources) > 1:
        raise UsageError("several SOURCEs are for WebDataset, Parquet/Arrow or TFRecord files; "
                         "give one folder, glob pattern, list file or JSON-lines file")
    source = sources[0]
    if "://" not in source:
        source = os.path.abspath(source)
    return list_source(source, *options)


def _partitions(listing: Listing, ranges: int | None) -> Any:
    from fpipe.prepare import from_generator
    from fpipe.prepare.partitions import even_ranges

    entries = list(listing.entries)
    count = ranges or max(1, -(-len(entries) // ENTRIES_A_PARTITION))
    labels = {name: number for number, name in enumerate(listing.labels)}
    cut = [EntryRange(entries[start:stop], f"entries {start}:{stop} of {len(entries)}")
           for start, stop in even_ranges(len(entries), count)]
    return from_generator(EntrySamples(labels), cut)


class EntryRange:
    """A partition of a listed source: its entries, shown (in the fingerprint) by their range,
    the first and last keys and a digest of all of them, so that a rerun that lists other
    files (another --exclude, a file added) is told from a resume."""

    def __init__(self, entries: list, shown: str) -> None:
        self.entries, self.shown = entries, shown

    def __repr__(self) -> str:
        if not self.entries:
            return self.shown
        keys = hashlib.sha256("\n".join(entry.key for entry in self.entries).encode())
        return (f"{self.shown}, {self.entries[0].key} to {self.entries[-1].key} "
                f"#{keys.hexdigest()[:12]}")


class EntrySamples:
    """The samples of an :class:`EntryRange`, made as ``fpipe write`` makes them."""

    def __init__(self, labels: dict) -> None:
        self.labels = labels

    def __call__(self, part: EntryRange) -> Any:
        make = SampleMaker("image", self.labels, None, ImageScreen("look"))
        for entry in part.entries:
            sample = make(entry)
            if sample is not None:
                yield sample
