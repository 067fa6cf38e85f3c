"""Sources in the training formats fpipe reads, as ``fpipe write`` and
:func:`fpipe.prepare.write_dataset` take them: which format a source is in (WebDataset tar
shards, Parquet or Arrow files and Hugging Face folders, TFRecord files, packed fpipe
datasets), its reader, and its files one by one (the partitions of a prepared dataset).

>>> source_format(["shards-{000..009}.tar"]), source_format(["data/*.parquet"])
('webdataset', 'parquet')
>>> source_format(["photos/"]) is None
True
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fpipe.errors import FpipeError

__all__ = ["FORMATS", "FORMAT_NAMES", "MixedSources", "open_source", "source_files", "source_format",
           "split_by_file"]


class MixedSources(FpipeError, ValueError):
    """Sources in several formats, or some in none of them, given together."""


#: The formats, by the suffixes that name their files.
FORMATS = {"webdataset": (".tar",), "parquet": (".parquet", ".arrow", ".feather", ".ipc"),
           "tfrecord": (".tfrecord", ".tfrecords", ".tfr"), "packed": (".msgpack",)}
FORMAT_NAMES = {"webdataset": "WebDataset shards", "parquet": "Parquet/Arrow files",
          "tfrecord": "TFRecord files", "packed": "packed fpipe datasets"}
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
    """``"webdataset"``, ``"parquet"``, ``"tfrecord"`` or ``"packed"`` when ``sources`` name
    files of that format (by suffix; a file without a known suffix by its first bytes; a
    folder of Parquet/Arrow files or a Hugging Face ``save_to_disk`` folder), None for anything
    else. Sources in several formats are a :class:`MixedSources` error."""
    kinds = [_format_of(source) for source in sources]
    if all(kind is None for kind in kinds):
        return None
    if len(set(kinds)) > 1:
        named = ", ".join(f"{source} ({kind or 'not one of them'})" for source, kind in zip(sources, kinds))
        raise MixedSources(f"the sources must all be WebDataset, Parquet/Arrow or TFRecord files of "
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


def open_source(kind: str, sources: Sequence[str],
                open_packed: Callable[[str], Any] | None = None) -> Any:
    """The reader of ``sources`` in format ``kind`` (see :func:`source_format`); packed
    datasets are opened by ``open_packed`` (a path or URL in, a reader out; default
    :class:`~fpipe.dataset.MsgpackReader`)."""
    from fpipe.formats import ParquetReader, TFRecordReader, WebDatasetReader

    _refuse_pending_exports(sources)
    if kind == "packed":
        return _packed_datasets(list(sources), open_packed)
    readers = {"webdataset": WebDatasetReader, "parquet": ParquetReader, "tfrecord": TFRecordReader}
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


def _packed_datasets(sources: list[str], open_packed: Callable[[str], Any] | None) -> Any:
    """The packed datasets that ``sources`` name (paths, URLs, glob or brace patterns) read
    as one: each sample with its key, to write again (shuffled, merged, or simply copied)."""
    from fpipe.dataset import MsgpackReader, ShardedReader
    from fpipe.formats._foreign import expand_shards

    opened = open_packed or MsgpackReader
    readers = [opened(path) for path in expand_shards(sources)]
    return readers[0] if len(readers) == 1 else ShardedReader(readers)


def split_by_file(sources: Sequence[str]) -> tuple[str, list[str]]:
    """The format of ``sources`` and their files of that format, one by one, in order
    (patterns expanded in sorted order, folders listed in sorted order): the partitions of a
    dataset prepared from them. Sources in no format fpipe reads are a :class:`ValueError`.

    >>> import os, tempfile
    >>> from fpipe.formats import TFRecordWriter
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("b.tfrecord", "a.tfrecord"):
    ...     with TFRecordWriter(os.path.join(folder, name)) as writer:
    ...         writer.write({"x": [1]})
    >>> kind, files = split_by_file([os.path.join(folder, "*.tfrecord")])
    >>> kind, [os.path.basename(name) for name in files]
    ('tfrecord', ['a.tfrecord', 'b.tfrecord'])
    """
    from fpipe.formats._foreign import expand_shards

    kind = source_format(sources)
    if kind is None:
        raise ValueError(f"sources must be WebDataset, Parquet/Arrow, TFRecord files or packed "
                         f"datasets (split by file); got {list(sources)!r:.200}")
    files: list[str] = []
    for source in sources:
        if "://" not in source and os.path.isdir(source):
            files += sorted(str(path) for path in Path(source).rglob("*")
                            if path.is_file() and _format_of_name(path.name) == kind)
        else:
            files += expand_shards(source)
    return kind, files
