"""Read Parquet and Arrow IPC files, and Hugging Face ``datasets`` folders, in place:
:class:`ParquetFileReader`, :class:`ArrowFileReader` (one file each) and
:class:`ParquetReader` (files, folders, glob and brace patterns, read as one
:class:`~fpipe.dataset.sharded.ShardedReader`), with fpipe's reader API. Rows are samples:
dicts of column name to value, as ``pyarrow`` converts them (strings, bytes, numbers, lists,
dicts; fixed-shape tensor columns as NumPy arrays).

Random access goes by row group (Parquet) or record batch (Arrow): reading a row decodes its
row group once, and the reader keeps the decoded groups it read last, up to ``cache_bytes``.
Iteration decodes each row group once, in order. Arrow IPC files are read as Parquet files
are: a record batch at a time, into memory (never memory-mapped: a file cut or changed under a
mapping kills the process). Every row group and record batch is validated in full by pyarrow
when it is read (offsets, lengths, UTF-8), so a damaged file raises
:class:`~fpipe.errors.FormatError` naming the file, the row group or record batch and the
sample, and never gives a row that pyarrow's validation rejects.

pyarrow is imported only here, and only when a reader is made (``pip install fpipe[parquet]``).

>>> import os, tempfile
>>> import pyarrow as pa, pyarrow.parquet as pq
>>> path = os.path.join(tempfile.mkdtemp(), "train.parquet")
>>> pq.write_table(pa.table({"text": ["a", "b", "c"], "label": [0, 1, 0]}), path, row_group_size=2)
>>> reader = ParquetFileReader(path)
>>> len(reader), reader[2], reader.find_key(2)
(3, {'text': 'c', 'label': 0}, 'train.parquet:2')
>>> ParquetFileReader(path, columns=["label"])[1]
{'label': 1}
"""

from __future__ import annotations

import json
import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Union

import numpy as np

from fpipe.dataset.base import Reader
from fpipe.dataset.format import PathLike, pack_sample
from fpipe.dataset.keyindex import KeyTable
from fpipe.dataset.sharded import ShardedReader
from fpipe.errors import FormatError, check_integer
from fpipe.formats._foreign import (
    ByteSource,
    expand_shards,
    numbered_index,
    numbered_keys,
    renamed,
    strings_to_arrays,
    write_shards,
)
from fpipe.formats._ipc import END_OF_STREAM, IpcLayout, ipc_layout
from fpipe.remote.urls import RemoteOptions, check_remote, takes_remote

__all__ = ["ArrowFileReader", "ParquetFileReader", "ParquetReader", "write_parquet"]

DEFAULT_CACHE_BYTES = 256 << 20
_ROWS_AT_ONCE = 1024  # rows converted to Python at a time while iterating
_ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
_KEY_COLUMNS = ("key", "__key__")


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as error:
        raise ModuleNotFoundError("reading Parquet and Arrow files needs pyarrow: pip install "
                                  "'fpipe[parquet]'") from error
    return pyarrow


def _arrow_errors() -> tuple[type[BaseException], ...]:
    pa = _pyarrow()
    return (pa.ArrowException, OSError, ValueError)


class _ArrowReader(Reader):
    """What the Parquet and Arrow readers share: rows in *parts* (row groups or record
    batches), each part decoded at once and kept in a small cache, keys from a column.

    Subclasses set ``source``, ``columns`` and ``_part_starts`` (the first row of each part,
    and the number of rows at the end) in ``_open_file``, and read part ``p`` in
    ``_read_part``; both may raise pyarrow's errors, which become FormatError here."""

    source: ByteSource
    columns: list[str] | None

    def __init__(self, path: PathLike, columns: Sequence[str] | None, key: str | None,
                 cache_bytes: int, remote: RemoteOptions | None) -> None:
        self.source = ByteSource(path, check_remote(remote))
        self.cache_bytes = check_integer("cache_bytes", cache_bytes, 0)
        self._wanted = _check_columns(columns)
        self._key_column = key
        self._reset()
        self._opened()  # read the metadata now: a bad file fails at the call site
        self._key_column = self._choose_key(key)
        self._decode_empty_parts()

    def _reset(self) -> None:
        self._handle: Any = None
        self._parts: OrderedDict[int, Any] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._keys: KeyTable | None = None
        self._keys_damaged: FormatError | None = None  # why the key index cannot be built

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_handle", "_parts", "_held", "_lock", "_pid", "_keys", "_keys_damaged"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def close(self) -> None:
        with self._lock:
            self._handle = None
            self._parts.clear()
            self._held = 0
        self.source.close()

    def _opened(self) -> Any:
        if self._handle is None or self._pid != os.getpid():
            if self._pid != os.getpid():
                self._reset()
            try:
                self._handle = self._open_file()
            except FormatError:
                raise
            except _arrow_errors() as error:
                raise FormatError(f"not a readable {self._kind} file ({error})",
                                  path=self.source.path) from None
        return self._handle

    def _decode_empty_parts(self) -> None:
        """Decode now the parts whose metadata says they hold no rows: no read of a row
        would, and the metadata of a damaged one would hide its rows without an error."""
        handle = self._opened()
        for part in np.flatnonzero(np.diff(self._part_starts) == 0).tolist():
            with self._lock:
                self._decoded(handle, part, None, self.columns)

    def _choose_key(self, key: str | None) -> str | None:
        names = self.columns_available
        if key is not None:
            if not isinstance(key, str):
                raise TypeError(f"key must be a column name (str) or None; got key={key!r:.80}")
            if key not in names:
                raise FormatError(f"has no key column {key!r} (it has {names})",
                                  path=self.source.path)
            return key
        return next((name for name in _KEY_COLUMNS if name in names), None)

    def _check_wanted(self, names: list[str]) -> None:
        if self._wanted is not None:
            missing = [name for name in self._wanted if name not in names]
            if missing:
                raise FormatError(f"has no column {missing[0]!r} (columns={self._wanted!r}; it "
                                  f"has {names})", path=self.source.path)

    def __len__(self) -> int:
        return int(self._part_starts[-1])

    @property
    def blocks(self) -> np.ndarray:
        """The bounds of the row groups (record batches): the first row of each, and the
        number of rows at the end. Reading a row decodes its whole row group, so the shuffles
        walk them (see :class:`~fpipe.dataset.shuffling.BlockShuffler`)."""
        return self._part_starts

    # --- parts -----------------------------------------------------------------------------

    def _part(self, part: int, index: int, keep: bool = True) -> Any:
        """Part ``part``, decoded (from the cache when it is there, and kept there if
        ``keep``); ``index`` is the sample that needs it, for the error."""
        handle = self._opened()
        with self._lock:
            found = self._parts.get(part)
            if found is not None:
                self._parts.move_to_end(part)
                return found
            table = self._decoded(handle, part, index, self.columns)
            if keep:
                self._keep(part, table)
            return table

    def _decoded(self, handle: Any, part: int, index: int | None, columns: list[str]) -> Any:
        """Part ``part`` (its ``columns``) as pyarrow reads it, validated in full, with the
        number of rows the metadata gives it; else FormatError naming the file, the part and
        sample ``index`` (the one that needs it). The caller holds the lock."""
        try:
            table = self._read_part(handle, part, columns)
            table.validate(full=True)
        except FormatError:
            raise
        except _arrow_errors() as error:
            raise self._undecodable(part, index, str(error)) from None
        claimed = int(self._part_starts[part + 1] - self._part_starts[part])
        if table.num_rows != claimed:
            raise self._undecodable(part, index, f"{table.num_rows} rows where its metadata "
                                                 f"says {claimed}")
        return table

    def _undecodable(self, part: int, index: int | None, reason: str) -> FormatError:
        reason = " ".join(reason.split())  # pyarrow's messages may run over several lines
        return FormatError(f"{self._unit} {part} does not decode ({reason})",
                           path=self.source.path, index=index)

    def _keep(self, part: int, table: Any) -> None:
        self._parts[part] = table
        self._held += table.nbytes
        while self._held > self.cache_bytes and len(self._parts) > 1:
            _, oldest = self._parts.popitem(last=False)
            self._held -= oldest.nbytes

    def block_rows(self, start: int, stop: int) -> _ArrowRows:
        """Rows ``start`` to ``stop`` of one row group, decoded once (and not kept in the
        cache) and held as Arrow columns; ``take(rows)`` makes the samples at ``rows``."""
        part, row = self._locate(self._index(start))
        table = self._part(part, start, keep=False)
        if row + stop - start > table.num_rows:
            raise ValueError(f"block_rows({start}, {stop}) reaches past {self._unit} {part}")
        return _ArrowRows(table.slice(row, stop - start), self.source.path, f"{self._unit} {part}")

    def _locate(self, index: int) -> tuple[int, int]:
        part = bisect_right(self._part_starts, index) - 1
        return part, index - int(self._part_starts[part])

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        index = self._index(index)
        part, row = self._locate(index)
        table = self._part(part, index)
        sample = _as_python(_row, table, row, path=self.source.path, what=f"{self._unit} {part}",
                            index=index)
        sample = pack_sample(sample) if raw else sample
        return (self.find_key(index), sample) if yield_key else sample

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        start, stop, _ = slice(start, stop).indices(len(self))
        return list(self._rows_between(start, stop, yield_key, raw, keep=True))

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        # a pass in order needs each part once: the cache is for random access
        return self._rows_between(start, stop, yield_key, raw, keep=False)

    def _rows_between(self, start: int, stop: int, yield_key: bool, raw: bool,
                      keep: bool) -> Iterator:
        index = start
        while index < stop:
            part, row = self._locate(index)
            table = self._part(part, index, keep)
            count = min(stop - index, table.num_rows - row)
            for first in range(row, row + count, _ROWS_AT_ONCE):
                at = index + first - row
                some = table.slice(first, min(row + count, first + _ROWS_AT_ONCE) - first)
                rows = _as_python(_rows, some, path=self.source.path, what=f"{self._unit} "
                                  f"{part} (samples {at} to {at + some.num_rows - 1})")
                if raw:
                    rows = [pack_sample(sample) for sample in rows]
                yield from zip(self._key_list(at, at + len(rows)), rows) if yield_key else rows
            index += count

    # --- keys ------------------------------------------------------------------------------

    def _key_index(self) -> KeyTable:
        """The keys of every row, read once; the FormatError of a part whose keys do not
        read (raised again at each call, without reading the file again)."""
        if self._keys_damaged is not None:
            raise self._keys_damaged
        if self._keys is None:
            blobs, ends, done = [], [], 0
            try:
                for part in range(len(self._part_starts) - 1):  # a part at a time: no list of all
                    blob, part_ends = strings_to_arrays(self._part_keys(part, 0, None))
                    blobs.append(blob)
                    ends.append(part_ends + done)
                    done += len(blob)
            except FormatError as error:
                self._keys_damaged = error
                raise
            self._keys = KeyTable(np.concatenate([np.zeros(0, np.uint8), *blobs]),
                                  np.concatenate([np.zeros(0, np.int64), *ends]))
        return self._keys

    def _part_keys(self, part: int, row: int, count: int | None) -> list[str]:
        """The keys of ``count`` rows (None: all) of part ``part`` from its row ``row``."""
        first = int(self._part_starts[part]) + row
        column = self._key_part(part, first)
        column = column.slice(row, count) if row or count is not None else column
        return _as_python(_strings, column, path=self.source.path,
                          what=f"the key column of {self._unit} {part}", index=first)

    def _key_part(self, part: int, first: int) -> Any:
        handle = self._opened()
        with self._lock:
            found = self._parts.get(part)
            if found is not None and self._key_column in found.column_names:
                return found.column(self._key_column)
            return self._decoded(handle, part, first, [self._key_column]).column(0)

    def _key_list(self, start: int, stop: int) -> list[str]:
        if self._key_column is None:
            return numbered_keys(self.source.name, start, stop)
        try:
            return self._key_index().keys(start, stop)
        except FormatError:  # a part's keys are damaged: those of the others still read
            return self._keys_between(start, stop)

    def _keys_between(self, start: int, stop: int) -> list[str]:
        keys: list[str] = []
        while start < stop:
            part, row = self._locate(start)
            count = min(stop - start, int(self._part_starts[part + 1]) - start)
            keys.extend(self._part_keys(part, row, count))
            start += count
        return keys

    def find_key(self, index: int) -> str:
        index = self._index(index)
        return self._key_list(index, index + 1)[0]

    def _find(self, key: Any) -> int:
        if self._key_column is None:
            return numbered_index(self.source.name, key, len(self))
        return self._key_index().find(key)

    def __contains__(self, key: object) -> bool:
        return self._find(key) >= 0

    def find_index(self, key: Any) -> int:
        found = self._find(key)
        if found < 0:
            raise KeyError(key)
        return found


class _ArrowRows:
    """Rows of a row group held by :meth:`_ArrowReader.block_rows`, from the file ``path``
    (``what``: which part of it, for errors)."""

    __slots__ = ("table", "path", "what")

    def __init__(self, table: Any, path: str, what: str) -> None:
        self.table, self.path, self.what = table, path, what

    def take(self, rows: np.ndarray) -> list[dict]:
        return _as_python(_rows, self.table.take(rows), path=self.path, what=self.what)

    def join(self, held: list) -> _ArrowRows | None:
        """The rows of ``held`` (this and others) one after the other, in one table with
        one chunk (so that a take does not combine them again), or None if they do not
        join (rows of files whose columns differ)."""
        tables = [rows.table for rows in held if isinstance(rows, _ArrowRows)]
        if len(tables) < len(held) or any(not t.schema.equals(tables[0].schema) for t in tables):
            return None
        return _ArrowRows(_pyarrow().concat_tables(tables).combine_chunks(),
                          ", ".join(dict.fromkeys(rows.path for rows in held)),
                          ", ".join(dict.fromkeys(rows.what for rows in held)))


def _check_columns(columns: Any) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(name, str) for name in columns):
        raise TypeError(f"columns must be a list of column names (str); got columns={columns!r:.80}")
    return list(columns)


def _is_tensor(column: Any) -> bool:
    return getattr(column.type, "extension_name", None) == "arrow.fixed_shape_tensor"


def _as_python(convert: Callable[..., Any], *arguments: Any, path: str, what: str,
               index: int | None = None) -> Any:
    """``convert(*arguments)`` (Arrow values made Python ones), or FormatError naming the file,
    the part (``what``) and the sample ``index`` when a value has no Python equivalent (a
    date past the year 9999, a timestamp past 2**63 seconds)."""
    try:
        return convert(*arguments)
    except (ArithmeticError, ValueError, _pyarrow().ArrowException) as error:
        raise FormatError(f"{what} holds a value that does not convert to Python ({error})",
                          path=path, index=index) from None


def _strings(column: Any) -> list[str]:
    return [str(value) for value in column.to_pylist()]


def _row(table: Any, row: int) -> dict:
    return {name: _value(table.column(name), row) for name in table.column_names}


def _value(column: Any, row: int) -> Any:
    if _is_tensor(column):
        return _tensors(column.slice(row, 1))[0]
    return column[row].as_py()


def _tensors(column: Any) -> list[np.ndarray]:
    arrays = [chunk.to_numpy_ndarray() for chunk in column.chunks]
    return [array.copy() for chunk in arrays for array in chunk]


def _rows(table: Any) -> list[dict]:
    """The rows of ``table`` as dicts (tensor columns as arrays)."""
    tensors = [name for name, column in zip(table.column_names, table.columns) if _is_tensor(column)]
    if not tensors:
        return table.to_pylist()
    values = {name: _tensors(table.column(name)) if name in tensors else table.column(name).to_pylist()
              for name in table.column_names}
    return [dict(zip(values, row)) for row in zip(*values.values())]


class ParquetFileReader(_ArrowReader):
    """One Parquet file, with the reader API: sample ``i`` is row ``i`` as a dict.

    ``columns`` chooses the columns (a file without one of them raises
    :class:`~fpipe.errors.FormatError` naming the file and the column). Keys come from the
    column ``key`` (default: ``"key"`` or ``"__key__"`` when the file has one); without one,
    row ``i`` of ``train.parquet`` has the key ``"train.parquet:i"``. A key lookup reads the
    key column once.

    A file that is not Parquet (a bad footer) raises FormatError when the reader is made; a
    row group that does not decode raises FormatError naming the file and the sample when
    it is read, and the other row groups stay readable.

    ``path`` may be a URL, with the ``remote=RemoteOptions(...)`` of
    :class:`~fpipe.dataset.reader.MsgpackReader`
    (the bytes come through the same block cache). It pickles by path.

    >>> import os, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> path = os.path.join(tempfile.mkdtemp(), "pets.parquet")
    >>> pq.write_table(pa.table({"key": ["cat", "dog"], "legs": [4, 4]}), path)
    >>> reader = ParquetFileReader(path)
    >>> reader.find_index("dog"), reader.get(0, yield_key=True)
    (1, ('cat', {'key': 'cat', 'legs': 4}))
    """

    _kind, _unit = "Parquet", "row group"

    @takes_remote
    def __init__(self, path: PathLike, *, columns: Sequence[str] | None = None,
                 key: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 remote: RemoteOptions | None = None) -> None:
        super().__init__(path, columns, key, cache_bytes, remote)

    def __repr__(self) -> str:
        return f"ParquetFileReader({self.source.path!r})"

    def _open_file(self) -> Any:
        import pyarrow.parquet as pq

        _pyarrow()
        target = self.source.file() if self.source.remote else self.source.path
        handle = pq.ParquetFile(target)
        names = handle.schema_arrow.names
        self.columns_available = names
        self._check_wanted(names)
        self.columns = self._wanted if self._wanted is not None else names
        counts = [handle.metadata.row_group(g).num_rows for g in range(handle.num_row_groups)]
        self._part_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        return handle

    def _read_part(self, handle: Any, part: int, columns: list[str]) -> Any:
        return handle.read_row_group(part, columns=columns)

    def prefetch(self, indices: Sequence[int]) -> None:
        """Fetch in the background the bytes of the row groups that samples ``indices`` need
        (a file at a URL; nothing to do for a local file)."""
        if not self.source.remote:
            return
        positions = np.asarray(indices, dtype=np.int64)
        parts = np.searchsorted(self._part_starts, positions, side="right") - 1
        metadata = self._opened().metadata
        spans = []
        for part in dict.fromkeys(parts.tolist()):
            if 0 <= part < metadata.num_row_groups:
                group = metadata.row_group(part)
                for column in range(group.num_columns):
                    chunk = group.column(column)
                    first = chunk.dictionary_page_offset or chunk.data_page_offset
                    spans.append((first, first + chunk.total_compressed_size))
        self.source.prefetch_spans(spans)


class ArrowFileReader(_ArrowReader):
    """One Arrow IPC file (the file or the stream format, as Hugging Face ``datasets`` keeps
    its tables), with the reader API: sample ``i`` is row ``i`` as a dict. ``columns`` and
    ``key`` as for :class:`ParquetFileReader`.

    The file is read as pyarrow's readers read a file that is not mapped: its headers when
    the reader is made (a few hundred bytes per record batch; a damaged header raises
    :class:`~fpipe.errors.FormatError` then), and a record batch when a row of it is read,
    validated in full (a damaged batch raises FormatError naming the file, the batch and the
    sample; the others stay readable). A file cut under an open reader raises FormatError
    at the reads it no longer holds; it is never memory-mapped.

    >>> import os, tempfile
    >>> import pyarrow as pa
    >>> path = os.path.join(tempfile.mkdtemp(), "data.arrow")
    >>> table = pa.table({"text": ["x", "y"]})
    >>> with pa.ipc.new_stream(path, table.schema) as writer:
    ...     writer.write_table(table)
    >>> ArrowFileReader(path)[1]
    {'text': 'y'}
    """

    _kind, _unit = "Arrow IPC", "record batch"

    @takes_remote
    def __init__(self, path: PathLike, *, columns: Sequence[str] | None = None,
                 key: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 remote: RemoteOptions | None = None) -> None:
        super().__init__(path, columns, key, cache_bytes, remote)

    def __repr__(self) -> str:
        return f"ArrowFileReader({self.source.path!r})"

    def _open_file(self) -> Any:
        layout = ipc_layout(self.source.read, self.source.size, self.source.path)
        handle = _IpcFile(self.source, layout) if layout.file_format else _IpcStream(self.source,
                                                                                     layout)
        names = handle.schema.names
        self.columns_available = names
        self._check_wanted(names)
        self.columns = self._wanted if self._wanted is not None else names
        self._part_starts = np.concatenate([[0], np.cumsum(layout.rows, dtype=np.int64)])
        return handle

    def _read_part(self, handle: Any, part: int, columns: list[str]) -> Any:
        return _pyarrow().Table.from_batches([handle.batch(part)]).select(columns)


class _IpcFile:
    """An Arrow IPC file: pyarrow reads its footer, and a record batch when asked, by ranges
    of the file (:meth:`ByteSource.file`)."""

    def __init__(self, source: ByteSource, layout: IpcLayout) -> None:
        self.reader = _pyarrow().ipc.open_file(source.file())
        self.schema = self.reader.schema
        if self.reader.num_record_batches != len(layout.rows):
            raise FormatError(f"not a readable Arrow IPC file (pyarrow finds "
                              f"{self.reader.num_record_batches} record batches in its footer, "
                              f"fpipe {len(layout.rows)})", path=source.path)

    def batch(self, number: int) -> Any:
        return self.reader.get_batch(number)


class _IpcStream:
    """An Arrow IPC stream, a record batch at a time: the batch's message, after the schema
    and the dictionaries before it, read as a stream of its own."""

    def __init__(self, source: ByteSource, layout: IpcLayout) -> None:
        self.source, self.layout = source, layout
        self.head = self._read(*layout.schema)
        self.schema = _pyarrow().ipc.open_stream(self.head + END_OF_STREAM).schema

    def _read(self, start: int, stop: int) -> bytes:
        data = self.source.read(start, stop)
        if len(data) != stop - start:
            raise OSError(f"the file was cut: bytes {start + len(data)} to {stop} of a message "
                          "are missing")
        return data

    def batch(self, number: int) -> Any:
        pa = _pyarrow()
        layout = self.layout
        spans = [*layout.dictionaries[:layout.dictionaries_before[number]], layout.spans[number]]
        pieces = [self.head, *(self._read(int(a), int(b)) for a, b in spans), END_OF_STREAM]
        return pa.ipc.open_stream(pa.py_buffer(b"".join(pieces))).read_next_batch()


def _folder_files(folder: str) -> list[str]:
    """The data files of a folder: those a Hugging Face ``save_to_disk`` folder lists in its
    ``state.json``, else every Parquet and Arrow file under it, sorted."""
    state = os.path.join(folder, "state.json")
    if os.path.isfile(state):
        with open(state, "rb") as file:
            try:
                listed = json.load(file).get("_data_files") or []
                return [os.path.join(folder, entry["filename"]) for entry in listed]
            except (ValueError, AttributeError, KeyError, TypeError) as error:
                raise FormatError(f"not a Hugging Face datasets state file ({error!r:.200})",
                                  path=state) from None
    found = []
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        found.extend(os.path.join(root, name) for name in sorted(files)
                     if name.endswith((".parquet", *_ARROW_SUFFIXES)) and not name.startswith("."))
    if not found:
        raise FileNotFoundError(2, "no Parquet or Arrow file in the folder", folder)
    return found


def open_table_file(path: str, **options: Any) -> _ArrowReader:
    """A :class:`ParquetFileReader` or :class:`ArrowFileReader` of ``path``, by its suffix."""
    if path.lower().endswith(_ARROW_SUFFIXES):
        return ArrowFileReader(path, **options)
    return ParquetFileReader(path, **options)


class ParquetReader(ShardedReader):
    """Parquet and Arrow files read as one dataset, in order: a file or URL, a folder (a
    Hugging Face ``save_to_disk`` folder reads the files its ``state.json`` lists; any other
    folder, every ``.parquet`` and ``.arrow`` file under it), a glob or brace pattern
    (``data/train-*.parquet``), or a list of these. Files ending in ``.arrow``, ``.feather``
    or ``.ipc`` are :class:`ArrowFileReader`, the others :class:`ParquetFileReader`; the
    keywords go to each. ``datasets.load_dataset("parquet", data_files=...)`` becomes
    ``ParquetReader(files)``, with no conversion and no copy.

    >>> import os, tempfile
    >>> import pyarrow as pa, pyarrow.parquet as pq
    >>> folder = tempfile.mkdtemp()
    >>> for part in range(2):
    ...     table = pa.table({"n": [part * 10, part * 10 + 1]})
    ...     pq.write_table(table, os.path.join(folder, f"train-{part:05d}-of-00002.parquet"))
    >>> reader = ParquetReader(folder)
    >>> len(reader), [row["n"] for row in reader]
    (4, [0, 1, 10, 11])
    """

    @takes_remote
    def __init__(self, paths: Union[PathLike, Iterable[PathLike]], *,
                 columns: Sequence[str] | None = None, key: str | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, remote: RemoteOptions | None = None) -> None:
        remote = check_remote(remote)
        files = []
        for path in ([paths] if isinstance(paths, (str, os.PathLike)) else list(paths)):
            path = os.fspath(path) if isinstance(path, os.PathLike) else path
            if isinstance(path, str) and os.path.isdir(path):
                files.extend(_folder_files(path))
            else:
                files.extend(expand_shards(path, storage_options=remote.storage_options))
        super().__init__([open_table_file(file, columns=columns, key=key, cache_bytes=cache_bytes,
                                          remote=remote) for file in files])

    def __repr__(self) -> str:
        return f"ParquetReader({len(self.readers)} files, {len(self)} rows)"


# --- writing ---------------------------------------------------------------------------------

DEFAULT_ROW_GROUP_SIZE = 1000


def _column(name: str, values: list) -> Any:
    """The Arrow array of field ``name``: one type per column (None for missing values), or a
    :class:`TypeError` naming the field."""
    pa = _pyarrow()
    kinds = {type(value) for value in values if value is not None}
    if len(kinds) > 1 and not kinds <= {bytes, bytearray}:
        raise TypeError(f"field {name!r} holds {' and '.join(sorted(k.__name__ for k in kinds))}; "
                        "a Parquet column holds one type")
    if kinds == {np.ndarray}:
        return _tensor_column(name, values)
    if kinds == {dict}:
        shapes = {tuple(value) for value in values if value is not None}
        if len(shapes) > 1:
            raise TypeError(f"field {name!r} holds dicts with different keys; a Parquet column "
                            "holds one struct type")
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        raise TypeError(f"field {name!r} cannot be a Parquet column ({error})") from None


def _tensor_column(name: str, values: list) -> Any:
    pa = _pyarrow()
    if any(value is None for value in values) or len({(v.dtype.str, v.shape) for v in values}) > 1:
        raise TypeError(f"field {name!r} holds arrays of different shapes or dtypes, or is "
                        "missing in some samples; a Parquet tensor column holds one shape")
    try:
        return pa.FixedShapeTensorArray.from_numpy_ndarray(np.stack(values))
    except (pa.ArrowException, TypeError, ValueError) as error:
        raise TypeError(f"field {name!r} cannot be a Parquet tensor column ({error})") from None


# row groups held back while a column's type is not known yet (all None, or empty lists)
_HELD_GROUPS = 16


class _ParquetShard:
    """One Parquet file being written, a row group every ``row_group_size`` samples. The file's
    schema is fixed when its first row groups are written, so row groups are held back (at most
    ``_HELD_GROUPS``) while a column is only None or empty lists, whose type is not known."""

    def __init__(self, path: str, row_group_size: int) -> None:
        self.path, self.row_group_size = path, row_group_size
        self.rows: list[dict] = []
        self.held: list = []  # tables not written yet
        self.pending = 0  # about the bytes of the rows not yet written
        self.writer: Any = None
        self.names: list[str] = []

    @property
    def size(self) -> int:
        """About the bytes of the file: those written, and those of the rows held."""
        return (os.path.getsize(self.path) if self.writer is not None else 0) + self.pending

    def write(self, sample: dict) -> None:
        self.rows.append(sample)
        self.pending += sum(len(value) if isinstance(value, (bytes, str)) else
                            getattr(value, "nbytes", 8) for value in sample.values())
        if len(self.rows) >= self.row_group_size:
            self._flush()

    def _table(self) -> Any:
        pa = _pyarrow()
        if not self.names:
            self.names = list(dict.fromkeys(name for row in self.rows for name in row))
        extra = [name for row in self.rows for name in row if name not in self.names]
        if extra:
            raise TypeError(f"field {extra[0]!r} is not in the first samples of this shard; a "
                            "Parquet file has one set of columns")
        table = pa.table({name: _column(name, [row.get(name) for row in self.rows])
                          for name in self.names})
        self.rows = []
        return table

    def _flush(self, final: bool = False) -> None:
        if self.rows:
            self.held.append(self._table())
        if not self.held:
            return
        if self.writer is None:
            import pyarrow.parquet as pq

            schema = _unified([table.schema for table in self.held])
            if "null" in str(schema.types) and not final and len(self.held) < _HELD_GROUPS:
                return
            self.writer = pq.ParquetWriter(self.path, schema)
        for table in self.held:
            self.writer.write_table(_cast(table, self.writer.schema))
        self.held, self.pending = [], 0

    def close(self) -> None:
        try:
            self._flush(final=True)
        finally:
            self.discard()

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _unified(schemas: list) -> Any:
    """One schema for row groups whose columns differ only where some are None (or empty)."""
    pa = _pyarrow()
    try:
        return pa.unify_schemas(schemas)
    except (pa.ArrowException, TypeError) as error:
        for name in schemas[0].names:
            kinds = {str(schema.field(name).type) for schema in schemas}
            if len(kinds) > 1 and not any("null" in kind for kind in kinds):
                raise TypeError(f"field {name!r} holds {' and '.join(sorted(kinds))} in this "
                                "shard; a Parquet column holds one type") from None
        raise TypeError(f"the fields of this shard do not make one Parquet schema ({error})") from None


def _cast(table: Any, schema: Any) -> Any:
    """``table`` in the types of the file (a column that was all None before takes the type it
    has now, if it can)."""
    if table.schema.equals(schema):
        return table
    pa = _pyarrow()
    try:
        return table.cast(schema)
    except (pa.ArrowException, TypeError, ValueError):
        for name in table.column_names:
            have, want = table.schema.field(name).type, schema.field(name).type
            if have != want:
                raise TypeError(f"field {name!r} holds {have} here but {want} in the first "
                                "samples of this shard; a Parquet column holds one type") from None
        raise


def write_parquet(samples: Iterable[dict], pattern: PathLike, *, shard_size: int | None = None,
                  shard_bytes: int | None = None, row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
                  rename: dict[str, str] | None = None, overwrite: bool = False,
                  inputs: Iterable[PathLike] = ()) -> list[str]:
    """Write ``samples`` as Parquet files named by ``pattern`` (one ``%d``-style field for the
    file number, e.g. ``out/train-%05d.parquet``), a new file after ``shard_size`` samples or
    once a file holds ``shard_bytes`` bytes, a row group every ``row_group_size`` samples
    (small row groups make random access cheaper); returns the file names.

    Fields become columns (``rename`` renames them first): bools, ints, floats, str, bytes,
    lists and dicts as Arrow's types, NumPy arrays of one shape and dtype as a fixed-shape
    tensor column; each column holds one type, and a field that does not fit raises
    :class:`TypeError` naming it. :class:`ParquetReader` reads the same samples back (a
    field missing from a sample reads back as None). Nothing appears under the names unless
    all files are written; existing files are replaced only with ``overwrite``, and never one
    of ``inputs`` (the files the samples come from). The files written are listed in a
    manifest beside them (``.PATTERN.shards.json``, written last); ``overwrite`` removes the
    files of an earlier, longer export that its manifest lists, and nothing else.

    >>> import os, tempfile
    >>> import numpy as np
    >>> pattern = os.path.join(tempfile.mkdtemp(), "train-%05d.parquet")
    >>> samples = [{"key": f"s{i}", "text": "hi " * i, "x": np.full(2, i)} for i in range(3)]
    >>> names = write_parquet(samples, pattern, shard_size=2)
    >>> reader = ParquetReader(names)
    >>> len(names), reader.find_index("s2"), reader[2]["x"]
    (2, 2, array([2, 2]))
    """
    row_group_size = check_integer("row_group_size", row_group_size, 1)
    chosen = (renamed(sample, rename) for sample in samples)
    return write_shards(chosen, pattern, lambda path: _ParquetShard(path, row_group_size),
                        shard_size, shard_bytes, overwrite, inputs)
