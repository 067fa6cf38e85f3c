"""Class lists and label fields for the commands: read a class list whole and checked, find a
field in a packed sample without decoding the rest, and renumber labels by their names.

A class list is the ``X.msgpack.classes.json`` beside a dataset, ``{"classes": {field: [name,
...]}}``: ``sample[field] == i`` means the class ``names[i]``. When datasets with different
lists are merged, the merged list is the *union*: the first input's names in its order, then
each name that a later input adds, in that input's order; so the first input keeps its numbers.

>>> union_of([["apple", "banana"], ["banana", "cherry"]])
['apple', 'banana', 'cherry']
>>> renumbering(["banana", "cherry"], ["apple", "banana", "cherry"])
[1, 2]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from fpipe.cli._common import CLASSES_SUFFIX
from fpipe.dataset import corrupt_reason, read_class_file, unpack_sample
from fpipe.dataset.format import DECODE_ERRORS
from fpipe.errors import FormatError, FpipeError

__all__ = ["check_matchable", "class_file", "class_lists", "field_span", "field_value", "merged_classes",
           "renumbered", "renumbering", "union_of"]

_MAP_TYPES = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))  # fixmap, map 16, map 32


def class_file(source: str | Path) -> Path:
    """The class-list file that ``source`` names: itself if it is a ``.json`` file, else the
    ``.classes.json`` beside the dataset ``source``.

    >>> class_file("train.msgpack").name, class_file("names.json").name
    ('train.msgpack.classes.json', 'names.json')
    """
    return Path(source) if str(source).endswith(".json") else Path(str(source) + CLASSES_SUFFIX)


def class_lists(source: str | Path) -> dict[str, list[str]] | None:
    """The class lists of ``source`` (a dataset or a ``.json`` class-list file, see
    :func:`class_file`), per label field; None when there is no such file. A file that is not
    a class list (:func:`fpipe.dataset.read_class_file`) raises
    :class:`~fpipe.errors.FpipeError` naming it. A list may name a class twice (ImageNet's
    names 'crane' twice); only matching labels by such a name is refused
    (:func:`check_matchable`)."""
    stored = read_class_file(class_file(source))
    return None if stored is None else stored["classes"]


def check_matchable(names: Sequence[str], labels: Iterable[str], where: str) -> None:
    """Refuse to match ``labels`` by name in the class list ``names`` when one of them is a
    name the list gives twice, so that its number is ambiguous.

    >>> check_matchable(["crane", "ox", "crane"], ["ox"], "x.classes.json")
    >>> check_matchable(["crane", "ox", "crane"], ["crane"], "x.classes.json")
    Traceback (most recent call last):
    ...
    fpipe.errors.FpipeError: x.classes.json names the class 'crane' twice (numbers 0 and 2), ...
    """
    numbers: dict[str, list[int]] = {}
    for number, name in enumerate(names):
        numbers.setdefault(name, []).append(number)
    for label in labels:
        found = numbers.get(label, ())
        if len(found) > 1:
            raise FpipeError(f"{where} names the class {label!r} twice (numbers {found[0]} and "
                             f"{found[1]}), so a label {label!r} cannot be numbered by its name")


def union_of(lists: Iterable[Sequence[str]]) -> list[str]:
    """Every name of ``lists``, once: the first list's names in its order, then the names each
    later list adds, in its order."""
    return list(dict.fromkeys(name for names in lists for name in names))


def renumbering(names: Sequence[str], merged: Sequence[str]) -> list[int]:
    """For each number of ``names``, the number of the same name in ``merged``."""
    position = {name: number for number, name in enumerate(merged)}
    return [position[name] for name in names]


def merged_classes(sources: Sequence[Path]) -> tuple[dict[str, list[str]] | None, list[dict]]:
    """The class lists of the merge of ``sources`` (per field, the :func:`union_of` the inputs'
    lists; None when no input has one), and for each input the new number of each of its
    labels, per field whose numbers change. Inputs whose labels cannot be matched by name (some
    with a class list and some without, or lists of different fields) raise
    :class:`~fpipe.errors.FpipeError`."""
    lists = [class_lists(source) for source in sources]
    if all(item is None for item in lists):
        return None, [{} for _ in sources]
    _check_comparable(sources, lists)
    if all(item == lists[0] for item in lists):
        return lists[0], [{} for _ in sources]
    for source, item in zip(sources, lists):
        for names in item.values():
            check_matchable(names, names, f"{class_file(source)} (merged with other lists)")
    merged = {field: union_of(item[field] for item in lists) for field in lists[0]}
    tables = [{field: renumbering(names, merged[field]) for field, names in item.items()
               if names != merged[field][:len(names)]} for item in lists]
    return merged, tables


def _check_comparable(sources: Sequence[Path], lists: list) -> None:
    with_list = next(source for source, item in zip(sources, lists) if item is not None)
    for source, item in zip(sources, lists):
        if item is None:
            raise FpipeError(f"{source} has no class list ({source}{CLASSES_SUFFIX}) but "
                             f"{with_list} has one: the labels cannot be matched by name; "
                             "nothing was written")
        if set(item) != set(lists[0]):
            raise FpipeError(f"the class lists of {sources[0]} and {source} are for different "
                             f"fields ({', '.join(lists[0])}; {', '.join(item)}); nothing was "
                             "written")


def field_span(data: bytes, name: str) -> tuple[int, int] | None:
    """Where the value of field ``name`` lies in the packed sample ``data``, found without
    decoding the other values; None when ``data`` is not a map or has no such field. Bytes
    that are not msgpack raise the msgpack error.

    >>> data = msgpack.packb({"key": "a", "image": b"xyz", "label": 7})
    >>> start, stop = field_span(data, "label")
    >>> msgpack.unpackb(data[start:stop])
    7
    """
    if not data or data[0] not in _MAP_TYPES:
        return None
    unpacker = msgpack.Unpacker(max_buffer_size=len(data), strict_map_key=False)
    unpacker.feed(data)
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        start = unpacker.tell()
        unpacker.skip()
        if key == name:
            return start, unpacker.tell()
    return None


def field_value(data: bytes, name: str, default: Any = None, *, path: Any = None,
                index: int | None = None) -> Any:
    """The value of field ``name`` of the packed sample ``data`` (``default`` when it has
    none), decoding nothing else; corrupt bytes raise :class:`~fpipe.errors.FormatError`
    naming ``path`` and ``index``.

    >>> field_value(msgpack.packb({"key": "a", "image": b"xyz", "label": 7}), "label")
    7
    """
    span = _checked_span(data, name, path, index)
    if span is None:
        return default
    return unpack_sample(data[span[0]:span[1]], path=path, index=index)


def _checked_span(data: bytes, name: str, path: Any, index: int) -> tuple[int, int] | None:
    try:
        return field_span(data, name)
    except DECODE_ERRORS as error:
        raise FormatError(corrupt_reason(error, data), path=path, index=index) from None


def renumbered(pairs: Iterable[tuple[str, Any]], tables: dict[str, list[int]],
               source: Path) -> Iterator[tuple[str, Any]]:
    """The ``(key, packed sample)`` pairs of dataset ``source`` with the label of each field
    in ``tables`` renumbered (``table[old] == new``); every other byte stays as it was."""
    for index, (key, data) in enumerate(pairs):
        for field, table in tables.items():
            data = _renumbered_sample(bytes(data), field, table, source, index, key)
        yield key, data


def _renumbered_sample(data: bytes, field: str, table: list[int], source: Path, index: int,
                       key: str) -> bytes:
    span = _checked_span(data, field, source, index)
    if span is None:
        return data
    value = unpack_sample(data[span[0]:span[1]], path=source, index=index)
    if type(value) is not int or not 0 <= value < len(table):
        raise FpipeError(f"{source}: sample {index} (key {key!r}): {field} is {value!r}, not a "
                         f"class number of its class list ({len(table)} names); nothing was "
                         "written")
    return data[:span[0]] + msgpack.packb(table[value]) + data[span[1]:]
