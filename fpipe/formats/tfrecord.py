"""Read and write TFRecord files of ``tf.train.Example`` without TensorFlow:
:class:`TFRecordFileReader` (one file), :class:`TFRecordReader` (a list, glob or brace pattern
of files, read as one :class:`~fpipe.dataset.sharded.ShardedReader`), :class:`TFRecordWriter`,
and the Example codec :func:`parse_example` / :func:`encode_example` (and
:func:`packable_example`, a parse ready for the packer).

A TFRecord file is a run of records, each framed as its length (8 bytes, little-endian), the
masked CRC-32C of the length, the data, and the masked CRC-32C of the data. fpipe parses the
framing and the Example protobuf itself (tested against the ``tfrecord`` package): the
Example message is small and frozen, so this costs no dependency on TensorFlow or protobuf and
its generated code. The layout that writers give an Example takes a short path (about 1.7x as
fast as protobuf's general rules, which the rest takes, and checked against them). The CRC-32C
comes from the ``crc32c`` package when it is installed (``pip install fpipe[tfrecord]``),
else from a slower fallback.

An Example is a map of feature name to a list of bytes, of float32 or of int64; fpipe reads
them as the ``tfrecord`` package does: a list of one bytes value as those bytes (several as a
list of bytes), float and int64 lists as NumPy arrays.
Bytes that writers never lay out so (a field twice, unknown fields, groups) are read by
protobuf's rules, as its Python package reads them: see :func:`parse_example`.

>>> import os, tempfile
>>> import numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "train.tfrecord")
>>> with TFRecordWriter(path) as writer:
...     writer.write({"image": b"\\xff\\xd8", "label": 3, "box": np.array([0.5, 0.25], np.float32)})
...     writer.write({"image": b"\\x89PNG", "label": 1, "box": np.zeros(2, np.float32)})
>>> reader = TFRecordFileReader(path)
>>> len(reader), reader[0]["image"], reader[0]["label"], reader[1]["box"]
(2, b'\\xff\\xd8', array([3]), array([0., 0.], dtype=float32))
>>> reader.find_key(1)
'train.tfrecord:1'
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np

from fpipe.dataset.format import PathLike
from fpipe.dataset.sharded import ShardedReader
from fpipe.errors import FormatError, check_bool
from fpipe.formats._crc32c import masked_crc32c
from fpipe.formats._foreign import (
    ByteSource,
    Scanner,
    SpanReader,
    cached_index,
    checked_spans,
    expand_shards,
    pin_index,
    same_bytes,
    strings_from_arrays,
    strings_to_arrays,
)
from fpipe.remote.urls import RemoteOptions, check_remote, takes_remote

__all__ = ["TFRecordFileReader", "TFRecordReader", "TFRecordWriter", "encode_example",
           "packable_example", "parse_example"]

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_INT64 = struct.Struct("<q")
_FRAME = _HEADER.size + _CRC.size
# The index's name in the cache: a new one when its arrays change, so old ones are rebuilt.
_INDEX_KIND = "tfrecord-2"
# An index in the cache is checked against the file at each open by a digest of bytes it was
# made from (``pin_index``): the file's first and last _CHECKED_EDGE bytes, and the 12-byte
# headers (length and its CRC) of up to 16 records spread over it (a file copied over another
# with ``cp -p`` keeps its size, modification time and inode, and its records may lie
# elsewhere).
_CHECKED_EDGE = 16
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_BYTES_LIST, _FLOAT_LIST, _INT64_LIST = 1, 2, 3


# --- the Example protobuf ----------------------------------------------------------------------

def _varint(data: bytes, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if position >= len(data):
            raise ValueError("a varint runs past the end of its message")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift >= 70:
            raise ValueError("a varint longer than 10 bytes")


def _length(data: bytes, position: int) -> tuple[int, int]:
    """The length at ``position`` and where its bytes end: a varint of at most 5 bytes, as
    protobuf reads lengths (a longer one, even of leading zeros, is not a message)."""
    length, end = _varint(data, position)
    if end - position > 5:
        raise ValueError("a length longer than 5 bytes")
    return length, end


def _tag(data: bytes, position: int) -> tuple[int, int]:
    """The tag at ``position`` and where it ends: a varint of at most 5 bytes and 32 bits, of
    a field number from 1 (protobuf refuses the others)."""
    byte = data[position]
    if byte < 0x80:
        end = position + 1
    else:
        byte, end = _varint(data, position)
        if end - position > 5 or byte >> 32:
            raise ValueError("a tag longer than 32 bits")
    if byte < 8:
        raise ValueError("field number 0, which no message has")
    return byte, end


def _span(data: bytes, position: int, stop: int) -> tuple[int, int]:
    """The ``(start, end)`` of the length-delimited value whose length is at ``position``."""
    first = data[position] if position < stop else 0x80
    if first < 0x80:  # most lengths fit in one byte, and most others in two
        start, end = position + 1, position + 1 + first
    elif position + 1 < stop and data[position + 1] < 0x80:
        start = position + 2
        end = start + ((first & 0x7F) | data[position + 1] << 7)
    else:
        length, start = _length(data, position)
        end = start + length
    if end > stop:
        raise ValueError("a field runs past the end of its message")
    return start, end


#: How deep protobuf lets messages and groups nest (the Example is at depth 0, a list at 4).
_MAX_DEPTH = 100
_START_GROUP, _END_GROUP = 3, 4


def _skip(data: bytes, position: int, stop: int, tag: int, depth: int) -> int:
    """Where the value of an unknown field with ``tag`` ends, in a message at ``depth``."""
    wire = tag & 7
    if wire == _VARINT:
        end = _varint(data, position)[1]
    elif wire == _LENGTH:
        end = _span(data, position, stop)[1]
    elif wire in (_FIXED64, _FIXED32):
        end = position + (8 if wire == _FIXED64 else 4)
    elif wire == _START_GROUP:
        end = _group_end(data, position, stop, tag >> 3, depth + 1)
    elif wire == _END_GROUP:
        raise ValueError(f"the end of a group {tag >> 3} that did not start")
    else:
        raise ValueError(f"field {tag >> 3} has wire type {wire}, which no field has")
    if end > stop:
        raise ValueError(f"field {tag >> 3} runs past the end of its message")
    return end


def _group_end(data: bytes, position: int, stop: int, number: int, depth: int) -> int:
    """Where the group of field ``number`` that starts at ``position`` ends (after its end
    tag): unknown fields to skip, as protobuf skips them."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"groups nested deeper than {_MAX_DEPTH}")
    while position < stop:
        tag, position = _tag(data, position)
        if tag & 7 == _END_GROUP:
            if tag >> 3 != number:
                raise ValueError(f"group {number} ends with the end of group {tag >> 3}")
            return position
        position = _skip(data, position, stop, tag, depth)
    raise ValueError(f"group {number} runs past the end of its message")


# tags (field number << 3 | wire type) of the fields an Example is made of
_FIRST_LENGTH, _SECOND_LENGTH, _THIRD_LENGTH = 0x0A, 0x12, 0x1A
_FIRST_VARINT, _FIRST_FIXED32 = 0x08, 0x0D


def parse_example(data: Any) -> dict:
    """The features of a serialized ``tf.train.Example``: a bytes list of one value as bytes
    (several as a list of bytes), float lists as float32 arrays, int64 lists as int64 arrays,
    a feature without a list as None. Bytes that are not an Example raise :class:`ValueError`.

    A field that comes twice merges as protobuf merges it: a name's last entry counts; lists
    of one kind in a feature add up, and a list of another kind replaces them. protobuf's
    Python package (upb) is the reference, and leaves out of the map an entry with a field
    that an entry does not have.

    >>> parse_example(encode_example({"a": 1, "b": 2}) + encode_example({"a": 3}))  # merged
    {'a': array([3]), 'b': array([2])}

    >>> parse_example(encode_example({"text": b"hi", "ids": [1, -2]}))
    {'text': b'hi', 'ids': array([ 1, -2])}
    """
    return _parsed(bytes(data), _COMMON_NUMBERS)


def packable_example(data: Any) -> dict:
    """The features of a serialized ``tf.train.Example`` as :func:`parse_example` gives them,
    but ready to pack: where the Example has the layout writers give it, its float and int64
    lists are the maps a packed dataset stores arrays as (:func:`~fpipe.dataset.format.encode_numpy`'s
    layout), made from the record's bytes with no array in between. Packed, both give the
    same bytes; ``fpipe write`` from TFRecord files packs these.

    >>> from fpipe.dataset import pack_sample
    >>> record = encode_example({"text": b"hi", "ids": [1, -2], "box": [0.5, 0.25]})
    >>> packable_example(record)["ids"][b"data"]
    b'\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\xfe\\xff\\xff\\xff\\xff\\xff\\xff\\xff'
    >>> pack_sample(packable_example(record)) == pack_sample(parse_example(record))
    True
    """
    return _parsed(bytes(data), _PACKABLE_NUMBERS)


def _parsed(data: bytes, numbers: dict) -> dict:
    try:
        features = _common_example(data, numbers)
    except (IndexError, ValueError):  # damaged: the general parser says how
        features = None
    return _any_example(data) if features is None else features


# --- the Example as writers lay it out -----------------------------------------------------------
# Writers (TensorFlow, the protobuf packages, the tfrecord package, fpipe) lay an Example out
# one way: map entries of a name then a feature, each feature one list, numbers packed. These
# functions parse that layout with few calls (a call costs about as much as the work of a
# field) and give up with None on anything else or on damage; the general parser below then
# reads it or says what is wrong. A property test holds the two to the same answers.

#: Feature names by their UTF-8 bytes: the same few in every record (bounded, see _name).
_NAMES: dict[bytes, str] = {}
_KNOWN_NAMES = 4096


def _common_example(data: bytes, numbers: dict) -> dict | None:
    if not data or data[0] != _FIRST_LENGTH:
        return None
    position, stop = _span(data, 1, len(data))  # Example.features, once
    if stop != len(data):
        return None
    features: dict = {}
    while position < stop:  # Features.feature: map entries
        # (lengths of one and two bytes are read in line: a call costs more than a field)
        length = data[position + 1]
        if length < 0x80:
            start = position + 2
        else:
            start, length = position + 3, length & 0x7F | data[position + 2] << 7
            if data[position + 2] >= 0x80:
                length, start = _length(data, position + 1)
        if data[position] != _FIRST_LENGTH or start + length > stop:
            return None
        position = start + length
        # a name (shorter than 128 bytes), then a feature
        name_end = start + 2 + data[start + 1]
        if (data[start] != _FIRST_LENGTH or data[start + 1] >= 0x80 or name_end >= position
                or data[name_end] != _SECOND_LENGTH):
            return None
        raw = data[start + 2:name_end]
        name = _NAMES.get(raw)
        value = _common_feature(data, name_end + 1, position, numbers)
        if value is None:
            return None
        features[_name(raw) if name is None else name] = value
    return features


def _common_feature(data: bytes, position: int, stop: int, numbers: dict) -> Any:
    """The value of the feature whose length is at ``position`` and which ends its map entry
    at ``stop``, if it is one list, its numbers read by the function of ``numbers`` for the
    list's tag; else None."""
    length = data[position]
    if length < 0x80:
        position += 1
    else:
        position, length = position + 2, length & 0x7F | data[position + 1] << 7
        if data[position - 1] >= 0x80:
            length, position = _length(data, position - 2)
    if position + length != stop:
        return None
    kind, length = data[position], data[position + 1]  # the list
    if length < 0x80:
        position += 2
    else:
        position, length = position + 3, length & 0x7F | data[position + 2] << 7
        if data[position - 1] >= 0x80:
            length, position = _length(data, position - 2)
    if position + length != stop:
        return None
    if kind != _FIRST_LENGTH:
        return numbers[kind](data, position, stop) if kind in numbers else None
    if position < stop and data[position] == _FIRST_LENGTH:  # a bytes list of one value?
        length = data[position + 1]
        if length < 0x80:
            start = position + 2
        else:
            start, length = position + 3, length & 0x7F | data[position + 2] << 7
            if data[position + 2] >= 0x80:
                length, start = _length(data, position + 1)
        if start + length == stop:
            return data[start:stop]
    return _common_bytes_list(data, position, stop)


def _name(raw: bytes) -> str:
    name = raw.decode("utf-8")
    if len(_NAMES) < _KNOWN_NAMES:
        _NAMES[raw] = name
    return name


def _common_bytes_list(data: bytes, position: int, stop: int) -> Any:
    items = []
    while position < stop:
        length = data[position + 1]
        if length < 0x80:
            start = position + 2
        else:
            start, length = position + 3, length & 0x7F | data[position + 2] << 7
            if data[position + 2] >= 0x80:
                length, start = _length(data, position + 1)
        if data[position] != _FIRST_LENGTH or start + length > stop:
            return None
        position = start + length
        items.append(data[start:position])
    return items[0] if len(items) == 1 else items


def _common_floats(data: bytes, position: int, stop: int) -> bytes | None:
    """The little-endian float32 values of a packed float list, as bytes."""
    if position == stop:
        return b""
    if data[position] != _FIRST_LENGTH:
        return None
    start, end = _span(data, position + 1, stop)
    return data[start:end] if end == stop and not (end - start) % 4 else None


def _common_int64s(data: bytes, position: int, stop: int) -> list[int] | None:
    """The values of a packed int64 list."""
    if position == stop:
        return []
    if data[position] != _FIRST_LENGTH:
        return None
    start, end = _span(data, position + 1, stop)
    return _packed_varints(data, start, end) if end == stop else None


def _common_float_list(data: bytes, position: int, stop: int) -> np.ndarray | None:
    floats = _common_floats(data, position, stop)
    # a copy: writable, and not holding on to the record's bytes
    return None if floats is None else np.frombuffer(floats, "<f4").astype(np.float32)


def _common_int64_list(data: bytes, position: int, stop: int) -> np.ndarray | None:
    values = _common_int64s(data, position, stop)
    return None if values is None else np.array(values, np.int64)


def _packable_float_list(data: bytes, position: int, stop: int) -> dict | None:
    floats = _common_floats(data, position, stop)
    return None if floats is None else _array_map("<f4", len(floats) // 4, floats)


def _packable_int64_list(data: bytes, position: int, stop: int) -> dict | None:
    if stop - position == 3 and data[position:position + 2] == b"\x0a\x01" and data[stop - 1] < 0x80:
        # one value below 128, as most labels are
        return {**_ONE_SMALL_INT64, b"data": _SMALL_INT64S[data[stop - 1]]}
    values = _common_int64s(data, position, stop)
    if values is None:
        return None
    if len(values) == 1:  # most int64 features: a label, a size, an id
        return _array_map("<i8", 1, _INT64.pack(values[0]))
    return _array_map("<i8", len(values), struct.pack(f"<{len(values)}q", *values))


_SMALL_INT64S = [_INT64.pack(value) for value in range(0x80)]


def _array_map(kind: str, length: int, data: bytes) -> dict:
    """A one-dimensional array of ``length`` values of dtype ``kind`` held in ``data``, as
    :func:`~fpipe.dataset.format.encode_numpy` gives it to the packer (the same keys, in the
    same order)."""
    return {b"nd": True, b"type": kind, b"kind": b"", b"shape": (length,), b"data": data}


_ONE_SMALL_INT64 = _array_map("<i8", 1, b"")
_COMMON_NUMBERS = {_SECOND_LENGTH: _common_float_list, _THIRD_LENGTH: _common_int64_list}
_PACKABLE_NUMBERS = {_SECOND_LENGTH: _packable_float_list, _THIRD_LENGTH: _packable_int64_list}


# --- any Example --------------------------------------------------------------------------------
# protobuf's rules for a field that comes more than once, which writers never do but
# concatenated messages do: Example.features (a message) merges; Features.feature (a map)
# keeps the last entry of a name; in an entry, the last name counts and the features merge;
# a feature's lists (a oneof of messages) merge while they are of one kind, and one of
# another kind replaces them; the values of a list add up. The depths are those of the
# messages (the Example at 0), which bound how deep unknown groups may nest.

def _any_example(data: bytes) -> dict:
    features: dict = {}
    position, stop = 0, len(data)
    while position < stop:
        tag, position = _tag(data, position)
        if tag == _FIRST_LENGTH:  # Example.features
            start, position = _span(data, position, stop)
            _features(data, start, position, features)
        else:
            position = _skip(data, position, stop, tag, 0)
    return features


def _features(data: bytes, position: int, stop: int, features: dict) -> None:
    while position < stop:
        tag, position = _tag(data, position)
        if tag == _FIRST_LENGTH:  # an entry of Features.feature, a map
            start, position = _span(data, position, stop)
            name, value, whole = _map_entry(data, start, position)
            if whole:
                features[name] = value
        else:
            position = _skip(data, position, stop, tag, 1)


def _map_entry(data: bytes, position: int, stop: int) -> tuple[str, Any, bool]:
    """The name and feature of a map entry, and whether it holds nothing else: protobuf
    (upb, which the ``protobuf`` package runs on) leaves an entry with other fields out of
    the map."""
    name, feature, whole = "", _Feature(), True
    while position < stop:
        tag, position = _tag(data, position)
        if tag == _FIRST_LENGTH:
            start, position = _span(data, position, stop)
            name = data[start:position].decode("utf-8")
        elif tag == _SECOND_LENGTH:
            start, position = _span(data, position, stop)
            feature.merge(data, start, position)
        else:
            position, whole = _skip(data, position, stop, tag, 2), False
    return name, feature.value(), whole


class _Feature:
    """A Feature as its serialized pieces merge into it: the tag of its list (None before
    any), and the list's values so far."""

    __slots__ = ("kind", "values")

    def __init__(self) -> None:
        self.kind: int | None = None
        self.values: list = []

    def merge(self, data: bytes, position: int, stop: int) -> None:
        while position < stop:
            tag, position = _tag(data, position)
            if tag in _LISTS:  # the oneof: a list of another kind replaces the one so far
                start, position = _span(data, position, stop)
                if tag != self.kind:
                    self.kind, self.values = tag, []
                _LISTS[tag](data, start, position, self.values)
            else:
                position = _skip(data, position, stop, tag, 3)

    def value(self) -> Any:
        """The feature as :func:`parse_example` gives it; None for a Feature without a list."""
        values = self.values
        if self.kind == _FIRST_LENGTH:
            return values[0] if len(values) == 1 else values
        if self.kind == _SECOND_LENGTH:
            # a copy: writable, and not holding on to the record's bytes
            return np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32)
        return None if self.kind is None else np.array(values, np.int64)


def _bytes_list(data: bytes, position: int, stop: int, items: list) -> None:
    while position < stop:
        tag, position = _tag(data, position)
        if tag == _FIRST_LENGTH:
            start, position = _span(data, position, stop)
            items.append(data[start:position])
        else:
            position = _skip(data, position, stop, tag, 4)


def _float_list(data: bytes, position: int, stop: int, parts: list) -> None:
    while position < stop:
        tag, position = _tag(data, position)
        if tag == _FIRST_LENGTH:  # packed
            start, position = _span(data, position, stop)
            if (position - start) % 4:
                raise ValueError("a packed float list whose length is not a multiple of 4")
            parts.append(np.frombuffer(data, "<f4", (position - start) // 4, start))
        elif tag == _FIRST_FIXED32:
            if position + 4 > stop:
                raise ValueError("a float runs past the end of its list")
            parts.append(np.frombuffer(data, "<f4", 1, position))
            position += 4
        else:
            position = _skip(data, position, stop, tag, 4)


def _int64_list(data: bytes, position: int, stop: int, values: list) -> None:
    while position < stop:
        tag, position = _tag(data, position)
        if tag == _FIRST_LENGTH:  # packed
            start, position = _span(data, position, stop)
            values.extend(_packed_varints(data, start, position))
        elif tag == _FIRST_VARINT:
            value, position = _varint(data, position)
            values.append(_int64(value))
        else:
            position = _skip(data, position, stop, tag, 4)
    if position > stop:
        raise ValueError("a varint runs past the end of its list")


def _packed_varints(data: bytes, start: int, stop: int) -> list[int]:
    """The int64 values of the packed varints ``data[start:stop]``."""
    piece = data[start:stop]
    if not piece or max(piece) < 0x80:  # values below 128: a byte each
        return list(piece)
    values, position = [], start
    while position < stop:
        value = data[position]
        if value < 0x80:
            position += 1
        elif position + 1 < stop and data[position + 1] < 0x80:  # below 16384: two bytes
            value, position = value & 0x7F | data[position + 1] << 7, position + 2
        else:
            value, position = _varint(data, position)
            value = _int64(value)
        values.append(value)
    if position != stop:
        raise ValueError("a packed varint runs past the end of its list")
    return values


def _int64(value: int) -> int:
    """The int64 a varint holds: its low 64 bits (as protobuf reads them), two's complement."""
    value &= 0xFFFFFFFFFFFFFFFF
    return value - (1 << 64) if value >> 63 else value


_LISTS = {_FIRST_LENGTH: _bytes_list, _SECOND_LENGTH: _float_list, _THIRD_LENGTH: _int64_list}


def _put_varint(out: bytearray, value: int) -> None:
    value &= 0xFFFFFFFFFFFFFFFF
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _put_field(out: bytearray, number: int, payload: bytes) -> None:
    _put_varint(out, number << 3 | _LENGTH)
    _put_varint(out, len(payload))
    out += payload


def _feature_bytes(name: str, value: Any) -> bytes:
    kind, payload = _feature_payload(name, value)
    feature = bytearray()
    _put_field(feature, kind, payload)
    return bytes(feature)


def _feature_payload(name: str, value: Any) -> tuple[int, bytes]:
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        value = [value]
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (str, bytes, bytearray, memoryview)) for v in value):
        out = bytearray()
        for item in value:
            _put_field(out, 1, item.encode("utf-8") if isinstance(item, str) else bytes(item))
        return _BYTES_LIST, bytes(out)
    return _number_payload(name, value)


def _number_payload(name: str, value: Any) -> tuple[int, bytes]:
    array = np.asarray(value) if value is not None else np.zeros(0, object)
    out = bytearray()
    if array.dtype.kind in "iub":
        if array.dtype.kind == "u" and array.size and int(array.max()) > 2**63 - 1:
            raise TypeError(f"feature {name!r}: values past the int64 range")
        packed = bytearray()
        for item in array.astype(np.int64).ravel().tolist():
            _put_varint(packed, item)
        _put_field(out, 1, bytes(packed))
        return _INT64_LIST, bytes(out)
    if array.dtype.kind == "f":
        _put_field(out, 1, array.astype("<f4").ravel().tobytes())
        return _FLOAT_LIST, bytes(out)
    raise TypeError(f"feature {name!r} holds {type(value).__name__}; an Example holds bytes, "
                    "str (as UTF-8 bytes), integers and floats, and lists or arrays of them")


def encode_example(features: Mapping[str, Any]) -> bytes:
    """A serialized ``tf.train.Example`` of ``features``: bytes (and str, as UTF-8) and lists of
    them become a bytes list; ints, bools and integer arrays an int64 list; floats and float
    arrays a float list (as float32). A value of another type raises :class:`TypeError`
    naming the feature.

    >>> parse_example(encode_example({"label": 3, "tags": ["a", "b"], "score": 0.5}))
    {'label': array([3]), 'tags': [b'a', b'b'], 'score': array([0.5], dtype=float32)}
    >>> encode_example({"when": None})
    Traceback (most recent call last):
    ...
    TypeError: feature 'when' holds NoneType; an Example holds bytes, str (as UTF-8 bytes), ...
    """
    entries = bytearray()
    for name, value in features.items():
        entry = bytearray()
        _put_field(entry, 1, str(name).encode("utf-8"))
        _put_field(entry, 2, _feature_bytes(name, value))
        _put_field(entries, 1, bytes(entry))
    example = bytearray()
    _put_field(example, 1, bytes(entries))
    return bytes(example)


# --- framing -----------------------------------------------------------------------------------

def frame_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord record."""
    length = struct.pack("<Q", len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


def _build_record_index(source: ByteSource, verify: bool) -> dict[str, np.ndarray]:
    starts, stops, position, reason = _record_spans(source, verify)
    damaged = -1
    if reason:
        damaged = len(starts)
        starts.append(position)
        stops.append(min(position + _HEADER.size, source.size))
    starts, stops = np.array(starts, np.int64), np.array(stops, np.int64)
    spans = checked_spans(source.size, _CHECKED_EDGE, starts,
                          np.minimum(starts + _HEADER.size, source.size))
    return {"starts": starts, "stops": stops,
            "damaged": np.array([damaged], np.int64), **dict(zip(
                ("reason_blob", "reason_ends"), strings_to_arrays([reason]))),
            **pin_index(source, spans)}


def _record_spans(source: ByteSource, verify: bool) -> tuple[list[int], list[int], int, str]:
    """The start and stop of every record found by reading their headers, where the reading
    stopped, and why, if it stopped before the end of the file."""
    scanner, starts, stops, position, size = Scanner(source), [], [], 0, source.size
    while position < size:
        header = scanner.take(position, position + _HEADER.size)
        if len(header) < _HEADER.size:
            return starts, stops, position, (f"truncated: a record header at byte {position} is "
                                             f"cut off at {size} bytes")
        length, crc = _HEADER.unpack(header)
        if verify and masked_crc32c(header[:8]) != crc:
            return starts, stops, position, _bad_length(source, position, header)
        stop = position + _FRAME + length
        if stop > size:
            return starts, stops, position, (f"truncated: the record ends at byte {stop} but the "
                                             f"file has {size} bytes")
        starts.append(position)
        stops.append(stop)
        position = stop
    return starts, stops, position, ""


def _bad_length(source: ByteSource, position: int, header: bytes) -> str:
    if position == 0 and header[:2] == b"\x1f\x8b":
        return ("the file is gzip-compressed; fpipe reads uncompressed TFRecord files "
                "(random access needs them): decompress it with gunzip")
    return "the CRC of the record's length does not match: not a TFRecord record, or damaged"


class TFRecordFileReader(SpanReader):
    """One TFRecord file of ``tf.train.Example`` records, with the reader API; sample ``i``
    is record ``i`` parsed by :func:`parse_example`.

    The first open reads each record's 12-byte header (checking its CRC) to index the record
    offsets, and keeps the index in the cache folder (``cache_dir``, default that of
    :mod:`fpipe.remote.urls`); later opens check it against a digest of the file's ends and
    of up to 16 record headers (a few reads), and DataLoader workers load it. Records have no
    keys: sample ``i`` of ``train.tfrecord`` has the key ``"train.tfrecord:i"``.

    ``features`` chooses the features to read; a record that lacks one raises
    :class:`~fpipe.errors.FormatError` naming the file, the record and the feature.
    ``verify=False`` skips the CRC checks. Damage raises FormatError (file, record, byte
    offset) when the record is read: a record whose data CRC does not match, or that is not
    an Example, alone; a record cut off at the end of the file, or whose length's CRC does not
    match, ends the records that can be found (those before it stay readable).

    ``path`` may be a URL, with the ``remote=RemoteOptions(...)`` of
    :class:`~fpipe.dataset.reader.MsgpackReader`
    (the bytes come through the same block cache). Gzip-compressed files are refused with a
    message: random access needs the records uncompressed.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
    >>> with TFRecordWriter(path) as writer:
    ...     writer.write({"text": b"a", "label": 1})
    ...     writer.write({"text": b"b"})
    >>> reader = TFRecordFileReader(path, features=["text", "label"])
    >>> reader[0]
    {'text': b'a', 'label': array([1])}
    >>> reader[1]
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: ...x.tfrecord: sample 1 at byte 49: the record has no feature 'label' ...
    """

    #: how a record's bytes become a sample (see :func:`packing_reader`)
    _parse = staticmethod(parse_example)

    @takes_remote
    def __init__(self, path: PathLike, *, features: Sequence[str] | None = None,
                 verify: bool = True, remote: RemoteOptions | None = None) -> None:
        remote = check_remote(remote)
        self.verify = check_bool("verify", verify)
        if features is not None and (isinstance(features, str) or not all(
                isinstance(name, str) for name in features)):
            raise TypeError(f"features must be a list of names (str); got features={features!r:.80}")
        self.features = None if features is None else tuple(features)
        self.source = ByteSource(path, remote)
        index = cached_index(self.source, f"{_INDEX_KIND}-{int(self.verify)}",
                             lambda: _build_record_index(self.source, self.verify),
                             remote.cache_dir, self._fits)
        self._load(index)

    def _fits(self, index: dict[str, np.ndarray]) -> bool:
        """Whether a cached index fits the file (sizes are claims: checked before use)."""
        starts, stops = index["starts"], index["stops"]
        return bool(len(starts) == len(stops) and (starts <= stops).all()
                    and (stops <= self.source.size).all() and (np.diff(starts) > 0).all()
                    and -1 <= int(index["damaged"][0]) < len(starts)
                    and same_bytes(self.source, index))

    def _load(self, index: dict[str, np.ndarray]) -> None:
        starts, stops = index["starts"], index["stops"]
        self._starts, self._stops, self._keys = starts, stops, None
        damaged = int(index["damaged"][0])
        reason = strings_from_arrays(index["reason_blob"], index["reason_ends"])[0]
        self._damage = {damaged: reason} if damaged >= 0 else {}

    def __repr__(self) -> str:
        return f"TFRecordFileReader({self.source.path!r})"

    def _decode(self, data: Any, index: int, offset: int) -> dict:
        payload = data[_HEADER.size:len(data) - _CRC.size]
        if self.verify:
            stored = _CRC.unpack_from(data, len(data) - _CRC.size)[0]
            if masked_crc32c(payload) != stored:
                raise FormatError("the CRC of the record's data does not match: the record is "
                                  "damaged", path=self.source.path, index=index, offset=offset)
        try:
            sample = self._parse(payload)
        except (ValueError, UnicodeDecodeError) as error:
            raise FormatError(f"not a tf.train.Example ({error})", path=self.source.path,
                              index=index, offset=offset) from None
        return sample if self.features is None else self._chosen(sample, index, offset)

    def _chosen(self, sample: dict, index: int, offset: int) -> dict:
        missing = [name for name in self.features if name not in sample]
        if missing:
            raise FormatError(f"the record has no feature {missing[0]!r} (features="
                              f"{list(self.features)!r}; it has {sorted(sample)})",
                              path=self.source.path, index=index, offset=offset)
        return {name: sample[name] for name in self.features}


class TFRecordReader(ShardedReader):
    """TFRecord files read as one dataset, in order: a path or URL, a brace pattern
    (``train-{00000..01023}-of-01024``), a glob pattern or a list of these; each file is a
    :class:`TFRecordFileReader` (the keywords go to each).

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for shard in range(2):
    ...     with TFRecordWriter(os.path.join(folder, f"part-{shard}.tfrecord")) as writer:
    ...         for i in range(3):
    ...             writer.write({"value": shard * 10 + i})
    >>> reader = TFRecordReader(os.path.join(folder, "part-*.tfrecord"))
    >>> len(reader), int(reader[4]["value"][0]), reader.find_key(4)
    (6, 11, 'part-1.tfrecord:1')
    """

    @takes_remote
    def __init__(self, paths: Union[PathLike, Iterable[PathLike]], *,
                 features: Sequence[str] | None = None, verify: bool = True,
                 remote: RemoteOptions | None = None) -> None:
        remote = check_remote(remote)
        files = expand_shards(paths, storage_options=remote.storage_options)
        super().__init__([TFRecordFileReader(path, features=features, verify=verify, remote=remote)
                          for path in files])

    def __repr__(self) -> str:
        return f"TFRecordReader({len(self.readers)} files, {len(self)} records)"


def packing_reader(reader: TFRecordFileReader | TFRecordReader) -> Any:
    """``reader``, set to give its samples as :func:`packable_example` parses them: for a
    writer that packs every sample and never looks at the numbers (``fpipe write``)."""
    for file_reader in reader.readers if isinstance(reader, ShardedReader) else [reader]:
        file_reader._parse = packable_example
    return reader


class TFRecordWriter:
    """Write ``tf.train.Example`` records (:func:`encode_example`) to a TFRecord file; the file
    appears under its name only when the writer closes without an error.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.tfrecord")
    >>> with TFRecordWriter(path) as writer:
    ...     writer.write({"text": "héllo"})
    >>> TFRecordFileReader(path)[0]["text"].decode()
    'héllo'
    """

    def __init__(self, path: PathLike, overwrite: bool = False) -> None:
        self.path = os.fspath(path)
        if os.path.exists(self.path) and not overwrite:
            raise FileExistsError(f"{self.path} exists; pass overwrite=True to replace it")
        self._temporary = f"{self.path}.{os.getpid()}.partial"
        self._file = open(self._temporary, "wb")
        self.written = 0

    def write(self, features: Mapping[str, Any]) -> None:
        """Append one Example."""
        self._file.write(frame_record(encode_example(features)))
        self.written += 1

    def write_record(self, data: bytes) -> None:
        """Append one record of any bytes (framed, with its CRCs)."""
        self._file.write(frame_record(bytes(data)))
        self.written += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            os.replace(self._temporary, self.path)

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, kind: Any, *exc_info: object) -> None:
        if kind is None:
            self.close()
        else:
            self._file.close()
            os.unlink(self._temporary)
