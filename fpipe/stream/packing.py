"""Variable-length data: batches within a token budget, batches by length bucket, and packing.

Three stages regroup a stream of samples of different lengths:

* :func:`batch_by_tokens` makes batches whose padded size (longest sample times count) stays
  within a budget of tokens, from samples sorted by length within a bounded look-ahead;
* :func:`bucket_by_length` batches samples of similar length, bucket by bucket (tf.data's
  ``bucket_by_sequence_length``);
* :func:`pack` packs samples into rows of exactly ``length`` tokens, with the segment ids and
  positions that attention masks and position embeddings need.

>>> import numpy as np
>>> from toolz import pipe
>>> samples = [np.arange(n) for n in (3, 5, 2, 6)]
>>> [ids.tolist() for _, ids, _ in pipe(samples, pack(8))]
[[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 2, 2, 2, 2, 2, 2]]

Each is deterministic (for a seed, where it draws) and keeps no state across applications
beyond the epoch, so the output does not depend on how many workers made its input, as long
as they keep its order. The stream a stage returns saves its place with ``state_dict()``, a
small dict of integers that names the input items it holds, not the items themselves; the
stage's ``load_state_dict(state)`` makes its next application carry on from that place exactly.

The three share the regrouping stream (the first section of this module): a stage supplies a
:class:`Grouper`, the algorithm of one application, which takes input items one by one and
makes outputs, each with its *recipe*, the input indices (and spans) that it is made of. The
stream keeps the recipes of what it holds, so that ``state_dict()`` names input items rather
than holding them, and a resumed stream rebuilds its place from the same items. A state records
the stage's settings, and loads only into a stage built the same way; it is checked whole
before the stage changes.
"""

from __future__ import annotations

import abc
import bisect
import collections
import copy
import numbers
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fpipe.errors import check_bool, check_callable, check_choice, check_integer, check_state
from fpipe.random import Seed, seed_entropy
from fpipe.stream.core import Stage, Stream, as_stream

__all__ = ["batch_by_tokens", "bucket_by_length", "pack"]

# --- the regrouping stream and its state, which the stages below share ---------------------


_CHUNK = 64  # input items read at a time
_SKIP_CHUNK = 1024  # input items read at a time while a resumed stream finds its place
_PRUNE_AT = 256  # input items a stream keeps at least before it forgets those it no longer needs
_STATE_KEYS = frozenset({"type", "seed", "epoch", "settings", "position", "consumed", "open",
                         "ready"})


class Grouper(abc.ABC):
    """The algorithm of one application: it takes input items one by one and makes outputs,
    each with its *recipe*, the input indices (and spans) that it is made of. ``open_recipes``
    describes what it holds, so that a resumed stream can rebuild it from the same items."""

    @abc.abstractmethod
    def feed(self, index: int, item: Any, out: list) -> None:
        """Take input item ``index``; append the ``(recipe, output)`` pairs it completes to ``out``."""

    @abc.abstractmethod
    def finish(self, out: list) -> None:
        """The input has ended: append what is still held to ``out``."""

    @abc.abstractmethod
    def open_recipes(self) -> list:
        """The recipes of what is held, in an order that :meth:`restore` rebuilds."""

    @abc.abstractmethod
    def restore(self, recipes: list, items: dict) -> None:
        """Hold again what ``recipes`` (from :meth:`open_recipes`) name; ``items`` by input index."""

    @abc.abstractmethod
    def build(self, recipe: list, items: dict) -> Any:
        """The output that ``recipe`` names, made of ``items`` (by input index)."""

    @staticmethod
    def indices(recipe: list) -> Iterable[int]:
        """The input indices that ``recipe`` names."""
        return recipe


class Regrouped(Stream):
    """The stream of a regrouping stage: it reads chunks of its input, feeds them to its
    grouper, and hands out the outputs; it knows which input items the outputs not handed out
    yet, and the grouper's open groups, are made of (:meth:`state_dict`)."""

    def __init__(self, upstream: Stream, name: str, grouper: Grouper, place: dict,
                 start: int, resume: dict | None) -> None:
        super().__init__(upstream, name)
        self._grouper, self._place = grouper, place  # place: type, seed, epoch
        self._index = start  # the input index of the next item read
        self._resume = resume
        self._made: collections.deque = collections.deque()  # (recipe, output), not pulled yet
        self._pulled: list = []  # the recipes of the last pull, for the items next() holds
        self._ended = False
        self._kept: dict = {}  # the input items that what is held or made is made of, by index
        self._prune_at = _PRUNE_AT  # how many kept items make _forget prune them

    def _pull(self, n: int) -> list:
        if self._resume is not None:
            self._restore(self._resume)
        made = self._made
        while not made and not self._ended:
            self._read()
        count = min(n, len(made))
        pulled = [made.popleft() for _ in range(count)]
        self._pulled = [recipe for recipe, _ in pulled]
        return [output for _, output in pulled]

    def _read(self) -> None:
        out: list = []
        try:
            chunk = self.pull_upstream(_CHUNK)
            if not chunk:
                self._ended = True
                self._grouper.finish(out)
            feed, index, kept = self._grouper.feed, self._index, self._kept
            for item in chunk:
                kept[index] = item
                feed(index, item, out)
                index += 1
                self._index = index
        except BaseException as error:
            self._made.extend(out)
            if not self.defer_error(error, self._made):
                raise
            self._ended = True  # the error is raised after the outputs made before it
            return
        self._made.extend(out)
        if len(self._kept) > self._prune_at:
            self._forget()

    def _forget(self) -> None:
        """Keep only the input items of what is held and made (the chain's state holds them),
        and prune again once twice as many are kept: a constant cost per item."""
        indices = self._grouper.indices
        needed = {i for recipe in self._grouper.open_recipes() for i in indices(recipe)}
        needed.update(i for recipe, _ in self._made for i in indices(recipe))
        kept = self._kept
        self._kept = {i: kept[i] for i in needed if i in kept}
        self._prune_at = max(_PRUNE_AT, 2 * len(self._kept))

    def _own_state(self) -> dict:
        # next()'s read-ahead is held by the base class; the outputs made and the open groups
        # are named by recipes, with the input items they are made of
        if self._resume is not None:
            raise TypeError(f"{self.name} was resumed from a stage's state and has not found its "
                            "place yet: save its state after its first item")
        self._forget()
        opened = self._grouper.open_recipes()
        ready = [recipe for recipe, _ in self._made]
        return copy.deepcopy({**self._place, "index": self._index, "ended": self._ended,
                              "open": opened, "ready": ready,
                              "items": [[i, self._kept[i]] for i in sorted(self._kept)]})

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        keys = {*self._place, "index", "ended", "open", "ready", "items"}
        if not isinstance(own, dict) or set(own) != keys:
            raise TypeError(f"{name} must be the dict of a {self.name} stream's state; got "
                            f"{own!r:.120}")
        for key, value in self._place.items():
            if own[key] != value:
                raise ValueError(f"{name} is of a stream with {key}={own[key]!r:.80}; this one "
                                 f"has {key}={value!r:.80}")
        index = check_integer(f"{name}['index']", own["index"], 0)
        if not isinstance(own["items"], list) or not all(
                isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int
                for pair in own["items"]):
            raise TypeError(f"{name}['items'] must be a list of [index, item]; got "
                            f"{own['items']!r:.80}")
        items = dict(copy.deepcopy(own["items"]))
        indices = self._grouper.indices
        for part in ("open", "ready"):
            if not isinstance(own[part], list):
                raise TypeError(f"{name}[{part!r}] must be a list of recipes; got {own[part]!r:.80}")
            for recipe in own[part]:
                if any(i not in items for i in indices(recipe)):
                    raise ValueError(f"{name}[{part!r}] names items that {name}['items'] lacks: "
                                     f"{recipe!r:.80}")
        ended = bool(own["ended"])

        def load() -> None:
            grouper = self._grouper
            grouper.restore(copy.deepcopy(own["open"]), items)
            self._made.extend((recipe, grouper.build(recipe, items)) for recipe in
                              copy.deepcopy(own["ready"]))
            self._index, self._ended, self._kept, self._resume = index, ended, items, None
            self._forget()
        return load

    def place(self) -> dict:
        """Where this stream stands, after the outputs it has handed out, for the stage's
        :meth:`RegroupStage.state_dict`: a plain dict of ints and lists of ints. ``position``
        is the index of the first input item that a
        resumed stream needs, ``consumed`` the number of input items read; ``open`` and
        ``ready`` name the input items of what the stream holds and of the outputs it made
        but has not handed out."""
        if self._resume is not None:
            return copy.deepcopy(self._resume)
        held = self.read_ahead  # outputs next() read ahead, not handed out
        ready = self._pulled[len(self._pulled) - held:] if held else []
        ready = [*ready, *(recipe for recipe, _ in self._made)]
        opened = self._grouper.open_recipes()
        indices = [i for recipe in ready for i in self._grouper.indices(recipe)]
        indices += [i for recipe in opened for i in self._grouper.indices(recipe)]
        # a copy: the caller may change it, the recipes of the outputs to come must stay
        return copy.deepcopy({**self._place, "position": min(indices, default=self._index),
                              "consumed": self._index, "open": opened, "ready": ready})

    def _restore(self, state: dict) -> None:
        """Move to the place ``state`` names: skip the input up to its position, keep the
        items it names up to the items it had read, and rebuild what it held."""
        self._resume = None
        position, consumed = state["position"], state["consumed"]
        if position < self._index:
            raise ValueError(f"the state needs the input from item {position}, but this input "
                             f"begins at item {self._index} (start={self._index})")
        wanted = {i for recipe in (*state["open"], *state["ready"])
                  for i in self._grouper.indices(recipe)}
        items = self._skip_to(consumed, wanted)
        self._grouper.restore(state["open"], items)
        self._made.extend((recipe, self._grouper.build(recipe, items)) for recipe in state["ready"])
        self._kept = items
        self._forget()

    def _skip_to(self, consumed: int, wanted: set) -> dict:
        items = {}
        while self._index < consumed:
            chunk = self.upstream.pull(min(_SKIP_CHUNK, consumed - self._index))
            if not chunk:
                raise ValueError(f"the input ended at item {self._index}, before the "
                                 f"{consumed} items that the state had read")
            for index, item in enumerate(chunk, self._index):
                if index in wanted:
                    items[index] = item
            self._index += len(chunk)
        return items


class RegroupStage(Stage):
    """What the three stages share: the streams they make, and their states."""

    kind = ""
    seed: int | None = None

    def __init__(self) -> None:
        self._resume: dict | None = None
        self._chain: dict | None = None  # a stream's state for the next application to load
        self._latest: Any = None  # a weak reference to the latest stream

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        resume, self._resume = self._resume, None
        chain, self._chain = self._chain, None
        place = {"type": self.kind, "seed": self.seed, "epoch": epoch, "settings": self.settings()}
        stream = Regrouped(as_stream(iterable), repr(self), self._grouper(epoch), place, start,
                            resume)
        if chain is not None:
            stream.load_state_dict(chain)
        self._latest = weakref.ref(stream)
        return stream

    @abc.abstractmethod
    def _grouper(self, epoch: int) -> Grouper:
        """The grouper of one application, in ``epoch``."""

    @abc.abstractmethod
    def settings(self) -> dict:
        """The settings that shape the outputs (but the functions): a state records them, and
        loads only into a stage with the same."""

    def _check_recipes(self, state: dict) -> None:
        """Refuse recipes that this stage could not have made (a ``ValueError`` naming them):
        lists of the input items the state had read, from its position on."""
        low, high = state["position"], state["consumed"]
        for part in ("open", "ready"):
            for recipe in state[part]:
                indices = _recipe_indices(self._indices, recipe, part)
                if any(type(i) is not int or not low <= i < high for i in indices):
                    raise ValueError(f"state[{part!r}] names items outside the {low} to {high - 1} "
                                     f"that the state had read and kept: {recipe!r:.80}")

    _indices = staticmethod(Grouper.indices)

    def state_dict(self) -> dict:
        """The state of the latest stream of this stage (see the module's docs), or the place
        where the next application begins if none was made since :meth:`load_state_dict`."""
        stream = self._latest() if self._latest is not None else None
        if self._chain is not None:
            return copy.deepcopy(self._chain)
        if self._resume is not None or stream is None:
            return copy.deepcopy(self._resume or {
                "type": self.kind, "seed": self.seed, "epoch": self.epoch,
                "settings": self.settings(), "position": 0, "consumed": 0, "open": [], "ready": []})
        return stream.place()

    def load_state_dict(self, state: dict) -> None:
        """Make the next application begin where ``state`` (of a stage built the same way)
        stood: in its epoch, with its seed, with the same outputs to come. That application
        reads its input from the start (or from item ``start``, if :meth:`apply` says the
        input begins there), skips to the items the state names, and rebuilds what the stream
        held.

        ``state`` may also be the :meth:`~fpipe.Stream.state_dict` of a stream of this stage
        (which holds the items it is made of): the next application loads it into its stream,
        whose upstream is then restored from it too."""
        if isinstance(state, dict) and state.get("type") == "Stream":
            self._load_chain(state)
            return
        checked = _checked_state(_with_settings(state, self.settings()), self.kind)
        _check_settings(checked["settings"], self.settings(), repr(self))
        self._check_recipes(checked)
        seed = _checked_seed(checked["seed"], self.seed)
        # all checked: now change
        self._resume = copy.deepcopy(checked)
        self.set_epoch(checked["epoch"])
        if seed is not None:
            self.seed = seed

    def _load_chain(self, state: dict) -> None:
        own = state.get("own")
        if not isinstance(own, dict) or own.get("type") != self.kind:
            raise ValueError(f"state['own'] is not of a {self.kind!r} stream; got {own!r:.80}")
        _check_settings(own.get("settings"), self.settings(), repr(self))
        seed = _checked_seed(own.get("seed"), self.seed)
        adopted = copy.copy(self)  # the stage as it will be, with the state's seed
        adopted.seed = seed
        check_state(state, "Stream", ("held", "own", "upstream"), {"stream": repr(adopted)})
        epoch = check_integer("state['own']['epoch']", own.get("epoch"), 0)
        # checked: now change
        self._resume, self._chain = None, copy.deepcopy(state)
        self.set_epoch(epoch)
        if seed is not None:
            self.seed = seed

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_latest": None}  # a weak reference does not pickle


def _with_settings(state: Any, settings: dict) -> Any:
    """A state of fpipe 0.1.0 had no settings: it loads with a warning (its recipes are
    still checked against this stage)."""
    if isinstance(state, dict) and set(state) == _STATE_KEYS - {"settings"}:
        warnings.warn("this state records no settings (fpipe 0.1.0 made it): only its rows are "
                      "checked against this stage; build the stage as the one that saved it",
                      stacklevel=3)
        return {**state, "settings": settings}
    return state


def _checked_state(state: Any, kind: str) -> dict:
    if not isinstance(state, dict) or set(state) != _STATE_KEYS:
        keys = sorted(map(repr, set(state) ^ _STATE_KEYS)) if isinstance(state, dict) else ()
        wrong = f" ({', '.join(keys)} missing or unknown)" if keys else ""
        raise TypeError(f"state must be a dict from state_dict(){wrong}; got state={state!r:.200}")
    if state["type"] != kind:
        raise ValueError(f"state is of a {state['type']!r} stage, not of {kind!r}")
    for key in ("epoch", "position", "consumed"):
        check_integer(f"state[{key!r}]", state[key], 0)
    if state["position"] > state["consumed"]:
        raise ValueError(f"state['position'] must be <= state['consumed']; got "
                         f"{state['position']} > {state['consumed']}")
    if not isinstance(state["open"], list) or not isinstance(state["ready"], list):
        raise TypeError(f"state['open'] and state['ready'] must be lists; got state={state!r}")
    return dict(state)


def _checked_seed(saved: Any, seed: int | None) -> int | None:
    if seed is None and saved is not None:
        raise ValueError(f"state['seed'] must be None: this stage draws nothing; got {saved!r}")
    return None if seed is None else check_integer("state['seed']", saved, 0)


def _check_settings(saved: Any, settings: dict, stage: str) -> None:
    if not isinstance(saved, dict):
        raise TypeError(f"state['settings'] must be the dict state_dict() gives; got {saved!r:.80}")
    differ = [f"{key}={saved.get(key)!r} (this stage: {value!r})" for key, value in settings.items()
              if saved.get(key) != value]
    differ += [f"{key}={saved[key]!r} (this stage has none)" for key in saved if key not in settings]
    if differ:
        raise ValueError(f"the state is of a stage built otherwise than {stage}: "
                         f"{', '.join(differ)}; build the stage as the one that saved it")


def _recipe_indices(indices: Callable, recipe: Any, part: str) -> list:
    try:
        return list(indices(recipe))
    except (TypeError, ValueError):
        raise ValueError(f"state[{part!r}] holds {recipe!r:.80}, not a recipe of this "
                         f"stage") from None


def length_of(length: Callable, index: int, item: Any) -> int:
    try:
        value = length(item)
    except Exception as error:
        raise ValueError(f"length raised {type(error).__name__} for item {index}: "
                         f"{error}") from error
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"length must give a non-negative integer; got {value!r} for item "
                         f"{index}")
    return int(value)


_TOKENS_STREAM = 0x746F6B73  # keeps the batch-order draws apart from other seeded draws


# --- batch_by_tokens --------------------------------------------------------------------


class _TokenBatcher(Grouper):
    """Windows of ``buffer_size`` items, each sorted by length and cut into batches within the
    budget; the batches of a window leave in an order drawn from ``(seed, epoch, window)``."""

    def __init__(self, stage: _TokenBatchStage, epoch: int) -> None:
        self.stage, self.epoch = stage, epoch
        self.window: list = []  # (length, index, item)

    def feed(self, index: int, item: Any, out: list) -> None:
        stage = self.stage
        size = length_of(stage.length, index, item)
        if size > stage.max_tokens and stage.overflow == "raise":
            raise ValueError(f"item {index} has length {size}, more than max_tokens="
                             f"{stage.max_tokens} (overflow='raise')")
        self.window.append((size, index, item))
        if len(self.window) == stage.buffer_size:
            self.finish(out)

    def finish(self, out: list) -> None:
        if not self.window:
            return
        batches = _cut(sorted(self.window, key=lambda entry: entry[:2]), self.stage.max_tokens)
        sequence = np.random.SeedSequence(self.stage.seed,
                                          spawn_key=(_TOKENS_STREAM, self.epoch, self.window[0][1]))
        for at in np.random.Generator(np.random.PCG64(sequence)).permutation(len(batches)):
            entries = batches[at]
            out.append(([index for _, index, _ in entries], [item for _, _, item in entries]))
        self.window = []

    def open_recipes(self) -> list:
        return [[index for _, index, _ in self.window]] if self.window else []

    def restore(self, recipes: list, items: dict) -> None:
        self.window = [(length_of(self.stage.length, i, items[i]), i, items[i])
                       for recipe in recipes for i in recipe]

    def build(self, recipe: list, items: dict) -> list:
        return [items[i] for i in recipe]


def _cut(entries: list, max_tokens: int) -> list:
    """Consecutive runs of ``entries`` (sorted by length), each as long as the budget allows;
    the last entry of a run is its longest, so a run's padded size is its count times that."""
    batches, current = [], []
    for entry in entries:
        if current and (len(current) + 1) * entry[0] > max_tokens:
            batches.append(current)
            current = []
        current.append(entry)
    if current:
        batches.append(current)
    return batches


class _TokenBatchStage(RegroupStage):
    kind = "batch_by_tokens"

    def __init__(self, max_tokens: int, length: Callable, buffer_size: int, seed: Seed | None,
                 overflow: str) -> None:
        super().__init__()
        self.max_tokens = check_integer("max_tokens", max_tokens, 1)
        check_callable("length", length)
        self.length = length
        self.buffer_size = check_integer("buffer_size", buffer_size, 1)
        self.seed = seed_entropy(seed)  # None: fresh entropy, kept here and in repr
        self.overflow = check_choice("overflow", overflow, ("alone", "raise"))

    def _grouper(self, epoch: int) -> Grouper:
        return _TokenBatcher(self, epoch)

    def settings(self) -> dict:
        return {"max_tokens": self.max_tokens, "buffer_size": self.buffer_size,
                "overflow": self.overflow}

    def __repr__(self) -> str:
        return (f"batch_by_tokens({self.max_tokens}, buffer_size={self.buffer_size}, "
                f"seed={self.seed})")


def batch_by_tokens(max_tokens: int, *, length: Callable[[Any], int] = len,
                    buffer_size: int = 1024, seed: Seed | None = None,
                    overflow: str = "alone") -> Stage:
    """The stage that groups items into batches (lists) whose padded size, the longest
    ``length(item)`` times the number of items, is at most ``max_tokens``.

    It reads ``buffer_size`` items at a time, sorts them by length (ties in input order), cuts
    the sorted run into the largest batches the budget allows, and hands out the batches of
    the window in an order drawn from ``(seed, epoch, window)``: the same in every run for a
    seed (``None`` draws fresh entropy, kept in ``stage.seed``), new in every epoch. An item
    longer than ``max_tokens`` gets a batch of its own (``overflow="alone"``) or raises
    ``ValueError`` (``overflow="raise"``). Every item is in exactly one batch.

    >>> from toolz import pipe
    >>> words = ["a", "bbbb", "cc", "ddd", "e", "ffffff", "gg"]
    >>> batches = list(pipe(words, batch_by_tokens(8, seed=0)))
    >>> sorted(batches)
    [['a', 'e', 'cc', 'gg'], ['ddd', 'bbbb'], ['ffffff']]
    >>> all(len(b) * max(map(len, b)) <= 8 for b in batches)
    True
    """
    return _TokenBatchStage(max_tokens, length, buffer_size, seed, overflow)


# --- bucket_by_length -------------------------------------------------------------------


class _Bucketer(Grouper):
    def __init__(self, stage: _BucketStage) -> None:
        self.stage = stage
        self.buckets: list[list] = [[] for _ in stage.batch_sizes]  # (index, item)

    def feed(self, index: int, item: Any, out: list) -> None:
        stage = self.stage
        at = bisect.bisect_right(stage.boundaries, length_of(stage.length, index, item))
        bucket = self.buckets[at]
        bucket.append((index, item))
        if len(bucket) == stage.batch_sizes[at]:
            out.append(_batch_of(bucket))
            self.buckets[at] = []

    def finish(self, out: list) -> None:
        if not self.stage.drop_last:
            # the partial batches, the one with the oldest item first
            for bucket in sorted(filter(None, self.buckets), key=lambda b: b[0][0]):
                out.append(_batch_of(bucket))
        self.buckets = [[] for _ in self.buckets]

    def open_recipes(self) -> list:
        return [[index for index, _ in bucket] for bucket in self.buckets]

    def restore(self, recipes: list, items: dict) -> None:
        for at, recipe in enumerate(recipes):
            self.buckets[at] = [(i, items[i]) for i in recipe]

    def build(self, recipe: list, items: dict) -> list:
        return [items[i] for i in recipe]


def _batch_of(bucket: list) -> tuple:
    return [index for index, _ in bucket], [item for _, item in bucket]


class _BucketStage(RegroupStage):
    kind = "bucket_by_length"

    def __init__(self, boundaries: Sequence[int], batch_sizes: Sequence[int], length: Callable,
                 drop_last: bool) -> None:
        super().__init__()
        self.boundaries = _check_boundaries(boundaries)
        if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence):
            raise TypeError(f"batch_sizes must be a sequence of integers; "
                            f"got batch_sizes={batch_sizes!r}")
        if len(batch_sizes) != len(self.boundaries) + 1:
            raise ValueError(f"batch_sizes must have one more entry than boundaries "
                             f"({len(self.boundaries) + 1}); got batch_sizes={batch_sizes!r}")
        self.batch_sizes = [check_integer(f"batch_sizes[{i}]", size, 1)
                            for i, size in enumerate(batch_sizes)]
        check_callable("length", length)
        self.length, self.drop_last = length, check_bool("drop_last", drop_last)

    def _grouper(self, epoch: int) -> Grouper:
        return _Bucketer(self)

    def settings(self) -> dict:
        return {"boundaries": self.boundaries, "batch_sizes": self.batch_sizes,
                "drop_last": self.drop_last}

    def _check_recipes(self, state: dict) -> None:
        super()._check_recipes(state)
        buckets = state["open"]
        if buckets and (len(buckets) != len(self.batch_sizes) or any(
                len(bucket) >= size for bucket, size in zip(buckets, self.batch_sizes))):
            raise ValueError(f"state['open'] must hold {len(self.batch_sizes)} buckets, each "
                             f"short of its batch size {self.batch_sizes}; got {buckets!r:.80}")

    def __repr__(self) -> str:
        drop = ", drop_last=True" if self.drop_last else ""
        return f"bucket_by_length({self.boundaries}, {self.batch_sizes}{drop})"


def _check_boundaries(boundaries: Any) -> list[int]:
    if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
        raise TypeError(f"boundaries must be a sequence of integers; got boundaries={boundaries!r}")
    values = [check_integer(f"boundaries[{i}]", b, 0) for i, b in enumerate(boundaries)]
    if any(low >= high for low, high in zip(values, values[1:])):
        raise ValueError(f"boundaries must increase strictly; got boundaries={boundaries!r}")
    return values


def bucket_by_length(boundaries: Sequence[int], batch_sizes: Sequence[int], *,
                     length: Callable[[Any], int] = len, drop_last: bool = False) -> Stage:
    """The stage that batches items of similar length, as tf.data's
    ``bucket_by_sequence_length``: an item of ``length(item)`` ``n`` goes to bucket ``i``
    where ``boundaries[i - 1] <= n < boundaries[i]`` (the first bucket has no lower bound, the
    last no upper bound), and a bucket is handed out as a batch when it holds
    ``batch_sizes[i]`` items. At the end of the input the partial batches follow, the one
    with the oldest item first, unless ``drop_last``.

    >>> from toolz import pipe
    >>> words = ["a", "bbbb", "cc", "ddd", "e", "ffffff", "g"]
    >>> list(pipe(words, bucket_by_length([3], [3, 2])))
    [['bbbb', 'ddd'], ['a', 'cc', 'e'], ['ffffff'], ['g']]
    """
    return _BucketStage(boundaries, batch_sizes, length, drop_last)


# --- pack -------------------------------------------------------------------------------


class _Row:
    """A row being filled: its pieces ``(index, fields, begin, end)`` and the room left."""

    __slots__ = ("pieces", "room", "serial")

    def __init__(self, room: int, serial: int) -> None:
        self.pieces: list = []
        self.room, self.serial = room, serial


class _Packer(Grouper):
    """Places the pieces of each sample in at most ``buffer_size`` open rows; a row leaves when
    it is full, when room is needed (the fullest row for best fit, the oldest for first fit),
    or at the end of the input (in the order the rows were opened)."""

    def __init__(self, stage: _PackStage) -> None:
        self.stage = stage
        self.rows: dict[int, _Row] = {}  # by serial: the order they were opened
        self.rooms: list = []  # best fit: (room, serial), sorted
        self.serials = 0
        self.names: Any = _UNSET  # the packed fields' names (None for plain arrays)

    def feed(self, index: int, item: Any, out: list) -> None:
        fields = self._fields(index, item)
        begin, end = 0, len(fields[0])
        if end > self.stage.length:
            begin, end = self._overflow(index, fields, end, out)
        if end > begin:
            self._place((index, fields, begin, end), end - begin, out)

    def _overflow(self, index: int, fields: tuple, size: int, out: list) -> tuple[int, int]:
        """Handle a sample longer than a row: the span of it still to place."""
        stage = self.stage
        if stage.overflow == "raise":
            raise ValueError(f"item {index} has length {size}, more than length={stage.length} "
                             f"(overflow='raise')")
        if stage.overflow == "truncate":
            return 0, stage.length
        if stage.strategy == "concat":
            return 0, size  # concat splits at the ends of rows anyway
        whole = size - size % stage.length
        for begin in range(0, whole, stage.length):
            out.append(([[index, begin, begin + stage.length]],
                        self._row([(index, fields, begin, begin + stage.length)])))
        return whole, size

    def _place(self, piece: tuple, size: int, out: list) -> None:
        strategy = self.stage.strategy
        if strategy == "best_fit":
            self._best_fit(piece, size, out)
        elif strategy == "first_fit":
            self._first_fit(piece, size, out)
        else:
            self._concat(piece, size, out)

    def _best_fit(self, piece: tuple, size: int, out: list) -> None:
        rooms = self.rooms
        at = bisect.bisect_left(rooms, (size, -1))
        if at == len(rooms):
            if len(rooms) == self.stage.buffer_size:
                self._emit(self.rows[rooms.pop(0)[1]], out)  # the fullest row
            row = self._open()
        else:
            row = self.rows[rooms.pop(at)[1]]
        self._put(row, piece, size, out)
        if row.room:
            bisect.insort(rooms, (row.room, row.serial))

    def _first_fit(self, piece: tuple, size: int, out: list) -> None:
        for row in self.rows.values():
            if row.room >= size:
                break
        else:
            if len(self.rows) == self.stage.buffer_size:
                self._emit(next(iter(self.rows.values())), out)  # the oldest row
            row = self._open()
        self._put(row, piece, size, out)

    def _concat(self, piece: tuple, size: int, out: list) -> None:
        index, fields, begin, end = piece
        while begin < end:
            row = next(iter(self.rows.values()), None) or self._open()
            take = min(row.room, end - begin)
            self._put(row, (index, fields, begin, begin + take), take, out)
            begin += take

    def _open(self) -> _Row:
        row = _Row(self.stage.length, self.serials)
        self.rows[row.serial] = row
        self.serials += 1
        return row

    def _put(self, row: _Row, piece: tuple, size: int, out: list) -> None:
        row.pieces.append(piece)
        row.room -= size
        if not row.room:
            self._emit(row, out)

    def _emit(self, row: _Row, out: list) -> None:
        del self.rows[row.serial]
        out.append(([[i, begin, end] for i, _, begin, end in row.pieces], self._row(row.pieces)))

    def finish(self, out: list) -> None:
        for row in list(self.rows.values()):
            self._emit(row, out)
        self.rooms = []

    def _row(self, pieces: list) -> Any:
        """The packed row of ``pieces``: each field, then segment ids and positions."""
        length = self.stage.length
        sizes = np.array([end - begin for _, _, begin, end in pieces])
        used = int(sizes.sum())
        columns = []
        for at in range(len(pieces[0][1])):
            parts = [fields[at][begin:end] for _, fields, begin, end in pieces]
            dtype = self._row_dtype(pieces, parts, at)
            parts.append(np.zeros(length - used, dtype))
            columns.append(np.concatenate(parts).astype(dtype, copy=False))
        ids = np.zeros(length, np.int32)
        ids[:used] = np.repeat(np.arange(1, len(pieces) + 1, dtype=np.int32), sizes)
        positions = np.zeros(length, np.int32)
        starts = np.cumsum(sizes) - sizes
        positions[:used] = np.arange(used, dtype=np.int32) - np.repeat(starts, sizes)
        if self.names is None:
            return (columns[0], ids, positions)
        return {**dict(zip(self.names, columns)), "segment_ids": ids, "positions": positions}

    def _row_dtype(self, pieces: list, parts: list, at: int) -> np.dtype:
        """The dtype of field ``at`` in a row: numpy's promotion of its pieces' dtypes, refused
        (naming the item) when some piece's values would not survive the cast."""
        dtypes = {part.dtype for part in parts}
        if len(dtypes) == 1:
            return parts[0].dtype
        name = "the item" if self.names is None else f"field {self.names[at]!r}"
        first = pieces[0][0]
        try:
            if len({dtype.kind in "SU" for dtype in dtypes}) > 1:
                raise TypeError("text and numbers")
            dtype = np.result_type(*dtypes)
        except TypeError:  # numpy's DTypePromotionError is one
            raise ValueError(f"item {pieces[-1][0]}: {name} of dtype {parts[-1].dtype} cannot "
                             f"share a row with item {first}'s {parts[0].dtype}") from None
        for (index, *_), part in zip(pieces, parts):
            if not _fits(part, dtype):
                raise ValueError(f"item {index}: {name} holds values that {dtype} (what its "
                                 f"row shares with item {first}'s {parts[0].dtype}) cannot hold "
                                 f"exactly; cast the samples to one dtype")
        return dtype

    def _fields(self, index: int, item: Any) -> tuple:
        """The packed fields of ``item`` as 1-D arrays of one length, by name."""
        if isinstance(item, Mapping):
            names = self.stage.fields if self.stage.fields is not None else tuple(sorted(item))
            fields = tuple(_field(index, item, name) for name in names)
        else:
            names = None
            fields = (_array(index, "the item", item),)
            if self.stage.fields is not None:
                raise TypeError(f"fields={self.stage.fields!r} is for dict items; item {index} "
                                f"is a {type(item).__name__}")
        self._check_shape(index, names, fields)
        return fields

    def _check_shape(self, index: int, names: tuple | None, fields: tuple) -> None:
        if any(field.ndim != 1 for field in fields):
            raise ValueError(f"item {index}: packed fields must be 1-D arrays; got shapes "
                             f"{[field.shape for field in fields]}")
        if len({len(field) for field in fields}) > 1:
            raise ValueError(f"item {index}: packed fields must have one length; got "
                             f"{dict(zip(names or ['item'], map(len, fields)))}")
        if self.names is _UNSET:
            if names is not None and {"segment_ids", "positions"} & set(names):
                raise ValueError(f"item {index} has a field named 'segment_ids' or "
                                 f"'positions', which pack adds; rename it")
            self.names = names
        elif names != self.names:
            raise ValueError(f"item {index} has the fields {names}; the first item had "
                             f"{self.names}")

    def open_recipes(self) -> list:
        return [[[i, begin, end] for i, _, begin, end in row.pieces] for row in self.rows.values()]

    def restore(self, recipes: list, items: dict) -> None:
        for recipe in recipes:
            row = self._open()
            for index, begin, end in recipe:
                self._put(row, (index, self._spanned(index, items[index], end), begin, end),
                          end - begin, [])
            if self.stage.strategy == "best_fit":
                bisect.insort(self.rooms, (row.room, row.serial))

    def build(self, recipe: list, items: dict) -> Any:
        return self._row([(i, self._spanned(i, items[i], end), begin, end)
                          for i, begin, end in recipe])

    def _spanned(self, index: int, item: Any, end: int) -> tuple:
        """The fields of a restored item, which must reach as far as the state's span of it."""
        fields = self._fields(index, item)
        if end > len(fields[0]):
            raise ValueError(f"the state has item {index} up to token {end}, but item {index} "
                             f"has {len(fields[0])}: is this the input the state was saved on?")
        return fields

    @staticmethod
    def indices(recipe: list) -> Iterable[int]:
        return (index for index, _, _ in recipe)



_UNSET = object()


def _field(index: int, item: Mapping, name: str) -> np.ndarray:
    try:
        value = item[name]
    except KeyError:
        raise ValueError(f"item {index} has no field {name!r}; it has {sorted(item)}") from None
    return _array(index, f"field {name!r}", value)


def _array(index: int, name: str, value: Any) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError as error:  # a ragged list
        raise ValueError(f"item {index}: {name} is not an array of one shape: {error}") from error
    if array.dtype.hasobject:
        raise ValueError(f"item {index}: {name} holds Python objects (dtype object), not "
                         f"numbers or text of one kind")
    return array


def _fits(part: np.ndarray, dtype: np.dtype) -> bool:
    """Whether ``part`` cast to ``dtype`` and back is ``part`` (NaN as NaN)."""
    with np.errstate(invalid="ignore", over="ignore"):
        back = part.astype(dtype).astype(part.dtype)
    return bool(np.array_equal(back, part, equal_nan=part.dtype.kind in "fc"))


class _PackStage(RegroupStage):
    kind = "pack"

    def __init__(self, length: int, fields: Sequence[str] | None, strategy: str,
                 buffer_size: int, overflow: str) -> None:
        super().__init__()
        self.length = check_integer("length", length, 1)
        self.fields = _check_fields(fields)
        self.strategy = check_choice("strategy", strategy, ("best_fit", "first_fit", "concat"))
        self.buffer_size = check_integer("buffer_size", buffer_size, 1)
        self.overflow = check_choice("overflow", overflow, ("split", "truncate", "raise"))

    def _grouper(self, epoch: int) -> Grouper:
        return _Packer(self)

    _indices = staticmethod(_Packer.indices)

    def settings(self) -> dict:
        return {"length": self.length, "fields": None if self.fields is None else list(self.fields),
                "strategy": self.strategy, "buffer_size": self.buffer_size,
                "overflow": self.overflow}

    def _check_recipes(self, state: dict) -> None:
        """Rows of pieces ``[item, begin, end]`` that fit a row; open rows short of full, no
        more of them than the stage keeps open."""
        super()._check_recipes(state)
        most = 1 if self.strategy == "concat" else self.buffer_size
        if len(state["open"]) > most:
            raise ValueError(f"state['open'] holds {len(state['open'])} rows; {self!r} keeps "
                             f"at most {most} open")
        for part, most_tokens in (("open", self.length - 1), ("ready", self.length)):
            for row in state[part]:
                if not _is_row(row, most_tokens):
                    raise ValueError(f"state[{part!r}] holds the row {row!r:.80}: not pieces "
                                     f"[item, begin, end] of at most {most_tokens} tokens "
                                     f"together, as {self!r} makes")

    def __repr__(self) -> str:
        fields = "" if self.fields is None else f", fields={list(self.fields)}"
        return (f"pack({self.length}{fields}, strategy={self.strategy!r}, "
                f"buffer_size={self.buffer_size}, overflow={self.overflow!r})")


def _is_row(row: Any, most_tokens: int) -> bool:
    """Whether ``row`` is pieces ``[item, begin, end]`` (ints, ``0 <= begin < end``) of at
    most ``most_tokens`` tokens together."""
    pieces = row if isinstance(row, (list, tuple)) else ()
    return bool(pieces) and all(
        isinstance(piece, (list, tuple)) and len(piece) == 3
        and all(type(value) is int for value in piece) and 0 <= piece[1] < piece[2]
        for piece in pieces) and sum(end - begin for _, begin, end in pieces) <= most_tokens


def _check_fields(fields: Any) -> tuple | None:
    if fields is None:
        return None
    if isinstance(fields, (str, bytes)) or not isinstance(fields, Sequence) or not all(
            isinstance(name, str) for name in fields):
        raise TypeError(f"fields must be a sequence of field names or None; got fields={fields!r}")
    if not fields or len(set(fields)) != len(fields):
        raise ValueError(f"fields must name at least one field, each once; got fields={fields!r}")
    return tuple(fields)


def pack(length: int, *, fields: Sequence[str] | None = None, strategy: str = "best_fit",
         buffer_size: int = 64, overflow: str = "split") -> Stage:
    """The stage that packs samples into rows of exactly ``length`` tokens.

    A sample is a dict of 1-D arrays of one length (the packed ``fields``; all of them if
    None; other fields are left out), or a plain 1-D array. A row holds each packed field as
    an array of ``length``, plus ``segment_ids`` (1, 2, ... for the samples in the row, 0 for
    padding) and ``positions`` (0, 1, ... within each sample, 0 in padding), as int32: a dict
    for dict samples, the tuple ``(tokens, segment_ids, positions)`` for arrays. Padding is 0.
    Fields go by name, in any key order; a row keeps them in the order of ``fields``, or sorted.
    A row's field has the dtype numpy promotes its samples' dtypes to, and holds their values
    exactly: values that dtype cannot hold (an int above 2**53 beside floats), Python objects
    and ragged lists raise ``ValueError`` naming the item.

    ``strategy`` says where a sample goes, among at most ``buffer_size`` open rows:

    * ``"best_fit"``: the row with the least room that fits it; if none does, a new row, and
      when ``buffer_size`` rows are open, the fullest leaves first;
    * ``"first_fit"``: the oldest row that fits it; if none, the oldest row leaves;
    * ``"concat"``: one row, filled in input order; a sample that does not fit goes on in the
      next row (its parts are separate segments, with positions from 0).

    ``overflow`` says what a sample longer than ``length`` does: ``"split"`` into full rows
    and a rest that is packed like a sample, ``"truncate"`` to its first ``length`` tokens, or
    ``"raise"`` ``ValueError``. Empty samples add nothing. A row leaves as soon as it is full;
    at the end of the input the open rows leave in the order they were opened.

    >>> import numpy as np
    >>> from toolz import pipe
    >>> samples = [{"tokens": np.arange(n) + 1} for n in (5, 4, 3)]
    >>> rows = list(pipe(samples, pack(8)))
    >>> [row["tokens"].tolist() for row in rows]
    [[1, 2, 3, 4, 5, 1, 2, 3], [1, 2, 3, 4, 0, 0, 0, 0]]
    >>> rows[0]["segment_ids"].tolist(), rows[0]["positions"].tolist()
    ([1, 1, 1, 1, 1, 2, 2, 2], [0, 1, 2, 3, 4, 0, 1, 2])
    """
    return _PackStage(length, fields, strategy, buffer_size, overflow)
