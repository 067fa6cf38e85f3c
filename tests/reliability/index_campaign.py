"""Data files with a few damaged bytes and no index, recovered by ``rebuild_index``, in a
process of its own: ``python -m tests.reliability.index_campaign SEED COUNT FOLDER`` prints,
as one JSON line, what the recovery did to each file.

A file is a few dozen samples of one of several kinds (fields that only some samples have,
samples of very different sizes, numpy arrays, maps with a ``"key"`` nested in samples),
with 1 to 3 of its bytes changed. An *intact* sample is one whose bytes no change touched.
Each file is recovered twice: without ``drop_damaged`` (which may refuse, changing nothing,
or cut off an incomplete last sample, keeping its bytes), then with it. Every intact sample
must come back, in order and byte for byte, or the recovery must refuse.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fpipe.cli.repair import check_dataset
from fpipe.dataset import DamagedDataError, MsgpackReader, pack_sample, rebuild_index
from fpipe.dataset.recovery import UndecidedDataError
from fpipe.errors import FormatError


def _fields(rng, i: int) -> dict:
    sample = {"key": f"f{i:03d}", "x": rng.bytes(int(rng.integers(0, 60)))}
    if i % 7 == 0:
        sample["extra"] = int(rng.integers(0, 1000))
    if i > 20:
        sample["late"] = "later samples have a field the first ones lack"
    return sample


def _sizes(rng, i: int) -> dict:
    return {"key": f"s{i:03d}", "blob": rng.bytes(int(rng.choice([3, 40, 700, 5000])))}


def _arrays(rng, i: int) -> dict:
    return {"key": f"a{i:03d}", "image": rng.integers(0, 255, (3, 2 + i % 4), dtype=np.uint8),
            "box": rng.normal(size=4).astype("<f4"), "label": i % 5}


def _nested(rng, i: int) -> dict:
    objects = [{"key": f"o{i}-{j}", "box": rng.integers(0, 9, 4).tolist()}
               for j in range(int(rng.integers(0, 3)))]
    return {"key": f"n{i:03d}", "objects": objects, "blob": rng.bytes(20)}


KINDS = {"fields": _fields, "sizes": _sizes, "arrays": _arrays, "nested": _nested}


def damaged_file(seed: int, number: int) -> tuple[str, list[bytes], bytes, set[int]]:
    """File ``number`` of campaign ``seed``: its kind, the samples as written, the damaged
    bytes, and which samples the damage touched."""
    rng = np.random.default_rng([seed, number])
    kind = list(KINDS)[number % len(KINDS)]
    spans = [pack_sample(KINDS[kind](rng, i)) for i in range(int(rng.integers(12, 50)))]
    data = bytearray(b"".join(spans))
    ends = np.cumsum([len(span) for span in spans])
    touched = set()
    for position in rng.choice(len(data), int(rng.integers(1, 4)), replace=False).tolist():
        data[position] = (data[position] + int(rng.integers(1, 256))) % 256
        touched.add(int(np.searchsorted(ends, position, side="right")))
    return kind, spans, bytes(data), touched


def _recovered(path: Path) -> list[bytes]:
    with MsgpackReader(path) as reader:
        return list(reader.iter(raw=True))


def _lost(spans: list[bytes], touched: set[int], recovered: list[bytes]) -> list[int]:
    """The intact samples that did not come back, in order and byte for byte."""
    lost, position = [], 0
    for i in range(len(spans)):
        if i in touched:
            continue
        try:
            position = recovered.index(spans[i], position) + 1
        except ValueError:
            lost.append(i)
    return lost


def recover(folder: Path, seed: int, number: int) -> dict:
    """What the recovery did to file ``number``, without and with ``drop_damaged``."""
    kind, spans, data, touched = damaged_file(seed, number)
    path = folder / f"{number}" / "set.msgpack"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    outcome = {"file": number, "kind": kind, "touched": sorted(touched)}
    for drop in (False, True):
        step = "drop" if drop else "ask"
        try:
            report = rebuild_index(path, drop_damaged=drop)
        except (DamagedDataError, UndecidedDataError) as refusal:
            changed = path.read_bytes() != data or len(list(path.parent.iterdir())) != 1
            outcome[step] = f"{'changed files, then ' if changed else ''}refused: {type(refusal).__name__}"
            continue
        except FormatError as error:  # a changed key that another sample has
            outcome[step] = f"FormatError: {error}"
            continue
        outcome[step] = _result(path, data, spans, touched, report)
        break
    return outcome


def _result(path: Path, data: bytes, spans: list[bytes], touched: set[int], report) -> dict:
    """What a recovery that went through did: the intact samples it lost, whether verify
    passes the result, and whether the bytes it dropped or cut are kept."""
    recovered = _recovered(path)
    dropped = report.valid_bytes < len(data)
    kept = [p for p in (report.backup, getattr(report, "cut_copy", None)) if p is not None]
    return {"samples": report.samples, "damaged": len(report.damaged),
            "lost": _lost(spans, touched, recovered),
            "verified": check_dataset(path, argparse.Namespace(quick=False, quiet=True))[0] == [],
            "dropped_and_kept": not dropped or any(p.exists() for p in kept)}


def main(seed: int, count: int, folder: Path) -> None:
    print(json.dumps([recover(folder, seed, number) for number in range(count)]))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
