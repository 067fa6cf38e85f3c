"""Workloads of preparing a dataset by partitions (issue 41): D1-D6.

The input is ``photos`` (2,000 JPEGs of 300-500 px) read ``FPIPE_BENCH_PHOTO_ROUNDS`` times
(default 10: the issue's 20,000 photos), 20 partitions of equal size. The transform decodes
a photo, resizes its shorter side to 256 pixels (Pillow, bilinear), flips it with probability
one half drawn from ``fpipe.current_rng()`` (seeded per sample) and encodes it as JPEG of
quality 90. Shards of 500 samples.

- D1f: fpipe on 2 local processes, its samples/s; D1l and D1m: the same against litdata's
  ``optimize(num_workers=2)`` and Mosaic's ``MDSWriter`` fed by a 2-process pool, the same
  transform (the flip drawn from a generator seeded by the position). Neither peer is in the
  ``bench`` extra: install them in an environment of their own (Mosaic's ``streaming`` imports
  torchvision, which needs the torch it was built with: ``pip install torch==2.14.1
  torchvision==0.29.1 litdata mosaicml-streaming``, then fpipe and the bench extra); without
  them D1l and D1m are skipped, saying so;
- D1c: D1f against its floor, the same reads and transform on two processes with nothing
  written or sent back: how close fpipe comes to the transform's own cost, which bounds any
  writer's speed on two cores;
- D2: D1 on a 2-worker dask ``LocalCluster`` against D1 on local processes;
- D3: D1 with one worker process SIGKILLed at 30 % and again at 60 % of the partitions
  committed, against D1 uninterrupted (a time ratio; the output is checked to be the same bytes);
- D4: the second half of D1 (a client killed at 50 % of the partitions committed, then the
  same call again): the resumed run's time against a full D1;
- D5: D1 written to SeaweedFS on loopback against D1 to a local folder;
- D6: the peak memory (RSS) of a worker process writing one partition of 1,000,000 tiny
  samples.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fpipe.dataset import MsgpackReader
from fpipe.prepare import from_generator, write_dataset

from .data import photos_path
from .harness import Pair, Unavailable, Value, workload

PARTITIONS = 20
SHARD_SIZE = 500
SIDE = 256
ROUNDS = int(os.environ.get("FPIPE_BENCH_PHOTO_ROUNDS", "10"))
TINY = 1_000_000


class PhotoRange:
    """Partition ``i`` of the photos read ``rounds`` times: a contiguous range of positions."""

    def __init__(self, path: str, rounds: int, partitions: int) -> None:
        self.path, self.rounds, self.partitions = path, rounds, partitions

    def total(self) -> int:
        return len(MsgpackReader(self.path)) * self.rounds

    def __call__(self, partition: int):
        reader = MsgpackReader(self.path)
        count = len(reader)
        size = -(-self.total() // self.partitions)
        for position in range(partition * size, min((partition + 1) * size, self.total())):
            sample = reader[position % count]
            yield {"key": f"{position:08d}", "image": sample["image"], "label": sample["label"]}


def resized(sample: dict, flip: bool) -> dict:
    """The sample's photo, shorter side 256, flipped if ``flip``, as JPEG of quality 90."""
    from PIL import Image

    image = Image.open(io.BytesIO(sample["image"]))
    image.draft("RGB", (SIDE, SIDE))
    image = image.convert("RGB")
    scale = SIDE / min(image.size)
    image = image.resize((max(SIDE, round(image.width * scale)),
                          max(SIDE, round(image.height * scale))), Image.BILINEAR)
    if flip:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    encoded = io.BytesIO()
    image.save(encoded, "JPEG", quality=90)
    return {"key": sample["key"], "image": encoded.getvalue(), "label": sample["label"]}


def transform(sample: dict) -> dict:
    """fpipe's transform: the flip drawn from the sample's own generator."""
    import fpipe as fp

    return resized(sample, bool(fp.current_rng().random() < 0.5))


def _partitions() -> object:
    return from_generator(PhotoRange(photos_path(), ROUNDS, PARTITIONS), range(PARTITIONS))


def _fresh(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"fpipe-bench-{prefix}-"))


def _local_run(out: Path, **options) -> object:
    shutil.rmtree(out, ignore_errors=True)
    return write_dataset(_partitions(), out, transform, shard_size=SHARD_SIZE, seed=0, **options)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# --- D1 ---------------------------------------------------------------------------------


def _peer_sample(position: int) -> dict:
    """The peers' transform of input ``position``: the same work, the flip drawn from a
    generator seeded by the position."""
    import numpy as np

    reader = _reader()
    sample = reader[position % len(reader)]
    sample = {"key": f"{position:08d}", "image": sample["image"], "label": sample["label"]}
    return resized(sample, bool(np.random.default_rng(position).random() < 0.5))


def _reader() -> MsgpackReader:
    if "reader" not in _opened:
        _opened["reader"] = MsgpackReader(photos_path())
    return _opened["reader"]


_opened: dict = {}


@workload("D1f", description=f"{ROUNDS * 2000:,} photos -> shorter side 256, JPEG q90, seeded "
          "flip -> shards; 2 local processes", reference="-", target="-", kind="value")
def _d1_alone():
    out = _fresh("d1f")
    photos_path()  # made (and cached) before the timing
    try:
        started = time.perf_counter()
        report = _local_run(out / "out", n_workers=2)
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return Value(report.samples / seconds, "samples/s")


def _litdata_run(out: Path) -> None:
    from litdata import optimize

    shutil.rmtree(out, ignore_errors=True)
    optimize(fn=_peer_sample, inputs=list(range(ROUNDS * 2000)), output_dir=str(out),
             chunk_size=SHARD_SIZE, num_workers=2)


def _mosaic_run(out: Path) -> None:
    import multiprocessing

    from streaming import MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    columns = {"key": "str", "image": "bytes", "label": "int"}
    with multiprocessing.get_context("spawn").Pool(2) as pool, \
            MDSWriter(out=str(out), columns=columns) as writer:
        for sample in pool.imap(_peer_sample, range(ROUNDS * 2000), chunksize=64):
            writer.write(sample)


def _against(peer: str, run) -> Pair:
    try:
        __import__(peer)
    except ImportError:
        raise Unavailable(f"{peer} is not installed: pip install litdata mosaicml-streaming "
                          "beside the bench extra (D1f times fpipe alone)") from None
    folder = _fresh(f"d1-{peer}")
    return Pair(fpipe=lambda: _local_run(folder / "fpipe", n_workers=2),
                reference=lambda: run(folder / peer), items=ROUNDS * 2000,
                teardown=lambda: shutil.rmtree(folder, ignore_errors=True))


@workload("D1l", description="D1f against litdata, the same transform",
          reference="litdata optimize(num_workers=2)", target=">= 1.3")
def _d1_litdata():
    return _against("litdata", _litdata_run)


@workload("D1m", description="D1f against Mosaic, the same transform",
          reference="Mosaic MDSWriter fed by a 2-process pool", target=">= 1.3")
def _d1_mosaic():
    return _against("streaming", _mosaic_run)


def _transformed_only(half: int) -> int:
    """Half ``half`` of D1's photos read and transformed, the results dropped: no writer."""
    total = ROUNDS * 2000
    for position in range(half * total // 2, (half + 1) * total // 2):
        _peer_sample(position)
    return total // 2


def _floor_run() -> None:
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert sum(pool.map(_transformed_only, range(2))) == ROUNDS * 2000


@workload("D1c", description="D1f against its floor: the same reads and transform on 2 "
          "processes, nothing written or sent back (no writer on 2 cores can beat it)",
          reference="the transform alone, 2 processes", target="-")
def _d1_floor():
    folder = _fresh("d1c")
    return Pair(fpipe=lambda: _local_run(folder / "fpipe", n_workers=2), reference=_floor_run,
                items=ROUNDS * 2000, teardown=lambda: shutil.rmtree(folder, ignore_errors=True))


# --- D2 ---------------------------------------------------------------------------------


@workload("D2", description="D1 on a 2-worker dask LocalCluster", reference="D1 on 2 local processes",
          target=">= 0.9")
def _d2():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None,
                           host="127.0.0.1")
    client = Client(cluster)
    folder = _fresh("d2")

    def teardown() -> None:
        client.close()
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)

    return Pair(fpipe=lambda: _local_run(folder / "dask", cluster=client),
                reference=lambda: _local_run(folder / "local", n_workers=2),
                items=ROUNDS * 2000, teardown=teardown)


# --- D3 ---------------------------------------------------------------------------------


def _committed(out: Path) -> int:
    return sum(1 for _ in out.glob("part-*/manifest.json")) if out.is_dir() else 0


class _WorkerKiller(threading.Thread):
    """SIGKILLs one worker process of this process when the job in ``out`` has committed
    each of ``fractions`` of its partitions."""

    def __init__(self, out: Path, fractions: tuple[float, ...]) -> None:
        super().__init__(daemon=True)
        self.out, self.fractions, self.killed, self.done = out, fractions, 0, threading.Event()

    def run(self) -> None:
        import psutil

        for fraction in self.fractions:
            while _committed(self.out) < fraction * PARTITIONS and not self.done.is_set():
                time.sleep(0.01)
            workers = [child.pid for child in psutil.Process().children(recursive=True)
                       if "popen_loky" in " ".join(_command(child))]  # not its resource tracker
            if workers and not self.done.is_set():
                os.kill(workers[0], signal.SIGKILL)
                self.killed += 1


def _command(process) -> list[str]:
    """The command line of ``process``; none for one that has ended meanwhile."""
    import psutil

    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


@workload("D3", description="D1 with one worker SIGKILLed at 30 % and at 60 %",
          reference="D1 uninterrupted", target="<= 1.5", kind="time")
def _d3():
    folder = _fresh("d3")
    clean = folder / "clean"
    _local_run(clean, n_workers=2)
    expected = _tree(clean)
    kills: list[int] = []

    def killed_run() -> None:
        out = folder / "killed"
        shutil.rmtree(out, ignore_errors=True)
        killer = _WorkerKiller(out, (0.3, 0.6))
        killer.start()
        try:
            _local_run(out, n_workers=2)
        finally:
            killer.done.set()
            killer.join()
        kills.append(killer.killed)
        if _tree(out) != expected:
            raise AssertionError("D3: the killed run's files differ from the clean run's")

    def teardown() -> None:
        print(f"D3: workers killed per run: {kills}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)

    return Pair(fpipe=killed_run, reference=lambda: _local_run(clean, n_workers=2),
                items=ROUNDS * 2000, teardown=teardown)


# --- D4 ---------------------------------------------------------------------------------


_CLIENT = """
import sys
from benchmarks.bench_prepare import _local_run
from pathlib import Path
_local_run(Path(sys.argv[1]), n_workers=2)
"""


def _half_done(out: Path) -> None:
    """A client process that runs D1 into ``out``, SIGKILLed at half of the partitions."""
    root = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, str(out)], cwd=root, env=environment,
                              start_new_session=True)
    try:
        while _committed(out) < PARTITIONS // 2:
            if client.poll() is not None:
                raise RuntimeError(f"D4: the client ended with {client.returncode} before half-way")
            time.sleep(0.01)
    finally:
        _crash(client)


def _crash(client: subprocess.Popen) -> None:
    """SIGKILL the client alone, as a crash would, and wait until its loky workers have seen
    it and exited (they do within a second); its resource trackers then remove what it held
    in ``/dev/shm``. (Killing its whole process group took the trackers too, and left that.)"""
    import psutil

    workers = psutil.Process(client.pid).children(recursive=True)
    client.kill()
    client.wait()
    _, alive = psutil.wait_procs(workers, timeout=60)
    for process in alive:  # not expected: a worker that missed its consumer's death
        process.kill()


@workload("D4", description="D1's client killed at 50 %, then the same call again (the resume timed)",
          reference="a full D1 run", target="<= 0.6", kind="time")
def _d4():
    folder = _fresh("d4")
    half = folder / "half"
    _half_done(half)
    resumed = folder / "resumed"

    def settle() -> None:
        shutil.rmtree(resumed, ignore_errors=True)
        shutil.copytree(half, resumed, symlinks=True)

    def resume() -> None:
        write_dataset(_partitions(), resumed, transform, shard_size=SHARD_SIZE, seed=0, n_workers=2)

    return Pair(fpipe=resume, reference=lambda: _local_run(folder / "full", n_workers=2),
                items=ROUNDS * 2000, settle=settle,
                teardown=lambda: shutil.rmtree(folder, ignore_errors=True))


# --- D5 ---------------------------------------------------------------------------------


@workload("D5", description="D1 written to SeaweedFS on loopback", reference="D1 to a local folder",
          target=">= 0.8")
def _d5():
    import s3fs

    from .s3server import SeaweedS3

    folder = _fresh("d5")
    (folder / "seaweed").mkdir()
    server = SeaweedS3(folder / "seaweed")
    server.start()
    fs = s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True)
    fs.mkdir("prepared")
    runs = iter(range(10 ** 6))

    def to_s3() -> None:
        write_dataset(_partitions(), f"s3://prepared/run-{next(runs)}", transform,
                      shard_size=SHARD_SIZE, seed=0, n_workers=2,
                      storage_options=server.storage_options)

    def teardown() -> None:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)

    return Pair(fpipe=to_s3, reference=lambda: _local_run(folder / "local", n_workers=2),
                items=ROUNDS * 2000, teardown=teardown)


# --- D6 ---------------------------------------------------------------------------------


def tiny(count: int):
    """``count`` tiny samples: a key and a number."""
    return ({"key": f"{i:08d}", "x": i} for i in range(count))


# the peak RSS of this process image: VmHWM starts anew at exec, while getrusage's ru_maxrss
# keeps the forked parent's (a harness that held 1 GB reported 1 GB here)
_WORKER = """
import sys
from fpipe.prepare import from_generator, write_dataset
from benchmarks.bench_prepare import tiny
write_dataset(from_generator(tiny, [int(sys.argv[2])]), sys.argv[1], shard_size=100_000, n_workers=1)
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
"""


@workload("D6", description=f"one partition of {TINY:,} tiny samples: the worker's peak RSS",
          reference="-", target="<= 512", kind="value")
def _d6():
    folder = _fresh("d6")
    root = Path(__file__).resolve().parents[1]
    try:
        printed = subprocess.run([sys.executable, "-c", _WORKER, str(folder / "out"), str(TINY)],
                                 cwd=root, capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": str(root)}).stdout
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Value(int(printed.split()[-1]) / 1024, "MiB")


def once() -> None:
    """D1 once each, fpipe, litdata and Mosaic in this order, at ``FPIPE_BENCH_PHOTO_ROUNDS``
    (the issue's 20,000 photos, where five timed repetitions of each would take half an hour
    on two cores): ``python -m benchmarks.bench_prepare``. Prints seconds, samples/s and the
    load average after each run."""
    photos_path()
    folder = _fresh("d1-once")
    runs = (("fpipe", lambda out: _local_run(out, n_workers=2)), ("litdata", _litdata_run),
            ("Mosaic", _mosaic_run))
    try:
        for name, run in runs:
            started = time.perf_counter()
            run(folder / name)
            seconds = time.perf_counter() - started
            shutil.rmtree(folder / name, ignore_errors=True)
            print(f"D1 once: {name} {seconds:.1f} s, {ROUNDS * 2000 / seconds:,.0f} samples/s, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    once()
