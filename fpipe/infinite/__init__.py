"""dpipe's batch iterator: :class:`Infinite` and the stage classes :class:`Threads`,
:class:`Loky` and :class:`Iterator`, as thin adapters over fpipe's stages.

``Infinite(source, *transformers, batch_size=, batches_per_epoch=)`` is the pipeline
``toolz.pipe(source, *stages, batch(batch_size), map(combiner), prefetch(buffer_size + 1))``
run in the background, handed out in epochs of ``batches_per_epoch`` batches:

>>> from fpipe import Infinite, sample, unpack_args
>>> def scale(x, y):
...     return x * 10, y
>>> pairs = [(1, 0), (2, 1), (3, 0)]
>>> with Infinite(sample(pairs, random_state=1), unpack_args(scale), batch_size=4,
...               batches_per_epoch=2) as batch_iter:
...     for xs, ys in batch_iter():
...         print(xs, ys)
[20 30 10 10] [1 0 0 0]
[10 10 10 20] [0 0 0 1]

The epochs are windows on one stream: no batch is lost or repeated between them, even when a
loop breaks out of an epoch early. Unlike dpipe's, ``close()`` stops and joins everything
before it returns, the original exception of a failing stage reaches the caller, a forgotten
``close()`` never hangs the interpreter, and a seeded pipeline saves and restores its place
(:meth:`Infinite.state_dict`).
"""

from __future__ import annotations

import collections.abc
import copy
import functools
import inspect
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Iterator as _Iterator
from typing import Any

import numpy as np

from fpipe.errors import check_auto, check_integer, check_state, close_after, state_header
from fpipe.functional import call_repr, func_name
from fpipe.infinite._lightning import closing_callback
from fpipe.infinite._pipeline import Pipeline, restorable
from fpipe.skipping import OnError, check_max_errors, check_on_error
from fpipe.stream import (
    ExpirationPool,
    Plan,
    Stage,
    Stats,
    Stream,
    as_stream,
    batch,
    combine_to_arrays,
    explain,
    map,
    prefetch,
    stats,
    transform_stream,
    unbatch,
)
from fpipe.stream.parallel.stages import ParallelOptions, process_stage, thread_stage
from fpipe.stream.simple import check_call

__all__ = ["Infinite", "Iterator", "Loky", "Threads"]

_ITERATOR_CHUNK = 64  # items per call of an Iterator transform that runs in several threads
_STATE_FIELDS = ("source", "epochs", "delivered", "consumed")


# --- the stage classes ----------------------------------------------------------------------


def _keywords(factory: Callable) -> frozenset:
    return frozenset(name for name, parameter in inspect.signature(factory).parameters.items()
                     if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def _make_stage(factory: Callable, func: Callable, args: tuple, kwargs: dict,
                **options: Any) -> Stage:
    """``factory(func, *args, **options)`` with ``kwargs`` going to ``func``, even the ones
    that share a name with an option of the factory (``seed=``, say)."""
    if kwargs.keys() & _keywords(factory):
        func, kwargs = functools.partial(func, **kwargs), {}
    return factory(func, *args, **options, **kwargs)




class _Adapter(Stage):
    """A dpipe stage class: applying it applies the fpipe stages it stands for."""

    def __init__(self, stages: list[Stage], positional: tuple, keywords: dict) -> None:
        self.stages, self._call = stages, (positional, keywords)

    def apply(self, iterable: Iterable, *, epoch: int = 0, start: int = 0) -> Stream:
        stream = as_stream(iterable)
        for stage in self.stages:
            stream = stage.apply(stream, epoch=epoch, start=start)
        return stream

    def close(self) -> None:
        """Release what the stages keep between runs (the joblib generator of a process
        stage on another backend than loky); the next run starts it again."""
        for stage in self.stages:
            stage.close()

    def __repr__(self) -> str:
        return call_repr(type(self).__name__, *self._call)


def _error_options(on_error: Any, max_errors: Any) -> dict:
    """The ``on_error`` options of a stage class for its repr, where they are not the defaults."""
    return {**({} if on_error == "raise" else {"on_error": on_error}),
            **({} if max_errors is None else {"max_errors": max_errors})}


def _budget_options(cpu_budget: Any, memory_budget: Any) -> dict:
    """The budgets of a stage class that were given, for its repr."""
    return {name: value for name, value in (("cpu_budget", cpu_budget),
                                            ("memory_budget", memory_budget))
            if value is not None}


def _parallel_options(budgets: dict) -> ParallelOptions | None:
    """The options of the thread or process stage that a stage class stands for."""
    return ParallelOptions(**budgets) if budgets else None


def _check_buffer_size(buffer_size: Any) -> None:
    """dpipe's ``buffer_size``, checked under its own name (the stages call it ``buffer_chunks``)."""
    check_auto("buffer_size", buffer_size, lambda size: check_integer("buffer_size", size, 1))


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _thread_buffer(n_workers: Any, buffer_size: Any) -> Any:
    """:func:`fpipe.threads`' ``buffer_size`` for dpipe's: ``buffer_size`` chunks wait for the
    consumer, and each worker may finish two more ahead of the one the output waits for (the
    order is kept); measured on P3, less room stalls the workers."""
    if not (_is_count(n_workers) and _is_count(buffer_size) and buffer_size >= 1
            and (n_workers >= 1 or n_workers == -1)):
        return buffer_size  # fpipe.threads names the bad argument
    workers = (os.cpu_count() or 1) if n_workers == -1 else int(n_workers)
    return int(buffer_size) + 2 * workers


class Threads(_Adapter):
    """dpipe's ``Threads``: ``func(item, *args, **kwargs)`` in ``n_workers`` threads, which is
    :func:`fpipe.threads`. Items travel in chunks; besides ``buffer_size`` chunks that wait for
    the consumer, each worker may finish two chunks ahead. Unlike dpipe's, the output keeps the
    input order. As in dpipe, every keyword argument goes to ``func``, also one named like an
    option of :func:`fpipe.threads` (``seed=``), except ``on_error`` and ``max_errors``, which
    skip the items on which ``func`` raises (see :mod:`fpipe.skipping`), and ``cpu_budget`` and
    ``memory_budget``, which bound ``n_workers="auto"`` and ``buffer_size="auto"`` as in
    :func:`fpipe.threads`. The keywords that go to ``func`` are checked against its signature
    now, so a misspelled option (``n_worker=2``) is a ``TypeError`` that names it; a ``func``
    that takes ``**kwargs`` gets its keywords through ``functools.partial``. The same holds for
    :class:`Loky` and :class:`Iterator`.

    >>> from toolz import pipe
    >>> list(pipe(range(5), Threads(pow, 2, n_workers=2)))
    [0, 1, 4, 9, 16]
    """

    one_to_one = True

    def __init__(self, func: Callable, *args: Any, n_workers: int | str = 1,
                 buffer_size: int | str = 1, on_error: OnError = "raise",
                 max_errors: int | None = None, cpu_budget: float | None = None,
                 memory_budget: int | None = None, **kwargs: Any) -> None:
        budgets = _budget_options(cpu_budget, memory_budget)
        options = {"n_workers": n_workers, "buffer_size": buffer_size,
                   **_error_options(on_error, max_errors), **budgets}
        _check_buffer_size(buffer_size)
        stage = thread_stage(func, args, kwargs, n_workers=n_workers,
                             buffer_chunks=_thread_buffer(n_workers, buffer_size),
                             on_error=on_error, max_errors=max_errors,
                             options=_parallel_options(budgets))
        super().__init__([stage], (func, *args), {**options, **kwargs})


def _loky_workers(n_workers: Any) -> Any:
    # dpipe's rule for negative counts: -1 is every core, -2 all but one, and so on
    if _is_count(n_workers) and n_workers < -1:
        return max(1, (os.cpu_count() or 1) + int(n_workers) + 1)
    return n_workers


class Loky(_Adapter):
    """dpipe's ``Loky``: ``func(item, *args, **kwargs)`` in ``n_workers`` worker processes
    (a negative count is counted back from the cores: -1 is all of them, -2 all but one), which
    is :func:`fpipe.processes` on joblib's loky backend. Unlike dpipe's, the workers are started
    once and stay warm for the next epoch and the next pipeline, items travel in chunks, the
    output keeps the input order, and a worker's exception reaches the consumer whole.
    With ``n_workers=1``, joblib runs the work in this process. ``on_error`` and ``max_errors``
    skip the items on which ``func`` raises, as in :class:`Threads`; ``n_workers="auto"``,
    ``buffer_size="auto"``, ``cpu_budget`` and ``memory_budget`` are those of
    :func:`fpipe.processes`. In an :class:`Infinite` with the default combiner, the workers
    make whole batches (see :func:`fpipe.explain`).

    >>> from toolz import pipe
    >>> list(pipe(range(4), Loky(divmod, 3)))
    [(0, 0), (0, 1), (0, 2), (1, 0)]
    """

    one_to_one = True

    def __init__(self, func: Callable, *args: Any, n_workers: int | str = 1,
                 buffer_size: int | str = 1, on_error: OnError = "raise",
                 max_errors: int | None = None, cpu_budget: float | None = None,
                 memory_budget: int | None = None, **kwargs: Any) -> None:
        budgets = _budget_options(cpu_budget, memory_budget)
        options = {"n_workers": n_workers, "buffer_size": buffer_size,
                   **_error_options(on_error, max_errors), **budgets}
        _check_buffer_size(buffer_size)
        stage = process_stage(func, args, kwargs, backend="loky",
                              n_workers=_loky_workers(n_workers), buffer_chunks=buffer_size,
                              on_error=on_error, max_errors=max_errors,
                              options=_parallel_options(budgets))
        super().__init__([stage], (func, *args), {**options, **kwargs})


class _ChunkCall:
    """``transform`` over one chunk of the stream, as a list (a class, so that it pickles)."""

    def __init__(self, transform: Callable, args: tuple, kwargs: dict) -> None:
        self.transform, self.args, self.kwargs = transform, args, kwargs

    def __call__(self, chunk: list) -> list:
        return list(self.transform(chunk, *self.args, **self.kwargs))

    def __repr__(self) -> str:  # what stats() and explain() call the thread stage's function
        return f"{func_name(self.transform)} (per chunk)"


class Iterator(_Adapter):
    """dpipe's ``Iterator``: ``transform(stream, *args, **kwargs)`` gets the whole stream and
    returns or yields any number of outputs (:func:`fpipe.transform_stream`), for filters, flat
    maps, windows and other stateful work. It runs in the thread that reads it (in
    :class:`Infinite`, the pipeline's background thread).

    With ``n_workers > 1``, ``transform`` is called on consecutive chunks of 64 items, in
    ``n_workers`` threads, and the outputs keep the input order; its state then lasts one
    chunk. (dpipe runs one instance per thread, each on an arbitrary share of the items.)
    ``buffer_size`` then counts chunks as in :class:`Threads`; ``n_workers="auto"``,
    ``buffer_size="auto"``, ``cpu_budget`` and ``memory_budget`` are those of
    :func:`fpipe.threads` (the chunks are its items). With one worker there is nothing for a
    budget to bound, and passing one is an error.

    >>> from toolz import pipe
    >>> def pairs(items):
    ...     items = iter(items)
    ...     return zip(items, items)
    >>> list(pipe(range(6), Iterator(pairs)))
    [(0, 1), (2, 3), (4, 5)]
    """

    def __init__(self, transform: Callable, *args: Any, n_workers: int | str = 1,
                 buffer_size: int | str = 1, cpu_budget: float | None = None,
                 memory_budget: int | None = None, **kwargs: Any) -> None:
        budgets = _budget_options(cpu_budget, memory_budget)
        options = {"n_workers": n_workers, "buffer_size": buffer_size, **budgets}
        # here, for both ways to run: with several workers the chunks' threads cannot see them
        check_call("Iterator", transform, args, kwargs, first="stream", workers=True)
        _check_buffer_size(buffer_size)
        if check_auto("n_workers", n_workers,
                      lambda count: check_integer("n_workers", count, 1)) == 1:
            _check_no_budgets(budgets)
            stages = [_make_stage(transform_stream, transform, args, kwargs)]
        else:
            stages = [batch(_ITERATOR_CHUNK),
                      thread_stage(_ChunkCall(transform, args, kwargs), (), {},
                                   n_workers=n_workers,
                                   buffer_chunks=_thread_buffer(n_workers, buffer_size),
                                   options=_parallel_options(budgets)),
                      unbatch()]
        super().__init__(stages, (transform, *args), {**options, **kwargs})


def _check_no_budgets(budgets: dict) -> None:
    """An Iterator of one worker runs in the thread that reads it: no budget bounds it."""
    if budgets:
        name, value = next(iter(budgets.items()))
        raise ValueError(f"{name} bounds the threads of Iterator(n_workers=2 or more, or "
                         f"'auto'); with n_workers=1 the transform runs in the thread that "
                         f"reads it and there is nothing to bound; got {name}={value!r}")


# --- Infinite -------------------------------------------------------------------------------


def _as_stage(position: int, transformer: Any, on_error: Any, max_errors: Any) -> Stage:
    if isinstance(transformer, Stage):
        return transformer
    if callable(transformer):
        return map(transformer, on_error=on_error, max_errors=max_errors)
    raise TypeError(f"transformers must be callables or fpipe stages; got "
                    f"transformers[{position}]={transformer!r}")


def _combiner_stage(combiner: Any, kwargs: dict) -> Stage:
    if isinstance(combiner, Stage):
        if kwargs:
            raise TypeError(f"Infinite got an unexpected keyword argument {next(iter(kwargs))!r}: "
                            f"combiner {combiner!r} is already a stage: give it its keyword "
                            f"arguments itself; got {', '.join(sorted(kwargs))}")
        return combiner
    if not callable(combiner):
        raise TypeError(f"combiner must be callable or an fpipe stage; got combiner={combiner!r}")
    try:
        signature = inspect.signature(combiner)
    except (TypeError, ValueError):  # some builtins have none: their call will tell
        signature = None
    if signature is not None:
        try:
            signature.bind([], **kwargs)
        except TypeError as error:
            raise TypeError(f"combiner {getattr(combiner, '__name__', combiner)!s} does not "
                            f"take these keyword arguments of Infinite: {error}") from None
    return _make_stage(map, combiner, (), kwargs)


def _inexact(stage: Stage) -> str | None:
    """Why a restored pipeline would not make the same items again through ``stage``, if it
    would not: results in the order they complete, or draws without a seed."""
    for part in getattr(stage, "stages", [stage]):  # a dpipe stage class stands for several
        if getattr(part, "ordered", True) is False:
            return f"{part!r} hands out results in the order they complete (ordered=False)"
        if isinstance(part, ExpirationPool) and part.seed is None:
            return f"{part!r} draws without a seed (give it seed=)"
    return None


class Infinite:
    """dpipe's batch iterator: ``source`` through ``transformers``, in batches of
    ``batch_size``, combined by ``combiner``, handed out ``batches_per_epoch`` at a time.

    * ``source`` is any iterable; an infinite one (:func:`fpipe.sample`,
      :func:`fpipe.load_by_random_id`) is the usual choice.
    * ``transformers`` are plain functions of an item (each becomes :func:`fpipe.stream.map`),
      :class:`Threads`, :class:`Loky`, :class:`Iterator`, :class:`fpipe.ExpirationPool`, or any
      fpipe stage.
    * ``batch_size`` is an integer, or a predicate ``batch_size(batch, item) -> bool`` that says
      whether ``item`` joins the batch (see :func:`fpipe.batch`).
    * ``combiner`` turns a list of items into a batch; ``kwargs`` go to it, as in dpipe. It may
      be a stage too (``Threads(combine_pad, n_workers=2)``), which takes its own arguments.
    * ``buffer_size`` batches wait ready while the next one is made, in a background thread.

    ``bi()`` and ``iter(bi)`` give the next ``batches_per_epoch`` batches. Nothing starts at
    construction; the first epoch or ``with bi:`` starts the pipeline, and ``close()`` (or
    leaving the ``with`` block) stops it and joins its threads before it returns. A ``with bi:``
    inside another one (a function that opens what its caller opened) leaves it open: the
    outermost block closes it. The object can be used again after ``close()``: it then starts
    over from the source, which a list or a range begins again and an iterator continues.

    A finite source ends the epoch in which it runs out, after its partial batch, with fewer
    than ``batches_per_epoch`` batches (a warning says so, once); the next epoch begins it again
    if it can be iterated again (a list) and is empty otherwise (a spent generator; a warning
    says so, once). An exception in any stage reaches the caller with its
    type, message and traceback, and closes the pipeline: the next epoch starts over cleanly.
    With ``on_error="skip"`` (or a callable), the transformers given as plain functions leave
    out the items on which they raise, and count them (:meth:`stats`); ``max_errors`` bounds
    their number in each (see :mod:`fpipe.skipping`). Stages keep their own ``on_error``.

    >>> batch_iter = Infinite(range(7), batch_size=3, batches_per_epoch=2,
    ...                       combiner=list)
    >>> [list(batch_iter()) for _ in range(3)]
    [[[0, 1, 2], [3, 4, 5]], [[6]], [[0, 1, 2], [3, 4, 5]]]
    >>> batch_iter.close()
    """

    def __init__(self, source: Iterable, *transformers: Callable | Stage,
                 batch_size: int | Callable[[list, Any], bool], batches_per_epoch: int,
                 buffer_size: int = 1, combiner: Callable | Stage = combine_to_arrays,
                 on_error: OnError = "raise", max_errors: int | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(source, (Iterable, collections.abc.Sequence)):
            raise TypeError(f"source must be iterable; got source={source!r}")
        check_on_error(on_error), check_max_errors(max_errors)
        stages = [_as_stage(i, transformer, on_error, max_errors)
                  for i, transformer in enumerate(transformers)]
        stages.append(batch(batch_size))
        self.batches_per_epoch = batches_per_epoch
        self.buffer_size = check_integer("buffer_size", buffer_size, 1)
        stages += [_combiner_stage(combiner, kwargs), prefetch(self.buffer_size + 1)]
        self.source, self.batch_size = source, batch_size
        self._pipeline = Pipeline(source, stages, len(transformers), batch_size)
        self._entered = 0  # how many ``with`` blocks of this object are open
        self._finalizer = weakref.finalize(self, self._pipeline.close)

    @property
    def batches_per_epoch(self) -> int:
        """How many batches an epoch has; it may be changed between epochs."""
        return self._batches_per_epoch

    @batches_per_epoch.setter
    def batches_per_epoch(self, value: int) -> None:
        self._batches_per_epoch = check_integer("batches_per_epoch", value, 1)

    def __call__(self) -> _Iterator:
        """The next ``batches_per_epoch`` batches (fewer if a finite source ends)."""
        self._pipeline.ensure()
        return self._epoch(self.batches_per_epoch)

    def _epoch(self, batches: int) -> _Iterator:
        for index in range(batches):
            try:
                item = self._pipeline.next_batch(first=not index)
            except StopIteration:
                if index:  # an empty epoch has its own warning
                    self._pipeline.warn_short(index, batches)
                return
            yield item

    def __iter__(self) -> _Iterator:
        return self()

    def __enter__(self) -> Infinite:
        self._pipeline.ensure()
        self._entered += 1
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        self._entered -= 1
        if self._entered:
            return  # an inner ``with`` of the same object: the outer one closes
        if error is None:
            self.close()
        else:
            close_after(self.close, error)  # never in place of the block's own error

    def close(self) -> None:
        """Stop the pipeline: every thread is joined when this returns (process workers stay
        warm in joblib's pool). Batches made ahead and not handed out are dropped. Closing
        twice does nothing, and the object can be used again.

        >>> batch_iter = Infinite(range(4), batch_size=2, batches_per_epoch=1, combiner=list)
        >>> list(batch_iter()), batch_iter.close(), batch_iter.close()
        ([[0, 1]], None, None)
        """
        self._pipeline.close()

    def __del__(self) -> None:
        finalizer = getattr(self, "_finalizer", None)  # absent if __init__ raised
        if finalizer is not None:
            finalizer()

    def stats(self) -> Stats:
        """Where the time goes, per stage, in the running pipeline (or the last one): see
        :func:`fpipe.stats`.

        >>> batch_iter = Infinite(range(10), batch_size=5, batches_per_epoch=2, combiner=list)
        >>> _ = list(batch_iter())
        >>> [row.name for row in batch_iter.stats()]
        ['source(range)', 'batch(5)', 'map(list)', 'prefetch(2)']
        >>> batch_iter.close()
        """
        stream = self._pipeline.last
        return stats(stream) if stream is not None else Stats()

    def explain(self) -> Plan:
        """The plan of the running pipeline (or the last one): what was fused into the
        workers, and the workers and buffers each background stage runs with; see
        :func:`fpipe.explain`. Empty before the pipeline first runs.

        >>> batch_iter = Infinite(range(8), Loky(divmod, 3), batch_size=4, batches_per_epoch=2)
        >>> _ = list(batch_iter())
        >>> print(batch_iter.explain())  # doctest: +ELLIPSIS
        source(range)
        batch(4)
        processes(divmod, 3, n_workers=1) + map(combine_to_arrays)
            fused: the workers make whole batches of 4 and combine them with combine_to_arrays
            workers 1 (fixed); ...
        prefetch(2)
        >>> batch_iter.close()
        """
        stream = self._pipeline.last
        return explain(stream) if stream is not None else Plan()

    def state_dict(self) -> dict:
        """Where the pipeline stands: the state of the source and the epochs of the stages when
        the running stream started, the batches handed out since, and (where they can be
        counted) the items each stage up to the batch took for them; with the batch size and the
        length of a source that has no state of its own (a list). A plain dict.

        For a seeded pipeline (a seeded source such as :func:`fpipe.sample` and seeded
        stages), an ``Infinite`` built the same way that loads this state hands out exactly
        the batches this one would have. When every transformer maps one item to one item
        (functions, :class:`Threads`, :class:`Loky`, :func:`fpipe.stream.map`, :func:`fpipe.threads`,
        :func:`fpipe.processes`), also if it skips the items on which it raises
        (``on_error``: the state counts the items it took, not those it gave), and
        ``batch_size`` is an integer, the restored pipeline skips ahead at once; otherwise it
        makes and drops the batches handed out so far. The number of workers of a stage may
        differ between the two (seeded stages draw per item, from ``(seed, epoch, index)``),
        except that :class:`Iterator` with one worker reads the whole stream and with more
        reads chunks of 64: keep that choice. Another batch size, number of stages or source is
        refused.

        A pipeline that cannot be made again exactly has no state: a ``ValueError`` names the
        stage, a parallel stage with ``ordered=False`` (its order depends on timing) or a pool
        without a seed. Other unseeded randomness in your functions cannot be seen here: seed
        it (:func:`fpipe.current_rng` in a seeded stage) or the restored batches differ.

        The source must have ``state_dict()`` and ``load_state_dict()``, or be iterable again
        from its start (a list, a range); an iterator raises ``TypeError``.

        >>> from fpipe import sample
        >>> def run():
        ...     return Infinite(sample(range(100), random_state=0), batch_size=2,
        ...                     batches_per_epoch=3, combiner=list)
        >>> first = run()
        >>> _ = list(first())
        >>> state = first.state_dict()
        >>> state["batch_size"], state["delivered"], state["consumed"]
        (2, 3, [6])
        >>> second = run()
        >>> second.load_state_dict(state)
        >>> list(first()) == list(second())
        True
        >>> first.close(), second.close()
        (None, None)
        """
        self._checkrestorable()
        self._check_exact()
        pipeline = self._pipeline
        if pipeline.stream is not None:
            source, epochs = pipeline.origin
            delivered, consumed = pipeline.delivered, pipeline.consumed()
        else:
            source, epochs = pipeline.source_state(), [s.epoch for s in pipeline.stages]
            delivered, consumed = pipeline.skip, pipeline.start_counts(pipeline.skip)
        # a copy: the caller may change what it gets, the origin must stay as it was
        return copy.deepcopy({**state_header("Infinite"), **self._settings(), "source": source,
                              "epochs": list(epochs), "delivered": delivered,
                              "consumed": consumed})

    def _settings(self) -> dict:
        """What a state names of this pipeline: the batch size (None for a predicate), and the
        length of a source that has no state of its own (a list, a range), else None."""
        sized = not restorable(self.source) and hasattr(self.source, "__len__")
        return {"batch_size": self._pipeline.per_batch,
                "source_length": len(self.source) if sized else None}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` of an ``Infinite`` built the same way: the
        running pipeline is closed, and the next epoch begins where that one stood. A state
        of another pipeline (another batch size, number of stages or kind of source) raises a
        ``ValueError`` that names the difference, before anything changes."""
        load = self._checked_state(state)
        self.close()
        load()

    def _checkrestorable(self) -> None:
        if not restorable(self.source) and isinstance(self.source, _Iterator):
            raise TypeError(f"a state needs a source with state_dict() and load_state_dict() "
                            f"(fpipe.sample, say) or one that can be iterated again from its "
                            f"start; got source={self.source!r}")

    def _check_exact(self) -> None:
        for stage in self._pipeline.stages:
            reason = _inexact(stage)
            if reason is not None:
                raise ValueError(f"this pipeline cannot be resumed exactly: {reason}")

    def _checked_state(self, state: Any) -> Callable[[], None]:
        """Check ``state`` all through, the source's state included, and return what loads it."""
        self._checkrestorable()
        self._check_exact()
        pipeline = self._pipeline
        settings = self._settings()
        if settings["source_length"] is None and isinstance(state, Mapping) and "version" not in state:
            del settings["source_length"]  # a state of fpipe 0.1.0 lacks nothing there
        check_state(state, "Infinite", _STATE_FIELDS, settings, old_keys=_STATE_FIELDS[:3])
        epochs = self._checked_epochs(state["epochs"])
        delivered = check_integer("state['delivered']", state["delivered"], 0)
        counts = self._checked_counts(state, delivered)
        load_source = self._source_loader(state["source"])

        def load() -> None:
            load_source()
            for stage, epoch in zip(pipeline.stages, epochs):
                stage.set_epoch(epoch)
            pipeline.skip, pipeline.resume_counts = delivered, counts
        return load

    def _checked_epochs(self, epochs: Any) -> list[int]:
        stages = len(self._pipeline.stages)
        if not isinstance(epochs, (list, tuple)):
            raise TypeError(f"state['epochs'] must be a list of epochs, one per stage; "
                            f"got {epochs!r:.120}")
        if len(epochs) != stages:
            raise ValueError(f"state is of a pipeline with {len(epochs)} stages; this one "
                             f"has {stages}")
        return [check_integer(f"state['epochs'][{k}]", epoch, 0) for k, epoch in enumerate(epochs)]

    def _checked_counts(self, state: Mapping, delivered: int) -> list[int] | None:
        """``state['consumed']``, once it fits this pipeline and ``delivered``; None where the
        state replays (of a pipeline that replays, or of fpipe 0.1.0, which has no counts)."""
        pipeline, counts = self._pipeline, state.get("consumed")
        if counts is None:
            return None  # the batches delivered are made again
        if not pipeline.countable:
            raise ValueError(f"state['consumed'] is {counts!r:.80}: the pipeline it is of counted "
                             f"its items, and this one replays them (a filter, an Iterator, a "
                             f"batch predicate; see Infinite.state_dict): it was built another way")
        if not isinstance(counts, (list, tuple)) or len(counts) != pipeline.batch_at + 1:
            raise TypeError(f"state['consumed'] must be a list of {pipeline.batch_at + 1} counts; "
                            f"got {counts!r:.120}")
        counts = [check_integer(f"state['consumed'][{k}]", n, 0) for k, n in enumerate(counts)]
        if counts[-1] != delivered * pipeline.per_batch or counts != sorted(counts, reverse=True):
            raise ValueError(f"state['consumed'] must count the items behind "
                             f"state['delivered']={delivered} batches of {pipeline.per_batch}, "
                             f"each stage at least as many as the next; got {counts}")
        return counts

    def _source_loader(self, saved: Any) -> Callable[[], None]:
        if (saved is None) == restorable(self.source):
            raise ValueError(f"state['source'] does not fit source={self.source!r}: a source "
                             f"with state_dict() needs its state, and only such a source has one")
        if saved is None:
            return lambda: None
        # fpipe's sources check a state all through before they load it; others load it
        loader = getattr(self.source, "state_loader", None)
        if callable(loader):
            return loader(saved, "state['source']")
        return functools.partial(self.source.load_state_dict, saved)

    @property
    def closing_callback(self) -> Any:
        """A Lightning callback that closes this iterator when the trainer tears down or
        fails: ``Trainer(callbacks=[batch_iter.closing_callback])``. It works with ``lightning``
        and with ``pytorch_lightning`` (whichever is imported; Lightning is imported here, not
        with fpipe). After a Ctrl-C, Lightning ignores SIGINT while it shuts down and leaves it
        ignored; the callback closes the iterator, then gives SIGINT back the handler it had
        when training began, so a program that goes on still answers Ctrl-C.

        >>> batch_iter = Infinite(range(4), batch_size=2, batches_per_epoch=1)
        >>> callback = batch_iter.closing_callback  # doctest: +SKIP
        >>> callback.teardown(trainer=None, pl_module=None, stage="fit")  # doctest: +SKIP
        """
        return closing_callback(self)

    def __repr__(self) -> str:
        stages = ", ".join(repr(stage) for stage in self._pipeline.stages)
        return (f"Infinite({type(self.source).__name__}, {stages}, "
                f"batches_per_epoch={self.batches_per_epoch})")
