"""Combinators: build transforms from transforms.

A *transform* maps one item to one item. Everything here returns a picklable object with a
readable ``repr`` (never a closure), so it can travel to worker processes with plain pickle.

The dpipe wrappers keep dpipe's argument order: arguments given at call time come before
the ones bound at construction, ``func(x, *call_args, *bound_args, **call_kwargs, **bound_kwargs)``.
The bound keywords are checked against ``func``'s signature when the transform is built, so a
misspelled one (or a misspelled ``random_state``) is a ``TypeError`` that names it; a ``func``
that takes ``**kwargs`` takes any name, so give it its keywords with ``functools.partial``.

>>> from toolz import pipe
>>> def square(x):
...     return x * x
>>> pipe((3, 4), apply_at(0, square), unpack_args(pow))
6561
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from fpipe.errors import (
    MissingParameterError,
    check_callable,
    check_keywords,
    check_probability,
    keyword_names,
)
from fpipe.random import (
    current_rng,
    draw_sample,
    legacy_generator,
    legacy_state,
    numpy_global_call,
    takes_rng,
)

__all__ = [
    "Compose",
    "apply_at",
    "compose",
    "identity",
    "multiply",
    "random_apply",
    "sample_args",
    "unpack_args",
    "zip_apply",
]


def identity(x: Any) -> Any:
    """Return ``x`` unchanged.

    >>> identity(3)
    3
    """
    return x


def func_name(func: Callable) -> str:
    """What reprs and messages call ``func``: its ``__name__``, else its repr. Not in
    ``__all__``, like :func:`call_repr`: fpipe's stages and adapters write their reprs with them.

    >>> func_name(abs), func_name(lambda x: x)
    ('abs', '<lambda>')
    """
    return getattr(func, "__name__", None) or repr(func)


def call_repr(factory: str, positional: Iterable, keywords: Mapping) -> str:
    """The repr of the call ``factory(*positional, **keywords)``, functions by name.

    >>> call_repr("map", (pow, 3), {"seed": 0})
    'map(pow, 3, seed=0)'
    """
    parts = [*map(_arg_repr, positional), *(_keyword_repr(k, v) for k, v in keywords.items())]
    return f"{factory}({', '.join(parts)})"


# The stages' options that count bytes: their reprs say 64 MiB, not 67108864.
_BYTE_OPTIONS = frozenset(("memory_budget", "shared_memory_budget"))
_BINARY_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _keyword_repr(name: str, value: Any) -> str:
    if name in _BYTE_OPTIONS and isinstance(value, int) and not isinstance(value, bool):
        return f"{name}={byte_size(value)}"
    return f"{name}={value!r}"


def byte_size(count: int) -> str:
    """``count`` bytes in the largest binary unit that holds it whole, else to two decimals
    (not in ``__all__``, like :func:`call_repr`: the stages' reprs use it).

    >>> byte_size(67108864), byte_size(3 << 30), byte_size(1536), byte_size(100_000_000), byte_size(10)
    ('64 MiB', '3 GiB', '1.5 KiB', '95.37 MiB', '10 bytes')
    """
    for unit, name in _BINARY_UNITS:
        if count >= unit:
            whole, rest = divmod(count, unit)
            return f"{whole} {name}" if not rest else f"{count / unit:.2f}".rstrip("0") + f" {name}"
    return f"{count} bytes"


class _Bound:
    """A function with bound extra arguments; the base of the dpipe-style wrappers."""

    __slots__ = ("func", "args", "kwargs")
    factory = ""  # the public function that builds this class, for the repr

    def __init__(self, func: Callable, *args: Any, **kwargs: Any) -> None:
        self.func, self.args, self.kwargs = check_callable("func", func), args, kwargs
        _check_forwarded(self.factory, func, kwargs)

    def __reduce__(self):
        return _rebuild, (type(self), (self.func, *self.args), self.kwargs)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.__reduce__() == other.__reduce__()

    def __hash__(self) -> int:
        return hash((type(self), self.func, self.args))

    def __repr__(self) -> str:
        _, (_, positional, keywords) = self.__reduce__()
        return call_repr(self.factory, positional, keywords)


def _check_forwarded(factory: str, func: Callable, kwargs: dict) -> None:
    """A TypeError now, not at the first call, when ``func`` takes no keyword argument of the
    name of one of ``kwargs`` (those that ``factory`` passes on to it)."""
    check_keywords(factory, kwargs, keyword_names(func), func_name(func))


def _rebuild(cls: type, args: tuple, kwargs: dict) -> Any:
    return cls(*args, **kwargs)


def _arg_repr(value: Any) -> str:
    return func_name(value) if callable(value) and hasattr(value, "__name__") else repr(value)


class _UnpackArgs(_Bound):
    __slots__ = ()
    factory = "unpack_args"

    def __call__(self, xs: Iterable | Mapping, *args: Any, **kwargs: Any) -> Any:
        if isinstance(xs, Mapping):
            return self.func(*args, *self.args, **xs, **kwargs, **self.kwargs)
        return self.func(*xs, *args, *self.args, **kwargs, **self.kwargs)


def unpack_args(func: Callable, *args: Any, **kwargs: Any) -> Callable:
    """A transform that calls ``func(*xs)`` on its input ``xs`` (``func(**xs)`` for a mapping).

    ``args`` and ``kwargs`` are passed to ``func`` after the unpacked values.

    >>> def add(x, y):
    ...     return x + y
    >>> unpack_args(add)([1, 2])
    3
    >>> unpack_args(add)({"x": 1, "y": 2})
    3
    """
    return _UnpackArgs(func, *args, **kwargs)


class _Multiply(_Bound):
    __slots__ = ()
    factory = "multiply"

    def __call__(self, xs: Iterable, *args: Any, **kwargs: Any) -> tuple:
        func, bound, keywords = self.func, self.args, self.kwargs
        return tuple(func(x, *args, *bound, **kwargs, **keywords) for x in xs)


def multiply(func: Callable, *args: Any, **kwargs: Any) -> Callable:
    """A transform that maps ``func`` over its input and returns a tuple.

    >>> multiply(abs)([-1, 2, -3])
    (1, 2, 3)
    >>> multiply(round, 1)([1.26, 2.71])
    (1.3, 2.7)
    """
    return _Multiply(func, *args, **kwargs)


class _ApplyAt(_Bound):
    __slots__ = ("index", "_indices")
    factory = "apply_at"

    def __init__(self, index: Any, func: Callable, *args: Any, **kwargs: Any) -> None:
        super().__init__(func, *args, **kwargs)
        self.index, self._indices = index, _check_index(index)

    def __reduce__(self):
        return _rebuild, (type(self), (self.index, self.func, *self.args), self.kwargs)

    def __call__(self, xs: Sequence | Mapping, *args: Any, **kwargs: Any) -> tuple | dict:
        targets = self._targets(xs)
        values = dict(xs) if isinstance(xs, Mapping) else list(xs)
        for i in targets:
            values[i] = self.func(values[i], *args, *self.args, **kwargs, **self.kwargs)
        return values if isinstance(xs, Mapping) else tuple(values)

    def _targets(self, xs: Sequence | Mapping) -> list:
        if isinstance(xs, Mapping):
            missing = [key for key in self._indices if key not in xs]
            if missing:
                raise KeyError(f"index {missing[0]!r} is not a key of the input; keys: {list(xs)}")
            return list(self._indices)
        n = len(xs)
        return list(dict.fromkeys(_normalize(i, n) for i in self._indices))


def _check_index(index: Any) -> tuple:
    indices = tuple(index) if isinstance(index, (list, tuple, range)) else (index,)
    if not indices:
        raise ValueError("index must name at least one position; got index=()")
    return indices


def _normalize(i: int, n: int) -> int:
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range for an input of length {n}")
    return i % n


def apply_at(index: int | Sequence[int], func: Callable, *args: Any, **kwargs: Any) -> Callable:
    """A transform that applies ``func`` at position(s) ``index`` and passes the rest through.

    ``index`` is an int or a sequence of ints (negative ones count from the end; positions
    that coincide are transformed once). The result is a tuple. For a mapping input,
    ``index`` names keys and the result is a dict. A position out of range raises
    ``IndexError`` naming it.

    >>> def square(x):
    ...     return x * x
    >>> apply_at(0, square)([3, 2, 1])
    (9, 2, 1)
    >>> apply_at([0, -1], square)((3, 2, 1))
    (9, 2, 1)
    >>> apply_at("image", square)({"image": 4, "label": 1})
    {'image': 16, 'label': 1}
    """
    return _ApplyAt(index, func, *args, **kwargs)


class _ZipApply:
    __slots__ = ("functions", "kwargs")
    factory = "zip_apply"

    def __init__(self, *functions: Callable, **kwargs: Any) -> None:
        for position, func in enumerate(functions):
            check_callable(f"functions[{position}]", func)
            _check_forwarded(self.factory, func, kwargs)
        self.functions, self.kwargs = functions, kwargs

    def __call__(self, xs: Iterable, **kwargs: Any) -> tuple:
        values = tuple(xs)
        if len(values) != len(self.functions):
            raise ValueError(f"zip_apply has {len(self.functions)} functions but the input has "
                             f"{len(values)} values")
        return tuple(f(x, **kwargs, **self.kwargs) for f, x in zip(self.functions, values))

    def __reduce__(self):
        return _rebuild, (type(self), self.functions, self.kwargs)

    __eq__, __hash__, __repr__ = _Bound.__eq__, _Bound.__hash__, _Bound.__repr__


def zip_apply(*functions: Callable, **kwargs: Any) -> Callable:
    """A transform that applies the k-th function to the k-th value of its input.

    Unlike dpipe's, it raises ``ValueError`` when the input does not have exactly one value
    per function, instead of silently dropping the extra ones.

    >>> zip_apply(abs, str)([-4, 9])
    (4, '9')
    """
    return _ZipApply(*functions, **kwargs)


class _RandomApply(_Bound):
    __slots__ = ("p", "random_state")
    factory = "random_apply"

    def __init__(self, p: float, func: Callable, *args: Any, random_state: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(func, *args, **kwargs)
        check_probability("p", p)
        self.p, self.random_state = p, legacy_state(random_state)

    def __reduce__(self):
        keywords = self.kwargs if self.random_state is None else {
            **self.kwargs, "random_state": self.random_state}
        return _rebuild, (type(self), (self.p, self.func, *self.args), keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._applies():
            return self.func(*args, *self.args, **kwargs, **self.kwargs)
        return args[0] if len(args) == 1 else args

    def _applies(self) -> bool:
        if self.random_state is not None:
            return bool(self.random_state.binomial(1, self.p))  # dpipe's draw, from this state
        return current_rng().random() < self.p


def random_apply(p: float, func: Callable, *args: Any, random_state: Any = None,
                 **kwargs: Any) -> Callable:
    """A transform that applies ``func`` with probability ``p`` and otherwise returns its input.

    The coin comes from the active item generator inside a seeded stage (reproducible for
    any number of workers), and from fresh entropy elsewhere. Unlike dpipe's, it never
    touches numpy's global random state, and a bad ``p`` raises at construction.

    ``random_state`` (an int or a ``numpy.random.RandomState``, which it then draws from)
    gives exactly the coins of dpipe 0.5.0's ``random_apply`` after ``np.random.seed(int)``
    (or with that ``RandomState``'s state as the global one): for porting an experiment
    whose results must not change. Each copy of the transform (each worker process) then
    draws the same coins: in parallel stages, seed the stage instead.

    >>> from fpipe.random import using_rng, item_rng
    >>> random_apply(1.0, abs)(-3), random_apply(0.0, abs)(-3)
    (3, -3)
    >>> with using_rng(item_rng(0, 0, 0)):
    ...     flip = random_apply(0.5, abs)(-3)
    >>> with using_rng(item_rng(0, 0, 0)):
    ...     flip == random_apply(0.5, abs)(-3)
    True
    >>> flip = random_apply(0.5, abs, random_state=1)
    >>> [flip(-1) for _ in range(6)]
    [-1, 1, -1, -1, -1, -1]
    """
    return _RandomApply(p, func, *args, random_state=random_state, **kwargs)


class _SampleArgs(_Bound):
    __slots__ = ("random_state",)
    factory = "sample_args"

    def __init__(self, func: Callable, *args: Callable, random_state: Any = None,
                 **kwargs: Callable) -> None:
        # the names first: a misspelled keyword is reported as such, whatever its value
        _check_forwarded(self.factory, check_callable("func", func), kwargs)
        for position, sampler in enumerate(args):
            check_callable(f"args[{position}]", sampler)
        for name, sampler in kwargs.items():
            check_callable(name, sampler)
        super().__init__(func, *args, **kwargs)
        self.random_state = legacy_state(random_state)

    def __reduce__(self):
        keywords = self.kwargs if self.random_state is None else {
            **self.kwargs, "random_state": self.random_state}
        return _rebuild, (type(self), (self.func, *self.args), keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        draw = self._draw_legacy if self.random_state is not None else draw_sample
        drawn = [draw(s) for s in self.args]
        named = {k: draw(s) for k, s in self.kwargs.items()}
        return self.func(*args, *drawn, **kwargs, **named)

    def _draw_legacy(self, sampler: Callable) -> Any:
        """Draw as dpipe did after ``np.random.seed``: numpy's global functions from this
        ``RandomState``, fpipe's samplers from a Generator over the same bits."""
        state = self.random_state
        if takes_rng(sampler):
            return sampler(legacy_generator(state))
        call = numpy_global_call(sampler)
        if call is None:
            return sampler()
        name, args, kwargs = call
        return getattr(state, name)(*args, **kwargs)


def sample_args(func: Callable, *args: Callable, random_state: Any = None,
                **kwargs: Callable) -> Callable:
    """A transform that calls ``func`` with extra arguments drawn afresh at every call.

    Each of ``args`` and ``kwargs`` is a sampler: either a callable of no argument (dpipe
    style, such as ``np.random.normal``) or one that takes the generator, such as
    :func:`fpipe.random.uniform` or ``lambda rng: rng.integers(4)``. Samplers of the second kind
    draw from the active item generator inside a seeded stage, so they are reproducible.
    So do NumPy's global functions (``np.random.normal``, or a ``functools.partial`` of one):
    inside a seeded stage they draw from the item's generator, through the ``Generator``
    method of the same meaning. Any other sampler of no argument that changes NumPy's global
    state inside a seeded stage (``lambda: np.random.normal(0, 2)``) raises ``RuntimeError``
    rather than be silently unreproducible.

    ``random_state`` (an int or a ``numpy.random.RandomState``) gives exactly the draws of
    dpipe 0.5.0's ``sample_args`` after ``np.random.seed(int)``: NumPy's global functions
    draw from that state instead (see :func:`random_apply`).

    >>> import fpipe, numpy as np
    >>> shift = sample_args(lambda x, by: x + by, by=fpipe.random.integers(10, 11))
    >>> shift(1)
    11
    >>> noisy = sample_args(lambda x, by: x + by, by=np.random.uniform, random_state=0)
    >>> round(noisy(0), 4)
    0.5488
    """
    return _SampleArgs(func, *args, random_state=random_state, **kwargs)


class _Step:
    """One function of a composition, with how its named parameters are read from params."""

    __slots__ = ("func", "prefix", "routes")

    def __init__(self, func: Callable, prefix: str) -> None:
        self.func, self.prefix = func, prefix
        self.routes = tuple((name, prefix + name, required)
                            for name, required in _named_parameters(func))

    def __call__(self, value: Any, params: Mapping) -> Any:
        kwargs = {}
        for name, key, required in self.routes:
            if key in params:
                kwargs[name] = params[key]
            elif required:
                raise MissingParameterError(name, key, func_name(self.func))
        return self.func(value, **kwargs)


def _named_parameters(func: Callable) -> list[tuple[str, bool]]:
    """The parameters after the value, as ``(name, required)``; rejects functions that
    cannot take the value."""
    check_callable("transform", func)
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return []  # builtins and ufuncs without a signature take the value alone
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    if not parameters or parameters[0].kind not in positional:
        raise ValueError(f"{func_name(func)} takes no positional parameter, so it cannot receive "
                         "the value; a composed function takes the value first")
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [(p.name, p.default is p.empty) for p in parameters[1:] if p.kind in named]


class Compose(functools.partial):
    """Transforms composed in the order given, first to last, with parameters read from a mapping.

    ``Compose(f, g)(x)`` is ``g(f(x))``, like ``toolz.pipe(x, f, g)`` and datadings's
    ``Compose`` — the *reverse* of ``toolz.compose``, whose first function is applied last.

    Each function receives the value first. Its other named parameters are filled from the
    ``params`` mapping passed at call time, looked up as ``prefix + name``: with
    ``prefix="mask_"``, parameter ``size`` is read from ``params["mask_size"]`` and passed as
    ``size=`` (datadings passes it as ``mask_size=``, so prefixed parameters never work
    there). A missing required parameter raises
    :class:`~fpipe.errors.MissingParameterError` (a ``KeyError``) naming the parameter and
    the function. Nested compositions are flattened, their prefixes prepended by the outer
    prefix, so composition is associative, parameter routing included.

    >>> def add(x, number):
    ...     return x + number
    >>> def scale(x, factor=2):
    ...     return x * factor
    >>> Compose(add, scale)(1, {"number": 3})
    8
    >>> Compose(add, scale, prefix="mask_")(1, {"mask_number": 3, "mask_factor": 10})
    40
    >>> Compose([abs, str])(-5)
    '5'
    """

    # A partial of a function compiled for these steps: calling it costs about as much as
    # the hand-written nested call, where a Python-level __call__ loop costs twice that.

    def __new__(cls, *transforms: Callable | Iterable[Callable], prefix: str = "") -> Compose:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str; got prefix={prefix!r}")
        if len(transforms) == 1 and not callable(transforms[0]):
            transforms = tuple(transforms[0])
        steps = tuple(_flatten(transforms, prefix))
        self = super().__new__(cls, _compile(steps))
        self.steps = steps
        return self

    @property
    def funcs(self) -> tuple[Callable, ...]:
        """The composed functions, flattened, in the order they are applied."""
        return tuple(step.func for step in self.steps)

    def __reduce__(self):
        return _rebuild_compose, (tuple((s.func, s.prefix) for s in self.steps),)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compose) and self.__reduce__() == other.__reduce__()

    def __hash__(self) -> int:
        return hash(self.__reduce__()[1])

    def __repr__(self) -> str:
        parts = [_arg_repr(s.func) if not s.prefix else
                 f"Compose({_arg_repr(s.func)}, prefix={s.prefix!r})" for s in self.steps]
        return f"Compose({', '.join(parts)})"


_EMPTY: Mapping = {}


def _compile(steps: tuple[_Step, ...]) -> Callable:
    """A function ``(value, params=None)`` that runs ``steps`` as straight-line code."""
    namespace: dict[str, Any] = {"_EMPTY": _EMPTY}
    lines = ["def composed(value, params=None):"]
    if any(step.routes for step in steps):
        lines.append("    params = _EMPTY if params is None else params")
    for i, step in enumerate(steps):
        namespace[f"f{i}"] = step if step.routes else step.func
        lines.append(f"    value = f{i}(value, params)" if step.routes else f"    value = f{i}(value)")
    lines.append("    return value")
    exec("\n".join(lines), namespace)
    return namespace["composed"]


def _flatten(transforms: Iterable[Callable], prefix: str) -> Iterable[_Step]:
    for func in transforms:
        if isinstance(func, Compose):
            yield from (_Step(step.func, prefix + step.prefix) for step in func.steps)
        else:
            yield _Step(func, prefix)


def _rebuild_compose(steps: tuple) -> Compose:
    return Compose(*(Compose(func, prefix=prefix) for func, prefix in steps))


def compose(*funcs: Callable | Iterable[Callable], prefix: str = "") -> Compose:
    """Compose transforms first to last: ``compose(f, g)(x) == g(f(x))``; see :class:`Compose`.

    >>> from toolz import pipe
    >>> compose(abs, str)(-5) == pipe(-5, abs, str)
    True
    >>> compose()(7)
    7
    """
    return Compose(*funcs, prefix=prefix)


# datadings.torch's two helpers; fpipe.torch exports them (they need no torch)


def no_rng(_: Any) -> dict:
    """The default ``rng``: no parameters, whatever the sample.

    >>> no_rng({"image": b"..."})
    {}
    """
    return {}


def dict2tuple(it: Iterable[Mapping], keys: tuple = ("image", "label")) -> Iterator[tuple]:
    """Yield ``tuple(sample[k] for k in keys)`` for each sample (or collated batch) of ``it``.

    >>> list(dict2tuple([{"image": 1, "label": 0, "key": "a"}]))
    [(1, 0)]
    """
    for sample in it:
        yield tuple(sample[k] for k in keys)
