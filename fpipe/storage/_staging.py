"""Write datasets beside their final name, then rename: a failed run leaves nothing half-written.

Every command that creates a packed dataset (and the well-known dataset writers) goes through
:func:`staged_datasets`: it refuses to replace an existing dataset unless asked, hands out paths
in a hidden staging folder next to each output, and only when the block succeeds moves the new
files onto the output names (``os.replace``, so each file changes in one step) and removes the
old dataset's leftover files. When the block raises, the staging folder is deleted and the
outputs are as they were.

A dataset ``X`` is the file ``X`` and its siblings ``X.*`` (index files, ``.md5``,
``.classes.json``):

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> target = os.path.join(folder, "out.msgpack")
>>> with staged_datasets([target]) as (path,):
...     _ = path.write_bytes(b"data")
...     _ = path.with_name(path.name + ".md5").write_text("...")
>>> sorted(os.listdir(folder))
['out.msgpack', 'out.msgpack.md5']
>>> with staged_datasets([target]):
...     pass
Traceback (most recent call last):
...
FileExistsError: ...out.msgpack exists; pass -y/--overwrite to replace it
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Union

__all__ = ["dataset_files", "staged_datasets", "staging_folder"]

PathLike = Union[str, "os.PathLike[str]"]


def dataset_files(path: PathLike) -> list[Path]:
    """The existing files of dataset ``path``: the file itself and its siblings ``path.*``.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("a.msgpack", "a.msgpack.keys", "ab.msgpack"):
    ...     open(os.path.join(folder, name), "w").close()
    >>> [p.name for p in dataset_files(os.path.join(folder, "a.msgpack"))]
    ['a.msgpack', 'a.msgpack.keys']
    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    prefix = path.name + "."
    return sorted(entry for entry in path.parent.iterdir()
                  if entry.name == path.name or (entry.name.startswith(prefix) and entry.is_file()))


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
def staged_datasets(targets: Sequence[PathLike], overwrite: bool = False) -> Iterator[list[Path]]:
    """Staging paths for the datasets ``targets``, moved onto the targets when the block succeeds.

    Raises :class:`FileExistsError` before anything is written if a target dataset exists and
    ``overwrite`` is false, :class:`IsADirectoryError` if a target is a folder, and
    :class:`ValueError` if a target is given twice. Missing parent folders are created (and
    removed again, when empty, if the block fails). Everything the block creates next to a
    staging path ``S`` under the name ``S`` or ``S.*`` moves along with it; on success the old
    dataset's files that were not replaced are deleted.
    """
    paths = [Path(target) for target in targets]
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
    seen: set[Path] = set()
    for path in paths:
        resolved = path.resolve()
        if resolved in seen:
            raise ValueError(f"output {path} is given twice")
        seen.add(resolved)
        if path.is_dir():
            raise IsADirectoryError(f"output {path} is a folder; give the dataset's file name, "
                                    f"e.g. {path / 'train.msgpack'}")
        if not overwrite and dataset_files(path):
            raise FileExistsError(f"{path} exists; pass -y/--overwrite to replace it")


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
    old = {path.name: path for path in dataset_files(target)}
    for staged in dataset_files(new):
        name = target.name + staged.name[len(new.name):]
        os.replace(staged, target.with_name(name))
        old.pop(name, None)
    for leftover in old.values():
        leftover.unlink()


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass
