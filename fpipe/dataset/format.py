"""The packed dataset format: file layout, index files, key hashing and the sample codec.

A dataset ``X.msgpack`` is a data file of msgpack messages written back to back, one per
sample, plus index files next to it (``X.msgpack.offsets``, ``.keys``, ``.key_hashes``,
``.filter`` and ``.md5``), byte-compatible with datadings, and fpipe's ``.key_index`` (keys
and indices both ways, without loading; see ``fpipe.dataset.keyindex``), which datadings
ignores. ``docs/format.md`` specifies every
byte; this module reads and writes them. The files' names, how they are opened and the
``.md5`` file come from the private ``_files`` module, on which the index builder and the key
index stand too; they are re-exported here.

Samples pack the way datadings packs them: bin type for bytes, UTF-8 strings, numpy arrays
and scalars in the msgpack-numpy layout. Tuples come back as lists, and decoded arrays are
read-only views of the bytes they were decoded from, unless ``copy=True`` asks for writable
copies (what the readers' ``get(i)`` gives by default):

>>> import numpy as np
>>> sample = unpack_sample(pack_sample({"key": "a", "xy": (1, 2), "image": np.eye(2)}))
>>> sample["key"], sample["xy"], sample["image"].tolist(), sample["image"].flags.writeable
('a', [1, 2], [[1.0, 0.0], [0.0, 1.0]], False)
>>> unpack_sample(pack_sample({"image": np.eye(2)}), copy=True)["image"].flags.writeable
True
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from fpipe.dataset._indexing import IndexBuilder
from fpipe.dataset.keyindex import BLOOM_MAX_BYTES, BloomFilter, hash_key, hash_keys, key_salt
from fpipe.errors import FormatError
from fpipe.files import (
    DECODE_ERRORS,
    SUFFIX_CLASSES,
    SUFFIX_FILTER,
    SUFFIX_KEY_HASHES,
    SUFFIX_KEY_INDEX,
    SUFFIX_KEYS,
    SUFFIX_LEGACY_INDEX,
    SUFFIX_MD5,
    SUFFIX_OFFSETS,
    DatasetFiles,
    PathLike,
    md5_line,
    open_regular,
    read_md5,
    read_regular,
)

__all__ = [
    "BLOOM_MAX_BYTES",
    "BloomFilter",
    "DatasetFiles",
    "MAX_EMPTY_ITEMS",
    "SUFFIX_CLASSES",
    "SUFFIX_FILTER",
    "SUFFIX_KEYS",
    "SUFFIX_KEY_HASHES",
    "SUFFIX_KEY_INDEX",
    "SUFFIX_LEGACY_INDEX",
    "SUFFIX_MD5",
    "SUFFIX_OFFSETS",
    "corrupt_reason",
    "decode_numpy",
    "decode_numpy_copy",
    "encode_numpy",
    "hash_key",
    "hash_keys",
    "key_salt",
    "legacy_index_batches",
    "md5_file",
    "md5_line",
    "new_packer",
    "open_regular",
    "pack_sample",
    "read_key_hashes",
    "read_keys",
    "read_legacy_index",
    "read_md5",
    "read_offsets",
    "read_regular",
    "unpack_sample",
    "write_index",
]

_LEGACY_BATCH = 1 << 16  # entries of a legacy .index map read at a time

#: The most items an array of zero-byte items (dtype ``V0``, a structured dtype without fields)
#: may hold. Its data is empty whatever the count, so no byte count bounds it; a claimed
#: ``2**62`` would take years to copy.
MAX_EMPTY_ITEMS = 1024

_OFFSET = np.dtype(">u8")
_MAX_DTYPE_DEPTH = 32  # structured dtypes of real data nest a few levels deep
_MAX_DIMS = 64  # numpy 2's limit (numpy 1 allows 32, and refuses more itself)
_MASK64 = (1 << 64) - 1


# --- the sample codec ------------------------------------------------------------------------

def encode_numpy(obj: Any) -> Any:
    """msgpack ``default`` hook: numpy arrays and scalars, and complex numbers, as maps.

    The layout is msgpack-numpy's, so datadings reads what fpipe writes. Object arrays would
    need pickle and are refused.

    >>> sorted(encode_numpy(np.zeros(2, np.int16)))
    [b'data', b'kind', b'nd', b'shape', b'type']
    >>> encode_numpy(np.float32(1.5))
    {b'nd': False, b'type': '<f4', b'data': b'\\x00\\x00\\xc0?'}
    """
    if isinstance(obj, np.ndarray):
        return _encode_array(obj)
    if isinstance(obj, (np.bool_, np.number, np.datetime64, np.timedelta64)):
        return {b"nd": False, b"type": obj.dtype.str, b"data": obj.tobytes()}
    if isinstance(obj, complex):
        return {b"complex": True, b"data": repr(obj)}
    raise TypeError(f"cannot pack an object of type {type(obj).__name__}: {obj!r:.80}")


def _encode_array(array: np.ndarray) -> dict:
    if array.dtype.hasobject:
        raise TypeError(f"cannot pack an array of dtype {array.dtype}: object arrays need pickle")
    if array.dtype.itemsize == 0 and array.size > MAX_EMPTY_ITEMS:
        raise ValueError(f"cannot pack an array of {array.size} items of zero bytes (dtype "
                         f"{array.dtype}): the format allows at most {MAX_EMPTY_ITEMS}")
    if array.dtype.names is not None:
        kind, descr = b"V", array.dtype.descr
    else:
        kind, descr = b"", array.dtype.str
    # A flat uint8 view of a contiguous array packs as bin without a copy, for every dtype.
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    return {b"nd": True, b"type": descr, b"kind": kind, b"shape": array.shape, b"data": data}


def decode_numpy(obj: dict) -> Any:
    """msgpack ``object_hook``: turn maps in the msgpack-numpy layout back into numpy values.

    Arrays are read-only views of the decoded bytes. Other maps pass through unchanged.

    >>> decode_numpy({b"nd": False, b"type": "<i2", b"data": b"\\x07\\x00"})
    np.int16(7)
    >>> decode_numpy({"label": 3})
    {'label': 3}
    """
    if b"nd" in obj:
        return _decode_numpy_value(obj)
    if b"complex" in obj and b"data" in obj:
        return complex(_text(obj[b"data"]))
    return obj


def decode_numpy_copy(obj: dict) -> Any:
    """Like :func:`decode_numpy`, but arrays are writable copies (one copy per array).

    >>> image = decode_numpy_copy(encode_numpy(np.zeros(3, np.uint8)))
    >>> image[0] = 7
    >>> image.tolist()
    [7, 0, 0]
    """
    # the same tests as decode_numpy, not a call of it: this hook runs for every map
    if b"nd" in obj:
        value = _decode_numpy_value(obj)
        return value.copy() if type(value) is np.ndarray else value
    if b"complex" in obj and b"data" in obj:
        return complex(_text(obj[b"data"]))
    return obj


def _decode_numpy_value(obj: dict) -> Any:
    if b"type" not in obj or b"data" not in obj:
        return obj
    if obj[b"nd"] is not True:
        return _decode_scalar(_dtype(obj[b"type"]), obj[b"data"])
    kind = obj.get(b"kind", b"")
    if kind == b"O":
        raise ValueError("object arrays are pickled by msgpack-numpy; fpipe does not unpickle")
    if b"shape" not in obj:
        raise ValueError("an array without a shape")
    dtype, shape, data = _dtype(obj[b"type"]), obj[b"shape"], obj[b"data"]
    _check_array(shape, dtype, data)
    return np.ndarray(buffer=data, dtype=dtype, shape=shape)


def _decode_scalar(dtype: np.dtype, data: Any) -> Any:
    size = len(data) if type(data) is bytes else _byte_count(data)
    if size != dtype.itemsize or not size:
        raise ValueError(f"a numpy scalar of dtype {dtype} has {dtype.itemsize} bytes; "
                         f"its data has {size}")
    return np.frombuffer(data, dtype=dtype)[0]


def _check_array(shape: Any, dtype: np.dtype, data: Any) -> None:
    """The shape must be a list of sizes whose items the data holds exactly, before numpy sees
    it: a claimed size is checked against the bytes present, and zero-byte items against the
    format's bound. (Loops, not generators: this runs for every array read.)"""
    if (type(shape) is not list and type(shape) is not tuple) or len(shape) > _MAX_DIMS:
        raise ValueError(_shape_problem(shape))
    for size in shape:
        if type(size) is not int or size < 0:
            raise ValueError(_shape_problem(shape))
    count = math.prod(shape)  # Python ints: no overflow
    itemsize = dtype.itemsize
    if not itemsize and count > MAX_EMPTY_ITEMS:
        raise ValueError(f"an array of {count} items of zero bytes (dtype {dtype}); the format "
                         f"allows at most {MAX_EMPTY_ITEMS}")
    size = len(data) if type(data) is bytes else _byte_count(data)
    if count * itemsize != size:
        raise ValueError(f"an array of shape {list(shape)!r:.80} and dtype {dtype} holds "
                         f"{count * itemsize} bytes; its data has {size}")


def _shape_problem(shape: Any) -> str:
    if not isinstance(shape, (list, tuple)) or not all(type(size) is int for size in shape):
        return f"an array's shape is a list of ints; got {shape!r:.80}"
    if len(shape) > _MAX_DIMS:
        return f"an array of {len(shape)} dimensions; numpy allows {_MAX_DIMS}"
    return f"an array's shape has a negative size: {list(shape)!r:.80}"


def _byte_count(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        raise ValueError(f"numpy data is bytes (msgpack bin); got {type(data).__name__}") from None


def _dtype(descr: Any, depth: int = 0) -> np.dtype:
    if isinstance(descr, (list, tuple)):
        # a bound well below Python's recursion limit: corrupt bytes may nest lists 1024 deep
        if depth == _MAX_DTYPE_DEPTH:
            raise ValueError(f"a structured dtype nested more than {_MAX_DTYPE_DEPTH} deep")
        dtype = np.dtype([_field(field, depth + 1) for field in descr])
    else:
        dtype = np.dtype(_text(descr))
    if dtype.hasobject:
        # numpy would read the bytes as pointers to Python objects, and crash
        raise ValueError(f"dtype {dtype} holds Python objects, which bytes cannot carry")
    return dtype


def _field(field: Sequence, depth: int) -> tuple:
    name, sub, *shape = field
    name = tuple(map(_text, name)) if isinstance(name, (list, tuple)) else _text(name)
    shape = [tuple(s) if isinstance(s, list) else s for s in shape]
    return (name, _dtype(sub, depth), *shape)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def new_packer() -> msgpack.Packer:
    """A msgpack packer configured like datadings's (bin type, UTF-8, numpy support).

    >>> new_packer().pack({"key": "a"})
    b'\\x81\\xa3key\\xa1a'
    """
    return msgpack.Packer(default=encode_numpy, use_bin_type=True)


def pack_sample(sample: Any) -> bytes:
    """Pack one sample into one msgpack message.

    >>> pack_sample({"key": "a", "data": b"\\x00"})
    b'\\x82\\xa3key\\xa1a\\xa4data\\xc4\\x01\\x00'
    """
    return msgpack.packb(sample, default=encode_numpy, use_bin_type=True)


def unpack_sample(data: Any, *, path: Any = None, index: int | None = None,
                  offset: int | None = None, copy: bool = False) -> Any:
    """Decode one msgpack message; bytes that are not exactly one sample raise FormatError.

    Arrays are read-only views of ``data`` unless ``copy=True`` makes them writable copies.
    ``path``, ``index`` and ``offset`` only label the error. The unpacker's size limits are
    bounded by ``len(data)``, so a corrupt length prefix cannot allocate more than that.

    >>> unpack_sample(b"\\x81\\xa3key\\xa1a")
    {'key': 'a'}
    >>> unpack_sample(b"\\x81\\xa3key", path="x", index=3, offset=99)
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: x: sample 3 at byte 99: corrupt sample: Unpack failed: incomplete input; ...
    """
    try:
        return msgpack.unpackb(data, strict_map_key=False,
                               object_hook=decode_numpy_copy if copy else decode_numpy)
    except DECODE_ERRORS as error:
        raise FormatError(corrupt_reason(error, data), path=path, index=index,
                          offset=offset) from error


def corrupt_reason(error: BaseException | None, data: Any = None) -> str:
    """Why bytes are not one sample, saying what was found there (for a FormatError).

    >>> print(corrupt_reason(msgpack.ExtraData(49, b"abc"), b"1abc"))
    corrupt sample: not one msgpack message but an int followed by 3 more bytes; its bytes begin b'1abc'
    """
    if isinstance(error, msgpack.ExtraData):
        found = (f"not one msgpack message but {_article(type(error.unpacked).__name__)} "
                 f"followed by {len(error.extra)} more bytes")
    elif error is None:
        found = "its message does not end at the next offset"
    else:
        # msgpack's own FormatError (a byte that begins no msgpack type) has no message
        found = str(error) or f"not msgpack ({type(error).__name__})"
    head = "" if data is None else f"; its bytes begin {bytes(data[:16])!r}"
    return f"corrupt sample: {found}{head}"


def _article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


# --- index files -----------------------------------------------------------------------------

def read_offsets(path: PathLike) -> np.ndarray:
    """The sample offsets of a dataset as a uint64 array of ``n + 1`` entries.

    ``path`` is the data file; the ``.offsets`` file next to it is read.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> write_index(os.path.join(folder, "x.msgpack"), ["a", "b"], [0, 3, 7], "0" * 32)
    >>> read_offsets(os.path.join(folder, "x.msgpack")).tolist()
    [0, 3, 7]
    """
    offsets = DatasetFiles(path).offsets
    data = read_regular(offsets)
    if len(data) % 8 or not data:
        raise FormatError(f"an offsets file holds n + 1 uint64; got {len(data)} bytes", path=offsets)
    return np.frombuffer(data, dtype=_OFFSET).astype(np.uint64)


def read_keys(path: PathLike) -> list[str]:
    """All keys of a dataset, from the ``.keys`` file next to data file ``path``.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> write_index(os.path.join(folder, "x.msgpack"), ["a", "b"], [0, 3, 7], "0" * 32)
    >>> read_keys(os.path.join(folder, "x.msgpack"))
    ['a', 'b']
    """
    keys = DatasetFiles(path).keys
    data = read_regular(keys)
    try:
        found = msgpack.unpackb(data)
    except DECODE_ERRORS as error:
        raise FormatError(f"corrupt keys file ({error})", path=keys) from error
    if type(found) is not list:
        raise FormatError(f"a keys file holds one msgpack array of str; got "
                          f"{_article(type(found).__name__)}", path=keys)
    wrong = next((i for i, key in enumerate(found) if type(key) is not str), None)
    if wrong is not None:
        raise FormatError(f"key {wrong} is {found[wrong]!r:.40}, not a str", path=keys)
    return found


def read_key_hashes(path: PathLike) -> tuple[bytes, np.ndarray]:
    """The salt and uint64 key hashes of a dataset (the ``.key_hashes`` file).

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> write_index(os.path.join(folder, "x.msgpack"), ["a", "b"], [0, 3, 7], "0" * 32)
    >>> salt, hashes = read_key_hashes(os.path.join(folder, "x.msgpack"))
    >>> salt == key_salt(0), int(hashes[0]) == hash_key("a", salt)
    (True, True)
    """
    key_hashes = DatasetFiles(path).key_hashes
    data = read_regular(key_hashes)
    if len(data) < 8 or len(data) % 8:
        raise FormatError(f"a key hashes file holds a salt and n uint64; got {len(data)} bytes",
                          path=key_hashes)
    return data[:8], np.frombuffer(data, dtype=_OFFSET, offset=8).astype(np.uint64)


def read_legacy_index(path: PathLike) -> tuple[list[str], np.ndarray]:
    """Keys and ``n + 1`` offsets from a datadings < 3.1 ``.index`` map (the data size ends it),
    whole: :func:`legacy_index_batches` reads them a batch at a time.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> data = os.path.join(folder, "old.msgpack")
    >>> with open(data, "wb") as file:
    ...     _ = file.write(pack_sample({"key": "a"}) + pack_sample({"key": "b"}))
    >>> with open(data + ".index", "wb") as file:
    ...     _ = file.write(msgpack.packb({"a": 0, "b": 7}))
    >>> keys, offsets = read_legacy_index(data)
    >>> keys, offsets.tolist()
    (['a', 'b'], [0, 7, 14])
    """
    keys: list[str] = []
    starts = []
    for batch, batch_starts in legacy_index_batches(path):
        keys += batch
        starts.append(batch_starts)
    size = np.array([DatasetFiles(path).data.stat().st_size], np.uint64)
    return keys, np.concatenate([*starts, size])


def legacy_index_batches(path: PathLike, size: int | None = None
                         ) -> Iterator[tuple[list[str], np.ndarray]]:
    """The keys of a datadings < 3.1 ``.index`` map, in order, with the byte offset where each
    sample starts (uint64), ``size`` at a time (default 65,536): the map is read as it goes,
    so that no pass holds it whole. A file that is not one msgpack map from str to offset
    raises :class:`~fpipe.errors.FormatError` naming it, at the batch where that shows.

    >>> import tempfile, os
    >>> data = os.path.join(tempfile.mkdtemp(), "old.msgpack")
    >>> with open(data + ".index", "wb") as file:
    ...     _ = file.write(msgpack.packb({"a": 0, "b": 7, "c": 14}))
    >>> [(keys, starts.tolist()) for keys, starts in legacy_index_batches(data, 2)]
    [(['a', 'b'], [0, 7]), (['c'], [14])]
    """
    index, size = DatasetFiles(path).legacy_index, size or _LEGACY_BATCH
    with open_regular(index) as file:
        unpacker = msgpack.Unpacker(file, raw=False, strict_map_key=False, read_size=1 << 20)
        try:
            count = unpacker.read_map_header()
            for done in range(0, count, size):
                pairs = [(unpacker.unpack(), unpacker.unpack())
                         for _ in range(min(size, count - done))]
                starts = np.array([start for _, start in pairs], np.uint64)
                keys = [key for key, _ in pairs]
                if not all(isinstance(key, str) for key in keys):
                    raise ValueError("a key is not a str")
                yield keys, starts
            if unpacker.tell() != os.fstat(file.fileno()).st_size:
                raise msgpack.ExtraData(None, b"")  # "unpack(b) received extra data."
        except (msgpack.OutOfData, *DECODE_ERRORS) as error:
            raise FormatError(f"corrupt legacy index ({error})", path=index) from error


def md5_file(path: PathLike, read_size: int = 1 << 20, progress: bool = False) -> str:
    """The hexadecimal MD5 of a file, read in ``read_size`` blocks.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as file:
    ...     md5_file(file.name)
    'd41d8cd98f00b204e9800998ecf8427e'
    """
    md5 = hashlib.md5()
    with open_regular(path) as file, _byte_bar(path, progress) as bar:
        while block := file.read(read_size):
            md5.update(block)
            bar.update(len(block))
    return md5.hexdigest()


def _byte_bar(path: PathLike, progress: bool):
    from tqdm import tqdm

    return tqdm(total=os.stat(path).st_size, unit="B", unit_scale=True, disable=not progress,
                desc=Path(path).name, leave=False)


def write_index(path: PathLike, keys: Sequence[str], offsets: Any, data_md5: str) -> None:
    """Write the index files and the ``.md5`` file of data file ``path``.

    ``offsets`` holds ``len(keys) + 1`` byte offsets, the first 0; ``data_md5`` is the data
    file's MD5 (the writer hashes the data as it writes, so it is not read again). The index
    files are written beside it and renamed into place, ``.md5`` last; a key given twice raises
    :class:`ValueError` and changes nothing.

    >>> import tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> write_index(os.path.join(folder, "x.msgpack"), ["a"], [0, 5], "0" * 32)
    >>> sorted(name[9:] for name in os.listdir(folder))
    ['.filter', '.key_hashes', '.key_index', '.keys', '.md5', '.offsets']
    """
    files = DatasetFiles(path)
    offsets = np.asarray(offsets, dtype=np.uint64)
    if len(offsets) != len(keys) + 1 or (len(offsets) and offsets[0] != 0):
        raise ValueError(f"offsets must be len(keys) + 1 = {len(keys) + 1} offsets from 0; got "
                         f"{len(offsets)} from {offsets[0] if len(offsets) else None}")
    staging = Path(tempfile.mkdtemp(prefix=".fpipe-", dir=files.data.parent))
    try:
        builder = IndexBuilder(staging, files.data.name)
        builder.add(list(keys), np.diff(offsets))
        built = builder.finish()
        built.refuse_duplicates()
        built.commit(files, data_md5)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
