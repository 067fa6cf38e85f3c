"""Damaged Parquet and Arrow IPC files read by fpipe and by pyarrow, in a process of its own.

``python -m tests.reliability.foreign_mutants KIND FOLDER SEED COUNT FIRST`` writes a small
valid file of ``KIND`` (``parquet``, ``arrow-file`` or ``arrow-stream``) in ``FOLDER``, makes
mutants ``FIRST`` to ``COUNT - 1`` of it (seeded: byte flips, truncations and zeroed spans,
anywhere from the first byte to the footer) and reads each with fpipe's reader and with the
reference, pyarrow reading the mutant part by part with full validation. For each mutant it
prints a JSON line ``{"start": n, "what": ...}`` before the reads and
``{"done": n, "verdict": ..., "problem": ...}`` after them.

A read that crashes the interpreter ends this process with a signal, and a read that hangs
for ``CASE_SECONDS`` ends it through :mod:`faulthandler`: the test that started it names the
mutant that had started and not finished.

``python -m tests.reliability.foreign_mutants truncated KIND FOLDER`` opens an fpipe reader
on a file of ``KIND``, cuts the file under it, and prints what every later read gave.
"""

from __future__ import annotations

import faulthandler
import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fpipe.errors import FormatError
from fpipe.formats import ArrowFileReader, ParquetFileReader

CASE_SECONDS = 60
KINDS = ("parquet", "arrow-file", "arrow-stream")


def table(first: int, n: int) -> pa.Table:
    """Rows of the types training data has: keys, numbers, text, bytes, lists, nulls."""
    rows = range(first, first + n)
    return pa.table({"key": [f"k{i:04d}" for i in rows],
                     "n": pa.array(rows, pa.int64()),
                     "score": [i / 7 for i in rows],
                     "text": [f"row {i}: é {i * 7919:x} ü" if i % 5 else "" for i in rows],
                     "blob": [bytes([i % 256]) * (i % 5) for i in rows],
                     "tags": pa.array([[i, -i] if i % 4 else None for i in rows],
                                      pa.list_(pa.int32()))})


def write(kind: str, path: Path, parts: int = 4, rows: int = 6) -> Path:
    """A file of ``kind`` with ``parts`` row groups (record batches) of ``rows`` rows."""
    whole = pa.concat_tables([table(p * rows, rows) for p in range(parts)])
    if kind == "parquet":
        # plain strings (not only a dictionary of them), as many writers leave text
        pq.write_table(whole, path, row_group_size=rows, use_dictionary=["key"])
    else:
        new = pa.ipc.new_file if kind == "arrow-file" else pa.ipc.new_stream
        with new(path, whole.schema) as writer:
            writer.write_table(whole, max_chunksize=rows)
    return path


def suffix(kind: str) -> str:
    return ".parquet" if kind == "parquet" else ".arrow"


def footer_span(kind: str, data: bytes) -> tuple[int, int]:
    """Where the file's footer is (Parquet's file metadata, the Arrow file's footer), or the
    whole file for an Arrow stream (its metadata is spread over its messages)."""
    if kind == "arrow-stream":
        return 0, len(data)
    trailer = 8 if kind == "parquet" else 10
    (length,) = struct.unpack_from("<i", data, len(data) - trailer)
    return len(data) - trailer - length, len(data)


def mutants(kind: str, data: bytes, seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` damaged copies of ``data`` (the same for the same seed): a third at positions
    in the footer, the rest anywhere."""
    rng = np.random.default_rng(seed)
    low, high = footer_span(kind, data)
    for number in range(count):
        at = int(rng.integers(low, high) if number % 3 == 0 else rng.integers(0, len(data)))
        how = ("flip", "truncate", "zero")[int(rng.integers(3))]
        copy = bytearray(data)
        if how == "flip":
            copy[at] ^= int(rng.integers(1, 256))
            yield f"byte {at} xor", bytes(copy)
        elif how == "truncate":
            yield f"cut at byte {at}", bytes(copy[:at])
        else:
            length = int(rng.integers(1, 65))
            copy[at:at + length] = bytes(len(copy[at:at + length]))
            yield f"bytes {at}..{at + length} zeroed", bytes(copy)


# --- the reference: pyarrow, part by part, with full validation --------------------------------

def _validated_rows(part: pa.RecordBatch | pa.Table) -> list[dict]:
    part.validate(full=True)
    return part.to_pylist()


def _parquet_parts(handle: pq.ParquetFile) -> Iterator[Callable[[], list[dict]]]:
    for group in range(handle.num_row_groups):
        yield lambda group=group: _validated_rows(handle.read_row_group(group))


def _arrow_file_parts(handle: pa.ipc.RecordBatchFileReader) -> Iterator[Callable[[], list[dict]]]:
    for number in range(handle.num_record_batches):
        yield lambda number=number: _validated_rows(handle.get_batch(number))


def _open_stream(path: Path) -> tuple[pa.ipc.MessageReader, pa.Schema]:
    messages = pa.ipc.MessageReader.open_stream(pa.BufferReader(path.read_bytes()))
    return messages, pa.ipc.read_schema(messages.read_next_message())


def _arrow_stream_parts(opened: tuple) -> Iterator[Callable[[], list[dict]]]:
    """Each record batch of the stream, decoded by itself, its messages read in order (so a
    message whose framing or metadata is damaged ends what pyarrow can find)."""
    messages, schema = opened
    while True:
        try:
            message = messages.read_next_message()
        except StopIteration:
            return
        if message.type != "record batch":
            raise ValueError(f"a {message.type} message after the schema")
        yield lambda message=message: _validated_rows(pa.ipc.read_record_batch(message, schema))


REFERENCE = {"parquet": (pq.ParquetFile, _parquet_parts),
             "arrow-file": (lambda path: pa.ipc.open_file(pa.BufferReader(path.read_bytes())),
                            _arrow_file_parts),
             "arrow-stream": (_open_stream, _arrow_stream_parts)}


def _attempt(read: Callable[[], list[dict]]) -> list[dict] | None:
    try:
        return read()
    except Exception:  # any failure: the reference has no rows in this part
        return None


def reference(kind: str, path: Path) -> tuple[list | None, bool]:
    """The rows of each part of the file as pyarrow reads them (None for a part that fails
    to read or validate; None for all if pyarrow cannot open the file), and whether these are
    all the parts (pyarrow reads a stream's messages in order: after a damaged one, it finds
    no more)."""
    open_file, parts_of = REFERENCE[kind]
    try:
        handle = open_file(path)
    except Exception:  # any failure: the reference has no rows
        return None, True
    parts: list = []
    try:
        for read in parts_of(handle):
            parts.append(_attempt(read))
    except Exception:  # any failure: the parts after it are unknown
        return [*parts, None], False
    return parts, True


# --- fpipe, judged against the reference -------------------------------------------------------

def _open(kind: str, path: Path) -> ParquetFileReader | ArrowFileReader:
    return ParquetFileReader(path) if kind == "parquet" else ArrowFileReader(path)


def _refusal(error: BaseException, path: Path) -> str | None:
    """None for a FormatError that names the file, else what is wrong with ``error``."""
    if isinstance(error, FormatError) and str(error).startswith(f"{path}: "):
        return None
    return f"{type(error).__name__}: {error}"


def _same(a: object, b: object) -> bool:
    return repr(a) == repr(b)  # exact, and NaN equals NaN


def judge(kind: str, path: Path) -> tuple[str, str | None]:
    """``(verdict, problem)``: the verdict is ``read`` (every part as the reference reads
    it), ``refused`` (a FormatError naming the file for each part where the reference has no
    rows), or ``refused when opened`` (a FormatError naming the file when the reader is made,
    where the reference reads some parts: a damaged header of one part leaves the rows of the
    others without numbers). The problem is None, or what fpipe did wrong: another error, a
    FormatError for a part the reference reads, rows the reference does not have."""
    expected, complete = reference(kind, path)
    try:
        reader = _open(kind, path)
    except Exception as error:  # the test judges every kind
        return ("refused" if expected is None else "refused when opened"), _refusal(error, path)
    if expected is None:
        return "read", f"fpipe opened a file that pyarrow cannot open ({len(reader)} rows)"
    starts = reader.blocks.tolist()
    found = len(starts) - 1
    if found < len(expected) or (complete and found > len(expected)):
        return "read", f"fpipe finds {found} parts where pyarrow finds {len(expected)}"
    if not complete:  # past where pyarrow stops, the bytes after the damage hold the original's
        original = reference(kind, path.with_name(f"original.{kind}"))[0]
        expected += [original[p] if p < len(original) else None
                     for p in range(len(expected), found)]
    verdicts = [_judge_part(reader, path, starts[p], starts[p + 1], expected[p])
                for p in range(found)]
    problems = [problem for _, problem in verdicts if problem]
    verdict = "refused" if any(verdict == "refused" for verdict, _ in verdicts) else "read"
    return verdict, "; ".join(problems) or None


def _key(path: Path, index: int, row: dict) -> str:
    """The key of ``row``: its key column's value as str; without one (a damaged column name),
    ``<file name>:<index>``."""
    return str(row["key"]) if "key" in row else f"{path.name}:{index}"


def _judge_part(reader, path: Path, start: int, stop: int, rows: list | None) -> tuple[str, str | None]:
    try:
        got = reader.get_slice(start, stop)
        last = reader.get(stop - 1, yield_key=True) if stop > start else None
    except Exception as error:  # the test judges every kind
        if rows is not None and len(rows) == stop - start:  # else its metadata is wrong
            return "refused", f"rows {start}..{stop} refused where pyarrow reads them: {error}"
        return "refused", _refusal(error, path)
    if rows is None:
        return "read", f"rows {start}..{stop} read where pyarrow finds the part damaged"
    if not _same(got, rows) or (last is not None and not _same(last, (_key(path, stop - 1, rows[-1]),
                                                                      rows[-1]))):
        return "read", f"rows {start}..{stop} differ from pyarrow's"
    return "read", None


def campaign(kind: str, folder: Path, seed: int, count: int, first: int) -> None:
    data = write(kind, folder / f"original.{kind}").read_bytes()
    for number, (what, mutant) in enumerate(mutants(kind, data, seed, count)):
        if number < first:
            continue
        print(json.dumps({"start": number, "what": what}), flush=True)
        path = folder / f"mutant-{number:04d}{suffix(kind)}"
        path.write_bytes(mutant)
        faulthandler.dump_traceback_later(CASE_SECONDS, exit=True)
        verdict, problem = judge(kind, path)
        faulthandler.cancel_dump_traceback_later()
        path.unlink()
        print(json.dumps({"done": number, "verdict": verdict, "problem": problem}), flush=True)


# --- a file cut under an open reader -----------------------------------------------------------

def truncated(kind: str, folder: Path) -> dict:
    """Read the first row group or record batch, cut the file to a third, read every row
    again."""
    path = write(kind, folder / f"cut{suffix(kind)}", parts=8, rows=20_000)
    reader = ParquetFileReader(path, cache_bytes=0) if kind == "parquet" else ArrowFileReader(
        path, cache_bytes=0)
    first = reader[0]
    os.truncate(path, path.stat().st_size // 3)
    outcomes = {}
    for index in range(0, len(reader), 10_000):
        try:
            reader.get(index)
            outcomes[index] = "ok"
        except Exception as error:  # the test judges every kind
            outcomes[index] = f"{type(error).__name__}: {error}"
    return {"path": str(path), "first": first["key"], "reads": outcomes}


if __name__ == "__main__":
    faulthandler.enable()
    if sys.argv[1] == "truncated":
        print(json.dumps(truncated(sys.argv[2], Path(sys.argv[3]))), flush=True)
    else:
        campaign(sys.argv[1], Path(sys.argv[2]), *map(int, sys.argv[3:6]))
