"""The partitions of a dataset to prepare: the calls of the user's generator function, one
argument a partition (:func:`from_generator`), or the files of the sources ``fpipe write``
takes, one file a partition (:func:`from_sources`).

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

from fpipe.errors import check_callable
from fpipe.prepare._manifest import describe_callable

__all__ = ["Partitions", "from_generator", "from_sources"]


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
        what = f"{self.kind} files" if self.generate is None else describe_callable(self.generate)
        return f"Partitions({len(self)} partitions of {what})"

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
        return str(describe_callable(self.generate))

    def argument(self, index: int) -> str:
        """Partition ``index``'s argument as the fingerprint shows it."""
        return f"{self.arguments[index]!r:.300}"

    def samples(self, index: int) -> Iterator[dict]:
        """The samples of partition ``index``, each a dict with its ``"key"``."""
        if self.generate is not None:
            yield from self.generate(self.arguments[index])
            return
        yield from _source_samples(self.kind, self.arguments[index])


def _source_samples(kind: str | None, path: str) -> Iterator[dict]:
    from fpipe.formats._sources import open_source

    reader = open_source(str(kind), [path])
    if kind == "tfrecord":
        from fpipe.formats.tfrecord import packing_reader

        reader = packing_reader(reader)
    try:
        for key, sample in reader.iter(yield_key=True, chunk_size=256):
            sample["key"] = key
            yield sample
    finally:
        reader.close()


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


def from_sources(sources: str | Sequence[str]) -> Partitions:
    """Partitions of the sources ``fpipe write`` takes in another format (WebDataset shards,
    Parquet/Arrow files or a Hugging Face folder, TFRecord files, packed fpipe datasets),
    split by file: one file a partition, in sorted order within each pattern or folder.

    >>> import os, tempfile
    >>> from fpipe.formats import TFRecordWriter
    >>> folder = tempfile.mkdtemp()
    >>> for part in range(2):
    ...     with TFRecordWriter(os.path.join(folder, f"{part}.tfrecord")) as writer:
    ...         writer.write({"x": [part]})
    >>> partitions = from_sources(os.path.join(folder, "*.tfrecord"))
    >>> len(partitions), partitions.kind
    (2, 'tfrecord')
    """
    from fpipe.formats._sources import split_by_file

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
    return Partitions(files, None, kind)
