"""Sources: infinite, seeded streams to start a pipeline with.

:func:`sample` draws elements of a sequence at random (by weight), :func:`load_by_random_id`
loads what the drawn ids name, and :func:`mix` interleaves several streams at random, in
proportion to their weights. They are :class:`fpipe.Stream` objects, so they pass whole chunks
to the next stage, and a sample's position can be saved and restored:

>>> from toolz import pipe
>>> from fpipe import batch, take
>>> list(pipe(sample("abc", weights=[1, 0, 1], random_state=0), batch(4), take(2)))
[['c', 'c', 'c', 'c'], ['a', 'a', 'a', 'a']]

The draws of a seeded source depend on the seed alone: draw ``i`` comes from block
``i // 1024`` of uniform numbers, each block made by its own generator, so a restored position
is reached in O(1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import check_callable, check_choice
from ..random import Seed, seed_entropy
from ._core import Stream, as_stream

__all__ = ["Mix", "Sample", "load_by_random_id", "mix", "sample"]

_BLOCK = 1024
_SAMPLE_STREAM, _MIX_STREAM = 0x73616D70, 0x6D697820  # keep draws apart from stages' item RNGs
_END = object()


class _Uniforms:
    """Uniform draws in [0, 1) by position: block ``b`` comes from ``(entropy, stream, b)``."""

    def __init__(self, entropy: int, stream: int) -> None:
        self.entropy, self._stream = entropy, stream
        self._block, self._values = -1, np.empty(0)

    def take(self, position: int, n: int) -> np.ndarray:
        pieces = []
        while n > 0:
            block, offset = divmod(position, _BLOCK)
            if block != self._block:
                sequence = np.random.SeedSequence(self.entropy, spawn_key=(self._stream, block))
                self._block = block
                self._values = np.random.Generator(np.random.PCG64(sequence)).random(_BLOCK)
            piece = self._values[offset:offset + n]
            pieces.append(piece)
            position, n = position + len(piece), n - len(piece)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


class _Chooser:
    """Indices drawn in proportion to weights (uniformly without them); zero weights never."""

    def __init__(self, count: int, weights: Any, name: str) -> None:
        self.count = count
        self.cumulative = None if weights is None else np.cumsum(_check_weights(weights, count, name))
        self.last = count - 1 if weights is None else int(np.flatnonzero(np.asarray(weights) > 0)[-1])

    def indices(self, uniforms: np.ndarray) -> list:
        if self.cumulative is None:
            chosen = (uniforms * self.count).astype(np.int64)
        else:
            chosen = np.searchsorted(self.cumulative, uniforms * self.cumulative[-1], side="right")
        # rounding can reach one past the last element with a positive weight
        return np.minimum(chosen, self.last).tolist()


def _check_weights(weights: Any, count: int, name: str) -> np.ndarray:
    try:
        values = np.asarray(weights, dtype=float)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a sequence of numbers; got {name}={weights!r}") from error
    if values.ndim != 1 or len(values) != count:
        raise ValueError(f"{name} must hold one weight per element: {count}; "
                         f"got {values.size} ({name}={weights!r})")
    if not np.isfinite(values).all() or (values < 0).any() or not values.sum() > 0:
        raise ValueError(f"{name} must be finite, non-negative and not all zero; "
                         f"got {name}={weights!r}")
    return values


class Sample(Stream):
    """The stream that :func:`sample` and :func:`load_by_random_id` return.

    ``position`` counts the items delivered; :meth:`state_dict` and :meth:`load_state_dict`
    save and restore it, with the seed. Closing a sample releases nothing, and it can be read
    on afterwards (as a dpipe generator can).

    >>> s = sample([10, 20], random_state=0)
    >>> _ = s.pull(3)
    >>> s.position
    3
    """

    def __init__(self, sequence: Sequence, weights: Any, random_state: Seed | None,
                 loaders: tuple = (), name: str = "sample") -> None:
        try:
            count = len(sequence)
        except TypeError as error:
            raise TypeError(f"sequence must be a sized sequence; got {sequence!r}") from error
        if count == 0:
            raise ValueError("sequence must not be empty")
        super().__init__(None, f"{name}({count} elements)")
        self._sequence, self._loaders = sequence, loaders
        self._chooser = _Chooser(count, weights, "weights")
        # None gives fresh entropy, which state_dict() records
        self._uniforms = _Uniforms(seed_entropy(random_state), _SAMPLE_STREAM)
        self._drawn = 0

    @property
    def position(self) -> int:
        """How many items this stream has delivered."""
        return self._drawn - self.read_ahead

    def state_dict(self) -> dict:
        """The seed and the position, to continue this stream elsewhere.

        >>> a = sample(range(100), random_state=3)
        >>> _ = [next(a) for _ in range(5)]
        >>> b = sample(range(100))
        >>> b.load_state_dict(a.state_dict())
        >>> [next(a) for _ in range(3)] == [next(b) for _ in range(3)]
        True
        """
        return {"seed": self._uniforms.entropy, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict`."""
        self._uniforms = _Uniforms(int(state["seed"]), _SAMPLE_STREAM)
        self._drawn = int(state["position"])
        self.discard_read_ahead()

    def _pull(self, n: int) -> list:
        sequence = self._sequence
        ids = [sequence[i] for i in self._chooser.indices(self._uniforms.take(self._drawn, n))]
        if not self._loaders:
            self._drawn += n
            return ids
        items: list = []
        try:
            items.extend(map(self._load, ids))
        except Exception as error:
            self._drawn += len(items) + 1  # the id that failed is used up
            if not self.defer_error(error, items):
                raise
            return items
        self._drawn += n
        return items

    def _load(self, key: Any) -> Any:
        loaders = self._loaders
        return loaders[0](key) if len(loaders) == 1 else tuple(load(key) for load in loaders)

    def close(self) -> None:
        """Nothing to release: a sample goes on where it was."""


def sample(sequence: Sequence, weights: Sequence[float] | None = None,
           random_state: Seed | None = None) -> Sample:
    """An infinite stream of elements of ``sequence``, drawn at random with probabilities
    proportional to ``weights`` (uniform without them). Elements of weight zero are never drawn.

    ``random_state`` is an ``int``, a ``numpy.random.Generator``, a ``SeedSequence``, a
    ``RandomState`` (one number is drawn from it) or None (fresh entropy). Bad weights (wrong
    length, negative, NaN, all zero) raise ``ValueError`` here, not at the first ``next()``.

    >>> s = sample(["a", "b"], weights=[0, 1])
    >>> next(s), next(s)
    ('b', 'b')
    >>> sample("ab", weights=[1, -1])
    Traceback (most recent call last):
    ...
    ValueError: weights must be finite, non-negative and not all zero; got weights=[1, -1]
    """
    return Sample(sequence, weights, random_state)


def load_by_random_id(*loaders: Callable, ids: Sequence, weights: Sequence[float] | None = None,
                      random_state: Seed | None = None) -> Sample:
    """An infinite stream of what ``loaders`` make of ids drawn by :func:`sample`: the bare
    value for one loader, a tuple for several. The id itself is not included.

    >>> s = load_by_random_id(str.upper, len, ids=["ab"], random_state=0)
    >>> next(s)
    ('AB', 2)
    """
    if not loaders:
        raise TypeError("load_by_random_id needs at least one loader")
    for position, load in enumerate(loaders):
        check_callable(f"loaders[{position}]", load)
    return Sample(ids, weights, random_state, loaders, name="load_by_random_id")


class Mix(Stream):
    """The stream that :func:`mix` returns.

    >>> isinstance(mix([1], [2]), Mix)
    True
    """

    def __init__(self, sources: tuple, weights: Any, seed: Seed | None, until: str) -> None:
        if not sources:
            raise TypeError("mix needs at least one source")
        check_choice("until", until, ("first", "all"))
        super().__init__(None, f"mix({len(sources)} sources)")
        self._sources = [as_stream(source) for source in sources]
        for source in self._sources:
            self.reads(source)
        self._weights = np.array(_check_weights(
            [1] * len(sources) if weights is None else weights, len(sources), "weights"))
        self._chooser = _Chooser(len(sources), self._weights, "weights")
        self._uniforms = _Uniforms(seed_entropy(seed), _MIX_STREAM)
        self._drawn, self._until = 0, until

    def _pull(self, n: int) -> list:
        items: list = []
        while len(items) < n and self._chooser is not None:
            uniforms = self._uniforms.take(self._drawn, n - len(items))
            self._drawn += len(uniforms)
            for k in self._chooser.indices(uniforms):
                item = next(self._sources[k], _END)
                if item is _END:
                    self._exhausted(k)
                    break
                items.append(item)
        return items

    def _exhausted(self, k: int) -> None:
        self._weights[k] = 0
        if self._until == "first" or not self._weights.any():
            self._chooser = None
        else:
            self._chooser = _Chooser(len(self._weights), self._weights, "weights")

    def start(self) -> Mix:
        """Start the background work of the sources now (see :meth:`fpipe.Stream.start`)."""
        for source in self._sources:
            source.start()
        return self

    def _close(self) -> None:
        for source in self._sources:
            source.close()


def mix(*sources: Iterable, weights: Sequence[float] | None = None, seed: Seed | None = None,
        until: str = "first") -> Mix:
    """Interleave ``sources`` at random, each next item taken from source ``k`` with
    probability proportional to ``weights[k]`` (equal without weights), reproducibly for a seed.

    When a finite source runs out: with ``until="first"`` (the default) the mix ends, so the
    proportions hold to the end; with ``until="all"`` that source drops out, the others go on
    in proportion to their weights, and the mix ends with the last of them. Closing the mix
    closes its sources.

    >>> list(mix("aaaa", "bb", seed=1))
    ['a', 'a', 'b', 'a', 'b']
    >>> sorted(mix("aaaa", "bb", seed=1, until="all"))
    ['a', 'a', 'a', 'a', 'b', 'b']
    """
    return Mix(sources, weights, seed, until)
