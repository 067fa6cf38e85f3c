"""``fpipe write SOURCE OUT``: pack a well-known dataset, a folder tree, a list file or JSON lines."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FpipeError
from ..storage._staging import staged_datasets
from ._common import (
    CLASSES_SUFFIX,
    UsageError,
    add_command,
    human_bytes,
    non_negative_int,
    positive_int,
    say,
    shows_progress,
)
from ._inputs import Entry, Listing, list_source

if TYPE_CHECKING:
    from ..sets import KnownDataset

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
  a JSON-lines file (.jsonl), one sample object per line, written as it is.

For files, OUT is the dataset's file (e.g. train.msgpack); each sample is
{{"key": the file's relative path, "image" (--field): the file's bytes, "label": number}}.
Images are stored as their original bytes unless --resize or --encode is given.
Labels are numbered in natural order of their names (digit runs compare as numbers, so
'class2' < 'class10'), and the names are stored beside the dataset, in
OUT.classes.json. Nothing appears under OUT unless the whole run succeeds."""

_EXAMPLE = """\
  fpipe write photos/ photos.msgpack --workers 4 --shuffle --seed 1
  fpipe write 'photos/{LABEL}/*.jpg' small.msgpack --resize 128 --encode jpeg
  fpipe write train.csv train.msgpack
  fpipe write cifar10 data/cifar10 --download"""

_FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe write``."""
    from .. import sets

    known = ", ".join(sets.names())
    parser = add_command(commands, "write", "write packed datasets from files or well-known sets",
                         _DESCRIPTION.format(known=known), _EXAMPLE, _run_write)
    parser.add_argument("source", metavar="SOURCE",
                        help=f"a folder, glob pattern, list file, .jsonl file, or one of {known}")
    parser.add_argument("out", metavar="OUT",
                        help="the dataset file to write (a folder for well-known datasets)")
    parser.add_argument("-y", "--overwrite", action="store_true",
                        help="replace datasets that already exist")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="threads that read and encode files (the output order does not change)")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the samples by --seed")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of --shuffle (0)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or summary")
    _add_file_options(parser.add_argument_group("files (folders, patterns, list files)"))
    _add_known_options(parser.add_argument_group("well-known datasets"))


def _add_file_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--field", default="image", metavar="NAME",
                       help="the field that holds a file's bytes (default image)")
    group.add_argument("--separator", metavar="SEP",
                       help="column separator of a list file (default: tab if the first line "
                            "has one, else comma)")
    group.add_argument("--resize", type=positive_int, metavar="SIZE",
                       help="scale images so that their shorter side is SIZE pixels")
    group.add_argument("--encode", choices=sorted(_FORMATS),
                       help="re-encode images in this format (default: keep the original bytes, "
                            "or with --resize the original format)")
    group.add_argument("--quality", type=positive_int, default=90,
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
    from .. import sets

    if args.source in sets.names():
        if args.resize or args.encode or args.separator or args.field != "image":
            raise UsageError("--field, --separator, --resize and --encode are for files, not "
                             f"for the well-known dataset {args.source}")
        return _write_known_set(sets.get(args.source), args)
    source = Path(args.source)
    if not source.exists() and not any(c in args.source for c in "*?[{"):
        if len(source.parts) > 1 or source.suffix:
            raise FileNotFoundError(f"{args.source}: no such file or folder")
        return _fail(EXIT_USAGE_ERROR, f"unknown dataset {args.source!r}; known: "
                     f"{', '.join(sets.names())}; or give a folder, glob pattern, list file or "
                     f".jsonl file")
    return _write_files(args)


def _fail(status: int, error: object) -> int:
    print(f"fpipe write: {error}", file=sys.stderr)
    return status


# --- well-known datasets ----------------------------------------------------------------


def _write_known_set(dataset: KnownDataset, args: argparse.Namespace) -> int:
    from ..sets import ArchiveError, DownloadError

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
    from ..storage import MsgpackReader

    for split, path in written.items():
        with MsgpackReader(path) as reader:
            print(f"{split}: {path} ({len(reader)} samples)")


# --- files ------------------------------------------------------------------------------


def _write_files(args: argparse.Namespace) -> int:
    if args.origin or args.download or args.base_url or args.splits:
        raise UsageError("--from, --download, --base-url and --split are for well-known datasets")
    if len(args.separator or ",") != 1:
        raise UsageError(f"--separator must be one character; got {args.separator!r}")
    listing = list_source(args.source, args.separator)
    if listing.note and not args.quiet:
        print(f"fpipe write: note: {listing.note}", file=sys.stderr)
    entries = _ordered(listing.entries, args)
    make = SampleMaker(args.field, {name: i for i, name in enumerate(listing.labels)},
                       _recoder(args))
    out = Path(args.out)
    with staged_datasets([out], args.overwrite) as (staged,):
        _write_samples(staged, entries, make, args)
        if listing.labels:
            _write_labels(staged, args.source, listing)
    say(args, f"wrote {len(entries)} samples from {listing.kind} {args.source} to {out} "
              f"({human_bytes(out.stat().st_size)})"
        + (f", {len(listing.labels)} labels in {out}{CLASSES_SUFFIX}" if listing.labels else ""))
    return 0


def _ordered(entries: list[Entry], args: argparse.Namespace) -> list[Entry]:
    if not args.shuffle:
        return entries
    from ..random import item_rng

    return [entries[i] for i in item_rng(args.seed, 0, 0).permutation(len(entries)).tolist()]


def _write_samples(path: Path, entries: list[Entry], make: SampleMaker,
                   args: argparse.Namespace) -> None:
    from ..storage import FileWriter

    shown = shows_progress(args)
    samples: Any = map(make, entries)
    if args.workers > 1:
        from ..streaming import threads

        samples = threads(make, n_workers=args.workers)(entries)
    with FileWriter(path, progress=shown, disable=not shown, total=len(entries),
                    desc=Path(args.out).name, unit=" samples") as writer:
        try:
            for sample in samples:
                writer.write(sample)
        finally:
            getattr(samples, "close", lambda: None)()


def _write_labels(path: Path, source: str, listing: Listing) -> None:
    content = {"dataset": source, "classes": {"label": listing.labels}, "label_order": "natural"}
    Path(str(path) + CLASSES_SUFFIX).write_text(
        json.dumps(content, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


class SampleMaker:
    """Turn an :class:`Entry` into the sample to write: read its file (and re-encode it),
    number its label. A plain class, so that worker threads share nothing but it."""

    def __init__(self, field: str, labels: dict, recode: ImageRecoder | None) -> None:
        self.field, self.labels, self.recode = field, labels, recode

    def __call__(self, entry: Entry) -> dict:
        if entry.sample is not None:
            sample = dict(entry.sample)
            if isinstance(sample.get("label"), str):
                sample["label"] = self.labels[sample["label"]]
            return sample
        try:
            data = Path(entry.path).read_bytes()
        except OSError as error:
            raise FpipeError(f"cannot read {entry.path}: {error.strerror or error}") from None
        if self.recode is not None:
            data = self.recode(data, entry.path)
        sample = {"key": entry.key, self.field: data}
        if entry.label is not None:
            sample["label"] = self.labels[entry.label]
        return sample


def _recoder(args: argparse.Namespace) -> ImageRecoder | None:
    if args.resize is None and args.encode is None:
        return None
    if args.quality > 100:
        raise UsageError(f"--quality must be between 1 and 100; got {args.quality}")
    return ImageRecoder(args.resize, _FORMATS.get(args.encode), args.quality)


class ImageRecoder:
    """Resize (shorter side to ``size``) and re-encode image bytes with Pillow, imported here
    only when images are re-encoded."""

    def __init__(self, size: int | None, encoding: str | None, quality: int) -> None:
        self.size, self.encoding, self.quality = size, encoding, quality

    def __call__(self, data: bytes, name: str) -> bytes:
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as image:
                encoding = self.encoding or (image.format if image.format in ("JPEG", "WEBP")
                                             else "PNG")
                return self._encode(self._resized(image), encoding)
        except (UnidentifiedImageError, OSError, ValueError) as error:
            raise FpipeError(f"{name}: cannot re-encode as an image ({error})") from None

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
