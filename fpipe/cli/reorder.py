"""``fpipe shuffle``, ``merge``, ``split`` and ``sample``: new datasets from old ones.

All of them copy the packed bytes of each sample (no decoding), write through a staging
folder (nothing appears under an output name unless the run succeeds), and copy the class
names stored beside the input. ``merge`` renumbers the labels of inputs whose class lists
differ to the union of the lists (see :mod:`fpipe.cli._labels`), changing only the bytes
of the label.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import tempfile
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fpipe.cli._common import (
    CLASSES_SUFFIX,
    UsageError,
    add_command,
    add_output_options,
    buffer_size,
    chosen_seed,
    copy_classes,
    dataset_key_batches,
    fraction,
    human_bytes,
    non_negative_int,
    open_dataset,
    positive_int,
    progress_bar,
    refuse_options,
    say,
    shows_progress,
)
from fpipe.cli._labels import class_lists, merged_classes, renumbered
from fpipe.dataset import MsgpackReader, RawWriter
from fpipe.dataset._staging import dataset_files, staged_datasets
from fpipe.dataset.keyindex import SortedPairs, key_salt, salted_hashes
from fpipe.errors import FpipeError
from fpipe.orderings import IndexShuffler, QuasiShuffler, Shuffler
from fpipe.orderings.permutation import Permutation
from fpipe.random import item_rng

__all__ = ["add_parsers", "part_bounds"]

_BLOCK = 4096
_QUASI_BUFFER, _QUASI_CHUNK = 0.01, 16  # fpipe shuffle --mode quasi's --buf-size, --chunk-size
_SHOWN_DUPLICATES = 5


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe shuffle``, ``merge``, ``split`` and ``sample``."""
    _add_shuffle(commands)
    _add_merge(commands)
    _add_split(commands)
    _add_sample(commands)


def _seed_option(parser: argparse.ArgumentParser, what: str) -> None:
    # None when not given, so that a seed given where nothing is drawn can be refused
    parser.add_argument("--seed", type=non_negative_int,
                        help=f"seed of the {what} (0); the same seed gives the same output")


def _add_shuffle(commands: argparse._SubParsersAction) -> None:
    parser = add_command(
        commands, "shuffle", "write a dataset's samples in a shuffled order",
        "Write the samples of IN to OUT in a shuffled order, copying their bytes. --mode true "
        "draws a uniform permutation (datadings's order for a seed; it holds 4 bytes a sample) "
        "and reads sample by sample; --mode index computes a uniform permutation position by "
        "position (fpipe.IndexShuffler: no permutation in memory, for datasets of any size) "
        "and reads sample by sample; --mode quasi reads chunks of --chunk-size samples in a "
        "shuffled order through a buffer of --buf-size samples (fewer, larger reads: for slow "
        "disks; see fpipe.orderings.QuasiShuffler). --mode index and quasi hold the same memory at any "
        "size.",
        "  fpipe shuffle train.msgpack train-shuffled.msgpack --seed 7\n"
        "  fpipe shuffle web.msgpack web-shuffled.msgpack --mode index\n"
        "  fpipe shuffle huge.msgpack huge-shuffled.msgpack --mode quasi --buf-size 0.05",
        _run_shuffle)
    parser.add_argument("input", metavar="IN", help="the dataset to shuffle")
    parser.add_argument("output", metavar="OUT",
                        help="the dataset to write (not IN: write a new one, then 'fpipe mv' "
                             "it onto IN)")
    parser.add_argument("--mode", choices=("true", "index", "quasi"), default="true",
                        help="true: a uniform permutation (default); index: the same, computed "
                             "position by position; quasi: chunked and buffered")
    _seed_option(parser, "shuffle")
    parser.add_argument("--buf-size", type=buffer_size, metavar="F",
                        help="quasi: buffer size, a fraction of IN below 1 or a whole number "
                             "of samples (0.01)")
    parser.add_argument("--chunk-size", type=positive_int, metavar="N",
                        help="quasi: samples per contiguous read (16)")
    add_output_options(parser)


def _add_merge(commands: argparse._SubParsersAction) -> None:
    parser = add_command(
        commands, "merge", "merge datasets into one",
        "Merge datasets into OUT, copying their bytes. --strategy concat writes IN one after "
        "the other; --strategy random interleaves them at random, each next sample taken from "
        "an input with probability proportional to the samples it has left (so every input is "
        "spread evenly over OUT, in its own order). Keys must be unique across the inputs: "
        "duplicates are listed and nothing is written (they are found by sorting the keys' "
        "hashes in the temporary folder, TMPDIR: 16 bytes a sample there, the same memory at "
        "any size). Labels are matched by class name: when "
        "the inputs' class lists (X.msgpack.classes.json) differ, OUT's list is their union "
        "(the first input's names, then each name a later input adds, in its order) and the "
        "labels of the inputs whose numbers change are renumbered; inputs some of which have no "
        "class list are refused.",
        "  fpipe merge part-0.msgpack part-1.msgpack all.msgpack\n"
        "  fpipe merge a.msgpack b.msgpack mixed.msgpack --strategy random --seed 3",
        _run_merge)
    parser.add_argument("inputs", nargs="+", metavar="IN", help="the datasets to merge")
    parser.add_argument("output", metavar="OUT", help="the dataset to write")
    parser.add_argument("--strategy", choices=("concat", "random"), default="concat",
                        help="concat (default) or random interleaving")
    _seed_option(parser, "random interleaving")
    add_output_options(parser)


def _add_split(commands: argparse._SubParsersAction) -> None:
    parser = add_command(
        commands, "split", "split a dataset into parts",
        "Split IN into the datasets given with -o, copying their bytes: every sample goes to "
        "exactly one part. Give a count or a fraction per part, or one fewer and the last part "
        "takes the rest. Parts are contiguous ranges of IN, or with --shuffle random subsets "
        "(each in IN's order): the samples whose places in a random permutation of IN (the "
        "one fpipe.IndexShuffler computes for the seed) fall in each part's range, found in "
        "one pass over IN with no permutation in memory.",
        "  fpipe split all.msgpack --fractions 0.9 -o train.msgpack val.msgpack --shuffle\n"
        "  fpipe split all.msgpack --counts 1000 1000 -o a.msgpack b.msgpack rest.msgpack",
        _run_split)
    parser.add_argument("input", metavar="IN", help="the dataset to split")
    sizes = parser.add_mutually_exclusive_group(required=True)
    sizes.add_argument("--counts", nargs="+", type=non_negative_int, metavar="N",
                       help="samples per part")
    sizes.add_argument("--fractions", nargs="+", type=fraction, metavar="F",
                       help="fraction of IN per part (rounded so that the parts add up)")
    parser.add_argument("-o", "--outputs", nargs="+", required=True, metavar="OUT",
                        help="the parts to write, in order")
    parser.add_argument("--shuffle", action="store_true",
                        help="assign samples to parts at random (by --seed)")
    _seed_option(parser, "assignment")
    add_output_options(parser)


def _add_sample(commands: argparse._SubParsersAction) -> None:
    parser = add_command(
        commands, "sample", "write a random subset of a dataset",
        "Write N samples of IN, drawn at random without replacement, to OUT in IN's order, "
        "copying their bytes: the samples whose places in a random permutation of IN (the one "
        "fpipe.IndexShuffler computes for the seed) are among the first N, found in one pass "
        "over IN with no permutation in memory.",
        "  fpipe sample train.msgpack tiny.msgpack 100 --seed 1", _run_sample)
    parser.add_argument("input", metavar="IN", help="the dataset to sample from")
    parser.add_argument("output", metavar="OUT", help="the dataset to write")
    parser.add_argument("count", type=non_negative_int, metavar="N", help="how many samples")
    _seed_option(parser, "draw")
    add_output_options(parser)


# --- copying ----------------------------------------------------------------------------


def _copy(pairs: Iterable[tuple[str, Any]], path: Path, total: int, name: str,
          args: argparse.Namespace) -> None:
    """Write ``(key, packed bytes)`` pairs to the dataset ``path`` with a progress bar."""
    shown = shows_progress(args)
    with RawWriter(path, progress=shown, disable=not shown, total=total, desc=name,
                   unit=" samples") as writer:
        write = writer.write
        for key, data in pairs:
            write(key, data)


def _write_copy(args: argparse.Namespace, source: Path, target: Path,
                pairs: Iterable[tuple[str, Any]], total: int) -> None:
    """Write ``(key, packed bytes)`` pairs to the dataset ``target`` through a staging folder,
    with the class names stored beside ``source``."""
    with staged_datasets([target], args.overwrite, sources=dataset_files(source)) as (staged,):
        _copy(pairs, staged, total, target.name, args)
        copy_classes(source, [staged])


def _files_of(datasets: Sequence[Path]) -> list[Path]:
    """Every file of the input datasets, which no output may replace."""
    return [file for dataset in datasets for file in dataset_files(dataset)]


def _written(args: argparse.Namespace, outputs: Sequence[Path]) -> None:
    for output in outputs:
        with MsgpackReader(output) as reader:
            say(args, f"wrote {len(reader)} samples to {output} "
                      f"({human_bytes(output.stat().st_size)})")


def _in_blocks(reader: Any, indices: np.ndarray) -> Iterator[tuple[str, Any]]:
    """Raw ``(key, bytes)`` of the samples at ``indices``, read a block of indices at a time."""
    for low in range(0, len(indices), _BLOCK):
        yield from reader.get_many(indices[low:low + _BLOCK].tolist(), yield_key=True, raw=True)


# --- shuffle ----------------------------------------------------------------------------


def _run_shuffle(args: argparse.Namespace) -> int:
    if args.mode != "quasi":
        refuse_options({"--buf-size": args.buf_size, "--chunk-size": args.chunk_size},
                       f"with --mode {args.mode} (they set --mode quasi's reads)")
    buf_size = _QUASI_BUFFER if args.buf_size is None else args.buf_size
    source, target = Path(args.input), Path(args.output)
    with open_dataset(source) as reader:
        if args.mode == "quasi":
            order = QuasiShuffler(reader, buf_size=buf_size,
                                  chunk_size=args.chunk_size or _QUASI_CHUNK, seed=chosen_seed(args))
        else:
            order = (Shuffler if args.mode == "true" else IndexShuffler)(reader, seed=chosen_seed(args))
        _write_copy(args, source, target, order.iter(yield_key=True, raw=True), len(reader))
    _written(args, [target])
    return 0


# --- merge ------------------------------------------------------------------------------


def _run_merge(args: argparse.Namespace) -> int:
    if args.strategy == "concat":
        refuse_options({"--seed": args.seed}, "with --strategy concat, which draws nothing")
    sources, target = [Path(p) for p in args.inputs], Path(args.output)
    readers = [open_dataset(source) for source in sources]
    try:
        _check_unique_keys(sources, readers, args)
        classes, tables = merged_classes(sources)
        lengths = [len(reader) for reader in readers]
        streams = [_merged_samples(*inputs) for inputs in zip(readers, tables, sources)]
        pairs = (_interleaved(streams, lengths, chosen_seed(args)) if args.strategy == "random"
                 else itertools.chain.from_iterable(streams))
        with staged_datasets([target], args.overwrite, sources=_files_of(sources)) as (staged,):
            _copy(pairs, staged, sum(lengths), target.name, args)
            _store_merged_classes(args, sources, staged, classes, tables)
    finally:
        for reader in readers:
            reader.close()
    _written(args, [target])
    return 0


def _merged_samples(reader: Any, table: dict, source: Path) -> Iterator[tuple[str, Any]]:
    """The raw ``(key, bytes)`` of an input, with its labels renumbered if ``table`` says so."""
    pairs = reader.iter(yield_key=True, raw=True)
    return renumbered(pairs, table, source) if table else pairs


def _store_merged_classes(args: argparse.Namespace, sources: list[Path], staged: Path,
                          classes: dict | None, tables: list[dict]) -> None:
    """The inputs' class list beside the merged dataset: copied when they all have the same,
    else their union, with a note naming the inputs whose labels were renumbered."""
    if classes is None:
        return
    if all(class_lists(source) == classes for source in sources):
        copy_classes(sources[0], [staged])  # with whatever else the file holds
        return
    content = {"dataset": f"merge of {', '.join(map(str, sources))}", "classes": classes}
    Path(f"{staged}{CLASSES_SUFFIX}").write_text(
        json.dumps(content, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    changed = [str(source) for source, table in zip(sources, tables) if table]
    if changed and not args.quiet:
        sizes = ", ".join(f"{field}: {len(names)} names" for field, names in classes.items())
        print(f"fpipe merge: note: the inputs' class lists differ; the merged list is their "
              f"union ({sizes}) and the labels of {', '.join(changed)} were renumbered to it",
              file=sys.stderr)


def _check_unique_keys(sources: list[Path], readers: list, args: argparse.Namespace) -> None:
    """Refuse inputs that share a key, naming them; in bounded memory: the keys' hashes are
    sorted by partitions in the temporary folder (16 bytes a sample), and only the keys of
    equal hashes are compared."""
    starts = np.cumsum([0, *map(len, readers)]).tolist()
    with tempfile.TemporaryDirectory(prefix="fpipe-merge-") as folder, progress_bar(
            args, total=starts[-1], desc="checking the keys", unit=" keys") as bar:
        pairs = SortedPairs(starts[-1], Path(folder))
        for start, reader in zip(starts, readers):
            for first, keys in dataset_key_batches(reader):
                pairs.add(salted_hashes(keys, key_salt(0)), start + first)
                bar.update(len(keys))
        groups = pairs.equal_hashes()
    duplicates = []
    for group in groups:  # samples whose hashes are equal: their keys tell
        owner: dict[str, tuple[int, int]] = {}
        for index in sorted(group):
            which, local = _located(index, starts)
            key = readers[which].find_key(local)
            first = owner.setdefault(key, (which, local))
            if first != (which, local):
                duplicates.append((key, first, (which, local)))
    duplicates.sort(key=lambda found: (found[2], found[1]))
    if duplicates:
        shown = "; ".join(f"{key!r} is sample {a} of {sources[i]} and sample {b} of {sources[j]}"
                          for key, (i, a), (j, b) in duplicates[:_SHOWN_DUPLICATES])
        more = (f" (and {len(duplicates) - _SHOWN_DUPLICATES} more)"
                if len(duplicates) > _SHOWN_DUPLICATES else "")
        raise FpipeError(f"{len(duplicates)} duplicate key(s), nothing was written: {shown}{more}")


def _located(index: int, starts: list[int]) -> tuple[int, int]:
    """Which input holds the sample at ``index`` of all the inputs, and where in it."""
    which = bisect_right(starts, index) - 1
    return which, index - starts[which]


def _interleaved(streams: list[Iterator], lengths: list[int], seed: int
                 ) -> Iterator[tuple[str, Any]]:
    """Each next sample from a random input, chosen with probability proportional to the
    samples it has left: a uniformly random interleaving that keeps every input's order.
    Drawn a block at a time: how many of the block each input gives (a multivariate
    hypergeometric draw), in a random order, so that no pass holds a pick per sample."""
    rng, left = item_rng(seed, 0, 0), np.array(lengths, dtype=np.int64)
    while (total := int(left.sum())):
        counts = rng.multivariate_hypergeometric(left, min(_BLOCK, total))
        picks = np.repeat(np.arange(len(streams), dtype=np.int32), counts)
        rng.shuffle(picks)
        left -= counts
        for pick in picks.tolist():
            yield next(streams[pick])


# --- split ------------------------------------------------------------------------------


def part_bounds(n: int, parts: int, counts: Sequence[int] | None = None,
                fractions: Sequence[float] | None = None) -> list[int]:
    """The ``parts + 1`` boundaries that cut ``n`` samples into parts of the given counts or
    fractions (one fewer: the last part takes the rest). Raises :class:`UsageError` if they
    do not add up to ``n``.

    >>> part_bounds(10, 3, counts=[3, 3])
    [0, 3, 6, 10]
    >>> part_bounds(10, 2, fractions=[0.25, 0.75])
    [0, 2, 10]
    >>> part_bounds(10, 2, counts=[3, 3])
    Traceback (most recent call last):
    ...
    fpipe.cli._common.UsageError: --counts add up to 6 but IN has 10 samples; ...
    """
    given = counts if counts is not None else fractions
    name = "--counts" if counts is not None else "--fractions"
    if len(given) not in (parts, parts - 1):
        raise UsageError(f"{name} needs {parts} or {parts - 1} values for {parts} outputs; "
                         f"got {len(given)}")
    bounds = _count_bounds(n, counts, parts) if counts is not None else \
        _fraction_bounds(n, fractions, parts)
    if bounds[-2] > n:
        what = f"add up to {bounds[-2]} samples" if counts is not None else "add up to more than 1"
        raise UsageError(f"{name} {what}, but IN has {n} samples")
    return bounds


def _count_bounds(n: int, counts: Sequence[int], parts: int) -> list[int]:
    bounds = np.cumsum([0, *counts]).tolist()
    if len(counts) == parts:
        if bounds[-1] != n:
            raise UsageError(f"--counts add up to {bounds[-1]} but IN has {n} samples; give one "
                             "count fewer to let the last part take the rest")
        return bounds
    return [*bounds, max(n, bounds[-1])]


def _fraction_bounds(n: int, fractions: Sequence[float], parts: int) -> list[int]:
    if any(not 0 <= f <= 1 for f in fractions):
        raise UsageError(f"--fractions must be between 0 and 1; got {' '.join(map(str, fractions))}")
    total = float(sum(fractions))
    if len(fractions) == parts and abs(total - 1) > 1e-6:
        raise UsageError(f"--fractions add up to {total:g}, not 1; give one fraction fewer to let "
                         "the last part take the rest")
    if total > 1 + 1e-6:
        raise UsageError(f"--fractions add up to {total:g}, more than 1")
    cuts = np.round(np.cumsum(fractions[:parts - 1]) * n).astype(np.int64).tolist()
    return [0, *(min(cut, n) for cut in cuts), n]


def _run_split(args: argparse.Namespace) -> int:
    if not args.shuffle:
        refuse_options({"--seed": args.seed}, "without --shuffle, which draws the parts")
    source, targets = Path(args.input), [Path(p) for p in args.outputs]
    if len({target.resolve() for target in targets}) < len(targets):
        raise UsageError(f"an output is given twice: {' '.join(args.outputs)}")
    with open_dataset(source) as reader:
        n = len(reader)
        bounds = part_bounds(n, len(targets), args.counts, args.fractions)
        with staged_datasets(targets, args.overwrite, sources=dataset_files(source)) as staged:
            if args.shuffle:
                permutation = Permutation(n, chosen_seed(args), 0)
                _copy_parts(reader, staged, lambda block: np.searchsorted(
                    bounds, permutation.positions(block), side="right") - 1, args)
            else:
                for target, path, low, high in zip(targets, staged, bounds, bounds[1:]):
                    _copy(reader.iter(low, high, yield_key=True, raw=True), path, high - low,
                          target.name, args)
            copy_classes(source, staged)
    _written(args, targets)
    return 0


def _copy_parts(reader: Any, paths: Sequence[Path], part_of: Callable[[np.ndarray], np.ndarray],
                args: argparse.Namespace) -> None:
    """One pass over ``reader`` in its order, each sample written to the dataset of ``paths``
    that ``part_of`` (of a block of indices) gives, or to none for -1."""
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(RawWriter(path)) for path in paths]
        bar = stack.enter_context(progress_bar(args, total=len(reader), desc=paths[0].name,
                                               unit=" samples"))
        for low in range(0, len(reader), _BLOCK):
            high = min(len(reader), low + _BLOCK)
            parts = part_of(np.arange(low, high)).tolist()
            for part, (key, data) in zip(parts, reader.iter(low, high, yield_key=True, raw=True)):
                if part >= 0:
                    writers[part].write(key, data)
            bar.update(high - low)


# --- sample -----------------------------------------------------------------------------


def _run_sample(args: argparse.Namespace) -> int:
    source, target = Path(args.input), Path(args.output)
    with open_dataset(source) as reader:
        if args.count > len(reader):
            raise UsageError(f"N is {args.count} but {source} has only {len(reader)} samples")
        # the samples whose places in a random permutation come first: a uniform draw
        permutation = Permutation(len(reader), chosen_seed(args), 0)
        with staged_datasets([target], args.overwrite, sources=dataset_files(source)) as staged:
            _copy_parts(reader, staged, lambda block: np.where(
                permutation.positions(block) < args.count, 0, -1), args)
            copy_classes(source, staged)
    _written(args, [target])
    return 0
