"""``fpipe mv``: rename a dataset, every file of it, and the names in its ``.md5``."""

from __future__ import annotations

import argparse
import errno
import os
import shutil
from pathlib import Path

from fpipe.cli._common import add_command, add_output_options, data_file, say
from fpipe.dataset._staging import dataset_files, signals_deferred, staged_datasets
from fpipe.errors import FormatError

__all__ = ["add_parsers", "move_dataset"]


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe mv``."""
    move = add_command(
        commands, "mv", "rename a dataset: every file, and the names in its .md5",
        "Rename dataset SRC to DST: the data file and every file beside it named SRC.* (index "
        "files, .md5, .classes.json) become DST and DST.*, and the .md5 names the new files, "
        "so 'md5sum -c' works on the result. The new names are made first (hard links, or "
        "copies on another file system); SRC goes only when DST is complete.",
        "  fpipe mv toy.msgpack train.msgpack\n  fpipe mv train.msgpack archive/train.msgpack",
        _run)
    move.add_argument("source", metavar="SRC", help="the dataset's data file (X.msgpack)")
    move.add_argument("target", metavar="DST", help="its new name")
    add_output_options(move)


def _run(args: argparse.Namespace) -> int:
    moved = move_dataset(Path(args.source), Path(args.target), args.overwrite)
    say(args, f"{args.source} -> {args.target}: {len(moved)} files")
    return 0


def move_dataset(source: Path, target: Path, overwrite: bool = False) -> list[Path]:
    """Rename dataset ``source`` to ``target``; return the new files."""
    files = dataset_files(data_file(source))
    with staged_datasets([target], overwrite, sources=files) as (staged,):
        for file in files:
            suffix = file.name[len(source.name):]
            if suffix == ".md5":
                _write_md5(file, staged.with_name(staged.name + suffix), source.name, target.name)
            else:
                _link_or_copy(file, staged.with_name(staged.name + suffix))
    with signals_deferred():  # SRC goes whole: Ctrl-C midway would leave some of its files
        for file in files:
            file.unlink()
    return [target.with_name(target.name + file.name[len(source.name):]) for file in files]


def _link_or_copy(source: Path, target: Path) -> None:
    """A new name for ``source`` (a symlink stays a symlink, as ``mv`` moves it)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if not (source.is_symlink() or source.is_file()):
            raise FormatError("not a regular file: fpipe mv moves files and symlinks",
                              path=source) from None
        shutil.copy2(source, target, follow_symlinks=False)


def _write_md5(md5: Path, target: Path, old: str, new: str) -> None:
    from fpipe.dataset.format import md5_line
    from fpipe.files import read_md5

    entries = read_md5(md5.with_name(old))
    lines = [md5_line(digest, new + name[len(old):] if name.startswith(old) else name)
             for name, digest in entries.items()]
    target.write_text("".join(lines), encoding="utf-8")
