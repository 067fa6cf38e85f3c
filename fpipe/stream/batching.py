"""Batching: group items into batches, and combine a batch into arrays (and back).

:func:`batch` is a stage; the combiners are transforms for :func:`fpipe.stream.map`:

>>> from toolz import pipe
>>> from fpipe.stream import map
>>> items = [(np.ones((2, 3)), 0), (np.ones((4, 1)), 1)]
>>> images, labels = next(pipe(items, batch(2), map(combine_pad)))
>>> images.shape, labels
((2, 4, 3), array([0, 1]))

The combiners read an item as a sequence of fields (an image and its label, say) and stack
each field over the batch, as dpipe does: a bare array of shape ``(3, 4)`` is three fields.
:func:`combine_dicts` stacks dict items key by key. :func:`uncombine` and :func:`unbatch` undo
the combining and the batching.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fpipe.functional import func_name
from fpipe.stream.core import READ_SECONDS, Stage, Stream, as_stream
from fpipe.stream.parallel._shm import empty as shared_empty

__all__ = [
    "batch",
    "combine_batches",
    "combine_dicts",
    "combine_pad",
    "combine_to_arrays",
    "pad_batch_equal",
    "pad_to_shape",
    "unbatch",
    "uncombine",
]


class _BatchStage(Stage):
    def __init__(self, batch_size: int | Callable, drop_last: bool) -> None:
        if callable(batch_size):
            self.size, self.predicate = None, batch_size
        elif isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool):
            if batch_size < 1:
                raise ValueError(f"batch_size must be >= 1; got batch_size={batch_size!r}")
            self.size, self.predicate = int(batch_size), None
        else:
            raise TypeError(f"batch_size must be an integer or a predicate (chunk, item) -> bool;"
                            f" got batch_size={batch_size!r}")
        self.drop_last = bool(drop_last)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return Batched(as_stream(iterable), repr(self), self)

    def __repr__(self) -> str:
        size = self.size if self.predicate is None else func_name(self.predicate)
        return f"batch({size}{', drop_last=True' if self.drop_last else ''})"


_NOTHING = object()


class Batched(Stream):
    def __init__(self, upstream: Stream, name: str, stage: _BatchStage) -> None:
        super().__init__(upstream, name)
        self.stage = stage  # for the planner, which may move the batching ahead of the workers
        self._size, self._predicate, self._drop_last = stage.size, stage.predicate, stage.drop_last
        self._held = _NOTHING  # the item that closed the last predicate batch
        self._filling: list = []  # the batch being made

    def _pull(self, n: int) -> list:
        # more than one batch only while they are cheap and need no waiting for other threads,
        # so that a batch is never held back by the making of the next one
        batches: list = []
        deadline = time.perf_counter() + READ_SECONDS if n > 1 and not self.upstream.waits else 0
        try:
            while True:
                items = self._sized() if self._predicate is None else self._by_predicate()
                if not items or (self._drop_last and self._size and len(items) < self._size):
                    return batches
                batches.append(items)
                if len(batches) >= n or time.perf_counter() > deadline:
                    return batches
        except BaseException as error:
            # the input ends in an error: what it gave of this batch goes out first, as at its end
            partial, self._filling = self._filling, []
            if partial and not (self._drop_last and self._size):
                batches.append(partial)
            if not self.defer_error(error, batches):
                raise
            return batches

    def _sized(self) -> list:
        size = self._size
        items = self._filling = self.pull_upstream(size, full=True)
        while 0 < len(items) < size:
            more = self.pull_upstream(size - len(items), full=True)
            if not more:
                break
            items += more
        self._filling = []
        return items

    def _by_predicate(self) -> list:
        first, self._held = self._held, _NOTHING
        if first is _NOTHING:
            first = next(self.upstream, _NOTHING)
            if first is _NOTHING:
                return []
        items = self._filling = [first]
        for item in self.upstream:
            if not self._predicate(items, item):
                self._held = item
                break
            items.append(item)
        self._filling = []
        return items

    def _own_state(self) -> dict:
        # between pulls nothing is filling; a predicate batch holds the item that closed it
        return {"next": [] if self._held is _NOTHING else [self._held]}

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        if not isinstance(own, dict) or set(own) != {"next"} or not isinstance(own["next"], list) \
                or len(own["next"]) > (0 if self._predicate is None else 1):
            raise TypeError(f"{name} must be the dict of a {self.name} stream's state; "
                            f"got {own!r:.120}")

        def load() -> None:
            self._held = own["next"][0] if own["next"] else _NOTHING
        return load


def batch(batch_size: int | Callable[[list, Any], bool], drop_last: bool = False) -> Stage:
    """The stage that groups items into lists: batches of ``batch_size`` items, or, with a
    predicate, batches that grow while ``batch_size(batch, item)`` is true.

    An int batch is released as soon as it is full. A predicate is not asked about the first
    item of a batch, so every batch has at least one item; when it says no, the batch is
    released and the item starts the next one (nothing is dropped). A finite stream ends with
    its partial batch, unless ``drop_last`` (for an int ``batch_size``).

    >>> list(batch(2)(range(5)))
    [[0, 1], [2, 3], [4]]
    >>> list(batch(2, drop_last=True)(range(5)))
    [[0, 1], [2, 3]]
    >>> def fits(chunk, item):
    ...     return sum(chunk) + item <= 5
    >>> list(batch(fits)([1, 2, 3, 4, 1]))
    [[1, 2], [3], [4, 1]]
    """
    return _BatchStage(batch_size, drop_last)


class _UnbatchStage(Stage):
    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return _Unbatched(as_stream(iterable), repr(self))

    def __repr__(self) -> str:
        return "unbatch()"


class _Unbatched(Stream):
    def __init__(self, upstream: Stream, name: str) -> None:
        super().__init__(upstream, name)
        self._rest: list = []

    def _pull(self, n: int) -> list:
        while not self._rest:
            batches = self.pull_upstream(1)
            if not batches:
                return []
            self._rest = list(batches[0])
        items, self._rest = self._rest[:n], self._rest[n:]
        return items

    def _own_state(self) -> dict:
        return {"rest": list(self._rest)}

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        if not isinstance(own, dict) or set(own) != {"rest"} or not isinstance(own["rest"], list):
            raise TypeError(f"{name} must be a dict of the items 'rest'; got {own!r:.120}")

        def load() -> None:
            self._rest = list(own["rest"])
        return load


def unbatch() -> Stage:
    """The stage that yields the items of each batch (the inverse of :func:`batch`).

    >>> list(unbatch()([[0, 1], [2]]))
    [0, 1, 2]
    """
    return _UnbatchStage()


# --- combiners ----------------------------------------------------------------------------


def combine_batches(inputs: Sequence[Sequence]) -> tuple:
    """Transpose a batch of items into a tuple of fields: ``[(x1, y1), (x2, y2)]`` gives
    ``((x1, x2), (y1, y2))``. Items with different numbers of fields raise ``ValueError``.

    >>> combine_batches([("a", 1), ("b", 2)])
    (('a', 'b'), (1, 2))
    >>> combine_batches([3, 4])
    Traceback (most recent call last):
    ...
    TypeError: combine_batches expects items that are sequences of fields, ... item 0 is 3 (int). ...
    """
    return _transposed(inputs, "combine_batches")


def _transposed(inputs: Sequence[Sequence], combiner: str) -> tuple:
    items = [_fields(item, position, combiner) for position, item in enumerate(inputs)]
    lengths = {len(item) for item in items}
    if len(lengths) > 1:
        first = len(items[0])
        odd = next(i for i, item in enumerate(items) if len(item) != first)
        raise ValueError(f"items have different numbers of fields: item 0 has {first}, "
                         f"item {odd} has {len(items[odd])}")
    return tuple(zip(*items))


def _fields(item: Any, position: int, combiner: str) -> tuple:
    try:
        return tuple(item)
    except TypeError:
        raise TypeError(f"{combiner} expects items that are sequences of fields, such as "
                        f"(image, label) pairs; item {position} is {item!r:.60} "
                        f"({type(item).__name__}). Wrap single values in a tuple, or pass "
                        "another combiner (combiner=numpy.array, say)") from None


def _stack(field: int | str, values: Sequence) -> np.ndarray:
    if _same_arrays(values):
        # made in place: in a process stage's worker, in the shared memory it crosses in
        first = values[0]
        return np.stack(values, out=shared_empty((len(values), *first.shape), first.dtype))
    try:
        array = np.array(values)
    except ValueError as error:
        shapes = sorted({np.shape(value) for value in values}, key=str)
        raise ValueError(f"field {field!r} has items of different shapes {shapes}; pad them "
                         f"(combine_pad) or combine them another way") from error
    if array.dtype.kind == "f" and all(_is_integer(value) for value in values):
        return _exact_integers(values)
    return array


def _same_arrays(values: Sequence) -> bool:
    """Whether ``values`` are arrays of one shape and dtype (which ``np.stack`` keeps)."""
    if not values or type(values[0]) is not np.ndarray:
        return False
    shape, dtype = values[0].shape, values[0].dtype
    return all(type(value) is np.ndarray and value.shape == shape and value.dtype == dtype
               for value in values)


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _exact_integers(values: Sequence) -> np.ndarray:
    """Integers that numpy would make floats of (a mix of int64 and uint64 values, which loses
    digits): uint64 when they all fit, else Python ints in an object array."""
    if min(values) >= 0 and max(values) < 2 ** 64:
        return np.array(values, dtype=np.uint64)
    return np.array(values, dtype=object)


def combine_to_arrays(inputs: Sequence[Sequence]) -> tuple:
    """Stack each field of a batch into one array along a new first axis (dpipe's default
    combiner). Ragged fields raise ``ValueError`` naming the field and the shapes. Integers
    keep every digit: where numpy would make floats of them (a mix of int64 and uint64
    values), the field is uint64, or Python ints in an object array.

    >>> images, labels = combine_to_arrays([(np.zeros((2, 2)), 0), (np.ones((2, 2)), 1)])
    >>> images.shape, labels
    ((2, 2, 2), array([0, 1]))

    Dict items (the rows of :func:`fpipe.pack`, say) give a dict, as :func:`combine_dicts`.
    """
    if _are_dicts(inputs):
        return combine_dicts(inputs)
    return tuple(_stack(i, field) for i, field in enumerate(_transposed(inputs, "combine_to_arrays")))


def _are_dicts(inputs: Sequence) -> bool:
    return bool(inputs) and isinstance(inputs[0], Mapping)


def _per_field(name: str, values: Any, count: int) -> list:
    if callable(values) or np.ndim(values) == 0:
        return [values] * count
    values = list(values)
    if len(values) != count:
        raise ValueError(f"{name} must be one value or one per field; got {len(values)} "
                         f"for {count} fields")
    return values


def combine_pad(inputs: Sequence[Sequence], padding_values: Any = 0, ratio: Any = 0.5) -> tuple:
    """Like :func:`combine_to_arrays`, but each field is first padded to the largest shape in
    the batch, axis by axis (:func:`pad_batch_equal`). ``padding_values`` is one value, one per
    field, or a function of each item (such as ``np.min``); ``ratio`` is the share of the
    padding put before the data, per axis or for all.

    >>> masks, labels = combine_pad([([1, 1], 0), ([2, 2, 2, 2], 1)], padding_values=(-1, 0))
    >>> masks
    array([[-1,  1,  1, -1],
           [ 2,  2,  2,  2]])

    Dict items (the rows of :func:`fpipe.pack`, say) give a dict, padded key by key as in
    :func:`combine_dicts`; then ``padding_values`` may be a dict by key.
    """
    if _are_dicts(inputs):
        return combine_dicts(inputs, padding_values, ratio)
    fields = _transposed(inputs, "combine_pad")
    values = _per_field("padding_values", padding_values, len(fields))
    return tuple(pad_batch_equal(field, value, ratio) for field, value in zip(fields, values))


def pad_batch_equal(batch: Sequence, padding_values: Any = 0, ratio: Any = 0.5) -> np.ndarray:
    """Pad every array of ``batch`` to the batch's largest size on each axis, and stack them.
    Scalars are stacked as they are. Arrays of different numbers of dimensions raise
    ``ValueError``.

    >>> pad_batch_equal([[1], [1, 2, 3]], ratio=0)
    array([[1, 0, 0],
           [1, 2, 3]])
    """
    shapes = [np.shape(x) for x in batch]
    if len({len(shape) for shape in shapes}) > 1:
        raise ValueError(f"cannot pad arrays with different numbers of dimensions to one shape;"
                         f" got shapes {sorted(set(shapes), key=str)}")
    if not shapes or not shapes[0]:
        return np.array(batch)
    target = np.max(shapes, axis=0)
    return np.array([pad_to_shape(x, target, padding_values=padding_values, ratio=ratio)
                     for x in batch])


def pad_to_shape(x: Any, shape: Sequence[int], axis: Any = None, padding_values: Any = 0,
                 ratio: Any = 0.5) -> np.ndarray:
    """Pad ``x`` to ``shape`` along ``axis`` (all axes by default): on each axis, with
    ``delta`` cells missing, ``int(delta * ratio)`` go before the data and the rest after.
    ``padding_values`` is cast to the array's dtype; a function is called on ``x``. The same
    signature and geometry as ``imops.pad_to_shape``.

    >>> pad_to_shape(np.array([1, 2]), [5], padding_values=9)
    array([9, 1, 2, 9, 9])
    >>> pad_to_shape(np.ones((1, 1), int), [2, 3], ratio=[0, 1])
    array([[0, 0, 1],
           [0, 0, 0]])
    """
    x = np.asarray(x)
    axes = np.arange(x.ndim) if axis is None else np.atleast_1d(axis) % max(x.ndim, 1)
    target = np.broadcast_to(shape, axes.shape).astype(int)
    delta = target - np.array(x.shape, dtype=int)[axes]
    if (delta < 0).any():
        raise ValueError(f"cannot pad an array of shape {x.shape} to the smaller shape "
                         f"{tuple(target)} on axes {tuple(axes)}")
    before = (delta * np.broadcast_to(ratio, axes.shape)).astype(int)
    widths = np.zeros((x.ndim, 2), dtype=int)
    widths[axes, 0], widths[axes, 1] = before, delta - before
    value = padding_values(x) if callable(padding_values) else padding_values
    out = np.empty(x.shape + widths.sum(axis=1), dtype=x.dtype)
    out[...] = np.asarray(value).astype(x.dtype)  # wraps like a C cast: -1 is 255 in uint8
    out[tuple(slice(low, low + size) for low, size in zip(widths[:, 0], x.shape))] = x
    return out


def combine_dicts(inputs: Sequence[Mapping], padding_values: Any = None,
                  ratio: Any = 0.5) -> dict:
    """Stack dict items key by key: a list of ``{"image": x, "label": y}`` gives
    ``{"image": array, "label": array}``. With ``padding_values`` (one value, or a dict per
    key), each key is padded as in :func:`combine_pad`. Items with different keys raise
    ``ValueError``.

    >>> combine_dicts([{"x": [1, 2], "y": 0}, {"x": [3, 4], "y": 1}])
    {'x': array([[1, 2],
           [3, 4]]), 'y': array([0, 1])}
    """
    keys = list(inputs[0]) if inputs else []
    for i, item in enumerate(inputs):
        if set(item) != set(keys):
            raise ValueError(f"items have different keys: item 0 has {sorted(keys)}, "
                             f"item {i} has {sorted(item)}")
    if padding_values is None:
        return {key: _stack(key, [item[key] for item in inputs]) for key in keys}
    values = padding_values if isinstance(padding_values, Mapping) else dict.fromkeys(
        keys, padding_values)
    return {key: pad_batch_equal([item[key] for item in inputs], values.get(key, 0), ratio)
            for key in keys}


def uncombine(batch: Sequence | Mapping) -> list:
    """Split a combined batch back into items (the inverse of the combiners): a tuple of fields
    gives a list of tuples, a dict of fields a list of dicts. Fields of different lengths
    raise ``ValueError``.

    >>> uncombine((np.array([1, 2]), ["a", "b"]))
    [(1, 'a'), (2, 'b')]
    >>> uncombine({"y": [0, 1]})
    [{'y': 0}, {'y': 1}]
    """
    keys = list(batch) if isinstance(batch, Mapping) else range(len(batch))
    lengths = {key: len(batch[key]) for key in keys}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"fields have different lengths: {lengths}")
    columns = [_as_items(batch[key]) for key in keys]
    if isinstance(batch, Mapping):
        return [dict(zip(keys, row)) for row in zip(*columns)]
    return list(zip(*columns))


def _as_items(field: Any) -> list:
    # numpy scalars become Python ones, so that uncombine(combine(items)) == items
    return field.tolist() if isinstance(field, np.ndarray) and field.ndim == 1 else list(field)
