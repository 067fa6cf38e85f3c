"""What every dataset writer shares: the write loop, staged output, class files, ordered workers.

A :class:`KnownDataset` turns its official sources into one packed dataset per split,
``<out>/<split>.msgpack``, with its class names beside it in ``<split>.msgpack.classes.json``.
Everything is written into a hidden staging folder inside ``<out>`` and renamed into place only
when every split is complete (:func:`fpipe.dataset._staging.staged_datasets`), so a failed run leaves no
half-written dataset under the output names.
"""

from __future__ import annotations

import errno
import io
import json
import os
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fpipe.dataset._staging import staged_datasets
from fpipe.dataset.class_lists import read_classes
from fpipe.dataset.format import DatasetFiles
from fpipe.errors import check_integer
from fpipe.random import Seed, item_rng
from fpipe.sets._fetch import Archive, check_base_url, fetch, shows_progress

__all__ = ["KnownDataset", "Records", "WriteOptions", "classes_path", "encode_png", "load_classes",
           "ordered_map"]

_CHUNK = 64


class Records(Protocol):
    """One split's source records: ``len(records)`` and ``records.sample(i)`` (a dict sample)."""

    def __len__(self) -> int: ...

    def sample(self, index: int) -> dict: ...


def classes_path(dataset: str | os.PathLike) -> Path:
    """Where the class names of the packed dataset ``dataset`` are stored.

    >>> classes_path("out/train.msgpack").as_posix()
    'out/train.msgpack.classes.json'
    """
    return DatasetFiles(dataset).classes


def load_classes(dataset: str | os.PathLike) -> dict[str, tuple[str, ...]]:
    """The class names stored beside the packed dataset ``dataset``, per label field.

    ``result[field][i]`` names the class of ``sample[field] == i``.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "train.msgpack")
    >>> _write_classes(classes_path(path), "toy", {"label": ("cat", "dog")})
    >>> load_classes(path)
    {'label': ('cat', 'dog')}
    """
    stored = read_classes(dataset)
    if stored is None:
        raise FileNotFoundError(errno.ENOENT, "no class names stored", str(classes_path(dataset)))
    return {field: tuple(names) for field, names in stored["classes"].items()}


def _write_classes(path: Path, dataset: str, classes: dict[str, tuple[str, ...]],
                   extra: dict | None = None) -> None:
    content = {"dataset": dataset, "classes": {field: list(names) for field, names in classes.items()},
               **(extra or {})}
    path.write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def encode_png(pixels: np.ndarray) -> bytes:
    """``pixels`` (H×W grey or H×W×3 RGB, uint8) as PNG bytes (zlib's default level: Pillow's
    ``optimize`` takes four times as long for a few percent).

    >>> encode_png(np.zeros((2, 2), np.uint8))[:8]
    b'\\x89PNG\\r\\n\\x1a\\n'
    """
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, "PNG")
    return buffer.getvalue()


def ordered_map(function: Callable[[Any], Any], items: Sequence, workers: int = 1,
                chunk_size: int = _CHUNK) -> Iterator:
    """``map(function, items)`` on ``workers`` threads, in input order, a few chunks ahead.

    An exception in ``function`` is raised in the consumer with its traceback; closing the
    iterator early cancels the chunks not yet started.

    >>> list(ordered_map(abs, range(-3, 3), workers=2, chunk_size=2))
    [3, 2, 1, 0, 1, 2]
    """
    if workers == 1:
        yield from map(function, items)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="fpipe-sets")
    pending: deque[Future] = deque()
    try:
        for start in range(0, len(items), chunk_size):
            pending.append(pool.submit(_map_list, function, items[start:start + chunk_size]))
            if len(pending) > 2 * workers:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _map_list(function: Callable[[Any], Any], items: Iterable) -> list:
    return [function(item) for item in items]


@dataclass(frozen=True)
class WriteOptions:
    """The arguments of one :meth:`KnownDataset.write`, checked, as a family's hooks
    (``_open``, ``_fetch``, ...) receive them.

    >>> WriteOptions(("train",), False, None, True, False, 1, False, 0, None).splits
    ('train',)
    """

    splits: tuple[str, ...]
    download: bool
    base_url: str | None
    verify: bool
    overwrite: bool
    workers: int
    shuffle: bool
    seed: Seed
    progress: bool | None


@dataclass(frozen=True)
class KnownDataset(ABC):
    """A well-known dataset that fpipe writes from its official sources.

    ``name`` is its command-line name, ``splits`` the packed datasets it writes,
    ``archives`` the official files (with md5 and download URL), ``fields`` the keys of every
    sample and ``CLASSES`` the class names, in label order. Families subclass it and supply
    ``_open`` (locate and open the sources) and ``_records`` (one split's records).
    """

    name: str
    splits: tuple[str, ...]
    archives: tuple[Archive, ...]
    CLASSES: tuple[str, ...]
    fields: tuple[str, ...] = ("key", "image", "label")

    def classes(self) -> dict[str, tuple[str, ...]]:
        """The class names of each label field, as stored beside every written split.

        >>> from fpipe.sets import mnist
        >>> mnist.classes()["label"][:3]
        ('0', '1', '2')
        """
        return {"label": self.CLASSES}

    def write(self, out: str | os.PathLike, source: str | os.PathLike | None = None, *,
              splits: Sequence[str] | None = None, download: bool = False,
              base_url: str | None = None, verify: bool = True, overwrite: bool = False,
              workers: int = 1, shuffle: bool = False, seed: Seed = 0,
              progress: bool | None = None) -> dict[str, Path]:
        """Write ``<out>/<split>.msgpack`` for each split from the sources in ``source``.

        ``source`` (default ``out``) is the folder holding the official archives; missing
        ones are downloaded there when ``download`` (from ``base_url`` instead of the official
        location when given). Each archive's md5 is checked (``verify=False`` skips it for
        files already present). Existing output raises :class:`FileExistsError` unless
        ``overwrite``. Samples keep the source order unless ``shuffle``, which permutes each
        split by ``seed``; ``workers`` threads encode images without changing the order.
        ``progress`` shows bars on stderr (None: when it is a terminal). Returns the path of
        each written split.

        >>> import tempfile
        >>> from fpipe.sets import cifar10
        >>> cifar10.write(tempfile.mkdtemp())
        Traceback (most recent call last):
        ...
        FileNotFoundError: cifar-10-python.tar.gz not found in ...; download it from https://...
        """
        options = WriteOptions(self._chosen(splits), download, base_url, verify, overwrite,
                               _checked_workers(workers), shuffle, seed, progress)
        check_base_url(base_url)
        out = Path(out)
        source = Path(source) if source is not None else out
        targets = {split: out / f"{split}.msgpack" for split in options.splits}
        with staged_datasets(list(targets.values()), overwrite) as staged, ExitStack() as stack:
            opened = self._open(source, options, stack)
            for split, path in zip(options.splits, staged):
                self._write_split(self._records(opened, split), split, path, options)
        return targets

    def _chosen(self, splits: Sequence[str] | None) -> tuple[str, ...]:
        if splits is None:
            return self.splits
        chosen = (splits,) if isinstance(splits, str) else tuple(splits)
        if not chosen or any(split not in self.splits for split in chosen):
            raise ValueError(f"splits must be a non-empty subset of {self.splits}; "
                             f"got splits={splits!r}")
        return tuple(split for split in self.splits if split in chosen)

    def _fetch(self, archive: Archive, source: Path, options: WriteOptions) -> Path:
        return fetch(archive, source, download=options.download, base_url=options.base_url,
                     verify=options.verify, progress=options.progress)

    def _fetch_all(self, source: Path, options: WriteOptions) -> dict[str, Path]:
        """Every archive needed for the chosen splits, by file name."""
        return {archive.filename: self._fetch(archive, source, options)
                for archive in self.archives if archive.needed_for(options.splits)}

    @abstractmethod
    def _open(self, source: Path, options: WriteOptions, stack: ExitStack) -> Any:
        """Locate (or download) and open the sources of ``options.splits``; ``stack`` closes
        what stays open."""

    @abstractmethod
    def _records(self, opened: Any, split: str) -> Records:
        """The records of ``split`` from what :meth:`_open` returned."""

    def _order(self, split: str, count: int, options: WriteOptions) -> Sequence[int]:
        if not options.shuffle:
            return range(count)
        # One generator per split, keyed by its position, so writing one split alone gives
        # the same order as writing all of them.
        return item_rng(options.seed, 0, self.splits.index(split)).permutation(count)

    def _write_split(self, records: Records, split: str, path: Path, options: WriteOptions) -> None:
        from fpipe.dataset.writer import FileWriter

        order = self._order(split, len(records), options)
        samples = ordered_map(records.sample, order, options.workers)
        shown = shows_progress(options.progress)
        with FileWriter(path, progress=shown, disable=not shown, total=len(records),
                        desc=f"{self.name} {split}", unit="img") as writer:
            for sample in samples:
                writer.write(sample)
        _write_classes(classes_path(path), self.name, self.classes(), self._classes_extra())

    def _classes_extra(self) -> dict:
        return {}


def _checked_workers(workers: int) -> int:
    return check_integer("workers", workers, 1)
