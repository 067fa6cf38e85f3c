"""``fpipe bench DATASET``: read throughput of a dataset, alone and through a pipeline."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from fpipe.cli._common import (
    UsageError,
    add_command,
    chosen_seed,
    non_negative_int,
    open_dataset,
    positive_int,
    positive_number,
    progress_bar,
    refuse_options,
    workers,
)
from fpipe.cli._images import encoded_image
from fpipe.dataset import unpack_sample
from fpipe.functional import unpack_args
from fpipe.image import ImageDecodeError, decode_image, with_sample_named
from fpipe.orderings import QuasiShuffler, Shuffler
from fpipe.stream import batch, processes, stats

__all__ = ["add_parsers", "decode_sample"]

_MODES = ("sequential", "random", "quasi")
_SHUFFLED = frozenset(("random", "quasi"))
_CHECK_EVERY = 64
_WORKERS, _BATCH_SIZE = 2, 32  # of --pipeline
# The shortest measurement that gives a rate: under it, start-up costs and the timer's
# grain are a large part of the time (51 samples read in 0.4 ms are no "132,742 samples/s")
_LEAST_SECONDS = 0.1


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe bench``."""
    parser = add_command(
        commands, "bench", "measure how fast a dataset reads",
        "Measure samples/s and MB/s of reading DATASET: sequential (in file order, large "
        "reads), random (a true shuffle: every sample once, one read each) and quasi (a "
        "QuasiShuffler: chunks in a shuffled order through a buffer). Samples are decoded "
        "(msgpack) unless --raw. With --pipeline, it also reads through a pipeline of "
        "process workers that decode samples and their images (JPEG, PNG, GIF, WebP), into "
        "batches, and prints the per-stage table; a sample that does not decode stops it, "
        "named by its index and key. Each measurement stops after one pass or --seconds. "
        "Figures reflect the page cache: a dataset read just before comes from memory.",
        "  fpipe bench train.msgpack\n  fpipe bench train.msgpack --modes random --seconds 10\n"
        "  fpipe bench train.msgpack --pipeline --workers 4 --batch-size 64", _run_bench)
    parser.add_argument("dataset", metavar="DATASET", help="the dataset file (X.msgpack)")
    parser.add_argument("--modes", default=",".join(_MODES), metavar="LIST",
                        help=f"comma-separated reads to measure ({','.join(_MODES)})")
    parser.add_argument("--seconds", type=positive_number, default=5.0,
                        help="stop each measurement after this long (5)")
    parser.add_argument("--raw", action="store_true", help="do not decode the samples")
    parser.add_argument("--seed", type=non_negative_int, help="seed of the shuffled reads (0)")
    pipeline = parser.add_argument_group("pipeline")
    pipeline.add_argument("--pipeline", action="store_true",
                          help="also read through a pipeline and print the per-stage table")
    pipeline.add_argument("--workers", type=workers,
                          help=f"decoding processes of the pipeline ({_WORKERS})")
    pipeline.add_argument("--batch-size", type=positive_int,
                          help=f"batch size ({_BATCH_SIZE})")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _run_bench(args: argparse.Namespace) -> int:
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in _MODES]
    if unknown or not (modes or args.pipeline):
        raise UsageError(f"--modes must be a comma-separated list of {', '.join(_MODES)}; "
                         f"got {args.modes!r}")
    _check_unused_options(args, modes)
    with open_dataset(args.dataset) as reader:
        if not len(reader):
            raise UsageError(f"{args.dataset} is empty: nothing to measure")
        print(f"{args.dataset}: {len(reader)} samples, {reader.path.stat().st_size / 1e6:.1f} MB, "
              f"{'raw' if args.raw else 'decoded'}")
        print(f"{'read':<12}{'samples':>10}{'seconds':>10}{'samples/s':>12}{'MB/s':>10}")
        for mode in modes:
            count, size, seconds = _measure(_reads(reader, mode, chosen_seed(args)), args, mode,
                                            len(reader))
            print(_row(mode, count, size, seconds, len(reader)), flush=True)
        if args.pipeline:
            _bench_pipeline(reader, args)
    return 0


def _check_unused_options(args: argparse.Namespace, modes: list[str]) -> None:
    if not args.pipeline:
        refuse_options({"--workers": args.workers, "--batch-size": args.batch_size},
                       "without --pipeline")
    if not _SHUFFLED & set(modes):
        refuse_options({"--seed": args.seed}, "without a shuffled read (--modes random or quasi)")
    if not modes:
        refuse_options({"--raw": args.raw}, "without --modes: the pipeline always decodes")


def _reads(reader: Any, mode: str, seed: int) -> Iterator[bytes]:
    if mode == "sequential":
        return reader.iter(raw=True)
    ordering = Shuffler(reader, seed=seed) if mode == "random" else QuasiShuffler(reader, seed=seed)
    return ordering.iter(raw=True)


def _measure(samples: Iterable[bytes], args: argparse.Namespace, name: str,
             total: int) -> tuple[int, int, float]:
    """Read (and decode) samples for at most ``args.seconds``; return count, bytes, seconds."""
    count = size = 0
    decode = None if args.raw else unpack_sample
    bar = progress_bar(args, total=total, desc=name, unit=" samples")
    start = time.perf_counter()
    deadline = start + args.seconds
    with bar:
        for data in samples:
            size += len(data)
            if decode is not None:
                decode(data)
            count += 1
            if count % _CHECK_EVERY == 0:
                bar.update(_CHECK_EVERY)
                if time.perf_counter() > deadline:
                    break
    return count, size, time.perf_counter() - start


def _row(name: str, count: int, size: int, seconds: float, total: int) -> str:
    if seconds < _LEAST_SECONDS:
        return f"{name:<12}{count:>10}  {_too_few(seconds, count < total)}"
    return (f"{name:<12}{count:>10}{seconds:>10.3f}{count / seconds:>12,.0f}"
            f"{size / 1e6 / seconds:>10,.1f}")


def _too_few(seconds: float, timed_out: bool) -> str:
    """What a measurement shorter than :data:`_LEAST_SECONDS` says instead of a rate: a pass
    over a small dataset is over before the timer means anything.

    >>> _too_few(0.0004, False)
    'too few samples to measure (took 0.4 ms; give more with a dataset of more samples)'
    """
    more = "a longer --seconds" if timed_out else "a dataset of more samples"
    return f"too few samples to measure (took {seconds * 1e3:.1f} ms; give more with {more})"


def decode_sample(data: bytes, index: int | None = None) -> dict:
    """Decode a packed sample and every JPEG, PNG, GIF or WebP image in it (to an RGB uint8
    array). With its ``index``, an error names the sample (index and key) and the field.

    >>> from fpipe.dataset import pack_sample
    >>> decode_sample(pack_sample({"key": "a", "label": 1}))
    {'key': 'a', 'label': 1}
    >>> decode_sample(pack_sample({"key": "a", "image": b"\\xff\\xd8\\xff cut"}), 6)
    Traceback (most recent call last):
    ...
    fpipe.image.ImageDecodeError: sample 6 (key 'a'), field 'image': cannot decode 7 bytes ...
    """
    sample = unpack_sample(data, index=index)
    if isinstance(sample, dict):
        for name, value in sample.items():
            if encoded_image(value):
                sample[name] = _image_array(value, index, sample, name)
    return sample


def _image_array(data: bytes, index: int | None, sample: dict, field: str) -> np.ndarray:
    try:
        return np.asarray(decode_image(data))
    except ImageDecodeError as error:
        if index is None:
            raise
        raise with_sample_named(error, index, sample, field) from None


def _bench_pipeline(reader: Any, args: argparse.Namespace) -> None:
    from toolz import pipe

    workers, size = args.workers or _WORKERS, args.batch_size or _BATCH_SIZE
    stages = (processes(unpack_args(decode_sample), n_workers=workers, backend="loky"),
              batch(size))
    stream = pipe(zip(reader.iter(raw=True), itertools.count()), *stages)  # (data, index)
    with stream:
        startup, count, seconds = _consume(stream, args, len(reader))
        table = stats(stream)
    print(f"\npipeline: read -> {' -> '.join(map(repr, stages))}")  # as the table names them
    rate = (_too_few(seconds, count + size < len(reader)) if seconds < _LEAST_SECONDS else
            f"{count / seconds:,.0f} samples/s")
    print(f"first batch after {startup:.2f} s (starting the workers); then {count} samples in "
          f"{seconds:.2f} s: {rate}\n")
    print(table)


def _consume(stream: Iterator[list], args: argparse.Namespace,
             total: int) -> tuple[float, int, float]:
    """Time to the first batch; then the samples of the later batches and their time."""
    start = time.perf_counter()
    with progress_bar(args, total=total, desc="pipeline", unit=" samples") as bar:
        first = next(stream, [])
        bar.update(len(first))
        started = time.perf_counter()
        count, deadline = 0, started + args.seconds
        for batch in stream:
            count += len(batch)
            bar.update(len(batch))
            if time.perf_counter() > deadline:
                break
    return started - start, count, time.perf_counter() - started
