"""Read WebDataset tar shards in place: :class:`TarReader` (one shard) and
:class:`WebDatasetReader` (a list, glob or brace pattern of shards, read as one
:class:`~fpipe.dataset.sharded.ShardedReader`), with fpipe's reader API.

A shard is a tar file whose members are grouped into samples as WebDataset groups them:
consecutive members with the same *key* (the member's path up to the first dot of its file
name) form one sample, and each member's *extension* (the rest of its file name) names a
field. ``train/0001.jpg`` and ``train/0001.cls`` make the sample
``{"key": "train/0001", "jpg": b"...", "cls": b"..."}``; fields are the members' bytes, as
WebDataset keeps them (``decode=True`` turns the well-known extensions into values).

Random access comes from an index of member offsets, built by reading the tar headers once
and kept in the cache folder; ``get`` is then one read of each member's bytes. Tiny members
(labels, short captions: at most 64 bytes) are kept in the index itself, so a sample of an
image and its label costs one read.

>>> import io, os, tarfile, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "shard-000.tar")
>>> with tarfile.open(path, "w") as tar:
...     for name, data in [("a.txt", b"hello"), ("a.cls", b"1"), ("b.txt", b"world"), ("b.cls", b"0")]:
...         info = tarfile.TarInfo(name)
...         info.size = len(data)
...         tar.addfile(info, io.BytesIO(data))
>>> reader = TarReader(path)
>>> len(reader), reader[1], reader.find_index("a")
(2, {'key': 'b', 'txt': b'world', 'cls': b'0'}, 0)
>>> TarReader(path, decode=True)[0]
{'key': 'a', 'txt': 'hello', 'cls': 1}
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from typing import Any, Union

import msgpack
import numpy as np

from fpipe.dataset.format import PathLike, pack_sample
from fpipe.dataset.keyindex import KeyTable
from fpipe.dataset.sharded import ShardedReader
from fpipe.errors import FormatError, check_bool
from fpipe.formats._foreign import (
    ByteSource,
    Scanner,
    SpanReader,
    cached_index,
    checked_spans,
    expand_shards,
    pin_index,
    renamed,
    same_bytes,
    strings_from_arrays,
    strings_to_arrays,
    write_shards,
)
from fpipe.remote.urls import RemoteOptions, check_remote, takes_remote

__all__ = ["TarReader", "WebDatasetReader", "decode_field", "encode_field", "member_key",
           "write_webdataset"]

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")
_META_TYPES = (b"x", b"g", b"L", b"K")
# links, devices, folders and FIFOs: no data follows their headers, whatever their size says
_NO_DATA_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")
_INT_EXTENSIONS = ("cls", "cls2", "index", "inx", "id")
_TEXT_EXTENSIONS = ("txt", "text", "transcript")
_JSON_EXTENSIONS = ("json", "jsn")
_MSGPACK_EXTENSIONS = ("msgpack", "mp", "mpk")
# Members of at most _INLINE_SIZE bytes are kept in the index (up to _INLINE_LIMIT bytes of
# them per shard), so that reading them costs no read of the file.
_INLINE_SIZE = 64
_INLINE_LIMIT = 16 << 20
# The index's name in the cache: a new one when its arrays change, so old ones are rebuilt.
_INDEX_KIND = "tar-3"
# An index in the cache is checked against the shard at each open by a digest of bytes it was
# made from (``pin_index``): the first and last blocks, and the header and first block of data
# of up to 16 members spread over the shard (a shard copied over another with ``cp -p`` keeps
# its size, modification time and inode, and the same layout would give the same offsets).


def decode_field(extension: str, data: bytes) -> Any:
    """The value of a member whose extension's last part says how it is encoded, as
    WebDataset's default decoders read it: ``cls``, ``cls2``, ``index``, ``inx``, ``id`` an
    integer in ASCII; ``txt``, ``text``, ``transcript`` UTF-8 text; ``json``, ``jsn`` JSON;
    ``npy`` a NumPy array; ``msgpack``, ``mp``, ``mpk`` msgpack. Anything else (images,
    audio, ...) stays bytes. A value that does not decode raises :class:`ValueError`.

    >>> decode_field("label.cls", b"7"), decode_field("jpg", b"\\xff\\xd8")
    (7, b'\\xff\\xd8')
    """
    kind = extension.rsplit(".", 1)[-1].lower()
    if kind in _INT_EXTENSIONS:
        return int(bytes(data).decode("ascii"))
    if kind in _TEXT_EXTENSIONS:
        return bytes(data).decode("utf-8")
    if kind in _JSON_EXTENSIONS:
        return json.loads(bytes(data))
    if kind == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if kind in _MSGPACK_EXTENSIONS:
        return msgpack.unpackb(data, strict_map_key=False)
    return bytes(data)


def encode_field(extension: str, value: Any) -> bytes:
    """The member bytes of ``value`` in a field named ``extension``: bytes as they are, and the
    values whose type the extension's last part encodes (see :func:`decode_field`). Any other
    type raises :class:`TypeError` naming the field: a tar member holds bytes.

    >>> encode_field("cls", 7), encode_field("meta.json", {"a": 1})
    (b'7', b'{"a": 1}')
    >>> encode_field("label", 7)
    Traceback (most recent call last):
    ...
    TypeError: field 'label' holds int; a WebDataset member holds bytes, or a value that its ...
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    kind = extension.rsplit(".", 1)[-1].lower()
    if kind in _INT_EXTENSIONS and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value)).encode("ascii")
    if kind in _TEXT_EXTENSIONS and isinstance(value, str):
        return value.encode("utf-8")
    if kind in _JSON_EXTENSIONS:
        try:
            return json.dumps(value, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as error:
            raise TypeError(f"field {extension!r}: not JSON ({error})") from None
    if kind == "npy" and isinstance(value, np.ndarray):
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return buffer.getvalue()
    if kind in _MSGPACK_EXTENSIONS:
        return pack_sample(value)
    raise TypeError(f"field {extension!r} holds {type(value).__name__}; a WebDataset member holds "
                    "bytes, or a value that its extension encodes (.cls: int, .txt: str, .json: "
                    f"JSON, .npy: array, .msgpack: any); rename the field (fpipe export --rename "
                    f"{extension}={extension}.cls)")


# --- the index of a shard ----------------------------------------------------------------------

class _Member:
    """A regular file in a tar: its name, where its data starts, its size, and its data when
    the scan kept it (a tiny member, see ``_INLINE_SIZE``)."""

    __slots__ = ("data", "name", "offset", "size")

    def __init__(self, name: str, offset: int, size: int, data: bytes | None = None) -> None:
        self.name, self.offset, self.size, self.data = name, offset, size, data


def _octal(field: bytes) -> int:
    """A tar number field: octal ASCII, or base-256 when its first byte has the high bit."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(field, "big", signed=False) & ~(0xFF << (8 * (len(field) - 1)))
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" ")
    return int(text, 8) if text else 0


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = _octal(header[148:156])
    except ValueError:  # not a number: not a header (a text file named .tar, say)
        return False
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if stored == unsigned:
        return True
    signed = unsigned - 2 * sum(b for b in header[:148] + header[156:] if b > 127)
    return stored == signed


def _pax_records(data: bytes, padding: bytes) -> dict[str, str]:
    """The records of a pax header's ``data``, each ``<length> <keyword>=<value>\\n``. Anything
    else, or anything but zeros in the ``padding`` of its last block, raises ValueError:
    tarfile reads records from the whole blocks, and would find others."""
    records, position = {}, 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0 or not data[position:space].isdigit():
            raise ValueError("a pax record without its length")
        end, equals = position + int(data[position:space]), data.find(b"=", space)
        if not space + 1 < equals < end <= len(data) or data[end - 1:end] != b"\n":
            raise ValueError("a pax record that does not fit its length")
        records[data[space + 1:equals].decode("utf-8", "surrogateescape")] = \
            data[equals + 1:end - 1].decode("utf-8", "surrogateescape")
        position = end
    if padding.strip(b"\0"):
        raise ValueError("data after the records of a pax header")
    return records


def _header_name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


class _TarScan:
    """A pass over a tar file's headers: the regular-file ``members``, and where and why the
    pass stopped early (``stopped_at`` None when it reached the end of the archive cleanly);
    ``cut`` is the name of the member that the damage cuts, when it is known."""

    def __init__(self, source: ByteSource) -> None:
        self.source, self.scanner = source, Scanner(source)
        self.members: list[_Member] = []
        self.inline_left = _INLINE_LIMIT
        self.stopped_at: int | None = None
        self.reason, self.cut = "", None
        self.long_name: str | None = None
        self.pax: dict[str, str] = {}

    def stop(self, position: int, reason: str, cut: str | None = None) -> _TarScan:
        self.stopped_at, self.reason, self.cut = position, reason, cut
        return self

    def run(self) -> _TarScan:
        position, size = 0, self.source.size
        while position + _BLOCK <= size:
            header = self.scanner.take(position, position + _BLOCK)
            if header == _ZERO_BLOCK:
                return self._end(position)
            if not _checksum_ok(header):
                return self.stop(position, "not a tar header (its checksum does not match)")
            position = self._member(header, position)
            if self.stopped_at is not None:
                return self
        return self._tail(position)

    def _member(self, header: bytes, position: int) -> int:
        """Take the member whose header is at ``position``; where the next header is (or, when
        the member is damaged, :meth:`stop` and ``position``)."""
        typeflag, size = header[156:157], self.source.size
        name = self.pax.get("path") or self.long_name or _header_name(header)
        if typeflag in _NO_DATA_TYPES:  # what their size says is not there (as tarfile reads)
            self.long_name, self.pax = None, {}
            return position + _BLOCK
        if typeflag == b"S":
            return self._damaged(position, f"member {name!r} is a sparse file, which fpipe does "
                                           "not read", name)
        try:
            length = int(self.pax["size"]) if "size" in self.pax and typeflag not in _META_TYPES \
                else _octal(header[124:136])
        except ValueError:
            return self._damaged(position, f"member {name!r}: its size is not a number", name)
        start = position + _BLOCK
        if length < 0 or start + length > size:
            return self._damaged(position, f"truncated: member {name!r} ends at byte "
                                           f"{start + length} but the file has {size} bytes", name)
        if typeflag in _META_TYPES:
            reason = self._meta(typeflag, self.scanner.take(start, start + length),
                                self.scanner.take(start + length, start + -(-length // _BLOCK) * _BLOCK))
            if reason:
                return self._damaged(position, reason)
        else:
            if typeflag in _FILE_TYPES:
                self.members.append(_Member(name, start, length, self._inline(start, length)))
            self.long_name, self.pax = None, {}
        return start + -(-length // _BLOCK) * _BLOCK

    def _damaged(self, position: int, reason: str, cut: str | None = None) -> int:
        self.stop(position, reason, cut)
        return position

    def _meta(self, typeflag: bytes, data: bytes, padding: bytes) -> str:
        """Take the data of a pax or long-name header (and the ``padding`` of its last block);
        why it is damaged ("" if it is not)."""
        if (typeflag == b"x" and (self.pax or self.long_name is not None)) or (
                typeflag == b"L" and self.long_name is not None):
            # which one names the member is a guess (tarfile lets the outer one win)
            return "two headers in a row that each name the member after them"
        if typeflag in (b"L", b"K"):
            if b"\0" not in data:  # its writer ends it with one; without, where it ends is a guess
                return "a long name without the NUL that ends it"
            if typeflag == b"L":
                self.long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            return ""
        try:
            records = _pax_records(data, padding)
        except ValueError as error:
            return f"a pax header that does not parse ({error})"
        if any(key.startswith("GNU.sparse.") for key in records):
            return "a pax header of a sparse file, which fpipe does not read"
        if typeflag == b"x":
            self.pax = records
        elif {"path", "size"} & set(records):  # tarfile would apply it to every member after
            return "a global pax header that sets the path or size of the members after it"
        return ""

    def _inline(self, start: int, length: int) -> bytes | None:
        """The data of a member small enough to keep in the index (it is in the scanner's
        window already), else None."""
        if length > _INLINE_SIZE or length > self.inline_left:
            return None
        self.inline_left -= length
        return self.scanner.take(start, start + length)

    def _end(self, position: int) -> _TarScan:
        """The zero block at ``position`` ends the archive if a second one (or the end of the
        file) follows it; one with a header after it is a header that was zeroed, and the
        members after it would be lost (tarfile ends there without a word)."""
        following = self.scanner.take(position + _BLOCK, position + 2 * _BLOCK)
        if following.strip(b"\0"):
            return self.stop(position, f"a zero block at byte {position} with more data after "
                                       "it: a damaged header, not the end of the archive")
        return self

    def _tail(self, position: int) -> _TarScan:
        """The end of a file that ran out before the end-of-archive blocks."""
        size = self.source.size
        rest = self.source.read(position, size)
        if rest.strip(b"\0"):
            # the name field comes first: a header cut after it still names its member
            cut = (self.pax.get("path") or self.long_name
                   or _header_name(rest + bytes(_BLOCK - len(rest))) if len(rest) >= 100 else None)
            return self.stop(position, f"truncated: a tar header at byte {position} is cut off "
                                       f"at {size} bytes", cut)
        if size:  # every tar writer ends the archive with zero blocks: without them, it was cut
            return self.stop(position, f"truncated: the archive ends at byte {size} without its "
                                       "end-of-archive blocks, so its last sample may lack members")
        return self


def _split_name(name: str) -> tuple[str, str] | None:
    """WebDataset's (key, extension) of a member name; None for names it leaves out (no dot in
    the file name, or a top-level ``__name__``-style metadata file)."""
    folder, _, base = name.rpartition("/")
    if "." not in base or (not folder and base.startswith("__")):
        return None
    stem, extension = base.split(".", 1)
    if not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), extension


def _build_tar_index(source: ByteSource) -> dict[str, np.ndarray]:
    """The index of a shard: its samples' keys, and for each member (sample after sample)
    its extension, offset and size, and where its data is in ``inline_blob`` (-1: not
    there, read it from the file)."""
    scan = _TarScan(source).run()
    if scan.stopped_at == 0 and not scan.members:  # nothing to read: say so at once
        reason = scan.reason if scan.reason.startswith("truncated") else \
            f"not a tar file ({scan.reason})"
        raise FormatError(reason, path=source.path, offset=0)
    keys, first, extensions, offsets, sizes, inline_at, inline = [], [], [], [], [], [], []
    kept = 0
    for member in scan.members:
        parts = _split_name(member.name)
        if parts is None:
            continue
        if not keys or keys[-1] != parts[0]:
            keys.append(parts[0])
            first.append(len(offsets))
        extensions.append(parts[1])
        offsets.append(member.offset)
        sizes.append(member.size)
        inline_at.append(-1 if member.data is None else kept)
        if member.data is not None:
            inline.append(member.data)
            kept += len(member.data)
    first.append(len(offsets))
    ends = np.array(offsets, np.int64) + np.array(sizes, np.int64)
    starts = np.array(offsets, np.int64)[first[:-1]] if keys else np.zeros(0, np.int64)
    stops = np.maximum.reduceat(ends, first[:-1]) if keys else np.zeros(0, np.int64)
    damaged = -1
    if scan.stopped_at is not None:
        damaged, keys, starts, stops, first = _with_damage(scan, source, keys, starts, stops, first)
    spans = _checked_spans(np.array([m.offset for m in scan.members], np.int64),
                           np.array([m.size for m in scan.members], np.int64), source.size)
    return {**_arrays("key", keys), **_arrays("ext", extensions), **_arrays("reason", [scan.reason]),
            "first": np.array(first, np.int64), "offsets": np.array(offsets, np.int64),
            "sizes": np.array(sizes, np.int64), "starts": starts, "stops": stops,
            "inline_at": np.array(inline_at, np.int64),
            "inline_blob": np.frombuffer(b"".join(inline), np.uint8),
            "damaged": np.array([damaged], np.int64),
            **pin_index(source, spans)}


def _checked_spans(offsets: np.ndarray, sizes: np.ndarray, size: int) -> np.ndarray:
    """The ``(start, stop)`` of the bytes whose digest ties an index to its shard: the first
    and last blocks of the file, and the header and first data block of up to 16 members, the
    first and last among them (their names, sizes and tiny members' data, which the index
    keeps)."""
    return checked_spans(size, _BLOCK, offsets - _BLOCK, offsets + np.minimum(sizes, _BLOCK))


def _with_damage(scan: _TarScan, source: ByteSource, keys: list, starts: np.ndarray,
                 stops: np.ndarray, first: list) -> tuple:
    """The sample that the damage cuts: the last one if the cut member belongs to it (or the
    cut member is unknown: then the last sample may lack members, and is not handed out as
    whole), else a new sample, without members, standing for what was lost."""
    parts = _split_name(scan.cut) if scan.cut is not None else None
    if keys and (parts is None or parts[0] == keys[-1]):
        return len(keys) - 1, keys, starts, stops, first
    key = parts[0] if parts is not None else f"{source.name}:damaged"
    at = np.array([scan.stopped_at], np.int64)
    return (len(keys), [*keys, key], np.concatenate([starts, at]), np.concatenate([stops, at]),
            [*first, first[-1]])


def _arrays(name: str, strings: list[str]) -> dict[str, np.ndarray]:
    blob, ends = strings_to_arrays(strings)
    return {f"{name}_blob": blob, f"{name}_ends": ends}


class TarReader(SpanReader):
    """One WebDataset tar shard, with the reader API: sample ``i`` is
    ``{"key": ..., <extension>: bytes, ...}``.

    The first open reads the tar headers (not the members' data) and keeps the index in the
    cache folder (``remote.cache_dir``, default that of :mod:`fpipe.remote.urls`), keyed by the
    file's path, size, modification and change times and inode; later opens check it against
    a digest of a few of the shard's headers (a few reads), and every DataLoader worker loads
    it. ``fields`` chooses the extensions to read, and a sample that lacks one raises
    :class:`~fpipe.errors.FormatError` naming the file, the sample and the field.
    ``decode=True`` turns the extensions that WebDataset's default decoders know into values
    (:func:`decode_field`); the others stay bytes.

    Damage is found where it is: a shard cut off in a member, or a header that is not one,
    keeps the samples before it readable, and the sample it cuts raises FormatError (file,
    sample, byte offset) when it is read, as does a sample with a member name twice.

    ``path`` may be a URL (``s3://``, ``https://``, any fsspec scheme): ``remote`` takes the
    :class:`~fpipe.remote.urls.RemoteOptions` that :class:`~fpipe.dataset.reader.MsgpackReader`
    takes, and the bytes come through the same block cache; building the index at a URL reads
    the shard once (its blocks stay in the cache).

    >>> import os, tempfile
    >>> pattern = os.path.join(tempfile.mkdtemp(), "s-%d.tar")
    >>> (path,) = write_webdataset([{"key": "a", "jpg": b"1"}, {"key": "b", "png": b"2"}], pattern)
    >>> reader = TarReader(path, fields=["jpg"])
    >>> reader[0]
    {'key': 'a', 'jpg': b'1'}
    >>> reader[1]
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: ...s-0.tar: sample 1 at byte 1536: sample 'b' has no field 'jpg' ...
    """

    @takes_remote
    def __init__(self, path: PathLike, *, fields: Sequence[str] | None = None,
                 decode: bool = False, remote: RemoteOptions | None = None) -> None:
        remote = check_remote(remote)
        self.decode = check_bool("decode", decode)
        self.fields = _check_fields(fields)
        self.source = ByteSource(path, remote)
        index = cached_index(self.source, _INDEX_KIND, lambda: _build_tar_index(self.source),
                             remote.cache_dir, self._fits)
        self._load(index)

    def _fits(self, index: dict[str, np.ndarray]) -> bool:
        """Whether a cached index fits the file (sizes are claims: checked before use)."""
        offsets, sizes, first = index["offsets"], index["sizes"], index["first"]
        starts, stops, ends = index["starts"], index["stops"], index["key_ends"]
        n, size = len(starts), self.source.size
        return bool(len(stops) == len(ends) == n == len(first) - 1 and len(offsets) == len(sizes)
                    and (offsets >= 0).all() and (sizes >= 0).all()
                    and (offsets + sizes <= size).all()
                    and (np.diff(first) >= 0).all() and (first[-1] == len(offsets))
                    and (starts <= stops).all() and (stops <= size).all()
                    and -1 <= int(index["damaged"][0]) < n
                    and _inline_fits(index["inline_at"], sizes, len(index["inline_blob"]))
                    and same_bytes(self.source, index))

    def _load(self, index: dict[str, np.ndarray]) -> None:
        offsets, sizes, first = index["offsets"], index["sizes"], index["first"]
        starts, stops = index["starts"], index["stops"]
        self._keys = KeyTable(index["key_blob"], index["key_ends"])
        self._first, self._offsets, self._sizes = first, offsets, sizes
        self._inline_at, self._inline = index["inline_at"], index["inline_blob"].tobytes()
        self._names, self._codes = _coded(strings_from_arrays(index["ext_blob"], index["ext_ends"]))
        self._views = _views(first, offsets, sizes, self._inline_at, self._codes)
        self._starts, self._stops = starts, stops
        damaged = int(index["damaged"][0])
        reason = strings_from_arrays(index["reason_blob"], index["reason_ends"])[0]
        self._damage = {damaged: reason} if damaged >= 0 else {}

    def __repr__(self) -> str:
        return f"TarReader({self.source.path!r})"

    def __getstate__(self) -> dict:
        return {name: value for name, value in self.__dict__.items() if name != "_views"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views = _views(self._first, self._offsets, self._sizes, self._inline_at, self._codes)

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        """Sample ``index``, each member read on its own (one copy of its bytes, not two), the
        tiny ones taken from the index."""
        if type(index) is not int or not 0 <= index < len(self._starts):
            index = self._index(index)
        if self._damage and index in self._damage:
            raise self._damaged(index)
        sample = self._sample(index, None, 0)
        if raw:
            sample = pack_sample(sample)
        return (self._keys[index], sample) if yield_key else sample

    def _decode(self, data: Any, index: int, offset: int) -> dict:
        return self._sample(index, data, offset)

    def _sample(self, index: int, data: Any, base: int) -> dict:
        """Sample ``index``, its members cut from ``data`` (the file's bytes from byte ``base``
        on), or read from the file when ``data`` is None; tiny members come from the index.
        One loop, without a call per member: ``get`` is this loop and a read."""
        first, offsets, sizes, inline_at, codes = self._views  # memoryviews: items are ints
        fields, names, inline, read = self.fields, self._names, self._inline, self.source.read
        sample: dict = {"key": self._keys[index]}
        for number in range(first[index], first[index + 1]):
            extension = names[codes[number]]
            if fields is not None and extension not in fields:
                continue
            if extension in sample:
                raise self._twice(sample["key"], extension, index)
            size, at, begin = sizes[number], inline_at[number], offsets[number]
            if at >= 0:
                sample[extension] = inline[at:at + size]
            elif data is not None:
                sample[extension] = bytes(data[begin - base:begin - base + size])
            else:
                sample[extension] = value = read(begin, begin + size)
                if len(value) != size:
                    raise self._truncated(index, int(self._starts[index]), begin + size)
        if fields is not None:
            self._check_fields(sample, index)
        return self._decoded(sample, index) if self.decode else sample

    def _twice(self, key: str, extension: str, index: int) -> FormatError:
        what = "the key field" if extension == "key" else "twice"
        return FormatError(f"member {key}.{extension} is {what} in the sample",
                           path=self.source.path, index=index, offset=int(self._starts[index]))

    def _decoded(self, sample: dict, index: int) -> dict:
        decoded = {"key": sample["key"]}
        for extension, value in sample.items():
            if extension == "key":
                continue
            try:
                decoded[extension] = decode_field(extension, value)
            except (ValueError, UnicodeDecodeError) as error:
                raise FormatError(f"field {extension!r} does not decode ({error})",
                                  path=self.source.path, index=index,
                                  offset=int(self._starts[index])) from None
        return decoded

    def _check_fields(self, sample: dict, index: int) -> None:
        missing = [field for field in self.fields if field not in sample]
        if missing:
            raise FormatError(f"sample {sample['key']!r} has no field {missing[0]!r} (fields="
                              f"{list(self.fields)!r}; it has {sorted(set(sample) - {'key'})})",
                              path=self.source.path, index=index, offset=int(self._starts[index]))


def _inline_fits(inline_at: np.ndarray, sizes: np.ndarray, blob_size: int) -> bool:
    """Whether the tiny members that an index keeps lie within its blob."""
    kept = inline_at >= 0
    return bool(len(inline_at) == len(sizes) and (sizes[kept] <= _INLINE_SIZE).all()
                and (inline_at[kept] + sizes[kept] <= blob_size).all())


def _coded(extensions: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """The distinct ``extensions`` (in the order they first come) and each one's number
    among them: no Python object per member, so forked workers reading a shard do not copy
    its index (a list of one string per member would be touched at each read)."""
    numbers: dict[str, int] = {}
    codes = np.array([numbers.setdefault(name, len(numbers)) for name in extensions], np.int64)
    return tuple(numbers), codes


def _views(*arrays: np.ndarray) -> tuple[memoryview, ...]:
    return tuple(memoryview(np.require(array, np.int64, ["C", "A"])) for array in arrays)


def _check_fields(fields: Any) -> tuple[str, ...] | None:
    if fields is None:
        return None
    if isinstance(fields, str) or not all(isinstance(field, str) for field in fields):
        raise TypeError(f"fields must be a list of extensions (str); got fields={fields!r:.80}")
    return tuple(fields)


class WebDatasetReader(ShardedReader):
    """WebDataset shards read as one dataset, in order: a path or URL, a brace pattern
    (``shards-{000..099}.tar``), a glob pattern (``data/*.tar``, or a URL with wildcards) or
    a list of these. Each shard is a :class:`TarReader` (the keywords go to each), so
    ``webdataset.WebDataset(urls)`` becomes ``WebDatasetReader(urls)``, with ``len``, random
    access, keys and fpipe's orderings and torch adapters.

    >>> import io, os, tarfile, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for shard in range(2):
    ...     with tarfile.open(os.path.join(folder, f"train-{shard:03d}.tar"), "w") as tar:
    ...         for i in range(3):
    ...             info = tarfile.TarInfo(f"{shard}-{i}.txt")
    ...             info.size = 1
    ...             tar.addfile(info, io.BytesIO(b"x"))
    >>> reader = WebDatasetReader(os.path.join(folder, "train-{000..001}.tar"))
    >>> len(reader), reader.find_key(4)
    (6, '1-1')
    """

    @takes_remote
    def __init__(self, urls: Union[PathLike, Iterable[PathLike]], *,
                 fields: Sequence[str] | None = None, decode: bool = False,
                 remote: RemoteOptions | None = None) -> None:
        remote = check_remote(remote)
        shards = expand_shards(urls, storage_options=remote.storage_options)
        super().__init__([TarReader(shard, fields=fields, decode=decode, remote=remote)
                          for shard in shards])

    def __repr__(self) -> str:
        return f"WebDatasetReader({len(self.readers)} shards, {len(self)} samples)"


# --- writing shards ----------------------------------------------------------------------------

def member_key(key: Any) -> str:
    """A sample key as WebDataset can carry it: a dot starts the extension, so dots in the
    key's file name become ``_``.

    >>> member_key("n01440764/n01440764_10026.JPEG")
    'n01440764/n01440764_10026_JPEG'
    """
    if not isinstance(key, str) or not key:
        raise TypeError(f"a WebDataset key must be a non-empty str; got key={key!r:.80}")
    folder, _, name = key.rpartition("/")
    name = name.replace(".", "_")
    return f"{folder}/{name}" if folder else name


class _TarShard:
    """One tar shard being written: members in WebDataset's layout, reproducibly (no times,
    owners or modes from the machine)."""

    def __init__(self, path: str) -> None:
        import tarfile

        self._tarfile = tarfile
        self.file = open(path, "wb")
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT)
        self.last_key: str | None = None

    @property
    def size(self) -> int:
        return self.file.tell()

    def write(self, sample: dict) -> None:
        if "key" not in sample:
            raise KeyError(f'samples must be dicts with a "key"; got {sample!r:.80}')
        key = member_key(sample["key"])
        if key == self.last_key:
            raise ValueError(f"keys {sample['key']!r} and the one before it are the same in "
                             "WebDataset (dots in a key's file name become '_')")
        self.last_key = key
        if len(sample) < 2:
            raise ValueError(f"sample {sample['key']!r} has no field besides its key; a WebDataset "
                             "sample is its members, and would be lost")
        for field, value in sample.items():
            if field == "key":
                continue
            if not isinstance(field, str) or not field or "/" in field:
                raise TypeError(f"field {field!r}: a WebDataset field name is a non-empty str "
                                "without '/' (it becomes the member's extension)")
            data = encode_field(field, value)
            info = self._tarfile.TarInfo(f"{key}.{field}")
            info.size, info.mode, info.mtime = len(data), 0o444, 0
            self.tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self.tar.close()
        self.file.close()

    def discard(self) -> None:
        self.file.close()


def write_webdataset(samples: Iterable[dict], pattern: PathLike, *, shard_size: int | None = None,
                     shard_bytes: int | None = None, rename: dict[str, str] | None = None,
                     overwrite: bool = False, inputs: Iterable[PathLike] = ()) -> list[str]:
    """Write ``samples`` as WebDataset tar shards named by ``pattern`` (one ``%d``-style field
    for the shard number, e.g. ``out/train-%06d.tar``), a new shard after ``shard_size``
    samples or once a shard holds ``shard_bytes`` bytes; returns the shard names.

    Each sample becomes members ``<key>.<field>`` (dots in the key's file name become ``_``):
    bytes as they are, and values whose type the field's extension encodes (``label.cls``
    an int, ``caption.txt`` a str, ``.json``, ``.npy``, ``.msgpack``; see
    :func:`encode_field`); ``rename`` renames fields first (``{"label": "cls"}``). Any other
    value raises :class:`TypeError` naming the field. Reading the shards back with
    ``decode=True`` gives the same samples. Nothing appears under the shard names unless all
    shards are written; existing shards are replaced only with ``overwrite``, and never one of
    ``inputs`` (the files the samples come from). The shards written are listed in a manifest
    beside them (``.PATTERN.shards.json``, written last); ``overwrite`` removes the shards of
    an earlier, longer export that its manifest lists, and nothing else.

    >>> import os, tempfile
    >>> pattern = os.path.join(tempfile.mkdtemp(), "train-%03d.tar")
    >>> samples = [{"key": f"s{i}", "jpg": b"...", "label": i} for i in range(5)]
    >>> [os.path.basename(p) for p in write_webdataset(samples, pattern, shard_size=2,
    ...                                                rename={"label": "cls"})]
    ['train-000.tar', 'train-001.tar', 'train-002.tar']
    >>> WebDatasetReader(pattern.replace("%03d", "*"), decode=True)[4]
    {'key': 's4', 'jpg': b'...', 'cls': 4}
    """
    chosen = (renamed(sample, rename) for sample in samples)
    return write_shards(chosen, pattern, _TarShard, shard_size, shard_bytes, overwrite, inputs)
