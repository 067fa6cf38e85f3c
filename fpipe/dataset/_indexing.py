"""The index files of a dataset, written in bounded memory: :class:`IndexBuilder`.

The writers, :func:`~fpipe.dataset.writer.rebuild_index` and
:func:`~fpipe.dataset.format.write_index` hand it the keys and byte lengths of the samples a
batch at a time. It streams the offsets and the keys into their files as they come, and
remembers where each key begins (8 bytes a sample, in a spill file). :meth:`IndexBuilder.finish`
then reads the keys back once: it hashes them (``.key_hashes``, in order), sets their bits in
the Bloom filter (at most :data:`~fpipe.dataset.format.BLOOM_MAX_BYTES`), and sorts the
hashes by partitions for the key index (:mod:`fpipe.dataset.keyindex`). Equal hashes are
looked at: a repeated key is reported (the index is not made), two keys that collide make it
hash anew with the next salt, as datadings does. Memory stays under about 150 MiB at any
number of samples; disk beside the output takes about 40 bytes a sample meanwhile.
Private: the writers use it.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> builder = IndexBuilder(folder, "x.msgpack")
>>> builder.add(["a", "b"], [3, 4])
>>> built = builder.finish()
>>> built.duplicates, sorted(p.name[9:] for p in folder.iterdir())
([], ['.filter', '.key_hashes', '.key_index', '.keys', '.offsets'])
>>> target = DatasetFiles(Path(tempfile.mkdtemp()) / "y.msgpack")
>>> built.commit(target, "0" * 32)
>>> target.md5.read_text().splitlines()[0]
'00000000000000000000000000000000  y.msgpack'
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgpack
import numpy as np

from fpipe.dataset._staging import signals_deferred
from fpipe.dataset.keyindex import (
    BloomFilter,
    KeyIndexWriter,
    SortedPairs,
    key_salt,
    salted_hashes,
)
from fpipe.errors import FormatError
from fpipe.files import DECODE_ERRORS, DatasetFiles, md5_line, open_regular

__all__ = ["Built", "IndexBuilder", "array_length", "without_samples"]

_BATCH = 1 << 16
_RESERVED = 5  # the keys array's header: array32 once there are 65,536 keys or more
_MAX_SALTS = 1000
_STR_HEADERS = np.array([32, 256, 65536], dtype=np.int64)


@dataclass
class Built:
    """What :meth:`IndexBuilder.finish` made: the index files (in the builder's folder) with
    their MD5s, or ``duplicates``, triples ``(first, later, key)`` of samples with the same key
    (then the index files are incomplete and must not be used)."""

    files: DatasetFiles
    md5: dict[str, str] = field(default_factory=dict)
    duplicates: list[tuple[int, int, str]] = field(default_factory=list)

    def refuse_duplicates(self) -> None:
        """Raise :class:`ValueError` naming the first repeated key, if a key is repeated."""
        if self.duplicates:
            first, later, key = self.duplicates[0]
            raise ValueError(f"duplicate key {key!r}: samples {first} and {later}; keys must be "
                             "unique")

    def commit(self, target: DatasetFiles, data_md5: str) -> None:
        """Write ``.md5`` (the data's MD5 is ``data_md5``) and move the index files onto
        those of ``target``, each in one rename, ``.md5`` last."""
        if self.duplicates:
            raise ValueError("an index with duplicate keys is not committed")
        names = [target.data, *target.index_files]
        md5 = {target.data.name: data_md5, **{new.name: self.md5[old.name] for new, old in
                                             zip(target.index_files, self.files.index_files)}}
        self.files.md5.write_text("".join(md5_line(md5[path.name], path.name) for path in names),
                                  encoding="utf-8")
        with signals_deferred():  # Ctrl-C amid the renames would leave two halves of indexes
            for new, old in zip((*self.files.index_files, self.files.md5),
                                (*target.index_files, target.md5)):
                os.replace(new, old)


class IndexBuilder:
    """The index files of the dataset ``name``, built in ``folder`` from the keys and lengths
    of its samples, in order."""

    def __init__(self, folder: Path, name: str) -> None:
        self.files = DatasetFiles(Path(folder) / name)
        self.count, self.end = 0, 0
        self._offsets = open(self.files.offsets, "wb")
        self._offsets_md5 = hashlib.md5(bytes(8))
        self._offsets.write(bytes(8))
        self._keys = open(self.files.keys, "wb")
        self._keys.write(bytes(_RESERVED))
        self._key_ends = open(self._spill_path, "wb")
        self._key_end = 0

    @property
    def _spill_path(self) -> Path:
        return self.files.data.with_name(self.files.data.name + ".key-ends.spill")

    def add(self, keys: Sequence[str], lengths: Sequence[int]) -> None:
        """The keys and byte lengths of the next samples."""
        if not len(keys):
            return
        if self.count + len(keys) >= 1 << 32:
            raise ValueError("a dataset holds fewer than 2**32 samples (msgpack's longest array "
                             "of keys)")
        ends = self.end + np.cumsum(np.asarray(lengths, dtype=np.uint64))
        data = ends.astype(">u8").tobytes()
        self._offsets.write(data)
        self._offsets_md5.update(data)
        self.end = int(ends[-1])
        packed = msgpack.packb(list(keys), use_bin_type=True)
        self._keys.write(memoryview(packed)[_array_header_size(len(keys)):])
        self._key_ends.write(self._next_key_ends(keys).astype(">u8").tobytes())
        self.count += len(keys)

    def _next_key_ends(self, keys: Sequence[str]) -> np.ndarray:
        sizes = np.fromiter((len(key) if key.isascii() else len(key.encode()) for key in keys),
                            np.int64, len(keys))
        # a str's msgpack header: 1 byte below 32 bytes, then 2, 3 or 5
        sizes += 1 + np.searchsorted(_STR_HEADERS, sizes, side="right") + (sizes >= 65536)
        ends = self._key_end + np.cumsum(sizes)
        self._key_end = int(ends[-1])
        return ends

    def add_dataset(self, files: DatasetFiles) -> None:
        """The samples of an existing dataset (checked by the caller), copied from its
        ``.offsets`` and ``.keys``: the base of an append."""
        with open(files.offsets, "rb") as source:
            source.read(8)
            while block := source.read(1 << 20):
                ends = np.frombuffer(block, dtype=">u8").astype(np.int64)
                self.add_lengths_of(ends)
        with open(files.keys, "rb") as source:
            count = msgpack.Unpacker(source, read_size=16).read_array_header()
        with open(files.keys, "rb") as source:
            source.seek(_array_header_size(count))
            unpacker = msgpack.Unpacker(source, raw=False, read_size=1 << 20)
            while batch := list(itertools.islice(unpacker, _BATCH)):
                self._key_ends.write(self._next_key_ends(batch).astype(">u8").tobytes())
                self._keys.write(msgpack.packb(batch, use_bin_type=True)[
                    _array_header_size(len(batch)):])
                self.count += len(batch)

    def add_lengths_of(self, ends: np.ndarray) -> None:
        data = ends.astype(">u8").tobytes()
        self._offsets.write(data)
        self._offsets_md5.update(data)
        self.end = int(ends[-1])

    def close_files(self) -> None:
        """Close the files the builder writes, also when a full disk keeps them from being
        flushed (so that no descriptor outlives a failed writer)."""
        for file in (self._offsets, self._keys, self._key_ends):
            try:
                file.close()
            except OSError:
                pass  # the file is closed all the same; what it lost is not used

    def abandon(self) -> None:
        """Close and remove what the builder wrote."""
        self.close_files()
        for path in (*self.files.index_files, self.files.md5, self._spill_path):
            path.unlink(missing_ok=True)

    def finish(self) -> Built:
        """Write the remaining index files (not ``.md5``: :meth:`Built.commit` does)."""
        for file in (self._offsets, self._keys, self._key_ends):
            file.close()
        self._fix_keys_header()
        built = Built(self.files, {self.files.offsets.name: self._offsets_md5.hexdigest()})
        try:
            for attempt in range(_MAX_SALTS):
                equal = self._hash_pass(key_salt(attempt), built, bloom=not attempt)
                if not equal:
                    return built
                built.duplicates = self._repeated(equal)
                if built.duplicates:
                    return built
            raise RuntimeError(f"key hashes collide for {_MAX_SALTS} salts")
        finally:
            self._spill_path.unlink(missing_ok=True)

    def samples_within(self, data: Path, size: int) -> int:
        """How many of the samples given so far end within the first ``size`` bytes of the
        data file ``data``: those whose offsets reached the disk (which may be full, so the
        last ones may not have), then the whole messages that follow them in the data."""
        if not self._offsets.closed:
            try:
                self._offsets.flush()
            except OSError:
                pass  # the search reads what the file holds
        with open(self.files.offsets, "rb") as file:
            low, high = 0, os.fstat(file.fileno()).st_size // 8 - 1
            while low < high:  # the last end at or before size: a binary search of preads
                middle = (low + high + 1) // 2
                if int.from_bytes(os.pread(file.fileno(), 8, 8 * middle), "big") <= size:
                    low = middle
                else:
                    high = middle - 1
            end = int.from_bytes(os.pread(file.fileno(), 8, 8 * low), "big") if high >= 0 else 0
        return low + _whole_messages(data, end, size)

    def _fix_keys_header(self) -> None:
        header = _array_header(self.count)
        with open(self.files.keys, "r+b") as file:
            if len(header) == _RESERVED:
                file.write(header)
                return
            file.seek(_RESERVED)
            rest = file.read()  # fewer than 65,536 keys
            file.seek(0)
            file.write(header + rest)
            file.truncate()

    def _hash_pass(self, salt: bytes, built: Built, bloom: bool) -> list[tuple[int, int]]:
        """Hash every key with ``salt``: ``.key_hashes``, the filter (if ``bloom``) and the key
        index; the pairs of samples whose hashes are equal."""
        files, n = self.files, self.count
        pairs = SortedPairs(n, files.data.parent)
        keys_md5, hashes_md5 = hashlib.md5(), hashlib.md5(salt)
        filter_ = BloomFilter.for_count(n) if bloom else None
        with open(files.keys, "rb") as source, open(files.key_hashes, "wb") as target:
            target.write(salt)
            unpacker = msgpack.Unpacker(_Hashing(source, keys_md5), raw=False, read_size=1 << 20)
            unpacker.read_array_header()
            first = 0
            while batch := list(itertools.islice(unpacker, _BATCH)):
                hashes = salted_hashes(batch, salt)
                data = hashes.astype(">u8").tobytes()
                target.write(data)
                hashes_md5.update(data)
                if filter_ is not None:
                    filter_.update(batch)
                pairs.add(hashes, first)
                first += len(batch)
        built.md5[files.keys.name] = keys_md5.hexdigest()
        built.md5[files.key_hashes.name] = hashes_md5.hexdigest()
        if filter_ is not None:
            built.md5[files.filter.name] = filter_.dump(files.filter)
            del filter_  # up to 64 MiB, not held while the key index is sorted
        return self._write_key_index(pairs, salt, built)

    def _write_key_index(self, pairs: SortedPairs, salt: bytes, built: Built) -> list:
        files = self.files
        writer = KeyIndexWriter(files.key_index, self.count, salt, files.keys.stat().st_size,
                                built.md5[files.keys.name])
        header = _array_header_size(self.count)
        writer.add_key_offsets(np.array([header], dtype=np.int64))
        with open(self._spill_path, "rb") as ends:
            while block := ends.read(1 << 20):
                writer.add_key_offsets(np.frombuffer(block, dtype=">u8").astype(np.int64) + header)
        equal = writer.write_sorted(pairs.sorted())
        if equal:
            writer.abandon()
            return equal
        built.md5[files.key_index.name] = writer.close()
        return []

    def _repeated(self, equal: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
        """The pairs of ``equal`` (samples with equal hashes) whose keys are equal, as
        ``(first, later, key)`` in order."""
        wanted = sorted({index for pair in equal for index in pair})
        keys = dict(zip(wanted, self._keys_at(wanted)))
        return sorted((min(a, b), max(a, b), keys[a]) for a, b in equal if keys[a] == keys[b])

    def _keys_at(self, indices: list[int]) -> list[str]:
        header = _array_header_size(self.count)
        with open(self._spill_path, "rb") as ends, open(self.files.keys, "rb") as keys:
            found = []
            for index in indices:
                start = header if index == 0 else header + struct.unpack(
                    ">Q", os.pread(ends.fileno(), 8, 8 * (index - 1)))[0]
                stop = header + struct.unpack(">Q", os.pread(ends.fileno(), 8, 8 * index))[0]
                found.append(msgpack.unpackb(os.pread(keys.fileno(), stop - start, start)))
        return found


class _Hashing:
    """A file that hashes what is read from it."""

    def __init__(self, file: IO[bytes], md5: Any) -> None:
        self.file, self.md5 = file, md5

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.md5.update(data)
        return data


def _whole_messages(data: Path, start: int, stop: int) -> int:
    """How many whole msgpack messages follow one another in ``data`` from byte ``start``
    up to ``stop``."""
    count = 0
    with open(data, "rb") as file:
        file.seek(start)
        unpacker = msgpack.Unpacker(file, read_size=1 << 20, max_buffer_size=0)
        try:
            while unpacker.tell() < stop - start:
                unpacker.skip()
                if start + unpacker.tell() <= stop:
                    count += 1
        except (msgpack.OutOfData, *DECODE_ERRORS):
            pass  # the last message is cut short
    return count


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + struct.pack(">H", count)
    return b"\xdd" + struct.pack(">I", count)


def _array_header_size(count: int) -> int:
    return 1 if count < 16 else 3 if count < 1 << 16 else 5


def array_length(path: Path) -> int:
    """The length of the msgpack array that the file ``path`` begins with (a ``.keys`` file),
    read from its header; :class:`~fpipe.errors.FormatError` if it begins with none."""
    try:
        with open_regular(path) as file:
            return msgpack.Unpacker(file, read_size=16).read_array_header()
    except (msgpack.OutOfData, *DECODE_ERRORS) as error:
        raise FormatError(f"corrupt keys file ({error})", path=path) from error


def index_batches(files: DatasetFiles, first: int = 0) -> Iterator[tuple[list[str], np.ndarray]]:
    """The keys and the ``n + 1``-style offsets (start of each, then the end) of the samples
    of a dataset's index from ``first`` on, a batch at a time."""
    with open(files.keys, "rb") as keys, open(files.offsets, "rb") as offsets:
        unpacker = msgpack.Unpacker(keys, raw=False, read_size=1 << 20)
        unpacker.read_array_header()
        for _ in itertools.islice(unpacker, first):
            pass
        done = first
        while batch := list(itertools.islice(unpacker, _BATCH)):
            bounds = np.frombuffer(os.pread(offsets.fileno(), 8 * (len(batch) + 1), 8 * done),
                                   dtype=">u8").astype(np.int64)
            yield batch, bounds
            done += len(batch)


def without_samples(built: Built, target: DatasetFiles, first: int, base_end: int,
                    base_md5: Any) -> tuple[Built, str]:
    """The dataset of ``built`` (whose data file is ``target.data``) without the later samples
    of its repeated keys, all from sample ``first`` on (those a writer wrote, after the
    ``first`` samples and ``base_end`` bytes of the dataset it appended to, whose data MD5
    ``base_md5`` runs on): that part of the data copied without them, and an index built anew;
    with the data's new MD5."""
    dropped = {later for _, later, _ in built.duplicates}
    folder = built.files.data.parent / "kept"
    folder.mkdir()
    builder = IndexBuilder(folder, target.data.name)
    if first:
        builder.add_dataset(target)
    md5, kept = base_md5.copy(), folder / "data"
    with open(target.data, "rb") as data, open(kept, "wb") as out:
        for keys, bounds in index_batches(built.files, first):
            block = os.pread(data.fileno(), int(bounds[-1] - bounds[0]), int(bounds[0]))
            pieces = [(key, block[a - bounds[0]:b - bounds[0]]) for index, (key, a, b) in
                      enumerate(zip(keys, bounds.tolist(), bounds[1:].tolist()), first)
                      if index not in dropped]
            first += len(keys)
            for _, piece in pieces:
                out.write(piece)
                md5.update(piece)
            builder.add([key for key, _ in pieces], [len(piece) for _, piece in pieces])
    if first:
        os.truncate(target.data, base_end)
        with open(kept, "rb") as source, open(target.data, "ab") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    else:
        os.replace(kept, target.data)
    again = builder.finish()
    return again, md5.hexdigest()
