"""What ``fpipe write`` reads: folder trees, glob patterns, list files and JSON-lines files.

Each source becomes a :class:`Listing`: the samples to write, in a stable order, each either
a file to read (``path``) or a ready sample, plus the label names. Labels are numbered in
*natural order* of their names (digit runs compare as numbers, so ``class2`` comes before
``class10``), the order in which fpipe's :class:`~fpipe.storage.ListReader` and datadings
number them; files found in folders and by patterns are taken in natural order of their paths.

>>> natural_order(["b10", "b2", "a"])
['a', 'b2', 'b10']
"""

from __future__ import annotations

import csv
import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..storage.unpacked import natural_key
from ._common import UsageError

__all__ = ["Entry", "Listing", "list_source", "natural_order"]

_GLOB_CHARS = re.compile(r"[*?\[]")
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class Entry:
    """One sample to write: ``key``, the ``path`` of its file (or None) or a ready ``sample``,
    and its label name (None when unlabelled)."""

    key: str
    path: str | None = None
    label: Any = None
    sample: dict | None = None


@dataclass
class Listing:
    """The entries of a source, what kind of source it was, the label names in label order
    (empty when unlabelled) and a note about files that were left out."""

    kind: str
    entries: list[Entry]
    labels: list = field(default_factory=list)
    note: str = ""


def natural_order(names: Any) -> list:
    """``names`` sorted so that digit runs compare by value."""
    return sorted(names, key=natural_key)


def list_source(source: str, separator: str | None = None) -> Listing:
    """The listing of ``source``: a folder, a glob pattern (``{LABEL}`` marks the label
    folder), a JSON-lines file, or a list file of ``path[,label]`` lines."""
    path = Path(source)
    if "{LABEL}" in source or (_GLOB_CHARS.search(source) and not path.exists()):
        listing = _glob_listing(source)
    elif path.is_dir():
        listing = _folder_listing(path)
    elif path.is_file():
        listing = _json_listing(path) if _is_json_lines(path) else _list_listing(path, separator)
    else:
        raise FileNotFoundError(f"{source}: no such file or folder")
    if not listing.entries:
        raise UsageError(f"{source}: no samples found")
    _check_unique(listing.entries)
    return listing


def _labelled(kind: str, entries: list[Entry], note: str = "") -> Listing:
    names = {entry.label for entry in entries if entry.label is not None}
    unlabelled = next((entry.key for entry in entries if entry.label is None), None)
    if names and unlabelled is not None:
        raise UsageError(f"{unlabelled} has no label but other samples have one")
    return Listing(kind, entries, natural_order(names), note)


def _visible_files(folder: Path) -> list[Path]:
    """Files under ``folder``, recursively, without hidden files and folders, in natural order."""
    found = []
    for root, folders, files in os.walk(folder):
        folders[:] = natural_order(name for name in folders if not name.startswith("."))
        found.extend(Path(root, name) for name in natural_order(files) if not name.startswith("."))
    return found


def _folder_listing(root: Path) -> Listing:
    classes = natural_order(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        entries = [Entry(p.relative_to(root).as_posix(), str(p)) for p in _visible_files(root)]
        return Listing("folder (unlabelled)", entries)
    loose = [p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(".")]
    note = (f"left out {len(loose)} file(s) at the top of {root} that are in no class folder "
            f"(e.g. {sorted(loose)[0]})" if loose else "")
    entries = [Entry(p.relative_to(root).as_posix(), str(p), name)
               for name in classes for p in _visible_files(root / name)]
    return _labelled("folder (ImageFolder layout)", entries, note)


def _glob_listing(pattern: str) -> Listing:
    parts = Path(pattern).parts
    if "{LABEL}" in pattern and "{LABEL}" not in parts:
        raise UsageError(f"{{LABEL}} must be a whole path component, as in root/{{LABEL}}/**; "
                         f"got {pattern!r}")
    labelled = "{LABEL}" in parts
    at = parts.index("{LABEL}") if labelled else _first_glob_part(parts)
    base = Path(*parts[:at]) if at else Path(".")
    matches = natural_order(glob.glob(pattern.replace("{LABEL}", "*", 1), recursive=True))
    entries = [Entry(Path(match).relative_to(base).as_posix(), match,
                     Path(match).parts[at] if labelled else None)
               for match in matches if os.path.isfile(match)
               and (not labelled or len(Path(match).parts) > at + 1)]
    if not entries:
        raise UsageError(f"{pattern}: the pattern matches no files"
                         + (" (end it with /** to take the files in each label folder)"
                            if pattern.rstrip("/\\").endswith("{LABEL}") else ""))
    return _labelled("glob pattern", entries)


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
    with open(path, encoding="utf-8", newline="") as file:
        lines = [(number, line) for number, line in enumerate(file, 1) if line.strip()]
    if separator is None:
        separator = "\t" if lines and "\t" in lines[0][1] else ","
    rows = [(number, next(csv.reader([line], delimiter=separator))) for number, line in lines]
    if rows and rows[0][1][0].strip().lower() == "path":
        rows = rows[1:]  # a header line
    entries = [_list_entry(path, number, row) for number, row in rows]
    return _labelled("list file", entries)


def _list_entry(list_file: Path, number: int, row: list[str]) -> Entry:
    if len(row) > 2:
        raise UsageError(f"{list_file}, line {number}: {len(row)} columns; a line is path[,label] "
                         "(--separator sets the separator)")
    name = row[0].strip()
    label = row[1].strip() if len(row) == 2 and row[1].strip() else None
    key = Path(name).as_posix()
    key = key[2:] if key.startswith("./") else key
    # Relative paths are relative to the list file's folder, wherever fpipe runs.
    return Entry(key, str(list_file.parent / name), label)


def _json_listing(path: Path) -> Listing:
    entries = []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            if line.strip():
                entries.append(_json_entry(path, number, line, len(entries)))
    labels = {entry.label for entry in entries if isinstance(entry.label, str)}
    if labels and any(not isinstance(e.label, str) for e in entries if "label" in e.sample):
        raise UsageError(f"{path}: some labels are strings and some are not; use one kind")
    return Listing("JSON lines", entries, natural_order(labels))


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


def _check_unique(entries: list[Entry]) -> None:
    seen: dict[str, None] = {}
    for entry in entries:
        if entry.key in seen:
            raise ValueError(f"duplicate key {entry.key!r}: keys must be unique")
        seen[entry.key] = None
