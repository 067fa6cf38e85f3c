"""Prepare a packed dataset on many processes or a dask cluster, each partition exactly once,
resumable, with the same bytes on any number of workers.

:func:`write_dataset` runs the user's transform over the samples of each partition in the
workers (seeded per sample from ``(seed, partition, index)``), writes each partition's shards
in an attempt's own staging place and commits the partition in one step (see
``fpipe.prepare._store``); the shard index ``OUT/dataset.shards`` is made from the committed
manifests, in partition order, when every partition is committed. The same call again skips
the committed partitions. :func:`verify_dataset` checks a prepared dataset against its
manifests.

>>> import os, tempfile
>>> from fpipe.dataset import ShardedReader
>>> from fpipe.prepare import from_generator
>>> def rows(start):
...     return ({"key": f"{i:04d}", "x": i} for i in range(start, start + 5))
>>> out = os.path.join(tempfile.mkdtemp(), "prepared")
>>> report = write_dataset(from_generator(rows, [0, 5, 10]), out, shard_size=2, n_workers=1)
>>> report.samples, report.written, report.skipped
(15, 3, 0)
>>> [s["x"] for s in ShardedReader(os.path.join(out, "dataset.shards"))][-3:]
[12, 13, 14]
>>> write_dataset(from_generator(rows, [0, 5, 10]), out, shard_size=2, n_workers=1).skipped
3
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fpipe.errors import FormatError, FpipeError, WorkerError, check_callable, check_integer
from fpipe.prepare._manifest import describe_callable, differences, manifest_text, partition_folder
from fpipe.prepare._store import INDEX, JobRunning, LocalStore, RemoteStore, open_store
from fpipe.prepare.partitions import Partitions, from_dask, from_sources

__all__ = ["JobRunning", "PrepareReport", "SettingsChanged", "verify_dataset", "write_dataset"]

#: How many times a partition whose local worker process died is run again.
RETRIES = 3


class SettingsChanged(FpipeError, ValueError):
    """A rerun whose settings (transform, generator, seed, shard size, a partition's argument)
    are not those the committed partitions were made with; ``restart=True`` starts over.

    >>> issubclass(SettingsChanged, ValueError)
    True
    """


@dataclass
class PrepareReport:
    """What :func:`write_dataset` did: the shard ``index`` written, the ``partitions`` of the
    job, those ``written`` now and those ``skipped`` (committed before), the ``samples`` and
    ``bytes`` of the whole dataset, the ``seconds`` taken and the dead attempts ``swept``.

    >>> print(PrepareReport("o/dataset.shards", 4, 3, 1, 1000, 2048, 2.0))
    prepared o/dataset.shards: 4 partitions (3 written, 1 already committed), 1,000 samples, 2.0 KiB in 2.0 s
    """

    index: str
    partitions: int
    written: int
    skipped: int
    samples: int
    bytes: int
    seconds: float
    swept: int = 0

    def __str__(self) -> str:
        return (f"prepared {self.index}: {self.partitions} partitions ({self.written} written, "
                f"{self.skipped} already committed), {self.samples:,} samples, "
                f"{_human(self.bytes)} in {self.seconds:.1f} s")


def _human(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return ""  # not reached


@dataclass
class Job:
    """What a task needs to write one partition: it travels to the workers."""

    partitions: Partitions
    out: str
    transform: Callable[[dict], dict | None] | None
    shard_size: int
    seed: int
    storage_options: dict | None
    settings: dict = field(default_factory=dict)

    def store(self) -> LocalStore | RemoteStore:
        return open_store(self.out, self.storage_options)

    def fingerprint(self, partition: int) -> dict:
        return {**self.settings, "argument": self.partitions.argument(partition)}

    def only(self, partition: int) -> Job:
        """This job with partition ``partition``'s argument alone (what its task carries)."""
        return dataclasses.replace(self, partitions=self.partitions.only(partition))


def write_dataset(partitions: Partitions | Sequence[str] | str, out: str | os.PathLike,
                  transform: Callable[[dict], dict | None] | None = None, *,
                  shard_size: int = 10_000, seed: int = 0, n_workers: int | None = None,
                  cluster: Any = None, restart: bool = False, storage_options: dict | None = None,
                  progress: bool = False) -> PrepareReport:
    """Write the samples of ``partitions`` through ``transform`` into the prepared dataset
    ``out`` (a folder, or a URL prefix such as ``s3://bucket/train``), each partition exactly
    once, and return a :class:`PrepareReport`.

    ``partitions`` come from :func:`~fpipe.prepare.from_generator` (the user's function, one
    argument a partition), :func:`~fpipe.prepare.from_sources` (files, or ranges of their
    samples) or :func:`~fpipe.prepare.from_dask`; a path, URL or pattern (or a list of them)
    is ``from_sources(partitions)``: the files ``fpipe write`` takes in another format, one
    file a partition; a ``dask.bag`` or ``dask.dataframe`` is ``from_dask(partitions)``.
    ``transform(sample)`` runs in the workers and returns the sample to write (a dict with its
    ``"key"``) or None to leave it out; while it runs,
    :func:`fpipe.current_rng` is the generator of ``(seed, partition, index)``, so its draws
    do not depend on the workers or on retries.

    Partition ``p`` becomes shards ``OUT/part-PPPPPP/NNNNN.msgpack`` of ``shard_size`` samples
    and its manifest; the shard index ``OUT/dataset.shards`` lists every partition's shards in
    partition order (:class:`~fpipe.dataset.ShardedReader` reads it). The work runs on
    ``n_workers`` local processes (default: the CPUs; 1 runs in this process) or on the dask
    ``cluster`` (a ``distributed.Client``, or a scheduler's address).

    Run again after any failure, the same call skips the committed partitions, and the result
    is the same bytes; with other settings it raises :class:`SettingsChanged` naming what
    changed, unless ``restart=True``, which deletes the prepared partitions first. The same
    call with the partitions extended appends the new ones (the committed ones are kept).
    ``progress`` prints the partitions done, samples/s and the time left on stderr. One job
    at a time prepares ``out``: while another client's job holds it, this call raises
    :class:`JobRunning`, naming that client.

    >>> import tempfile
    >>> write_dataset(["a.tar"], tempfile.mkdtemp(), shard_size=0)
    Traceback (most recent call last):
    ...
    ValueError: shard_size must be >= 1; got shard_size=0
    """
    job, backend = _checked_job(partitions, out, transform, shard_size, seed, n_workers,
                                cluster, restart, storage_options, progress)
    started = time.monotonic()
    store = job.store()
    store.prepare()
    with store.lock():
        committed = _check_committed(store, job, restart)
        todo = [p for p in range(len(job.partitions)) if p not in committed]
        bar = _JobProgress(len(job.partitions), len(committed), progress)
        backend(job, todo, bar.done)
        names, counts, sizes = _index_entries(store, len(job.partitions))
        store.write_index(names, counts)
        swept = store.sweep()
    report = PrepareReport(store.location(INDEX), len(job.partitions), len(todo), len(committed),
                           sum(counts), sum(sizes), time.monotonic() - started, swept)
    return report


def _checked_job(partitions: Any, out: Any, transform: Any, shard_size: Any, seed: Any,
                 n_workers: Any, cluster: Any, restart: Any, storage_options: Any,
                 progress: Any) -> tuple[Job, Callable]:
    """The job and its backend, every argument checked (nothing is created yet)."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out must be a folder or a URL; got {type(out).__name__} {out!r:.80}")
    if transform is not None:
        check_callable("transform", transform)
    shard_size, seed = check_integer("shard_size", shard_size, 1), check_integer("seed", seed, 0)
    for name, value in (("restart", restart), ("progress", progress)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False; got {name}={value!r:.80}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict; got {type(storage_options).__name__}")
    out = os.fspath(out)
    if "://" not in out:
        out = os.path.abspath(out)
        if storage_options is not None:
            raise ValueError(f"storage_options are for a URL; out is the local folder {out}")
    backend = _backend(n_workers, cluster)
    if isinstance(partitions, str) or (isinstance(partitions, (list, tuple)) and partitions
                                       and all(isinstance(p, str) for p in partitions)):
        partitions = from_sources(partitions)
    elif type(partitions).__module__.startswith(("dask.bag", "dask.dataframe")):
        partitions = from_dask(partitions)
    if not isinstance(partitions, Partitions):
        raise TypeError("partitions must be made by from_generator, from_sources or from_dask, "
                        "or be paths of sources, a dask.bag or a dask.dataframe; got "
                        f"{type(partitions).__name__} {partitions!r:.80}")
    settings = {"partitions": partitions.origin, "transform": describe_callable(transform),
                "shard_size": shard_size, "seed": seed}
    return Job(partitions, out, transform, shard_size, seed, storage_options, settings), backend


def _backend(n_workers: Any, cluster: Any) -> Callable:
    if cluster is not None:
        if n_workers is not None:
            raise ValueError("pass n_workers (local processes) or cluster (dask), not both; the "
                             "cluster's workers do the work")
        if not isinstance(cluster, str) and not hasattr(cluster, "submit"):
            raise TypeError("cluster must be a distributed.Client or a scheduler's address; got "
                            f"{type(cluster).__name__} {cluster!r:.80}")
        return lambda job, todo, done: _run_on_dask(job, todo, done, cluster)
    if n_workers is None:
        count = os.cpu_count() or 1
    else:
        count = check_integer("n_workers", n_workers, 1)
    return lambda job, todo, done: _run_locally(job, todo, done, count)


def _check_committed(store: LocalStore | RemoteStore, job: Job, restart: bool) -> set[int]:
    """The partitions committed before (every manifest read and checked), after refusing
    other settings; with ``restart``, none: everything is deleted first."""
    if restart:
        store.remove_all()
        return set()
    committed = store.committed()
    extra = [p for p in committed if p >= len(job.partitions)]
    if extra:
        raise SettingsChanged(f"{store.shown} holds partition {extra[-1]}, and this job has "
                              f"{len(job.partitions)} partitions; pass restart=True "
                              "(fpipe write --restart) to start over")
    changed = []
    for partition, manifest in store.read_manifests(committed).items():
        if manifest is not None:
            what = differences(manifest["fingerprint"], job.fingerprint(partition))
            if what:
                changed.append((partition, what))
    if changed:
        partition, what = changed[0]
        raise SettingsChanged(f"{store.shown} was prepared with other settings: {'; '.join(what)} "
                              f"in partition {partition}" + (f" and {len(changed) - 1} more"
                                                             if len(changed) > 1 else "")
                              + "; pass restart=True (fpipe write --restart) to start over")
    return set(committed)


def _index_entries(store: LocalStore | RemoteStore, count: int
                   ) -> tuple[list[str], list[int], list[int]]:
    """The shards of every committed manifest, in partition order: names, counts, sizes."""
    names, counts, sizes = [], [], []
    for partition, manifest in store.read_manifests(list(range(count))).items():
        if manifest is None:
            raise FpipeError(f"{store.shown}: partition {partition} is not committed after its "
                             "task ended; run the same call again to finish it")
        for shard in manifest["shards"]:
            names.append(f"{partition_folder(partition)}/{shard['name']}")
            counts.append(shard["samples"])
            sizes.append(shard["size"])
    return names, counts, sizes


# --- one partition, in a worker -----------------------------------------------------------


def write_partition(job: Job, partition: int) -> dict:
    """Write and commit ``partition`` of ``job`` (the task a worker runs), unless it is
    committed already; what was done: ``partition``, ``samples``, ``written`` (False when an
    earlier attempt had committed it)."""
    from fpipe.stream.parallel._joblib import freed_memory_kept

    store = job.store()
    found = store.read_manifest(partition)
    if found is not None:
        return {"partition": partition, "samples": found["samples"], "written": False}
    attempt = store.begin(partition)
    try:
        with freed_memory_kept():  # a dask worker's settings cost image work half as long again
            shards = _write_shards(job, partition, attempt)
        text = manifest_text(partition, attempt.recorded, shards, job.fingerprint(partition))
        written = attempt.commit(text)
    except BaseException:
        attempt.abandon()
        raise
    return {"partition": partition, "samples": sum(s["samples"] for s in shards),
            "written": written}


def _write_shards(job: Job, partition: int, attempt: Any) -> list[dict]:
    """Write the samples of ``partition`` into shards of the attempt; their entries."""
    from fpipe.dataset import FileWriter

    shards: list[dict] = []
    writer, name = None, ""
    try:
        for sample in _transformed(job, partition):
            if writer is None:
                name, location = attempt.shard(len(shards))
                writer = FileWriter(location, storage_options=attempt.storage_options)
            writer.write(sample)
            if writer.written >= job.shard_size:
                shards.append(_closed_shard(writer, name, attempt))
                writer = None
        if writer is not None:
            shards.append(_closed_shard(writer, name, attempt))
            writer = None
    finally:
        if writer is not None:  # a failed partition: its attempt's files go anyway
            writer.abandon()
    return shards


def _closed_shard(writer: Any, name: str, attempt: Any) -> dict:
    writer.close()
    size, md5 = attempt.stats(name)
    return {"name": name, "samples": writer.written, "size": size, "md5": md5}


def _transformed(job: Job, partition: int) -> Iterator[dict]:
    """The samples of ``partition`` after the transform, each drawing from its own generator."""
    from fpipe.random import item_rng, using_rng

    transform = job.transform
    for index, sample in enumerate(job.partitions.samples(partition)):
        if transform is not None:
            with using_rng(item_rng(job.seed, partition, index)):
                sample = transform(sample)
            if sample is None:
                continue
        if not isinstance(sample, dict):
            raise TypeError(f"partition {partition}, sample {index}: the transform must return "
                            f"a dict sample or None; got {type(sample).__name__}")
        yield sample


# --- backends -----------------------------------------------------------------------------


def _run_locally(job: Job, todo: list[int], done: Callable[[dict], None], n_workers: int) -> None:
    """Run the partitions ``todo`` in this process (one worker) or in ``n_workers`` loky
    processes; a partition whose process died runs again, up to :data:`RETRIES` times."""
    if n_workers == 1 or len(todo) <= 1:
        for partition in todo:
            done(write_partition(job, partition))
        return
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    from fpipe.stream.parallel._joblib import shared_executor

    tries: dict[int, int] = {}
    while todo:
        executor = shared_executor(n_workers)
        if executor is None:  # no worker processes here (a daemon process): run them here
            _run_locally(job, todo, done, 1)
            return
        futures = {executor.submit(write_partition, job.only(p), p): p for p in todo}
        todo = []
        try:
            for future in as_completed(futures):
                try:
                    done(future.result())
                except BrokenProcessPool as error:  # a worker died: its partitions run again
                    partition = futures[future]
                    tries[partition] = tries.get(partition, 0) + 1
                    if tries[partition] > RETRIES:
                        raise WorkerError(f"partition {partition}: its worker process died "
                                          f"{tries[partition]} times ({error})") from None
                    todo.append(partition)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
        todo.sort()


def _run_on_dask(job: Job, todo: list[int], done: Callable[[dict], None], cluster: Any) -> None:
    """Run the partitions ``todo`` as tasks on the dask cluster (a Client, or an address);
    the scheduler runs a task again when its worker dies."""
    from distributed import Client, as_completed

    client = Client(cluster) if isinstance(cluster, str) else cluster
    token = os.urandom(6).hex()
    futures = [client.submit(write_partition, job.only(p), p, key=f"fpipe-prepare-{token}-{p:06d}",
                             pure=False) for p in todo]
    try:
        for future in as_completed(futures):
            done(future.result())
    except BaseException:
        client.cancel(futures)
        raise
    finally:
        if client is not cluster:
            client.close()


class _JobProgress:
    """The partitions done, samples/s and the time left, a line each on stderr."""

    def __init__(self, total: int, committed: int, shown: bool) -> None:
        self.total, self.finished, self.shown = total, committed, shown
        self.todo, self.written, self.samples = total - committed, 0, 0
        self.started = time.monotonic()

    def done(self, result: dict) -> None:
        self.finished += 1
        self.written += 1
        self.samples += result["samples"]
        if not self.shown:
            return
        elapsed = max(time.monotonic() - self.started, 1e-9)
        left = elapsed / self.written * (self.todo - self.written)
        print(f"fpipe prepare: {self.finished}/{self.total} partitions, {self.samples:,} "
              f"samples, {self.samples / elapsed:,.0f} samples/s, ETA {_clock(left)}",
              file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


# --- verify -------------------------------------------------------------------------------


def verify_dataset(out: str | os.PathLike, *, storage_options: dict | None = None) -> dict:
    """Check the prepared dataset ``out`` against its manifests: every partition the index
    lists is committed, the index lists exactly the manifests' shards with their counts in
    partition order, and each shard has the size and MD5 its manifest gives and as many
    samples (its ``.offsets``). The first difference is a :class:`~fpipe.errors.FormatError`
    naming the file; else the totals: ``partitions``, ``shards``, ``samples``, ``bytes``.

    >>> import os, tempfile
    >>> from fpipe.prepare import from_generator
    >>> out = tempfile.mkdtemp()
    >>> _ = write_dataset(from_generator(lambda n: ({"key": str(i)} for i in range(n)), [3, 2]),
    ...                   out, n_workers=1)
    >>> verify_dataset(out)
    {'partitions': 2, 'shards': 2, 'samples': 5, 'bytes': 35}
    >>> with open(os.path.join(out, "part-000001", "00000.msgpack"), "r+b") as shard:
    ...     _ = shard.write(b"!")
    >>> verify_dataset(out)
    Traceback (most recent call last):
    ...
    fpipe.errors.FormatError: ...00000.msgpack: its MD5 is ..., its manifest says ...
    """
    import json

    where = os.fspath(out)
    store = open_store(where if "://" in where else os.path.abspath(where), storage_options)
    try:
        index = json.loads(store.read_bytes(INDEX))
        listed = list(zip(index["shards"], index["samples"]))
    except FileNotFoundError:
        raise FileNotFoundError(f"{store.location(INDEX)}: no shard index: the job has not "
                                "finished (run it again to finish it)") from None
    except (ValueError, KeyError, TypeError) as error:
        raise FormatError(f"{store.location(INDEX)}: not a shard index ({error})") from None
    partitions = sorted({name.split("/", 1)[0] for name, _ in listed})
    expected = []
    for number in range(len(partitions)):
        manifest = store.read_manifest(number)
        if manifest is None:
            raise FormatError(f"{store.location(partition_folder(number))}: partition {number} "
                              "has no manifest")
        for shard in manifest["shards"]:
            expected.append((f"{partition_folder(number)}/{shard['name']}", shard))
    if [(name, shard["samples"]) for name, shard in expected] != [tuple(e) for e in listed]:
        raise FormatError(f"{store.location(INDEX)}: does not list the shards of the manifests "
                          "with their counts, in partition order")
    for name, shard in expected:
        _verify_shard(store, name, shard)
    return {"partitions": len(partitions), "shards": len(expected),
            "samples": sum(shard["samples"] for _, shard in expected),
            "bytes": sum(shard["size"] for _, shard in expected)}


def _verify_shard(store: LocalStore | RemoteStore, name: str, shard: dict) -> None:
    where = store.location(name)
    size = store.size(name)
    if size != shard["size"]:
        raise FormatError(f"{where}: {'missing' if size is None else f'{size:,} bytes'}, its "
                          f"manifest says {shard['size']:,} bytes")
    md5 = store.md5(name)
    if md5 != shard["md5"]:
        raise FormatError(f"{where}: its MD5 is {md5}, its manifest says {shard['md5']}")
    offsets = store.size(f"{name}.offsets")
    if offsets is None or offsets // 8 - 1 != shard["samples"]:
        raise FormatError(f"{where}: its .offsets holds {'no' if offsets is None else offsets // 8 - 1} "
                          f"samples, its manifest says {shard['samples']}")
