"""Damaged datasets, and an oracle of what a reader must answer for any bytes on disk.

The format says that sample ``i`` is exactly one msgpack message in
``data[offsets[i]:offsets[i + 1]]``. :class:`Oracle` decodes that straight from the bytes, so
a read that returns anything else is a wrong record, whatever the damage.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np
import pytest

from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.dataset.format import DatasetFiles, decode_numpy
from fpipe.errors import FormatError

# a damaged key index is left aside with a warning and keys are looked up in .keys: a right
# answer in the checks that damage index files, so its warning is expected there
KEY_INDEX_LEFT_ASIDE = pytest.mark.filterwarnings(
    "ignore:.*the key index is left aside:UserWarning")

#: The exceptions a damaged dataset may raise; anything else is a failure.
ALLOWED = (FormatError, FileNotFoundError)
#: msgpack (>= 1.2.4) preallocates at most this many slots for a container it has not finished,
#: and keeps at most this many containers open at once.
MSGPACK_PREALLOC, MSGPACK_DEPTH = 10_000, 1024


def allocation_limit(size: int) -> int:
    """The documented bound on what one read allocates from a dataset whose files hold
    ``size`` bytes: the decoded objects (an empty map, one byte on disk, is a 64-byte dict:
    128 bytes per byte covers every type), plus the slots msgpack preallocates for containers
    that a corrupt sample opens and never finishes, plus 2 MiB of fixed buffers (the keys
    file is read 1 MiB at a time). No declared length or offset enters it."""
    open_containers = min(size, MSGPACK_DEPTH) * 8 * min(size, MSGPACK_PREALLOC)
    return 128 * size + open_containers + (2 << 20)


def write_dataset(path: Path, samples: list[dict]) -> Path:
    with FileWriter(path, overwrite=True) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def _every_file(files: DatasetFiles) -> tuple[Path, ...]:
    return (*files.all_files, files.legacy_index)


def file_bytes(path: Path) -> dict[str, bytes]:
    """Every file of the dataset at ``path``, by suffix ("" for the data file)."""
    files = DatasetFiles(path)
    return {file.name[len(files.data.name):]: file.read_bytes()
            for file in _every_file(files) if file.exists()}


def put_files(path: Path, contents: dict[str, bytes]) -> None:
    """Make the dataset's files exactly ``contents`` (a suffix that is missing: no file)."""
    files = DatasetFiles(path)
    for file in _every_file(files):
        suffix = file.name[len(files.data.name):]
        if suffix in contents:
            file.write_bytes(contents[suffix])
        elif file.exists():
            file.unlink()


def same(a, b) -> bool:
    """Deep equality that compares numpy values by type, dtype, shape and bytes, and NaN to NaN."""
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        return (type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b)
                and np.asarray(a).tobytes() == np.asarray(b).tobytes())
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b)
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))


BAD = object()  # the oracle's answer for a sample that must raise FormatError


@dataclass
class Oracle:
    """Each sample as the format defines it, decoded straight from the files' bytes."""

    data: bytes
    offsets: list[int]

    @classmethod
    def of(cls, contents: dict[str, bytes]) -> Oracle | None:
        """The oracle of a dataset with an ``.offsets`` file (None for other index kinds)."""
        raw = contents.get(".offsets")
        if not raw or len(raw) % 8:
            return None
        return cls(contents.get("", b""), np.frombuffer(raw, ">u8").tolist())

    def raw(self, i: int):
        start, stop = self.offsets[i], self.offsets[i + 1]
        if start > stop or stop > len(self.data):
            return BAD
        return self.data[start:stop]

    def sample(self, i: int):
        span = self.raw(i)
        if span is BAD:
            return BAD
        try:
            return msgpack.unpackb(span, strict_map_key=False, object_hook=decode_numpy)
        except Exception:
            return BAD


@dataclass
class Tally:
    """Reads made on one dataset, and the most memory one of them allocated."""

    reads: int = 0
    peak: int = 0

    def attempt(self, read, *args, traced: bool = True, **kwargs):
        """The result of ``read(*args, **kwargs)``, or the allowed exception it raised (others
        propagate). Its allocations count when ``traced`` and ``tracemalloc`` is on."""
        self.reads += 1
        tracing = traced and tracemalloc.is_tracing()
        if tracing:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
        try:
            return read(*args, **kwargs)
        except ALLOWED as error:
            return error
        finally:
            if tracing:
                self.peak = max(self.peak, tracemalloc.get_traced_memory()[1] - before)


def check_answer(got, expected, what: str) -> None:
    """``got`` is a read's result or the FormatError it raised; it must match the oracle."""
    if expected is BAD:
        assert isinstance(got, FormatError), f"{what}: expected FormatError, got {got!r:.200}"
    else:
        assert not isinstance(got, Exception), f"{what}: {got!r} for a readable sample"
        assert same(got, expected), f"{what}: wrong record {got!r:.200} != {expected!r:.200}"


def check_reader(path: Path, contents: dict[str, bytes], most: int = 64) -> Tally:
    """Read the dataset at ``path`` (whose files hold ``contents``) every way the reader
    offers. Every read returns what the oracle says, or raises FormatError or
    FileNotFoundError; key lookups and checks answer or raise those two."""
    tally = Tally()
    reader = tally.attempt(MsgpackReader, path)
    if isinstance(reader, Exception):
        return tally
    oracle = Oracle.of(contents)
    n = min(len(reader), most)
    for i in range(n):
        for raw in (False, True):
            got = tally.attempt(reader.get, i, raw=raw)
            if oracle is not None:
                check_answer(got, oracle.raw(i) if raw else oracle.sample(i), f"get({i}, raw={raw})")
    _check_sequences(reader, oracle, n, tally)
    _check_keys(reader, n, tally)
    for verify in (reader.verify_data, reader.verify_index):  # reads blocks of 512 KiB
        assert isinstance(tally.attempt(verify, traced=False), (bool, *ALLOWED))
    return tally


def _check_sequences(reader: MsgpackReader, oracle: Oracle | None, n: int, tally: Tally) -> None:
    """Iterators yield the oracle's samples up to the first bad one, then raise FormatError;
    a slice is all of them or FormatError."""
    for chunk_size in (1, 3, 64):
        for raw in (False, True):
            got, iterator = [], reader.iter(0, n, raw=raw, chunk_size=chunk_size)
            error = tally.attempt(got.extend, iterator)
            if oracle is not None:
                expected = [oracle.raw(i) if raw else oracle.sample(i) for i in range(n)]
                _check_prefix(got, error, expected, f"iter(chunk_size={chunk_size}, raw={raw})")
    whole = tally.attempt(reader.get_slice, 0, n)
    if oracle is not None:
        expected = [oracle.sample(i) for i in range(n)]
        if any(e is BAD for e in expected):
            assert isinstance(whole, FormatError), f"get_slice: {whole!r:.200}"
        else:
            assert not isinstance(whole, Exception) and same(whole, expected), "get_slice"


def _check_prefix(got: list, error, expected: list, what: str) -> None:
    bad = next((i for i, e in enumerate(expected) if e is BAD), len(expected))
    assert len(got) == bad, f"{what}: {len(got)} samples before the error, expected {bad}"
    assert same(got, expected[:bad]), f"{what}: wrong record"
    assert isinstance(error, FormatError) == (bad < len(expected)), f"{what}: {error!r}"
    if isinstance(error, FormatError):
        assert error.index == bad, f"{what}: the error names sample {error.index}, not {bad}"


def _find_index(reader: MsgpackReader, key: str):
    try:
        return reader.find_index(key)
    except KeyError as error:  # a damaged hash file may not find a key: no wrong answer
        return error


def _check_keys(reader: MsgpackReader, n: int, tally: Tally) -> None:
    for i in range(n):
        key = tally.attempt(reader.find_key, i)
        if not isinstance(key, str):
            assert isinstance(key, ALLOWED), f"find_key({i}): {key!r}"
            continue
        assert isinstance(tally.attempt(reader.__contains__, key), (bool, *ALLOWED))
        found = tally.attempt(_find_index, reader, key)
        assert isinstance(found, (int, KeyError, *ALLOWED)), f"find_index: {found!r}"
        assert not isinstance(found, int) or 0 <= found < len(reader)
    for probe in ("absent", "ключ"):
        assert isinstance(tally.attempt(reader.__contains__, probe), (bool, *ALLOWED))
