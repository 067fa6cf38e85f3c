"""Two revisions of fpipe side by side: the same workloads, alternating, and the files each writes.

``python -m benchmarks.revisions --before REV --after REV [--repeats 3] [--workloads NAME ...]``

Each revision is checked out into a temporary git worktree (removed at the end, also on Ctrl-C
or an error). Each workload runs in a new subprocess with ``PYTHONPATH`` set to a checkout, so
that it runs that revision's ``fpipe`` through that revision's own ``benchmarks/`` code (the
import paths differ between revisions); only fpipe's side of a workload is timed, never its
reference. The subprocesses alternate, before and after, ``--repeats`` times, the order within
a pair swapping each time (before, after, after, before ...) so that a machine that grows
busier or quieter favours neither. Each run gives the median of its timed calls (after one
untimed call); the figure of a revision is the median over its runs.

A workload is *slower* when ``after / before`` (time) exceeds ``1 + noise``, *faster* when it
is below ``1 / (1 + noise)``; the noise is the larger relative spread ``(max - min) / median``
of the two revisions' runs, and at least ``NOISE_FLOOR``.

Then the byte-for-byte check: each revision writes the same samples with ``FileWriter`` (as
``fpipe.FileWriter`` and as ported code imports it, ``fpipe.storage.FileWriter``) and
``ShardedWriter``, and ``fpipe write`` packs the same folder of files (in order and
``--shuffle``); every file is compared, byte for byte, between the revisions, and with what
datadings's own ``FileWriter`` writes where datadings is importable. Each revision writes
twice, so that a file that differs between two runs of one revision is reported as such.

The table is printed and written to ``benchmarks/results/revisions-<date>.md``, the figures
beside it as ``.json`` (``--render`` that file to print the report again). Datasets are
written into the temporary folder too, unless ``$FPIPE_BENCH_DATA`` names a folder to keep
them in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .revision_driver import MARKER

__all__ = ["WORKLOADS", "Comparison", "Workload", "compare", "compare_trees", "main", "schedule",
           "slower_pairs", "spread"]

NOISE_FLOOR = 0.03  # a spread below 3 % in three runs is luck, not a steady machine
RUN_TIMEOUT = 300.0  # seconds for one subprocess
HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


# --- the decision ------------------------------------------------------------------------------

def spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of ``values``: how far apart runs of the same code fell."""
    if not values:
        raise ValueError("spread of no values")
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


@dataclass(frozen=True)
class Comparison:
    before: float  # median seconds of the runs of each revision
    after: float
    ratio: float  # after / before, of time: above 1 is slower
    noise: float  # the relative spread both must clear
    verdict: str  # "slower", "faster" or "same"


def compare(before: Sequence[float], after: Sequence[float], floor: float = NOISE_FLOOR) -> Comparison:
    """The verdict on two revisions' run times (seconds, one figure per run)."""
    b, a = statistics.median(before), statistics.median(after)
    noise = max(spread(before), spread(after), floor)
    ratio = a / b
    verdict = "slower" if ratio > 1 + noise else "faster" if ratio < 1 / (1 + noise) else "same"
    return Comparison(b, a, ratio, noise, verdict)


def slower_pairs(before: Sequence[float], after: Sequence[float]) -> tuple[int, int]:
    """In how many of the pairs of runs (before[i], after[i]: the repeat i) after took longer,
    and how many pairs there are: a steady difference smaller than the noise shows here."""
    pairs = list(zip(before, after))
    return sum(a > b for b, a in pairs), len(pairs)


def schedule(names: Sequence[str], repeats: int) -> Iterator[tuple[str, int, str]]:
    """``(workload, repeat, side)`` in the order they run: each workload's runs together,
    before and after alternating, the pair's order swapped at each repeat."""
    for name in names:
        for repeat in range(repeats):
            pair = ("before", "after") if repeat % 2 == 0 else ("after", "before")
            for side in pair:
                yield name, repeat, side


# --- the workloads -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    name: str
    area: str
    what: str
    setup: str  # code run in the revision: defines work(), and items, teardown() if it has them
    data: tuple[str, ...] = ()  # datasets to write first (keys of DATASETS)
    samples: int = 5  # timed samples in each run
    loops: int = 1  # calls of work() per sample
    kind: str = "throughput"  # or "time": a latency, with no items per second


def _harness(module: str, name: str, patch: str = "") -> str:
    """Setup code for fpipe's side of the revision's own workload ``name`` of ``module``
    (``patch``: code run first, to make it smaller, say)."""
    return (f"import importlib\n"
            f"from benchmarks import harness\n"
            f"importlib.import_module('benchmarks.{module}')\n"
            f"{patch}\n"
            f"if {name!r} not in harness.WORKLOADS:\n"
            f"    raise LookupError('this revision has no workload {name}')\n"
            f"_pair = harness.WORKLOADS[{name!r}].build()\n"
            f"work, items, teardown = _pair.fpipe, _pair.items, _pair.teardown\n")


# what each dataset's writing needs run, in the revision's benchmarks code
DATASETS = {
    "small": "from benchmarks import data; data.small_path()",
    "large": "from benchmarks import data; data.large_path()",
    "photos": "from benchmarks import data; data.photos_path()",
    "shards": "from benchmarks import bench_formats; bench_formats.shard_paths()",
    "parquet": "from benchmarks import bench_formats; bench_formats.parquet_path()",
    "tfrecord": "from benchmarks import bench_formats; bench_formats.tfrecord_path()",
}

_KEY_LOOKUPS = """
import numpy as np
from benchmarks import data
import fpipe.storage  # the name ported code imports, in every revision

reader = fpipe.storage.MsgpackReader(data.small_path())
keys = [f"{i:08d}" for i in np.random.default_rng(0).permutation(len(reader))[:20000].tolist()]
items = len(keys)

def work():
    for key in keys:
        reader.find_index(key)
"""

_IMAGES_SMALLER = "import benchmarks.bench_images as _b; _b.SERIAL_IMAGES = 256; _b.WORKER_IMAGES = 512"
_NO_DATASETS_LIBRARY = "import benchmarks.bench_formats as _f; _f._hf_dataset = lambda cache: None"

WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("C1", "core", "compose(inc, double, dec), 1M calls", _harness("bench_core", "C1")),
    Workload("P1", "stream", "toolz.pipe: map, batch 32, combine_to_arrays, 2,000 batches",
             _harness("bench_streaming", "P1"), samples=5, loops=10),
    Workload("P1p", "stream", "P1 with prefetch(64): a background thread",
             _harness("bench_streaming", "P1p"), samples=5, loops=10),
    Workload("P2", "stream", "processes(2 workers), 1,024 items of 1 ms pure Python, batch 32",
             _harness("bench_streaming", "P2"), samples=3),
    Workload("P3", "stream", "threads(2 workers), 1,024 items of 1 ms numpy, batch 32",
             _harness("bench_streaming", "P3"), samples=3),
    Workload("P4", "stream", "expiration pool 1,000 x 4 over 200,000 items",
             _harness("bench_streaming", "P4"), samples=3),
    Workload("P5", "stream", "warm process workers: first batch of the next epoch (time)",
             _harness("bench_streaming", "P5"), samples=9, kind="time"),
    Workload("P1i", "Infinite", "P1 through Infinite: one epoch of 2,000 batches",
             _harness("bench_infinite", "P1i"), loops=3),
    Workload("P5i", "Infinite", "Infinite with Loky(2): close, first batch of the next epoch (time)",
             _harness("bench_infinite", "P5i"), samples=7, kind="time"),
    Workload("V1", "packing", "pack 5,000 lognormal sequences into rows of 2,048, best fit",
             _harness("bench_packing", "V1"), loops=5),
    Workload("S1", "dataset", "write `small` (100,000 x 1 KiB) with FileWriter",
             _harness("bench_storage", "S1")),
    Workload("S2", "dataset", "iterate `small` in file order", _harness("bench_storage", "S2"),
             data=("small",), loops=3),
    Workload("S3", "dataset", "random get over `small` (100,000)", _harness("bench_storage", "S3"),
             data=("small",)),
    Workload("S4", "dataset", "random get over `large` (10,000 x 100 KiB)",
             _harness("bench_storage", "S4"), data=("large",)),
    Workload("S5", "dataset", "open + len + first get + first key lookup on `small` (time)",
             _harness("bench_storage", "S5"), data=("small",), samples=7, loops=20, kind="time"),
    Workload("K1", "dataset", "20,000 key lookups (find_index) on `small`, warm index",
             _KEY_LOOKUPS, data=("small",)),
    Workload("S6q", "orderings", "an epoch of QuasiShuffler over `large`",
             _harness("bench_orderings", "S6q"), data=("large",)),
    Workload("S6i", "orderings", "an epoch of IndexShuffler over `large`",
             _harness("bench_orderings", "S6i"), data=("large",)),
    Workload("X1", "formats", "iterate 10 WebDataset shards (10,000 JPEG samples)",
             _harness("bench_formats", "X1"), data=("shards",)),
    Workload("X2", "formats", "5,000 random gets over the WebDataset shards",
             _harness("bench_formats", "X2"), data=("shards",), loops=3),
    Workload("X3a", "formats", "iterate a 1M-row Parquet file as dicts",
             _harness("bench_formats", "X3a"), data=("parquet",)),
    Workload("X4", "formats", "5,000 random gets over the Parquet file",
             _harness("bench_formats", "X4", _NO_DATASETS_LIBRARY), data=("parquet",), loops=3),
    Workload("X5", "formats", "iterate 100,000 TFRecord Examples", _harness("bench_formats", "X5"),
             data=("tfrecord",)),
    Workload("T1", "torch", "IterableDataset over `small`, DataLoader 2 workers, batch 256",
             _harness("bench_torch", "T1"), data=("small",), samples=3),
    Workload("T2", "torch", "map-style Dataset over `small`, DataLoader shuffle, 2 workers",
             _harness("bench_torch", "T2"), data=("small",), samples=3),
    Workload("I1u", "images", "serial: 256 photos, random resized crop 224 + flip, uint8",
             _harness("bench_images", "I1u", _IMAGES_SMALLER), data=("photos",)),
    Workload("I4u", "images", "processes(2): 512 photos, the I1u recipe, batches of 32",
             _harness("bench_images", "I4u", _IMAGES_SMALLER), data=("photos",)),
]}


# --- running a revision's code -----------------------------------------------------------------

@dataclass
class Checkout:
    side: str
    revision: str  # as given
    commit: str
    subject: str
    path: Path


@dataclass
class Outcome:
    workload: Workload
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"before": [], "after": []})
    items: int = 1
    errors: dict[str, str] = field(default_factory=dict)


class Runner:
    """Runs the driver in a checkout, one subprocess at a time, and ends it on interruption."""

    def __init__(self, scratch: Path, data: Path) -> None:
        self.scratch, self.data = scratch, data
        self.driver = (HERE / "revision_driver.py").read_text()
        self.child: subprocess.Popen | None = None

    def env(self, checkout: Checkout) -> dict[str, str]:
        tmp = self.scratch / "tmp"
        tmp.mkdir(exist_ok=True)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        env.update(PYTHONPATH=str(checkout.path), TMPDIR=str(tmp), FPIPE_BENCH_DATA=str(self.data),
                   FPIPE_CACHE_DIR=str(self.scratch / "cache"), PYTHONDONTWRITEBYTECODE="1")
        return env

    def run(self, checkout: Checkout, spec: dict, timeout: float = RUN_TIMEOUT) -> dict:
        spec = {**spec, "root": str(checkout.path)}
        child = self.child = subprocess.Popen(
            [sys.executable, "-c", self.driver, json.dumps(spec)], cwd=checkout.path,
            env=self.env(checkout), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)  # its own session: a terminal's Ctrl-C reaches this process only
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {timeout:.0f} s"}
        finally:
            self.stop()
        lines = [line for line in out.splitlines() if line.startswith(MARKER)]
        if not lines:
            return {"error": f"exit status {child.returncode}: {err.strip()[-2000:]}"}
        return json.loads(lines[-1][len(MARKER):])

    def stop(self) -> None:
        """End the running subprocess and what it started (its own session), if any."""
        child, self.child = self.child, None
        if child is None or child.poll() is not None:
            self._reap_group(child)
            return
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                break
            try:
                child.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._reap_group(child)

    @staticmethod
    def _reap_group(child: subprocess.Popen | None) -> None:
        """Processes the subprocess left behind in its session (a pool it did not close): a
        moment to end on their own (a resource tracker cleaning up), then SIGTERM, SIGKILL."""
        if child is None:
            return
        for sig in (0, 0, 0, 0, signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(child.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.5)


def _git(*args: str, cwd: Path = HERE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkout(side: str, revision: str, scratch: Path) -> Checkout:
    commit = _git("rev-parse", "--verify", f"{revision}^{{commit}}")
    path = scratch / side
    _git("worktree", "add", "--detach", "--quiet", str(path), commit)
    subject = _git("log", "-1", "--format=%s", commit)
    return Checkout(side, revision, commit, subject, path)


def remove_checkout(path: Path) -> None:
    """Remove a temporary worktree and git's record of it (only this one)."""
    if not path.exists():
        return
    admin = None
    dotgit = path / ".git"
    if dotgit.is_file():
        text = dotgit.read_text().strip()
        if text.startswith("gitdir:"):
            admin = Path(text.split(":", 1)[1].strip())
    try:
        _git("worktree", "remove", "--force", "--force", str(path))
    except subprocess.CalledProcessError:
        shutil.rmtree(path, ignore_errors=True)
        if admin is not None and admin.parent.name == "worktrees":
            shutil.rmtree(admin, ignore_errors=True)


# --- timing ------------------------------------------------------------------------------------

def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def prepare(runner: Runner, before: Checkout, workloads: Sequence[Workload]) -> str | None:
    """Write the datasets the workloads read, with the before revision's benchmark code."""
    needed = [name for name in DATASETS if any(name in w.data for w in workloads)]
    if not needed:
        return None
    _log(f"writing the datasets {', '.join(needed)} (once, untimed) ...")
    began = time.monotonic()
    result = runner.run(before, {"mode": "prepare", "setup": "\n".join(DATASETS[n] for n in needed)},
                        timeout=1800)
    _log(f"  done in {time.monotonic() - began:.0f} s")
    return result.get("error")


def measure(runner: Runner, checkouts: dict[str, Checkout], workloads: Sequence[Workload],
            repeats: int) -> list[Outcome]:
    outcomes = {w.name: Outcome(w) for w in workloads}
    for name, repeat, side in schedule([w.name for w in workloads], repeats):
        outcome = outcomes[name]
        if side in outcome.errors:
            continue
        load = outcome.workload
        result = runner.run(checkouts[side], {"mode": "time", "setup": load.setup,
                                              "samples": load.samples, "loops": load.loops})
        if "error" in result:
            outcome.errors[side] = result["error"]
            _log(f"{name:<5} {side:<6} run {repeat + 1}: error: {result['error'].strip().splitlines()[-1]}")
            continue
        run_seconds = statistics.median(result["seconds"])
        outcome.seconds[side].append(run_seconds)
        outcome.items = result["items"]
        _log(f"{name:<5} {side:<6} run {repeat + 1}: {run_seconds * 1e3:9.2f} ms "
             f"(samples {', '.join(f'{s * 1e3:.1f}' for s in result['seconds'])})")
    return list(outcomes.values())


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


def _rate(items: int, seconds: float) -> str:
    rate = items / seconds
    if rate >= 1e6:
        return f"{rate / 1e6:.2f} M/s"
    return f"{rate / 1e3:.1f} k/s" if rate >= 1e3 else f"{rate:.0f}/s"


def timing_table(outcomes: Sequence[Outcome]) -> tuple[str, list[str]]:
    """The markdown table of the outcomes, and the notes on errors."""
    rows = ["| workload | area | what | before ms | after ms | before items/s | after items/s "
            "| after/before (time) | noise | pairs after slower | verdict |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    notes = []
    for outcome in outcomes:
        load = outcome.workload
        head = f"| {load.name} | {load.area} | {load.what} |"
        if outcome.errors or not (outcome.seconds["before"] and outcome.seconds["after"]):
            rows.append(head + " | | | | | | | **error** |")
            for side, error in outcome.errors.items():
                notes.append(f"- {load.name}, {side}: `{error.strip().splitlines()[-1][:300]}`")
            continue
        c = compare(outcome.seconds["before"], outcome.seconds["after"])
        rates = ("-", "-") if load.kind == "time" else (_rate(outcome.items, c.before),
                                                       _rate(outcome.items, c.after))
        verdict = {"slower": "**slower**", "faster": "faster", "same": "same (within noise)"}[c.verdict]
        slower, pairs = slower_pairs(outcome.seconds["before"], outcome.seconds["after"])
        rows.append(f"{head} {_ms(c.before)} | {_ms(c.after)} | {rates[0]} | {rates[1]} | "
                    f"{c.ratio:.3f} | ±{c.noise:.1%} | {slower}/{pairs} | {verdict} |")
    return "\n".join(rows), notes


# --- the byte-for-byte check -------------------------------------------------------------------

# Code, not a pickle, so that each revision makes the samples itself (a pickled array of a
# swapped byte order does not always come back in that order).
SAMPLES_CODE = """
import numpy as np

def byte_samples(n=300):
    rng = np.random.default_rng(1)
    dtypes = ["<f4", ">i2", "u1", "<c16", "?", "<U3", "<i8", ">f8"]
    return [{
        "key": f"k{i:05d}-\u00fc",
        "image": rng.integers(0, 255, (i % 4, 3)).astype(dtypes[i % len(dtypes)]),
        "scalar": np.int16(i), "float32": np.float32(i / 3), "complex": complex(i, -i),
        "label": i % 5, "big": 2**64 - 1 - i, "neg": -2**63 + i, "text": "x" * (i % 7),
        "tuple": (i, "x"), "bytes": rng.bytes(i % 50), "nested": {1: [0.5, None, {"deep": b"\\x00"}]},
    } for i in range(n)]
"""


def byte_samples(n: int = 300) -> list[dict]:
    """Samples of every kind the format stores (arrays of several dtypes and byte orders,
    numpy scalars, big and negative integers, tuples, bytes, nested maps), the same at every
    call, and in every revision (which runs ``SAMPLES_CODE``)."""
    namespace: dict = {}
    exec(SAMPLES_CODE, namespace)
    return namespace["byte_samples"](n)


def image_folder(root: Path) -> Path:
    """An ImageFolder tree of small JPEG and PNG files in three classes (and a file that is
    not an image, which ``fpipe write`` leaves out with a note)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(2)
    for label in ("cat", "dog", "class10"):
        (root / label).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (int(rng.integers(8, 40)), int(rng.integers(8, 40)), 3),
                                  dtype=np.uint8)
            buffer = io.BytesIO()
            suffix = "png" if i % 3 == 0 else "jpg"
            Image.fromarray(pixels).save(buffer, format="PNG" if suffix == "png" else "JPEG", quality=90)
            (root / label / f"img{i}.{suffix}").write_bytes(buffer.getvalue())
    (root / "cat" / "notes.txt").write_text("not an image\n")
    return root


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root``, by relative path: its sha256."""
    return {str(p.relative_to(root)): _digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def compare_trees(first: dict[str, str], second: dict[str, str]) -> dict[str, list[str]]:
    """Files of two trees (``tree()``), as ``same``, ``differ``, ``only_first``, ``only_second``."""
    return {"same": sorted(p for p in first.keys() & second.keys() if first[p] == second[p]),
            "differ": sorted(p for p in first.keys() & second.keys() if first[p] != second[p]),
            "only_first": sorted(first.keys() - second.keys()),
            "only_second": sorted(second.keys() - first.keys())}


def datadings_files(samples: list[dict], folder: Path) -> Path | None:
    """What datadings's own FileWriter writes of ``samples`` (None without datadings)."""
    try:
        from datadings.writer import FileWriter as DatadingsFileWriter
    except ImportError:
        return None
    folder.mkdir(parents=True)
    with DatadingsFileWriter(folder / "data.msgpack", disable=True) as writer:
        for sample in samples:
            writer.write(sample)
    return folder


def compare_with_datadings(theirs: Path, ours: Path) -> tuple[list[str], list[str]]:
    """Each file datadings wrote against fpipe's of the same name: (same, differ). fpipe's
    ``.md5`` lists its own files besides (the key index): only datadings's lines compare."""
    same, differ = [], []
    for path in sorted(theirs.iterdir()):
        mine = ours / path.name
        if path.suffix == ".md5" and mine.exists():
            names = {p.name for p in theirs.iterdir()}
            lines = [line for line in mine.read_text().splitlines() if line.split("  ", 1)[-1] in names]
            equal = lines == path.read_text().splitlines()
        else:
            equal = mine.exists() and mine.read_bytes() == path.read_bytes()
        (same if equal else differ).append(path.name)
    return same, differ


def byte_check(runner: Runner, checkouts: dict[str, Checkout], scratch: Path) -> list[str]:
    """Write with both revisions (twice each), compare; the report's lines."""
    work = scratch / "bytes"
    work.mkdir()
    samples = byte_samples()
    folder = image_folder(work / "files")
    trees, errors = {}, []
    for run in (1, 2):
        for side in ("before", "after"):
            out = work / f"{side}-{run}"
            result = runner.run(checkouts[side], {"mode": "bytes", "samples": SAMPLES_CODE,
                                                  "folder": str(folder), "out": str(out), "shard_size": 64})
            if "error" in result:
                errors.append(f"- {side}, run {run}: error: `{result['error'].strip().splitlines()[-1]}`")
                continue
            trees[side, run] = tree(out)
    lines = ["## Byte for byte", "",
             f"Both revisions wrote {len(samples)} samples with `fpipe.FileWriter` (`file/`), with "
             "`fpipe.storage.FileWriter` as ported code imports it (`ported/`), with "
             "`ShardedWriter(shard_size=64)` (`sharded/`), and ran `fpipe write` on a folder of 36 "
             "images in three classes (`cli/`, and `cli-shuffled/` with `--shuffle --seed 1`), twice "
             "each.", ""]
    lines += errors
    if ("before", 1) in trees and ("after", 1) in trees:
        for side in ("before", "after"):
            if (side, 2) in trees:
                unsteady = compare_trees(trees[side, 1], trees[side, 2])
                changing = unsteady["differ"] + unsteady["only_first"] + unsteady["only_second"]
                if changing:
                    lines.append(f"- {side}: {len(changing)} files differ between two runs of the same "
                                 f"revision: {', '.join(changing)}")
        result = compare_trees(trees["before", 1], trees["after", 1])
        total = len(trees["before", 1].keys() | trees["after", 1].keys())
        lines.append(f"- before against after: **{len(result['same'])} of {total} files identical**")
        for key, words in (("differ", "differ"), ("only_first", "only before wrote"),
                           ("only_second", "only after wrote")):
            if result[key]:
                lines.append(f"  - {words}: {', '.join(result[key])}")
    theirs = datadings_files(samples, work / "datadings")
    if theirs is None:
        lines.append("- datadings is not importable here: no comparison with its writer")
    else:
        for side in ("before", "after"):
            if (side, 1) in trees:
                for name in ("file", "ported"):
                    same, differ = compare_with_datadings(theirs, work / f"{side}-1" / name)
                    verdict = "identical" if not differ else f"**differ: {', '.join(differ)}**"
                    lines.append(f"- {side} `{name}/` against datadings's FileWriter: "
                                 f"{len(same)} of {len(same) + len(differ)} files {verdict}"
                                 + (f" ({', '.join(same)})" if not differ else ""))
    return lines


# --- the report --------------------------------------------------------------------------------

def record(checkouts: dict[str, Checkout], outcomes: Sequence[Outcome], byte_lines: list[str],
           command: str, repeats: int, load_before: tuple, minutes: float, notes: list[str]) -> dict:
    """Everything the report shows, as JSON can hold it (``--render`` makes the report again)."""
    return {
        "command": command, "date": time.strftime("%Y-%m-%d %H:%M %Z"), "repeats": repeats,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "load": [list(load_before), list(os.getloadavg())], "minutes": minutes, "notes": notes,
        "checkouts": {side: {"revision": c.revision, "commit": c.commit, "subject": c.subject}
                      for side, c in checkouts.items()},
        "outcomes": [{"name": o.workload.name, "area": o.workload.area, "what": o.workload.what,
                      "kind": o.workload.kind, "seconds": o.seconds, "items": o.items,
                      "errors": o.errors} for o in outcomes],
        "bytes": byte_lines}


def _outcome(saved: dict) -> Outcome:
    load = Workload(saved["name"], saved["area"], saved["what"], "", kind=saved["kind"])
    return Outcome(load, saved["seconds"], saved["items"], saved["errors"])


def report(run: dict) -> str:
    """The markdown report of a run's :func:`record`."""
    outcomes = [_outcome(saved) for saved in run["outcomes"]]
    table, errors = timing_table(outcomes)
    slower = [o.workload.name for o in outcomes if not o.errors and o.seconds["before"] and
              o.seconds["after"] and compare(o.seconds["before"], o.seconds["after"]).verdict == "slower"]
    checkouts, (load_start, load_end) = run["checkouts"], run["load"]
    lines = [f"# fpipe: {checkouts['before']['commit'][:7]} against {checkouts['after']['commit'][:7]}",
             "", f"`{run['command']}` on {run['date']}: {run['machine']}; load average "
             f"{', '.join(f'{x:.2f}' for x in load_start)} at the start, "
             f"{', '.join(f'{x:.2f}' for x in load_end)} at the end; {run['minutes']:.1f} minutes.", ""]
    for side in ("before", "after"):
        c = checkouts[side]
        lines.append(f"- {side}: `{c['revision']}` = {c['commit'][:10]} {c['subject'][:100]}")
    lines += ["", f"fpipe's side of each workload (never its reference), in a new process per run, "
              f"{run['repeats']} runs of each revision alternating (the order swapped at each pair); a "
              "run's figure is the median of its timed calls after one untimed call, a revision's the "
              "median of its runs. after/before is of time (above 1: slower); noise is the larger "
              "spread (max - min) / median of the two revisions' runs, at least "
              f"{NOISE_FLOOR:.0%}; *slower* means after/before > 1 + noise. \"pairs after slower\" "
              "counts the repeats in which the after run took longer than the before run next to it "
              "(a steady difference within the noise shows there).", "", table, ""]
    lines.append(f"**Slower than the noise: {', '.join(slower) if slower else 'none'}.**")
    lines += ["", "Each run's figure (ms), by revision:", ""]
    for o in outcomes:
        runs = "; ".join(f"{side} {', '.join(_ms(s) for s in o.seconds[side])}"
                         for side in ("before", "after") if o.seconds[side])
        lines.append(f"- {o.workload.name}: {runs}")
    if errors or run["notes"]:
        lines += ["", "Errors:", *run["notes"], *errors]
    lines += ["", *run["bytes"], ""]
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------------

def _on_terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.revisions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the earlier revision (any git revision)")
    parser.add_argument("--after", help="the later revision (any git revision)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each revision (default 3)")
    parser.add_argument("--workloads", nargs="+", metavar="NAME", help="these workloads only "
                        f"(default all: {' '.join(WORKLOADS)})")
    parser.add_argument("--no-bytes", action="store_true", help="skip the byte-for-byte check")
    parser.add_argument("--output", help="the report (default benchmarks/results/revisions-<date>.md)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--render", metavar="JSON", help="print the report of a run's saved figures "
                        "(the .json beside its report) and exit")
    args = parser.parse_args(argv)
    if args.render:
        print(report(json.loads(Path(args.render).read_text())))
        return 0
    if args.list:
        for load in WORKLOADS.values():
            print(f"{load.name:<5} {load.area:<10} {load.what}")
        return 0
    if not (args.before and args.after):
        parser.error("--before and --after are both needed")
    if args.repeats < 2:
        parser.error(f"--repeats must be at least 2 (the noise is their spread); got {args.repeats}")
    names = args.workloads or list(WORKLOADS)
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; known: {' '.join(WORKLOADS)}")
    workloads = [WORKLOADS[name] for name in names]
    output = Path(args.output) if args.output else RESULTS / f"revisions-{time.strftime('%Y-%m-%d')}.md"
    command = "python -m benchmarks.revisions " + " ".join(sys.argv[1:] if argv is None else argv)

    previous = signal.signal(signal.SIGTERM, _on_terminate)
    scratch = Path(tempfile.mkdtemp(prefix="fpipe-revisions-"))
    data = Path(os.environ["FPIPE_BENCH_DATA"]) if os.environ.get("FPIPE_BENCH_DATA") else scratch / "data"
    runner = Runner(scratch, data)
    checkouts: dict[str, Checkout] = {}
    began, load_before = time.monotonic(), os.getloadavg()
    try:
        for side, revision in (("before", args.before), ("after", args.after)):
            checkouts[side] = checkout(side, revision, scratch)
            _log(f"{side}: {revision} = {checkouts[side].commit[:10]} {checkouts[side].subject[:70]}")
        notes = []
        error = prepare(runner, checkouts["before"], workloads)
        if error:
            notes.append(f"- writing the datasets: `{error.strip().splitlines()[-1]}`")
        outcomes = measure(runner, checkouts, workloads, args.repeats)
        byte_lines = [] if args.no_bytes else byte_check(runner, checkouts, scratch)
        run = record(checkouts, outcomes, byte_lines, command, args.repeats, load_before,
                     (time.monotonic() - began) / 60, notes)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.with_suffix(".json").write_text(json.dumps(run, indent=1))
        output.write_text(report(run))
        print(report(run))
        _log(f"written to {output} (and its figures to {output.with_suffix('.json')})")
        return 0
    except KeyboardInterrupt:
        _log("interrupted: removing the temporary checkouts")
        return 130
    finally:
        runner.stop()
        for c in checkouts.values():
            remove_checkout(c.path)
        for side in ("before", "after"):  # a checkout interrupted while it was being made
            remove_checkout(scratch / side)
        shutil.rmtree(scratch, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
