"""Class lists: the names of a dataset's labels, stored beside it in ``X.classes.json``.

``fpipe write`` and the well-known dataset writers store them; the commands that make
datasets from datasets copy or merge them; ``fpipe info`` names the labels with them.

>>> import os, tempfile
>>> data = os.path.join(tempfile.mkdtemp(), "pets.msgpack")
>>> _ = DatasetFiles(data).classes.write_text('{"classes": {"label": ["cat", "dog"]}}')
>>> read_classes(data)["classes"]["label"]
['cat', 'dog']
"""

from __future__ import annotations

import json
from typing import Any

from fpipe.dataset.format import DatasetFiles, PathLike, read_regular
from fpipe.errors import FormatError

__all__ = ["read_class_file", "read_classes"]


def read_classes(path: PathLike) -> dict | None:
    """What the ``.classes.json`` beside data file ``path`` holds, or None when there is none.

    It is a JSON object whose ``"classes"`` maps each label field to its class names (strings;
    ``names[i]`` names label ``i``); its other entries (``"dataset"``, ...) are free.
    Any other content raises :class:`~fpipe.errors.FormatError` naming the file.

    >>> import tempfile, os
    >>> data = os.path.join(tempfile.mkdtemp(), "x.msgpack")
    >>> read_classes(data) is None
    True
    >>> _ = DatasetFiles(data).classes.write_text('{"classes": {"label": ["cat", "dog"]}}')
    >>> read_classes(data)["classes"]
    {'label': ['cat', 'dog']}
    >>> _ = DatasetFiles(data).classes.write_text('[1, 2]')
    >>> read_classes(data)
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: ...x.msgpack.classes.json: not a class list: the file holds an array, ...
    """
    return read_class_file(DatasetFiles(path).classes)


def read_class_file(file: PathLike) -> dict | None:
    """What the class-list file ``file`` holds (see :func:`read_classes`), checked; None when
    there is no such file.

    >>> read_class_file("/dev/null")
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: /dev/null: not a regular file but a device
    """
    try:
        data = read_regular(file)
    except FileNotFoundError:
        return None
    try:
        stored = json.loads(data)
    except ValueError as error:  # JSON syntax, or bytes that are not UTF-8
        raise FormatError(f"not valid JSON ({error})", path=file) from error
    problem = _classes_problem(stored)
    if problem:
        raise FormatError(f"not a class list: {problem}, not an object like "
                          '{"classes": {"label": ["cat", "dog"]}}', path=file)
    return stored


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number",
               float: "a number", bool: "a boolean", type(None): "null"}


def _classes_problem(stored: Any) -> str:
    """What is wrong with a parsed ``.classes.json`` (empty when nothing is)."""
    if type(stored) is not dict:
        return f"the file holds {_JSON_TYPES[type(stored)]}"
    if "classes" not in stored:
        return 'it has no "classes"'
    classes = stored["classes"]
    if type(classes) is not dict:
        return f'"classes" is {_JSON_TYPES[type(classes)]}'
    for field, names in classes.items():
        if type(names) is not list or not all(type(name) is str for name in names):
            return f'"classes" of {field!r} is not a list of strings'
    return ""
