"""The simple stages: :func:`map`, :func:`filter`, :func:`take` and :func:`transform_stream`.
They work in the consumer's thread, a chunk at a time.

>>> from toolz import pipe
>>> list(pipe(range(10), map(lambda x: x * x), filter(lambda x: x % 2), take(3)))
[1, 9, 25]
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import CapturedError, capture, check_callable, check_integer
from ..functional import call_repr
from ..random import Seed, item_rng, optional_entropy, set_active
from ._core import Stage, Stream, as_stream, generator_stream, mapped_stream

__all__ = ["filter", "map", "take", "transform_stream"]


class ItemCall:
    """``func(item, *args, **kwargs)`` over a chunk, each item's generator active when seeded.
    A class, not a closure, so that it pickles to worker processes."""

    __slots__ = ("func", "args", "kwargs", "seed", "epoch")

    def __init__(self, func: Callable, args: tuple, kwargs: dict, seed: int | None,
                 epoch: int) -> None:
        self.func, self.args, self.kwargs, self.seed, self.epoch = func, args, kwargs, seed, epoch

    def __reduce__(self):
        return ItemCall, (self.func, self.args, self.kwargs, self.seed, self.epoch)

    def into(self, outputs: list, chunk: list, start: int) -> None:
        """Append the results to ``outputs``; on an error, the results before it stay there."""
        func, args, kwargs = self.func, self.args, self.kwargs
        if self.seed is None:
            calls = (builtins.map(func, chunk) if not (args or kwargs)
                     else (func(item, *args, **kwargs) for item in chunk))
            outputs.extend(calls)
            return
        for index, item in enumerate(chunk, start):
            previous = set_active(item_rng(self.seed, self.epoch, index))
            try:
                outputs.append(func(item, *args, **kwargs))
            finally:
                set_active(previous)

    def run(self, chunk: list, start: int) -> tuple[list, CapturedError | None, float]:
        """``(results, captured error or None, seconds)``: what a worker sends back."""
        began, outputs = time.perf_counter(), []
        try:
            self.into(outputs, chunk, start)
        except BaseException as error:  # a worker must report even SystemExit, not die
            return outputs, capture(error), time.perf_counter() - began
        return outputs, None, time.perf_counter() - began


def stage_repr(name: str, func: Callable, args: tuple, options: dict) -> str:
    """The repr of a stage built by ``name(func, *args, **options)``; None options are left out."""
    return call_repr(name, (func, *args), {k: v for k, v in options.items() if v is not None})


class _MapStage(Stage):
    one_to_one = True

    def __init__(self, func: Callable, args: tuple, kwargs: dict, seed: Seed | None) -> None:
        self.func, self.args, self.kwargs = check_callable("func", func), args, kwargs
        self.seed = optional_entropy(seed)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        call = ItemCall(self.func, self.args, self.kwargs, self.seed, epoch)
        return mapped_stream(iterable, repr(self), call.into, start)

    def __repr__(self) -> str:
        return stage_repr("map", self.func, self.args, {"seed": self.seed, **self.kwargs})


class _FilterStage(Stage):
    def __init__(self, predicate: Callable) -> None:
        self.predicate = check_callable("predicate", predicate)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return mapped_stream(iterable, repr(self), self._into, start)

    def _into(self, outputs: list, chunk: list, start: int) -> None:
        outputs.extend(builtins.filter(self.predicate, chunk))

    def __repr__(self) -> str:
        return call_repr("filter", (self.predicate,), {})


def map(func: Callable, *args: Any, seed: Seed | None = None, **kwargs: Any) -> Stage:
    """The stage that yields ``func(item, *args, **kwargs)`` for each item, in this thread.

    With ``seed``, each item's generator (from ``(seed, epoch, index)``) is active while
    ``func`` runs, for :func:`fpipe.random_apply`, :func:`fpipe.sample_args` and the samplers.

    >>> list(map(pow, 3)([1, 2, 3]))
    [1, 8, 27]
    >>> from fpipe import random_apply
    >>> flip = map(random_apply(0.5, lambda x: -x), seed=0)
    >>> list(flip.apply(range(1, 9))) == list(flip.apply(range(1, 9)))
    True
    """
    return _MapStage(func, args, kwargs, seed)


def filter(predicate: Callable) -> Stage:
    """The stage that keeps the items for which ``predicate(item)`` is true.

    >>> list(filter(str.isdigit)("a1b2"))
    ['1', '2']
    """
    return _FilterStage(predicate)


class _TakeStage(Stage):
    def __init__(self, n: int) -> None:
        self.n = check_integer("n", n, 0)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return _Taken(as_stream(iterable), repr(self), self.n)

    def __repr__(self) -> str:
        return f"take({self.n})"


class _Taken(Stream):
    def __init__(self, upstream: Stream, name: str, n: int) -> None:
        super().__init__(upstream, name)
        self._left = n

    def _pull(self, n: int) -> list:
        if self._left <= 0:
            return []
        items = self.pull_upstream(min(n, self._left))
        self._left -= len(items)
        return items


def take(n: int) -> Stage:
    """The stage that yields the first ``n`` items and then ends; it reads no more than ``n``
    items from its upstream (which it leaves open until it is closed itself).

    >>> list(take(2)("abc"))
    ['a', 'b']
    """
    return _TakeStage(n)


class _StreamStage(Stage):
    def __init__(self, func: Callable, args: tuple, kwargs: dict) -> None:
        self.func, self.args, self.kwargs = check_callable("func", func), args, kwargs

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return generator_stream(iterable, repr(self), self._start)

    def _start(self, upstream: Stream) -> Iterator:
        return iter(self.func(upstream, *self.args, **self.kwargs))

    def __repr__(self) -> str:
        return stage_repr("transform_stream", self.func, self.args, self.kwargs)




def transform_stream(func: Callable, *args: Any, **kwargs: Any) -> Stage:
    """The stage that hands the whole stream to ``func(stream, *args, **kwargs)``, which returns
    or yields any number of outputs (dpipe's ``Iterator``): for windows, pairs, flat maps and
    other stateful work. It runs in this thread; add :func:`fpipe.prefetch` to run it ahead.

    >>> def pairs(items):
    ...     items = iter(items)
    ...     return zip(items, items)
    >>> list(transform_stream(pairs)(range(6)))
    [(0, 1), (2, 3), (4, 5)]
    """
    return _StreamStage(func, args, kwargs)


