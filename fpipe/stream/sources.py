"""Sources: infinite, seeded streams to start a pipeline with.

:func:`sample` draws elements of a sequence at random (by weight), :func:`load_by_random_id`
loads what the drawn ids name, and :func:`mix` interleaves several sources at random, in
proportion to their weights. They are :class:`fpipe.Stream` objects, so they pass whole chunks
to the next stage, and their place can be saved and restored (``state_dict()``).

Two kinds of draws, chosen by the argument that seeds them:

- ``random_state=`` an ``int`` or a ``numpy.random.RandomState`` (dpipe's argument): dpipe's
  stream, item for item. One ``random_sample()`` of that ``RandomState`` is drawn per item, in
  order, so a restored position carries the generator's state (624 numbers).
- ``seed=`` (any seed: ``int``, ``Generator``, ``SeedSequence``, ``RandomState``), or a
  ``Generator`` or ``SeedSequence`` given as ``random_state``, or nothing (fresh entropy):
  fpipe's counter-based draws. Draw ``i`` of epoch ``e`` is a function of ``(seed, e, i)``, so
  the state is a few counters and any position is reached in O(1), without replay.

>>> from toolz import pipe
>>> from fpipe import batch, take
>>> list(pipe(sample("abc", weights=[1, 0, 1], random_state=0), batch(4), take(2)))
[['c', 'c', 'c', 'c'], ['a', 'c', 'a', 'c']]
>>> list(pipe(sample("abc", weights=[1, 0, 1], seed=0), batch(4), take(2)))
[['c', 'c', 'a', 'c'], ['a', 'a', 'a', 'c']]

Weights may follow a schedule: a list of ``(step, weights)``, each in force from its step on,
or a function of the step (the position of the item in the stream) that returns the weights.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np

from fpipe.errors import check_bool, check_callable, check_choice, check_integer, check_state, state_header
from fpipe.random import Seed, seed_entropy
from fpipe.stream._draws import Counted, Schedule, Sequential, rng_state
from fpipe.stream.core import Stream, as_stream

__all__ = ["Mix", "Sample", "load_by_random_id", "mix", "sample"]

# fixed weights, a list of (step, weights), or a function of the step
Weights = Union[Sequence[float], Sequence[tuple], Callable[[int], Sequence[float]], None]

_SAMPLE_STREAM, _MIX_STREAM = 0x73616D70, 0x6D697820  # keep draws apart from stages' item RNGs
_MIX_FIELDS = ("seed", "epoch", "position", "at", "taken", "alive", "ended", "sources")
_END = object()


def _draws(random_state: Seed | None, seed: Seed | None, epoch: Any, stream: int,
           ) -> Counted | Sequential:
    """dpipe's sequential stream for an int or ``RandomState`` given as ``random_state``,
    counter-based draws otherwise."""
    epoch = check_integer("epoch", epoch, 0)
    if random_state is not None and seed is not None:
        raise TypeError(f"give random_state (dpipe's stream) or seed (counter-based draws), not "
                        f"both; got random_state={random_state!r}, seed={seed!r}")
    legacy = isinstance(random_state, np.random.RandomState) or (
        isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool))
    if not legacy:
        if not isinstance(random_state, (np.random.Generator, np.random.SeedSequence, type(None))):
            raise TypeError(f"random_state must be an int, RandomState, Generator or "
                            f"SeedSequence; got random_state={random_state!r}")
        return Counted(seed_entropy(random_state if seed is None else seed), stream, epoch)
    if epoch:
        raise ValueError(f"epoch numbers the counter-based draws of seed=; dpipe's stream of "
                         f"random_state={random_state!r} has none; got epoch={epoch}")
    if isinstance(random_state, np.random.RandomState):
        return Sequential(random_state)
    if not 0 <= random_state < 2 ** 32:
        raise ValueError(f"random_state must be in [0, 2**32) (a RandomState seed); "
                         f"got random_state={random_state!r}")
    return Sequential(np.random.RandomState(int(random_state)))


class Sample(Stream):
    """The stream that :func:`sample` and :func:`load_by_random_id` return.

    ``position`` counts the items delivered; :meth:`state_dict` and :meth:`load_state_dict`
    save and restore it, with the seed (or dpipe's ``RandomState`` state). Closing a sample
    releases nothing, and it can be read on afterwards (as a dpipe generator can). With
    dpipe's stream, ``next()`` draws exactly one number per item, as dpipe does.

    >>> s = sample([10, 20], random_state=0)
    >>> _ = s.pull(3)
    >>> s.position
    3
    """

    def __init__(self, sequence: Sequence, weights: Weights, random_state: Seed | None,
                 loaders: tuple = (), name: str = "sample", seed: Seed | None = None,
                 epoch: int = 0) -> None:
        try:
            count = len(sequence)
        except TypeError as error:
            raise TypeError(f"sequence must be a sized sequence; got {sequence!r}") from error
        if count == 0:
            raise ValueError("sequence must not be empty")
        super().__init__(None, f"{name}({count} elements)")
        self._sequence, self._loaders = sequence, loaders
        self._schedule = Schedule(weights, count, "weights")
        # None gives fresh entropy, which state_dict() records
        self._draws = _draws(random_state, seed, epoch, _SAMPLE_STREAM)
        self._drawn = 0

    @property
    def position(self) -> int:
        """How many items this stream has delivered."""
        return self._drawn - self.read_ahead

    def __next__(self) -> Any:
        if not self._draws.sequential:
            return super().__next__()
        items = self.pull(1)  # no read-ahead: dpipe's RandomState moves one draw per item
        if not items:
            raise StopIteration
        return items[0]

    def state_dict(self) -> dict:
        """Where this stream stands: the seed, the epoch and the position (or the state of
        dpipe's ``RandomState``), to continue it elsewhere, with what it draws from: the
        length of the sequence and a digest of its weights. A plain dict of constant size.

        >>> a = sample(range(100), random_state=3)
        >>> _ = [next(a) for _ in range(5)]
        >>> b = sample(range(100))
        >>> b.load_state_dict(a.state_dict())
        >>> [next(a) for _ in range(3)] == [next(b) for _ in range(3)]
        True
        >>> sample("ab", seed=3).state_dict()
        {'type': 'Sample', 'version': 1, 'length': 2, 'weights': 'uniform', 'seed': 3, 'epoch': 0, \
'position': 0}
        """
        header = {**state_header("Sample"), **self._settings()}
        if self._draws.sequential:
            return {**header, "random_state": self._draws.state(), "at": self._drawn,
                    "position": self._drawn}
        return {**header, **self._draws.state(), "position": self.position}

    def _settings(self) -> dict:
        return {"length": len(self._sequence), "weights": self._schedule.fingerprint()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` of a sample of a sequence of the same length
        with the same weights (anything else raises a ``ValueError`` naming the difference,
        and changes nothing). A ``position`` past the saved one moves on that many items (in
        O(1) for counter-based draws; dpipe's stream draws and drops the numbers, without
        loading). dpipe's state is loaded into this sample's ``RandomState``, which is the
        caller's if one was given.

        >>> sample(range(3), seed=0).load_state_dict(sample(range(4), seed=0).state_dict())
        Traceback (most recent call last):
        ...
        ValueError: state is of a Sample with length=4; this one has length=3
        """
        self.state_loader(state)()

    def state_loader(self, state: Any, name: str = "state") -> Callable[[], None]:
        """Check ``state`` (called ``name`` in messages) all through, changing nothing, and
        return the function that loads it: so a mix or an :class:`fpipe.Infinite` loads all
        the states it holds or none.

        >>> s = sample("abc", seed=1)
        >>> load = s.state_loader(sample("abc", seed=2).state_dict())
        >>> load()
        >>> s.state_dict()["seed"]
        2
        """
        dpipe = isinstance(state, Mapping) and "random_state" in state
        fields = ("random_state", "at", "position") if dpipe else ("seed", "epoch", "position")
        check_state(state, "Sample", fields, self._settings(), old_keys=fields, name=name)
        position = check_integer(f"{name}['position']", state["position"], 0)
        if not dpipe:
            return functools.partial(self._load_counted,
                                     Counted.of_state(state, _SAMPLE_STREAM, name), position)
        at = check_integer(f"{name}['at']", state["at"], 0)
        if position < at:
            raise ValueError(f"dpipe's stream cannot go back: {name}['position']={position} is "
                             f"before {name}['at']={at}")
        random_state = rng_state(state["random_state"], f"{name}['random_state']")
        return functools.partial(self._load_sequential, random_state, at, position)

    def _load_counted(self, draws: Counted, position: int) -> None:
        self.discard_read_ahead()
        self._draws, self._drawn = draws, position

    def _load_sequential(self, random_state: dict, at: int, position: int) -> None:
        self.discard_read_ahead()
        if not self._draws.sequential:
            self._draws = Sequential(np.random.RandomState())
        self._draws.load(random_state)
        self._draws.advance(position - at)
        self._drawn = position

    def _pull(self, n: int) -> list:
        if self._draws.sequential and (self._loaders or n == 1):
            return self._in_turn(n)
        sequence, step = self._sequence, self._drawn
        indices, _ = self._schedule.choose(step, n, functools.partial(self._draws.take, step))
        ids = [sequence[i] for i in indices.tolist()]
        if not self._loaders:
            self._drawn += n
            return ids
        items: list = []
        try:
            items.extend(map(self._load, ids))
        except BaseException as error:
            self._drawn += len(items) + 1  # the id that failed is used up
            if not self.defer_error(error, items):
                raise
            return items
        self._drawn += n
        return items

    def _in_turn(self, n: int) -> list:
        """Draw an id and load it, one at a time, as dpipe does: after a failed load, the
        caller's ``RandomState`` has made one draw per id used, the failed one included.
        (Also the quick way to draw one item.)"""
        items: list = []
        random_state, sequence = self._draws.random_state, self._sequence
        try:
            for _ in range(n):
                chooser = self._schedule.chooser_at(self._drawn)
                key = sequence[chooser.index(random_state.random_sample())]
                self._drawn += 1
                items.append(self._load(key) if self._loaders else key)
        except BaseException as error:
            if not self.defer_error(error, items):
                raise
        return items

    def _load(self, key: Any) -> Any:
        loaders = self._loaders
        try:
            return loaders[0](key) if len(loaders) == 1 else tuple(load(key) for load in loaders)
        except StopIteration as stop:  # would end the stream as if it had run out
            raise RuntimeError(f"a loader raised StopIteration on id {key!r}") from stop

    def close(self) -> None:
        """Nothing to release: a sample goes on where it was."""


def sample(sequence: Sequence, weights: Weights = None, random_state: Seed | None = None, *,
           seed: Seed | None = None, epoch: int = 0) -> Sample:
    """An infinite stream of elements of ``sequence``, drawn at random with probabilities
    proportional to ``weights`` (uniform without them). Elements of weight zero are never drawn.

    ``random_state``, an ``int`` or a ``numpy.random.RandomState``, gives dpipe 0.5.0's stream
    item for item; a ``RandomState`` is the caller's: it advances by one draw per item, as with
    dpipe. ``seed`` (or a ``Generator``/``SeedSequence`` as ``random_state``, or neither: fresh
    entropy) gives counter-based draws: item ``i`` depends on ``(seed, epoch, i)`` alone, so
    another ``epoch`` gives other draws, and a restored position costs O(1). Give one of the two.

    ``weights`` may be fixed, a list of ``(step, weights)`` (each in force from its step on;
    the first step is 0), or a function of the step; a step is the position of the item in
    the stream. Bad weights (wrong length, negative, NaN, all zero) raise ``ValueError`` here
    (a function's, when it is called).

    >>> s = sample(["a", "b"], weights=[0, 1])
    >>> next(s), next(s)
    ('b', 'b')
    >>> sample(range(10), random_state=1).pull(6)
    [4, 7, 0, 3, 1, 0]
    >>> sample("ab", weights=[(0, [1, 0]), (3, [0, 1])], seed=0).pull(5)
    ['a', 'a', 'a', 'b', 'b']
    >>> sample("ab", weights=[1, -1])
    Traceback (most recent call last):
    ...
    ValueError: weights must be finite, non-negative and not all zero; got weights=[1, -1]
    """
    return Sample(sequence, weights, random_state, seed=seed, epoch=epoch)


def load_by_random_id(*loaders: Callable, ids: Sequence, weights: Weights = None,
                      random_state: Seed | None = None, seed: Seed | None = None,
                      epoch: int = 0) -> Sample:
    """An infinite stream of what ``loaders`` make of ids drawn by :func:`sample` (with the same
    ``weights``, ``random_state``, ``seed`` and ``epoch``): the bare value for one loader, a
    tuple for several. The id itself is not included. With ``random_state`` the ids are
    dpipe's.

    >>> s = load_by_random_id(str.upper, len, ids=["ab"], random_state=0)
    >>> next(s)
    ('AB', 2)
    """
    if not loaders:
        raise TypeError("load_by_random_id needs at least one loader")
    for position, load in enumerate(loaders):
        check_callable(f"loaders[{position}]", load)
    return Sample(ids, weights, random_state, loaders, name="load_by_random_id", seed=seed,
                  epoch=epoch)


def _indexed(source: Any) -> bool:
    """Whether the mix reads ``source`` by index (so its place is a count) rather than as a
    stream."""
    return not isinstance(source, Stream) and isinstance(source, (Sequence, np.ndarray))


class Mix(Stream):
    """The stream that :func:`mix` returns.

    ``position`` counts the items delivered. :meth:`state_dict` holds the seed, the epoch,
    the position, how many items each source gave, and the state of each source that is a
    stream (sequences need none: the mix reads them by index). A mix does not read ahead of its
    consumer, so its sources' states are those of the items delivered.

    >>> m = mix([1, 2, 3], [4, 5], seed=0)
    >>> isinstance(m, Mix), m.pull(2), m.position
    (True, [4, 1], 2)
    """

    def __init__(self, sources: tuple, weights: Weights, seed: Seed | None, until: str,
                 epoch: int = 0) -> None:
        if not sources:
            raise TypeError("mix needs at least one source")
        check_choice("until", until, ("first", "all", "never"))
        super().__init__(None, f"mix({len(sources)} sources)")
        self._sources = [source if _indexed(source) else as_stream(source) for source in sources]
        for k, source in enumerate(self._sources):
            if isinstance(source, Stream):
                self.reads(source)
                if until == "never":
                    raise ValueError(f"until='never' starts each source again, so each must be a "
                                     f"sequence; got sources[{k}]={sources[k]!r}")
            elif until == "never" and len(source) == 0:
                raise ValueError(f"until='never' needs sources that are not empty; "
                                 f"sources[{k}] is")
        count = len(sources)
        self._schedule = Schedule([1] * count if weights is None else weights, count, "weights")
        self._draws = Counted(seed_entropy(seed), _MIX_STREAM, check_integer("epoch", epoch, 0))
        self._until, self._position, self._taken = until, 0, [0] * count
        self._alive, self._ended = np.ones(count, bool), False

    @property
    def position(self) -> int:
        """How many items this mix has delivered."""
        return self._position

    def __next__(self) -> Any:
        items = self.pull(1)  # no read-ahead: the sources' states stay those of the items delivered
        if not items:
            raise StopIteration
        return items[0]

    def _pull(self, n: int) -> list:
        items: list = []
        self._run(n, items)
        return items

    def _run(self, n: int, items: list | None) -> int:
        """Take ``n`` items (fewer at the end), appended to ``items``; None skips them: a
        sequence is not read then. Returns how many were taken."""
        taken = 0
        while taken < n and not self._ended:
            step = self._position
            chosen, complete = self._schedule.choose(
                step, n - taken, functools.partial(self._draws.take, step), self._alive)
            for k in chosen.tolist():
                item = self._take(k, items is not None)
                if item is _END:
                    self._source_ended(k)
                    break  # the same draw chooses again among the sources left
                if items is not None:
                    items.append(item)
                self._position, taken = self._position + 1, taken + 1
            else:
                self._ended = not complete
        return taken

    def _take(self, k: int, keep: bool) -> Any:
        source = self._sources[k]
        if isinstance(source, Stream):
            item = next(source, _END)
        else:
            index, length = self._taken[k], len(source)
            if index >= length and self._until != "never":
                return _END
            item = source[index % length] if keep else None
        self._taken[k] += 1
        return item

    def _source_ended(self, k: int) -> None:
        self._alive[k] = False
        if self._until == "first":
            self._ended = True

    def state_dict(self) -> dict:
        """Where this mix stands: a plain dict of a few counters, and the states of the
        sources that are streams (they need ``state_dict()``; a sequence needs nothing), with
        what shapes the mix: ``until``, the weights, and the lengths of the sequences.

        >>> a = mix(range(100), range(100, 200), weights=[3, 1], seed=5)
        >>> _ = a.pull(10)
        >>> b = mix(range(100), range(100, 200), weights=[3, 1])
        >>> b.load_state_dict(a.state_dict())
        >>> a.pull(5) == b.pull(5)
        True
        """
        sources = []
        for k, source in enumerate(self._sources):
            if not isinstance(source, Stream):
                sources.append(None)
            elif callable(getattr(source, "state_dict", None)):
                sources.append(source.state_dict())
            else:
                raise TypeError(f"a mix's state needs sources that are sequences or have "
                                f"state_dict(); got sources[{k}]={source!r}")
        return {**state_header("Mix"), **self._settings(), **self._draws.state(),
                "position": self._position, "at": self._position, "taken": list(self._taken),
                "alive": self._alive.tolist(), "ended": self._ended, "sources": sources}

    def _settings(self) -> dict:
        return {"until": self._until, "weights": self._schedule.fingerprint(),
                "lengths": [None if isinstance(source, Stream) else len(source)
                            for source in self._sources]}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` of a mix built the same way: as many sources,
        sequences of the same lengths, the same weights and ``until`` (anything else raises a
        ``ValueError`` naming the difference, and changes nothing, in the mix or its sources).
        A ``position`` past ``at`` (the saved place) moves on that many items: sequences are
        not read for it, streams are."""
        self.state_loader(state)()

    def state_loader(self, state: Any, name: str = "state") -> Callable[[], None]:
        """Check ``state`` all through, the sources' states included, changing nothing, and
        return the function that loads it (see :meth:`Sample.state_loader`).

        >>> m = mix("ab", "cd", seed=0)
        >>> m.state_loader({**m.state_dict(), "ended": "no"})
        Traceback (most recent call last):
        ...
        TypeError: state['ended'] must be True or False; got state['ended']='no'
        """
        check_state(state, "Mix", _MIX_FIELDS, self._settings(), old_keys=_MIX_FIELDS, name=name)
        draws = Counted.of_state(state, _MIX_STREAM, name)
        at = check_integer(f"{name}['at']", state["at"], 0)
        position = check_integer(f"{name}['position']", state["position"], 0)
        if position < at:
            raise ValueError(f"{name}['position'] must not be before {name}['at']; got "
                             f"position={position}, at={at}")
        taken = self._checked_taken(state["taken"], f"{name}['taken']")
        alive = np.array(self._per_source(state["alive"], f"{name}['alive']", check_bool), bool)
        ended = check_bool(f"{name}['ended']", state["ended"])
        sources = self._source_loaders(state["sources"], f"{name}['sources']")

        def load() -> None:
            for load_source in sources:  # another kind of stream first: it may still refuse
                load_source()
            self._draws, self._position, self._taken = draws, at, taken
            self._alive, self._ended = alive, ended
            self._run(position - at, None)
        return load

    def _per_source(self, values: Any, name: str, check: Callable[[str, Any], Any]) -> list:
        if not isinstance(values, (list, tuple)) or len(values) != len(self._sources):
            raise TypeError(f"{name} must be a list of one value per source "
                            f"({len(self._sources)}); got {values!r:.120}")
        return [check(f"{name}[{k}]", value) for k, value in enumerate(values)]

    def _checked_taken(self, taken: Any, name: str) -> list[int]:
        counts = self._per_source(taken, name, lambda where, value: check_integer(where, value, 0))
        for k, (count, source) in enumerate(zip(counts, self._sources)):
            if self._until != "never" and not isinstance(source, Stream) and count > len(source):
                raise ValueError(f"{name}[{k}] must be at most the length of sources[{k}], "
                                 f"{len(source)}; got {count}")
        return counts

    def _source_loaders(self, states: Any, name: str) -> list[Callable[[], None]]:
        """What loads each source that is a stream, checked where it can be (a sample or a
        mix); the loads of other streams come first."""
        self._per_source(states, name, lambda where, value: value)
        checked, other = [], []
        for k, (source, saved) in enumerate(zip(self._sources, states)):
            if not isinstance(source, Stream):
                if saved is not None:
                    raise ValueError(f"{name}[{k}] must be None: sources[{k}] is a sequence, "
                                     f"read by index; got {saved!r:.120}")
            elif isinstance(source, (Sample, Mix)):
                checked.append(source.state_loader(saved, f"{name}[{k}]"))
            else:
                other.append(functools.partial(source.load_state_dict, saved))
        return other + checked

    def start(self) -> Mix:
        """Start the background work of the sources now (see :meth:`fpipe.Stream.start`)."""
        for source in self._sources:
            if isinstance(source, Stream):
                source.start()
        return self

    def close(self) -> None:
        """Close the sources that are streams. A mix whose sources go on after closing
        (sequences, samples, mixes) goes on too, as a sample does: so
        :class:`fpipe.Infinite` can start it again where it was."""
        for source in self._sources:
            if isinstance(source, Stream):
                source.close()


def mix(*sources: Iterable, weights: Weights = None, seed: Seed | None = None,
        until: str = "first", epoch: int = 0) -> Mix:
    """Interleave ``sources`` at random: item ``i`` comes from source ``k`` with probability
    proportional to the weight of ``k`` at step ``i`` (equal without weights). The choice is a
    function of ``(seed, epoch, i)`` (and of which sources have ended), so a mix resumes in O(1)
    from its :meth:`Mix.state_dict`, and each ``epoch`` draws anew. Each source keeps its order.

    ``weights`` may be fixed, a list of ``(step, weights)`` or a function of the step, as for
    :func:`sample`. A sequence (list, range, array) is read by index; any other iterable as a
    stream. When a source runs out: with ``until="first"`` (the default) the mix ends, so the
    proportions hold to the end; with ``until="all"`` that source drops out, the others go on
    in proportion to their weights, and the mix ends with the last of them (or when the weights
    in force leave none); with ``until="never"`` (sequences only) it starts again, and the mix
    never ends.

    **Datasets of different lengths.** Source ``k`` gives a share ``w_k / sum(w)`` of the
    items, so over ``N`` items it goes through ``N * w_k / (sum(w) * len_k)`` of its epochs.
    To go through each dataset at the same pace (a shuffled concatenation), make the weights
    the lengths; to see a small dataset twice per pass over a large one, give it twice its
    length as weight.

    >>> list(mix("aaaa", "bb", seed=2))
    ['b', 'a', 'a', 'a', 'b', 'a']
    >>> list(mix("aaaa", "bb", seed=1))  # "bb" has run out
    ['b', 'a', 'b']
    >>> sorted(mix("aaaa", "bb", seed=1, until="all"))
    ['a', 'a', 'a', 'a', 'b', 'b']
    >>> mix("ab", "xyz", weights=[2, 3], until="never", seed=0).pull(10)
    ['x', 'a', 'b', 'y', 'z', 'x', 'y', 'z', 'x', 'y']
    """
    return Mix(sources, weights, seed, until, epoch)
