"""The planner: which stages fuse into a process stage's workers, and :func:`explain`, which
shows the plan of a running pipeline (what was fused, or why not; the workers and buffers
that each background stage runs with and the tuner's last measurements).

Two fusions, decided when the stages are applied (before anything runs):

- a process stage followed by :func:`fpipe.batch` of a size and a ``map`` of one of fpipe's
  combiners (:func:`fpipe.combine_to_arrays`, :func:`fpipe.combine_pad`,
  :func:`fpipe.combine_batches`, :func:`fpipe.combine_dicts`): the items are grouped a
  batch's worth at a time before the workers, and each worker makes whole batches, which cross
  in shared memory as one piece;
- a ``map(..., in_workers=True)`` just before a process stage: it runs in the workers, before
  the stage's function; and one just after a fused combiner (or after another such map): it
  runs in the workers on each batch, which crosses in shared memory as what it returns.

A function of yours runs in the workers only when its map says ``in_workers=True``: a map
after the batch may hold a GPU or a model, which the workers must not touch. Fused or not, a
pipeline gives the same items in the same batches in the same order, with the same errors.

>>> from functools import partial
>>> from toolz import pipe
>>> import fpipe
>>> stream = pipe(range(1, 7), fpipe.processes(partial(divmod, 4), backend="threading"),
...               fpipe.batch(4), fpipe.stream.map(fpipe.combine_batches))
>>> list(stream)
[((4, 2, 1, 1), (0, 0, 1, 0)), ((0, 0), (4, 4))]
>>> print(explain(stream))  # doctest: +ELLIPSIS
source(range)
batch(4)
processes(partial(divmod, 4), n_workers=1, backend='threading') + map(combine_batches)
    fused: the workers make whole batches of 4 and combine them with combine_batches
    workers 1 (fixed); room for 4 chunks (buffer 2)
    measured: ...
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fpipe.functional import func_name
from fpipe.stream.batching import (
    Batched,
    batch,
    combine_batches,
    combine_dicts,
    combine_pad,
    combine_to_arrays,
)
from fpipe.stream.core import Stage, Stream
from fpipe.stream.metrics import stream_chain
from fpipe.stream.parallel._fusion import BatchCall, ChainedCall

__all__ = ["Plan", "StagePlan", "explain"]

FPIPE_COMBINERS = frozenset({combine_to_arrays, combine_pad, combine_batches, combine_dicts})


@dataclass
class _Applied:
    """What the planner keeps of an applied stage: the stage, the stream it reads, its call and
    first index, its name, and what the plan says of it."""

    stage: Stage
    upstream: Stream
    call: Any
    start: int
    notes: list[str] = field(default_factory=list)
    unit: str = "item"  # what the stream gives: items, or batches where fused


_applied: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # stream -> _Applied


def _untouched(stream: Stream) -> bool:
    """Whether nothing has read ``stream`` or started its work yet."""
    return (not stream.closed and not stream.read_ahead and not stream.measure(0.0)[0]
            and not getattr(stream, "started", False))


# --- the map after a batch ------------------------------------------------------------------


def plan_map(stage: Stage, call: Any, upstream: Stream, start: int,
             build: Callable[[Stream], Stream]) -> Stream:
    """The stream of map ``stage`` (whose call is ``call``, numbered from ``start``) over
    ``upstream``: fused into the process stage before the batch that ``upstream`` makes when
    it may, else ``build(upstream)``, with the reason it was not fused."""
    fused, reason = _fused(stage, call, upstream, start)
    if fused is None and reason is None:
        fused, reason = _folded_after(stage, call, upstream, start)
    if fused is not None:
        return fused
    stream = build(upstream)
    _applied[stream] = _Applied(stage, upstream, call, start, [reason] if reason else [])
    return stream


def _fused(stage: Stage, call: Any, batched: Stream, start: int) -> tuple[Stream | None, str | None]:
    if not isinstance(batched, Batched):
        return None, None
    producer = _applied.get(batched.upstream)
    if producer is None or getattr(producer.stage, "kind", "") != "processes":
        return None, None
    if not (_untouched(batched) and _untouched(batched.upstream)):
        return None, "not fused: the stream before the map had been read already"
    reason = _why_not_fused(stage, batched.stage, producer.stage)
    if reason is not None:
        return None, f"not fused: {reason}"
    size = batched.stage.size
    # the groups keep a short last one even with drop_last: its items still run (an error of
    # theirs is raised, as in the consumer), and the workers then leave the short batch out
    grouped = Batched(producer.upstream, batched.name, batch(size))
    fused_call = BatchCall(producer.call, producer.start, size, batched.stage.drop_last, call,
                           start)
    name = f"{batched.upstream.name} + {stage!r}"
    stream = producer.stage.stream(grouped, fused_call, 0, name, group=size)
    combiner = func_name(stage.func)
    _applied[stream] = _Applied(producer.stage, grouped, fused_call, 0, [
        *producer.notes, f"fused: the workers make whole batches of {size} and combine them "
                         f"with {combiner}"], unit="batch")
    return stream, None


def _folded_after(stage: Stage, call: Any, upstream: Stream,
                  start: int) -> tuple[Stream | None, str | None]:
    """A map after a fused stream (whose workers make whole batches): folded in after the
    combiner when it says ``in_workers=True``, else None and why not."""
    record = _applied.get(upstream)
    if record is None or not isinstance(record.call, BatchCall):
        return None, None
    reason = _why_not_folded(stage)
    if reason is None and not _untouched(upstream):
        reason = "the stream before it had been read already"
    if reason is not None:
        return None, f"not folded in: {stage!r} {reason}"
    fused_call = record.call.then(call, start)
    stream = record.stage.stream(record.upstream, fused_call, 0, f"{upstream.name} + {stage!r}",
                                 group=fused_call.size)
    _applied[stream] = _Applied(record.stage, record.upstream, fused_call, 0, [
        *record.notes, f"folded in: {stage!r} runs in the workers, on each batch"], unit="batch")
    return stream, None


def _why_not_fused(stage: Stage, batching: Any, process: Any) -> str | None:
    """Why the map ``stage`` after ``batching`` after ``process`` does not fuse, or None."""
    if batching.predicate is not None:
        return (f"{batching!r} ends a batch where its predicate says, which is known only "
                "once the items are made")
    if process.on_error != "raise":
        return (f"the process stage has on_error={process.on_error!r}: the items it leaves "
                "out move where batches begin")
    if not process.ordered:
        return ("the process stage has ordered=False: its batches are of the items in the "
                "order they complete")
    if stage.on_error != "raise":
        return f"the map has on_error={stage.on_error!r}, which applies to whole batches here"
    if stage.in_workers:
        return None
    yours = _your_function(stage)
    if yours is not None:
        return (f"{yours} is your function: it runs in this process unless its map says "
                "in_workers=True")
    return None


def _your_function(stage: Any) -> str | None:
    """What in a map's call is a function of the user's (the function, or a function passed
    to one of fpipe's combiners), or None."""
    if stage.func not in FPIPE_COMBINERS:
        return func_name(stage.func)
    for key, value in [*enumerate(stage.args), *stage.kwargs.items()]:
        if callable(value):
            name = f"argument {key}" if isinstance(key, int) else key
            return f"{func_name(stage.func)}'s {name}={func_name(value)}"
    return None


# --- the maps before a process stage --------------------------------------------------------


def plan_parallel(stage: Any, upstream: Stream, call: Any, start: int) -> Stream:
    """The stream of the background ``stage`` (``threads`` or ``processes``) over
    ``upstream``: a process stage runs the ``map(..., in_workers=True)`` just before it in
    its workers."""
    notes: list[str] = []
    names = [repr(stage)]
    if stage.kind == "processes":
        upstream, call, folded, notes = _folded(upstream, call, start)
        names = [*folded, *names]
    stream = stage.stream(upstream, call, start, " + ".join(names))
    _applied[stream] = _Applied(stage, upstream, call, start, notes)
    return stream


def _folded(upstream: Stream, call: Any, start: int) -> tuple[Stream, Any, list[str], list[str]]:
    """The stream to read, the call to run and the maps folded in, with what the plan says."""
    calls, offsets, names, notes = [call], [0], [], []
    while True:
        record = _applied.get(upstream)  # a map's has in_workers
        if record is None or not hasattr(record.stage, "in_workers") or not _untouched(upstream):
            break
        reason = _why_not_folded(record.stage)
        if reason is not None:
            notes.append(f"not folded in: {record.stage!r} {reason}")
            break
        calls.insert(0, record.call)
        offsets.insert(0, record.start - start)
        names.insert(0, repr(record.stage))
        notes.insert(0, f"folded in: {record.stage!r} runs in the workers")
        upstream = record.upstream
    if len(calls) == 1:
        return upstream, call, names, notes
    return upstream, ChainedCall(tuple(calls), tuple(offsets)), names, notes


def _why_not_folded(stage: Any) -> str | None:
    if not stage.in_workers:
        return "runs in this process: pass in_workers=True to run it in the workers"
    if stage.on_error != "raise":
        return (f"has on_error={stage.on_error!r}, whose count of skipped items stays in this "
                "process")
    return None


# --- explain --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagePlan:
    """One stage of a :class:`Plan`: its name; what the planner did with it (``notes``); for
    ``threads`` and ``processes``, the setting it runs with (``n_workers``, ``buffer_chunks``,
    ``slots``: the chunks it may hold, ``chunk_size``: the most items in one, None when not
    bounded by memory), whether it is tuned, why the tuner chose so, and what it measured.

    >>> stage = StagePlan("threads(abs, n_workers=2)", n_workers=2, buffer_chunks=2, slots=4,
    ...                   reason="fixed")
    >>> print(Plan([stage]))
    threads(abs, n_workers=2)
        workers 2 (fixed); room for 4 chunks (buffer 2)
    """

    name: str
    notes: tuple[str, ...] = ()
    n_workers: int | None = None
    buffer_chunks: int | None = None
    slots: int | None = None
    chunk_size: int | None = None
    tuned: bool = False
    reason: str = ""
    measured: Any = None  # the tuner's Window: seconds, items, work, cpu, ...
    unit: str = "item"  # what the stage gives: "batch" where fused

    def lines(self) -> list[str]:
        lines = [self.name, *(f"    {note}" for note in self.notes)]
        if self.n_workers is not None:
            how = f"auto: {self.reason}" if self.tuned else self.reason
            chunk = (f", chunks of at most {_count(self.chunk_size, self.unit)}"
                     if self.chunk_size else "")
            lines.append(f"    workers {self.n_workers} ({how}); room for "
                         f"{_count(self.slots, 'chunk')} (buffer {self.buffer_chunks}){chunk}")
        if self.measured is not None:
            lines.append(f"    measured: {_measurements(self.measured, self.unit)}")
        return lines


_PLURAL = {"item": "items", "batch": "batches", "chunk": "chunks"}


def _count(number: Any, unit: str) -> str:
    """``number`` of ``unit``, in the plural unless it is 1.

    >>> _count(1, "item"), _count(4, "batch"), _count(1, "chunk")
    ('1 item', '4 batches', '1 chunk')
    """
    return f"{number} {unit if number == 1 else _PLURAL[unit]}"


def _measurements(window: Any, unit: str) -> str:
    seconds = max(window.seconds, 1e-9)
    alone, share = window.per_item()
    parts = [f"{window.delivered / seconds:.4g} {_PLURAL[unit]}/s to the consumer"]
    if window.worked:
        parts.append(f"{1e3 * window.work / window.worked:.3g} ms of work per {unit} "
                     f"({share:.0%} of it on a core)")
    parts.append(f"the consumer waited {window.starved / seconds:.0%} of the time")
    parts.append(f"the feeder read the upstream {window.reading / seconds:.0%}")
    if window.item_bytes:
        parts.append(f"{window.item_bytes / 2**20:.3g} MiB per {unit} in the stage")
    return ", ".join(parts)


class Plan(tuple):
    """The plan of a pipeline, one :class:`StagePlan` per stream, source first; ``str()``
    gives it as text.

    >>> print(Plan([StagePlan("source(list)")]))
    source(list)
    """

    def __str__(self) -> str:
        return "\n".join(line for stage in self for line in stage.lines())


def explain(stream: Stream) -> Plan:
    """The plan of a pipeline as it runs, from its source to ``stream`` (what applying the
    last stage returned; for an :class:`fpipe.Infinite`, call its ``explain()``): which
    stages were fused into a process stage's workers, and why not where they were not; the
    workers and buffer each ``threads`` and ``processes`` stage runs with, why (fixed, or
    the tuner's reason), and the tuner's last measurements.

    >>> from toolz import pipe
    >>> import fpipe
    >>> stream = pipe(range(4), fpipe.threads(abs, n_workers="auto"))
    >>> list(stream)
    [0, 1, 2, 3]
    >>> print(explain(stream))  # doctest: +ELLIPSIS
    source(range)
    threads(abs, n_workers='auto')
        workers ... (auto: ...); room for ... chunks (buffer 2)
        measured: ...
    """
    return Plan(_stage_plan(stream) for stream in stream_chain(stream, "explain"))


def _stage_plan(stream: Stream) -> StagePlan:
    record = _applied.get(stream)
    notes = tuple(record.notes) if record is not None else ()
    watch = getattr(stream, "watch", None)
    if watch is None:  # not a background stage, or not started yet
        return StagePlan(stream.name, notes)
    decision = watch.tuner.history[-1]
    setting = decision.setting
    return StagePlan(stream.name, notes, setting.workers, setting.buffer, setting.slots,
                     setting.chunk, watch.tuner.auto, decision.reason, watch.last_window(),
                     record.unit if record is not None else "item")
