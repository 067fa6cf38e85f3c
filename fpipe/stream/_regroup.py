"""The machinery that the variable-length stages share (:mod:`fpipe.stream.packing`): a
stream that regroups its input, and its state.

A stage supplies a :class:`Grouper`, the algorithm of one application: it takes input items
one by one and makes outputs, each with its *recipe*, the input indices (and spans) that it is
made of. The stream keeps the recipes of what it holds, so that ``state_dict()`` names input
items rather than holding them, and a resumed stream rebuilds its place from the same items. A
state records the stage's settings, and loads only into a stage built the same way; it is
checked whole before the stage changes.
"""

from __future__ import annotations

import abc
import collections
import copy
import numbers
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from fpipe.errors import check_integer, check_state
from fpipe.stream.core import Stage, Stream, as_stream

__all__ = ["Grouper", "RegroupStage", "Regrouped", "length_of"]

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
