"""What ``fpipe write`` reads: folder trees, glob patterns, list files and JSON-lines files.

Each source becomes a :class:`Listing`: the samples to write, in a stable order, each either
a file to read (``path``) or a ready sample, plus the label names. Labels are numbered in
*natural order* of their names (digit runs compare as numbers, so ``class2`` comes before
``class10``), the order in which fpipe's :class:`~fpipe.dataset.ListReader` and datadings
number them; files found in folders and by patterns are taken in natural order of their paths.
A pattern's file suffix matches in either case, as the suffixes of images in class folders do.

>>> natural_order(["b10", "b2", "a"])
['a', 'b2', 'b10']
>>> either_case_suffix("photos/*/*.jpg")
'photos/*/*.[jJ][pP][gG]'
"""

from __future__ import annotations

import csv
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import cached_property
from pathlib import Path
from typing import Any

from fpipe.cli._common import UsageError
from fpipe.dataset.unpacked import natural_key
from fpipe.errors import FpipeError

__all__ = ["IMAGE_SUFFIXES", "JSON_LINES", "LIST_FILE", "Entries", "Entry", "FolderFiles",
           "JsonLinesEntries", "ListFileEntries", "Listing", "PatternFiles", "clean_path",
           "either_case_suffix", "file_suffix", "list_source", "natural_order"]

_GLOB_CHARS = re.compile(r"[*?\[]")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")
_FOLDER_LAYOUT = "folder (ImageFolder layout)"
LIST_FILE, JSON_LINES = "list file", "JSON lines"  # the kinds of listing whose options differ
#: What a file in a class folder must end with to be taken as an image (case ignored).
IMAGE_SUFFIXES = frozenset((".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff",
                            ".ppm", ".pgm", ".pbm", ".jp2", ".avif", ".heic"))
_NAMED = 3  # files named in a one-line notice
_SEPARATOR_CHARS = "/" + (os.altsep or "") + (os.sep if os.sep != "/" else "")
_SEPARATORS = "[" + re.escape(_SEPARATOR_CHARS) + "]"
# A list file's first line is a header if its path column is a column name, not a file's path.
_COLUMN_NAME = re.compile(r"[^\W\d][\w -]*")


@dataclass(frozen=True)
class Entry:
    """One sample to write: ``key``, the ``path`` of its file (or None) or a ready ``sample``,
    and its label name (None when unlabelled)."""

    key: str
    path: str | None = None
    label: Any = None
    sample: dict | None = None


@dataclass(frozen=True)
class _Survey:
    """What a pass over entries found: how many, their label names, the key of the first
    without a label, and how many are not images by their suffix, with the first few keys."""

    count: int
    labels: frozenset
    unlabelled: str | None
    not_images: int
    named: tuple[str, ...]


def _survey(entries: Iterable[Entry]) -> _Survey:
    if isinstance(entries, Entries):
        return entries.survey
    count, labels, unlabelled, not_images, named = 0, set(), None, 0, []
    for entry in entries:
        count += 1
        if entry.label is not None:
            labels.add(entry.label)
        elif unlabelled is None:
            unlabelled = entry.key
        if not _is_image(entry.key):
            not_images += 1
            if len(named) < _NAMED:
                named.append(entry.key)
    return _Survey(count, frozenset(labels), unlabelled, not_images, tuple(named))


def _is_image(key: str) -> bool:
    return file_suffix(key).lower() in IMAGE_SUFFIXES


def file_suffix(path: str) -> str:
    """The suffix of the file ``path`` names, as :attr:`pathlib.PurePath.suffix` has it,
    without a Path: pathlib interns the parts of every path it makes, a cost for each file of
    a tree of millions.

    >>> file_suffix("photos/cat.1.JPG"), file_suffix("photos/.hidden"), file_suffix("a.b/c")
    ('.JPG', '', '')
    """
    name = re.split(_SEPARATORS, path.rstrip(_SEPARATOR_CHARS))[-1]
    dot = name.rfind(".")
    return name[dot:] if 0 < dot < len(name) - 1 else ""


class Entries(ABC):
    """The entries of a source, read again at each pass (a folder walked, a list file or
    JSON lines read, a pattern matched), holding one folder's names or one line at a time,
    so that a source of any size is listed in bounded memory: those whose key every one of
    ``keep`` takes. A subclass says what the source yields (:meth:`_all`); ``len`` and
    :attr:`survey` come from one pass, made once."""

    keep: tuple[Callable[[str], bool], ...]

    @abstractmethod
    def _all(self) -> Iterator[Entry]:
        """Every entry of the source, in its order, before ``keep`` chooses."""

    def __iter__(self) -> Iterator[Entry]:
        keep = self.keep
        return (entry for entry in self._all() if all(wanted(entry.key) for wanted in keep))

    def __len__(self) -> int:
        return self.survey.count

    def kept(self, wanted: Callable[[str], bool]) -> Entries:
        """These entries, those whose key ``wanted`` takes."""
        return replace(self, keep=(*self.keep, wanted))  # type: ignore[type-var]

    @cached_property
    def survey(self) -> _Survey:
        """A pass over the entries (made once)."""
        return _survey(iter(self))


@dataclass(frozen=True)
class FolderFiles(Entries):
    """The files under ``root`` as entries, keyed by their path relative to it: in the class
    folders ``classes`` (labelled by them), or anywhere under it (unlabelled) when None.
    Each pass walks the folders again, in natural order, holding the names of one folder at
    a time (a pass costs a walk of the tree)."""

    root: Path
    classes: tuple[str, ...] | None = None
    keep: tuple[Callable[[str], bool], ...] = ()

    def _all(self) -> Iterator[Entry]:
        root = self.root
        folders = [(root, None)] if self.classes is None else \
            [(root / name, name) for name in self.classes]
        for folder, label in folders:
            for key, path in _visible_files(folder, root):
                yield Entry(key, path, label)


@dataclass(frozen=True)
class ListFileEntries(Entries):
    """The ``path[,label]`` lines of the list file ``path`` as entries, columns split at
    ``separator``, after the first line if it is a ``header``; each pass reads the file
    again, a line at a time."""

    path: Path
    separator: str
    header: bool
    keep: tuple[Callable[[str], bool], ...] = ()

    def _all(self) -> Iterator[Entry]:
        rows, folder = _list_rows(self.path, self.separator), str(self.path.parent)
        if self.header:
            next(rows, None)
        return (_list_entry(self.path, folder, number, row) for number, row in rows)


@dataclass(frozen=True)
class JsonLinesEntries(Entries):
    """The samples of the JSON-lines file ``path`` as entries (a sample without ``"key"``
    gets its number among the samples); each pass reads the file again, a line at a time."""

    path: Path
    keep: tuple[Callable[[str], bool], ...] = ()

    def _all(self) -> Iterator[Entry]:
        with open(self.path, encoding="utf-8") as file:
            index = 0
            for number, line in enumerate(file, 1):
                if line.strip():
                    yield _json_entry(self.path, number, line, index)
                    index += 1


@dataclass(frozen=True)
class PatternFiles(Entries):
    """The files under ``base`` whose path relative to it matches the glob components
    ``parts`` as :func:`glob.glob` matches them (``**`` crosses folders, wildcards do not
    match hidden names), keyed by that relative path; labelled by their first component
    (which must be a folder) if ``labelled``. Each pass walks the folders again, holding the
    names of one folder a level, in natural order of the paths."""

    base: Path
    parts: tuple[str, ...]
    labelled: bool = False
    keep: tuple[Callable[[str], bool], ...] = ()

    def _all(self) -> Iterator[Entry]:
        prefix = "" if self.base == Path(".") else str(self.base)
        for names in _matched_files(str(self.base), (), self.parts):
            if not self.labelled or len(names) > 1:
                yield Entry("/".join(names), os.path.join(prefix, *names),
                            names[0] if self.labelled else None)


@dataclass
class Listing:
    """The entries of a source, what kind of source it was, the label names in label order
    (empty when unlabelled), a note about files that were left out, whether its labels are
    class folders (an ImageFolder tree or a ``{LABEL}`` pattern), and the labels that lost
    every sample to ``--include``/``--exclude`` or to the image filter (``emptied``). The
    entries are :class:`Entries`, which read the source again at each pass: none is held."""

    kind: str
    entries: Entries
    labels: list = field(default_factory=list)
    note: str = ""
    class_folders: bool = False
    emptied: list = field(default_factory=list)


def natural_order(names: Any) -> list:
    """``names`` sorted so that digit runs compare by value."""
    return sorted(names, key=natural_key)


def list_source(source: str, separator: str | None = None, include: Sequence[str] = (),
                exclude: Sequence[str] = (), strict: bool = False) -> Listing:
    """The listing of ``source``: a folder, a glob pattern (``{LABEL}`` marks the label
    folder), a JSON-lines file, or a list file of ``path[,label]`` lines.

    Only samples whose key (a file's relative path) matches one of the ``include`` globs, if
    any, and none of the ``exclude`` globs are kept (a glob's file suffix matches in either
    case). In class folders, files that are not images (by their suffix) are left out, and the
    listing's note names them; with ``strict`` they are an error instead, and ``strict`` on a
    source without class folders is a usage error.
    """
    listing = _select(_list_all(source, separator), include, exclude)
    if listing.class_folders:
        listing = _images_only(source, listing, strict)
    elif strict:
        raise UsageError(f"--strict is for class folders (an ImageFolder tree or a {{LABEL}} "
                         f"pattern), where it refuses files that are not images; {source} is a "
                         f"{listing.kind}")
    if not listing.entries:
        raise UsageError(f"{source}: no samples found"
                         + (" (after --include/--exclude)" if include or exclude else ""))
    # keys listed twice are refused by the writer, which finds them in bounded memory
    return listing


def _list_all(source: str, separator: str | None) -> Listing:
    path = Path(source)
    if "{LABEL}" in source or (_GLOB_CHARS.search(source) and not path.exists()):
        listing = _glob_listing(source)
    elif path.is_dir():
        listing = _folder_listing(path)
    elif path.is_file():
        listing = _json_listing(path) if _is_json_lines(path) else _list_listing(path, separator)
    else:
        raise FileNotFoundError(f"{source}: no such file or folder")
    return listing


def _select(listing: Listing, include: Sequence[str], exclude: Sequence[str]) -> Listing:
    if not include and not exclude:
        return listing
    include, exclude = [*map(either_case_suffix, include)], [*map(either_case_suffix, exclude)]

    def chosen(key: str) -> bool:
        return (not include or any(fnmatchcase(key, glob) for glob in include)) \
            and not any(fnmatchcase(key, glob) for glob in exclude)

    return _with_entries(listing, listing.entries.kept(chosen))


def either_case_suffix(pattern: str) -> str:
    """``pattern`` with the letters of its file suffix (``.jpg`` in ``*/*.jpg``) matching either
    case, as files in class folders are told apart by their suffix in any case."""
    cut = max(pattern.rfind("/"), pattern.rfind(os.sep)) + 1
    stem, dot, suffix = pattern[cut:].rpartition(".")
    if not stem or not suffix or _GLOB_CHARS.search(suffix):
        return pattern
    return pattern[:cut] + stem + dot + "".join(map(_either_case, suffix))


def _either_case(char: str) -> str:
    lower, upper = char.lower(), char.upper()
    return f"[{lower}{upper}]" if lower != upper and len(lower) == len(upper) == 1 else char


def _with_entries(listing: Listing, entries: Entries) -> Listing:
    """``listing`` with fewer entries, and the labels that are left."""
    present = _survey(entries).labels
    return replace(listing, entries=entries,
                   labels=[label for label in listing.labels if label in present],
                   emptied=[*listing.emptied, *(label for label in listing.labels
                                                if label not in present)])


def _images_only(source: str, listing: Listing, strict: bool) -> Listing:
    survey = _survey(listing.entries)
    if not survey.not_images:
        return listing
    named = ", ".join(survey.named) + (f" and {survey.not_images - _NAMED} more"
                                       if survey.not_images > _NAMED else "")
    what = (f"{survey.not_images} file(s) in the class folders that are not images (by "
            f"suffix): {named}")
    if strict:
        raise FpipeError(f"{source}: {what}; --exclude them, or leave out --strict to skip them")
    left = _with_entries(listing, listing.entries.kept(_is_image))
    return replace(left, note="; ".join(filter(None, (listing.note, f"left out {what}"))))


def _labelled(kind: str, entries: Entries, note: str = "",
              class_folders: bool = False) -> Listing:
    survey = _survey(entries)
    if survey.labels and survey.unlabelled is not None:
        raise UsageError(f"{survey.unlabelled} has no label but other samples have one")
    return Listing(kind, entries, natural_order(survey.labels), note, class_folders)


def _visible_files(folder: Path, root: Path) -> Iterator[tuple[str, str]]:
    """Files under ``folder``, recursively, without hidden files and folders, in natural order
    (a folder's files, then its folders'), holding the names of one folder at a time: each as
    its path relative to ``root`` (with ``/``) and its path."""
    for where, folders, files in os.walk(folder):
        folders[:] = natural_order(name for name in folders if not name.startswith("."))
        # one Path a folder, not a file: pathlib interns the parts of every path it parses
        relative = Path(where).relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        yield from ((prefix + name, os.path.join(where, name)) for name in natural_order(files)
                    if not name.startswith("."))


def _folder_listing(root: Path) -> Listing:
    classes = natural_order(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        return Listing("folder (unlabelled)", FolderFiles(root))
    loose = [p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(".")]
    note = (f"left out {len(loose)} file(s) at the top of {root} that are in no class folder "
            f"(e.g. {sorted(loose)[0]})" if loose else "")
    return _labelled(_FOLDER_LAYOUT, FolderFiles(root, tuple(classes)), note, class_folders=True)


def _glob_listing(pattern: str) -> Listing:
    parts = Path(pattern).parts
    if "{LABEL}" in pattern and "{LABEL}" not in parts:
        raise UsageError(f"{{LABEL}} must be a whole path component, as in root/{{LABEL}}/**; "
                         f"got {pattern!r}")
    labelled = "{LABEL}" in parts
    at = parts.index("{LABEL}") if labelled else _first_glob_part(parts)
    base = Path(*parts[:at]) if at else Path(".")
    if not base.is_dir():
        raise FileNotFoundError(f"{base}: no such folder (in the pattern {pattern})")
    matched = Path(either_case_suffix(pattern.replace("{LABEL}", "*", 1))).parts[at:]
    entries = PatternFiles(base, matched, labelled)
    if pattern.endswith(_SEPARATOR_CHARS) or not entries:  # a trailing / matches folders only
        raise UsageError(f"{pattern}: the pattern matches no files"
                         + (" (end it with /** to take the files in each label folder)"
                            if pattern.rstrip("/\\").endswith("{LABEL}") else ""))
    return _labelled("glob pattern", entries, class_folders=labelled)


def _matched_files(folder: str, names: tuple[str, ...], parts: tuple[str, ...],
                   states: frozenset[int] = frozenset({0})) -> Iterator[tuple[str, ...]]:
    """The files under ``folder`` (reached by ``names`` from the base) whose names match the
    rest of the glob components ``parts``, as :func:`glob.glob` matches them: ``states`` are
    the components that the next name may match (a ``**`` may match none, one or several
    names). In natural order of their paths: a folder's entries sorted as the paths below
    them sort, holding the matching names of one folder a level (folders whose names sort
    alike, ``c1`` and ``c01``, are taken one after the other, by name)."""
    states = _past_stars(parts, states)
    matching = []
    with os.scandir(folder) as found:
        for entry in found:
            after = _advanced(parts, states, entry.name)
            if after:
                is_folder = entry.is_dir()
                if is_folder or entry.is_file():
                    matching.append((entry.name + "/" if is_folder else entry.name, after))
    for name, after in sorted(matching, key=lambda pair: (natural_key(pair[0]), pair[0])):
        if name.endswith("/"):
            yield from _matched_files(os.path.join(folder, name[:-1]), (*names, name[:-1]),
                                      parts, after)
        elif len(parts) in _past_stars(parts, after):
            yield (*names, name)


def _past_stars(parts: tuple[str, ...], states: frozenset[int]) -> frozenset[int]:
    """``states`` and the components after each ``**`` among them (which may match no name)."""
    more = set(states)
    for state in sorted(states):
        while state < len(parts) and parts[state] == "**":
            state += 1
            more.add(state)
    return frozenset(more)


def _advanced(parts: tuple[str, ...], states: frozenset[int], name: str) -> frozenset[int]:
    """The components that the name after ``name`` may match, from ``states``; empty if
    ``name`` matches none of them. Wildcards do not match a hidden name; a ``**`` stays."""
    hidden = name.startswith(".")
    after = set()
    for state in states:
        if state == len(parts):
            continue
        part = parts[state]
        if part == "**":
            if not hidden:
                after.add(state)
        elif (not hidden or part.startswith(".")) and fnmatchcase(name, part):
            after.add(state + 1)
    return frozenset(after)


def _first_glob_part(parts: tuple[str, ...]) -> int:
    return next(i for i, part in enumerate(parts) if _GLOB_CHARS.search(part))


def _is_json_lines(path: Path) -> bool:
    if path.suffix.lower() in _JSON_SUFFIXES:
        return True
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            if line.strip():
                return line.lstrip().startswith("{")
    return False


def _list_listing(path: Path, separator: str | None) -> Listing:
    number, first = _first_line(path)
    if separator is None:
        separator = "\t" if "\t" in first else ","
    row = next(csv.reader([first], delimiter=separator)) if first else None
    header = row is not None and _is_header(path, row)
    note = ""
    if header and row[0].strip().lower() != "path":  # the documented header needs no note
        note = f"took line {number} of {path} ({separator.join(row)}) as a header"
    return _labelled(LIST_FILE, ListFileEntries(path, separator, header), note)


def _first_line(path: Path) -> tuple[int, str]:
    """The number and text of the first line of ``path`` that is not blank; (0, "") if none."""
    with open(path, encoding="utf-8", newline="") as file:
        return next(((number, line) for number, line in enumerate(file, 1) if line.strip()),
                    (0, ""))


def _list_rows(path: Path, separator: str) -> Iterator[tuple[int, list[str]]]:
    """The lines of the list file ``path`` that are not blank, numbered, split at
    ``separator``, read one at a time."""
    with open(path, encoding="utf-8", newline="") as file:
        for number, line in enumerate(file, 1):
            if line.strip():
                yield number, next(csv.reader([line], delimiter=separator))


def _is_header(list_file: Path, row: list[str]) -> bool:
    """Whether the first line of a list file names its columns: its first cell is ``path``, or
    another column name (``filename``, ``image path``: no dot, no slash) that names no file."""
    name = row[0].strip()
    if name.lower() == "path":
        return True
    return bool(_COLUMN_NAME.fullmatch(name)) and not (list_file.parent / name).exists()


def _list_entry(list_file: Path, folder: str, number: int, row: list[str]) -> Entry:
    """The entry of line ``number`` of ``list_file``, whose relative paths are relative to
    its ``folder`` (wherever fpipe runs)."""
    if len(row) > 2:
        raise UsageError(f"{list_file}, line {number}: {len(row)} columns; a line is path[,label] "
                         "(--separator sets the separator)")
    label = row[1].strip() if len(row) == 2 and row[1].strip() else None
    key = clean_path(row[0].strip())
    return Entry(key, key if folder == "." else os.path.join(folder, key), label)


def clean_path(name: str) -> str:
    """The path ``name`` written with ``/``, without empty and ``.`` components, as
    :meth:`pathlib.PurePath.as_posix` writes it, without a Path: pathlib interns the parts
    of every path it parses, a cost for each line of a list of millions.

    >>> clean_path("./photos//cat.jpg"), clean_path("/data/./a.png"), clean_path("./")
    ('photos/cat.jpg', '/data/a.png', '.')
    """
    parts = [part for part in re.split(_SEPARATORS, name) if part not in ("", ".")]
    root = "/" if name.startswith(tuple(_SEPARATOR_CHARS)) else ""
    return root + "/".join(parts) if parts or root else "."


def _json_listing(path: Path) -> Listing:
    entries = JsonLinesEntries(path)
    return Listing(JSON_LINES, entries, natural_order(_json_labels(path, entries)))


def _json_labels(path: Path, entries: JsonLinesEntries) -> set[str]:
    """The label names of the samples (a pass over them): labels that are strings, which
    must then be all the labels."""
    names, others = set(), False
    for entry in entries:
        if isinstance(entry.label, str):
            names.add(entry.label)
        elif entry.sample is not None and "label" in entry.sample:
            others = True
    if names and others:
        raise UsageError(f"{path}: some labels are strings and some are not; use one kind")
    return names


def _json_entry(path: Path, number: int, line: str, index: int) -> Entry:
    try:
        sample = json.loads(line)
    except ValueError as error:
        raise ValueError(f"{path}, line {number}: not JSON ({error})") from None
    if not isinstance(sample, dict):
        raise ValueError(f"{path}, line {number}: a sample is a JSON object; got "
                         f"{type(sample).__name__}")
    key = sample.setdefault("key", str(index))
    if not isinstance(key, str):
        raise ValueError(f"{path}, line {number}: \"key\" must be a string; got {key!r}")
    return Entry(key, None, sample.get("label"), sample)
