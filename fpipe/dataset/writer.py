"""Write packed datasets: :class:`FileWriter` for dict samples, :class:`RawWriter` for packed bytes.

A writer buffers samples and writes them in large blocks, hashing the data as it goes; on
:meth:`~Writer.close` (also when the ``with`` block raises) it writes the index files and the
``.md5`` file, so every sample written so far is kept:

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "pets.msgpack")
>>> with FileWriter(path) as writer:
...     writer.write({"key": "cat", "legs": 4})
...     writer.write({"key": "bird", "legs": 2})
>>> len(os.listdir(os.path.dirname(path)))
7

``append=True`` adds samples to an existing dataset (and creates one that is not there); its
keys must be new to the dataset:

>>> with FileWriter(path, append=True) as writer:
...     writer.write({"key": "ant", "legs": 6})
>>> from fpipe.dataset import MsgpackReader
>>> [sample["key"] for sample in MsgpackReader(path)]
['cat', 'bird', 'ant']

A data file whose writer was killed before closing is recovered with
:func:`~fpipe.dataset.recovery.rebuild_index`.
"""

from __future__ import annotations

import errno
import hashlib
import inspect
import os
import queue
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fpipe.dataset._indexing import IndexBuilder, array_length, without_samples
from fpipe.dataset._staging import signals_deferred
from fpipe.dataset.format import (
    DatasetFiles,
    PathLike,
    md5_file,
    new_packer,
    open_regular,
    read_keys,
    read_md5,
)
from fpipe.errors import FormatError, check_integer, check_keywords, redacted_url

__all__ = ["FileWriter", "RawWriter", "Writer", "index_keys"]

_DEFAULT_BUFFER = 1 << 20
# Below this buffer size blocks are written in the caller's thread (no hand-off per block).
_THREAD_MIN = 1 << 16
_HELD_SAMPLES = 1 << 15  # samples buffered at most, however small
# A writer checks each key against the first this many keys (of the dataset it appends to,
# and its own) as it is written, in memory; every key is checked when the index is built.
WINDOW = 1 << 20


class Writer:
    """Base class of the writers: buffering, duplicate checks, index and md5 at close.

    ``Writer(outfile, buffering=1 MiB, overwrite=False, *, progress=False, **tqdm_kwargs)``;
    the positional order is datadings's. ``buffering`` is the number of bytes collected before
    one write system call (``0`` writes every sample at once). An existing dataset (any of its
    files) raises :class:`FileExistsError` unless ``overwrite=True``, which removes the old
    files first (a reader that has them open keeps reading the old data). ``progress=True``,
    or any tqdm option such as ``desc=`` or ``total=``, shows a progress bar
    (``disable=True`` hides it); a keyword that tqdm does not take either is a
    :class:`TypeError` that names it, and the bar is made (so tqdm checks its values) before
    any file is created. ``outfile`` may be a URL of object storage (``s3://``,
    ``gs://``; ``storage_options`` go to fsspec): the dataset is written to a local staging
    folder and uploaded at :meth:`close`, ``.offsets`` last, so that it appears only when whole
    (see :class:`fpipe.remote.transfer.Upload`). Hashing and writing run in a background thread when
    ``buffering`` is at least 64 KiB; the thread ends at :meth:`close`. A write that fails (a
    full disk) raises an :class:`OSError` that names the file and the number of samples it
    keeps whole; no index is written after it (``fpipe index`` makes one from the data).

    Memory stays bounded at any number of samples: the offsets and keys go to files in a hidden
    staging folder beside the dataset as they come, and :meth:`close` builds the other index
    files from them in bounded memory (see ``fpipe.dataset._indexing``). A key written again
    raises :class:`ValueError` at that write while the writer holds its keys in memory (the
    first ``WINDOW``, 1,048,576, keys of the dataset); past them, :meth:`close` finds it, writes
    the dataset without the later samples of each repeated key, and then raises the
    ``ValueError`` that names them.

    ``append=True`` opens an existing dataset to add samples after its last one (a missing
    dataset is created). It checks first that the data file matches its index and ``.md5``
    (reading it once, to carry its MD5 on), and refuses keys the dataset already has. The
    original files are untouched until :meth:`close`, which appends nothing more and replaces
    the index files and ``.md5`` with complete new ones, each in one rename. A write or close
    that fails cuts the data file back, leaving the dataset as it was; samples written before
    an exception in the ``with`` block are kept, as with any writer. Kill the process
    mid-append and readers still see the old dataset (``fpipe index`` takes in the
    appended samples, ``fpipe verify`` reports the extra bytes).

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> RawWriter(path).close()
    >>> RawWriter(path)
    Traceback (most recent call last):
    ...
    FileExistsError: [Errno 17] dataset exists (pass overwrite=True to replace it): '...x.msgpack'
    """

    def __init__(self, outfile: PathLike, buffering: int = _DEFAULT_BUFFER, overwrite: bool = False,
                 *, append: bool = False, progress: bool = False,
                 storage_options: dict | None = None, **tqdm_kwargs: Any) -> None:
        # first: a misspelled option must not leave a data file and a staging folder behind
        check_progress_options(type(self).__name__, tqdm_kwargs)
        buffering = check_integer("buffering", buffering, 0)
        if append and overwrite:
            raise ValueError("pass append=True or overwrite=True, not both; got both")
        if append and isinstance(outfile, str) and "://" in outfile:
            raise ValueError("append=True works on local datasets only; got the URL "
                             f"{redacted_url(outfile)!r}")
        # where the files go: here, or to a staging folder that close() uploads
        self._upload = _upload(outfile, storage_options, overwrite)
        # absolute, as a reader's: the files land where they were asked for, whatever the
        # current folder is when the writer closes
        self.path = Path(outfile).absolute() if self._upload is None else self._upload.path
        self._files = DatasetFiles(self.path)
        self._buffering = buffering
        # before any file is made: tqdm refuses a bad value (ncols="x") when the bar is built
        self._bar = _progress_bar(self.path, progress, tqdm_kwargs)
        try:
            self._open(append, overwrite)
        except BaseException:
            if self._bar is not None:
                self._bar.leave = False
                self._bar.close()
            raise

    def _open(self, append: bool, overwrite: bool) -> None:
        """Open the data file (a new one, or the end of the dataset to append to) and the
        staging folder of the index."""
        self._base = _Base.read(self._files) if append and self.path.exists() else _Base.empty()
        self._keys: dict[str, None] | _ClosedKeys = dict.fromkeys(self._base.window)
        self._written = 0
        self._new_keys: list[str] = []
        self._chunks: list[bytes] = []
        self._pending = 0
        self._failure: OSError | None = None
        fd = _open_end(self._files) if self._base.existing else _create(self._files, overwrite)
        # the MD5 before this writer's data: the sink's runs on with it
        self._sink: _Sink | None = _Sink(fd, self._buffering >= _THREAD_MIN, self._base.md5.copy())
        self._staging = Path(tempfile.mkdtemp(prefix=".fpipe-", dir=self.path.parent))
        self._builder = IndexBuilder(self._staging, self.path.name)
        if self._base.existing:
            self._builder.add_dataset(self._files)
        # A writer dropped without close() still stops its thread, closes its file and
        # removes its staging folder.
        self._finalizer = weakref.finalize(self, _forget, self._sink, self._staging)

    @property
    def written(self) -> int:
        """The number of samples written so far (by this writer, when it appends)."""
        return self._written

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._sink is None else "open"
        where = self._upload.url if self._upload is not None else str(self.path)
        return f"{type(self).__name__}({where!r}, written={self.written}, {state})"

    def write_packed(self, key: str, packed: bytes) -> None:
        """Append one sample already packed into one msgpack message, under ``key``.

        The hook for a subclass whose ``write`` chooses the key or packs the sample itself
        (where one written for datadings called its private ``_write_data``): the writer keeps
        its keys, offsets and checksum, so a subclass needs none of its attributes.

        >>> import os, tempfile
        >>> from fpipe.dataset import FileWriter, MsgpackReader, pack_sample
        >>> class KeyedWriter(FileWriter):
        ...     def write(self, sample, key):
        ...         self.write_packed(key, pack_sample(sample))
        >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
        >>> with KeyedWriter(path) as writer:
        ...     writer.write({"label": 3}, "a")
        >>> MsgpackReader(path).find_index("a"), MsgpackReader(path).get(0)
        (0, {'label': 3})
        """
        packed = bytes(packed)
        if not packed:
            raise ValueError(f"data for key {key!r} is empty; a sample is one msgpack message")
        self._add(key, packed)

    def _add(self, key: object, packed: bytes) -> None:
        if type(key) is not str and not isinstance(key, str):
            raise TypeError(f"keys must be str; got {type(key).__name__} {key!r:.80}")
        if not key.isascii() and not _encodable(key):  # else the index could not be written
            raise ValueError(f"keys must be text that UTF-8 can encode (no lone surrogates); "
                             f"got {key!r:.80}")
        keys = self._keys
        if key in keys:
            raise ValueError(f"duplicate key {key!r}: keys must be unique")
        if len(keys) < WINDOW:
            keys[key] = None
        self._written += 1
        self._new_keys.append(key)
        self._chunks.append(packed)
        self._pending += len(packed)
        if self._pending >= self._buffering or len(self._chunks) >= _HELD_SAMPLES:
            self.flush()
        if self._bar is not None:
            self._bar.update()

    def flush(self) -> None:
        """Hand the buffered samples to the data file (the index is written at close)."""
        if self._failure is not None:  # its index files are closed: nothing more goes in
            raise self._failure
        if self._chunks and self._sink is not None:
            block = b"".join(self._chunks)
            try:  # the index's staging files fill the same disk as the data
                self._builder.add(self._new_keys, list(map(len, self._chunks)))
                self._new_keys, self._pending = [], 0
                self._chunks.clear()
                self._sink.put(block)
            except OSError as error:
                raise self._failed(error) from error

    def close(self) -> None:
        """Flush the data, then write the index files and ``.md5``. Closing twice is harmless.

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
        >>> writer = FileWriter(path)
        >>> writer.write({"key": "a"})
        >>> writer.close()
        >>> writer.close()
        >>> sorted(name[len("x.msgpack"):] for name in os.listdir(os.path.dirname(path)))
        ['', '.filter', '.key_hashes', '.key_index', '.keys', '.md5', '.offsets']
        >>> writer.write({"key": "b"})
        Traceback (most recent call last):
        ...
        ValueError: ...x.msgpack: write to a closed writer
        """
        if self._sink is None:
            return
        sink = self._sink
        try:
            self.flush()
        finally:
            self._sink, self._keys = None, _ClosedKeys(self._written, self.path)
            self._finalizer.detach()
            try:
                digest = sink.finish()
            except OSError as error:
                failure = self._failed(error)  # it reads the offsets in the staging folder
                self._discard_staging()
                raise failure from error
            if self._failure is not None:  # an earlier write failed: no index
                self._discard_staging()
                raise self._failure
        committed = False
        try:
            built = self._builder.finish()
            repeated = built.duplicates
            if repeated:
                built, digest = without_samples(built, self._files, self._base.count,
                                                self._base.end, self._base.md5)
            with signals_deferred():  # Ctrl-C here comes after the commit: the index stays
                built.commit(self._files, digest)
                committed = True
        except OSError as error:  # a full disk while the index is built: the data is whole
            raise self._failed(error) from error
        except BaseException:
            if self._base.existing and not committed:
                os.truncate(self.path, self._base.end)
            raise
        finally:
            self._discard_staging()
        if self._bar is not None:
            self._bar.close()
        if repeated:
            raise _repeated_keys(repeated, self._files)
        if self._upload is not None:
            self._upload.commit(progress=self._bar is not None)

    def _discard_staging(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)

    def abandon(self) -> None:
        """Close without keeping what this writer wrote: a new dataset's data file is removed,
        an appended one is cut back to the dataset it was. Closing afterwards is harmless.

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
        >>> with FileWriter(path) as writer:
        ...     writer.write({"key": "a"})
        >>> writer = FileWriter(path, append=True)
        >>> writer.write({"key": "b"})
        >>> writer.abandon()
        >>> from fpipe.dataset import MsgpackReader
        >>> [s["key"] for s in MsgpackReader(path)], MsgpackReader(path).verify_data()
        (['a'], True)
        """
        if self._sink is None:
            return
        sink, self._sink = self._sink, None
        self._keys = _ClosedKeys(self._written, self.path)
        self._finalizer.detach()
        try:
            sink.finish()
        except OSError:
            pass  # what failed to be written is dropped anyway
        self._discard_staging()
        if self._base.existing:
            os.truncate(self.path, self._base.end)
        else:
            self.path.unlink(missing_ok=True)
        if self._bar is not None:
            self._bar.close()

    def _failed(self, error: OSError) -> OSError:
        """The error of a failed write (a full disk, say), saying what the data file keeps.
        No index is written after it: one would describe samples that are not there."""
        if self._failure is None and self._base.existing:
            os.truncate(self.path, self._base.end)
            self._failure = OSError(
                error.errno, f"{error.strerror}; the append stopped and was undone: the dataset "
                f"holds its {self._base.count} samples as before", str(self.path))
        if self._failure is None:
            size = self.path.stat().st_size if self.path.exists() else 0
            whole = self._builder.samples_within(self.path, size)
            self._failure = OSError(
                error.errno, f"{error.strerror}; writing stopped, and the data file keeps the "
                f"first {whole} samples whole, without an index ('fpipe index' makes one)",
                str(self.path))
        self._builder.close_files()
        return self._failure


@dataclass(frozen=True)
class _Base:
    """What a dataset holds before an append: its number of samples, the end of its data, its
    data MD5 (running) and the keys a writer checks at each write (all of them, up to
    ``WINDOW``; none past it)."""

    count: int
    end: int
    md5: Any
    window: list[str]
    existing: bool = True

    @classmethod
    def empty(cls) -> _Base:
        return cls(0, 0, hashlib.md5(), [], existing=False)

    @classmethod
    def read(cls, files: DatasetFiles) -> _Base:
        """The dataset of ``files``, checked: its index and ``.md5`` describe its data file."""
        if not files.offsets.exists() or not files.keys.exists():
            raise FormatError("cannot append: the dataset has no .offsets and .keys (a legacy "
                              "or damaged index; 'fpipe index' makes them)", path=files.data)
        count, end, keys = _index_extent(files)
        size = files.data.stat().st_size
        if count != keys or end != size:
            raise FormatError(f"cannot append: the index ({keys} keys, {count + 1} "
                              f"offsets ending at byte {end}) does not describe the "
                              f"data file ({size} bytes); 'fpipe verify' says more, 'fpipe "
                              "index' rebuilds the index", path=files.data)
        md5 = _hash(files.data)
        expected = read_md5(files.data).get(files.data.name) if files.md5.exists() else None
        if expected is not None and md5.hexdigest() != expected:
            raise FormatError("cannot append: the data file does not match its .md5 entry "
                              "('fpipe verify' says more)", path=files.data)
        return cls(count, end, md5, _first_keys(files, count) if count <= WINDOW else [])


def _index_extent(files: DatasetFiles) -> tuple[int, int, int]:
    """The samples ``.offsets`` counts, the byte it ends at, and the keys ``.keys`` counts."""
    with open_regular(files.offsets) as file:
        size = os.fstat(file.fileno()).st_size
        if size < 8 or size % 8:
            raise FormatError(f"an offsets file holds n + 1 uint64; got {size} bytes",
                              path=files.offsets)
        end = int.from_bytes(os.pread(file.fileno(), 8, size - 8), "big")
    return size // 8 - 1, end, array_length(files.keys)


def _first_keys(files: DatasetFiles, count: int) -> list[str]:
    keys = read_keys(files.data)
    if len(keys) != count:
        raise FormatError(f"the keys file holds {len(keys)} keys for {count} samples",
                          path=files.keys)
    return keys


def _hash(path: Path) -> Any:
    md5 = hashlib.md5()
    with open(path, "rb", buffering=0) as file:
        while block := file.read(1 << 20):
            md5.update(block)
    return md5


def _forget(sink: _Sink, staging: Path) -> None:
    """What a writer dropped without closing leaves: its thread stopped, its file closed."""
    try:
        sink.finish()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _repeated_keys(repeated: list[tuple[int, int, str]], files: DatasetFiles) -> ValueError:
    shown = "; ".join(f"{key!r:.80} is sample {first} and sample {later}"
                      for first, later, key in repeated[:5])
    more = f" (and {len(repeated) - 5} more)" if len(repeated) > 5 else ""
    return ValueError(f"duplicate key: keys must be unique; {shown}{more}, found when the index "
                      f"of {files.data} was built; the dataset was written without the later "
                      "samples")


def _open_end(files: DatasetFiles) -> int:
    return os.open(files.data, os.O_WRONLY | os.O_APPEND | getattr(os, "O_BINARY", 0))


def _upload(outfile: Any, storage_options: dict | None, overwrite: bool) -> Any:
    """An :class:`~fpipe.remote.transfer.Upload` for a URL; None for a local path."""
    if isinstance(outfile, str) and "://" in outfile:
        from fpipe.remote.transfer import Upload
        from fpipe.remote.urls import is_url

        if is_url(outfile):
            return Upload(outfile, storage_options, overwrite)
    if storage_options is not None:
        raise ValueError(f"storage_options only apply to URLs; got the local path {outfile!r}")
    return None


def _encodable(key: str) -> bool:
    try:
        key.encode()
    except UnicodeEncodeError:
        return False
    return True


class _ClosedKeys:
    """Stands in for the keys of a closed writer: it has their count and refuses writes
    (so that a write need not check whether the writer is open)."""

    def __init__(self, count: int, path: Path) -> None:
        self.count, self.path = count, path

    def __len__(self) -> int:
        return self.count

    def __contains__(self, key: object) -> bool:
        raise ValueError(f"{self.path}: write to a closed writer")


class _Sink:
    """The data file's writing end: appends blocks and hashes them.

    With ``threaded`` a background thread does both, so hashing and the write system calls
    (which release the GIL) overlap with packing the next samples. Its failure surfaces at
    the next ``put`` or at ``finish``.
    """

    def __init__(self, fd: int, threaded: bool, md5: Any) -> None:
        self._fd: int | None = fd
        self._md5 = md5
        self._error: BaseException | None = None
        self._queue: queue.Queue | None = queue.Queue(maxsize=4) if threaded else None
        self._thread: threading.Thread | None = None

    def put(self, block: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._queue is None:
            try:
                self._append(block)
            except BaseException as error:
                self._error = error  # raised again by finish(): the writer writes no index
                raise
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="fpipe-writer", daemon=True)
            self._thread.start()
        self._queue.put(block)

    def _append(self, block: bytes) -> None:
        self._md5.update(block)
        _write_all(self._fd, block)

    def _drain(self) -> None:
        while (block := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._append(block)
                except BaseException as error:
                    self._error = error

    def finish(self) -> str:
        """Wait for the pending blocks, close the file, and return the data's MD5."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._error is not None:
            raise self._error
        return self._md5.hexdigest()


class FileWriter(Writer):
    """Write dict samples; each needs a unique str ``"key"``.

    Samples are packed like datadings packs them (see :mod:`fpipe.dataset.format`). A missing
    key raises :class:`KeyError`, a non-str key :class:`TypeError`, and a duplicate key or
    one that UTF-8 cannot encode (a lone surrogate) :class:`ValueError`, all at that
    ``write`` (:class:`RawWriter` too), and the sample is not written.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> with FileWriter(path) as writer:
    ...     writer.write({"key": "a", "label": 1})
    ...     writer.write({"key": "a", "label": 2})
    Traceback (most recent call last):
    ...
    ValueError: duplicate key 'a': keys must be unique
    >>> from fpipe.dataset import MsgpackReader
    >>> reader = MsgpackReader(path)
    >>> len(reader), reader.get(0)
    (1, {'key': 'a', 'label': 1})
    """

    def __init__(self, outfile: PathLike, buffering: int = _DEFAULT_BUFFER, overwrite: bool = False,
                 *, append: bool = False, progress: bool = False, **tqdm_kwargs: Any) -> None:
        super().__init__(outfile, buffering, overwrite, append=append, progress=progress,
                         **tqdm_kwargs)
        self._packer = new_packer()

    def write(self, sample: dict) -> None:
        """Pack and append one sample (buffered: it is on disk once the buffer fills, and
        readable with the index written at :meth:`close`).

        >>> import os, tempfile
        >>> from fpipe.dataset import MsgpackReader
        >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
        >>> writer = FileWriter(path)
        >>> writer.write({"key": "a", "image": b"\\x89PNG"})
        >>> writer.written
        1
        >>> writer.write({"label": 3})
        Traceback (most recent call last):
        ...
        KeyError: 'samples must be dicts with a "key"; got ...'
        >>> writer.close()
        >>> MsgpackReader(path).get(0)
        {'key': 'a', 'image': b'\\x89PNG'}
        """
        try:
            key = sample["key"]
        except (KeyError, TypeError, IndexError):
            raise KeyError(f'samples must be dicts with a "key"; got {sample!r:.80}') from None
        self._add(key, self._packer.pack(sample))


class RawWriter(Writer):
    """Write samples that are already packed, each under its key (zero-decode copying).

    ``data`` must be exactly one msgpack message; it is written as given, not checked.

    >>> import os, tempfile
    >>> from fpipe.dataset import MsgpackReader, pack_sample
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> with RawWriter(path) as writer:
    ...     writer.write("a", pack_sample({"key": "a", "n": 1}))
    >>> MsgpackReader(path).get(0)
    {'key': 'a', 'n': 1}
    """

    def write(self, key: str, data: bytes) -> None:
        """Append one packed sample under ``key`` (as :meth:`~Writer.write_packed` does)."""
        self.write_packed(key, data)


def _create(files: DatasetFiles, overwrite: bool) -> int:
    files.data.parent.mkdir(parents=True, exist_ok=True)
    existing = [path for path in (*files.all_files, files.legacy_index) if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(errno.EEXIST, "dataset exists (pass overwrite=True to replace it)",
                              str(existing[0]))
    # Removed, not truncated: readers that still map the old files keep reading them, and no
    # stale index describes the new data if this writer never reaches close().
    for path in existing:
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    return os.open(files.data, flags, 0o666)


def _write_all(fd: int, block: bytes) -> None:
    view = memoryview(block)
    while view:
        view = view[os.write(fd, view):]


def check_progress_options(owner: str, options: dict) -> None:
    """A TypeError naming the first of ``options`` (keyword arguments given to ``owner``, a
    writer) that tqdm's progress bar does not take.

    >>> check_progress_options("FileWriter", {"desc": "train", "overwirte": True})
    Traceback (most recent call last):
    ...
    TypeError: FileWriter got an unexpected keyword argument 'overwirte' (its other keyword \
arguments go to tqdm, which takes no keyword of that name)
    """
    if options:
        check_keywords(owner, options, _tqdm_options(), "tqdm")


def _tqdm_options() -> frozenset[str]:
    """What tqdm's bar takes by name (its ``**kwargs`` only raise ``TqdmKeyError``); the
    iterable is the writer's, not an option."""
    from tqdm import tqdm  # imported only when options are given

    parameters = inspect.signature(tqdm.__init__).parameters.values()
    return frozenset(parameter.name for parameter in parameters
                     if parameter.kind is parameter.POSITIONAL_OR_KEYWORD
                     and parameter.name not in ("self", "iterable"))


def _progress_bar(path: Path, progress: bool, tqdm_kwargs: dict) -> Any:
    wanted = progress or bool(tqdm_kwargs)
    if not wanted or tqdm_kwargs.get("disable", False):
        return None
    from tqdm import tqdm  # imported only when a bar is shown

    options = {"desc": path.name, "unit": " samples", "mininterval": 0.5, **tqdm_kwargs}
    try:
        return tqdm(**options)
    except (TypeError, ValueError, AttributeError) as error:  # tqdm's own, on a bad value
        kind = ValueError if isinstance(error, ValueError) else TypeError
        shown = ", ".join(f"{name}={value!r:.40}" for name, value in tqdm_kwargs.items())
        raise kind(f"tqdm refused the progress bar options {shown} "
                   f"({type(error).__name__}: {error})") from error


def index_keys(path: PathLike) -> None:
    """Write the key index (``.key_index``) of the dataset of data file ``path`` from its
    ``.offsets`` and ``.keys``, for a dataset that lacks it (written by datadings, or by an
    older fpipe); ``.md5`` is written anew with it. Reads the index files once, in bounded
    memory; not the data, whose MD5 the ``.md5`` file gives (or which is hashed if it does
    not). A dataset whose index does not describe its data raises
    :class:`~fpipe.errors.FormatError` (:func:`rebuild_index` rebuilds it from the data).

    >>> import os, tempfile
    >>> from fpipe.dataset import FileWriter, MsgpackReader
    >>> path = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> with FileWriter(path) as writer:
    ...     writer.write({"key": "a"})
    >>> os.remove(path + ".key_index")
    >>> index_keys(path)
    >>> os.path.exists(path + ".key_index"), MsgpackReader(path).find_index("a")
    (True, 0)
    """
    files = DatasetFiles(path)
    count, end, keys = _index_extent(files)
    size = files.data.stat().st_size
    if count != keys or end != size:
        raise FormatError(f"the index ({keys} keys, {count + 1} offsets ending at byte {end}) "
                          f"does not describe the data file ({size} bytes); 'fpipe index' "
                          "rebuilds it from the data", path=files.data)
    listed = read_md5(files.data).get(files.data.name) if files.md5.exists() else None
    data_md5 = listed or md5_file(files.data)
    staging = Path(tempfile.mkdtemp(prefix=".fpipe-", dir=files.data.parent))
    try:
        builder = IndexBuilder(staging, files.data.name)
        builder.add_dataset(files)
        built = builder.finish()
        if built.duplicates:
            first, later, key = built.duplicates[0]
            raise FormatError(f"duplicate key {key!r} (sample {first} has it too); 'fpipe "
                              "verify' says more", path=files.keys, index=later)
        built.commit(files, data_md5)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
