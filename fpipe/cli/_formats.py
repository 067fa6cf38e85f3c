"""Datasets in other training formats on the command line: which format a SOURCE is in
(WebDataset tar shards, Parquet or Arrow files and Hugging Face folders, TFRecord files, and
packed fpipe datasets too), its reader, and ``fpipe write`` from it into a packed dataset.

>>> source_format(["shards-{000..009}.tar"]), source_format(["data/*.parquet"])
('webdataset', 'parquet')
>>> source_format(["photos/"]) is None
True
"""

from __future__ import annotations

import argparse
import functools
import os
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fpipe.cli._common import (
    UsageError,
    chosen_seed,
    human_bytes,
    refuse_options,
    say,
    shows_progress,
)
from fpipe.dataset._staging import dataset_files, refuse_inputs, staged_datasets
from fpipe.errors import FpipeError

__all__ = ["FORMATS", "open_source", "source_files", "source_format", "write_from_format"]

#: The formats, by the suffixes that name their files.
FORMATS = {"webdataset": (".tar",), "parquet": (".parquet", ".arrow", ".feather", ".ipc"),
           "tfrecord": (".tfrecord", ".tfrecords", ".tfr"), "packed": (".msgpack",)}
_NAMES = {"webdataset": "WebDataset shards", "parquet": "Parquet/Arrow files",
          "tfrecord": "TFRecord files", "packed": "packed fpipe datasets"}
# options of ``fpipe write`` that only files (images) take
_FILE_OPTIONS = ("field", "resize", "encode", "quality", "separator", "include", "exclude",
                 "classes", "strict", "check", "skip_bad", "origin", "download",
                 "base_url", "splits")


def _format_of_name(name: str) -> str | None:
    lowered = name.lower().rstrip("/")
    for kind, suffixes in FORMATS.items():
        if lowered.endswith(suffixes):
            return kind
    return None


def _sniffed(path: str) -> str | None:
    """The format of a file whose name does not say it, from its first bytes: a TFRecord
    record header (length and its CRC), a Parquet or Arrow magic, a tar header; a packed
    dataset by its ``.offsets`` file."""
    from fpipe.files import DatasetFiles
    from fpipe.formats._crc32c import masked_crc32c

    if DatasetFiles(path).offsets.is_file():
        return "packed"
    try:
        with open(path, "rb") as file:
            head = file.read(512)
    except OSError:
        return None
    if head[:4] == b"PAR1" or head[:6] == b"ARROW1":
        return "parquet"
    if len(head) >= 12 and masked_crc32c(head[:8]) == struct.unpack_from("<I", head, 8)[0]:
        return "tfrecord"
    if len(head) == 512 and head[257:262] == b"ustar":
        return "webdataset"
    return None


def _format_of(source: str) -> str | None:
    if "://" in source:  # by the path: a query (a presigned URL's signature) says nothing
        from fpipe.remote.urls import split_query

        return _format_of_name(split_query(source)[0])
    if os.path.isdir(source):
        folder = Path(source)
        if (folder / "state.json").is_file() and any(folder.glob("*.arrow")):
            return "parquet"
        return "parquet" if _only_parquet(folder) else None
    named = _format_of_name(source)
    if named is not None or not os.path.isfile(source):
        return named
    return _sniffed(source)


def _only_parquet(folder: Path) -> bool:
    """Whether ``folder`` holds files, all of them (hidden ones aside) Parquet or Arrow files
    by their names; the look stops at the first that is not (a folder of a million images
    is not listed)."""
    found = False
    for path in folder.rglob("*"):
        if not path.name.startswith(".") and path.is_file():
            if _format_of_name(path.name) != "parquet":
                return False
            found = True
    return found


def source_format(sources: Sequence[str]) -> str | None:
    """``"webdataset"``, ``"parquet"`` or ``"tfrecord"`` when the SOURCE arguments name files
    of that format (by suffix; a file without a known suffix by its first bytes; a folder of
    Parquet/Arrow files or a Hugging Face ``save_to_disk`` folder), None for anything else.
    Sources in several formats are a usage error."""
    kinds = [_format_of(source) for source in sources]
    if all(kind is None for kind in kinds):
        return None
    if len(set(kinds)) > 1:
        named = ", ".join(f"{source} ({kind or 'not one of them'})" for source, kind in zip(sources, kinds))
        raise UsageError(f"the sources must all be WebDataset, Parquet/Arrow or TFRecord files of "
                         f"one format; got {named}")
    return kinds[0]


def source_files(sources: Sequence[str]) -> Iterator[str]:
    """The local files that the SOURCE arguments name (patterns expanded, folders listed),
    which an output must not replace."""
    from fpipe.formats._foreign import expand_shards

    for source in sources:
        if "://" in source:
            continue
        if os.path.isdir(source):
            yield from (str(path) for path in Path(source).rglob("*") if path.is_file())
        else:
            yield from (path for path in expand_shards(source, must_exist=False)
                        if os.path.isfile(path))


def open_source(kind: str, sources: Sequence[str]) -> Any:
    """The reader of ``sources`` in format ``kind`` (see :func:`source_format`)."""
    from fpipe.formats import ParquetReader, TFRecordReader, WebDatasetReader

    _refuse_pending_exports(sources)
    readers = {"webdataset": WebDatasetReader, "parquet": ParquetReader, "tfrecord": TFRecordReader,
               "packed": _packed_datasets}
    return readers[kind](list(sources))


def _refuse_pending_exports(sources: Sequence[str]) -> None:
    """Refuse shards of a pattern whose export was killed while it renamed them into place
    (they are of two exports until the next export to the pattern finishes that commit)."""
    import glob

    from fpipe.formats._foreign import EXPORT_JOURNAL, pending_export

    journals: dict[str, bool] = {}
    for path in source_files(sources):
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in journals:
            journals[folder] = bool(glob.glob(os.path.join(glob.escape(folder), ".fpipe-*",
                                                           EXPORT_JOURNAL)))
        reason = pending_export(path) if journals[folder] else None
        if reason is not None:
            raise FpipeError(f"{path}: {reason}")


def _packed_datasets(sources: list[str]) -> Any:
    """The packed datasets that ``sources`` name (paths, URLs, glob or brace patterns) read
    as one: each sample with its key, to write again (shuffled, merged, or simply copied)."""
    from fpipe.cli._common import open_dataset
    from fpipe.dataset import ShardedReader
    from fpipe.formats._foreign import expand_shards

    readers = [open_dataset(path) for path in expand_shards(sources)]
    return readers[0] if len(readers) == 1 else ShardedReader(readers)


def _carry_classes(sources: Sequence[str], target: Path) -> None:
    """Store the class names of the packed datasets ``sources`` beside ``target`` when they
    all hold the same ones (else the labels would mean different classes: none are stored)."""
    from fpipe.dataset.class_lists import read_classes
    from fpipe.formats._foreign import expand_shards

    stored = [read_classes(path) for path in expand_shards(sources)]
    if stored[0] is None or any(other != stored[0] for other in stored[1:]):
        return
    from fpipe.files import DatasetFiles

    text = DatasetFiles(expand_shards(sources)[0]).classes.read_text(encoding="utf-8")
    DatasetFiles(target).classes.write_text(text, encoding="utf-8")


def write_from_format(kind: str, args: argparse.Namespace) -> int:
    """``fpipe write SOURCE... OUT`` for sources in another format: every sample, in order (or
    shuffled by ``--seed``), read in bounded memory and written with its key."""
    refuse_options({f"--{name.replace('_', '-')}": getattr(args, name, None)
                    for name in _FILE_OPTIONS}, f"with {_NAMES[kind]}, whose samples are "
                   "written as they are read")
    if args.append and args.overwrite:
        raise UsageError("--append adds to OUT, -y/--overwrite replaces it: pass one of them")
    reader = open_source(kind, args.source)
    if kind == "tfrecord":
        from fpipe.formats.tfrecord import packing_reader

        reader = packing_reader(reader)
    out = Path(args.out)
    if args.append:
        refuse_inputs(dataset_files(out), source_files(args.source))
        _write_packed(out, reader, args, append=True)
    else:
        with staged_datasets([out], args.overwrite, sources=source_files(args.source)) as (staged,):
            _write_packed(staged, reader, args)
            if kind == "packed":
                _carry_classes(args.source, staged)
    say(args, f"{'appended' if args.append else 'wrote'} {len(reader)} samples from "
              f"{_NAMES[kind]} ({len(args.source)} source(s)) to {out} "
              f"({human_bytes(out.stat().st_size)})")
    return 0


#: Samples a worker reads and decodes at a time with ``--workers``.
WORKER_CHUNK = 1024


def _ordered(reader: Any, args: argparse.Namespace) -> Any:
    """``reader``, or its samples shuffled by ``--seed`` with ``--shuffle``: an
    :class:`~fpipe.orderings.IndexShuffler`, which computes the sample at each position and
    holds no permutation (a Shuffler draws one of 4 bytes a sample, in each worker too)."""
    if args.shuffle:
        from fpipe.orderings import IndexShuffler

        return IndexShuffler(reader, seed=chosen_seed(args))
    return reader


def _pairs(reader: Any, args: argparse.Namespace) -> Iterator[tuple[str, dict]]:
    """``(key, sample)`` of every sample, in order or shuffled by ``--seed``."""
    if args.shuffle:
        return _ordered(reader, args).iter(yield_key=True)
    return reader.iter(yield_key=True, chunk_size=256)


def _packed_in_workers(reader: Any, args: argparse.Namespace) -> Iterator[tuple[str, bytes]]:
    """``(key, packed sample)`` of every sample, in the order of :func:`_pairs`: read, decoded
    and packed by ``--workers`` processes, ``WORKER_CHUNK`` positions a task. Closing the
    iterator stops the workers."""
    from fpipe.stream import ParallelOptions, processes

    source = _ordered(reader, args)
    spans = ((start, min(start + WORKER_CHUNK, len(source)))
             for start in range(0, len(source), WORKER_CHUNK))
    chunks = processes(functools.partial(_packed_span, source=source), n_workers=args.workers,
                       options=ParallelOptions(chunk_size=1))(spans)
    try:
        for chunk in chunks:
            yield from chunk
    finally:
        chunks.close()


def _packed_span(span: tuple[int, int], source: Any) -> list[tuple[str, bytes]]:
    """The samples at positions ``span = (start, stop)`` of ``source`` (a reader or an
    ordering), each packed with its key."""
    from fpipe.dataset.format import new_packer

    pack, packed = new_packer().pack, []
    for key, sample in source.iter(*span, yield_key=True, chunk_size=256):
        sample["key"] = key
        try:
            packed.append((key, _packed(pack, sample)))
        except UnicodeEncodeError:
            sample = _text_names(sample)
            packed.append((sample["key"], _packed(pack, sample)))
    return packed


def _write_packed(path: Path, reader: Any, args: argparse.Namespace, append: bool = False) -> None:
    from fpipe.dataset import FileWriter

    shown = shows_progress(args)
    with FileWriter(path, append=append, progress=shown, disable=not shown, total=len(reader),
                    desc=Path(args.out).name, unit=" samples") as writer:
        packed = _packed_in_workers(reader, args) if args.workers > 1 else None
        try:
            if packed is None:
                _write_all(writer, _pairs(reader, args))
            else:
                for key, data in packed:
                    writer.write_packed(key, data)
        except BaseException:
            if append:
                writer.abandon()
            raise
        finally:
            if packed is not None:
                packed.close()


def _write_all(writer: Any, pairs: Iterator[tuple[str, dict]]) -> None:
    """Write each sample with its key. One loop and no call per sample but the writer's: at a
    million rows, a Python call per row is a tenth of a second."""
    write = writer.write
    for key, sample in pairs:
        sample["key"] = key
        try:
            write(sample)
        except TypeError as error:
            _name_the_field(sample, error)
            raise
        except UnicodeEncodeError:  # the packer refused the name before anything was written
            write(_text_names(sample))


# The surrogate escapes of bytes 0x80-0xFF (as Python and fpipe read names that are not
# UTF-8, e.g. tar members named on a Latin-1 system) and the Latin-1 characters of the bytes.
_LATIN_1 = {0xDC80 + byte: 0x80 + byte for byte in range(0x80)}


def _text_names(sample: dict) -> dict:
    """``sample`` with the bytes of its key and field names that are not UTF-8 read as Latin-1:
    a packed dataset holds its keys as text, and ``b"caf\\xe9"`` was most likely ``café``.

    >>> _text_names({"key": "caf\\udce9", "jpg": b"..."})
    {'key': 'café', 'jpg': b'...'}
    """
    return {(name.translate(_LATIN_1) if isinstance(name, str) else name):
            (value.translate(_LATIN_1) if name == "key" and isinstance(value, str) else value)
            for name, value in sample.items()}


def _packed(pack: Callable[[dict], bytes], sample: dict) -> bytes:
    """``sample`` packed, or FpipeError naming the field that a packed dataset cannot hold."""
    try:
        return pack(sample)
    except TypeError as error:
        _name_the_field(sample, error)
        raise


def _name_the_field(sample: dict, error: TypeError) -> None:
    """Raise FpipeError naming the field of ``sample`` that a packed dataset cannot hold (the
    writer's ``error`` said only that something could not be packed)."""
    from fpipe.dataset import pack_sample

    for field, value in sample.items():
        try:
            pack_sample(value)
        except TypeError:
            raise FpipeError(f"sample {sample['key']!r}: field {field!r} holds "
                             f"{type(value).__name__}, which a packed dataset cannot hold "
                             f"({error})") from None


def note(text: str) -> None:
    """A one-line note on stderr."""
    print(f"fpipe: note: {text}", file=sys.stderr)
