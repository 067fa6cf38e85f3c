"""What fpipe's sources choose with: uniform draws (by position, or dpipe's sequential
stream), and weights that may follow a schedule. Private: :mod:`fpipe.stream.sources` uses it.

>>> schedule = Schedule([(0, [1, 0]), (2, [0, 1])], 2, "weights")
>>> schedule.choose(0, 4, lambda n: np.full(n, 0.5))[0].tolist()
[0, 0, 1, 1]
"""

from __future__ import annotations

import bisect
import hashlib
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fpipe.errors import check_integer

BLOCK = 1024


class Counted:
    """Uniform draws in [0, 1) by position: block ``b`` of ``epoch`` comes from its own
    generator, seeded with ``(entropy, stream, epoch, b)``, so any position is reached in O(1).

    >>> a = Counted(7, 1, epoch=0)
    >>> bool((a.take(1000, 50) == Counted(7, 1, epoch=0).take(0, 1050)[1000:]).all())
    True
    """

    sequential = False

    def __init__(self, entropy: int, stream: int, epoch: int) -> None:
        self.entropy, self.epoch, self._stream = entropy, epoch, stream
        self._block, self._values = -1, np.empty(0)

    def take(self, position: int, n: int) -> np.ndarray:
        pieces = []
        while n > 0:
            block, offset = divmod(position, BLOCK)
            if block != self._block:
                sequence = np.random.SeedSequence(
                    self.entropy, spawn_key=(self._stream, self.epoch, block))
                self._block = block
                self._values = np.random.Generator(np.random.PCG64(sequence)).random(BLOCK)
            piece = self._values[offset:offset + n]
            pieces.append(piece)
            position, n = position + len(piece), n - len(piece)
        return pieces[0] if len(pieces) == 1 else np.concatenate([np.empty(0), *pieces])

    def state(self) -> dict:
        return {"seed": self.entropy, "epoch": self.epoch}

    @classmethod
    def of_state(cls, state: Mapping, stream: int, name: str) -> Counted:
        """The draws that :meth:`state` describes, once its seed and epoch are integers >= 0
        (numpy would refuse a negative one only at the first draw)."""
        return cls(check_integer(f"{name}['seed']", state["seed"], 0), stream,
                   check_integer(f"{name}['epoch']", state["epoch"], 0))


_MT_WORDS = 624  # the Mersenne Twister's state: 624 words and a position among them


class Sequential:
    """dpipe's stream: one ``random_sample()`` of a ``RandomState`` per draw, in order. The
    ``RandomState`` may be the caller's; it advances by one draw per item used, as dpipe's does.

    >>> Sequential(np.random.RandomState(1)).take(0, 2).tolist() == \\
    ...     np.random.RandomState(1).random_sample(2).tolist()
    True
    """

    sequential = True

    def __init__(self, random_state: np.random.RandomState) -> None:
        self.random_state = random_state

    def take(self, position: int, n: int) -> np.ndarray:
        # random_sample(n) makes the same numbers as n calls of random_sample()
        return self.random_state.random_sample(n)

    def advance(self, n: int) -> None:
        for start in range(0, n, BLOCK * 64):
            self.random_state.random_sample(min(BLOCK * 64, n - start))

    def state(self) -> dict:
        state = self.random_state.get_state(legacy=False)
        inner = state["state"]
        return {**state, "state": {"key": inner["key"].tolist(), "pos": int(inner["pos"])}}

    def load(self, state: dict) -> None:
        """Load a state that :func:`rng_state` made."""
        self.random_state.set_state(state)


def rng_state(state: Any, name: str) -> dict:
    """A ``RandomState`` state as :meth:`Sequential.state` saves it, made ready for numpy's
    ``set_state``, once every field is what it must be; otherwise a ``TypeError`` or
    ``ValueError`` that names the field.

    >>> saved = Sequential(np.random.RandomState(0)).state()
    >>> rng_state(saved, "state['random_state']")["state"]["pos"]
    624
    >>> rng_state({**saved, "state": [1, 2]}, "state['random_state']")
    Traceback (most recent call last):
    ...
    TypeError: state['random_state']['state'] must be a dict of 'key' and 'pos'; got [1, 2]
    """
    if not isinstance(state, Mapping) or set(state) != {"bit_generator", "state", "has_gauss",
                                                         "gauss"}:
        raise TypeError(f"{name} must be a dict of 'bit_generator', 'state', 'has_gauss' and "
                        f"'gauss' (a RandomState's state); got {state!r:.120}")
    if state["bit_generator"] != "MT19937":
        raise ValueError(f"{name}['bit_generator'] must be 'MT19937'; got {state['bit_generator']!r:.80}")
    inner = state["state"]
    if not isinstance(inner, Mapping) or set(inner) != {"key", "pos"}:
        raise TypeError(f"{name}['state'] must be a dict of 'key' and 'pos'; got {inner!r:.120}")
    gauss = state["gauss"]
    if isinstance(gauss, bool) or not isinstance(gauss, numbers.Real):
        raise TypeError(f"{name}['gauss'] must be a real number; got {gauss!r:.80}")
    return {"bit_generator": "MT19937", "state": {
        "key": _mt_key(inner["key"], f"{name}['state']['key']"),
        "pos": _bounded(f"{name}['state']['pos']", inner["pos"], _MT_WORDS)},
        "has_gauss": _bounded(f"{name}['has_gauss']", state["has_gauss"], 1),
        "gauss": float(gauss)}


def _mt_key(key: Any, name: str) -> np.ndarray:
    if not isinstance(key, (list, tuple, np.ndarray)) or len(key) != _MT_WORDS or not all(
            isinstance(word, (int, np.integer)) and not isinstance(word, bool) for word in key):
        raise TypeError(f"{name} must be a list of {_MT_WORDS} integers; got {key!r:.80}")
    words = np.asarray(key, dtype=object)
    if not ((words >= 0) & (words < 2 ** 32)).all():
        raise ValueError(f"{name} must hold integers in [0, 2**32); got {key!r:.80}")
    return words.astype(np.uint32)


def _bounded(name: str, value: Any, high: int) -> int:
    value = check_integer(name, value, 0)
    if value > high:
        raise ValueError(f"{name} must be <= {high}; got {name}={value}")
    return value


class Chooser:
    """Indices drawn from uniforms: dpipe's arithmetic, so that its streams are reproduced. Without
    weights ``int(u * count)``; with them, the first index whose normalized cumulative weight
    exceeds ``u``. Zero weights are never chosen (rounding is clipped to the last positive one).

    >>> Chooser(3, np.array([1.0, 0.0, 1.0])).indices(np.array([0.2, 0.7, 0.9999])).tolist()
    [0, 2, 2]
    """

    def __init__(self, count: int, weights: np.ndarray | None) -> None:
        if weights is None:
            self.count, self.cumulative, self.last = count, None, count - 1
        else:
            self.count, self.cumulative = count, np.add.accumulate(weights / weights.sum())
            self._listed = self.cumulative.tolist()
            self.last = int(np.flatnonzero(weights > 0)[-1])

    def index(self, uniform: float) -> int:
        """:meth:`indices` of one draw, with Python numbers (the same arithmetic)."""
        if self.cumulative is None:
            return min(int(uniform * self.count), self.last)
        return min(bisect.bisect_right(self._listed, uniform), self.last)

    def indices(self, uniforms: np.ndarray) -> np.ndarray:
        if self.cumulative is None:
            chosen = (uniforms * self.count).astype(np.int64)
        else:
            chosen = np.searchsorted(self.cumulative, uniforms, side="right")
        return np.minimum(chosen, self.last)


def check_weights(weights: Any, count: int, name: str) -> np.ndarray:
    """``weights`` as a float array, once they are one finite, non-negative weight per element
    and not all zero; otherwise a ``TypeError`` or ``ValueError`` that names them."""
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


def _is_schedule_list(weights: Any) -> bool:
    return isinstance(weights, (list, tuple)) and len(weights) > 0 and \
        isinstance(weights[0], (list, tuple)) and len(weights[0]) == 2


class Schedule:
    """The weights in force at each step: fixed weights (or None: uniform), a list of
    ``(step, weights)`` (each in force from its step on; the first step is 0), or a function
    of the step that returns the weights.

    >>> Schedule(lambda step: [step % 2, 1 - step % 2], 2, "weights").at(3)[0].tolist()
    [1.0, 0.0]
    """

    def __init__(self, weights: Any, count: int, name: str) -> None:
        self.count, self._name, self._function = count, name, None
        self._steps: list[int] = [0]
        self._weights: list[np.ndarray | None] = [None]
        if callable(weights):
            self._function = weights
        elif _is_schedule_list(weights):
            self._check_list(weights)
        elif weights is not None:
            self._weights = [check_weights(weights, count, name)]
        self._key: Any = None
        self._chooser: Chooser | None = None

    def fingerprint(self) -> str:
        """What a state records of these weights, to tell another schedule: ``"uniform"``,
        ``"function"`` (a function of the step, which cannot be checked), or a digest of the
        steps and of each step's weights divided by their sum (weights in proportion draw alike).

        >>> Schedule([1, 3], 2, "w").fingerprint() == Schedule([2, 6], 2, "w").fingerprint()
        True
        >>> Schedule(None, 2, "w").fingerprint(), Schedule(lambda s: [1, 1], 2, "w").fingerprint()
        ('uniform', 'function')
        """
        if self._function is not None:
            return "function"
        if self._weights[0] is None:
            return "uniform"
        digest = hashlib.blake2b(digest_size=8)
        for step, weights in zip(self._steps, self._weights):
            digest.update(np.int64(step).tobytes())
            digest.update((weights / weights.sum()).tobytes())
        return digest.hexdigest()

    def _check_list(self, pairs: Any) -> None:
        name = self._name
        steps = [check_integer(f"{name}[{k}][0]", pair[0], 0) for k, pair in enumerate(pairs)]
        if steps[0] != 0 or any(a >= b for a, b in zip(steps, steps[1:])):
            raise ValueError(f"the steps of {name} must start at 0 and increase; got {steps}")
        self._steps = steps
        self._weights = [check_weights(pair[1], self.count, f"{name}[{k}][1]")
                         for k, pair in enumerate(pairs)]

    def at(self, step: int) -> tuple[np.ndarray | None, int | None]:
        """The weights at ``step``, and the first later step whose weights may differ (None:
        none does)."""
        if self._function is not None:
            weights = check_weights(self._function(step), self.count, f"{self._name}({step})")
            return weights, step + 1
        k = bisect.bisect_right(self._steps, step) - 1
        following = self._steps[k + 1] if k + 1 < len(self._steps) else None
        return self._weights[k], following

    def choose(self, step: int, n: int, draw: Callable[[int], np.ndarray],
               alive: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
        """The indices chosen at steps ``step, ..., step + n - 1`` among the elements ``alive``
        (all without it), from the uniforms ``draw(k)`` gives; and whether all ``n`` were
        chosen: at the first step whose weights give no live element a positive weight, the
        choice stops. The weights are known (and checked) before anything is drawn, so a bad
        weight uses no draw."""
        plan, done = [], 0
        while done < n:
            weights, following = self.at(step + done)
            chooser = self._chooser_for(weights, alive)
            if chooser is None:
                break
            stop = n if following is None else min(n, following - step)
            plan.append((done, stop, chooser))
            done = stop
        uniforms, out = draw(done), np.empty(done, np.int64)
        for start, stop, chooser in plan:
            out[start:stop] = chooser.indices(uniforms[start:stop])
        return out, done == n

    def chooser_at(self, step: int) -> Chooser:
        """The chooser of ``step`` (all elements live)."""
        return self._chooser_for(self.at(step)[0], None)

    def _chooser_for(self, weights: np.ndarray | None, alive: np.ndarray | None) -> Chooser | None:
        if alive is not None:
            weights = np.where(alive, np.ones(self.count) if weights is None else weights, 0.0)
            if not weights.any():
                return None
        key = None if weights is None else weights.tobytes()
        if self._chooser is None or key != self._key:
            # one chooser kept: a schedule changes its weights rarely, or at every step
            self._key, self._chooser = key, Chooser(self.count, weights)
        return self._chooser
