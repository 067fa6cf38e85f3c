"""Workloads of the readers of other formats: X1-X6 against webdataset, wids, Hugging Face
datasets, pyarrow and the tfrecord package; X7, a shuffled Parquet epoch against the in-order one.

The data is written once into the benchmark cache folder (``benchmarks.data``), by the peers'
own writers where they have one:

=============  ===============================================================================
``shards``     10 WebDataset shards of 1,000 samples ``{"jpg": a JPEG of images, "cls": label}``
               (webdataset's TarWriter)
``parquet``    1,000,000 rows ``{"text": 20-80 characters, "n": int}``, row groups of 10,000
               rows (pyarrow)
``tfrecord``   100,000 Examples ``{"image": 1-3 KB of bytes, "label": int, "text": bytes}``
               (the tfrecord package's writer)
``grouped``    100,000 rows ``{"text": about 30 characters, "n": int}``, row groups of 1,000
               rows (pyarrow), for X7
=============  ===============================================================================
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.formats import ParquetFileReader, ParquetReader, TFRecordFileReader, WebDatasetReader
from fpipe.orderings import QuasiShuffler, Range
from fpipe.remote import RemoteOptions

from . import data
from .harness import Pair, Value, workload

_SHARDS, _PER_SHARD = 10, 1000
_ROWS = 1_000_000
_RECORDS = 100_000
_RANDOM_GETS = 5000


def _folder(name: str, build: Callable[[Path], None]) -> Path:
    """The cached folder ``name``, built by ``build(folder)`` on first use (beside, then
    renamed into place)."""
    folder = data.cache_folder() / "formats" / name
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    try:
        build(building)
        try:
            os.rename(building, folder)
        except OSError:  # another run built it first
            pass
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


def _write_shards(folder: Path) -> None:
    import webdataset

    images = MsgpackReader(data.images_path())
    for shard in range(_SHARDS):
        with webdataset.TarWriter(str(folder / f"train-{shard:03d}.tar")) as sink:
            for i in range(shard * _PER_SHARD, (shard + 1) * _PER_SHARD):
                image = images[i % len(images)]
                sink.write({"__key__": f"{i:08d}", "jpg": image["image"],
                            "cls": str(image["label"]).encode()})


def shard_paths() -> list[str]:
    folder = _folder("shards", _write_shards)
    return [str(folder / f"train-{shard:03d}.tar") for shard in range(_SHARDS)]


def _write_parquet(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    words = np.array(["data", "train", "model", "batch", "epoch", "shard", "loader", "fpipe"])
    lengths = rng.integers(3, 13, _ROWS)
    picks = rng.integers(0, len(words), int(lengths.sum()))
    ends = np.cumsum(lengths)
    texts = [" ".join(words[picks[end - n:end]]) for end, n in zip(ends.tolist(), lengths.tolist())]
    table = pa.table({"text": texts, "n": np.arange(_ROWS, dtype=np.int64)})
    pq.write_table(table, folder / "train.parquet", row_group_size=10_000)


def parquet_path() -> str:
    return str(_folder("parquet", _write_parquet) / "train.parquet")


def _write_tfrecord(folder: Path) -> None:
    import tfrecord

    rng = np.random.default_rng(6)
    writer = tfrecord.TFRecordWriter(str(folder / "train.tfrecord"))
    for i in range(_RECORDS):
        writer.write({"image": (rng.bytes(int(rng.integers(1000, 3000))), "byte"),
                      "label": (i % 1000, "int"), "text": (b"caption %d" % i, "byte")})
    writer.close()


def tfrecord_path() -> str:
    return str(_folder("tfrecord", _write_tfrecord) / "train.tfrecord")


def _drain(iterable) -> int:
    count = 0
    for _ in iterable:
        count += 1
    return count


def _cache() -> str:
    """A fresh index cache for fpipe's readers (the first open builds the indexes, untimed)."""
    return tempfile.mkdtemp(prefix="fpipe-index-")


@workload("X1", description="iterate 10 WebDataset shards of 1,000 JPEG samples, decode nothing",
          reference="webdataset.WebDataset", target=">= 1.2")
def iterate_shards() -> Pair:
    import webdataset

    paths, cache = shard_paths(), _cache()
    ours = WebDatasetReader(paths, remote=RemoteOptions(cache_dir=cache))

    def theirs() -> int:
        return _drain(webdataset.WebDataset(paths, shardshuffle=False))
    return Pair(fpipe=lambda: _drain(ours), reference=theirs, items=len(ours),
                teardown=lambda: shutil.rmtree(cache, ignore_errors=True))


@workload("X2", description="random get over the 10 shards (5,000 of a fixed permutation)",
          reference="wids.ShardListDataset", target=">= 1.2")
def random_get_shards() -> Pair:
    import wids

    paths, cache = shard_paths(), _cache()
    ours = WebDatasetReader(paths, remote=RemoteOptions(cache_dir=cache))
    spec = [{"url": path, "nsamples": _PER_SHARD} for path in paths]
    theirs = wids.ShardListDataset(spec, cache_dir=os.path.join(cache, "wids"), transformations=[])
    order = np.random.default_rng(0).permutation(len(ours))[:_RANDOM_GETS].tolist()

    def run(get) -> None:
        for index in order:
            get(index)
    return Pair(fpipe=lambda: run(ours.get), reference=lambda: run(theirs.__getitem__),
                items=len(order), teardown=lambda: shutil.rmtree(cache, ignore_errors=True))


def _hf_dataset(cache: str):
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_parquet(parquet_path(), cache_dir=cache)


@workload("X3", description="iterate a 1M-row Parquet file (text + int columns) as dicts",
          reference="datasets iteration (Dataset.from_parquet)", target=">= 1.0")
def iterate_parquet() -> Pair:
    cache = _cache()
    ours, theirs = ParquetFileReader(parquet_path()), _hf_dataset(cache)
    return Pair(fpipe=lambda: _drain(ours), reference=lambda: _drain(theirs), items=len(ours),
                teardown=lambda: shutil.rmtree(cache, ignore_errors=True))


@workload("X3a", description="iterate the 1M-row Parquet file as dicts",
          reference="pyarrow iter_batches + to_pylist (the limit)", target=">= 0.7")
def iterate_parquet_limit() -> Pair:
    import pyarrow.parquet as pq

    path = parquet_path()
    ours = ParquetFileReader(path)

    def theirs() -> int:
        return sum(len(batch.to_pylist()) for batch in pq.ParquetFile(path).iter_batches())
    return Pair(fpipe=lambda: _drain(ours), reference=theirs, items=len(ours))


@workload("X4", description="random get over the 1M-row Parquet file (5,000, fixed permutation)",
          reference="datasets ds[i]", target=">= 1.0")
def random_get_parquet() -> Pair:
    cache = _cache()
    ours, theirs = ParquetFileReader(parquet_path()), _hf_dataset(cache)
    order = np.random.default_rng(0).permutation(len(ours))[:_RANDOM_GETS].tolist()

    def run(get) -> None:
        for index in order:
            get(index)
    return Pair(fpipe=lambda: run(ours.get), reference=lambda: run(theirs.__getitem__),
                items=len(order), teardown=lambda: shutil.rmtree(cache, ignore_errors=True))


@workload("X5", description="iterate 100,000 TFRecord Examples (image bytes, label, text)",
          reference="tfrecord package (tfrecord_loader)", target=">= 1.0")
def iterate_tfrecord() -> Pair:
    from tfrecord.reader import tfrecord_loader

    path, cache = tfrecord_path(), _cache()
    ours = TFRecordFileReader(path, remote=RemoteOptions(cache_dir=cache))
    return Pair(fpipe=lambda: _drain(ours), reference=lambda: _drain(tfrecord_loader(path, None)),
                items=len(ours), teardown=lambda: shutil.rmtree(cache, ignore_errors=True))


# --- X7: a shuffled epoch of Parquet against the in-order epoch --------------------------------

_GROUPED_ROWS, _GROUP_ROWS = 100_000, 1000


def _write_grouped_parquet(folder: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"row {i} of the shuffled epoch" for i in range(_GROUPED_ROWS)]
    table = pa.table({"text": texts, "n": np.arange(_GROUPED_ROWS, dtype=np.int64)})
    pq.write_table(table, folder / "rows.parquet", row_group_size=_GROUP_ROWS)


def grouped_parquet_path() -> str:
    """100,000 rows ``{"text", "n"}`` in row groups of 1,000 (fpipe's writer's default)."""
    return str(_folder("grouped", _write_grouped_parquet) / "rows.parquet")


@workload("X7", description="a shuffled epoch (IterableDataset(ParquetReader, "
          "layout=Shards(shuffle=True)), seed 0, a new epoch each run) of 100,000 Parquet rows in "
          "row groups of 1,000",
          reference="the in-order epoch of the same dataset", target=">= 0.5")
def shuffled_parquet_epoch() -> Pair:
    from fpipe.torch import IterableDataset, Samples, Shards

    path = grouped_parquet_path()
    shuffled = IterableDataset(ParquetReader(path), layout=Shards(shuffle=True), samples=Samples(seed=0))
    in_order = IterableDataset(ParquetReader(path))
    return Pair(fpipe=lambda: _drain(shuffled), reference=lambda: _drain(in_order),
                items=len(in_order))


@workload("X7q", description="an epoch of QuasiShuffler(Range(Indexed(ParquetReader))) (defaults, "
          "seed 0) over the X7 rows: chunks of 16 through the row-group cache",
          reference="the in-order epoch of the same dataset", target="-")
def quasi_shuffled_parquet_epoch() -> Pair:
    from fpipe.orderings.order import Indexed

    path = grouped_parquet_path()
    reader = ParquetReader(path)
    shuffler = QuasiShuffler(Range(Indexed(reader), 0, len(reader)), seed=0)
    in_order = ParquetReader(path)
    return Pair(fpipe=lambda: _drain(shuffler), reference=lambda: _drain(in_order),
                items=len(reader))


# --- X6: fpipe write from each format, then a DataLoader epoch --------------------------------

def _epoch(path: Path) -> int:
    import torch

    from fpipe.torch import Dataset

    loader = torch.utils.data.DataLoader(Dataset(MsgpackReader(path)), batch_size=64,
                                         num_workers=2, collate_fn=list)
    return sum(len(batch) for batch in loader)


def _write_then_epoch(kind: str, sources: list[str], options: tuple[str, ...] = ()) -> Pair:
    from fpipe.cli import main
    from fpipe.cli._formats import open_source

    folder = Path(tempfile.mkdtemp(prefix=f"fpipe-x6{kind}-"))
    reader = open_source(kind, sources)
    samples = [{**sample, "key": key} for key, sample in reader.iter(yield_key=True)]
    # the reference's samples stay alive through both sides: out of the collector's walks,
    # which would otherwise charge either side for them
    gc.collect()
    gc.freeze()
    env_cache = os.environ.get("FPIPE_CACHE_DIR")
    os.environ["FPIPE_CACHE_DIR"] = str(folder / "cache")

    def ours() -> int:
        out = _fresh(folder / "from-format") / "out.msgpack"
        assert main(["write", *sources, str(out), "-q", *options]) == 0
        return _epoch(out)

    def theirs() -> int:
        out = _fresh(folder / "from-memory") / "out.msgpack"
        with FileWriter(out) as writer:
            for sample in samples:
                writer.write(sample)
        return _epoch(out)

    def teardown() -> None:
        if env_cache is None:
            os.environ.pop("FPIPE_CACHE_DIR", None)
        else:
            os.environ["FPIPE_CACHE_DIR"] = env_cache
        gc.unfreeze()
        shutil.rmtree(folder, ignore_errors=True)
    return Pair(fpipe=ours, reference=theirs, items=len(samples), teardown=teardown)


def _fresh(folder: Path) -> Path:
    """``folder``, emptied: each side writes a new dataset, as a first conversion does (a
    replace by rename makes ext4 write the new file out at once, which an in-place write
    leaves to the kernel)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    return folder


@workload("X6w", description="fpipe write from the 10 WebDataset shards, then a DataLoader epoch",
          reference="the same samples written from memory", target=">= 0.8")
def write_from_shards() -> Pair:
    return _write_then_epoch("webdataset", shard_paths())


@workload("X6p", description="fpipe write from the 1M-row Parquet file, then a DataLoader epoch",
          reference="the same samples written from memory", target=">= 0.8")
def write_from_parquet() -> Pair:
    return _write_then_epoch("parquet", [parquet_path()])


@workload("X6t", description="fpipe write from the 100,000 TFRecord Examples, then a DataLoader "
          "epoch", reference="the same samples written from memory", target=">= 0.8")
def write_from_tfrecord() -> Pair:
    return _write_then_epoch("tfrecord", [tfrecord_path()])


@workload("X6t2", description="X6t with --workers 2: two processes read, parse and pack the "
          "Examples (information: how far workers go on two cores)",
          reference="the same samples written from memory", target="-")
def write_from_tfrecord_in_workers() -> Pair:
    return _write_then_epoch("tfrecord", [tfrecord_path()], ("--workers", "2"))


@workload("X6m", description="fpipe write from the 1M-row Parquet file: peak memory above that of "
          "the writer alone (the same number of samples from a generator)", reference="-",
          target="<= 64", kind="value")
def write_memory() -> Value:
    return Value(_peak_mib(_FROM_PARQUET) - _peak_mib(_FROM_GENERATOR), "MiB")


# the peak resident size of a run, less the resident size just before it
_PEAK = ("import os, resource, sys\n"
         "import fpipe.cli, fpipe.storage, pyarrow.parquet\n"
         "base = int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
         "{run}\n"
         "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
         "print((peak - base) / 2**20)\n")
_FROM_PARQUET = "assert fpipe.cli.main(['write', sys.argv[1], sys.argv[2], '-q']) == 0"
_FROM_GENERATOR = ("with fpipe.dataset.FileWriter(sys.argv[2]) as writer:\n"
                   f"    for i in range({_ROWS}):\n"
                   "        writer.write({'key': f'train.parquet:{i}', 'text': 'data train model "
                   "batch', 'n': i})")


def _peak_mib(run: str) -> float:
    folder = tempfile.mkdtemp(prefix="fpipe-x6m-")
    try:
        result = subprocess.run([sys.executable, "-c", _PEAK.format(run=run), parquet_path(),
                                 os.path.join(folder, "out.msgpack")], capture_output=True,
                                text=True, check=True, env={**os.environ, "FPIPE_CACHE_DIR": folder})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return float(result.stdout.split()[-1])
