"""The expiration pool: reuse expensive items a fixed number of times, in random order.

Put it after the expensive stages (loading, preprocessing): each item it reads is yielded
``repetitions`` times, drawn at random from a pool of at most ``pool_size`` items, and is
dropped after its last use, when the pool reads the next item.

>>> from collections import Counter
>>> out = list(ExpirationPool(pool_size=3, repetitions=2, seed=0)("abcde"))
>>> len(out), Counter(out) == Counter("aabbccddee")
(10, True)
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from fpipe.errors import check_integer
from fpipe.random import Seed, optional_entropy
from fpipe.stream.core import Stage, Stream, as_stream

__all__ = ["ExpirationPool", "expiration_pool"]

_BLOCK = 1024  # uniform draws are made this many at a time
_POOL_STREAM = 0x706F6F6C  # keeps the pool's draws apart from the item generators of stages


class ExpirationPool(Stage):
    """The stage that yields every item ``repetitions`` times, in random order, holding at most
    ``pool_size`` items: it reads an item, yields ``iterations`` draws from the pool, keeps
    drawing while the pool is full, and at the end drains the pool. A draw costs O(1). (dpipe's
    name, and fpipe's one name for the pool as a stage.)

    With ``seed``, the draws are the same in every run (for the same input), and differ from
    epoch to epoch. The items read ahead by the stream the pool reads from (at most 64 cheap
    ones, see :class:`fpipe.Stream`) are not in the pool yet.

    >>> list(ExpirationPool(1, 2)("ab"))
    ['a', 'a', 'b', 'b']
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
        return _Pooled(as_stream(iterable), repr(self), self, self._generator(epoch))

    def _generator(self, epoch: int) -> np.random.Generator:
        if self.seed is None:
            return np.random.default_rng()
        sequence = np.random.SeedSequence(self.seed, spawn_key=(_POOL_STREAM, epoch))
        return np.random.Generator(np.random.PCG64(sequence))

    def __repr__(self) -> str:
        extra = "" if self.iterations == 1 else f", iterations={self.iterations}"
        seed = "" if self.seed is None else f", seed={self.seed}"
        return f"ExpirationPool({self.pool_size}, {self.repetitions}{extra}{seed})"


class _Pooled(Stream):
    """The stream of a pool: dpipe's loop (read one item, draw ``iterations`` times, draw more
    while the pool is full, drain the pool at the end) with its place in the open, so that its
    state names the pool's items, their uses left and the generator's place."""

    def __init__(self, upstream: Stream, name: str, stage: ExpirationPool,
                 rng: np.random.Generator) -> None:
        super().__init__(upstream, name)
        self._size, self._repetitions = stage.pool_size, stage.repetitions
        self._iterations = stage.iterations
        self._rng = rng
        self._block_state = rng.bit_generator.state  # where the current block of draws began
        self._block: list = []
        self._used = 0  # draws taken from the current block
        self._live: list = []  # [item, uses left]; an expired slot is swapped with the last
        self._owed = 0  # draws still owed to the item read last
        self._unread: list = []  # items pulled from upstream, not in the pool yet
        self._ended = False

    def _pull(self, n: int) -> list:
        out: list = []
        live = self._live
        while len(out) < n:
            if self._owed:
                if live:
                    out.append(self._draw())
                    self._owed -= 1
                else:
                    self._owed = 0
            elif len(live) >= self._size or (self._ended and live):
                out.append(self._draw())
            elif not self._ended:
                if not self._unread:
                    if out and self.upstream.waits:
                        break  # what the upstream gives next may wait for these outputs
                    self._unread = self.pull_upstream(n)[::-1]
                if not self._unread:
                    self._ended = True
                    continue
                live.append([self._unread.pop(), self._repetitions])
                self._owed = self._iterations
            else:
                break
        return out

    def _draw(self) -> Any:
        if self._used == len(self._block):
            self._block_state = self._rng.bit_generator.state
            self._block, self._used = self._rng.random(_BLOCK).tolist(), 0
        uniform = self._block[self._used]
        self._used += 1
        live = self._live
        index = int(uniform * len(live))
        slot = live[index]
        slot[1] -= 1
        if not slot[1]:
            live[index] = live[-1]
            live.pop()
        return slot[0]

    def _own_state(self) -> dict:
        return copy.deepcopy({"rng": self._block_state, "used": self._used,
                              "drawn": len(self._block) > 0, "live": self._live,
                              "owed": self._owed, "unread": self._unread[::-1],
                              "ended": self._ended})

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        keys = {"rng", "used", "drawn", "live", "owed", "unread", "ended"}
        if not isinstance(own, dict) or set(own) != keys:
            raise TypeError(f"{name} must be the dict of a pool stream's state; got {own!r:.120}")
        used = check_integer(f"{name}['used']", own["used"], 0)
        owed = check_integer(f"{name}['owed']", own["owed"], 0)
        live, unread = own["live"], own["unread"]
        if not isinstance(live, list) or len(live) > self._size + 1 or not all(
                isinstance(slot, list) and len(slot) == 2 and type(slot[1]) is int
                and 0 < slot[1] <= self._repetitions for slot in live):
            raise ValueError(f"{name}['live'] must be at most {self._size + 1} [item, uses left] "
                             f"with 1 to {self._repetitions} uses; got {live!r:.80}")
        if not isinstance(unread, list) or used > _BLOCK or owed > self._iterations:
            raise ValueError(f"{name} is not of {self.name}: used={used}, owed={owed}")
        rng = np.random.Generator(type(self._rng.bit_generator)())
        try:
            rng.bit_generator.state = own["rng"]
        except (TypeError, ValueError, KeyError) as error:
            raise ValueError(f"{name}['rng'] is not the state of this pool's generator: "
                             f"{error}") from None

        def load() -> None:
            self._rng, self._block_state = rng, copy.deepcopy(own["rng"])
            self._block = rng.random(_BLOCK).tolist() if own["drawn"] else []
            self._used = used if own["drawn"] else 0
            self._live = copy.deepcopy(live)
            self._owed, self._unread = owed, copy.deepcopy(unread)[::-1]
            self._ended = bool(own["ended"])
        return load


def expiration_pool(iterable: Iterable, pool_size: int, repetitions: int,
                    iterations: int = 1) -> Stream:
    """dpipe's function form of the pool: ``ExpirationPool(pool_size, repetitions,
    iterations)`` applied to ``iterable`` (unseeded, as in dpipe).

    >>> sorted(expiration_pool("ab", pool_size=2, repetitions=2))
    ['a', 'a', 'b', 'b']
    """
    return ExpirationPool(pool_size, repetitions, iterations)(iterable)
