"""Write datasets beside their final name, then rename: a failed run leaves nothing half-written.

Every command that creates a packed dataset (and the well-known dataset writers) goes through
:func:`staged_datasets`: it refuses to replace an existing dataset unless asked, or to write
over one of the command's own inputs, hands out paths in a hidden staging folder next to each
output, and only when the block succeeds moves the new files onto the output names
(``os.replace``, so each file changes in one step) and removes the old dataset's files that the
new one does not have. When the block raises, the staging folder is deleted and the outputs are
as they were.

The commit of a dataset (:func:`commit_dataset`) never shows a reader a mix of the two: the
old data file goes first, so that while the index files change there is no data file to read
them with (a reader finds none and says why); the new data file comes last, in one rename.
SIGINT, SIGTERM and SIGHUP wait until the commit is done (:func:`signals_deferred`): Ctrl-C
leaves the old dataset whole or the new one. A process killed in the middle (SIGKILL, power)
leaves a journal in its staging folder, by which :func:`finish_commit` completes the commit
(``fpipe index X`` calls it) and readers explain the missing data file
(:func:`interrupted_commit`).

A dataset ``X`` is the file ``X`` and the side files the format names
(:attr:`~fpipe.dataset.format.DatasetFiles.members`: index files, ``.md5``, the legacy
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

import errno
import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Union

from fpipe.files import DatasetFiles

__all__ = ["commit_dataset", "dataset_files", "disk_full", "finish_commit", "folder_size",
           "interrupted_commit", "missing_data_reason", "refuse_inputs", "same_file",
           "signals_deferred", "staged_datasets", "staging_folder"]

PathLike = Union[str, "os.PathLike[str]"]

#: The journal of a commit under way, in the staging folder that holds the new files.
JOURNAL = "commit.json"
#: The errors of a disk (or a quota) that is full.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
#: The signals that wait until a commit is done.
DEFERRED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                         if hasattr(signal, name))


def dataset_files(path: PathLike) -> list[Path]:
    """The files of dataset ``path`` that exist: the data file and the side files the format
    names (:attr:`~fpipe.dataset.format.DatasetFiles.members`), nothing else.

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
    folders: dict[Path, Path] = {}
    try:
        _add_staging_folders(paths, folders)
        staged = [folders[path.parent] / path.name for path in paths]
        yield staged
    except BaseException as error:
        written = sum(map(folder_size, folders.values()))
        _remove_staging_folders(folders)
        for folder in reversed(created):
            _remove_if_empty(folder)
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            raise disk_full(error, paths[0], written) from error
        raise
    what = "dataset is" if len(paths) == 1 else "datasets are"
    done = (f"during the commit, which was finished first: the new {what} in place, whole "
            f"({', '.join(map(str, paths))})")
    with signals_deferred(done=done):
        # a signal that ends the process finds the staging folders gone
        try:
            for path, new in zip(paths, staged):
                commit_dataset(new, path)
        finally:
            _remove_staging_folders(folders)


def folder_size(folder: PathLike) -> int:
    """The bytes of the files under ``folder`` (0 if it is gone)."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total


def disk_full(error: OSError, target: PathLike, written: int, what: str = "") -> OSError:
    """The error to report when the disk filled up (``error``) while a command wrote
    ``target`` and removed what it had written (``written`` bytes, for ``what``): it names
    the target, not a staging file, and says how much room there is now.

    >>> import tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), "out.msgpack")
    >>> error = disk_full(OSError(errno.ENOSPC, "No space left on device"), target, 5000)
    >>> print(error.filename == target, error.strerror)  # doctest: +ELLIPSIS
    True No space left on device: it needs more than the 5,000 bytes written before the disk
    filled, ... bytes are free there; nothing was kept, and ...out.msgpack is as it was
    """
    folder = next(parent for parent in Path(target).absolute().parents if parent.is_dir())
    try:
        free = f"{shutil.disk_usage(folder).free:,}"
    except OSError:
        free = "an unknown number of"
    return OSError(error.errno, f"{os.strerror(error.errno)}: it needs more than the "
                   f"{written:,} bytes written{what} before the disk filled, {free} bytes are "
                   f"free there; nothing was kept, and {target} is as it was", str(target))


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
    if existing:  # else no source can be one of the targets' files
        refuse_inputs(existing, sources)


def refuse_inputs(outputs: Iterable[PathLike], sources: Iterable[PathLike]) -> None:
    """Raise :class:`shutil.SameFileError` if one of ``outputs`` (files a command writes or
    replaces) is one of ``sources`` (the files it reads), also through symlinks and hard links.

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> open(os.path.join(folder, "a.tar"), "w").close()
    >>> refuse_inputs([os.path.join(folder, "a.tar")], [os.path.join(folder, ".", "a.tar")])
    Traceback (most recent call last):
    ...
    shutil.SameFileError: ...a.tar is an input of this command: ...
    """
    outputs = [Path(output) for output in outputs if os.path.lexists(output)]
    if not outputs:
        return
    for source in sources:
        found = next((output for output in outputs if same_file(output, source)), None)
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


def _add_staging_folders(paths: list[Path], folders: dict[Path, Path]) -> None:
    """A staging folder in each folder of ``paths`` (added to ``folders`` as made)."""
    for path in paths:
        if path.parent not in folders:
            folders[path.parent] = Path(tempfile.mkdtemp(prefix=".fpipe-", dir=path.parent))


def _remove_staging_folders(folders: dict[Path, Path]) -> None:
    for folder in folders.values():
        if not (folder / JOURNAL).exists():  # else a commit failed midway: finish_commit
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def signals_deferred(signals: Sequence[int] = DEFERRED_SIGNALS, done: str = ""
                     ) -> Iterator[list[int]]:
    """Hold ``signals`` for the block: one that arrives is recorded (in the list the block
    gets) and delivered again, to the handler that was in place, once the block has ended.
    Signals that are ignored stay ignored; outside the main thread, where Python delivers no
    signal, nothing changes. ``done`` says what a block that ran to its end did: it becomes
    the message of the ``KeyboardInterrupt`` of a Ctrl-C held meanwhile.

    >>> import signal
    >>> try:
    ...     with signals_deferred(done="the files are in place") as caught:
    ...         signal.raise_signal(signal.SIGINT)
    ...         print("the block goes on after", caught)
    ... except KeyboardInterrupt as error:
    ...     print("and then KeyboardInterrupt:", error)
    the block goes on after [2]
    and then KeyboardInterrupt: the files are in place
    """
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    held = [number for number in signals
            if signal.getsignal(number) not in (None, signal.SIG_IGN)]
    previous = {number: signal.signal(number, lambda number, _: caught.append(number))
                for number in held}
    finished = False
    try:
        yield caught
        finished = True
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(caught):
            _deliver(number, done if finished else "")


def _deliver(number: int, done: str) -> None:
    try:
        signal.raise_signal(number)
    except KeyboardInterrupt as error:
        if error.args or not done:
            raise
        raise KeyboardInterrupt(done) from None


def commit_dataset(new: Path, target: Path) -> None:
    """Move the staged dataset ``new`` onto ``target``, file by file as the format names them;
    a file of the old dataset that the new one does not have is deleted. A journal beside
    ``new`` records the commit until it is done, and the old data file goes first and the new
    one last, so that no reader meets the new index with the old data or the other way round
    (see the module). Call it with signals deferred."""
    journal = new.parent / JOURNAL
    kept = [member.name for member in DatasetFiles(new).members if os.path.lexists(member)]
    journal.write_text(json.dumps({"target": str(target.absolute()), "files": kept}) + "\n",
                       encoding="utf-8")
    if os.path.lexists(target):
        target.unlink()
    _replace_side_files(new, target, set(kept))
    if os.path.lexists(new):
        os.replace(new, target)
    journal.unlink()


def _replace_side_files(new: Path, target: Path, kept: set[str]) -> None:
    """Move the side files of the staged dataset ``new`` that are still there onto those of
    ``target``; delete those of ``target`` that the new dataset (files ``kept``) lacks."""
    pairs = zip(DatasetFiles(new).members[1:], DatasetFiles(target).members[1:])
    for staged, final in pairs:
        if os.path.lexists(staged):
            os.replace(staged, final)
        elif staged.name not in kept and os.path.lexists(final):
            final.unlink()


def _journals(target: Path) -> Iterator[Path]:
    """The journals of commits onto ``target`` that did not finish (by its name: the folder
    may have moved since)."""
    for journal in target.parent.glob(f".fpipe-*/{JOURNAL}"):
        try:
            if Path(json.loads(journal.read_text(encoding="utf-8"))["target"]).name == target.name:
                yield journal
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours


def interrupted_commit(target: PathLike) -> Path | None:
    """The staging folder of a commit onto dataset ``target`` that was stopped between the
    removal of the old data file and the rename of the new one (its process killed), which
    :func:`finish_commit` completes; None if there is none.

    >>> import tempfile
    >>> interrupted_commit(os.path.join(tempfile.mkdtemp(), "x.msgpack")) is None
    True
    """
    target = Path(target)
    if os.path.lexists(target):
        return None
    return next((journal.parent for journal in _journals(target)
                 if os.path.lexists(journal.parent / target.name)), None)


def missing_data_reason(path: PathLike) -> str:
    """Why the data file ``path`` is not there: not found, or a commit that replaced it was
    killed midway (see :func:`interrupted_commit`).

    >>> import tempfile
    >>> missing_data_reason(os.path.join(tempfile.mkdtemp(), "x.msgpack"))
    'dataset data file not found'
    """
    folder = interrupted_commit(path)
    if folder is None:
        return "dataset data file not found"
    return (f"dataset data file not found: a command that replaced the dataset was stopped "
            f"while it renamed the new files into place (they wait in {folder.name}); "
            f"'fpipe index {path}' finishes it")


def finish_commit(target: PathLike) -> bool:
    """Complete a commit onto dataset ``target`` whose process was killed in the middle (see
    :func:`interrupted_commit`), and remove the staging folders of commits onto it that were
    killed before or after their data file changed (the dataset is whole then, old or new);
    whether a commit was completed. The new files were whole before their commit began, so
    the new dataset is whole after it.
    """
    target = Path(target)
    with signals_deferred():
        folder = interrupted_commit(target)
        if folder is not None:
            kept = json.loads((folder / JOURNAL).read_text(encoding="utf-8"))["files"]
            _replace_side_files(folder / target.name, target, set(kept))
            os.replace(folder / target.name, target)
        for journal in list(_journals(target)):
            shutil.rmtree(journal.parent, ignore_errors=True)
    return folder is not None


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass
