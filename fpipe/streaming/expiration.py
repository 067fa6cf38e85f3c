"""The expiration pool: reuse expensive items a fixed number of times, in random order.

Put it after the expensive stages (loading, preprocessing): each item it reads is yielded
``repetitions`` times, drawn at random from a pool of at most ``pool_size`` items, and is
dropped after its last use, when the pool reads the next item.

>>> from collections import Counter
>>> out = list(pool(pool_size=3, repetitions=2, seed=0)("abcde"))
>>> len(out), Counter(out) == Counter("aabbccddee")
(10, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import check_integer
from ..random import Seed, optional_entropy
from ._core import Stage, Stream, generator_stream

__all__ = ["ExpirationPool", "expiration_pool", "pool"]

_BLOCK = 1024  # uniform draws are made this many at a time
_POOL_STREAM = 0x706F6F6C  # keeps the pool's draws apart from the item generators of stages


class ExpirationPool(Stage):
    """The pool as a stage (dpipe's name); see :func:`pool`.

    >>> stage = ExpirationPool(pool_size=2, repetitions=3, seed=1)
    >>> sorted(stage([1, 2, 3]))
    [1, 1, 1, 2, 2, 2, 3, 3, 3]
    """

    def __init__(self, pool_size: int, repetitions: int, iterations: int = 1,
                 seed: Seed | None = None) -> None:
        self.pool_size = check_integer("pool_size", pool_size, 1)
        self.repetitions = check_integer("repetitions", repetitions, 1)
        self.iterations = check_integer("iterations", iterations, 1)
        self.seed = optional_entropy(seed)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return generator_stream(iterable, repr(self), lambda upstream: self._draws(
            upstream, self._generator(epoch)))

    def _generator(self, epoch: int) -> np.random.Generator:
        if self.seed is None:
            return np.random.default_rng()
        sequence = np.random.SeedSequence(self.seed, spawn_key=(_POOL_STREAM, epoch))
        return np.random.Generator(np.random.PCG64(sequence))

    def _draws(self, upstream: Iterator, rng: np.random.Generator) -> Iterator:
        # dpipe's loop: read one item, draw `iterations` times, draw more while the pool is
        # full, and drain the pool at the end
        live: list = []  # [item, uses left]; an expired slot is swapped with the last, O(1)
        uniforms = _uniforms(rng)
        for item in upstream:
            live.append([item, self.repetitions])
            for _ in range(self.iterations):
                if live:
                    yield _draw(live, next(uniforms))
            while len(live) >= self.pool_size:
                yield _draw(live, next(uniforms))
        while live:
            yield _draw(live, next(uniforms))

    def __repr__(self) -> str:
        extra = "" if self.iterations == 1 else f", iterations={self.iterations}"
        seed = "" if self.seed is None else f", seed={self.seed}"
        return f"pool({self.pool_size}, {self.repetitions}{extra}{seed})"


def _uniforms(rng: np.random.Generator) -> Iterator[float]:
    while True:
        yield from rng.random(_BLOCK).tolist()


def _draw(live: list, uniform: float) -> Any:
    index = int(uniform * len(live))
    slot = live[index]
    slot[1] -= 1
    if not slot[1]:
        live[index] = live[-1]
        live.pop()
    return slot[0]


def pool(pool_size: int, repetitions: int, iterations: int = 1,
         seed: Seed | None = None) -> ExpirationPool:
    """The stage that yields every item ``repetitions`` times, in random order, holding at most
    ``pool_size`` items: it reads an item, yields ``iterations`` draws from the pool, keeps
    drawing while the pool is full, and at the end drains the pool. A draw costs O(1).

    With ``seed``, the draws are the same in every run (for the same input), and differ from
    epoch to epoch. The items read ahead by the stream the pool reads from (at most 64 cheap
    ones, see :class:`fpipe.Stream`) are not in the pool yet.

    >>> list(pool(1, 2)("ab"))
    ['a', 'a', 'b', 'b']
    """
    return ExpirationPool(pool_size, repetitions, iterations, seed)


def expiration_pool(iterable: Iterable, pool_size: int, repetitions: int,
                    iterations: int = 1) -> Stream:
    """dpipe's function form of :func:`pool`: ``pool(pool_size, repetitions, iterations)``
    applied to ``iterable`` (unseeded, as in dpipe).

    >>> sorted(expiration_pool("ab", pool_size=2, repetitions=2))
    ['a', 'a', 'b', 'b']
    """
    return pool(pool_size, repetitions, iterations)(iterable)
