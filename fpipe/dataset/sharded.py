"""Several datasets read as one: :class:`ShardedReader`, over a glob pattern (local or a URL
with wildcards), a list of paths, URLs and readers, or a shard index; :class:`ShardedWriter`
writes shards and their index.

>>> from fpipe.dataset import ListReader
>>> len(ShardedReader([ListReader([{"key": "a"}]), ListReader([{"key": "b"}])]))
2

A *shard index* (``X.shards``) names the shards of a dataset and their lengths, so that a
reader of ten thousand shards opens one file, knows its length at once, and opens a shard only
when it reads from it. It is JSON: ``{"format": "fpipe-shards", "version": 1, "shards":
[names], "samples": [counts]}``, the names relative to the index's folder (or URL). The counts
are checked against the shards (see :class:`ShardedReader`).
"""

from __future__ import annotations

import errno
import glob
import json
import os
import warnings
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from fpipe.dataset.base import Reader
from fpipe.dataset.format import DatasetFiles, PathLike
from fpipe.dataset.reader import MsgpackReader
from fpipe.dataset.writer import FileWriter, check_progress_options
from fpipe.errors import FormatError, check_integer, redacted_url
from fpipe.remote.urls import RemoteOptions, check_remote, refuse_remote_options, takes_remote

__all__ = ["ShardedReader", "ShardedWriter", "write_shard_index"]

SHARD_INDEX_SUFFIX = ".shards"
_FORMAT, _VERSION = "fpipe-shards", 1
_INDEX_LIMIT = 256 << 20
_MAX_COUNT = 1 << 32  # a shard is a dataset: fewer keys than msgpack's longest array


class ShardedReader(Reader):
    """Several datasets read as one, in order: a glob pattern (sorted matches), a list of paths,
    URLs and readers, or the path or URL of a shard index (``X.shards``, see the module).

    >>> from fpipe.dataset import ListReader
    >>> first, second = ListReader([{"key": "a"}]), ListReader([{"key": "b"}, {"key": "c"}])
    >>> sharded = ShardedReader([first, second])
    >>> len(sharded), sharded.find_index("c"), [s["key"] for s in sharded.iter(0, 2)]
    (3, 2, ['a', 'b'])

    A shard is opened when it is first read. Its length comes from the size of a local shard's
    ``.offsets`` file, or from the shard index for a shard at a URL, so ``len`` costs no
    opening: over ten thousand shards, a shard index opens with one read and a ``stat`` a local
    shard, and ``len``, ``get`` and the iterators touch only the shards they need. A count in
    the index that is not a local shard's own is corrected, with a warning naming the index and
    the shard (the shard's samples are read, none left out or read twice); a count that no
    shard can hold (negative, 2**32 or more, not an integer) or a shard listed twice is a
    :class:`~fpipe.errors.FormatError` naming the index. A shard at a URL whose length differs
    from the index's raises FormatError naming both when it is opened (samples were numbered
    by the index by then); one listed with 0 samples is opened at once to check it. Shards at
    URLs listed without an index are opened at once (their lengths are in their
    ``.offsets``). ``find_index`` and ``in`` ask the shards in turn, opening them.

    Shards may be URLs, and a pattern may be a URL with wildcards (``s3://b/train-*.msgpack``);
    ``remote=RemoteOptions(...)`` goes to each :class:`MsgpackReader` made from a path or URL
    (and its ``storage_options`` to the fetch of a shard index at a URL).
    """

    @takes_remote
    def __init__(self, shards: Union[PathLike, Iterable[Union[PathLike, Reader]]], *,
                 remote: RemoteOptions | None = None) -> None:
        self._remote = check_remote(remote)
        storage_options = self._remote.storage_options
        self._shard_index: str | None = None  # the shard index read, as shown in messages
        lengths: list[int | None]
        if isinstance(shards, (str, os.PathLike)) and _names_shard_index(os.fspath(shards)):
            self._sources, lengths = _read_shard_index(os.fspath(shards), storage_options)
            self._shard_index, listed = redacted_url(os.fspath(shards)), list(lengths)
            lengths = _own_lengths(self._sources, listed)
        else:
            if isinstance(shards, (str, os.PathLike)):
                pattern = os.fspath(shards)
                shards = _matches(pattern, storage_options)
                if not shards:
                    raise FileNotFoundError(errno.ENOENT, "no dataset matches the pattern",
                                            redacted_url(pattern))
            self._sources = [_checked_source(shard) for shard in shards]
            lengths = [_known_length(source) for source in self._sources]
        local = [source for source in self._sources if isinstance(source, str) and "://" not in source]
        if local:  # checked now: the shards open when they are read
            refuse_remote_options(local[0], self._remote)
        self._opened: dict[int, Reader] = {}
        for shard, length in enumerate(lengths):
            if length is None:  # its length is in its .offsets, at a URL (or to be checked)
                self._opened[shard] = self._made(shard)
                lengths[shard] = len(self._opened[shard])
        self._lengths = np.array(lengths, dtype=np.int64)
        self._starts = np.concatenate(([0], np.cumsum(self._lengths))).astype(np.int64)
        if self._shard_index is not None:
            _warn_of_other_counts(self._shard_index, self._sources, listed, lengths)
        # the same as ints, one per shard: a get bisects them in a fraction of NumPy's time
        self._bounds = self._starts.tolist()

    def __getstate__(self) -> dict:
        # a worker opens the shards it reads itself; readers given as objects go along
        given = {shard: reader for shard, reader in self._opened.items()
                 if self._sources[shard] is reader}
        return {**self.__dict__, "_opened": given}

    def __repr__(self) -> str:
        shown = [source if isinstance(source, Reader) else redacted_url(str(source))
                 for source in self._sources[:3]]
        more = f", ... {len(self._sources)} shards" if len(self._sources) > 3 else ""
        return f"ShardedReader({shown!r}{more})"

    def __len__(self) -> int:
        return self._bounds[-1]

    @property
    def blocks(self) -> np.ndarray | None:
        """The bounds of the shards' blocks, one after the other, when every shard is open
        (given as a reader, or at a URL listed without an index) and has them (the files of a
        :class:`~fpipe.formats.parquet.ParquetReader`, shards at URLs); else None (see
        :class:`~fpipe.dataset.base.Reader`). No shard is opened to find out."""
        readers = [source if isinstance(source, Reader) else self._opened.get(shard)
                   for shard, source in enumerate(self._sources)]
        parts = [getattr(reader, "blocks", None) for reader in readers]
        if not parts or any(part is None for part in parts):
            return None
        shifted = [np.asarray(part, dtype=np.int64) + start for part, start in zip(parts, self._bounds)]
        return np.unique(np.concatenate(shifted))

    @property
    def readers(self) -> list[Reader]:
        """The shards' readers (opening every shard)."""
        return [self._shard(shard) for shard in range(len(self._sources))]

    def _shard(self, shard: int) -> Reader:
        reader = self._opened.get(shard)
        if reader is None:
            reader = self._opened[shard] = self._open(shard)
        return reader

    def _open(self, shard: int) -> Reader:
        reader, expected = self._made(shard), int(self._lengths[shard])
        if len(reader) != expected:
            source = redacted_url(str(self._sources[shard]))
            if self._shard_index is None:
                raise FormatError(f"shard {shard} has {len(reader)} samples; its .offsets said "
                                  f"{expected} when it was listed", path=source)
            raise FormatError(f"shard {shard} ({source}) has {len(reader)} samples; the shard "
                              f"index lists {expected}, and samples were numbered by it "
                              "(write_shard_index writes it anew)", path=self._shard_index)
        return reader

    def _made(self, shard: int) -> Reader:
        source = self._sources[shard]
        return source if isinstance(source, Reader) else MsgpackReader(source, remote=self._remote)

    def close(self) -> None:
        for reader in self._opened.values():
            reader.close()

    def __contains__(self, key: object) -> bool:
        return any(key in self._shard(shard) for shard in range(len(self._sources)))

    def _locate(self, index: int) -> tuple[Reader, int]:
        shard = bisect_right(self._bounds, index) - 1
        return self._shard(shard), index - self._bounds[shard]

    def find_key(self, index: int) -> Any:
        reader, local = self._locate(self._index(index))
        return reader.find_key(local)

    def find_index(self, key: Any) -> int:
        for shard in range(len(self._sources)):
            reader = self._shard(shard)
            if key in reader:
                return int(self._starts[shard]) + reader.find_index(key)
        raise KeyError(key)

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        if type(index) is not int or not 0 <= index < self._bounds[-1]:
            index = self._index(index)
        reader, local = self._locate(index)
        return reader.get(local, yield_key, raw, copy)

    def block_rows(self, start: int, stop: int) -> Any:
        """The shard's :meth:`~fpipe.dataset.base.Reader.block_rows` (a block lies in one
        shard)."""
        reader, local = self._locate(self._index(start))
        return reader.block_rows(local, local + stop - start)

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[Reader, int, int]]:
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        for shard in range(max(first, 0), len(self._sources)):
            low, high = int(self._starts[shard]), int(self._starts[shard + 1])
            if low >= stop:
                return
            if high > start:
                yield self._shard(shard), max(start, low) - low, min(stop, high) - low

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        start, stop, _ = slice(start, stop).indices(len(self))
        return [sample for reader, a, b in self._pieces(start, stop)
                for sample in reader.get_slice(a, b, yield_key, raw, copy)]

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        for reader, a, b in self._pieces(start, stop):
            yield from reader.iter(a, b, yield_key, raw, copy, chunk_size)

    def prefetch(self, indices: Sequence[int]) -> None:
        """Pass each shard the indices of ``indices`` that fall in it (see
        :meth:`~fpipe.dataset.reader.MsgpackReader.prefetch`)."""
        positions = np.asarray(indices, dtype=np.int64)
        shard_of = np.searchsorted(self._starts, positions, side="right") - 1
        for shard in np.unique(shard_of).tolist():
            mine = positions[shard_of == shard]
            self._shard(shard).prefetch(mine - self._starts[shard])


# what ShardedWriter passes on to each shard's FileWriter besides tqdm's options
_SHARD_WRITER_OPTIONS = ("buffering", "progress")


class ShardedWriter:
    """Write samples into shards of ``shard_size`` samples each, ``{prefix}-00000.msgpack``,
    ``{prefix}-00001.msgpack`` ..., and at :meth:`close` their shard index
    ``{prefix}.shards``, from which :class:`ShardedReader` opens them lazily. Each shard is a
    dataset of its own (a :class:`FileWriter`: ``write`` takes dict samples, ``write_packed``
    packed ones); keys are checked within each shard. Local paths only: upload the folder to
    object storage afterwards. ``overwrite`` and the writers' other options (``buffering``,
    ``progress`` and tqdm's; another keyword is a :class:`TypeError` at once) go to every shard;
    an existing shard index is replaced only with ``overwrite=True``.

    >>> import os, tempfile
    >>> prefix = os.path.join(tempfile.mkdtemp(), "train")
    >>> with ShardedWriter(prefix, shard_size=2) as writer:
    ...     for i in range(5):
    ...         writer.write({"key": f"{i}", "x": i})
    >>> sorted(os.listdir(os.path.dirname(prefix)))[-2:]
    ['train-00002.msgpack.offsets', 'train.shards']
    >>> reader = ShardedReader(prefix + ".shards")
    >>> len(reader), reader.get(4)
    (5, {'key': '4', 'x': 4})
    """

    def __init__(self, prefix: PathLike, shard_size: int, *, overwrite: bool = False,
                 **writer_options: Any) -> None:
        if isinstance(prefix, str) and "://" in prefix:
            raise ValueError(f"ShardedWriter writes local shards; got the URL {redacted_url(prefix)!r} "
                             "(write them here, then upload the folder)")
        self.prefix, self.shard_size = Path(prefix), check_integer("shard_size", shard_size, 1)
        # now, not at the first shard: a misspelled option is refused before anything exists
        check_progress_options("ShardedWriter", {name: value for name, value in writer_options.items()
                                                 if name not in _SHARD_WRITER_OPTIONS})
        self.index = Path(f"{self.prefix}{SHARD_INDEX_SUFFIX}")
        if self.index.exists() and not overwrite:
            raise FileExistsError(errno.EEXIST, "shard index exists (pass overwrite=True to "
                                  "replace it)", str(self.index))
        self._options = {"overwrite": overwrite, **writer_options}
        self._shards: list[Path] = []
        self._counts: list[int] = []
        self._writer: FileWriter | None = None
        self._closed = False

    def __enter__(self) -> ShardedWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _current(self) -> FileWriter:
        if self._closed:
            raise ValueError(f"{self.index}: write to a closed writer")
        if self._writer is None or self._writer.written >= self.shard_size:
            self._finish_shard()
            path = Path(f"{self.prefix}-{len(self._shards):05d}.msgpack")
            self._writer = FileWriter(path, **self._options)
            self._shards.append(path)
        return self._writer

    def _finish_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._counts.append(self._writer.written)
            self._writer = None

    def write(self, sample: dict) -> None:
        """Write one dict sample into the current shard (a new one when it is full)."""
        self._current().write(sample)

    def write_packed(self, key: str, packed: bytes) -> None:
        """Write one packed sample under ``key`` (see :meth:`Writer.write_packed`)."""
        self._current().write_packed(key, packed)

    def close(self) -> None:
        """Close the last shard and write the shard index (beside it, then renamed)."""
        if self._closed:
            return
        self._closed = True
        self._finish_shard()
        _write_index(self.index, [path.name for path in self._shards], self._counts)


def write_shard_index(shards: Iterable[PathLike], index: PathLike) -> None:
    """Write the shard index ``index`` (``X.shards``) of the local datasets ``shards``, which
    must be in its folder (or below it), in the order given; each one's length comes from its
    ``.offsets``. For shards written otherwise than by :class:`ShardedWriter`.

    >>> import os, tempfile
    >>> from fpipe.dataset import FileWriter
    >>> folder = tempfile.mkdtemp()
    >>> for part in range(3):
    ...     with FileWriter(os.path.join(folder, f"part-{part}.msgpack")) as writer:
    ...         writer.write({"key": f"{part}"})
    >>> write_shard_index(sorted(glob.glob(os.path.join(folder, "part-*.msgpack"))),
    ...                   os.path.join(folder, "parts.shards"))
    >>> len(ShardedReader(os.path.join(folder, "parts.shards")))
    3
    """
    index = Path(index)
    if not index.name.endswith(SHARD_INDEX_SUFFIX):
        raise ValueError(f"a shard index is named X{SHARD_INDEX_SUFFIX}; got index={str(index)!r}")
    folder, names, counts = index.parent.resolve(), [], []
    for shard in map(Path, shards):
        try:
            names.append(shard.resolve().relative_to(folder).as_posix())
        except ValueError:
            raise ValueError(f"shard {shard} is not in the folder of the index {index}") from None
        length = _offsets_length(shard)
        if length is None:
            raise FileNotFoundError(errno.ENOENT, "dataset offsets not found",
                                    str(DatasetFiles(shard).offsets))
        counts.append(length)
    _write_index(index, names, counts)


def shard_index_text(names: list[str], counts: list[int]) -> str:
    """The JSON of the shard index of shards ``names`` (relative to its folder) holding
    ``counts`` samples (see the module). Not in ``__all__``: for writers of shards that are
    not local files (``fpipe.prepare`` uploads it).

    >>> shard_index_text(["a-0.msgpack"], [2])
    '{"format": "fpipe-shards", "version": 1, "shards": ["a-0.msgpack"], "samples": [2]}\\n'
    """
    content = {"format": _FORMAT, "version": _VERSION, "shards": names, "samples": counts}
    return json.dumps(content, ensure_ascii=False) + "\n"


def _write_index(index: Path, names: list[str], counts: list[int]) -> None:
    staged = index.with_name(f".{index.name}.{os.getpid()}")
    staged.write_text(shard_index_text(names, counts), encoding="utf-8")
    os.replace(staged, index)


def _names_shard_index(location: str) -> bool:
    """Whether ``location`` names a shard index: by its path (a URL's query says nothing)."""
    if "://" in location:
        from fpipe.remote.urls import split_query

        location = split_query(location)[0]
    return location.endswith(SHARD_INDEX_SUFFIX)


def _read_shard_index(location: str, storage_options: dict | None) -> tuple[list[str], list]:
    """The shards a shard index names (paths or URLs beside it) and their lengths."""
    if "://" in location:
        from fpipe.remote.urls import read_whole

        data, base = read_whole(location, storage_options, _INDEX_LIMIT), location
        shown = redacted_url(location)
    else:
        data, base, shown = Path(location).read_bytes(), str(Path(location).parent), location
    try:
        content = json.loads(data)
        names, counts = content["shards"], content["samples"]
        if content.get("format") != _FORMAT or content.get("version") != _VERSION:
            raise ValueError(f"not a shard index of version {_VERSION}")
        if len(names) != len(counts):
            raise ValueError(f"{len(names)} shards and {len(counts)} lengths")
        sources = [_beside(base, name, "://" in location) for name in names]
        lengths = [_count(shard, name, count) for shard, (name, count) in
                   enumerate(zip(names, counts))]
        _refuse_repeats(names)
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise FormatError(f"corrupt shard index ({error})", path=shown) from error
    return sources, lengths


def _count(shard: int, name: str, count: Any) -> int:
    """The count of samples listed for ``shard`` (``name``), checked."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < _MAX_COUNT:
        raise ValueError(f"shard {shard} ({name}) is listed with {count!r:.40} samples, not a "
                         f"count from 0 to 2**32 - 1")
    return count


def _refuse_repeats(names: list[str]) -> None:
    seen: dict[str, int] = {}
    for shard, name in enumerate(names):
        if name in seen:
            raise ValueError(f"shard {shard} ({name}) is listed before, as shard {seen[name]}")
        seen[name] = shard


def _own_lengths(sources: list[str], listed: list[int]) -> list[int | None]:
    """The lengths of the shards a shard index lists, as far as they cost no opening: a local
    shard's from its ``.offsets``; otherwise the count listed, which the shard is checked
    against when it is opened, but None (open it now) for a count of 0, which would never be
    opened and checked."""
    owns = [None if "://" in source else _offsets_length(Path(source)) for source in sources]
    return [count or None if own is None else own for own, count in zip(owns, listed)]


def _warn_of_other_counts(index: str, sources: list[str], listed: list[int],
                          lengths: list[int]) -> None:
    """Warn, naming the shard index and the shards, of counts it lists that are not the
    shards' own (which are read: nothing is left out or read twice)."""
    other = [f"shard {shard} ({redacted_url(source)}) holds {own}, not {count}"
             for shard, (source, count, own) in enumerate(zip(sources, listed, lengths))
             if own != count]
    if other:
        more = f" and {len(other) - 3} more" if len(other) > 3 else ""
        warnings.warn(f"{index}: samples listed that are not the shards' own: "
                      f"{'; '.join(other[:3])}{more}; the shards are read with their own "
                      "counts (write_shard_index writes the index anew)", stacklevel=3)


def _beside(base: str, name: Any, url: bool) -> str:
    """Shard ``name`` in folder ``base``, or for a URL, beside the index at URL ``base``."""
    parts = name.split("/") if isinstance(name, str) else None
    if not parts or any(part in ("", ".", "..") for part in parts) or "\\" in name:
        raise ValueError(f"a shard's name is a relative path within the index's folder; got "
                         f"{name!r:.80}")
    if url:
        from fpipe.remote.urls import beside_url

        return beside_url(base, name)
    return os.path.join(base, *parts)


def _checked_source(shard: Any) -> Any:
    if isinstance(shard, Reader):
        return shard
    if isinstance(shard, (str, os.PathLike)):
        return shard if isinstance(shard, str) and "://" in shard else os.fspath(shard)
    raise TypeError(f"shards must be paths or readers; got {type(shard).__name__} {shard!r:.80}")


def _known_length(source: Any) -> int | None:
    """The length of a shard that costs no opening: a reader's, or a local shard's from the
    size of its ``.offsets`` (None for one at a URL, or with a legacy index)."""
    if isinstance(source, Reader):
        return len(source)
    if "://" in source:
        return None
    return _offsets_length(Path(source))


def _offsets_length(path: Path) -> int | None:
    try:
        size = DatasetFiles(path).offsets.stat().st_size
    except FileNotFoundError:
        return None
    return size // 8 - 1 if size >= 8 and size % 8 == 0 else None


def _matches(pattern: str, storage_options: dict | None) -> list[str]:
    if isinstance(pattern, str) and "://" in pattern:
        from fpipe.remote.urls import glob_urls

        return glob_urls(pattern, storage_options)
    return sorted(glob.glob(pattern))
