"""A partition's manifest: the one file whose presence commits the partition, listing its
shards with their sample counts, sizes and MD5s, and the fingerprint of the settings that made
them (so that a rerun with other settings is refused, naming what changed).

>>> shard = {"name": "00000.msgpack", "samples": 2, "size": 30, "md5": "0" * 32}
>>> text = manifest_text(4, "a1b2c3d4e5f6", [shard], {"seed": 0})
>>> parse_manifest(text, "part-000004/manifest.json", 4)["shards"][0]["samples"]
2
>>> parse_manifest('{"format": "other"}', "part-000004/manifest.json", 4)
Traceback (most recent call last):
...
fpipe.errors.FormatError: part-000004/manifest.json: not a partition manifest of fpipe ...
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import re
import types
from collections.abc import Callable
from typing import Any

from fpipe.errors import FormatError

__all__ = ["MANIFEST", "describe_callable", "differences", "manifest_text", "parse_manifest",
           "partition_folder"]

#: The name of a partition's manifest, in its folder.
MANIFEST = "manifest.json"
_FORMAT, _VERSION = "fpipe-partition", 1
_MD5 = re.compile(r"[0-9a-f]{32}")
_SHARD_NAME = re.compile(r"(a-[0-9a-f]{12}/)?\d{5}\.msgpack")
_COUNT_BOUND = 1 << 32


def partition_folder(partition: int) -> str:
    """The folder of partition ``partition`` in a prepared dataset.

    >>> partition_folder(3)
    'part-000003'
    """
    return f"part-{partition:06d}"


def manifest_text(partition: int, attempt: str, shards: list[dict], fingerprint: dict) -> str:
    """The JSON of the manifest of ``partition`` written by ``attempt``: its ``shards``
    (``name``, ``samples``, ``size``, ``md5`` each) and the ``fingerprint`` of its settings."""
    content = {"format": _FORMAT, "version": _VERSION, "partition": partition,
               "attempt": attempt, "samples": sum(shard["samples"] for shard in shards),
               "shards": shards, "fingerprint": fingerprint}
    return json.dumps(content, ensure_ascii=False, sort_keys=True) + "\n"


def parse_manifest(text: str | bytes, where: str, partition: int) -> dict:
    """The manifest of ``partition`` read from ``text`` (found at ``where``), checked: anything
    but a manifest of that partition that fpipe wrote (damaged, foreign, another partition's,
    shards with impossible counts, sizes or MD5s) is a :class:`~fpipe.errors.FormatError`
    naming ``where``."""
    try:
        content = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise FormatError(f"{where}: a partition manifest that is not JSON ({error}); move it "
                          "away, or rerun with restart=True (--restart)") from None
    if not isinstance(content, dict) or content.get("format") != _FORMAT:
        raise FormatError(f"{where}: not a partition manifest of fpipe (no \"format\": "
                          f"\"{_FORMAT}\"); a file of another program is in the way: move it")
    if content.get("version") != _VERSION:
        raise FormatError(f"{where}: a partition manifest of version {content.get('version')!r}, "
                          f"which this fpipe does not read (it reads version {_VERSION})")
    if content.get("partition") != partition:
        raise FormatError(f"{where}: the manifest of partition {content.get('partition')!r} in "
                          f"the folder of partition {partition}")
    _check_shards(content.get("shards"), where)
    if not isinstance(content.get("fingerprint"), dict) or not isinstance(content.get("attempt"), str):
        raise FormatError(f"{where}: a partition manifest without its fingerprint or attempt")
    return content


def _check_shards(shards: Any, where: str) -> None:
    if not isinstance(shards, list):
        raise FormatError(f"{where}: a partition manifest without its list of shards")
    for number, shard in enumerate(shards):
        problem = _shard_problem(shard)
        if problem:
            raise FormatError(f"{where}: shard {number} of the manifest {problem}")


def _shard_problem(shard: Any) -> str:
    if not isinstance(shard, dict):
        return "is not an object"
    if not isinstance(shard.get("name"), str) or not _SHARD_NAME.fullmatch(shard["name"]):
        return f"has the name {shard.get('name')!r:.80}, which no shard of fpipe has"
    for field in ("samples", "size"):
        value = shard.get(field)
        if type(value) is not int or not 0 <= value < (_COUNT_BOUND if field == "samples" else 1 << 63):
            return f"has {field}={value!r:.40}, which no shard can have"
    if not isinstance(shard.get("md5"), str) or not _MD5.fullmatch(shard["md5"]):
        return f"has md5={shard.get('md5')!r:.40}, which is no MD5"
    return ""


def differences(saved: dict, wanted: dict) -> list[str]:
    """What changed between the fingerprint ``saved`` in a manifest and the one ``wanted``
    now, each as ``name (was ..., now ...)``.

    >>> differences({"seed": 0, "shard_size": 10}, {"seed": 1, "shard_size": 10})
    ['seed (was 0, now 1)']
    """
    names = sorted(set(saved) | set(wanted))
    return [f"{name} (was {_shown(saved.get(name))}, now {_shown(wanted.get(name))})"
            for name in names if saved.get(name) != wanted.get(name)]


def _shown(value: Any) -> str:
    return "nothing" if value is None else f"{value!r:.120}"


def describe_callable(func: Callable | None) -> str | None:
    """A text that changes when ``func`` does: its name and a digest of its code, constants
    and defaults (a ``functools.partial`` with its arguments; another callable object by its
    type and pickled state). Moving a function within its file changes nothing; editing its
    body does. What a function reaches through globals or a closure is not included.

    >>> def double(sample):
    ...     return {**sample, "x": 2 * sample["x"]}
    >>> describe_callable(double).startswith("double#")
    True
    >>> describe_callable(None) is None
    True
    """
    if func is None:
        return None
    if isinstance(func, functools.partial):
        return (f"partial({describe_callable(func.func)}, args={func.args!r:.200}, "
                f"keywords={func.keywords!r:.200})")
    code = getattr(func, "__code__", None)
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    if isinstance(code, types.CodeType):
        digest = hashlib.sha256(_code_bytes(code))
        digest.update(repr(getattr(func, "__defaults__", None)).encode())
        digest.update(repr(getattr(func, "__kwdefaults__", None)).encode())
        return f"{name}#{digest.hexdigest()[:12]}"
    try:
        state = pickle.dumps(func, protocol=4)
    except Exception:  # not picklable here: its type says what it is
        state = repr(type(func)).encode()
    return f"{type(func).__qualname__}#{hashlib.sha256(state).hexdigest()[:12]}"


def _code_bytes(code: types.CodeType) -> bytes:
    """The bytecode, names and constants of ``code`` and of the code it nests; not its file
    name or line numbers."""
    parts = [code.co_code, repr(code.co_names).encode(), repr(code.co_varnames).encode()]
    for constant in code.co_consts:
        parts.append(_code_bytes(constant) if isinstance(constant, types.CodeType)
                     else repr(constant).encode())
    return b"\0".join(parts)
