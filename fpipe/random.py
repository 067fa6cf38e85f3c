"""Seeds, and the random generator each item gets.

fpipe never touches global random state. Anything random takes a ``seed`` (or dpipe's
``random_state``): an ``int``, a :class:`numpy.random.Generator`, a
:class:`numpy.random.SeedSequence`, a :class:`numpy.random.RandomState` (for dpipe code) or
``None`` for fresh entropy.

A seeded stage gives each item its own generator, derived from ``(seed, epoch, index)`` alone,
so what an item draws does not depend on the items before it, on the number of workers or on
the backend:

>>> a = item_rng(7, epoch=0, index=3).random()
>>> b = item_rng(7, epoch=0, index=3).random()
>>> a == b, a == item_rng(7, epoch=1, index=3).random()
(True, False)

While a stage runs a function on an item, that item's generator is *active*: the combinators
(:func:`fpipe.random_apply`, :func:`fpipe.sample_args`) and the ready samplers below draw from
it. Outside a seeded stage there is no active generator and they draw fresh entropy.

>>> with using_rng(item_rng(7, 0, 3)):
...     print(uniform(0, 1)(active_rng()) == a)
True
>>> print(active_rng())
None
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Union

import numpy as np

from fpipe.errors import check_callable, check_keywords, keyword_names

__all__ = [
    "Sampler",
    "Seed",
    "active_rng",
    "as_generator",
    "choice",
    "current_rng",
    "integers",
    "item_rng",
    "normal",
    "seed_entropy",
    "uniform",
    "using_rng",
]

Seed = Union[int, np.integer, np.random.Generator, np.random.SeedSequence,
             np.random.RandomState, None]

_ENTROPY_BOUND = 2 ** 63


def seed_entropy(seed: Seed) -> int:
    """Turn any accepted seed into one non-negative ``int`` from which items' seeds derive.

    A generator or ``RandomState`` is drawn from once (it is the caller's, so that is allowed);
    ``None`` gives fresh entropy, which a caller can store to reproduce a run.

    >>> seed_entropy(5)
    5
    >>> seed_entropy(np.random.default_rng(0)) == seed_entropy(np.random.default_rng(0))
    True
    >>> seed_entropy(-1)
    Traceback (most recent call last):
    ...
    ValueError: seed must be a non-negative integer; got seed=-1
    """
    if seed is None:
        return int(np.random.SeedSequence().entropy)
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"seed must be an int, Generator, SeedSequence or RandomState; got seed={seed!r}")
    if isinstance(seed, (int, np.integer)):
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer; got seed={seed!r}")
        return int(seed)
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(_ENTROPY_BOUND))
    if isinstance(seed, np.random.RandomState):
        return int(seed.randint(0, _ENTROPY_BOUND, dtype=np.int64))
    if isinstance(seed, np.random.SeedSequence):
        low, high = seed.generate_state(2, np.uint32)
        return int(low) | int(high) << 32
    raise TypeError(
        f"seed must be an int, Generator, SeedSequence or RandomState; got seed={seed!r}")


def optional_entropy(seed: Seed | None) -> int | None:
    """:func:`seed_entropy` of ``seed``, but None stays None (an unseeded stage). Not in
    ``__all__``: fpipe's stages call it.

    >>> optional_entropy(None) is None, optional_entropy(7)
    (True, 7)
    """
    return None if seed is None else seed_entropy(seed)


def as_generator(seed: Seed) -> np.random.Generator:
    """A :class:`numpy.random.Generator` for ``seed``; a generator passes through unchanged.

    >>> bool(as_generator(3).integers(100) == as_generator(3).integers(100))
    True
    >>> g = np.random.default_rng(1)
    >>> as_generator(g) is g
    True
    """
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed_entropy(seed))


def item_rng(seed: Seed, epoch: int, index: int) -> np.random.Generator:
    """The generator of item ``index`` in ``epoch`` of a stage seeded with ``seed``.

    Pass an ``int`` seed (see :func:`seed_entropy`) so that the result depends on the three
    numbers alone.

    >>> int(item_rng(0, 0, 0).integers(10 ** 6)) == int(item_rng(0, 0, 0).integers(10 ** 6))
    True
    """
    sequence = np.random.SeedSequence(seed_entropy(seed), spawn_key=(int(epoch), int(index)))
    return np.random.Generator(np.random.PCG64(sequence))


class _Active(threading.local):
    rng: np.random.Generator | None = None


_active = _Active()
_fallback: dict[int, np.random.Generator] = {}


def active_rng() -> np.random.Generator | None:
    """The generator of the item being processed in this thread, or None outside a seeded stage.

    >>> active_rng() is None
    True
    """
    return _active.rng


def current_rng() -> np.random.Generator:
    """The active generator, or else this process's unseeded one (fresh entropy per process).

    >>> current_rng() is current_rng()
    True
    """
    rng = _active.rng
    if rng is not None:
        return rng
    pid = os.getpid()
    if pid not in _fallback:
        # keyed by pid so that forked workers do not replay their parent's draws
        _fallback[pid] = np.random.default_rng()
    return _fallback[pid]


@contextmanager
def using_rng(rng: np.random.Generator | None) -> Iterator[np.random.Generator | None]:
    """Make ``rng`` the active generator of this thread inside the ``with`` block.

    >>> with using_rng(np.random.default_rng(0)):
    ...     active_rng() is not None
    True
    """
    previous, _active.rng = _active.rng, rng
    try:
        yield rng
    finally:
        _active.rng = previous


def set_active(rng: np.random.Generator | None) -> np.random.Generator | None:
    """Make ``rng`` the active generator and return the one it replaces: :func:`using_rng`
    without a context manager, for per-item loops (not in ``__all__``: fpipe's stages and
    torch adapters use it; call it again with what it returned to restore).

    >>> rng = np.random.default_rng(0)
    >>> previous = set_active(rng)
    >>> active_rng() is rng, set_active(previous) is rng, active_rng() is previous
    (True, True, True)
    """
    previous, _active.rng = _active.rng, rng
    return previous


class Sampler:
    """A picklable sampler: ``sampler(rng)`` returns ``draw(rng, *args, **kwargs)``.

    :func:`fpipe.sample_args` calls a sampler with the active generator; called with no
    generator, a sampler draws from :func:`current_rng`. ``draw`` must be a module-level
    function, so that the sampler pickles.

    >>> Sampler(_integers, 0, 10)(np.random.default_rng(0)) in range(10)
    True
    >>> uniform(-1.0, 1.0)
    uniform(-1.0, 1.0)
    """

    __slots__ = ("draw", "args", "kwargs")

    def __init__(self, draw: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.draw, self.args, self.kwargs = check_callable("draw", draw), args, kwargs
        check_keywords("Sampler", kwargs, keyword_names(draw), getattr(draw, "__name__", repr(draw)))

    def __call__(self, rng: np.random.Generator | None = None) -> Any:
        return self.draw(rng if rng is not None else current_rng(), *self.args, **self.kwargs)

    def __reduce__(self):
        return _rebuild_sampler, (self.draw, self.args, self.kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sampler) and (self.draw, self.args, self.kwargs) == (
            other.draw, other.args, other.kwargs)

    def __hash__(self) -> int:
        return hash((self.draw, self.args))

    def __repr__(self) -> str:
        parts = [*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())]
        return f"{self.draw.__name__.lstrip('_')}({', '.join(parts)})"


def _rebuild_sampler(draw: Callable[..., Any], args: tuple, kwargs: dict) -> Sampler:
    return Sampler(draw, *args, **kwargs)


def _uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(rng.uniform(low, high))


def _normal(rng: np.random.Generator, loc: float, scale: float) -> float:
    return float(rng.normal(loc, scale))


def _integers(rng: np.random.Generator, low: int, high: int | None) -> int:
    return int(rng.integers(low, high))


def _choice(rng: np.random.Generator, options: tuple, p: tuple | None) -> Any:
    return options[int(rng.choice(len(options), p=p))]


def uniform(low: float = 0.0, high: float = 1.0) -> Sampler:
    """A sampler of floats uniform in ``[low, high)``.

    >>> 2.0 <= uniform(2.0, 3.0)(np.random.default_rng(0)) < 3.0
    True
    """
    if not low <= high:
        raise ValueError(f"low must not exceed high; got low={low!r}, high={high!r}")
    return Sampler(_uniform, low, high)


def normal(loc: float = 0.0, scale: float = 1.0) -> Sampler:
    """A sampler of normally distributed floats.

    >>> isinstance(normal(0.0, 2.0)(np.random.default_rng(0)), float)
    True
    """
    if not scale >= 0:
        raise ValueError(f"scale must be non-negative; got scale={scale!r}")
    return Sampler(_normal, loc, scale)


def integers(low: int, high: int | None = None) -> Sampler:
    """A sampler of integers in ``[low, high)`` (or ``[0, low)`` when ``high`` is None).

    >>> integers(5)(np.random.default_rng(0)) in range(5)
    True
    """
    if (high is None and low < 1) or (high is not None and high <= low):
        raise ValueError(f"the range [low, high) must not be empty; got low={low!r}, high={high!r}")
    return Sampler(_integers, low, high)


def choice(options: Sequence[Any], p: Sequence[float] | None = None) -> Sampler:
    """A sampler that picks one of ``options`` (with probabilities ``p``).

    >>> choice(["a", "b"], p=[0.0, 1.0])(np.random.default_rng(0))
    'b'
    """
    if len(options) == 0:
        raise ValueError("options must not be empty")
    if p is not None and len(p) != len(options):
        raise ValueError(f"p must have one probability per option; got {len(p)} for {len(options)}")
    return Sampler(_choice, tuple(options), None if p is None else tuple(p))


def takes_rng(sampler: Callable) -> bool:
    """Whether ``sampler`` wants the generator as its one argument (fpipe style), rather than
    no argument at all (dpipe style, such as ``np.random.normal``)."""
    if isinstance(sampler, Sampler):
        return True
    try:
        parameters = inspect.signature(sampler).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in parameters if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1


# NumPy's global sampling functions whose Generator method has another name
_GENERATOR_NAMES = {"rand": "random", "random_sample": "random", "ranf": "random",
                    "sample": "random", "randn": "standard_normal", "randint": "integers"}
_NOT_SAMPLERS = frozenset({"seed", "get_state", "set_state", "default_rng", "get_bit_generator",
                           "set_bit_generator"})


def numpy_global_call(sampler: Callable) -> tuple[str, tuple, dict] | None:
    """``(name, args, kwargs)`` when ``sampler`` is one of NumPy's global functions
    (``np.random.normal``) or a ``functools.partial`` of one, else None. Not in ``__all__``.

    >>> numpy_global_call(functools.partial(np.random.uniform, -1, high=1))
    ('uniform', (-1,), {'high': 1})
    >>> numpy_global_call(lambda: 0) is None
    True
    """
    func, args, kwargs = sampler, (), {}
    if isinstance(sampler, functools.partial):
        func, args, kwargs = sampler.func, sampler.args, dict(sampler.keywords)
    name = getattr(func, "__name__", None)
    if not isinstance(name, str) or getattr(np.random, name, None) is not func:
        return None
    return name, args, kwargs


def generator_call(rng: np.random.Generator, name: str, args: tuple, kwargs: dict) -> Any:
    """What ``np.random.<name>(*args, **kwargs)`` means, drawn from ``rng``; a ``TypeError``
    for a global function that has no ``Generator`` counterpart. Not in ``__all__``.

    >>> generator_call(np.random.default_rng(0), "randint", (3,), {}) in range(3)
    True
    """
    method = _GENERATOR_NAMES.get(name, name)
    if name in _NOT_SAMPLERS or not callable(getattr(rng, method, None)):
        raise TypeError(f"np.random.{name} has no numpy.random.Generator counterpart, so inside a "
                        "seeded stage it cannot draw from the item's generator; use a sampler "
                        "that takes the generator (lambda rng: ...) or one of fpipe's samplers")
    if name in ("rand", "randn") and args:  # dimensions given one by one
        args, kwargs = (), {**kwargs, "size": args}
    return getattr(rng, method)(*args, **kwargs)


def draw_sample(sampler: Callable) -> Any:
    """One draw of a :func:`fpipe.sample_args` sampler. Inside a seeded stage, every draw
    comes from the item's generator, or fails: NumPy's global functions are mapped onto it,
    and any other sampler of no argument that changes NumPy's global state raises
    ``RuntimeError``. Not in ``__all__``.

    >>> with using_rng(item_rng(0, 0, 0)):
    ...     a = draw_sample(np.random.normal)
    >>> with using_rng(item_rng(0, 0, 0)):
    ...     a == draw_sample(np.random.normal) == float(item_rng(0, 0, 0).normal())
    True
    """
    if takes_rng(sampler):
        return sampler(current_rng())
    rng = _active.rng
    if rng is None:
        return sampler()  # outside a seeded stage, as in dpipe
    call = numpy_global_call(sampler)
    if call is not None:
        return generator_call(rng, *call)
    before = _global_mark()
    value = sampler()
    if _global_mark() != before:
        raise RuntimeError(
            f"the sampler {getattr(sampler, '__name__', sampler)!s} drew from NumPy's global "
            "random state inside a seeded stage, which makes the stage unreproducible; pass "
            "np.random.<function> itself (or a functools.partial of it), or a sampler that takes "
            "the generator: lambda rng: rng.normal(0, 2)")
    return value


def _global_mark() -> tuple:
    state = np.random.get_state(legacy=False)["state"]
    return state["pos"], state["key"].tobytes()


def legacy_state(random_state: Any) -> np.random.RandomState | None:
    """dpipe's ``random_state`` argument as a ``RandomState`` (an int seeds a new one; a
    ``RandomState`` is used, and advanced, as it is); None stays None. Not in ``__all__``.

    >>> legacy_state(1).randint(10) == np.random.RandomState(1).randint(10)
    True
    """
    if random_state is None or isinstance(random_state, np.random.RandomState):
        return random_state
    if isinstance(random_state, (bool, np.bool_)) or not isinstance(random_state, (int, np.integer)):
        raise TypeError("random_state must be an int or a numpy.random.RandomState (as in dpipe); "
                        f"got random_state={random_state!r}; for a Generator or fpipe's per-item "
                        "seeds, pass seed= to the stage instead")
    if not 0 <= random_state < 2 ** 32:
        raise ValueError(f"random_state must be in [0, 2**32), as NumPy's legacy seeds are; "
                         f"got random_state={random_state!r}")
    return np.random.RandomState(int(random_state))


def legacy_generator(state: np.random.RandomState) -> np.random.Generator:
    """A Generator over the bits of ``state``, so that fpipe's samplers and NumPy's legacy
    functions draw from one stream. Not in ``__all__``."""
    # RandomState has no public accessor for its bit generator; this one is stable since 1.17
    return np.random.Generator(state._bit_generator)


def shard_seed(seed: int, start: int) -> int:
    """The seed of the shard that begins at ``start``: a 3-number spawn key, so that no
    shard's seed is ever an item generator's (2 numbers).

    >>> shard_seed(0, 5) == shard_seed(0, 5) != shard_seed(0, 6)
    True
    """
    return seed_entropy(np.random.SeedSequence(seed, spawn_key=(start, 0, 1)))


def order_keys(seed: int, epoch: int, count: int) -> np.ndarray:
    """``count`` 64-bit keys of the order of epoch ``epoch`` under ``seed`` (an ordering's round
    keys): a 3-number spawn key of its own, so that they are no item's or shard's seed.

    >>> keys = order_keys(0, 1, 4)
    >>> keys.dtype, len(keys), keys.tolist() == order_keys(0, 1, 4).tolist()
    (dtype('uint64'), 4, True)
    >>> keys.tolist() == order_keys(0, 2, 4).tolist()
    False
    """
    return np.random.SeedSequence(seed, spawn_key=(epoch, 0, 2)).generate_state(count, np.uint64)
