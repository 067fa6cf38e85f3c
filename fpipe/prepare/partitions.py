"""The partitions of a dataset to prepare: the calls of the user's generator function, one
argument a partition (:func:`from_generator`), the files of the sources ``fpipe write`` takes,
one file a partition or each file cut into ranges of samples (:func:`from_sources`), or the
partitions of a ``dask.bag`` or ``dask.dataframe`` (:func:`from_dask`).

>>> def numbers(start):
...     for i in range(start, start + 2):
...         yield {"key": f"{i:03d}", "x": i}
>>> partitions = from_generator(numbers, [0, 10])
>>> len(partitions), [s["key"] for s in partitions.samples(1)]
(2, ['010', '011'])
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fpipe.errors import check_callable, check_integer
from fpipe.prepare._manifest import describe_callable

__all__ = ["Partitions", "from_dask", "from_generator", "from_sources"]


class Partitions(Sequence):
    """The partitions of a job: ``len`` of them; partition ``i`` yields its samples (dicts
    with a ``"key"``) from :meth:`samples`, in the same order at every call. Made by
    :func:`from_generator` or :func:`from_sources`; it travels to the workers (pickled), so
    the generator must be picklable (cloudpickle takes lambdas and local functions).

    >>> partitions = from_generator(lambda n: ({"key": str(i)} for i in range(n)), [1, 2])
    >>> partitions[1], list(partitions.samples(1))
    (2, [{'key': '0'}, {'key': '1'}])
    """

    def __init__(self, arguments: Sequence[Any], generate: Callable[[Any], Iterable[dict]] | None,
                 kind: str | None = None) -> None:
        self.arguments, self.generate, self.kind = list(arguments), generate, kind

    def __len__(self) -> int:
        return len(self.arguments)

    def __getitem__(self, index: Any) -> Any:
        return self.arguments[index]

    def __repr__(self) -> str:
        return f"Partitions({len(self)} partitions of {self.origin})"

    def only(self, index: int) -> Partitions:
        """These partitions with the argument of partition ``index`` alone: what a task
        carries to its worker (not every partition's argument).

        >>> from_generator(range, [3, 4, 5]).only(2).arguments
        {2: 5}
        """
        one = Partitions([], self.generate, self.kind)
        one.arguments = {index: self.arguments[index]}  # type: ignore[assignment]
        return one

    @property
    def origin(self) -> str:
        """What makes the samples, for the fingerprint: the generator, or the sources' format."""
        if self.generate is None:
            return f"{self.kind} files"
        if isinstance(self.generate, _DaskPartition):
            return self.generate.origin
        return str(describe_callable(self.generate))

    def argument(self, index: int) -> str:
        """Partition ``index``'s argument as the fingerprint shows it."""
        return f"{self.arguments[index]!r:.300}"

    def samples(self, index: int) -> Iterator[dict]:
        """The samples of partition ``index``, each a dict with its ``"key"``."""
        if self.generate is not None:
            yield from self.generate(self.arguments[index])
            return
        argument = self.arguments[index]
        if isinstance(argument, tuple):  # a range of samples of one file
            path, start, stop = argument
            if stop > start:
                yield from _source_samples(self.kind, path, start, stop)
            return
        yield from _source_samples(self.kind, argument)


def _opened(kind: str | None, path: str) -> Any:
    from fpipe.formats._sources import open_source

    reader = open_source(str(kind), [path])
    if kind == "tfrecord":
        from fpipe.formats.tfrecord import packing_reader

        reader = packing_reader(reader)
    return reader


def _source_samples(kind: str | None, path: str, start: int | None = None,
                    stop: int | None = None) -> Iterator[dict]:
    """The samples of the file ``path``, or those of its positions ``start`` to ``stop``."""
    reader = _opened(kind, path)
    try:
        for key, sample in reader.iter(start, stop, yield_key=True, chunk_size=256):
            sample["key"] = key
            yield sample
    finally:
        reader.close()


def _sample_count(kind: str | None, path: str) -> int:
    """How many samples the file ``path`` holds (a packed or Parquet file says; the others
    are read through once)."""
    reader = _opened(kind, path)
    try:
        if kind in ("packed", "parquet"):
            return len(reader)
        return sum(1 for _ in reader.iter(yield_key=True, chunk_size=256))
    finally:
        reader.close()


def even_ranges(count: int, ranges: int) -> list[tuple[int, int]]:
    """``ranges`` contiguous ranges of ``count`` positions whose sizes differ by one at most,
    the longer first.

    >>> even_ranges(10, 3), even_ranges(1, 2)
    ([(0, 4), (4, 7), (7, 10)], [(0, 1), (1, 1)])
    """
    size, extra = divmod(count, ranges)
    bounds = [0]
    for number in range(ranges):
        bounds.append(bounds[-1] + size + (number < extra))
    return list(zip(bounds, bounds[1:]))


def from_generator(generate: Callable[[Any], Iterable[dict]], arguments: Iterable[Any]) -> Partitions:
    """Partitions made by the user's function: partition ``i`` holds the samples of
    ``generate(arguments[i])`` (dicts, each with a unique ``"key"``), read in the worker.

    >>> list(from_generator(range, [2]).arguments)
    [2]
    >>> from_generator(3, [1])
    Traceback (most recent call last):
    ...
    TypeError: generate must be callable; got generate=3
    """
    check_callable("generate", generate)
    arguments = list(arguments)
    if not arguments:
        raise ValueError("arguments must hold one argument a partition; got none")
    return Partitions(arguments, generate)


def from_sources(sources: str | Sequence[str], ranges: int | None = None) -> Partitions:
    """Partitions of the sources ``fpipe write`` takes in another format (WebDataset shards,
    Parquet/Arrow files or a Hugging Face folder, TFRecord files, packed fpipe datasets),
    split by file: one file a partition, in sorted order within each pattern or folder; with
    ``ranges=N``, each file is cut into ``N`` partitions, contiguous ranges of its samples
    whose sizes differ by one at most (the files are counted here: a packed or Parquet file
    says its count, the others are read through once). The same files give the same
    partitions, and each partition's range is in the job's fingerprint.

    >>> import os, tempfile
    >>> from fpipe.formats import TFRecordWriter
    >>> folder = tempfile.mkdtemp()
    >>> for part in range(2):
    ...     with TFRecordWriter(os.path.join(folder, f"{part}.tfrecord")) as writer:
    ...         writer.write({"x": [part]})
    >>> partitions = from_sources(os.path.join(folder, "*.tfrecord"))
    >>> len(partitions), partitions.kind
    (2, 'tfrecord')
    >>> len(from_sources(os.path.join(folder, "*.tfrecord"), ranges=3))
    6
    >>> from_sources(os.path.join(folder, "*.tfrecord"), ranges=0)
    Traceback (most recent call last):
    ...
    ValueError: ranges must be >= 1; got ranges=0
    """
    from fpipe.formats._sources import split_by_file

    if ranges is not None:
        ranges = check_integer("ranges", ranges, 1)

    if isinstance(sources, str):
        sources = [sources]
    if not sources or not all(isinstance(source, str) for source in sources):
        raise TypeError(f"sources must be paths, URLs or patterns (str); got {sources!r:.200}")
    kind, files = split_by_file(list(sources))
    if not files:
        raise FileNotFoundError(f"no file matches the sources {list(sources)!r:.200}")
    seen: dict[str, int] = {}
    for number, path in enumerate(files):
        real = os.path.realpath(path) if "://" not in path else path
        if real in seen:
            raise ValueError(f"{path} is partition {seen[real]} and partition {number}: a "
                             "file's samples would be written twice; give each file once")
        seen[real] = number
    if ranges is None:
        return Partitions(files, None, kind)
    cut = [(path, start, stop) for path in files
           for start, stop in even_ranges(_sample_count(kind, path), ranges)]
    return Partitions(cut, None, kind)


class _DaskPartition:
    """Partition ``i`` of a dask bag or dataframe, computed in the worker that writes it (its
    own part of the graph, on dask's synchronous scheduler); a sample without a ``"key"``
    gets ``PPPPPP-NNNNNNNNN`` (its partition and position)."""

    def __init__(self, kind: str, count: int, columns: list[str] | None) -> None:
        self.kind, self.count, self.columns = kind, count, columns

    @property
    def origin(self) -> str:
        columns = "" if self.columns is None else f", columns {self.columns!r:.200}"
        return f"a dask.{self.kind} of {self.count} partitions{columns}"

    def __call__(self, argument: tuple[int, Any]) -> Iterator[dict]:
        partition, part = argument
        computed = part.compute(scheduler="sync")
        if self.kind == "dataframe":
            rows = (row for start in range(0, len(computed), 1024)
                    for row in computed.iloc[start:start + 1024].to_dict("records"))
        else:
            rows = iter(computed)
        for index, row in enumerate(rows):
            if not isinstance(row, dict):
                raise TypeError(f"partition {partition} of the dask.bag: its items must be dict "
                                f"samples; item {index} is {type(row).__name__} {row!r:.80}")
            if "key" not in row:
                row = {"key": f"{partition:06d}-{index:09d}", **row}
            yield row


class _Part(tuple):
    """A dask partition's argument: shown as its number in the fingerprint (a dask name's
    token may differ between runs of the same job)."""

    def __repr__(self) -> str:
        return f"partition {self[0]}"


def from_dask(collection: Any) -> Partitions:
    """Partitions of a ``dask.bag`` (one a bag partition; its items are dict samples) or a
    ``dask.dataframe`` (one a dataframe partition; each row a sample, a dict of its columns),
    in the collection's order. Each partition is computed in the worker that writes it. A
    sample without a ``"key"`` gets one from its partition and position
    (``"000003-000000017"``). The job's fingerprint holds the kind, the number of partitions
    (and a dataframe's columns): a rerun on another partitioning is refused.

    >>> import dask.bag
    >>> bag = dask.bag.from_sequence([{"key": str(i), "x": i} for i in range(5)], npartitions=2)
    >>> partitions = from_dask(bag)
    >>> len(partitions), [s["x"] for s in partitions.samples(1)]
    (2, [3, 4])
    >>> from_dask([1, 2])
    Traceback (most recent call last):
    ...
    TypeError: collection must be a dask.bag or a dask.dataframe; got list [1, 2]
    """
    module = type(collection).__module__
    if module.startswith("dask.bag"):
        kind, columns = "bag", None
    elif module.startswith("dask.dataframe") and hasattr(collection, "columns"):
        kind, columns = "dataframe", [str(column) for column in collection.columns]
    else:
        raise TypeError("collection must be a dask.bag or a dask.dataframe; got "
                        f"{type(collection).__name__} {collection!r:.80}")
    parts = collection.to_delayed()
    if not parts:
        raise ValueError(f"collection must have partitions; the dask.{kind} has none")
    return Partitions([_Part((number, part)) for number, part in enumerate(parts)],
                      _DaskPartition(kind, len(parts), columns), kind)
