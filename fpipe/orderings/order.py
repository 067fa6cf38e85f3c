"""Orderings: windows, repetitions and seeded, resumable shuffles of readers.

An ordering wraps a reader (any object with ``len``, ``get`` and the readers'
``iter(start, stop, yield_key=..., raw=..., copy=..., chunk_size=...)``), or another
ordering, and offers the same iteration API in another order:

>>> from fpipe.dataset import ListReader
>>> reader = ListReader([{"key": i} for i in range(10)])
>>> [sample["key"] for sample in Range(reader, 2, 5)]
[2, 3, 4]
>>> [sample["key"] for sample in Repeater(Range(reader, 0, 2), 3)]
[0, 1, 0, 1, 0, 1]
>>> sorted(sample["key"] for sample in Shuffler(reader, seed=0)) == list(range(10))
True

**Epochs.** The order of a shuffler depends on ``(seed, epoch)`` alone. An ordering has a start
point ``(epoch, position)``, at first ``(0, 0)``. Every iteration without an explicit
``start`` begins at the start point, so iterators are independent of each other; when an
iteration hands out the last item of its epoch, the start point moves on to the next epoch,
so ``for x in shuffler`` gives a new order each time. :meth:`~Shuffler.set_epoch` moves the
start point to the beginning of an epoch explicitly:

>>> shuffler = Shuffler(reader, seed=0)
>>> first, second = list(shuffler), list(shuffler)
>>> first != second, shuffler.epoch
(True, 2)
>>> shuffler.set_epoch(0)
>>> list(shuffler) == first
True

**Resume.** ``state_dict()`` describes where the latest iteration stands (the seed included)
and ``load_state_dict()`` makes the start point of another ordering, built the same way, that
place; ``seek(k)`` moves to position ``k`` of the current epoch:

>>> shuffler = Shuffler(reader)                 # fresh entropy, kept in shuffler.seed
>>> stream = iter(shuffler)
>>> taken = [next(stream) for _ in range(4)]
>>> restored = Shuffler(reader)
>>> restored.load_state_dict(shuffler.state_dict())
>>> taken + list(restored) == list(Shuffler(reader, seed=shuffler.seed))
True

A wrapped ordering follows its wrapper: while a wrapper reads it, epoch ``e`` of the wrapper
reads epoch ``e`` of a :class:`Range`, :class:`Shuffler`, :class:`QuasiShuffler` or
:class:`Cycler` inside it, and a :class:`Repeater` of ``times`` reads epochs
``e * times`` to ``e * times + times - 1`` of what it repeats.
"""

from __future__ import annotations

import abc
import array
import itertools
import math
import random
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from fpipe.errors import check_integer, check_state, state_header
from fpipe.random import Seed, seed_entropy

__all__ = ["Cycler", "QuasiShuffler", "Range", "Repeater", "Shuffler"]


class ReadOptions(NamedTuple):
    """How an iteration reads samples. This class and the reading functions below without an
    underscore (outside ``__all__``) serve the orderings of other modules as well, such as
    :class:`~fpipe.orderings.permutation.IndexShuffler`."""

    yield_key: bool
    raw: bool
    copy: bool
    chunk_size: int


def _options(yield_key: bool, raw: bool, copy: bool, chunk_size: int) -> ReadOptions:
    return ReadOptions(bool(yield_key), bool(raw), bool(copy), check_integer("chunk_size", chunk_size, 1))


def read_source(source: Any, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
    """Positions ``[start, stop)`` of epoch ``epoch`` of a reader or ordering (``start < stop``)."""
    if isinstance(source, _Ordering):
        return source._read(epoch, start, stop, options)
    return source.iter(start, stop, yield_key=options.yield_key, raw=options.raw,
                       copy=options.copy, chunk_size=options.chunk_size)


def _read_list(source: Any, epoch: int, start: int, stop: int, options: ReadOptions) -> list:
    """Like :func:`read_source`, as a list: one ``get_slice`` where the reader offers it
    (a single contiguous read: one ``pread``)."""
    if isinstance(source, _Ordering):
        return source._read_list(epoch, start, stop, options)
    get_slice = getattr(source, "get_slice", None)
    if get_slice is None:
        return list(read_source(source, epoch, start, stop, options))
    return get_slice(start, stop, yield_key=options.yield_key, raw=options.raw,
                     copy=options.copy)


def source_getter(source: Any, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
    """A function from a position of epoch ``epoch`` of ``source`` to its sample."""
    if isinstance(source, _Ordering):
        return source._getter(epoch, options)
    if (options.yield_key, options.raw, options.copy) == (False, False, True):
        return source.get
    return partial(source.get, yield_key=options.yield_key, raw=options.raw, copy=options.copy)


def prefetch_indices(source: Any, indices: np.ndarray) -> None:
    """Tell the reader under ``source`` which of its samples come next, in order, so that a
    reader at a URL fetches their blocks in the background (other readers ignore it)."""
    while isinstance(source, Range):
        source, indices = source.reader, indices + source.start
    prefetch = None if isinstance(source, _Ordering) else getattr(source, "prefetch", None)
    if prefetch is not None and len(indices):
        prefetch(indices)


def random_access(source: Any) -> bool:
    if isinstance(source, _Ordering):
        return source._random_access()
    return callable(getattr(source, "get", None))


class _Progress:
    """Where one iteration stands: its next item is ``position`` of ``epoch``; ``origin`` is the
    start point the ordering had when this iteration began its current epoch."""

    __slots__ = ("epoch", "origin", "position")

    def __init__(self, origin: tuple[int, int]) -> None:
        self.origin = origin
        self.epoch, self.position = origin


class _Ordering(abc.ABC):
    """What all orderings share: the iteration API, epochs, and resume. An ordering says how
    long an epoch is (``len``) and reads positions of an epoch (:meth:`_read`)."""

    _endless = False

    def __init__(self, reader: Any) -> None:
        if not hasattr(reader, "__len__") or not hasattr(reader, "iter"):
            raise TypeError(f"reader must be a reader or an ordering (with len and iter); "
                            f"got reader={reader!r}")
        self.reader = reader
        self._move((0, 0))

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of positions in an epoch."""

    @abc.abstractmethod
    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        """The samples at positions ``[start, stop)`` of epoch ``epoch`` (``start < stop``)."""

    def _read_list(self, epoch: int, start: int, stop: int, options: ReadOptions) -> list:
        return list(self._read(epoch, start, stop, options))

    def _getter(self, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
        # one-item windows work for every ordering; the ones with random access do better
        def get(index: int) -> Any:
            return next(iter(self._read(epoch, index, index + 1, options)))
        return get

    def _random_access(self) -> bool:
        return False

    def iter(self, start: int | None = None, stop: int | None = None, yield_key: bool = False,
             raw: bool = False, copy: bool = True, chunk_size: int = 16) -> Iterator[Any]:
        """Iterate positions ``[start, stop)`` of the current epoch (like ``range``).

        Without ``start``, begin at the start point and follow it: the iteration counts towards
        :meth:`state_dict`, and handing out the last item of the epoch moves the start point to
        the next epoch. With ``start``, read that window of the current epoch and change
        nothing. ``yield_key``, ``raw``, ``copy`` and ``chunk_size`` go to the reader's reads.

        >>> from fpipe.dataset import ListReader
        >>> cycler = Cycler(ListReader([{"key": i} for i in range(3)]))
        >>> [key for key, sample in cycler.iter(1, 5, yield_key=True)]
        [1, 2, 0, 1]
        """
        options = _options(yield_key, raw, copy, chunk_size)
        if start is None:
            self._progress = progress = _Progress(self._origin)
            return self._tracked(progress, self._limit(stop), options)
        return self._walk(*self._window(start, stop), options)

    def __iter__(self) -> Iterator[Any]:
        return self.iter()

    def rawiter(self, yield_key: bool = False) -> Iterator[Any]:
        """``iter(raw=True, yield_key=yield_key)``, as in datadings."""
        return self.iter(yield_key=yield_key, raw=True)

    @property
    def epoch(self) -> int:
        """The epoch in which the next iteration begins."""
        return self._origin[0]

    @property
    def endless(self) -> bool:
        """Whether an iteration carries on into the next epoch at the end of one (a
        :class:`Cycler` that has samples) rather than ending there.

        >>> from fpipe.dataset import ListReader
        >>> reader = ListReader([{"key": 0}])
        >>> Cycler(reader).endless, Cycler(Range(reader, 0, 0)).endless, Range(reader).endless
        (True, False, False)
        """
        return self._endless and len(self) > 0

    def set_epoch(self, epoch: int) -> None:
        """Begin the next iteration at the start of ``epoch``.

        >>> from fpipe.dataset import ListReader
        >>> shuffler = Shuffler(ListReader([{"key": i} for i in range(5)]), seed=1)
        >>> first = list(shuffler)
        >>> shuffler.set_epoch(0)
        >>> list(shuffler) == first
        True
        """
        self._move((check_integer("epoch", epoch, 0), 0))

    def seek(self, index: int) -> None:
        """Begin the next iteration at position ``index`` of the current epoch; an index past
        the end carries on into the following epochs (datadings' Shuffler yielded nothing).

        >>> from fpipe.dataset import ListReader
        >>> window = Range(ListReader([{"key": i} for i in range(5)]))
        >>> window.seek(7)
        >>> [s["key"] for s in window], window.epoch
        ([2, 3, 4], 2)
        """
        index, n = check_integer("index", index, 0), len(self)
        epoch = self._origin[0]
        self._move((epoch + index // n, index % n) if n else (epoch, 0))

    def state_dict(self) -> dict[str, Any]:
        """Where the latest iteration stands (or the start point, if none began since it was
        set), with the seeds and the settings that shape the order (a :class:`Range`'s window,
        a :class:`Repeater`'s ``times``, a :class:`QuasiShuffler`'s buffer and chunk sizes),
        of this ordering and of those it wraps: a plain dict of ints, strings and None.

        >>> from fpipe.dataset import ListReader
        >>> shuffler = Shuffler(ListReader([{"key": i} for i in range(5)]), seed=1)
        >>> stream = iter(shuffler)
        >>> _ = next(stream), next(stream)
        >>> shuffler.state_dict()
        {'type': 'Shuffler', 'version': 1, 'length': 5, 'seed': 1, 'reader': None, 'epoch': 0, 'position': 2}
        """
        progress = self._progress
        return {**self._describe(), "epoch": progress.epoch, "position": progress.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the place that ``state`` describes the start point, adopting its seeds.

        ``state`` must be of an ordering built the same way: the same kinds, lengths and
        settings, all the way in (the seeds may differ: they are adopted). Anything else raises
        a ``ValueError`` that names the difference, and leaves this ordering as it was.

        >>> from fpipe.dataset import ListReader
        >>> reader = ListReader([{"key": i} for i in range(5)])
        >>> shuffler = Shuffler(reader)
        >>> shuffler.load_state_dict({"type": "Shuffler", "version": 1, "length": 5, "seed": 1,
        ...                           "reader": None, "epoch": 0, "position": 2})
        >>> shuffler.seed, list(shuffler) == list(Shuffler(reader, seed=1))[2:]
        (1, True)
        >>> Range(reader, 0, 3).load_state_dict(Range(reader, 2, 5).state_dict())
        Traceback (most recent call last):
        ...
        ValueError: state is of a Range with start=2, stop=5; this one has start=0, stop=3
        """
        self.state_loader(state)()

    def state_loader(self, state: Any, name: str = "state") -> Callable[[], None]:
        """Check ``state`` (called ``name`` in messages) all through, changing nothing, and
        return the function that loads it: so :class:`fpipe.Infinite` can refuse a state
        before it stops its pipeline.

        >>> from fpipe.dataset import ListReader
        >>> shuffler = Shuffler(ListReader([{"key": i} for i in range(4)]), seed=1)
        >>> load = shuffler.state_loader({**shuffler.state_dict(), "seed": 7})
        >>> shuffler.seed, load(), shuffler.seed
        (1, None, 7)
        """
        seeds = self._check_description(state, name, ("epoch", "position"))
        epoch = check_integer(f"{name}['epoch']", state["epoch"], 0)
        position = check_integer(f"{name}['position']", state["position"], 0)
        if position >= max(1, len(self)):
            raise ValueError(f"{name}['position'] must be < {len(self)}; got {position}")

        def load() -> None:
            for ordering, seed in seeds:
                ordering._reseed(seed)
            self._move((epoch, position))
        return load

    def _describe(self) -> dict[str, Any]:
        inner = self.reader._describe() if isinstance(self.reader, _Ordering) else None
        return {**state_header(type(self).__name__), "length": len(self), **self._settings(),
                "seed": getattr(self, "seed", None), "reader": inner}

    def _settings(self) -> dict[str, Any]:
        """The settings besides the length that shape the order, as a state names them."""
        return {}

    def _check_description(self, description: Any, name: str,
                           fields: tuple = ()) -> list[tuple[_Ordering, int]]:
        """Check that ``description`` (with ``fields``) is of an ordering built as this one,
        all the way in; the seeds to adopt, changing nothing yet."""
        settings = {"length": len(self), **self._settings()}
        check_state(description, type(self).__name__, ("seed", "reader", *fields), settings,
                    old_keys=("type", "length", "seed", "reader", *fields), name=name)
        seed = description["seed"]
        seeds = [] if seed is None else [(self, self._check_seed(seed, f"{name}['seed']"))]
        if isinstance(self.reader, _Ordering):
            return seeds + self.reader._check_description(description["reader"], f"{name}['reader']")
        if description["reader"] is not None:
            raise ValueError(f"{name}['reader'] describes an ordering, but this {type(self).__name__} "
                             f"reads {type(self.reader).__name__}; got {description['reader']!r:.200}")
        return seeds

    def _check_seed(self, seed: Any, name: str) -> int:
        raise ValueError(f"a {type(self).__name__} has no seed; got {name}={seed!r:.80}")

    def _move(self, origin: tuple[int, int]) -> None:
        self._origin = origin
        self._progress = _Progress(origin)

    def _limit(self, stop: int | None) -> int | None:
        if stop is None:
            return None
        return range(len(self))[:check_integer("stop", stop)].stop

    def _window(self, start: int, stop: int | None) -> tuple[int, int, int | None]:
        stop = None if stop is None else check_integer("stop", stop)
        window = range(len(self))[check_integer("start", start):stop]
        return self._origin[0], window.start, window.stop

    def _walk(self, epoch: int, position: int, limit: int | None, options: ReadOptions) -> Iterator:
        n = len(self)
        while True:
            end = n if limit is None else min(n, limit)
            if position >= end:
                return
            yield from self._read(epoch, position, end, options)
            if end < n or not self._endless:
                return
            epoch, position, limit = epoch + 1, 0, None if limit is None else limit - n

    def _tracked(self, progress: _Progress, limit: int | None, options: ReadOptions) -> Iterator:
        n = len(self)
        for item in self._walk(progress.epoch, progress.position, limit, options):
            progress.position += 1
            if progress.position == n:
                self._turn(progress)
            yield item

    def _turn(self, progress: _Progress) -> None:
        # the last item of an epoch is on its way out: the next iteration begins the next
        # epoch, unless someone moved the start point meanwhile
        following = (progress.epoch + 1, 0)
        if self._origin is progress.origin:
            self._origin = following
        progress.origin = following
        progress.epoch, progress.position = following

    def __enter__(self) -> _Ordering:
        enter = getattr(self.reader, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        leave = getattr(self.reader, "__exit__", None)
        if leave is not None:
            leave(*exc_info)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reader!r}{self._arguments()})"

    def _arguments(self) -> str:
        return ""


class IndexableOrdering(_Ordering):
    """Orderings with random access: ``get`` reads one position of the current epoch."""

    def get(self, index: int, yield_key: bool = False, raw: bool = False,
            copy: bool = True) -> Any:
        """The sample at position ``index`` of the current epoch (negative counts from the end).

        >>> from fpipe.dataset import ListReader
        >>> Range(ListReader([{"key": i} for i in range(5)]), 1, 4).get(-1)
        {'key': 3}
        """
        if not self._random_access():
            raise TypeError(f"{type(self).__name__} over {type(self.reader).__name__} has no "
                            "random access: the reader it wraps cannot get")
        index, n = check_integer("index", index), len(self)
        if not -n <= index < n:
            raise IndexError(f"index must be in [-{n}, {n}); got index={index}")
        return self._getter(self.epoch, _options(yield_key, raw, copy, 1))(index % n)


class SeededOrdering(_Ordering):
    """Orderings whose order depends on a seed and the epoch; keeps one epoch's plan cached."""

    def __init__(self, reader: Any, seed: Seed) -> None:
        super().__init__(reader)
        self._reseed(seed)

    def _reseed(self, seed: Seed) -> None:
        self.seed = seed_entropy(seed)
        self._cache: tuple[Any, Any] = (None, None)

    def _check_seed(self, seed: Any, name: str) -> int:
        return check_integer(name, seed, 0)

    def _cached(self, epoch: int, build: Callable[[int], Any]) -> Any:
        key = (self.seed, epoch)
        if self._cache[0] != key:
            self._cache = (key, build(epoch))
        return self._cache[1]

    def _arguments(self) -> str:
        return f", seed={self.seed}"


class Range(IndexableOrdering):
    """The positions ``[start, stop)`` of ``reader``, normalised like a slice of ``range``.

    A window past the end is empty (datadings raised IndexError).

    >>> from fpipe.dataset import ListReader
    >>> window = Range(ListReader([{"key": i} for i in range(10)]), 7, -1)
    >>> [s["key"] for s in window], len(window), window.get(0), window.get(-1)
    ([7, 8], 2, {'key': 7}, {'key': 8})
    >>> list(Range(window, 5))
    []
    """

    def __init__(self, reader: Any, start: int = 0, stop: int | None = None) -> None:
        super().__init__(reader)
        stop = None if stop is None else check_integer("stop", stop)
        window = range(len(reader))[check_integer("start", start):stop]
        self.start, self.stop = window.start, max(window.start, window.stop)

    def __len__(self) -> int:
        return self.stop - self.start

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        return read_source(self.reader, epoch, self.start + start, self.start + stop, options)

    def _read_list(self, epoch: int, start: int, stop: int, options: ReadOptions) -> list:
        return _read_list(self.reader, epoch, self.start + start, self.start + stop, options)

    def _getter(self, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
        get, offset = source_getter(self.reader, epoch, options), self.start
        return lambda index: get(offset + index)

    def _random_access(self) -> bool:
        return random_access(self.reader)

    def _arguments(self) -> str:
        return f", {self.start}, {self.stop}"

    def _settings(self) -> dict[str, Any]:
        return {"start": self.start, "stop": self.stop}


class Repeater(_Ordering):
    """``times`` passes over ``reader``; one pass of the Repeater is all of them, so its ``len``
    is ``times * len(reader)`` (datadings reported ``len(reader)``). Each repetition reads the
    next epoch of the reader, so repeating a shuffler gives a new order every time.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"key": i} for i in range(9)])
    >>> [s["key"] for s in Repeater(Range(reader, 0, 2), 2)]
    [0, 1, 0, 1]
    >>> len(Repeater(reader, 3))
    27
    """

    def __init__(self, reader: Any, times: int) -> None:
        super().__init__(reader)
        self.times = check_integer("times", times, 0)

    def __len__(self) -> int:
        return self.times * len(self.reader)

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        n = len(self.reader)
        for repetition in range(start // n, -(-stop // n)):
            low, high = max(start, repetition * n), min(stop, (repetition + 1) * n)
            yield from read_source(self.reader, epoch * self.times + repetition,
                                    low - repetition * n, high - repetition * n, options)

    def _getter(self, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
        n, reader, times = len(self.reader), self.reader, self.times
        return lambda index: source_getter(reader, epoch * times + index // n, options)(index % n)

    def _random_access(self) -> bool:
        return random_access(self.reader)

    def _arguments(self) -> str:
        return f", {self.times}"

    def _settings(self) -> dict[str, Any]:
        return {"times": self.times}


class Cycler(_Ordering):
    """Endless passes over ``reader``, each in the reader's next epoch; ``len`` is one pass.

    Positions count on across epochs: ``iter(start, stop)`` reads from position ``start`` to
    ``stop`` (endlessly if ``stop`` is None). Over an empty reader it ends at once.

    >>> from itertools import islice
    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"key": i} for i in range(3)])
    >>> [s["key"] for s in islice(Cycler(reader), 7)]
    [0, 1, 2, 0, 1, 2, 0]
    >>> [s["key"] for s in Cycler(reader).iter(2, 7)]
    [2, 0, 1, 2, 0]
    """

    _endless = True

    def __len__(self) -> int:
        return len(self.reader)

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        return read_source(self.reader, epoch, start, stop, options)

    def _read_list(self, epoch: int, start: int, stop: int, options: ReadOptions) -> list:
        return _read_list(self.reader, epoch, start, stop, options)

    def _getter(self, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
        return source_getter(self.reader, epoch, options)

    def _random_access(self) -> bool:
        return random_access(self.reader)

    def _limit(self, stop: int | None) -> int | None:
        return None if stop is None else check_integer("stop", stop, 0)

    def _window(self, start: int, stop: int | None) -> tuple[int, int, int | None]:
        start, n = check_integer("start", start, 0), max(1, len(self))
        laps = start // n
        limit = None if stop is None else check_integer("stop", stop, 0) - laps * n
        return self._origin[0] + laps, start % n, limit


class Shuffler(SeededOrdering, IndexableOrdering):
    """A true permutation of ``reader`` per epoch, read sample by sample with ``get``.

    The permutation of epoch ``e`` depends on ``(seed, e)`` alone, and is datadings's: Python's
    ``random.Random(seed + e * len(reader)).shuffle`` of the indices, so an int seed gives the
    order datadings 3.4.7 gave, epoch after epoch. ``seed=None`` draws fresh entropy, kept in
    ``seed`` (datadings used ``len(reader)``, the same order every run). The permutation
    lives in a numpy array (4 bytes a sample); drawing it costs about a second per million
    samples, once an epoch.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"key": i} for i in range(6)])
    >>> shuffler = Shuffler(reader, seed=3)
    >>> [shuffler.get(i) for i in range(6)] == list(shuffler)
    True
    >>> sorted(s["key"] for s in Shuffler(reader, seed=3))
    [0, 1, 2, 3, 4, 5]
    """

    def __init__(self, reader: Any, seed: Seed = None) -> None:
        super().__init__(reader, seed)
        if not random_access(reader):
            raise TypeError(f"Shuffler needs a reader with random access (get); got "
                            f"reader={reader!r}")
        self._length = len(reader)

    def __len__(self) -> int:
        return self._length

    def _permutation(self, epoch: int) -> np.ndarray:
        return self._cached(epoch, self._draw_permutation)

    def _draw_permutation(self, epoch: int) -> np.ndarray:
        return shuffled(epoch_random(self.seed, epoch, self._length), self._length)

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        get, order = source_getter(self.reader, epoch, options), self._permutation(epoch)
        return self._blocks(get, order, start, stop)

    def _blocks(self, get: Callable[[int], Any], order: np.ndarray, start: int,
                stop: int) -> Iterator:
        for low in range(start, stop, BLOCK):
            high = min(stop, low + BLOCK)
            # two blocks ahead, so the next block's first samples are on their way too
            prefetch_indices(self.reader, order[low:min(stop, high + BLOCK)])
            yield from map(get, order[low:high].tolist())

    def _getter(self, epoch: int, options: ReadOptions) -> Callable[[int], Any]:
        get, order = source_getter(self.reader, epoch, options), self._permutation(epoch)
        return lambda index: get(int(order[index]))

    def _random_access(self) -> bool:
        return True


class QuasiShuffler(SeededOrdering):
    """Shuffle ``reader`` cheaply: read whole chunks in a shuffled order and pass them through a
    buffer of random slots. Reads are contiguous, one per chunk.

    ``buf_size`` below 1 is a fraction of the dataset, an integer from 1 up is a number of
    samples; either way the buffer is rounded up to whole chunks of ``chunk_size`` samples.
    Per epoch, the buffer fills with the first ``buffer_size // chunk_size`` chunks in shuffled
    order; every later sample then takes the place of a random slot, whose sample goes out;
    at the end the buffer goes out in slot order (in a shuffled order if the whole epoch fit
    in the buffer). Every sample comes out once per epoch, for
    any length, buffer and chunk size, and at most ``buffer_size + chunk_size`` samples are
    held at a time.

    The random choices are datadings's: Python's ``random.Random(seed + e * len(reader))``
    shuffles the chunks of epoch ``e`` and then picks the slots, so an int seed gives the
    order datadings 3.4.7 gave wherever it had the same buffer (an integer ``buf_size``, or
    the default 0.01). ``seed=None`` draws fresh entropy, kept in ``seed`` (datadings used
    ``len(reader) * buffer_size * chunk_size``).

    Resuming at position ``k`` replays the epoch's random choices on indices (vectorised, no
    data read), then reads only what the buffer holds at ``k``. Fixed against datadings: a
    fraction is honoured (datadings used 1 % for any fraction), resuming on a chunk boundary
    is exact, ``iter(chunk_size=...)`` cannot drop samples (each chunk is one read of
    ``chunk_size`` samples whatever ``iter`` is given), ``copy`` is passed on, and an epoch
    that fits in the buffer is shuffled (datadings gave its chunks in file order; there the
    streams differ).

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"key": i} for i in range(100)])
    >>> shuffler = QuasiShuffler(reader, buf_size=0.2, chunk_size=8, seed=0)
    >>> shuffler.buffer_size
    24
    >>> sorted(s["key"] for s in shuffler) == list(range(100))
    True
    """

    def __init__(self, reader: Any, buf_size: float = 0.01, chunk_size: int = 16,
                 seed: Seed = None) -> None:
        super().__init__(reader, seed)
        self.chunk_size = check_integer("chunk_size", chunk_size, 1)
        self._length = len(reader)
        wanted = buffer_samples(buf_size, self._length)
        self.buffer_size = max(1, -(-wanted // self.chunk_size)) * self.chunk_size

    def __len__(self) -> int:
        return self._length

    def _arguments(self) -> str:
        return f", buf_size={self.buffer_size}, chunk_size={self.chunk_size}, seed={self.seed}"

    def _settings(self) -> dict[str, Any]:
        return {"buffer_size": self.buffer_size, "chunk_size": self.chunk_size}

    def _plan(self, epoch: int) -> EpochPlan:
        return self._cached(epoch, self._draw_plan)

    def _draw_plan(self, epoch: int) -> EpochPlan:
        n, size = self._length, self.chunk_size
        rand = epoch_random(self.seed, epoch, n)
        order = shuffled(rand, -(-n // size))
        sizes = np.minimum(size, n - order.astype(np.int64) * size)
        starts = np.concatenate(([0], np.cumsum(sizes)))
        # the buffer is whole chunks: shorter than buffer_size if it holds the short last one
        fill = int(starts[min(len(order), self.buffer_size // size)])
        state = rand.getstate()
        # datadings let the buffer out in slot order; when nothing streamed through it, that
        # is the file order within each chunk: no shuffle at all
        flush = np.arange(fill) if fill < n else shuffled(rand, fill)
        return EpochPlan(order, starts, fill, size, state, flush)

    def _read(self, epoch: int, start: int, stop: int, options: ReadOptions) -> Iterator:
        return itertools.islice(self._pass(epoch, start, options), stop - start)

    def _pass(self, epoch: int, start: int, options: ReadOptions) -> Iterator:
        plan = self._plan(epoch)
        options = options._replace(chunk_size=self.chunk_size)
        streamed = self._length - plan.fill
        blocks = slot_blocks(plan.slot_state, plan.fill) if streamed else iter(())
        buffer, rest = self._load_buffer(plan, epoch, start, blocks, options)
        if start < streamed:
            slots = itertools.chain(rest.tolist(), itertools.chain.from_iterable(
                block.tolist() for block in blocks))
            yield from self._stream(plan, epoch, buffer, slots, start, options)
        for slot in plan.flush[max(0, start - streamed):].tolist():
            sample, buffer[slot] = buffer[slot], None
            yield sample

    def _stream(self, plan: EpochPlan, epoch: int, buffer: list, slots: Iterator[int], step: int,
                options: ReadOptions) -> Iterator:
        position = hinted = plan.fill + step
        for first, stop in plan.pieces(plan.fill + step, self._length):
            if position >= hinted:
                hinted = position + BLOCK
                self._prefetch(plan, position, hinted + BLOCK)
            position += stop - first
            samples = _read_list(self.reader, epoch, first, stop, options)
            # samples first: zip must not draw a slot for a sample that is not there
            for sample, slot in zip(samples, slots):
                yield buffer[slot]
                buffer[slot] = sample
            # samples that went out again within their own chunk must not outlive it
            del samples

    def _load_buffer(self, plan: EpochPlan, epoch: int, start: int, blocks: Iterator[np.ndarray],
                     options: ReadOptions) -> tuple[list, np.ndarray]:
        """The buffer at position ``start`` (slots already gone out are None), and the slot
        choices left over from the block in which the replay stopped."""
        if start == 0:
            self._prefetch(plan, 0, plan.fill + BLOCK)
            return [sample for first, stop in plan.pieces(0, plan.fill)
                    for sample in _read_list(self.reader, epoch, first, stop, options)], NO_SLOTS
        streamed = self._length - plan.fill
        held, rest = replayed_slots(plan, blocks, min(start, streamed))
        wanted = plan.flush[max(0, start - streamed):]
        buffer: list = [None] * plan.fill
        get = source_getter(self.reader, epoch, options)
        for slot, index in zip(wanted.tolist(), held[wanted].tolist()):
            buffer[slot] = get(index)
        return buffer, rest

    def _prefetch(self, plan: EpochPlan, low: int, high: int) -> None:
        """Hint the samples at read positions ``[low, high)``: those of each chunk in turn."""
        prefetch_indices(self.reader, plan.samples(np.arange(low, min(high, self._length))))


class Indexed:
    """A reader of ``(position, sample)``, so that a shuffled shard knows where each sample
    came from (for its random generator and its error messages); the torch adapters use it."""

    __slots__ = ("reader",)

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def iter(self, start: int | None = None, stop: int | None = None, yield_key: bool = False,
             raw: bool = False, copy: bool = True, chunk_size: int = 16) -> Iterator[tuple[int, Any]]:
        window = range(len(self.reader))[start:stop]
        samples = self.reader.iter(window.start, window.stop, copy=copy, chunk_size=chunk_size)
        return zip(window, samples)

    def get_slice(self, start: int, stop: int, yield_key: bool = False, raw: bool = False,
                  copy: bool = True) -> list[tuple[int, Any]]:
        # the reader's get_slice, so that a chunk of a shuffle goes through its cache (a
        # Parquet reader's decoded row groups) where its iter would decode afresh
        window = range(len(self.reader))[start:stop]
        get_slice = getattr(self.reader, "get_slice", None)
        if get_slice is None:
            return list(self.iter(window.start, window.stop, copy=copy))
        return list(zip(window, get_slice(window.start, window.stop, copy=copy)))

    def get(self, index: int, yield_key: bool = False, raw: bool = False,
            copy: bool = True) -> tuple[int, Any]:
        return index, self.reader.get(index)

    def prefetch(self, indices: Any) -> None:
        prefetch = getattr(self.reader, "prefetch", None)
        if prefetch is not None:
            prefetch(indices)


# --- the random draws of the shufflers, on indices -------------------------------------------
#
# datadings's per-epoch random.Random, shuffles kept in compact arrays, and a QuasiShuffler's
# plan of an epoch, with the replay that finds what its buffer holds at any position without
# reading a sample. The index orderings of other modules use them too (BLOCK, buffer_samples).

# indices become Python ints this many at a time, so that no pass holds n of them at once
BLOCK = 1 << 14


class EpochPlan(NamedTuple):
    """One epoch of a QuasiShuffler in terms of indices.

    Chunks are read in the shuffled ``order``; the *read position* of a sample is its place
    in that sequence, and ``starts[j]`` is the read position of chunk ``order[j]``'s first
    sample. Read positions ``[0, fill)`` fill the buffer; each later one replaces a random slot.
    """

    order: np.ndarray
    starts: np.ndarray
    fill: int
    chunk_size: int
    slot_state: tuple  # the Mersenne Twister's state when the first slot is drawn
    flush: np.ndarray  # the order in which the buffer's slots go out at the end

    def pieces(self, low: int, high: int) -> Iterator[tuple[int, int]]:
        """The sample ranges ``(first, stop)`` that read positions ``[low, high)`` cover, one
        contiguous range per chunk."""
        if low >= high:
            return
        for block in range(int(np.searchsorted(self.starts, low, side="right")) - 1,
                           len(self.order), BLOCK):
            chunks = self.order[block:block + BLOCK].tolist()
            starts = self.starts[block:block + BLOCK + 1].tolist()
            for chunk, start, end in zip(chunks, starts, starts[1:]):
                if start >= high:
                    return
                begin = max(low, start)
                first = chunk * self.chunk_size + begin - start
                yield first, first + min(high, end) - begin

    def samples(self, positions: np.ndarray) -> np.ndarray:
        chunks = np.searchsorted(self.starts, positions, side="right") - 1
        return (self.order[chunks].astype(np.int64) * self.chunk_size
                + (positions - self.starts[chunks]))


NO_SLOTS = np.empty(0, dtype=np.uint64)


def epoch_random(seed: int, epoch: int, n: int) -> random.Random:
    # datadings seeds each pass with seed + offset, the offset growing by n a pass
    return random.Random(seed + epoch * n)


def shuffled(rand: random.Random, n: int) -> np.ndarray:
    """``rand.shuffle`` of ``range(n)``, in a compact array (a list would take 9 times the
    memory while it is shuffled).

    >>> order = shuffled(epoch_random(seed=3, epoch=1, n=6), 6)
    >>> sorted(order.tolist()), order.tolist() == shuffled(epoch_random(3, 1, 6), 6).tolist()
    ([0, 1, 2, 3, 4, 5], True)
    """
    order = array.array("i" if n < 2 ** 31 else "q", range(n))
    rand.shuffle(order)
    return np.frombuffer(order, dtype=order.typecode)


def slot_blocks(state: tuple, slots: int) -> Iterator[np.ndarray]:
    """Endless ``randrange(slots)`` draws of a ``random.Random`` in ``state``, a block at a
    time. numpy's MT19937 is the same generator: started from the same state it gives the
    same 32-bit words, and ``randrange(m)`` keeps the top ``m.bit_length()`` bits of a word
    when they are below ``m`` and tries the next word otherwise."""
    words = np.random.MT19937()
    words.state = {"bit_generator": "MT19937",
                   "state": {"key": np.array(state[1][:-1], dtype=np.uint32), "pos": state[1][-1]}}
    shift = np.uint64(32 - slots.bit_length())
    while True:
        drawn = words.random_raw(BLOCK) >> shift
        yield drawn[drawn < slots]


def replayed_slots(plan: EpochPlan, blocks: Iterator[np.ndarray],
                   steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The sample index in each buffer slot after ``steps`` replacements, replayed on indices
    (the last replacement of a slot decides what it holds), and the slot choices left over
    from the last block drawn."""
    held, done, rest = np.arange(plan.fill, dtype=np.int64), 0, NO_SLOTS
    while done < steps:
        drawn = next(blocks)
        taken, rest = drawn[:steps - done], drawn[steps - done:]
        chosen, last_from_end = np.unique(taken[::-1], return_index=True)
        held[chosen] = plan.fill + done + len(taken) - 1 - last_from_end
        done += len(taken)
    return plan.samples(held), rest


def buffer_samples(buf_size: float, n: int) -> int:
    if isinstance(buf_size, (bool, np.bool_)) or not isinstance(
            buf_size, (int, float, np.integer, np.floating)):
        raise TypeError(f"buf_size must be a number; got buf_size={buf_size!r}")
    if 0 < buf_size < 1:
        return math.ceil(buf_size * n)
    if not (buf_size >= 1 and float(buf_size).is_integer()):
        raise ValueError("buf_size must be a fraction in (0, 1) or a whole number of samples "
                         f">= 1; got buf_size={buf_size!r}")
    return int(buf_size)
