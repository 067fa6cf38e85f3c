"""Datasets in other training formats on the command line: ``fpipe write`` from WebDataset tar
shards, Parquet or Arrow files and Hugging Face folders, TFRecord files, and packed fpipe
datasets into a packed dataset. Which format a SOURCE is in, and its reader, are
:mod:`fpipe.formats._sources`' (``fpipe.prepare`` splits the same sources into partitions);
here a mix of formats is a usage error, and packed datasets are opened with the command's
checks.

>>> source_format(["shards-{000..009}.tar"]), source_format(["data/*.parquet"])
('webdataset', 'parquet')
>>> source_format(["photos/"]) is None
True
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fpipe.cli._common import (
    UsageError,
    chosen_seed,
    human_bytes,
    open_dataset,
    refuse_options,
    say,
    shows_progress,
)
from fpipe.dataset._staging import dataset_files, refuse_inputs, staged_datasets
from fpipe.errors import FpipeError
from fpipe.formats._sources import FORMAT_NAMES, FORMATS, MixedSources, source_files
from fpipe.formats._sources import open_source as open_any_source
from fpipe.formats._sources import source_format as any_source_format

__all__ = ["FORMATS", "open_source", "source_files", "source_format", "write_from_format"]


def source_format(sources: Sequence[str]) -> str | None:
    """The format of the SOURCE arguments (see :func:`fpipe.formats._sources.source_format`);
    sources in several formats are a usage error."""
    try:
        return any_source_format(sources)
    except MixedSources as error:
        raise UsageError(str(error)) from None


def open_source(kind: str, sources: Sequence[str]) -> Any:
    """The reader of ``sources`` in format ``kind``; packed datasets are checked as every
    command checks a dataset it reads."""
    return open_any_source(kind, sources, open_packed=open_dataset)


# options of ``fpipe write`` that only files (images) take
_FILE_OPTIONS = ("field", "resize", "encode", "quality", "separator", "include", "exclude",
                 "classes", "strict", "check", "skip_bad", "origin", "download",
                 "base_url", "splits")


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
                    for name in _FILE_OPTIONS}, f"with {FORMAT_NAMES[kind]}, whose samples are "
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
              f"{FORMAT_NAMES[kind]} ({len(args.source)} source(s)) to {out} "
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
