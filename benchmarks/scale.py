"""The scale workloads L1-L6: each per-dataset cost at 1M, 10M and 100M samples, its growth
fitted and extrapolated to 1B and 10B.

``python -m benchmarks.scale [--sizes 1000000 10000000 100000000] [--folder DIR]
[--json FILE] [--skip NAME ...]`` writes a dataset of tiny samples ``{"key": "%09d", "d": i}``
at each size into ``DIR`` (about 12 GB with its index at 100M; removed afterwards), measures
every operation in a fresh process of its own (so peak memory is the operation's), prints a
table with the fitted growth, and writes the figures as JSON. Operations:

==========  ===================================================================================
``write``   FileWriter over all samples: rate, and the process's peak RSS (L3)
``first``   open, IndexShuffler (and Shuffler, QuasiShuffler up to 10M): time to the first
            sample of epoch 1, and what the process's RSS grew by (L1)
``epoch``   at the smallest size: an epoch of IndexShuffler against one of Shuffler, 5 times
            alternately (L1's throughput ratio)
``lookup``  open, first ``find_index``, then 2,000 more (mean), RSS growth (L2)
``tools``   ``fpipe verify``, ``shuffle --mode index``, ``merge``, ``split``: time, peak RSS (L4);
            and ``fpipe info`` and ``fpipe index`` (the index rebuilt from the samples)
``loader``  2 DataLoader workers over IndexShuffler: time to the first batch, each worker's
            RSS then (L6)
``shards``  ShardedReader over 10,000 shards of the smallest dataset's samples: open and
            ``len``, local and on SeaweedFS (L5; only at the smallest size)
==========  ===================================================================================
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from fpipe.remote import RemoteOptions

__all__ = ["fit", "main"]

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1_000_000, 10_000_000, 100_000_000)
TOOLS = ("verify", "info", "index", "shuffle", "split", "merge")
TARGETS = {
    "L1 first sample (s)": 0.05, "L1 order state (MB)": 16, "L2 first lookup (s)": 0.010,
    "L2 later lookup (us)": 50, "L2 memory (MB)": 64, "L3 write memory (MB)": 256,
    "L4 tool memory (MB)": 1024, "L5 open local (s)": 0.5, "L5 open s3 (s)": 2.0,
    "L6 first batch (s)": 1.0,
}


# --- what each child process measures ---------------------------------------------------------

def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_write(path: str, n: int) -> dict:
    from fpipe.dataset import FileWriter

    base = _rss_mb()
    started = time.perf_counter()
    with FileWriter(path, overwrite=True) as writer:
        write = writer.write
        for i in range(n):
            write({"key": f"{i:09d}", "d": i})
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "rate": n / seconds, "peak_mb": _peak_mb(), "base_mb": base}


def measure_first(path: str, kind: str) -> dict:
    from fpipe.dataset import MsgpackReader
    from fpipe.orderings import IndexShuffler, QuasiShuffler, Shuffler

    make = {"index": IndexShuffler, "shuffler": Shuffler, "quasi": QuasiShuffler}[kind]
    base = _rss_mb()
    started = time.perf_counter()
    ordering = make(MsgpackReader(path), seed=0)
    ordering.set_epoch(1)
    next(iter(ordering))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "grew_mb": _rss_mb() - base, "peak_mb": _peak_mb()}


def measure_epoch(path: str) -> dict:
    from fpipe.dataset import MsgpackReader
    from fpipe.orderings import IndexShuffler, Shuffler

    reader = MsgpackReader(path)
    times: dict[str, list[float]] = {"index": [], "shuffler": []}
    for repetition in range(6):  # the first of each is a warm-up
        for kind, make in (("index", IndexShuffler), ("shuffler", Shuffler)):
            ordering = make(reader, seed=repetition)
            started = time.perf_counter()
            for _ in ordering:
                pass
            if repetition:
                times[kind].append(time.perf_counter() - started)
    index, shuffler = (sorted(times[k])[len(times[k]) // 2] for k in ("index", "shuffler"))
    return {"index_seconds": index, "shuffler_seconds": shuffler, "ratio": shuffler / index}


def measure_lookup(path: str, n: int) -> dict:
    import random

    from fpipe.dataset import MsgpackReader

    base = _rss_mb()
    started = time.perf_counter()
    reader = MsgpackReader(path)
    first = reader.find_index(f"{n // 2:09d}")
    first_seconds = time.perf_counter() - started
    draw = random.Random(0)
    picks = [draw.randrange(n) for _ in range(2000)]
    keys = [f"{i:09d}" for i in picks]
    started = time.perf_counter()
    found = [reader.find_index(key) for key in keys]
    later = (time.perf_counter() - started) / len(keys)
    assert first == n // 2 and found == picks
    return {"first_seconds": first_seconds, "later_seconds": later, "grew_mb": _rss_mb() - base}


def measure_loader(path: str) -> dict:
    from torch.utils.data import DataLoader

    from fpipe.dataset import MsgpackReader
    from fpipe.orderings import IndexShuffler
    from fpipe.torch import IterableDataset

    data = IterableDataset(IndexShuffler(MsgpackReader(path), seed=0), batch_size=256)
    started = time.perf_counter()
    loader = iter(DataLoader(data, batch_size=256, num_workers=2))
    next(loader)
    seconds = time.perf_counter() - started
    workers = [_process_rss(w.pid) for w in loader._workers]
    return {"seconds": seconds, "worker_rss_mb": workers}


def _process_rss(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                fields[name] = int(value.split()[0]) / 1024
    return fields


def measure_tool(arguments: list[str]) -> dict:
    from fpipe.cli import main as fpipe_main

    started = time.perf_counter()
    code = fpipe_main(arguments)
    return {"seconds": time.perf_counter() - started, "peak_mb": _peak_mb(), "code": code}


def measure_shards(folder: str, url: str | None, options: str | None) -> dict:
    from fpipe.dataset import ShardedReader

    started = time.perf_counter()
    reader = ShardedReader(url or os.path.join(folder, "many.shards"),
                           remote=RemoteOptions(storage_options=json.loads(options) if options else None))
    length = len(reader)
    opened = time.perf_counter() - started
    started = time.perf_counter()
    reader.get(length // 2)
    return {"open_seconds": opened, "first_get_seconds": time.perf_counter() - started,
            "samples": length}


_MEASURES = {"write": measure_write, "first": measure_first, "epoch": measure_epoch,
             "lookup": measure_lookup, "loader": measure_loader, "tool": measure_tool,
             "shards": measure_shards}


def _child(name: str, *arguments: object, env: dict | None = None) -> dict:
    """Run measure ``name`` in a fresh process; its JSON result."""
    code = ("import json, sys; from benchmarks.scale import _MEASURES; "
            "print(json.dumps(_MEASURES[sys.argv[1]](*json.loads(sys.argv[2]))))")
    process = subprocess.run([sys.executable, "-c", code, name, json.dumps(arguments)],
                             capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    if process.returncode:
        raise RuntimeError(f"{name}{arguments}: {process.stderr[-2000:]}")
    return json.loads(process.stdout.strip().splitlines()[-1])


# --- the run ------------------------------------------------------------------------------------

def fit(sizes: list[int], values: list[float]) -> tuple[float, float]:
    """``(a, b)`` of ``value = a * n ** b`` by least squares in log-log (b: the growth).

    >>> a, b = fit([10, 100, 1000], [1.0, 10.0, 100.0])
    >>> round(a, 3), round(b, 3)
    (0.1, 1.0)
    """
    points = [(math.log(n), math.log(max(v, 1e-9))) for n, v in zip(sizes, values)]
    if len(points) < 2:
        return values[0] / sizes[0], 1.0
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    slope = (sum((x - mx) * (y - my) for x, y in points)
             / max(1e-12, sum((x - mx) ** 2 for x, _ in points)))
    return math.exp(my - slope * mx), slope


def _at_size(folder: Path, n: int, skip: set[str], figures: dict) -> None:
    path = str(folder / f"tiny-{n}.msgpack")
    say = lambda text: print(f"[{n:>11,}] {text}", flush=True)  # noqa: E731
    figures["write"][n] = _child("write", path, n)
    say(f"write {figures['write'][n]}")
    kinds = ["index"] + (["shuffler", "quasi"] if n <= 10_000_000 else [])
    for kind in kinds:
        figures[f"first-{kind}"][n] = _child("first", path, kind)
        say(f"first sample ({kind}) {figures[f'first-{kind}'][n]}")
    figures["lookup"][n] = _child("lookup", path, n)
    say(f"lookup {figures['lookup'][n]}")
    if "loader" not in skip:
        figures["loader"][n] = _child("loader", path)
        say(f"loader {figures['loader'][n]}")
    if "tools" not in skip:
        _tools(folder, path, n, figures, say, skip)
    if "epoch" not in skip and n == min(figures["sizes"]):
        figures["epoch"][n] = _child("epoch", path)
        say(f"epoch {figures['epoch'][n]}")
    for file in folder.glob(f"tiny-{n}.msgpack*"):
        file.unlink()


def _tools(folder: Path, path: str, n: int, figures: dict, say, skip: set[str]) -> None:
    out = str(folder / "out.msgpack")
    runs = {"verify": ["verify", path, "-q"],
            "info": ["info", path, "-q"],
            # rebuilt in place from the samples: the same files again
            "index": ["index", path, "-q"],
            "shuffle": ["shuffle", path, out, "--mode", "index", "--seed", "1", "-y", "-q"],
            "split": ["split", path, "--fractions", "0.5", "-o", out, str(folder / "b.msgpack"),
                      "-y", "-q"],
            "merge": ["merge", path, out, str(folder / "merged.msgpack"), "-y", "-q"]}
    for name, arguments in runs.items():
        if name in skip:
            continue
        if name == "merge":  # the second half, from split, merged back onto the whole
            arguments = ["merge", str(folder / "b.msgpack"), out, str(folder / "merged.msgpack"),
                         "-y", "-q"]
        figures[f"tool-{name}"][n] = _child("tool", arguments)
        say(f"fpipe {name} {figures[f'tool-{name}'][n]}")
        if name in ("shuffle", "merge"):
            for file in folder.glob("merged.msgpack*"):
                file.unlink()
    for stem in ("out", "b", "merged"):
        for file in folder.glob(f"{stem}.msgpack*"):
            file.unlink()


def _shards(folder: Path, figures: dict) -> None:
    """L5: 10,000 shards of 10 samples, local and on SeaweedFS."""
    shards = folder / "shards"
    shards.mkdir()
    code = ("import sys; from fpipe.dataset import ShardedWriter\n"
            "with ShardedWriter(sys.argv[1], shard_size=10) as w:\n"
            "    for i in range(100_000): w.write({'key': f'{i:09d}', 'd': i})")
    subprocess.run([sys.executable, "-c", code, str(shards / "many")], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    figures["shards"]["local"] = _child("shards", str(shards), None, None)
    print(f"[     shards] local {figures['shards']['local']}", flush=True)
    try:
        figures["shards"]["s3"] = _s3_shards(folder, shards)
        print(f"[     shards] s3 {figures['shards']['s3']}", flush=True)
    finally:
        shutil.rmtree(shards, ignore_errors=True)


def _s3_shards(folder: Path, shards: Path) -> dict:
    import s3fs

    from .s3server import SeaweedS3

    server_folder = folder / "seaweed"
    server_folder.mkdir()
    server = SeaweedS3(server_folder)
    server.start()
    try:
        fs = s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True)
        fs.mkdir("scale")
        fs.put(str(shards) + "/", "scale/many/", recursive=True)
        return _child("shards", str(shards), "s3://scale/many/many.shards",
                      json.dumps(server.storage_options))
    finally:
        server.stop()
        shutil.rmtree(server_folder, ignore_errors=True)


def _table(figures: dict) -> list[str]:
    sizes = figures["sizes"]
    rows = [("write rate (samples/s)", "write", lambda f: f["rate"]),
            ("write peak RSS (MB)", "write", lambda f: f["peak_mb"]),
            ("IndexShuffler first sample (s)", "first-index", lambda f: f["seconds"]),
            ("IndexShuffler RSS growth (MB)", "first-index", lambda f: f["grew_mb"]),
            ("Shuffler first sample (s)", "first-shuffler", lambda f: f["seconds"]),
            ("Shuffler RSS growth (MB)", "first-shuffler", lambda f: f["grew_mb"]),
            ("QuasiShuffler first sample (s)", "first-quasi", lambda f: f["seconds"]),
            ("first key lookup (s)", "lookup", lambda f: f["first_seconds"]),
            ("later key lookup (us)", "lookup", lambda f: f["later_seconds"] * 1e6),
            ("lookup RSS growth (MB)", "lookup", lambda f: f["grew_mb"]),
            ("DataLoader first batch (s)", "loader", lambda f: f["seconds"]),
            ("DataLoader worker RSS (MB)", "loader",
             lambda f: max(w.get("VmRSS", 0) for w in f["worker_rss_mb"]))]
    rows += [(f"fpipe {tool} {what}", f"tool-{tool}", pick)
             for tool in TOOLS
             for what, pick in (("(s)", lambda f: f["seconds"]),
                                ("peak RSS (MB)", lambda f: f["peak_mb"]))]
    lines = [f"{'operation':<34}" + "".join(f"{n:>14,}" for n in sizes)
             + f"{'growth n^b':>12}{'at 1B':>12}{'at 10B':>12}"]
    for label, key, pick in rows:
        measured = figures.get(key, {})
        values = [pick(measured[n]) if n in measured else None for n in sizes]
        known = [(n, v) for n, v in zip(sizes, values) if v is not None]
        line = f"{label:<34}" + "".join(f"{v:>14.4g}" if v is not None else f"{'-':>14}"
                                         for v in values)
        if len(known) >= 2:
            a, b = fit([n for n, _ in known], [v for _, v in known])
            line += f"{b:>12.2f}{a * 1e9 ** b:>12.4g}{a * 1e10 ** b:>12.4g}"
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--folder", default=None, help="where the datasets go (a temp folder)")
    parser.add_argument("--json", default="benchmarks/results/scale.json")
    parser.add_argument("--skip", nargs="*", default=[],
                        help="operations to leave out: loader, tools, epoch, shards; or "
                             f"single tools: {', '.join(TOOLS)}")
    args = parser.parse_args(argv)
    folder = Path(args.folder or os.environ.get("FPIPE_BENCH_DATA", "/tmp")) / "fpipe-scale"
    folder.mkdir(parents=True, exist_ok=True)
    names = ["write", "first-index", "first-shuffler", "first-quasi", "lookup", "loader",
             "epoch", "shards"] + [f"tool-{t}" for t in TOOLS]
    figures: dict = {"sizes": sorted(args.sizes), **{name: {} for name in names},
                     "load_average_at_start": os.getloadavg()}
    try:
        for n in sorted(args.sizes):
            _at_size(folder, n, set(args.skip), figures)
        if "shards" not in args.skip:
            _shards(folder, figures)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    figures["load_average_at_end"] = os.getloadavg()
    print("\n".join(_table(figures)))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
