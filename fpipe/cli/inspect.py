"""``fpipe cat`` (readable sample dumps) and ``fpipe info`` (what a dataset holds)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fpipe.cli._common import (
    UsageError,
    add_command,
    dataset_key_batches,
    human_bytes,
    non_negative_int,
    open_dataset,
    positive_int,
    progress_bar,
    refuse_options,
)
from fpipe.cli._index_checks import read_index
from fpipe.cli._labels import class_lists, field_value
from fpipe.errors import FpipeError
from fpipe.files import DatasetFiles

__all__ = ["FieldSummary", "add_parsers", "key_line", "short_repr"]

_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF8", "GIF"),
          (b"RIFF", "RIFF/WebP"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))
_LIST_ITEMS = 8
_NEEDS_QUOTES = re.compile("[\x00-\x1f\x7f]")
_BAR_WIDTH = 40
_SAMPLES = 1000  # fpipe info examines this many samples unless --samples or --all
_LABEL = "label"  # the field of fpipe info's histogram unless --label
_MAX_STRING = 40  # fpipe cat shortens longer bytes and strings
# fpipe info counts the labels of every sample of a local data file this large at most. Reading
# only the label costs reading the file: 0.34 s for 668 MB from the page cache, seconds from disk
_LABEL_SCAN_BYTES = 1 << 30
_ABSENT = object()  # a sample without the label field
_OFFSETS_WINDOW = 1 << 16  # offsets fpipe info reads at a time
_KEY_BATCH = 1 << 16  # keys fpipe info reads at a time


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe cat`` and ``fpipe info``."""
    _add_cat(commands)
    _add_info(commands)


def _add_cat(commands: argparse._SubParsersAction) -> None:
    cat = add_command(commands, "cat", "print samples readably",
                      "Print samples, one per line, with long bytes, strings, lists and arrays "
                      "shortened. Piping into head or less and quitting early is fine.",
                      "  fpipe cat train.msgpack | head -3\n  fpipe cat train.msgpack --key "
                      "cat/1.jpg\n  fpipe cat train.msgpack --keys > keys.txt", _run_cat)
    cat.add_argument("dataset", metavar="DATASET", help="the dataset file (X.msgpack), or its URL")
    cat.add_argument("--start", type=non_negative_int, help="first sample (0)")
    cat.add_argument("-n", "--limit", type=non_negative_int, help="print at most this many samples")
    cat.add_argument("--key", action="append", metavar="KEY",
                     help="print the sample with this key (repeatable)")
    cat.add_argument("--keys", action="store_true",
                     help="print only the keys, one a line; a key with a control character "
                          "(a newline, ...) or a leading '\"' is printed as a JSON string")
    cat.add_argument("-z", "--null", action="store_true",
                     help="with --keys: end each key with a NUL byte instead, printed as it is "
                          "(for xargs -0)")
    cat.add_argument("-s", "--max-string", type=positive_int, metavar="N",
                     help=f"shorten bytes and strings longer than N ({_MAX_STRING})")


def _add_info(commands: argparse._SubParsersAction) -> None:
    info = add_command(commands, "info", "summarise a dataset: sizes, keys, fields, labels",
                       "Summarise a dataset: sample count, file and sample sizes, the range of "
                       "keys, the fields with their types and value ranges, and a histogram of "
                       "the label field (with the class names stored beside the dataset). "
                       "Fields come from --samples samples spread over the dataset, or from "
                       "every sample with --all. The histogram counts every sample when the "
                       "data file is local and at most 1 GiB (it reads only the label, about a "
                       "second), else the same samples as the fields; it says which. It reads "
                       "the index files a window at a time, in the same memory at any size.",
                       "  fpipe info train.msgpack\n  fpipe info train.msgpack --all --json",
                       _run_info)
    info.add_argument("dataset", metavar="DATASET", help="the dataset file (X.msgpack), or its URL")
    info.add_argument("--samples", type=positive_int, metavar="N",
                      help=f"examine N samples spread evenly over the dataset ({_SAMPLES})")
    info.add_argument("--all", action="store_true", help="examine every sample")
    info.add_argument("--label", metavar="FIELD",
                      help="the field to count in the histogram (label)")
    info.add_argument("--json", action="store_true", help="print the summary as JSON")
    info.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


# --- cat --------------------------------------------------------------------------------


def _run_cat(args: argparse.Namespace) -> int:
    _check_cat_options(args)
    with open_dataset(args.dataset) as reader:
        if args.start and args.start >= len(reader):
            raise UsageError(f"--start {args.start} is past the end: {args.dataset} has "
                             f"{len(reader)} samples")
        write = sys.stdout.write
        if args.keys:
            line = _null_ended if args.null else key_line
            for key in _selected(reader, args, keys_only=True):
                write(line(key))
        else:
            width = args.max_string or _MAX_STRING
            for sample in _selected(reader, args, keys_only=False):
                write(short_repr(sample, width) + "\n")
    return 0


def _check_cat_options(args: argparse.Namespace) -> None:
    if args.key:
        refuse_options({"--start": args.start, "-n/--limit": args.limit},
                       "with --key, which picks the samples by their keys")
    if args.keys:
        refuse_options({"-s/--max-string": args.max_string}, "with --keys, which prints keys whole")
    else:
        refuse_options({"-z/--null": args.null}, "without --keys: it ends each key with a NUL "
                       "byte")


def _selected(reader: Any, args: argparse.Namespace, keys_only: bool) -> Iterator:
    if args.key:
        for key in args.key:
            try:
                index = reader.find_index(key)
            except KeyError:
                raise UsageError(f"{args.dataset} has no sample with key {key!r}") from None
            yield reader.find_key(index) if keys_only else reader.get(index)
        return
    start = args.start or 0
    stop = len(reader) if args.limit is None else min(len(reader), start + args.limit)
    if keys_only:
        yield from (reader.find_key(i) for i in range(start, stop))
    elif start < stop:
        yield from reader.iter(start, stop)


def key_line(key: str) -> str:
    """``key`` as a line of ``fpipe cat --keys``: as it is, or as a JSON string when it holds
    a control character (which would break the line) or begins with a double quote.

    >>> print(key_line("cat/1.jpg"), key_line("two\\nlines"), key_line('"quoted"'), sep="", end="")
    cat/1.jpg
    "two\\nlines"
    "\\"quoted\\""
    """
    if _NEEDS_QUOTES.search(key) or key.startswith('"'):
        return json.dumps(key, ensure_ascii=False) + "\n"
    return key + "\n"


def _null_ended(key: str) -> str:
    if "\0" in key:
        raise FpipeError(f"key {key!r} holds a NUL character, which -z/--null cannot separate; "
                         "leave out -z to print it as a JSON string")
    return key + "\0"


def short_repr(value: Any, width: int = 40) -> str:
    """``repr(value)`` with bytes and strings longer than ``width`` cut, long lists shortened
    and arrays summarised (map keys, and the value of ``"key"``, are never cut).

    >>> print(short_repr({"key": "a", "data": b"abcdefgh", "xs": list(range(20))}, 4))
    {'key': 'a', 'data': b'abcd'...(8 bytes), 'xs': [0, 1, 2, 3, 4, 5, 6, 7, ...(20 items)]}
    >>> short_repr(np.zeros((2, 3), np.uint8))
    'array(shape=(2, 3), dtype=uint8)'
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return repr(data) if len(data) <= width else f"{data[:width]!r}...({len(data)} bytes)"
    if isinstance(value, str):
        return repr(value) if len(value) <= width else f"{value[:width]!r}...({len(value)} chars)"
    if isinstance(value, dict):
        # Field names and the sample's key are shown whole: they identify what is shortened.
        items = ", ".join(f"{k!r}: {v!r}" if k == "key" and isinstance(v, str) else
                          f"{k!r}: {short_repr(v, width)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, (list, tuple)):
        shown = [short_repr(item, width) for item in value[:_LIST_ITEMS]]
        if len(value) > _LIST_ITEMS:
            shown.append(f"...({len(value)} items)")
        return "[" + ", ".join(shown) + "]"
    if isinstance(value, np.ndarray):
        if value.size <= _LIST_ITEMS and value.ndim <= 1:
            return f"array({value.tolist()!r}, dtype={value.dtype})"
        return f"array(shape={value.shape}, dtype={value.dtype})"
    return repr(value)


# --- info -------------------------------------------------------------------------------


def _run_info(args: argparse.Namespace) -> int:
    if args.all:
        refuse_options({"--samples": args.samples}, "with --all, which examines every sample")
    asked, args.label = args.label is not None, args.label or _LABEL
    with open_dataset(args.dataset) as reader:
        summary = _file_summary(reader, args.dataset)
        indices = _examined(len(reader), None if args.all else args.samples or _SAMPLES)
        fields, labels = _content_summary(reader, indices, args)
        counted = len(indices)
        if counted < len(reader) and reader.url is None \
                and summary["data_bytes"] <= _LABEL_SCAN_BYTES:
            labels, counted = _every_label(reader, args), len(reader)
    summary["examined"] = len(indices)
    summary["fields"] = {name: field.as_dict() for name, field in fields.items()}
    summary["labels"] = _label_summary(args, labels, counted)
    if asked and not labels:
        print(f"fpipe info: note: no sample of the {counted} counted has the field "
              f"{args.label!r}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, indent=1, ensure_ascii=False))
    else:
        print("\n".join(_info_lines(summary)))
    return 0


def _file_summary(reader: Any, given: str) -> dict:
    """What ``fpipe info`` says of the files of ``reader``, the dataset named ``given``."""
    files = DatasetFiles(reader.path)
    n = len(reader)
    sizes, end = _sample_sizes(files)
    present = {path.name: path.stat().st_size for path in (*files.all_files, files.legacy_index)
               if path.exists()}
    if reader.url is not None:  # the index files are in the cache; the data stays remote
        present[files.data.name] = end
    return {
        "path": reader.url or given,  # as the user named it (reader.path is absolute)
        "samples": n,
        "files": present,
        "data_bytes": present.get(files.data.name, 0),
        "index_bytes": sum(size for name, size in present.items() if name != files.data.name),
        "sample_bytes": sizes if n else None,
        "keys": _key_range(reader) if n else None,
    }


def _sample_sizes(files: DatasetFiles) -> tuple[dict | None, int]:
    """The smallest, mean and largest sample size (None without samples), and where the last
    sample ends: the offsets read a window at a time."""
    index = read_index(files)
    count = index.offset_count
    low, high, first, last = None, None, 0, 0
    for start in range(0, count, _OFFSETS_WINDOW):
        window = index.offsets(start, min(count, start + _OFFSETS_WINDOW + 1))
        if start == 0:
            first = int(window[0])
        last = int(window[-1])
        sizes = np.diff(window)
        if sizes.size:
            low = int(sizes.min()) if low is None else min(low, int(sizes.min()))
            high = int(sizes.max()) if high is None else max(high, int(sizes.max()))
    if low is None:
        return None, last
    return {"min": low, "mean": (last - first) / (count - 1), "max": high}, last


def _key_range(reader: Any) -> dict:
    """The first and last key in file order and in sorted order: the keys read a batch at a
    time."""
    first = last = low = high = None
    for _, batch in dataset_key_batches(reader, _KEY_BATCH):
        if first is None:
            first = low = high = batch[0]
        last, low, high = batch[-1], min(low, min(batch)), max(high, max(batch))
    return {"first": first, "last": last, "min": low, "max": high}


def _examined(n: int, limit: int | None) -> Sequence[int]:
    """All indices, or ``limit`` of them spread evenly from the first to the last."""
    if limit is None or limit >= n:
        return range(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64)).tolist()


def _content_summary(reader: Any, indices: Sequence[int], args: argparse.Namespace) -> tuple:
    fields: dict[str, FieldSummary] = {}
    labels: Counter = Counter()
    everything = len(indices) == len(reader)
    samples = reader.iter() if everything else map(reader.get, indices)
    for sample in progress_bar(args, samples, total=len(indices), desc="examining", unit=" samples"):
        if not isinstance(sample, dict):
            fields.setdefault("(not a map)", FieldSummary()).add(sample)
            continue
        for name, value in sample.items():
            fields.setdefault(str(name), FieldSummary()).add(value)
        if args.label in sample:
            labels[_hashable(sample[args.label])] += 1
    return fields, labels


def _every_label(reader: Any, args: argparse.Namespace) -> Counter:
    """The label histogram of every sample, read in file order, decoding only the label."""
    labels: Counter = Counter()
    samples = progress_bar(args, reader.iter(raw=True), total=len(reader),
                           desc="counting labels", unit=" samples")
    for index, data in enumerate(samples):
        value = field_value(data, args.label, _ABSENT, path=reader.path, index=index)
        if value is not _ABSENT:
            labels[_hashable(value)] += 1
    return labels


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


class FieldSummary:
    """Running summary of one field's values: how many, of which types, numeric and length
    ranges, image formats of bytes values, shapes and dtypes of arrays.

    >>> summary = FieldSummary()
    >>> for value in (3, 7, b"\\xff\\xd8\\xff\\xe0"):
    ...     summary.add(value)
    >>> summary.describe()
    'int 2 (3 .. 7); bytes 1 (4 .. 4 bytes, JPEG 1)'
    """

    def __init__(self) -> None:
        self.count = 0
        self.types: Counter = Counter()
        self.ranges: dict[str, list] = {}
        self.details: dict[str, Counter] = {}

    def add(self, value: Any) -> None:
        """Count one value."""
        self.count += 1
        kind = _type_name(value)
        self.types[kind] += 1
        measure, detail = _measure(value)
        if measure is not None:
            low, high = self.ranges.get(kind, (measure, measure))
            self.ranges[kind] = [min(low, measure), max(high, measure)]
        if detail is not None:
            self.details.setdefault(kind, Counter())[detail] += 1

    def as_dict(self) -> dict:
        """The summary as plain JSON-ready data."""
        return {"count": self.count, "types": {
            kind: {"count": count, **({"range": self.ranges[kind]} if kind in self.ranges else {}),
                   **({"kinds": dict(self.details[kind].most_common(5))}
                      if kind in self.details else {})}
            for kind, count in self.types.most_common()}}

    def describe(self) -> str:
        """One line: each type with its count, range and most common details."""
        return "; ".join(_describe_type(kind, info) for kind, info in self.as_dict()["types"].items())


def _type_name(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return "array"
    if isinstance(value, np.generic):
        return f"numpy {value.dtype}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    return {dict: "map", list: "list", tuple: "list", type(None): "nil"}.get(
        type(value), type(value).__name__)


def _measure(value: Any) -> tuple[Any, Any]:
    """A number whose range is worth showing, and a detail worth counting."""
    if isinstance(value, bool) or value is None:
        return None, None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return value.item() if isinstance(value, np.generic) else value, None
    if isinstance(value, (bytes, bytearray, memoryview)):
        head = bytes(value[:8])
        return len(value), next((name for magic, name in _MAGIC if head.startswith(magic)), None)
    if isinstance(value, (str, list, tuple, dict)):
        return len(value), None
    if isinstance(value, np.ndarray):
        return None, f"{value.dtype}{list(value.shape)}"
    return None, None


def _describe_type(kind: str, info: dict) -> str:
    unit = {"bytes": " bytes", "str": " chars", "list": " items", "map": " keys"}.get(kind, "")
    text = f"{kind} {info['count']}"
    parts = []
    if "range" in info:
        low, high = info["range"]
        parts.append(f"{_number(low)} .. {_number(high)}{unit}")
    if "kinds" in info:
        parts.append(", ".join(f"{name} {count}" for name, count in info["kinds"].items()))
    return text + (f" ({', '.join(parts)})" if parts else "")


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _label_summary(args: argparse.Namespace, counts: Counter, counted: int) -> dict | None:
    """The histogram of the label field over ``counted`` samples, with the class names."""
    if not counts:
        return None
    is_url = "://" in str(args.dataset)  # no class list is fetched with a remote dataset
    names = ({} if is_url else class_lists(args.dataset) or {}).get(args.label, [])
    rows = sorted(counts.items(), key=_label_order)
    return {"field": args.label, "counted": counted, "counts": [
        {"value": value, "count": count,
         **({"name": names[value]} if isinstance(value, int) and 0 <= value < len(names) else {})}
        for value, count in rows]}


def _label_order(item: tuple) -> tuple:
    value = item[0]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 0, value, ""
    return 1, 0, str(value)


def _info_lines(summary: dict) -> list[str]:
    """The summary as the text that fpipe info prints."""
    lines = [f"dataset      {summary['path']}",
             f"samples      {summary['samples']}",
             f"data file    {human_bytes(summary['data_bytes'])} (+ {human_bytes(summary['index_bytes'])}"
             f" index, {len(summary['files']) - 1} files)"]
    if summary["sample_bytes"]:
        sizes = summary["sample_bytes"]
        lines.append(f"sample size  {human_bytes(sizes['min'])} .. {human_bytes(sizes['max'])}, "
                     f"mean {human_bytes(sizes['mean'])}")
        keys = summary["keys"]
        lines.append(f"keys         {keys['first']!r} .. {keys['last']!r} in file order; "
                     f"sorted {keys['min']!r} .. {keys['max']!r}")
    lines.append(f"fields       (from {summary['examined']} of {summary['samples']} samples)")
    width = max([len(name) for name in summary["fields"]] + [4])
    for name, info in summary["fields"].items():
        text = "; ".join(_describe_type(kind, detail) for kind, detail in info["types"].items())
        lines.append(f"  {name:<{width}}  {text}")
    if summary["labels"]:
        lines.extend(_histogram_lines(summary["labels"], summary["samples"]))
    return lines


def _histogram_lines(labels: dict, samples: int) -> list[str]:
    rows = labels["counts"]
    top = max(row["count"] for row in rows)
    names = [f"{row['value']}" + (f" {row['name']}" if "name" in row else "") for row in rows]
    width = max(len(name) for name in names)
    counted = (f"in all {samples} samples" if labels["counted"] == samples else
               f"in {labels['counted']} of {samples} samples, spread evenly (--all counts every one)")
    lines = [f"labels       {labels['field']}: {len(rows)} values, counted {counted}"]
    for name, row in zip(names, rows):
        bar = "#" * max(1, round(_BAR_WIDTH * row["count"] / top))
        lines.append(f"  {name:<{width}}  {row['count']:>8}  {bar}")
    return lines
