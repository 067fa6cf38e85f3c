"""Key hashing and the Bloom filter of the packed format: the salted 64-bit hashes of
``.key_hashes`` and the key index, with datadings's search for a salt under which they are
distinct, and the filter of ``.filter`` in simplebloom's format. Private: their public names
are :mod:`fpipe.dataset.format`'s.

>>> salt, hashes = hash_keys(["a", "b"])
>>> salt == key_salt(0), int(hashes[1]) == hash_key("b", salt)
(True, True)
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

__all__ = ["BLOOM_MAX_BYTES", "BloomFilter", "digests", "hash_key", "hash_keys", "key_salt",
           "salted_hashes"]

_OFFSET = np.dtype(">u8")
_MASK64 = (1 << 64) - 1


# --- key hashing -----------------------------------------------------------------------------

def key_salt(attempt: int) -> bytes:
    """The salt datadings tries at ``attempt``: the first 8 bytes of blake2s of its decimal.

    >>> key_salt(0).hex()
    '652e530edee5893b'
    """
    return hashlib.blake2s(str(attempt).encode()).digest()[:8]


def hash_key(key: str, salt: bytes) -> int:
    """The 64-bit hash of ``key``: blake2s salted with ``salt``, first 8 bytes, big-endian.

    >>> hash_key("a", key_salt(0)) == hash_key("a", key_salt(0)) != hash_key("a", key_salt(1))
    True
    """
    return int.from_bytes(hashlib.blake2s(key.encode(), salt=salt).digest()[:8], "big")


def digests(keys: Iterable[str], salt: bytes = b"") -> bytes:
    """The 32-byte blake2s digests of the keys, concatenated.

    >>> len(digests(["a", "b"]))
    64
    """
    # Copying a prepared hash object is cheaper than passing the salt for every key.
    new = hashlib.blake2s(salt=salt).copy

    def digest(key: str) -> bytes:
        state = new()
        state.update(key.encode())
        return state.digest()
    return b"".join(map(digest, keys))


def salted_hashes(keys: Iterable[str], salt: bytes) -> np.ndarray:
    """:func:`hash_key` of each key, as a uint64 array (not in ``__all__``: the index
    writers use it).

    >>> int(salted_hashes(["a"], key_salt(0))[0]) == hash_key("a", key_salt(0))
    True
    """
    return np.frombuffer(digests(keys, salt), dtype=_OFFSET)[::4].astype(np.uint64)


def hash_keys(keys: Sequence[str], max_tries: int = 1000) -> tuple[bytes, np.ndarray]:
    """Hash every key with the first salt (in datadings's order) that gives distinct hashes.

    Returns ``(salt, hashes)``, the hashes as a uint64 array in key order.

    >>> salt, hashes = hash_keys(["a", "b"])
    >>> salt == key_salt(0), hashes.dtype, int(hashes[1]) == hash_key("b", salt)
    (True, dtype('uint64'), True)
    """
    message = f"key hashes collide for {max_tries} salts; are the keys unique?"
    for attempt in range(max_tries):
        salt = key_salt(attempt)
        hashes = salted_hashes(keys, salt)
        ranked = np.sort(hashes)
        if not (ranked[1:] == ranked[:-1]).any():
            return salt, hashes
        if not attempt:
            _refuse_duplicates(keys, hashes, message)
    raise RuntimeError(message)


def _refuse_duplicates(keys: Sequence[str], hashes: np.ndarray, message: str) -> None:
    """Duplicate keys collide under every salt: say so at once, rather than after hashing
    every key with each of them."""
    order = np.argsort(hashes, kind="stable")
    ranked = hashes[order]
    for at in np.flatnonzero(ranked[1:] == ranked[:-1]).tolist():
        if keys[order[at]] == keys[order[at + 1]]:
            raise RuntimeError(f"{message} ({keys[order[at]]!r} is there twice)")


# --- the Bloom filter (simplebloom's file format) --------------------------------------------

_BLOOM_MAGIC = b"SIMPBLOO"
_BLOOM_HEADER = struct.Struct(">8sQQd")
_LN2 = 0.6931471805599453
_LN2_SQUARED = 0.4804530139182015
_BLOOM_BATCH = 1 << 15
_BLOOM_UNPACKED_MAX = 8 << 20
#: The most bytes of bits a Bloom filter that fpipe writes takes (see
#: :meth:`BloomFilter.for_count`): a writer holds it while it writes the index.
BLOOM_MAX_BYTES = 64 << 20


class BloomFilter:
    """A Bloom filter of strings, stored byte for byte as simplebloom stores it.

    Sized for ``num_elements`` with false-positive probability ``false_positive_prob``
    (default ``1 / num_elements``). Key ``k`` sets bits ``(h1 + i * h2) mod 2**64 mod
    num_bits`` for ``i < num_hashes``, where ``h1, h2`` are the first two big-endian
    uint64 of blake2s of its UTF-8 bytes.

    >>> bloom = BloomFilter.build(["cat", "dog"])
    >>> "cat" in bloom, "cow" in bloom
    (True, False)
    >>> BloomFilter.loads(bloom.dumps()).dumps() == bloom.dumps()
    True
    """

    def __init__(self, num_elements: int, false_positive_prob: float | None = None,
                 bits: bytes | None = None) -> None:
        if num_elements < 2:
            raise ValueError(f"num_elements must be >= 2; got num_elements={num_elements}")
        fpp = 1.0 / num_elements if false_positive_prob is None else float(false_positive_prob)
        if not 0 < fpp < 1:
            raise ValueError(f"false_positive_prob must be in (0, 1); got {fpp}")
        self.num_elements, self.false_positive_prob = num_elements, fpp
        self.num_bits = _bloom_bits(num_elements, fpp)
        self.num_hashes = int(round(self.num_bits / num_elements * _LN2))
        size = self.num_bits >> 3
        if bits is not None and len(bits) != size:
            raise ValueError(f"a filter of {num_elements} elements has {size} bytes; got {len(bits)}")
        self._bits = bytearray(size) if bits is None else bytearray(bits)
        self._unpacked: np.ndarray | None = None

    @classmethod
    def build(cls, keys: Sequence[str]) -> BloomFilter:
        """The filter fpipe writes for ``keys`` (:meth:`for_count` of their number).

        >>> "b" in BloomFilter.build(["a", "b"])
        True
        """
        bloom = cls.for_count(len(keys))
        bloom.update(keys)
        return bloom

    @classmethod
    def for_count(cls, n: int) -> BloomFilter:
        """An empty filter for ``n`` keys: datadings's, of ``max(2, n)`` elements at false
        positives ``1 / max(2, n)``, while it takes at most :data:`BLOOM_MAX_BYTES`; past
        about 14 million keys, one of that many bytes, with more false positives (its header
        says which; ``key in reader`` then looks the key up, so answers stay right).

        >>> BloomFilter.for_count(1000).num_bits == BloomFilter(1000).num_bits
        True
        >>> BloomFilter.for_count(10**9).num_bits // 8 <= BLOOM_MAX_BYTES
        True
        """
        elements = max(2, n)
        # sized before any is made: the filter of 1 / n false positives at 100M keys is 480 MB
        if _bloom_bits(elements, 1.0 / elements) // 8 <= BLOOM_MAX_BYTES:
            return cls(elements)
        # a byte short of the bound, so that rounding up stays within it
        return cls(elements, math.exp(-8 * (BLOOM_MAX_BYTES - 1) * _LN2_SQUARED / elements))

    def update(self, keys: Sequence[str]) -> None:
        """Add every key (vectorised over batches of keys). A filter of up to 8 MiB keeps its
        bits unpacked meanwhile, eight times its size, until it is read or dumped; a larger one
        sets them in place."""
        data = np.frombuffer(self._bits, np.uint8)
        if self._unpacked is None and len(data) <= _BLOOM_UNPACKED_MAX:
            self._unpacked = np.unpackbits(data, bitorder="little").view(bool)
        rounds = np.arange(self.num_hashes, dtype=np.uint64)
        for start in range(0, len(keys), _BLOOM_BATCH):
            h1, h2 = _bloom_hashes(keys[start:start + _BLOOM_BATCH])
            with np.errstate(over="ignore"):
                positions = ((h1[:, None] + rounds[None, :] * h2[:, None])
                             % np.uint64(self.num_bits)).ravel()
            if self._unpacked is not None:
                self._unpacked[positions] = True
            else:
                np.bitwise_or.at(data, (positions >> np.uint64(3)).astype(np.intp),
                                 np.left_shift(1, positions & np.uint64(7)).astype(np.uint8))

    def _packed(self) -> bytearray:
        if self._unpacked is not None:
            self._bits = bytearray(np.packbits(self._unpacked, bitorder="little").tobytes())
            self._unpacked = None
        return self._bits

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        try:
            data = key.encode()
        except UnicodeEncodeError:  # a lone surrogate: no key that UTF-8 can hold was added
            return False
        h1, h2 = struct.unpack_from(">QQ", hashlib.blake2s(data).digest())
        bits, num_bits = self._packed(), self.num_bits
        for i in range(self.num_hashes):
            position = ((h1 + i * h2) & _MASK64) % num_bits
            if not bits[position >> 3] & (1 << (position & 7)):
                return False
        return True

    def dumps(self) -> bytes:
        """The filter file: ``>8sQQd`` header (magic, total size, elements, fpp) and the bits."""
        bits = self._packed()
        header = _BLOOM_HEADER.pack(_BLOOM_MAGIC, _BLOOM_HEADER.size + len(bits),
                                    self.num_elements, self.false_positive_prob)
        return header + bytes(bits)

    def dump(self, path: Path) -> str:
        """Write the filter file (:meth:`dumps`) to ``path`` without a copy of its bits in
        memory; its MD5.

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "x.filter"
        >>> bloom = BloomFilter.build(["a"])
        >>> bloom.dump(path) == hashlib.md5(bloom.dumps()).hexdigest(), path.read_bytes() == bloom.dumps()
        (True, True)
        """
        bits = self._packed()
        header = _BLOOM_HEADER.pack(_BLOOM_MAGIC, _BLOOM_HEADER.size + len(bits),
                                    self.num_elements, self.false_positive_prob)
        with open(path, "wb") as file:
            file.write(header)
            file.write(bits)
        md5 = hashlib.md5(header)
        md5.update(bits)
        return md5.hexdigest()

    @classmethod
    def loads(cls, data: bytes) -> BloomFilter:
        """Read a filter from the bytes of a ``.filter`` file."""
        if len(data) < _BLOOM_HEADER.size:
            raise ValueError(f"a Bloom filter has a {_BLOOM_HEADER.size}-byte header; got {len(data)} bytes")
        magic, size, num_elements, fpp = _BLOOM_HEADER.unpack_from(data)
        if magic != _BLOOM_MAGIC or size != len(data):
            raise ValueError("not a simplebloom filter (bad magic or size)")
        return cls(num_elements, fpp, data[_BLOOM_HEADER.size:])


def _bloom_bits(num_elements: int, fpp: float) -> int:
    """The bits of a filter of ``num_elements`` at false positives ``fpp``: the same float
    arithmetic as simplebloom, so that sizes agree to the bit."""
    return int(math.ceil(num_elements * math.log(fpp) / -_LN2_SQUARED / 8) * 8)


def _bloom_hashes(keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    words = np.frombuffer(digests(keys), dtype=_OFFSET).reshape(-1, 4).astype(np.uint64)
    return words[:, 0], words[:, 1]
