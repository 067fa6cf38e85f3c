"""Several datasets read as one: :class:`ShardedReader`, over a glob pattern (local or a URL
with wildcards) or a list of paths, URLs and readers.

>>> from fpipe.storage import ListReader
>>> len(ShardedReader([ListReader([{"key": "a"}]), ListReader([{"key": "b"}])]))
2
"""

from __future__ import annotations

import errno
import glob
import os
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Union

import numpy as np

from ..errors import redacted_url
from .base import Reader
from .format import PathLike
from .reader import MsgpackReader

__all__ = ["ShardedReader"]


class ShardedReader(Reader):
    """Several datasets read as one, in order: a glob pattern (sorted matches) or a list of
    paths and readers.

    >>> from fpipe.storage import ListReader
    >>> first, second = ListReader([{"key": "a"}]), ListReader([{"key": "b"}, {"key": "c"}])
    >>> sharded = ShardedReader([first, second])
    >>> len(sharded), sharded.find_index("c"), [s["key"] for s in sharded.iter(0, 2)]
    (3, 2, ['a', 'b'])

    Shards may be URLs, and a pattern may be a URL with wildcards (``s3://b/train-*.msgpack``);
    the keywords go to each :class:`MsgpackReader` made from a path or URL.
    """

    def __init__(self, shards: Union[PathLike, Iterable[Union[PathLike, Reader]]], *,
                 storage_options: dict | None = None, cache_dir: PathLike | None = None,
                 cache_limit: int | None = None, block_size: int | None = None,
                 read_ahead: int | None = None, retries: int | None = None,
                 timeout: float | None = None) -> None:
        options = {"storage_options": storage_options, "cache_dir": cache_dir,
                   "cache_limit": cache_limit, "block_size": block_size, "read_ahead": read_ahead,
                   "retries": retries, "timeout": timeout}
        if isinstance(shards, (str, os.PathLike)):
            pattern = os.fspath(shards)
            shards = _matches(pattern, storage_options)
            if not shards:
                raise FileNotFoundError(errno.ENOENT, "no dataset matches the pattern",
                                        redacted_url(pattern))
        self.readers = [_as_reader(shard, options) for shard in shards]
        self._starts = [0]
        for reader in self.readers:
            self._starts.append(self._starts[-1] + len(reader))

    def __repr__(self) -> str:
        return f"ShardedReader({self.readers!r})"

    def __len__(self) -> int:
        return self._starts[-1]

    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    def __contains__(self, key: object) -> bool:
        return any(key in reader for reader in self.readers)

    def _locate(self, index: int) -> tuple[Reader, int]:
        shard = bisect_right(self._starts, index) - 1
        return self.readers[shard], index - self._starts[shard]

    def find_key(self, index: int) -> Any:
        reader, local = self._locate(self._index(index))
        return reader.find_key(local)

    def find_index(self, key: Any) -> int:
        for start, reader in zip(self._starts, self.readers):
            if key in reader:
                return start + reader.find_index(key)
        raise KeyError(key)

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        reader, local = self._locate(self._index(index))
        return reader.get(local, yield_key, raw, copy)

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[Reader, int, int]]:
        for first, end, reader in zip(self._starts, self._starts[1:], self.readers):
            if first < stop and start < end:
                yield reader, max(start, first) - first, min(stop, end) - first

    def get_slice(self, start: int | None, stop: int | None, yield_key: bool = False,
                  raw: bool = False, copy: bool = True) -> list:
        start, stop, _ = slice(start, stop).indices(len(self))
        return [sample for reader, a, b in self._pieces(start, stop)
                for sample in reader.get_slice(a, b, yield_key, raw, copy)]

    def _chunks(self, start: int, stop: int, yield_key: bool, raw: bool, copy: bool,
                chunk_size: int) -> Iterator:
        for reader, a, b in self._pieces(start, stop):
            yield from reader.iter(a, b, yield_key, raw, copy, chunk_size)

    def prefetch(self, indices: Sequence[int]) -> None:
        """Pass each shard the indices of ``indices`` that fall in it (see
        :meth:`~fpipe.storage.reader.MsgpackReader.prefetch`)."""
        positions = np.asarray(indices, dtype=np.int64)
        shard_of = np.searchsorted(self._starts, positions, side="right") - 1
        for shard, reader in enumerate(self.readers):
            mine = positions[shard_of == shard]
            if mine.size:
                reader.prefetch(mine - self._starts[shard])


def _matches(pattern: str, storage_options: dict | None) -> list[str]:
    if isinstance(pattern, str) and "://" in pattern:
        from .remote import glob_urls

        return glob_urls(pattern, storage_options)
    return sorted(glob.glob(pattern))


def _as_reader(shard: Union[PathLike, Reader], options: dict) -> Reader:
    if isinstance(shard, Reader):
        return shard
    if isinstance(shard, (str, os.PathLike)):
        return MsgpackReader(shard, **options)
    raise TypeError(f"shards must be paths or readers; got {type(shard).__name__} {shard!r:.80}")
