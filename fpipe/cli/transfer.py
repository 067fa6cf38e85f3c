"""``fpipe cp``: copy a dataset, with all its files, between local paths and URLs."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from fpipe.cli._common import add_command, add_output_options, data_file, say, shows_progress
from fpipe.dataset._staging import dataset_files, staged_datasets
from fpipe.files import DatasetFiles, open_regular
from fpipe.remote.transfer import Upload, download_dataset
from fpipe.remote.urls import is_url

__all__ = ["add_parsers", "copy_dataset"]


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe cp``."""
    copy = add_command(
        commands, "cp", "copy a dataset between local paths and URLs (s3://, gs://, https://)",
        "Copy a dataset with all its files (data, index files, .md5, .classes.json) from SRC to "
        "DST; either may be a local path or a URL (s3://, gs://, any fsspec scheme; https:// "
        "as a source only). Credentials come the way fsspec and the cloud libraries take them: "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL (for an S3-compatible "
        "server), config files, or a cloud machine's role. An upload sends the .offsets file "
        "last, so the dataset appears at DST only when it is whole; a failed upload removes "
        "what it sent. A local DST is written beside its name and renamed into place.",
        "  fpipe cp train.msgpack s3://bucket/datasets/train.msgpack\n"
        "  fpipe cp s3://bucket/datasets/train.msgpack /scratch/train.msgpack -y",
        _run_copy)
    copy.add_argument("source", metavar="SRC", help="the dataset's data file: a path or a URL")
    copy.add_argument("target", metavar="DST", help="where the copy goes: a path or a URL")
    add_output_options(copy)


def _run_copy(args: argparse.Namespace) -> int:
    copy_dataset(args.source, args.target, overwrite=args.overwrite, progress=shows_progress(args))
    say(args, f"copied {args.source} to {args.target}")
    return 0


def copy_dataset(source: str, target: str, overwrite: bool = False, progress: bool = False) -> None:
    """Copy the dataset ``source`` to ``target`` (each a path or a URL), all files of it."""
    if not is_url(source):
        data_file(source)
    if not is_url(target):
        _to_path(source, Path(target), overwrite, progress)
        return
    upload = Upload(target, overwrite=overwrite)
    if not is_url(source):
        upload.commit(progress, source=Path(source))
        return
    _fetch(source, upload.path, progress)
    upload.commit(progress)


def _to_path(source: str, target: Path, overwrite: bool, progress: bool) -> None:
    inputs = [] if is_url(source) else dataset_files(source)
    with staged_datasets([target], overwrite, sources=inputs) as (staged,):
        if is_url(source):
            _fetch(source, staged, progress)
            return
        for path, copy in zip(DatasetFiles(source).members, DatasetFiles(staged).members):
            if path in inputs:
                _copy_regular(path, copy)


def _copy_regular(source: Path, target: Path) -> None:
    """Copy a regular file; a FIFO or a device (a symlink to /dev/zero) raises FormatError
    instead of blocking or copying forever."""
    with open_regular(source) as data, open(target, "xb") as copy:
        shutil.copyfileobj(data, copy, 1 << 20)


def _fetch(url: str, path: Path, progress: bool) -> None:
    download_dataset(url, path, progress=progress)


def fetched_copy(url: str) -> tuple[Path, tempfile.TemporaryDirectory]:
    """A local copy of the dataset at ``url`` in a temporary folder (kept while the returned
    folder object lives), for the commands that check files."""
    folder = tempfile.TemporaryDirectory(prefix="fpipe-fetched-")
    path = Path(folder.name) / url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    _fetch(url, path, progress=False)
    return path, folder
