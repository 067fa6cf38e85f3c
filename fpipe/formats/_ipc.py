"""Where the messages of an Arrow IPC file or stream lie, read from their headers alone: the
record batches (their bytes and numbers of rows) and the messages a batch needs to be decoded
by itself (the schema, the dictionaries before it). :func:`ipc_layout` reads a few hundred
bytes per record batch, never a batch's body.

An IPC stream is a run of messages: the schema, then dictionary batches and record batches.
Each message is a prefix (``0xFFFFFFFF`` and the length of its metadata; older writers leave
out the ``0xFFFFFFFF``), its metadata (a flatbuffer ``Message``: its kind, the length of its
body and, for a record batch, its number of rows) and its body; a prefix with a length of 0
ends the stream. An IPC file is ``ARROW1``, two bytes of padding, a stream, a flatbuffer
``Footer`` (among others, where each record batch is), the footer's length and ``ARROW1``.

Every offset and length read here is checked against the size of the file before it is used:
damage raises :class:`~fpipe.errors.FormatError` naming the file and the byte.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fpipe.errors import FormatError

__all__ = ["END_OF_STREAM", "IpcLayout", "ipc_layout"]

MAGIC = b"ARROW1"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_CONTINUATION = -1
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3  # the kinds of message (MessageHeader)
_BLOCK = struct.Struct("<qi4xq")  # a Footer's Block: offset, metaDataLength, bodyLength
_HEAD_BYTES = 1024  # read at once: a message's prefix and, most often, all its metadata

Read = Callable[[int, int], bytes]


class _Damaged(Exception):
    """A field of a flatbuffer that does not fit in its bytes (becomes a FormatError)."""


def _unpack(layout: str, data: bytes, at: int) -> int:
    if at < 0 or at + struct.calcsize(layout) > len(data):
        raise _Damaged(f"a field at byte {at} of {len(data)}")
    return struct.unpack_from(layout, data, at)[0]


class _Table:
    """A flatbuffer table at ``at`` in ``data``, each field checked against the bytes."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at
        self.vtable = at - _unpack("<i", data, at)
        size = _unpack("<H", data, self.vtable)
        if size < 4 or size % 2 or self.vtable + size > len(data):
            raise _Damaged(f"a vtable of {size} bytes at byte {self.vtable}")
        self.fields = (size - 4) // 2

    def _where(self, field: int) -> int | None:
        if field >= self.fields:
            return None
        offset = _unpack("<H", self.data, self.vtable + 4 + 2 * field)
        return self.at + offset if offset else None

    def scalar(self, field: int, layout: str, default: int = 0) -> int:
        where = self._where(field)
        return default if where is None else _unpack(layout, self.data, where)

    def _target(self, field: int) -> int | None:
        where = self._where(field)
        return None if where is None else where + _unpack("<I", self.data, where)

    def table(self, field: int) -> _Table | None:
        target = self._target(field)
        return None if target is None else _Table(self.data, target)

    def structs(self, field: int, size: int) -> list[bytes]:
        """The elements of a vector of structs of ``size`` bytes each."""
        target = self._target(field)
        if target is None:
            return []
        count = _unpack("<I", self.data, target)
        if target + 4 + count * size > len(self.data):
            raise _Damaged(f"a vector of {count} elements at byte {target}")
        return [self.data[at:at + size] for at in range(target + 4, target + 4 + count * size, size)]


def _root(data: bytes) -> _Table:
    return _Table(data, _unpack("<I", data, 0))


@dataclass(frozen=True)
class _Message:
    start: int
    stop: int
    kind: int
    rows: int


class _Messages:
    """The messages of a file, read by their headers: ``at(offset)`` is the message there."""

    def __init__(self, read: Read, size: int, path: str) -> None:
        self.read, self.size, self.path = read, size, path

    def damaged(self, reason: str, offset: int) -> FormatError:
        return FormatError(f"not a readable Arrow IPC file ({reason})", path=self.path,
                           offset=offset)

    def at(self, offset: int) -> _Message | None:
        """The message at ``offset``, or None at the end of the stream."""
        prefix = self.read(offset, offset + _HEAD_BYTES)
        if len(prefix) < 4:
            raise self.damaged("the file ends inside a message's prefix", offset)
        length, metadata = struct.unpack_from("<i", prefix)[0], offset + 4
        if length == _CONTINUATION:
            if len(prefix) < 8:
                raise self.damaged("the file ends inside a message's prefix", offset)
            length, metadata = struct.unpack_from("<i", prefix, 4)[0], offset + 8
        if length == 0:
            return None
        if length < 0 or metadata + length > self.size:
            raise self.damaged(f"a message claims {length} bytes of metadata; the file has "
                               f"{self.size}", offset)
        data = prefix[metadata - offset:metadata - offset + length]
        if len(data) < length:
            data = self.read(metadata, metadata + length)
        try:
            kind, body, rows = _header(data)
        except _Damaged as error:
            raise self.damaged(f"the metadata of a message is damaged: {error}", offset) from None
        stop = metadata + length + body
        if body < 0 or rows < 0 or stop > self.size:
            raise self.damaged(f"a message claims a body of {body} bytes and {rows} rows; "
                               f"the file has {self.size} bytes", offset)
        return _Message(offset, stop, kind, rows)


def _header(metadata: bytes) -> tuple[int, int, int]:
    """The kind of a message, the length of its body, and its number of rows (0 for a
    message that is not a record batch)."""
    message = _root(metadata)
    kind, body = message.scalar(1, "<B"), message.scalar(3, "<q")
    if kind != _RECORD_BATCH:
        return kind, body, 0
    batch = message.table(2)
    if batch is None:
        raise _Damaged("a record batch without its header")
    return kind, body, batch.scalar(0, "<q")


@dataclass(frozen=True)
class IpcLayout:
    """Where the parts of an Arrow IPC file or stream are.

    ``file_format`` tells an IPC file (whose footer lists its batches) from a stream.
    ``spans`` holds the ``(start, stop)`` bytes of each record batch's message, ``rows`` its
    number of rows. For a stream, ``schema`` is the span of the schema message,
    ``dictionaries`` the spans of the dictionary messages, and ``dictionaries_before[i]`` the
    number of them that come before batch ``i`` (those it may use)."""

    file_format: bool
    spans: np.ndarray
    rows: np.ndarray
    schema: tuple[int, int] = (0, 0)
    dictionaries: tuple[tuple[int, int], ...] = ()
    dictionaries_before: np.ndarray | None = None


def ipc_layout(read: Read, size: int, path: str) -> IpcLayout:
    """The layout of the Arrow IPC file or stream of ``size`` bytes that ``read(start, stop)``
    reads; FormatError naming ``path`` if its headers are damaged or claim bytes it lacks."""
    messages = _Messages(read, size, path)
    if read(0, len(MAGIC)) == MAGIC:
        return _file_layout(messages)
    return _stream_layout(messages)


def _stream_layout(messages: _Messages) -> IpcLayout:
    offset, found = 0, []
    while offset < messages.size:
        message = messages.at(offset)
        if message is None:
            break
        found.append(message)
        offset = message.stop
    if not found or found[0].kind != _SCHEMA:
        raise messages.damaged("a stream begins with its schema", 0)
    dictionaries, spans, rows, before = [], [], [], []
    for message in found[1:]:
        if message.kind == _DICTIONARY:
            dictionaries.append((message.start, message.stop))
        elif message.kind == _RECORD_BATCH:
            spans.append((message.start, message.stop))
            rows.append(message.rows)
            before.append(len(dictionaries))
        else:
            raise messages.damaged(f"a message of kind {message.kind} after the schema",
                                   message.start)
    return IpcLayout(False, np.array(spans, np.int64).reshape(-1, 2), np.array(rows, np.int64),
                     (found[0].start, found[0].stop), tuple(dictionaries),
                     np.array(before, np.int64))


def _file_layout(messages: _Messages) -> IpcLayout:
    size = messages.size
    trailer = messages.read(size - 10, size) if size >= 10 else b""
    if len(trailer) < 10 or trailer[4:] != MAGIC:
        raise messages.damaged("an IPC file ends with its footer's length and ARROW1", size)
    length = struct.unpack_from("<i", trailer)[0]
    start = size - 10 - length
    if length <= 0 or start < 8:
        raise messages.damaged(f"a footer of {length} bytes in a file of {size}", size - 10)
    try:
        blocks = _root(messages.read(start, size - 10)).structs(3, _BLOCK.size)
    except _Damaged as error:
        raise messages.damaged(f"the footer is damaged: {error}", start) from None
    spans, rows = [], []
    for block in blocks:
        offset = _BLOCK.unpack(block)[0]
        message = messages.at(offset) if 0 <= offset < size else None
        if message is None or message.kind != _RECORD_BATCH:
            raise messages.damaged("the footer lists a record batch where there is none", offset)
        spans.append((message.start, message.stop))
        rows.append(message.rows)
    return IpcLayout(True, np.array(spans, np.int64).reshape(-1, 2), np.array(rows, np.int64))
