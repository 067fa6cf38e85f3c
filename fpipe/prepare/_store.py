"""Where a prepared dataset lives, and its commit protocol: a local folder or a URL prefix.

A partition ``p`` is written by an *attempt* (a worker's run of its task), with a token of its
own, into a staging place of its own, and committed in one step:

- locally, the attempt writes its shards and manifest into ``OUT/.attempts/part-PPPPPP.TOKEN/``
  and renames that folder to ``OUT/part-PPPPPP/``; a rename onto a folder that exists fails,
  so a second attempt finds the partition committed, deletes its own folder and leaves;
- at a URL, the attempt uploads its shards under ``OUT/part-PPPPPP/a-TOKEN/`` and commits by
  writing ``OUT/part-PPPPPP/manifest.json`` last, naming them; an attempt that finds a
  manifest there (before it begins, before it commits, or when it reads its own back)
  deletes its shards and leaves: the manifest names one attempt's complete shards.

Whatever a dead attempt left (a staging folder, shards that no manifest names) is swept when
the job ends, and nothing else.

One job (one client) at a time prepares an ``OUT``: locally it holds an exclusive lock on
``OUT/.fpipe-prepare.lock`` (``flock``: released by the system when the client dies, so a
rerun after a kill goes on); at a URL, a lease object ``OUT/.fpipe-prepare.lease`` that the
client renews while it runs and deletes at its end (a killed client's lease lapses after
:data:`LEASE` seconds). A second client is refused with :class:`JobRunning`, saying which
process holds ``OUT``. Both files go when the job ends.

>>> import tempfile
>>> store = open_store(tempfile.mkdtemp())
>>> store.committed()
[]
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from fpipe.errors import FormatError, FpipeError, redacted_url
from fpipe.prepare._manifest import MANIFEST, parse_manifest, partition_folder
from fpipe.remote.urls import DEFAULT_RETRIES

__all__ = ["INDEX", "LEASE", "JobRunning", "LocalStore", "RemoteStore", "open_store"]

#: The shard index of a prepared dataset, in its folder.
INDEX = "dataset.shards"
ATTEMPTS = ".attempts"
_PARTITION = re.compile(r"part-(\d{6})")
_STAGING = re.compile(r"part-\d{6}\.[0-9a-f]{12}")
_ATTEMPT = re.compile(r"a-[0-9a-f]{12}")
_CHUNK = 1 << 20


LOCK = ".fpipe-prepare.lock"
LEASE_OBJECT = ".fpipe-prepare.lease"
#: Seconds a client's lease on a URL lasts unless renewed (it is renewed every third of it).
LEASE = 60.0


class JobRunning(FpipeError, RuntimeError):
    """Another job (client) is preparing the same ``OUT``: one at a time.

    >>> issubclass(JobRunning, RuntimeError)
    True
    """


def _holder() -> dict:
    import socket

    return {"pid": os.getpid(), "host": socket.gethostname(), "since": round(time.time(), 1)}


def _refusal(shown: str, holder: Any, how: str) -> JobRunning:
    if isinstance(holder, dict):
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
        who = f"process {holder.get('pid')} on {holder.get('host')}, since {since}"
    else:
        who = "a job whose lock says nothing more"
    return JobRunning(f"{shown} is being prepared by another job ({who}); run one job at a "
                      f"time on an OUT: {how}")


def open_store(out: str, storage_options: dict | None = None) -> LocalStore | RemoteStore:
    """The store of the prepared dataset ``out``: a local folder, or a URL prefix."""
    if "://" in out:
        return RemoteStore(out, storage_options)
    return LocalStore(out)


def new_token() -> str:
    """A fresh attempt's token: 12 hexadecimal digits."""
    return uuid.uuid4().hex[:12]


def _md5_listed(md5_text: str, name: str, where: str) -> str:
    """The MD5 that a dataset's ``.md5`` file lists for its data file ``name``."""
    for line in md5_text.splitlines():
        digest, _, listed = line.partition("  ")
        if listed.strip() == name:
            return digest.strip()
    raise FormatError(f"{where}: the .md5 file lists no checksum of {name}")


class LocalStore:
    """A prepared dataset in the local folder ``out`` (see the module)."""

    def __init__(self, out: str | os.PathLike) -> None:
        self.root = Path(out).absolute()
        self.shown = str(self.root)

    def prepare(self) -> None:
        """Create the folder of the dataset (and its parents) if it is missing."""
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"{self.root} is a file; out is the folder of the prepared "
                                     "dataset")
        self.root.mkdir(parents=True, exist_ok=True)

    def location(self, name: str) -> str:
        """The path of ``name`` (relative, ``/``-separated) in the dataset."""
        return str(self.root.joinpath(*name.split("/")))

    def lock(self) -> Any:
        """A context that holds ``OUT``'s lock for one job, or raises :class:`JobRunning`."""
        import contextlib
        import fcntl
        import json

        @contextlib.contextmanager
        def held() -> Any:
            path = self.root / LOCK
            while True:
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    try:
                        holder = json.loads(os.pread(descriptor, 4096, 0) or b"null")
                    except ValueError:
                        holder = None
                    os.close(descriptor)
                    raise _refusal(self.shown, holder, "this one starts when that one has "
                                   "ended (its lock goes with it)") from None
                try:  # the lock file may have been removed by the job that just ended
                    same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(descriptor)
            try:
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, json.dumps(_holder()).encode(), 0)
                yield
            finally:
                path.unlink(missing_ok=True)
                os.close(descriptor)

        return held()

    def committed(self) -> list[int]:
        """The committed partitions, in order."""
        if not self.root.is_dir():
            return []
        found = (_PARTITION.fullmatch(name) for name in os.listdir(self.root))
        return sorted(int(match[1]) for match in found if match
                      and (self.root / match[0] / MANIFEST).is_file())

    def read_manifest(self, partition: int) -> dict | None:
        """The checked manifest of ``partition``, or None if it is not committed."""
        path = self.root / partition_folder(partition) / MANIFEST
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return None
        return parse_manifest(text, str(path), partition)

    def read_manifests(self, partitions: list[int]) -> dict[int, dict | None]:
        """The checked manifests of ``partitions``, in their order (None: not committed)."""
        return {partition: self.read_manifest(partition) for partition in partitions}

    def begin(self, partition: int) -> LocalAttempt:
        """A new attempt at ``partition``, with its own staging folder."""
        staging = self.root / ATTEMPTS / f"{partition_folder(partition)}.{new_token()}"
        for _ in range(3):  # an attempt that ends may remove the empty .attempts meanwhile
            try:
                staging.mkdir(parents=True)
                break
            except FileNotFoundError:
                continue
        else:
            staging.mkdir(parents=True)
        return LocalAttempt(self, partition, staging)

    def sweep(self) -> int:
        """Remove the staging folders of attempts (call it when no attempt runs any more);
        the number removed."""
        folder = self.root / ATTEMPTS
        if not folder.is_dir():
            return 0
        removed = 0
        for name in os.listdir(folder):
            if _STAGING.fullmatch(name):
                shutil.rmtree(folder / name, ignore_errors=True)
                removed += 1
        try:
            folder.rmdir()
        except OSError:  # something else is in there: not ours to remove
            pass
        return removed

    def remove_all(self) -> None:
        """Remove every partition, attempt and the shard index (to start over)."""
        for partition in self._partition_folders():
            shutil.rmtree(partition)
        self.sweep()
        (self.root / INDEX).unlink(missing_ok=True)

    def _partition_folders(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [self.root / name for name in os.listdir(self.root) if _PARTITION.fullmatch(name)]

    def write_index(self, names: list[str], counts: list[int]) -> None:
        """Write the shard index (beside it, then renamed)."""
        from fpipe.dataset.sharded import shard_index_text

        staged = self.root / f".{INDEX}.{new_token()}"
        staged.write_text(shard_index_text(names, counts), encoding="utf-8")
        os.replace(staged, self.root / INDEX)

    def read_bytes(self, name: str) -> bytes:
        """The bytes of file ``name`` in the dataset."""
        return Path(self.location(name)).read_bytes()

    def size(self, name: str) -> int | None:
        """The size of file ``name`` in the dataset, None if it is missing."""
        try:
            return os.path.getsize(self.location(name))
        except FileNotFoundError:
            return None

    def md5(self, name: str) -> str:
        """The MD5 of the bytes of file ``name``, read in chunks."""
        digest = hashlib.md5(usedforsecurity=False)
        with open(self.location(name), "rb") as file:
            for chunk in iter(lambda: file.read(_CHUNK), b""):
                digest.update(chunk)
        return digest.hexdigest()


class LocalAttempt:
    """An attempt at one partition of a :class:`LocalStore`: its shards go to its staging
    folder; :meth:`commit` renames the folder into place."""

    storage_options = None
    #: The attempt that a manifest names: none, locally (the folder renamed into place holds
    #: the shards), so that a partition's files are the same bytes whichever attempt wrote them.
    recorded = ""

    def __init__(self, store: LocalStore, partition: int, staging: Path) -> None:
        self.store, self.partition, self.staging = store, partition, staging
        self.token = staging.name.rsplit(".", 1)[1]

    def shard(self, number: int) -> tuple[str, str]:
        """The name of shard ``number`` in the manifest, and where the writer writes it."""
        name = f"{number:05d}.msgpack"
        return name, str(self.staging / name)

    def stats(self, name: str) -> tuple[int, str]:
        """The size and MD5 of the written shard ``name`` (its ``.md5`` lists the MD5)."""
        path = self.staging / name
        md5 = _md5_listed(Path(f"{path}.md5").read_text(encoding="utf-8"), name, str(path))
        return path.stat().st_size, md5

    def commit(self, manifest: str) -> bool:
        """Commit the partition with ``manifest``, in one rename; False if another attempt
        committed it first (this one's files are deleted then)."""
        (self.staging / MANIFEST).write_text(manifest, encoding="utf-8")
        target = self.store.root / partition_folder(self.partition)
        try:
            os.rename(self.staging, target)
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            self.abandon()
            return False
        try:
            self.staging.parent.rmdir()
        except OSError:  # other attempts are in there
            pass
        return True

    def abandon(self) -> None:
        """Delete what this attempt wrote (and ``.attempts``, once empty)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        try:
            self.staging.parent.rmdir()
        except OSError:  # other attempts are in there
            pass


#: Tries of a manifest's or the index's request at a URL, with the readers' pauses between
#: them (:func:`fpipe.remote.urls.backoff`): throttling (429, 503, SlowDown) and 5xx heal.
TRIES = DEFAULT_RETRIES + 1


class RemoteStore:
    """A prepared dataset under the URL prefix ``out`` (see the module). The requests for
    manifests, listings and the index are tried again after a failure that may heal."""

    def __init__(self, out: str, storage_options: dict | None = None) -> None:
        from fpipe.errors import Secrets
        from fpipe.remote.urls import filesystem

        self.url, self.storage_options = out.rstrip("/"), storage_options
        self.shown = redacted_url(self.url)
        self._secrets = Secrets(self.url, storage_options)
        self.fs, self.root = filesystem(self.url, storage_options)
        self.root = self.root.rstrip("/")

    def _retried(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``, tried again (:data:`TRIES` in all) after a failure that
        may heal; a :class:`~fpipe.remote.RemoteError` that shows no secret when it does not.
        A missing object is no failure: FileNotFoundError passes."""
        from fpipe.remote.urls import Refused, RemoteError, backoff, failure

        for tried in range(TRIES):
            try:
                return call(*args, **kwargs)
            except FileNotFoundError:
                raise
            except Exception as error:  # each storage library has its own errors
                meaning = failure(error, self.url, self._secrets)
                if isinstance(meaning, Refused) or tried + 1 == TRIES:
                    after = "" if isinstance(meaning, Refused) else f" after {TRIES} attempts"
                    raise RemoteError(self.url, None, None, f"{meaning}{after}") from None
                time.sleep(backoff(tried))
        raise AssertionError("unreachable")

    def prepare(self) -> None:
        """Nothing to create: objects need no folder."""

    def lock(self) -> Any:
        """A context that holds a lease on ``OUT`` for one job (renewed every third of
        :data:`LEASE` while it runs, deleted at its end), or raises :class:`JobRunning` when
        another client's lease has not lapsed."""
        import contextlib
        import json
        import threading

        path = self._path(LEASE_OBJECT)
        mine = {**_holder(), "owner": new_token()}

        def found() -> dict | None:
            try:
                lease = json.loads(self._retried(self.fs.cat_file, path))
            except FileNotFoundError:
                return None
            except ValueError:
                return {}
            return lease if isinstance(lease, dict) else {}

        def write() -> None:
            lease = json.dumps({**mine, "expires": round(time.time() + LEASE, 1)})
            self._retried(self.fs.pipe_file, path, lease.encode())

        @contextlib.contextmanager
        def held() -> Any:
            lease = found()
            if lease is not None and float(lease.get("expires", 0)) > time.time():
                left = float(lease.get("expires", 0)) - time.time()
                raise _refusal(self.shown, lease, f"its lease ({self.location(LEASE_OBJECT)}) "
                               f"lapses in {left:.0f} s if that job is dead, and then this one "
                               "can start")
            write()
            stop = threading.Event()

            def renew() -> None:
                while not stop.wait(LEASE / 3):
                    try:
                        write()
                    except Exception:  # the next renewal tries again; the job goes on
                        pass

            thread = threading.Thread(target=renew, name="fpipe-prepare-lease", daemon=True)
            thread.start()
            try:
                yield
            finally:
                stop.set()
                thread.join()
                with contextlib.suppress(Exception):
                    if (found() or {}).get("owner") == mine["owner"]:
                        self.fs.rm(path)

        return held()

    def location(self, name: str) -> str:
        """The URL of ``name`` (relative, ``/``-separated) in the dataset."""
        return f"{self.url}/{name}"

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def committed(self) -> list[int]:
        """The committed partitions, in order."""
        found = self._retried(self.fs.glob, self._path(f"part-*/{MANIFEST}"))
        matches = (_PARTITION.fullmatch(path.rstrip("/").split("/")[-2]) for path in found)
        return sorted(int(match[1]) for match in matches if match)

    def read_manifest(self, partition: int) -> dict | None:
        """The checked manifest of ``partition``, or None if it is not committed."""
        name = f"{partition_folder(partition)}/{MANIFEST}"
        try:
            text = self._retried(self.fs.cat_file, self._path(name))
        except FileNotFoundError:
            return None
        return parse_manifest(text, redacted_url(self.location(name)), partition)

    def read_manifests(self, partitions: list[int]) -> dict[int, dict | None]:
        """The checked manifests of ``partitions``, in their order (None: not committed),
        fetched concurrently."""
        names = {partition: f"{partition_folder(partition)}/{MANIFEST}" for partition in partitions}
        if not names:
            return {}
        try:
            found = self._retried(self.fs.cat, [self._path(name) for name in names.values()],
                                  on_error="omit")
        except FileNotFoundError:  # fsspec may refuse a list with a missing path: one by one
            return {partition: self.read_manifest(partition) for partition in partitions}
        fetched = {path.rstrip("/").split("/")[-2]: text for path, text in found.items()}
        return {partition: None if name.split("/")[0] not in fetched else
                parse_manifest(fetched[name.split("/")[0]], redacted_url(self.location(name)), partition)
                for partition, name in names.items()}

    def begin(self, partition: int) -> RemoteAttempt:
        """A new attempt at ``partition``, with its own prefix."""
        return RemoteAttempt(self, partition, new_token())

    def sweep(self) -> int:
        """Remove the shards of attempts that no manifest names (call it when no attempt runs
        any more); the number of attempts removed."""
        removed = 0
        for folder in self.fs.glob(self._path("part-*")):
            match = _PARTITION.fullmatch(folder.rstrip("/").split("/")[-1])
            if not match:
                continue
            manifest = self.read_manifest(int(match[1]))
            kept = manifest["attempt"] if manifest else None
            for entry in self.fs.ls(folder, detail=False):
                name = entry.rstrip("/").split("/")[-1]
                if _ATTEMPT.fullmatch(name) and name != f"a-{kept}":
                    left = [info for info in self.fs.find(entry, detail=True).values()
                            if info.get("type") != "directory"]  # a store may keep folders
                    _remove_quietly(self.fs, entry)
                    removed += bool(left)
        return removed

    def remove_all(self) -> None:
        """Remove every partition, attempt and the shard index (to start over)."""
        for folder in self.fs.glob(self._path("part-*")):
            if _PARTITION.fullmatch(folder.rstrip("/").split("/")[-1]):
                self.fs.rm(folder, recursive=True)
        if self.fs.exists(self._path(INDEX)):
            self.fs.rm(self._path(INDEX))

    def write_index(self, names: list[str], counts: list[int]) -> None:
        """Upload the shard index (one object, written whole)."""
        from fpipe.dataset.sharded import shard_index_text

        self._retried(self.fs.pipe_file, self._path(INDEX), shard_index_text(names, counts).encode())

    def read_bytes(self, name: str) -> bytes:
        """The bytes of object ``name`` in the dataset."""
        return self.fs.cat_file(self._path(name))

    def size(self, name: str) -> int | None:
        """The size of object ``name``, None if it is missing."""
        try:
            return int(self.fs.size(self._path(name)))
        except FileNotFoundError:
            return None

    def md5(self, name: str) -> str:
        """The MD5 of the bytes of object ``name``, read in chunks."""
        digest = hashlib.md5(usedforsecurity=False)
        with self.fs.open(self._path(name), "rb") as file:
            for chunk in iter(lambda: file.read(_CHUNK), b""):
                digest.update(chunk)
        return digest.hexdigest()


class RemoteAttempt:
    """An attempt at one partition of a :class:`RemoteStore`: its shards go under its own
    prefix; :meth:`commit` writes the manifest last."""

    def __init__(self, store: RemoteStore, partition: int, token: str) -> None:
        self.store, self.partition, self.token = store, partition, token
        self.storage_options = store.storage_options
        self.recorded = token  # the manifest names the attempt whose shards it lists
        self.folder = f"{partition_folder(partition)}/a-{token}"

    def shard(self, number: int) -> tuple[str, str]:
        """The name of shard ``number`` in the manifest, and the URL the writer writes."""
        name = f"a-{self.token}/{number:05d}.msgpack"
        return name, self.store.location(f"{partition_folder(self.partition)}/{name}")

    def stats(self, name: str) -> tuple[int, str]:
        """The size and MD5 of the uploaded shard ``name`` (its ``.md5`` lists the MD5)."""
        relative = f"{partition_folder(self.partition)}/{name}"
        md5_text = self.store.read_bytes(f"{relative}.md5").decode("utf-8")
        md5 = _md5_listed(md5_text, name.split("/")[-1], redacted_url(self.store.location(relative)))
        return int(self.store.size(relative) or 0), md5

    def commit(self, manifest: str) -> bool:
        """Commit the partition by writing ``manifest`` last; False if another attempt
        committed it (this one's shards are deleted then)."""
        if self.store.read_manifest(self.partition) is None:
            name = f"{partition_folder(self.partition)}/{MANIFEST}"
            self.store._retried(self.store.fs.pipe_file, self.store._path(name),
                                manifest.encode("utf-8"))
            found = self.store.read_manifest(self.partition)
            if found is not None and found["attempt"] == self.token:
                return True
        self.abandon()
        return False

    def abandon(self) -> None:
        """Delete what this attempt uploaded."""
        _remove_quietly(self.store.fs, self.store._path(self.folder))


def _remove_quietly(fs: Any, path: str) -> None:
    """Remove ``path`` and what is under it, if anything is: the objects, then the folder
    that a store like SeaweedFS keeps when its objects are gone."""
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass
    fs.invalidate_cache(path)
    if fs.exists(path):
        try:
            fs.rm(path)
        except (FileNotFoundError, IsADirectoryError):
            pass

