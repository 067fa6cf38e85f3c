"""CRC-32C (Castagnoli), the checksum of TFRecord framing: the ``crc32c`` or ``google-crc32c``
package when one is installed (hardware instructions, about 10 GB/s), else a table-driven
fallback in NumPy for long buffers (about 150 MB/s) and Python for short ones (about 10 MB/s).

The fallback runs many lanes of the byte-at-a-time table algorithm side by side, one lane per
32-byte piece of the buffer, then folds the lanes' registers together with the linear maps
that pushing 32, 64, 128, ... zero bytes through the register applies (CRCs are linear over
GF(2)).

>>> crc32c(b"123456789") == 0xE3069283 == python_crc32c(b"123456789") == numpy_crc32c(b"123456789")
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["crc32c", "masked_crc32c", "numpy_crc32c", "python_crc32c"]

_POLY = 0x82F63B78  # the Castagnoli polynomial, bit-reflected
_LANE = 32
_SHORT = 2048  # buffers up to this long go through the Python loop (as fast there)


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _byte_table()
_TABLE_LIST = _TABLE.tolist()


def _register(register: int, data: Any) -> int:
    """The raw CRC register after ``data``, from ``register`` (no pre- or post-inversion)."""
    table = _TABLE_LIST
    for byte in bytes(data):
        register = table[(register ^ byte) & 0xFF] ^ (register >> 8)
    return register


def python_crc32c(data: Any) -> int:
    """CRC-32C of ``data`` with a Python loop (fast enough for a few hundred bytes).

    >>> hex(python_crc32c(b""))
    '0x0'
    """
    return _register(0xFFFFFFFF, data) ^ 0xFFFFFFFF


def _apply(columns: list[int], value: int) -> int:
    result, bit = 0, 0
    while value:
        if value & 1:
            result ^= columns[bit]
        value >>= 1
        bit += 1
    return result


def _shift_tables(levels: int) -> list[np.ndarray]:
    """For each level ``k``, the map "push ``32 * 2**k`` zero bytes through the register" as
    four byte-indexed tables (a linear map on 32 bits, looked up a byte at a time)."""
    columns = [_register(1 << bit, bytes(_LANE)) for bit in range(32)]
    tables = []
    for _ in range(levels):
        table = np.zeros((4, 256), np.uint32)
        for part in range(4):
            for value in range(256):
                table[part, value] = _apply(columns, value << (8 * part))
        tables.append(table)
        columns = [_apply(columns, column) for column in columns]  # the map applied twice
    return tables


_SHIFTS: list[np.ndarray] = []


def _fold(registers: np.ndarray) -> int:
    """The register of the whole buffer, from the registers of its lanes (each from zero)."""
    if not _SHIFTS:
        _SHIFTS.extend(_shift_tables(40))
    level = 0
    while len(registers) > 1:
        shift = _SHIFTS[level]
        left, right = registers[0::2], registers[1::2]
        registers = (shift[0][left & 0xFF] ^ shift[1][(left >> 8) & 0xFF]
                     ^ shift[2][(left >> 16) & 0xFF] ^ shift[3][left >> 24]) ^ right
        level += 1
    return int(registers[0])


def numpy_crc32c(data: Any) -> int:
    """CRC-32C of ``data`` with NumPy: many lanes at once (see the module docstring).

    >>> numpy_crc32c(bytes(1000)) == python_crc32c(bytes(1000))
    True
    """
    view = np.frombuffer(data, np.uint8)
    n = len(view)
    if n < 4:
        return python_crc32c(data)
    lanes = 1 << max(0, (-(-n // _LANE) - 1).bit_length())
    # zeros in front change nothing from a zero register; the initial register goes into the
    # first four bytes instead (the register meets the bytes by XOR)
    padded = np.zeros(lanes * _LANE, np.uint8)
    start = len(padded) - n
    padded[start:] = view
    padded[start:start + 4] ^= np.uint8(0xFF)
    columns = padded.reshape(lanes, _LANE).T.astype(np.uint32)
    registers = np.zeros(lanes, np.uint32)
    table = _TABLE
    for column in columns:
        registers = table[(registers ^ column) & 0xFF] ^ (registers >> 8)
    return _fold(registers) ^ 0xFFFFFFFF


def _fallback(data: Any) -> int:
    return python_crc32c(data) if len(data) <= _SHORT else numpy_crc32c(data)


def _fastest() -> Callable[[Any], int]:
    try:
        from crc32c import crc32c as fast  # the ``crc32c`` package

        return fast
    except ImportError:
        pass
    try:
        from google_crc32c import value as fast

        return lambda data: fast(bytes(data))
    except ImportError:
        return _fallback


_CHOSEN: list[Callable[[Any], int]] = []


def crc32c(data: Any) -> int:
    """CRC-32C of ``data``, by the fastest implementation installed (chosen at the first call,
    so that importing fpipe imports none of them).

    >>> hex(crc32c(b"a"))
    '0xc1d04330'
    """
    if not _CHOSEN:
        _CHOSEN.append(_fastest())
    return _CHOSEN[0](data)


def masked_crc32c(data: Any) -> int:
    """TFRecord's masked CRC-32C of ``data``: rotated right by 15 bits, plus a constant.

    >>> hex(masked_crc32c(b"\\x00" * 8))
    '0x7980329'
    """
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
