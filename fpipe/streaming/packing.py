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
"""

from __future__ import annotations

import abc
import bisect
import collections
import copy
import numbers
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import check_integer
from ..random import Seed, seed_entropy
from ._core import Stage, Stream, as_stream

__all__ = ["batch_by_tokens", "bucket_by_length", "pack"]

_CHUNK = 64  # input items read at a time
_SKIP_CHUNK = 1024  # input items read at a time while a resumed stream finds its place
_TOKENS_STREAM = 0x746F6B73  # keeps the batch-order draws apart from other seeded draws
_STATE_KEYS = frozenset({"type", "seed", "epoch", "position", "consumed", "open", "ready"})


# --- the stream that all three share ----------------------------------------------------


class _Grouper(abc.ABC):
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


class _Regrouped(Stream):
    """The stream of a regrouping stage: it reads chunks of its input, feeds them to its
    grouper, and hands out the outputs; it knows which input items the outputs not handed out
    yet, and the grouper's open groups, are made of (:meth:`state_dict`)."""

    def __init__(self, upstream: Stream, name: str, grouper: _Grouper, place: dict,
                 start: int, resume: dict | None) -> None:
        super().__init__(upstream, name)
        self._grouper, self._place = grouper, place  # place: type, seed, epoch
        self._index = start  # the input index of the next item read
        self._resume = resume
        self._made: collections.deque = collections.deque()  # (recipe, output), not pulled yet
        self._pulled: list = []  # the recipes of the last pull, for the items next() holds
        self._ended = False

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
            feed, index = self._grouper.feed, self._index
            for item in chunk:
                feed(index, item, out)
                index += 1
                self._index = index
        except Exception as error:
            self._made.extend(out)
            if not self.defer_error(error, self._made):
                raise
            self._ended = True  # the error is raised after the outputs made before it
            return
        self._made.extend(out)

    def state_dict(self) -> dict:
        """Where this stream stands, after the outputs it has handed out: a plain dict of
        ints and lists of ints. ``position`` is the index of the first input item that a
        resumed stream needs, ``consumed`` the number of input items read; ``open`` and
        ``ready`` name the input items of what the stream holds and of the outputs it made
        but has not handed out."""
        if self._resume is not None:
            return dict(self._resume)
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


class _RegroupStage(Stage):
    """What the three stages share: the streams they make, and their states."""

    kind = ""
    seed: int | None = None

    def __init__(self) -> None:
        self._resume: dict | None = None
        self._latest: Any = None  # a weak reference to the latest stream

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        resume, self._resume = self._resume, None
        place = {"type": self.kind, "seed": self.seed, "epoch": epoch}
        stream = _Regrouped(as_stream(iterable), repr(self), self._grouper(epoch), place, start,
                            resume)
        self._latest = weakref.ref(stream)
        return stream

    @abc.abstractmethod
    def _grouper(self, epoch: int) -> _Grouper:
        """The grouper of one application, in ``epoch``."""

    def state_dict(self) -> dict:
        """The state of the latest stream of this stage (see the module's docs), or the place
        where the next application begins if none was made since :meth:`load_state_dict`."""
        stream = self._latest() if self._latest is not None else None
        if self._resume is not None or stream is None:
            return dict(self._resume or {"type": self.kind, "seed": self.seed, "epoch": self.epoch,
                                         "position": 0, "consumed": 0, "open": [], "ready": []})
        return stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Make the next application begin where ``state`` (of a stage built the same way)
        stood: in its epoch, with its seed, with the same outputs to come. That application
        reads its input from the start (or from item ``start``, if :meth:`apply` says the
        input begins there), skips to the items the state names, and rebuilds what the stream
        held."""
        self._resume = _checked_state(state, self.kind)
        self.set_epoch(state["epoch"])
        if self.seed is not None:
            self.seed = check_integer("state['seed']", state["seed"], 0)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_latest": None}  # a weak reference does not pickle


def _checked_state(state: Any, kind: str) -> dict:
    if not isinstance(state, dict) or set(state) != _STATE_KEYS:
        raise TypeError(f"state must be a dict from state_dict(); got state={state!r}")
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


def _length_of(length: Callable, index: int, item: Any) -> int:
    value = length(item)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"length must give a non-negative integer; got {value!r} for item "
                         f"{index}")
    return int(value)


def _check_callable(name: str, value: Any) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable; got {name}={value!r}")


def _check_choice(name: str, value: Any, choices: tuple) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; "
                         f"got {name}={value!r}")
    return value


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {name}={value!r}")
    return value


# --- batch_by_tokens --------------------------------------------------------------------


class _TokenBatcher(_Grouper):
    """Windows of ``buffer_size`` items, each sorted by length and cut into batches within the
    budget; the batches of a window leave in an order drawn from ``(seed, epoch, window)``."""

    def __init__(self, stage: _TokenBatchStage, epoch: int) -> None:
        self.stage, self.epoch = stage, epoch
        self.window: list = []  # (length, index, item)

    def feed(self, index: int, item: Any, out: list) -> None:
        stage = self.stage
        size = _length_of(stage.length, index, item)
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
        self.window = [(_length_of(self.stage.length, i, items[i]), i, items[i])
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


class _TokenBatchStage(_RegroupStage):
    kind = "batch_by_tokens"

    def __init__(self, max_tokens: int, length: Callable, buffer_size: int, seed: Seed | None,
                 overflow: str) -> None:
        super().__init__()
        self.max_tokens = check_integer("max_tokens", max_tokens, 1)
        _check_callable("length", length)
        self.length = length
        self.buffer_size = check_integer("buffer_size", buffer_size, 1)
        self.seed = seed_entropy(seed)  # None: fresh entropy, kept here and in repr
        self.overflow = _check_choice("overflow", overflow, ("alone", "raise"))

    def _grouper(self, epoch: int) -> _Grouper:
        return _TokenBatcher(self, epoch)

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


class _Bucketer(_Grouper):
    def __init__(self, stage: _BucketStage) -> None:
        self.stage = stage
        self.buckets: list[list] = [[] for _ in stage.batch_sizes]  # (index, item)

    def feed(self, index: int, item: Any, out: list) -> None:
        stage = self.stage
        at = bisect.bisect_right(stage.boundaries, _length_of(stage.length, index, item))
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
        if recipes and len(recipes) != len(self.buckets):
            raise ValueError(f"state has {len(recipes)} buckets; this stage has "
                             f"{len(self.buckets)}")
        for at, recipe in enumerate(recipes):
            self.buckets[at] = [(i, items[i]) for i in recipe]

    def build(self, recipe: list, items: dict) -> list:
        return [items[i] for i in recipe]


def _batch_of(bucket: list) -> tuple:
    return [index for index, _ in bucket], [item for _, item in bucket]


class _BucketStage(_RegroupStage):
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
        _check_callable("length", length)
        self.length, self.drop_last = length, _check_flag("drop_last", drop_last)

    def _grouper(self, epoch: int) -> _Grouper:
        return _Bucketer(self)

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


class _Packer(_Grouper):
    """Places the pieces of each sample in at most ``buffer_size`` open rows; a row leaves when
    it is full, when room is needed (the fullest row for best fit, the oldest for first fit),
    or at the end of the input (in the order the rows were opened)."""

    def __init__(self, stage: _PackStage) -> None:
        self.stage = stage
        self.rows: dict[int, _Row] = {}  # by serial: the order they were opened
        self.rooms: list = []  # best fit: (room, serial), sorted
        self.serials = 0
        self.shape: tuple | None = None  # the first sample's kind and field dtypes

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
        for at, dtype in enumerate(self.shape[1]):
            parts = [fields[at][begin:end] for _, fields, begin, end in pieces]
            parts.append(np.zeros(length - used, dtype))
            columns.append(np.concatenate(parts).astype(dtype, copy=False))
        ids = np.zeros(length, np.int32)
        ids[:used] = np.repeat(np.arange(1, len(pieces) + 1, dtype=np.int32), sizes)
        positions = np.zeros(length, np.int32)
        starts = np.cumsum(sizes) - sizes
        positions[:used] = np.arange(used, dtype=np.int32) - np.repeat(starts, sizes)
        if self.shape[0] is None:
            return (columns[0], ids, positions)
        return {**dict(zip(self.shape[0], columns)), "segment_ids": ids, "positions": positions}

    def _fields(self, index: int, item: Any) -> tuple:
        """The packed fields of ``item`` as 1-D arrays of one length."""
        if isinstance(item, Mapping):
            names = self.stage.fields if self.stage.fields is not None else tuple(item)
            fields = tuple(_field(index, item, name) for name in names)
        else:
            names = None
            fields = (np.asarray(item),)
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
        if self.shape is None:
            if names is not None and {"segment_ids", "positions"} & set(names):
                raise ValueError(f"item {index} has a field named 'segment_ids' or "
                                 f"'positions', which pack adds; rename it")
            self.shape = (names, tuple(field.dtype for field in fields))
        elif names != self.shape[0]:
            raise ValueError(f"item {index} has the fields {names}; the first item had "
                             f"{self.shape[0]}")

    def open_recipes(self) -> list:
        return [[[i, begin, end] for i, _, begin, end in row.pieces] for row in self.rows.values()]

    def restore(self, recipes: list, items: dict) -> None:
        for recipe in recipes:
            row = self._open()
            for index, begin, end in recipe:
                self._put(row, (index, self._fields(index, items[index]), begin, end),
                          end - begin, [])
            if self.stage.strategy == "best_fit":
                bisect.insort(self.rooms, (row.room, row.serial))

    def build(self, recipe: list, items: dict) -> Any:
        return self._row([(i, self._fields(i, items[i]), begin, end) for i, begin, end in recipe])

    @staticmethod
    def indices(recipe: list) -> Iterable[int]:
        return (index for index, _, _ in recipe)



def _field(index: int, item: Mapping, name: str) -> np.ndarray:
    try:
        return np.asarray(item[name])
    except KeyError:
        raise ValueError(f"item {index} has no field {name!r}; it has {sorted(item)}") from None


class _PackStage(_RegroupStage):
    kind = "pack"

    def __init__(self, length: int, fields: Sequence[str] | None, strategy: str,
                 buffer_size: int, overflow: str) -> None:
        super().__init__()
        self.length = check_integer("length", length, 1)
        self.fields = _check_fields(fields)
        self.strategy = _check_choice("strategy", strategy, ("best_fit", "first_fit", "concat"))
        self.buffer_size = check_integer("buffer_size", buffer_size, 1)
        self.overflow = _check_choice("overflow", overflow, ("split", "truncate", "raise"))

    def _grouper(self, epoch: int) -> _Grouper:
        return _Packer(self)

    def __repr__(self) -> str:
        fields = "" if self.fields is None else f", fields={list(self.fields)}"
        return (f"pack({self.length}{fields}, strategy={self.strategy!r}, "
                f"buffer_size={self.buffer_size}, overflow={self.overflow!r})")


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
