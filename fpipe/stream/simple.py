"""The simple stages: :func:`map`, :func:`filter`, :func:`take` and :func:`transform_stream`.
They work in the consumer's thread, a chunk at a time.

>>> from toolz import pipe
>>> list(pipe(range(10), map(lambda x: x * x), filter(lambda x: x % 2), take(3)))
[1, 9, 25]
"""

from __future__ import annotations

import builtins
import functools
import inspect
import operator
import reprlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fpipe.errors import CapturedError, capture, check_bool, check_callable, check_integer
from fpipe.functional import call_repr, func_name
from fpipe.random import Seed, item_rng, optional_entropy, set_active
from fpipe.skipping import OnError, SkipLog, check_max_errors, check_on_error, handle
from fpipe.stream.core import (
    Stage,
    Stream,
    as_stream,
    checked_fields,
    generator_stream,
    mapped_stream,
)
from fpipe.stream.parallel.planner import plan_map

__all__ = ["filter", "map", "take", "transform_stream"]


class ItemCall:
    """``func(item, *args, **kwargs)`` over a chunk, each item's generator active when seeded.
    A class, not a closure, so that it pickles to worker processes."""

    __slots__ = ("func", "args", "kwargs", "seed", "epoch", "on_error")

    def __init__(self, func: Callable, args: tuple, kwargs: dict, seed: int | None,
                 epoch: int, on_error: OnError = "raise") -> None:
        self.func, self.args, self.kwargs, self.seed, self.epoch = func, args, kwargs, seed, epoch
        self.on_error = on_error

    def __reduce__(self):
        return ItemCall, (self.func, self.args, self.kwargs, self.seed, self.epoch, self.on_error)

    def into(self, outputs: list, chunk: list, start: int) -> None:
        """Append the results to ``outputs``; on an error, the results before it stay there.
        With ``on_error`` other than ``"raise"``, a failed item appends its :class:`Skipped`
        record instead (the consumer's :class:`SkipLog` takes it out). A StopIteration from
        ``func`` is raised as a RuntimeError that names the item (see :func:`stop_error`)."""
        if self.on_error != "raise":
            self._into_skipping(outputs, chunk, start)
            return
        mark = len(outputs)
        if self.seed is None and not (self.args or self.kwargs):
            outputs.extend(builtins.map(self.func, chunk))
            done = len(outputs) - mark
            if done == len(chunk):
                return
            # extend took a StopIteration from func for the end of the chunk: the item that
            # raised it goes again through the loop, which sees it
            chunk, start, mark = chunk[done:], start + done, len(outputs)
        try:
            self._into_raising(outputs, chunk, start)
        except StopIteration as stop:
            index = len(outputs) - mark  # one result per item, up to the one that failed
            raise stop_error(self.func, chunk[index], start + index) from stop

    def _into_raising(self, outputs: list, chunk: list, start: int) -> None:
        func, args, kwargs, append = self.func, self.args, self.kwargs, outputs.append
        if self.seed is None:
            if args or kwargs:
                for item in chunk:
                    append(func(item, *args, **kwargs))
            else:
                for item in chunk:
                    append(func(item))
            return
        for index, item in enumerate(chunk, start):
            previous = set_active(item_rng(self.seed, self.epoch, index))
            try:
                append(func(item, *args, **kwargs))
            finally:
                set_active(previous)

    def _into_skipping(self, outputs: list, chunk: list, start: int) -> None:
        for index, item in enumerate(chunk, start):
            try:
                outputs.append(self._call_one(item, index))
            except Exception as error:
                outputs.append(handle(self.on_error, error, item, index))

    def _call_one(self, item: Any, index: int) -> Any:
        previous = None if self.seed is None else set_active(
            item_rng(self.seed, self.epoch, index))
        try:
            return self.func(item, *self.args, **self.kwargs)
        except StopIteration as stop:
            raise stop_error(self.func, item, index) from stop
        finally:
            if self.seed is not None:
                set_active(previous)

    def run(self, chunk: list, start: int) -> tuple[list, CapturedError | None, float]:
        """``(results, captured error or None, seconds)``: what a worker sends back."""
        began, outputs = time.perf_counter(), []
        try:
            self.into(outputs, chunk, start)
        except BaseException as error:  # a worker must report even SystemExit, not die
            return outputs, capture(error), time.perf_counter() - began
        return outputs, None, time.perf_counter() - began


def stop_error(func: Callable, item: Any, index: int) -> RuntimeError:
    """The error that stands for a StopIteration raised by ``func`` on item ``index``: raised
    as it is, it would end the consumer's loop as if the stream had ended, and the items after
    it would be lost without a word. A generator turns it into a RuntimeError too (PEP 479).

    >>> stop_error(abs, "x", 5)
    RuntimeError("abs raised StopIteration on item 5 ('x')")
    """
    return RuntimeError(f"{func_name(func)} raised StopIteration on item {index} "
                        f"({reprlib.repr(item)})")


def stage_repr(name: str, func: Callable, args: tuple, options: dict) -> str:
    """The repr of a stage built by ``name(func, *args, **options)``; None options are left out,
    and a ``functools.partial`` shows as the call that made it.

    >>> stage_repr("threads", functools.partial(pow, exp=2), (), {"n_workers": 2, "seed": None})
    'threads(partial(pow, exp=2), n_workers=2)'
    """
    if type(func) is functools.partial:
        func = _Shown(shown_name(func))
    return call_repr(name, (func, *args), {k: v for k, v in options.items() if v is not None})


def shown_name(func: Callable) -> str:
    """What reprs and messages call ``func``: its name, or the call of a ``functools.partial``.

    >>> shown_name(abs), shown_name(functools.partial(pow, exp=2))
    ('abs', 'partial(pow, exp=2)')
    """
    if type(func) is functools.partial:
        return call_repr("partial", (func.func, *func.args), func.keywords)
    return func_name(func)


class _Shown:
    """A value whose repr is ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def check_call(name: str, func: Callable, args: tuple, kwargs: dict, first: str = "item",
               workers: bool = False) -> None:
    """A ``TypeError`` at once if ``func(item, *args, **kwargs)`` does not fit ``func``'s
    signature: the arguments after ``func`` go to it, and the stage's own options are keyword
    arguments, so ``threads(load, 2)`` passes 2 to ``load``. A function whose signature cannot
    be read (some built-ins) is left to its call. ``first`` names what comes before ``args``;
    ``workers`` says that the stage has ``n_workers``, which the message then suggests.

    >>> check_call("threads", len, (2,), {}, workers=True)
    Traceback (most recent call last):
    ...
    TypeError: threads(len, 2): len(item, 2) does not fit len's signature (too many positional \
arguments): the arguments after the function go to it; did you mean threads(len, n_workers=2)?
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as error:
        name_of = shown_name(func)
        call = call_repr(name_of, (first, *args), kwargs).replace(repr(first), first, 1)
        hint = ""
        if workers and args and isinstance(args[0], int) and not isinstance(args[0], bool):
            hint = f"; did you mean {name}({name_of}, n_workers={args[0]})?"
        elif workers and (args or kwargs):
            hint = f" (the options of {name}, n_workers= and the others, are keyword arguments)"
        after = ": the arguments after the function go to it" if args or kwargs else ""
        raise TypeError(f"{stage_repr(name, func, args, kwargs)}: {call} does not fit "
                        f"{name_of}'s signature ({error}){after}{hint}") from None


class _MapStage(Stage):
    one_to_one = True

    def __init__(self, func: Callable, args: tuple, kwargs: dict, seed: Seed | None,
                 on_error: OnError = "raise", max_errors: int | None = None,
                 in_workers: bool = False) -> None:
        self.func, self.args, self.kwargs = check_callable("func", func), args, kwargs
        check_call("map", func, args, kwargs)
        self.seed = optional_entropy(seed)
        self.on_error, self.max_errors = check_on_error(on_error), check_max_errors(max_errors)
        self.in_workers = check_bool("in_workers", in_workers)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        call = ItemCall(self.func, self.args, self.kwargs, self.seed, epoch, self.on_error)
        return plan_map(self, call, as_stream(iterable), start,
                        lambda upstream: self._stream(upstream, call, start))

    def _stream(self, upstream: Stream, call: ItemCall, start: int) -> Stream:
        if self.on_error == "raise":
            return mapped_stream(upstream, repr(self), call.into, start)
        log = SkipLog(self.max_errors)
        stream = mapped_stream(upstream, repr(self), SkippingInto(call.into, log), start)
        stream.skips = log
        return stream

    def __repr__(self) -> str:
        return stage_repr("map", self.func, self.args, {"seed": self.seed, **error_options(self),
                                                        "in_workers": self.in_workers or None,
                                                        **self.kwargs})


class SkippingInto:
    """``into(outputs, chunk, start)`` whose :class:`Skipped` records go to ``log``, not to
    the outputs (also when ``into`` raises, so no record reaches the consumer)."""

    __slots__ = ("into", "log")

    def __init__(self, into: Callable[[list, list, int], None], log: SkipLog) -> None:
        self.into, self.log = into, log

    def __call__(self, outputs: list, chunk: list, start: int) -> None:
        mark = len(outputs)
        try:
            self.into(outputs, chunk, start)
        except BaseException:
            self.log.keep(outputs, mark)
            raise
        self.log.keep(outputs, mark)


def at_epoch(stage: Stage, epoch: int) -> Stage:
    """``stage``, its first application set to epoch ``epoch``."""
    stage.set_epoch(epoch)
    return stage


def error_options(stage: Any) -> dict:
    """``on_error`` and ``max_errors`` of ``stage`` for its repr, where they are not the defaults."""
    return {"on_error": None if stage.on_error == "raise" else stage.on_error,
            "max_errors": stage.max_errors}


class _FilterStage(Stage):
    def __init__(self, predicate: Callable) -> None:
        self.predicate = check_callable("predicate", predicate)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        return mapped_stream(iterable, repr(self), self._into, start)

    def _into(self, outputs: list, chunk: list, start: int) -> None:
        predicate, items = self.predicate, iter(chunk)
        outputs.extend(builtins.filter(predicate, items))
        left = operator.length_hint(items)
        if not left:
            return
        # extend took a StopIteration from the predicate for the end of the chunk: the item
        # that raised it is asked again, where the StopIteration is seen
        index = len(chunk) - left - 1
        try:
            for item in chunk[index:]:
                if predicate(item):
                    outputs.append(item)
                index += 1
        except StopIteration as stop:
            raise stop_error(predicate, chunk[index], start + index) from stop

    def __repr__(self) -> str:
        return call_repr("filter", (self.predicate,), {})


def map(func: Callable, *args: Any, seed: Seed | None = None, epoch: int = 0,
        on_error: OnError = "raise", max_errors: int | None = None, in_workers: bool = False,
        **kwargs: Any) -> Stage:
    """The stage that yields ``func(item, *args, **kwargs)`` for each item, in this thread.

    With ``seed``, each item's generator (from ``(seed, epoch, index)``) is active while
    ``func`` runs, for :func:`fpipe.random_apply`, :func:`fpipe.sample_args` and the samplers.
    ``epoch`` is the epoch of the stage's first application (each later one counts on): a
    loop that builds its pipeline anew every epoch passes ``epoch=e`` to get epoch ``e``'s
    draws, the draws one stage object makes in its ``e``-th application.

    ``on_error="skip"`` (or a callable) leaves out the items on which ``func`` raises, counts
    them and records them for :func:`fpipe.stats`; ``max_errors`` bounds how many may fail
    (see :mod:`fpipe.skipping`). The keyword arguments that are not options go to ``func``,
    checked against its signature now, as in :func:`fpipe.threads` (a ``func`` that takes
    ``**kwargs`` gets its keywords through ``functools.partial``).

    ``in_workers=True`` lets ``func`` run in the worker processes of the process stage next to
    it: just before a :func:`fpipe.processes` stage, or after one and a :func:`fpipe.batch`
    (then the workers make whole batches). It is the one way to say that ``func`` may run
    there: fpipe never moves a function of yours to another process unasked (one that puts
    tensors on a GPU must stay here). fpipe's own combiners move without it. The output is
    the same either way; :func:`fpipe.explain` says what moved.

    >>> from fpipe import stats
    >>> stream = map(lambda x: 10 // x, on_error="skip")([5, 0, 2])
    >>> list(stream), stats(stream)[-1].skipped
    ([2, 5], 1)

    >>> list(map(pow, 3)([1, 2, 3]))
    [1, 8, 27]
    >>> from fpipe import random_apply
    >>> flip = map(random_apply(0.5, lambda x: -x), seed=0)
    >>> list(flip.apply(range(1, 9))) == list(flip.apply(range(1, 9)))
    True
    >>> first, second = list(flip(range(1, 9))), list(flip(range(1, 9)))
    >>> second == list(map(random_apply(0.5, lambda x: -x), seed=0, epoch=1)(range(1, 9)))
    True
    """
    return at_epoch(_MapStage(func, args, kwargs, seed, on_error, max_errors, in_workers), epoch)


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

    def _own_state(self) -> dict:
        return {"left": self._left}

    def _own_loader(self, own: Any, name: str) -> Callable[[], None]:
        left = checked_fields(own, name, ("left",))["left"]

        def load() -> None:
            self._left = left
        return load


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
        check_call("transform_stream", func, args, kwargs, first="stream")

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
    ``args`` and ``kwargs`` are checked against ``func``'s signature now: a name it does not
    take is a ``TypeError`` that names it.

    >>> def pairs(items):
    ...     items = iter(items)
    ...     return zip(items, items)
    >>> list(transform_stream(pairs)(range(6)))
    [(0, 1), (2, 3), (4, 5)]
    """
    return _StreamStage(func, args, kwargs)


