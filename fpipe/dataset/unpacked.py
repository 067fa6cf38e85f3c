"""Readers over samples that are not packed: a list of dicts in memory (:class:`ListReader`),
files on disk (:class:`DirectoryReader`) and the members of a zip file
(:class:`ZipFileReader`), with the reader API of :mod:`fpipe.dataset.base`.

>>> reader = ListReader([{"key": "a", "label": "x10"}, {"key": "b", "label": "x2"}])
>>> reader.labels, reader.get(0)["label"]
(['x2', 'x10'], 1)
"""

from __future__ import annotations

import glob
import os
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from fnmatch import fnmatch
from typing import Any, Union

from fpipe.dataset.base import Reader
from fpipe.dataset.format import PathLike, pack_sample

__all__ = ["DirectoryReader", "ListReader", "ZipFileReader"]


def _noop(sample: dict) -> None:
    """The default ``initfun``/``convertfun``: leave the sample as it is."""


class ListReader(Reader):
    """A reader over an indexable sequence of dict samples, held in memory.

    A sample without ``"key"`` gets its index as key (a duplicate key raises
    :class:`ValueError`). ``labels`` (a list, or a file with one label per line) fixes the
    label order; by default it is the natural sort of all ``"label"`` values. With
    ``numeric_labels`` a sample's ``"label"`` becomes its position in ``labels`` and the
    original is kept as ``"_label"``. ``initfun(sample)`` runs once per sample at
    construction; ``convertfun(sample)`` on a shallow copy at every ``get``.

    >>> reader = ListReader([{"label": "dog"}, {"label": "cat"}])
    >>> reader.labels, reader.get(0)
    (['cat', 'dog'], {'label': 1, 'key': 0, '_label': 'dog'})
    """

    def __init__(self, samples: Sequence[dict], labels: Union[Iterable, PathLike, None] = None,
                 numeric_labels: bool = True, initfun: Callable[[dict], Any] = _noop,
                 convertfun: Callable[[dict], Any] = _noop) -> None:
        self._samples, self._convertfun = samples, convertfun
        self._index_of: dict = {}
        for i, sample in enumerate(samples):
            initfun(sample)
            key = sample.setdefault("key", i)
            if key in self._index_of:
                raise ValueError(f"duplicate key {key!r}")
            self._index_of[key] = i
        self.labels = _labels(labels, samples, numeric_labels)
        self._numeric_labels = numeric_labels
        self._label_index = {}
        if numeric_labels:
            self._label_index = {str(label): i for i, label in enumerate(self.labels)}
            self._label_index.update((label, i) for i, label in enumerate(self.labels))

    def __len__(self) -> int:
        return len(self._samples)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._index_of
        except TypeError:
            return False

    def find_key(self, index: int) -> Any:
        return self._samples[self._index(index)]["key"]

    def find_index(self, key: Any) -> int:
        return self._index_of[key]

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True) -> Any:
        sample = dict(self._samples[self._index(index)])
        if self._numeric_labels and "label" in sample:
            sample["_label"] = sample["label"]
            sample["label"] = self._label_index[sample["label"]]
        self._convertfun(sample)
        key = sample["key"]
        if raw:
            sample = pack_sample(sample)
        return (key, sample) if yield_key else sample


def _labels(labels: Any, samples: Sequence[dict], numeric: bool) -> list:
    if isinstance(labels, (str, os.PathLike)):
        with open(labels, encoding="utf-8") as file:
            return [line.strip("\n ") for line in file]
    if labels:
        return list(labels)
    found = {sample["label"] for sample in samples if "label" in sample}
    if None in found:
        if numeric:
            raise ValueError("a sample has label None; pass labels= to use None as a label")
        found.discard(None)
    return sorted(found, key=natural_key)


def natural_key(value: Any) -> tuple:
    """Sort key that orders digit runs by value ("x2" < "x10"), like natsort's default."""
    if isinstance(value, (int, float)):
        return ("", value)
    parts = re.split(r"(\d+)", str(value))
    return tuple(int(part) if i % 2 else part for i, part in enumerate(parts))


class DirectoryReader(ListReader):
    """A reader over files on disk; the sample's ``"data"`` is the file's bytes, read at ``get``.

    Each pattern is a recursive glob in which a path component ``{LABEL}`` marks the label
    directory (``root/{LABEL}/**``), or a list file with lines ``path[<separator>label[...]]``
    (extra columns go to ``"_additional_info"``; relative paths are joined to ``root_dir``).
    ``include``/``exclude`` are :func:`fnmatch.fnmatch` patterns on the path. Keys are paths
    with the common prefix of the patterns removed. Glob matches are sorted.

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for label, name in [("cat", "1.txt"), ("dog", "2.txt")]:
    ...     os.makedirs(os.path.join(root, label))
    ...     with open(os.path.join(root, label, name), "w") as file:
    ...         _ = file.write(label)
    >>> reader = DirectoryReader(os.path.join(root, "{LABEL}", "**"))
    >>> sample = reader.get(1)
    >>> sample["key"], sample["label"], sample["_label"], sample["data"]
    ('dog/2.txt', 1, 'dog', b'dog')
    """

    def __init__(self, patterns: Union[PathLike, Sequence[PathLike]], labels: Any = None,
                 numeric_labels: bool = True, initfun: Callable[[dict], Any] = _noop,
                 convertfun: Callable[[dict], Any] = _noop, include: Sequence[str] = (),
                 exclude: Sequence[str] = (), separator: str = "\t", root_dir: PathLike = "") -> None:
        patterns = [os.fspath(patterns)] if isinstance(patterns, (str, os.PathLike)) else [
            os.fspath(p) for p in patterns]
        entries = _directory_entries(patterns, separator)
        samples = [{"key": key, "label": label, "path": os.path.join(root_dir, path),
                    "_additional_info": info}
                   for key, path, label, info in entries if _included(path, include, exclude)]
        super().__init__(samples, labels, numeric_labels, initfun, self._load)
        self._user_convertfun = convertfun
        self.bytes_read = 0

    def _load(self, sample: dict) -> None:
        with open(sample["path"], "rb") as file:
            sample["data"] = file.read()
        self.bytes_read += len(sample["data"])
        self._user_convertfun(sample)


def _included(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    return ((not include or any(fnmatch(path, p) for p in include))
            and not any(fnmatch(path, p) for p in exclude))


def _directory_entries(patterns: list[str], separator: str) -> Iterator[tuple]:
    prefix = os.path.commonprefix(patterns) if len(patterns) > 1 else ""
    prefix = prefix.split("{LABEL}")[0]
    for pattern in patterns:
        if os.path.isfile(pattern):
            yield from _list_file_entries(pattern, prefix, separator)
        else:
            yield from _glob_entries(pattern, prefix)


def _list_file_entries(list_file: str, prefix: str, separator: str) -> Iterator[tuple]:
    with open(list_file, encoding="utf-8") as file:
        for line in file:
            if not line.strip():
                continue
            path, *rest = line.rstrip("\n").split(separator)
            label = rest[0] if rest else None
            yield _strip(path, prefix), path, label, rest[1:]


def _glob_entries(pattern: str, prefix: str) -> Iterator[tuple]:
    parts = pattern.split(os.sep)
    label_at = parts.index("{LABEL}") if "{LABEL}" in parts else None
    if label_at is not None and not prefix:
        prefix = pattern[:pattern.index("{LABEL}")]
    for path in sorted(glob.glob(pattern.replace("{LABEL}", "*", 1), recursive=True)):
        if os.path.isfile(path):
            label = path.split(os.sep)[label_at] if label_at is not None else None
            yield _strip(path, prefix), path, label, []


def _strip(path: str, prefix: str) -> str:
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


class ZipFileReader(ListReader):
    """A reader over the members of a zip file, matched like :class:`DirectoryReader`'s
    patterns (``{LABEL}/**`` by default; ``/`` separates components). Each process opens
    the zip file itself, so the reader is fork-safe, and it pickles (and copies) by path.

    >>> import io, os, tempfile, zipfile
    >>> path = os.path.join(tempfile.mkdtemp(), "pets.zip")
    >>> with zipfile.ZipFile(path, "w") as archive:
    ...     archive.writestr("cat/1.txt", b"meow")
    ...     archive.writestr("dog/2.txt", b"woof")
    >>> reader = ZipFileReader(path)
    >>> for sample in reader:
    ...     print(sample["key"], sample["label"], sample["data"])
    cat/1.txt 0 b'meow'
    dog/2.txt 1 b'woof'
    """

    def __init__(self, path: PathLike, patterns: Union[str, Sequence[str]] = "{LABEL}/**",
                 labels: Any = None, numeric_labels: bool = True,
                 initfun: Callable[[dict], Any] = _noop, convertfun: Callable[[dict], Any] = _noop,
                 include: Sequence[str] = (), exclude: Sequence[str] = (), separator: str = "\t") -> None:
        self.path = os.path.abspath(path)  # as for MsgpackReader
        self._zip: zipfile.ZipFile | None = None
        self._zip_pid = -1
        patterns = [patterns] if isinstance(patterns, str) else list(patterns)
        entries = _zip_entries(self._archive().infolist(), patterns, separator)
        samples = [{"key": key, "label": label, "path": member, "_additional_info": info}
                   for key, member, label, info in entries if _included(member, include, exclude)]
        super().__init__(samples, labels, numeric_labels, initfun, self._load)
        self._user_convertfun = convertfun
        self.bytes_read = 0

    def _archive(self) -> zipfile.ZipFile:
        # A ZipFile's file position is shared with forked children: reopen per process.
        if self._zip is None or self._zip_pid != os.getpid():
            self._zip, self._zip_pid = zipfile.ZipFile(self.path), os.getpid()
        return self._zip

    def close(self) -> None:
        if self._zip is not None and self._zip_pid == os.getpid():
            self._zip.close()
        self._zip = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_zip": None, "_zip_pid": -1}

    def _load(self, sample: dict) -> None:
        sample["data"] = self._archive().read(sample["path"])
        self.bytes_read += len(sample["data"])
        self._user_convertfun(sample)


def _zip_entries(infos: list[zipfile.ZipInfo], patterns: list[str], separator: str) -> Iterator[tuple]:
    for pattern in patterns:
        if os.path.isfile(pattern):
            yield from _list_file_entries(pattern, "", separator)
            continue
        parts = pattern.split("/")
        label_at = parts.index("{LABEL}") if "{LABEL}" in parts else None
        key_from = pattern.index("{LABEL}") if label_at is not None else 0
        glob_pattern = pattern.replace("{LABEL}", "*", 1)
        for info in infos:
            if not info.is_dir() and fnmatch(info.filename, glob_pattern):
                label = info.filename.split("/")[label_at] if label_at is not None else None
                yield info.filename[key_from:], info.filename, label, []
