"""Write datasets beside their final name, then rename: a failed run leaves nothing half-written.

Every command that creates a packed dataset (and the well-known dataset writers) goes through
:func:`staged_datasets`: it refuses to replace an existing dataset unless asked, or to write
over one of the command's own inputs, hands out paths in a hidden staging folder next to each
output, and only when the block succeeds moves the new files onto the output names
(``os.replace``, so each file changes in one step) and removes the old dataset's files that the
new one does not have. When the block raises, the staging folder is deleted and the outputs are
as they were.

A dataset ``X`` is the file ``X`` and the side files the format names
(:attr:`~fpipe.storage.format.DatasetFiles.members`: index files, ``.md5``, the legacy
``.index``, ``.classes.json``). No other file is touched, whatever its name begins with:

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> target = os.path.join(folder, "out.msgpack")
>>> for name in ("out.msgpack.bak", "out.pdf"):
...     open(os.path.join(folder, name), "w").close()
>>> for _ in range(2):
...     with staged_datasets([target], overwrite=True) as (path,):
...         _ = path.write_bytes(b"data")
...         _ = path.with_name(path.name + ".md5").write_text("...")
>>> sorted(os.listdir(folder))
['out.msgpack', 'out.msgpack.bak', 'out.msgpack.md5', 'out.pdf']
>>> with staged_datasets([target]):
...     pass
Traceback (most recent call last):
...
FileExistsError: ...out.msgpack exists; pass -y/--overwrite to replace it
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Union

from .format import DatasetFiles

__all__ = ["dataset_files", "same_file", "staged_datasets", "staging_folder"]

PathLike = Union[str, "os.PathLike[str]"]


def dataset_files(path: PathLike) -> list[Path]:
    """The files of dataset ``path`` that exist: the data file and the side files the format
    names (:attr:`~fpipe.storage.format.DatasetFiles.members`), nothing else.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("a.msgpack", "a.msgpack.keys", "a.msgpack.bak", "ab.msgpack"):
    ...     open(os.path.join(folder, name), "w").close()
    >>> [p.name for p in dataset_files(os.path.join(folder, "a.msgpack"))]
    ['a.msgpack', 'a.msgpack.keys']
    """
    return [member for member in DatasetFiles(path).members if os.path.lexists(member)]


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether ``a`` and ``b`` name the same file: the same path after symlinks, or one file
    under two names (a hard link).

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> open(os.path.join(folder, "a"), "w").close()
    >>> os.link(os.path.join(folder, "a"), os.path.join(folder, "b"))
    >>> same_file(os.path.join(folder, "a"), os.path.join(folder, ".", "b"))
    True
    """
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


@contextmanager
def staging_folder(beside: PathLike) -> Iterator[Path]:
    """A hidden, empty folder in the folder of ``beside`` (same file system, so renames out of
    it are atomic); it and whatever is left in it are removed on leaving the block.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with staging_folder(os.path.join(folder, "x.msgpack")) as staging:
    ...     staging.parent == Path(folder), staging.name.startswith(".fpipe-")
    (True, True)
    >>> os.listdir(folder)
    []
    """
    parent = Path(beside).parent
    folder = Path(tempfile.mkdtemp(prefix=".fpipe-", dir=parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def staged_datasets(targets: Sequence[PathLike], overwrite: bool = False,
                    sources: Iterable[PathLike] = ()) -> Iterator[list[Path]]:
    """Staging paths for the datasets ``targets``, moved onto the targets when the block succeeds.

    Before anything is written, raises :class:`FileExistsError` if a file of a target dataset
    exists and ``overwrite`` is false, :class:`shutil.SameFileError` if a target is one of
    ``sources`` (the files the block reads; also through symlinks and hard links),
    :class:`IsADirectoryError` if a target or one of its side files is a folder, and
    :class:`ValueError` if a target is given twice. Missing parent folders are created (and
    removed again, when empty, if the block fails). The files the block creates under the
    names of a staging path's dataset move to the target's names; on success the old
    dataset's files that were not replaced are deleted, and nothing else.
    """
    paths = [Path(target) for target in targets]
    _check_sources(paths, sources)
    _check_targets(paths, overwrite)
    created = _make_parents(paths)
    try:
        with _staging_folders(paths) as folders:
            staged = [folders[path.parent] / path.name for path in paths]
            yield staged
            for path, new in zip(paths, staged):
                _commit(new, path)
    except BaseException:
        for folder in reversed(created):
            _remove_if_empty(folder)
        raise


def _check_targets(paths: list[Path], overwrite: bool) -> None:
    for i, path in enumerate(paths):
        if any(same_file(path, other) for other in paths[:i]):
            raise ValueError(f"output {path} is given twice")
        if path.is_dir():
            raise IsADirectoryError(f"output {path} is a folder; give the dataset's file name, "
                                    f"e.g. {path / 'train.msgpack'}")
        existing = dataset_files(path)
        folders = [member for member in existing if stat.S_ISDIR(member.lstat().st_mode)]
        if folders:
            raise IsADirectoryError(f"{folders[0]} is a folder, where dataset {path} has a file; "
                                    "fpipe replaces files only: move the folder away")
        if existing and not overwrite:
            raise FileExistsError(_exists_message(path, existing[0]))


def _exists_message(path: Path, found: Path) -> str:
    what = f"{path} exists" if found == path else f"{found} (a file of dataset {path}) exists"
    return f"{what}; pass -y/--overwrite to replace it"


def _check_sources(paths: list[Path], sources: Iterable[PathLike]) -> None:
    """Refuse a target dataset that has one of ``sources`` among its files."""
    existing = [member for path in paths for member in dataset_files(path)]
    if not existing:  # nothing there: no source can be one of the targets' files
        return
    for source in sources:
        found = next((member for member in existing if same_file(member, source)), None)
        if found is not None:
            what = "an input" if found == Path(source) else f"the same file as the input {source}"
            raise shutil.SameFileError(f"{found} is {what} of this command: an output never "
                                       "replaces an input; write to a new name")


def _make_parents(paths: list[Path]) -> list[Path]:
    """Create missing parent folders; return those created, outermost first."""
    created: list[Path] = []
    for path in paths:
        missing = [parent for parent in reversed(path.parents) if not parent.exists()]
        for folder in missing:
            folder.mkdir()
            created.append(folder)
    return created


@contextmanager
def _staging_folders(paths: list[Path]) -> Iterator[dict[Path, Path]]:
    folders: dict[Path, Path] = {}
    try:
        for path in paths:
            if path.parent not in folders:
                folders[path.parent] = Path(tempfile.mkdtemp(prefix=".fpipe-", dir=path.parent))
        yield folders
    finally:
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)


def _commit(new: Path, target: Path) -> None:
    """Move the staged dataset ``new`` onto ``target``, file by file as the format names them;
    a file of the old dataset that the new one does not have is deleted."""
    for staged, final in zip(DatasetFiles(new).members, DatasetFiles(target).members):
        if os.path.lexists(staged):
            os.replace(staged, final)
        elif os.path.lexists(final):
            final.unlink()


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass
