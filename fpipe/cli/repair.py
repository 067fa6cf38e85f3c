"""``fpipe verify`` (checksums and structure) and ``fpipe index`` (rebuild or convert an index)."""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fpipe.cli._common import (
    add_command,
    data_file,
    human_bytes,
    progress_bar,
    refuse_options,
    say,
    shows_progress,
)
from fpipe.cli._images import image_problems
from fpipe.cli._index_checks import (
    Index,
    OffsetChecks,
    key_problems,
    keys_and_offsets,
    offset_problems,
    read_index,
)
from fpipe.cli._prepare import is_prepared, verify_prepared
from fpipe.dataset import index_keys, legacy_index_batches, md5_file, rebuild_index, unpack_sample
from fpipe.dataset._indexing import IndexBuilder
from fpipe.dataset._staging import finish_commit, staging_folder
from fpipe.dataset.recovery import DamagedDataError
from fpipe.errors import FormatError, FpipeError, redacted_url
from fpipe.files import DatasetFiles, read_md5

__all__ = ["add_parsers", "check_dataset"]

_MAX_SAMPLE_PROBLEMS = 10


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe verify`` and ``fpipe index``."""
    _add_verify(commands)
    _add_index(commands)


def _add_verify(commands: argparse._SubParsersAction) -> None:
    verify = add_command(
        commands, "verify", "check a dataset's checksums and structure",
        "Check datasets: every file against the checksums in X.msgpack.md5; the index (offsets "
        "start at 0, increase, and end at the data file's size; one unique key per sample; key "
        "hashes and Bloom filter match the keys); and that every sample is exactly one msgpack "
        "message whose \"key\" is its key in the index. Prints each problem with the sample and "
        "byte offset; the exit status is 1 if there is any. It holds the same memory at any "
        "size: repeated keys are found by sorting the keys' hashes in the temporary folder "
        "(TMPDIR: 16 bytes a sample there; 8 more for a legacy .index, whose offsets are "
        "copied there as its map is read).",
        "  fpipe verify train.msgpack val.msgpack\n  fpipe verify big.msgpack --quick",
        _run_verify)
    verify.add_argument("datasets", nargs="+", metavar="DATASET",
                        help="dataset files (X.msgpack), or URLs (fetched to a temporary "
                             "folder), or the folder or URL of a dataset that 'fpipe write "
                             "--processes/--cluster' prepared (each shard checked against its "
                             "partition's manifest: size, MD5, samples; the index against the "
                             "manifests)")
    verify.add_argument("--quick", action="store_true",
                        help="check checksums and the index, not every sample")
    verify.add_argument("--images", action="store_true",
                        help="also check every image, as 'fpipe write --check' does: the "
                             "JPEG, PNG, GIF, WebP bytes, and the bytes of samples whose key "
                             "names an image file (an empty or text file named .jpg is a bad "
                             "image); report those that are empty, not images, cut off or do "
                             "not decode (slower: a full decode of each)")
    verify.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar; print only problems")


def _add_index(commands: argparse._SubParsersAction) -> None:
    index = add_command(
        commands, "index", "rebuild the index of a damaged data file, or convert a legacy .index",
        "Rebuild the index files (.offsets, .keys, .key_hashes, .filter) and .md5 of a data "
        "file by reading its samples, e.g. after the writer was killed. Every intact sample is "
        "kept. An incomplete last sample (a writer killed while writing it) is cut off the data "
        "file and kept as DATASET.incomplete. Damage elsewhere does not end the scan: it goes "
        "on where samples decode again (a sample and the next, or one up to the end of the "
        "file), and the bytes in between are a damaged region; bytes in which a sample decodes "
        "are never cut off. With damaged regions nothing is changed unless -y is given; then "
        "the intact samples are written to a new data file, and the original is kept as "
        "DATASET.damaged. Where the bytes cannot tell an intact sample from a damaged one, "
        "nothing is changed, with or without -y (exit status 1). --dry-run lists what would "
        "be done. A dataset "
        "with only a legacy X.msgpack.index (datadings < 3.1) is converted from that index "
        "instead (--scan reads the samples anyway). The new files are written beside the "
        "dataset and renamed into place at the end. A dataset whose data file is missing "
        "because a command that replaced it was killed while it renamed the new files into "
        "place is finished instead: the new dataset is put in place. It holds the same memory "
        "at any size: the "
        "index files are built as the scan finds the samples, or as the legacy index is read "
        "(about 40 bytes a sample beside the dataset meanwhile; with --dry-run, in the "
        "temporary folder, or none for a legacy index).",
        "  fpipe index killed.msgpack --dry-run\n  fpipe index killed.msgpack\n"
        "  fpipe index damaged.msgpack -y\n  fpipe index from-datadings.msgpack --keys",
        _run_index)
    index.add_argument("dataset", metavar="DATASET", help="the data file (X.msgpack)")
    index.add_argument("--keys", action="store_true",
                       help="only add the key index (.key_index) to a dataset whose index is "
                            "intact (one written by datadings, say): reads the index files, not "
                            "the samples, in the same memory at any size")
    index.add_argument("--scan", action="store_true",
                       help="rebuild from the samples even when a legacy .index exists")
    index.add_argument("--dry-run", action="store_true",
                       help="report what would be recovered, cut and dropped; change nothing")
    index.add_argument("-y", "--drop-damaged", action="store_true",
                       help="drop damaged regions between samples: write the intact samples to "
                            "a new data file, keeping the original as DATASET.damaged")
    index.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")


# --- verify -----------------------------------------------------------------------------


def _run_verify(args: argparse.Namespace) -> int:
    if args.quick:
        refuse_options({"--images": args.images}, "with --quick, which reads no sample")
    failed = False
    for dataset in args.datasets:
        if is_prepared(dataset):
            problems = verify_prepared(dataset, args)
            if problems:
                failed = True
                print(f"{redacted_url(dataset)}: {len(problems)} problem(s)")
                print("\n".join(f"  {problem}" for problem in problems))
            continue
        problems, images, checked = _check_any(dataset, args)
        if problems or images:
            failed = True
            print(f"{redacted_url(dataset)}: {len(problems) + len(images)} problem(s)")
            print("\n".join(f"  {problem}" for problem in problems + images))
            hint = _hint(problems)  # fpipe index rebuilds an index; it mends no image
            if hint:
                print(f"  hint: {hint}")
        else:
            say(args, f"{dataset}: ok ({checked})")
    return 1 if failed else 0


def _check_any(dataset: str, args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """:func:`_findings` of a path, or of a URL's dataset fetched to a temporary folder."""
    from fpipe.cli.transfer import fetched_copy
    from fpipe.remote.urls import is_url

    if not is_url(dataset):
        return _findings(Path(dataset), args)
    path, folder = fetched_copy(dataset)
    with folder:
        return _findings(path, args)


def check_dataset(path: Path, args: argparse.Namespace) -> tuple[list[str], str]:
    """The problems found in dataset ``path``, and what was checked."""
    problems, images, checked = _findings(path, args)
    return problems + images, checked


def _findings(path: Path, args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """The problems with the files, index and samples of dataset ``path``; those with its
    images (``--images``); and what was checked."""
    files = DatasetFiles(data_file(path))
    problems, checked_files = _check_md5(files, args)
    index, index_problems = _check_index(files, args)
    problems += index_problems
    checked = f"md5 of {checked_files} files, index"
    if index is not None and not args.quick:
        problems += _check_samples(files, index, args)
        checked += f", {index.count} samples"
    images: list[str] = []
    if index is not None and getattr(args, "images", False):
        images, decoded = image_problems(files.data, args)
        checked += f", {decoded} images checked"
    return problems, images, checked


def _check_md5(files: Any, args: argparse.Namespace) -> tuple[list[str], int]:
    """Problems with the checksums, and how many files were checked against them."""
    if not os.path.lexists(files.md5):
        return [f"{files.md5.name} is missing: nothing to check the files against"], 0
    try:
        entries = read_md5(files.data)
    except FormatError as error:
        return [str(error)], 0
    problems = []
    if files.data.name not in entries:
        problems.append(f"{files.md5.name} has no entry for {files.data.name}")
    # Only the dataset's own files, in its folder: an entry is a name from a file that anyone
    # may have written, so "../../etc/hostname" or a FIFO is reported, never read.
    own = {path.name: path for path in files.members if path != files.md5}
    for name, expected in entries.items():
        problem = _md5_problem(own.get(name), name, expected, files, args)
        if problem:
            problems.append(problem)
    return problems, sum(name in own for name in entries)


def _md5_problem(target: Path | None, name: str, expected: str, files: Any,
                 args: argparse.Namespace) -> str:
    listed = f"listed in {files.md5.name}"
    if target is None:
        return f"{name!r} is not a file of this dataset ({listed}); it was not read"
    if not os.path.lexists(target):
        return f"{name} is missing ({listed})"
    try:
        actual = md5_file(target, progress=target == files.data and shows_progress(args))
    except (FormatError, OSError) as error:
        return f"{name} cannot be checked ({listed}): {_reason(error)}"
    return "" if actual == expected else f"{name}: md5 is {actual}, {files.md5.name} says {expected}"


def _reason(error: FormatError | OSError) -> str:
    """What went wrong, without the file name that the problem line names already."""
    if isinstance(error, FormatError):
        return error.reason
    return error.strerror or str(error)


def _check_index(files: Any, args: argparse.Namespace) -> tuple[Index | None, list[str]]:
    """Read and check the index; return it if samples can be checked by it."""
    try:
        index = read_index(files)
        problems, broken = offset_problems(index, files.data.stat().st_size)
        with progress_bar(args, total=index.count, desc=f"checking the keys of {files.data.name}",
                          unit=" keys") as bar:
            problems += key_problems(index, bar.update)
    except (FormatError, OSError, ValueError) as error:
        return None, [f"index: {error}"]
    return (None if broken else index), problems


def _check_samples(files: Any, index: Index, args: argparse.Namespace) -> list[str]:
    problems = []
    bar = progress_bar(args, total=index.count, desc=f"checking {files.data.name}",
                       unit=" samples")
    with bar, open(files.data, "rb") as data:
        for i, problem in _sample_problems(data, index, bar.update):
            problems.append(problem)
            if len(problems) == _MAX_SAMPLE_PROBLEMS:
                problems.append("... (stopped after "
                                f"{_MAX_SAMPLE_PROBLEMS} bad samples; sample {i} was the last)")
                break
    return problems


def _sample_problems(data: Any, index: Index, tick: Callable[[int], Any]
                     ) -> Iterator[tuple[int, str]]:
    for first, keys, offsets in keys_and_offsets(index):
        base = int(offsets[0])
        buffer = memoryview(os.pread(data.fileno(), int(offsets[-1]) - base, base))
        for i, key, start, stop in zip(itertools.count(first), keys, offsets.tolist(),
                                       offsets[1:].tolist()):
            try:
                sample = unpack_sample(buffer[start - base:stop - base], path=data.name, index=i,
                                       offset=start)
            except FormatError as error:
                yield i, str(error)
                continue
            found = sample.get("key") if isinstance(sample, dict) else None
            if found != key:
                yield i, f"sample {i} at byte {start}: its \"key\" is {found!r}, the index says {key!r}"
        tick(len(keys))


def _hint(problems: list[str]) -> str:
    text = " ".join(problems)
    if "index" in text or "truncated" in text or "after its last sample" in text or ".offsets" in text:
        return "'fpipe index DATASET' rebuilds the index from the samples in the data file"
    return ""


# --- index ------------------------------------------------------------------------------


def _run_index(args: argparse.Namespace) -> int:
    if not args.dry_run and finish_commit(args.dataset):
        say(args, f"{args.dataset}: finished the interrupted command that replaced it: the new "
                  "dataset is in place")
        return 0
    files = DatasetFiles(data_file(args.dataset))
    if args.keys:
        refuse_options({"--scan": args.scan, "--dry-run": args.dry_run,
                        "-y/--drop-damaged": args.drop_damaged},
                       "with --keys, which reads only the index files")
        index_keys(files.data)
        say(args, f"{files.data}: wrote its key index ({files.key_index.name})")
        return 0
    if files.legacy_index.exists() and not files.offsets.exists() and not args.scan:
        count = _convert_legacy(files, args.dry_run, shows_progress(args))
        verb = "would convert" if args.dry_run else "converted"
        say(args, f"{files.data}: {verb} the legacy index ({count} samples)")
        return 0
    size = files.data.stat().st_size
    try:
        report = _rebuild(files.data, size, args)
    except DamagedDataError as error:
        _say_damage(args, error.report)
        raise FpipeError(f"{files.data}: {error.report.damage()}. Nothing was changed; "
                         f"'-y' drops the damaged bytes, keeps the {error.report.samples} intact "
                         f"samples and the original as {error.report.backup}") from None
    say(args, _rebuild_summary(files.data, size, report, args.dry_run))
    _say_damage(args, report)
    return 0


def _rebuild(data: Path, size: int, args: argparse.Namespace) -> Any:
    with progress_bar(args, total=size, desc="scanning", unit="B", unit_scale=True) as bar:
        return rebuild_index(data, progress=lambda done: bar.update(done - bar.n),
                             drop_damaged=args.drop_damaged, dry_run=args.dry_run)


def _rebuild_summary(data: Path, size: int, report: Any, dry_run: bool) -> str:
    verb = "would index" if dry_run else "indexed"
    text = f"{data}: {verb} {report.samples} samples ({human_bytes(report.valid_bytes)})"
    if report.damaged:
        drop = "would drop" if dry_run else "dropped"
        keep = "would keep" if dry_run else "kept"
        text += (f"; {drop} {len(report.damaged)} damaged region(s), "
                 f"{sum(region.size for region in report.damaged)} bytes ({keep} the original "
                 f"data file as {report.backup})")
    if report.incomplete_bytes:
        cut = "would cut off" if dry_run else "cut off"
        text += (f"; {cut} {report.incomplete_bytes} bytes of an incomplete sample at byte "
                 f"{size - report.incomplete_bytes}")
        if report.cut_copy is not None:
            text += f" ({'would keep' if dry_run else 'kept'} them as {report.cut_copy})"
    return text


def _say_damage(args: argparse.Namespace, report: Any) -> None:
    for region in report.damaged[:_MAX_SAMPLE_PROBLEMS]:
        say(args, f"  damaged: bytes {region.start}-{region.stop} ({region.size} bytes): "
                  f"{region.reason}")
    if len(report.damaged) > _MAX_SAMPLE_PROBLEMS:
        say(args, f"  ... and {len(report.damaged) - _MAX_SAMPLE_PROBLEMS} more damaged regions")


def _convert_legacy(files: Any, dry_run: bool, progress: bool) -> int:
    """Write the index files of ``files`` from its legacy ``.index`` (only check that, with
    ``dry_run``), reading its map a batch at a time; how many samples it lists."""
    size = files.data.stat().st_size
    if dry_run:
        return _add_legacy_samples(files, size, None)
    with staging_folder(files.data) as folder:
        builder = IndexBuilder(folder, files.data.name)
        try:
            count = _add_legacy_samples(files, size, builder)
        except BaseException:
            builder.abandon()
            raise
        built = builder.finish()
        built.refuse_duplicates()
        built.commit(files, md5_file(files.data, progress=progress))
    return count


def _add_legacy_samples(files: Any, size: int, builder: IndexBuilder | None) -> int:
    """Hand the keys and lengths of the samples that the legacy ``.index`` of ``files`` lists
    (its data file has ``size`` bytes) to ``builder``, if one is given, a batch at a time,
    checking their offsets as they come; how many there are. Damaged offsets raise
    FormatError at the end (the message counts them all)."""
    checks, count = OffsetChecks(), 0
    held_keys: list[str] = []  # the last key read: where it ends shows in the next batch
    held_starts = np.zeros(0, np.uint64)
    for keys, starts in legacy_index_batches(files.data):
        checks.add(starts.astype(np.int64))
        count += len(keys)
        if builder is not None:
            held_keys, held_starts = held_keys + keys, np.concatenate([held_starts, starts])
            builder.add(held_keys[:-1], np.diff(held_starts))
            held_keys, held_starts = held_keys[-1:], held_starts[-1:]
    end = np.array([size], np.uint64)
    checks.add(end.astype(np.int64))
    problems = checks.problems(size)[0]
    if problems:
        raise FormatError(f"the legacy index is damaged ({problems[0]}); pass --scan to rebuild "
                          "from the samples", path=files.legacy_index)
    if builder is not None:
        builder.add(held_keys, np.diff(np.concatenate([held_starts, end])))
    return count
