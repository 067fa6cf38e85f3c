"""Seeded mutants of a dataset's key index and of a shard index, judged in a process of their
own: ``python -m tests.reliability.index_mutants KIND FOLDER FIRST COUNT`` writes the dataset
(or the shards) into ``FOLDER``, then for each mutant ``FIRST`` to ``FIRST + COUNT - 1`` prints
a JSON line ``{"mutant", "damage"}`` before it reads and ``{"mutant", "outcome"}`` after, so
that a mutant that kills or hangs the process is named by the last line. Each mutant has 60 s
(``faulthandler`` ends the process with the stacks after that).

``KIND`` is ``key_index`` (bit flips, zeroed spans, truncations and bytes appended, at places
spread over the file's sections: a section drawn first, so that the 64-byte header is hit as
often as the entries) or ``shard_index`` (the same over the JSON text, and counts
and names changed as a stale or hand-edited index has them). An outcome is ``ok`` (every
answer right), ``warned`` (every answer right, with a warning naming the index), ``error``
(FormatError naming the index; for a shard index, FileNotFoundError for a shard name that
names no file), or ``wrong: ...`` / ``crash: ...``, which the test counts as failures.
"""

from __future__ import annotations

import faulthandler
import json
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from fpipe.dataset import FileWriter, MsgpackReader, ShardedReader, ShardedWriter
from fpipe.dataset.format import DatasetFiles
from fpipe.errors import FormatError

SEED = 39
TIMEOUT = 60
SAMPLES = 300
KEYS = [f"k{i:04d}-é" if i % 9 == 0 else f"k{i:04d}" for i in range(SAMPLES)]
ABSENT = ["absent", "k0300", "k0009", ""]
SHARD_SIZE, SHARD_SAMPLES = 7, 20


class Wrong(Exception):
    """An answer that is not what was written."""


def _expect(got: object, expected: object, what: str) -> None:
    if got != expected:
        raise Wrong(f"{what}: {got!r:.120} instead of {expected!r:.120}")


# --- the key index ---------------------------------------------------------------------------

def _key_index_sections(data: bytes) -> list[tuple[int, int]]:
    """The byte ranges of the sections of the key index ``data``, by its documented layout:
    header, directory, entries, key places, and the checksums after them."""
    bits, n = int.from_bytes(data[12:16], "big"), int.from_bytes(data[16:24], "big")
    entries = 64 + 8 * ((1 << bits) + 1)
    bounds = [0, 64, entries, entries + 16 * n, entries + 24 * n + 8, len(data)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


def _spot(rng: np.random.Generator, sections: list[tuple[int, int]]) -> int:
    """A byte in a section drawn at random (small sections as likely as large ones)."""
    start, stop = sections[rng.integers(len(sections))]
    return int(rng.integers(start, stop))


def mutate_bytes(data: bytes, rng: np.random.Generator,
                 sections: list[tuple[int, int]]) -> tuple[bytes, str]:
    """``data`` with one seeded change, and what it was."""
    mutant, kind = bytearray(data), rng.choice(["flip", "flip", "zero", "truncate", "append"])
    if kind == "flip":
        at, bit = _spot(rng, sections), int(rng.integers(8))
        mutant[at] ^= 1 << bit
        return bytes(mutant), f"bit {bit} of byte {at} flipped"
    if kind == "zero":
        at = _spot(rng, sections)
        length = int(rng.integers(1, 257))
        mutant[at:at + length] = bytes(len(mutant[at:at + length]))
        return bytes(mutant), f"bytes {at} to {at + length} zeroed"
    if kind == "truncate":
        size = int(rng.integers(len(data)))
        return bytes(mutant[:size]), f"cut to {size} bytes"
    extra = rng.bytes(int(rng.integers(1, 64)))
    return bytes(mutant) + extra, f"{len(extra)} bytes appended"


def _key_answers(path: Path, by_index_first: bool) -> None:
    """Every question a new reader of ``path`` answers about keys, each checked."""
    reader = MsgpackReader(path)

    def by_key() -> None:
        _expect([reader.find_index(key) for key in KEYS], list(range(SAMPLES)), "find_index")
        _expect(all(key in reader for key in KEYS), True, "a present key in the reader")

    def by_index() -> None:
        _expect([reader.find_key(i) for i in range(SAMPLES)], KEYS, "find_key")
        _expect([key for key, _ in reader.iter(0, SAMPLES, yield_key=True, chunk_size=64)],
                KEYS, "iter(yield_key=True)")
        _expect([key for key, _ in reader.get_slice(5, 77, yield_key=True)], KEYS[5:77],
                "get_slice(yield_key=True)")
        _expect([reader.get(i, yield_key=True) for i in (0, 64, SAMPLES - 1)],
                [(KEYS[i], {"key": KEYS[i], "i": i}) for i in (0, 64, SAMPLES - 1)],
                "get(yield_key=True)")
    for ask in (by_index, by_key) if by_index_first else (by_key, by_index):
        ask()
    for key in ABSENT:
        _expect(key in reader, False, f"{key!r} in the reader")
        try:
            found = reader.find_index(key)
        except KeyError:
            continue
        raise Wrong(f"find_index({key!r}) gave {found} for an absent key")


def _judge(read: Callable[[], None], names: tuple[str, ...], missing_ok: bool = False) -> str:
    """The outcome of ``read`` (which raises Wrong on a wrong answer): an error must name one
    of ``names``; with ``missing_ok``, FileNotFoundError is an error too (a shard name
    changed into the name of no file)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            read()
        except Wrong as error:
            return f"wrong: {error}"
        except FormatError as error:
            return "error" if any(name in str(error) for name in names) else f"crash: {error!r}"
        except FileNotFoundError as error:
            return "error" if missing_ok and error.filename else f"crash: {error!r}"
        except Exception as error:  # any other kind is what the campaign looks for
            return f"crash: {type(error).__name__}: {error}"
    said = [str(warning.message) for warning in caught]
    if said and all(any(name in message for name in names) for message in said):
        return "warned"
    return "ok" if not said else f"crash: unexpected warnings {said}"


def _worst(outcomes: list[str]) -> str:
    """The outcome that says most: a failure, else an error, a warning, ok."""
    rank = {"ok": 0, "warned": 1, "error": 2}
    return max(outcomes, key=lambda outcome: rank.get(outcome, 3))


def write_dataset(folder: Path) -> Path:
    path = folder / "set.msgpack"
    with FileWriter(path, overwrite=True) as writer:
        for i, key in enumerate(KEYS):
            writer.write({"key": key, "i": i})
    return path


def key_index_mutant(folder: Path, mutant: int, original: bytes) -> tuple[str, Callable]:
    """Write mutant ``mutant`` of the key index ``original``; what it is, and its judge."""
    path = folder / "set.msgpack"
    damaged, damage = mutate_bytes(original, np.random.default_rng([SEED, mutant]),
                                   _key_index_sections(original))
    DatasetFiles(path).key_index.write_bytes(damaged)

    def judge() -> str:
        names = ("set.msgpack.key_index",)
        return _worst([_judge(partial(_key_answers, path, first), names)
                       for first in (False, True)])
    return damage, judge


# --- the shard index -------------------------------------------------------------------------

STRANGE_COUNTS = [0, 1, 6, 8, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64, -1, -2**63,
                  1.5, 7.0, "7", None, True, [], {}, 10**30]


def write_shards(folder: Path) -> Path:
    with ShardedWriter(folder / "train", shard_size=SHARD_SIZE, overwrite=True) as writer:
        for i in range(SHARD_SAMPLES):
            writer.write({"key": f"s{i:03d}", "i": i})
    return folder / "train.shards"


def mutate_shard_index(text: bytes, rng: np.random.Generator) -> tuple[bytes, str, int | None]:
    """The shard index ``text`` with one seeded change, to its bytes or to its content; what
    it was; and the shard it leaves out of a well-formed index (another dataset), if any."""
    if rng.random() < 0.5:
        return (*mutate_bytes(text, rng, [(0, len(text))]), None)
    content = json.loads(text)
    shards, counts = content["shards"], content["samples"]
    which = int(rng.integers(len(shards)))
    change = rng.choice(["count", "count", "drop count", "drop shard", "repeat name", "swap counts"])
    if change == "count":
        value = STRANGE_COUNTS[rng.integers(len(STRANGE_COUNTS))]
        counts[which] = value
        damage = f"count {which} set to {value!r}"
    elif change == "drop count":
        del counts[which]
        damage = f"count {which} left out"
    elif change == "drop shard":
        del shards[which], counts[which]
        return json.dumps(content).encode(), f"shard {which} left out (a smaller dataset)", which
    elif change == "repeat name":
        other = (which + 1) % len(shards)
        shards[which] = shards[other]
        damage = f"shard {which} named as shard {other}"
    else:
        counts.reverse()
        damage = "counts in reverse order"
    return json.dumps(content).encode(), damage, None


def _shard_answers(index: Path, expected: list[dict]) -> None:
    reader = ShardedReader(index)
    _expect(len(reader), len(expected), "len")
    _expect([reader.get(i) for i in range(len(expected))], expected, "get")
    _expect(list(reader.iter(chunk_size=3)), expected, "iter")
    _expect(reader.get_slice(2, 17), expected[2:17], "get_slice")
    _expect([reader.find_index(sample["key"]) for sample in expected],
            list(range(len(expected))), "find_index")
    _expect([reader.find_key(i) for i in range(len(expected))],
            [sample["key"] for sample in expected], "find_key")


def shard_index_mutant(folder: Path, mutant: int, original: bytes) -> tuple[str, Callable]:
    index = folder / "train.shards"
    damaged, damage, gone = mutate_shard_index(original, np.random.default_rng([SEED, mutant]))
    index.write_bytes(damaged)
    expected = [{"key": f"s{i:03d}", "i": i} for i in range(SHARD_SAMPLES)
                if i // SHARD_SIZE != gone]
    return damage, lambda: _judge(lambda: _shard_answers(index, expected), ("train.shards",),
                                  missing_ok=True)


# --- the process -----------------------------------------------------------------------------

KINDS = {"key_index": (write_dataset, lambda path: DatasetFiles(path).key_index, key_index_mutant),
         "shard_index": (write_shards, lambda path: path, shard_index_mutant)}


def run(kind: str, folder: Path, first: int, count: int) -> None:
    write, target, mutant_of = KINDS[kind]
    original = target(write(folder)).read_bytes()
    for mutant in range(first, first + count):
        damage, judge = mutant_of(folder, mutant, original)
        print(json.dumps({"mutant": mutant, "damage": damage}), flush=True)
        faulthandler.dump_traceback_later(TIMEOUT, exit=True)
        outcome = judge()
        faulthandler.cancel_dump_traceback_later()
        print(json.dumps({"mutant": mutant, "outcome": outcome}), flush=True)


if __name__ == "__main__":
    run(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
