"""What a process stage's workers run when the planner has fused stages into it: the maps
folded in before its function (:class:`ChainedCall`), and the batching and combining after it
(:class:`BatchCall`). Both keep the errors of the stages they stand for: the same error, after
the same outputs, as the stages would give one after the other in the consumer.

>>> from fpipe.stream.simple import ItemCall
>>> calls = ChainedCall((ItemCall(abs, (), {}, None, 0), ItemCall(str, (), {}, None, 0)), (0, 0))
>>> calls.run([-1, 2], 0)[:2]
(['1', '2'], None)
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from fpipe.errors import CapturedError, capture

__all__: list[str] = []  # private: the planner and the process stage are its users


class Call(Protocol):
    """What a worker runs over a chunk: ``run(chunk, start)`` gives ``(outputs, error,
    seconds)`` (:class:`fpipe.stream.simple.ItemCall` is one)."""

    def run(self, chunk: list, start: int) -> tuple[list, CapturedError | None, float]: ...


class ChainedCall:
    """Item calls one after another over a chunk: each takes what the one before gave. The
    ``k``-th numbers its items from ``start + offsets[k]`` (a folded map counts its own items).

    An error cuts a call's outputs short; the calls after it still run over the outputs before
    the error, and the last error raised is the one reported: it is of the earliest item, as
    the later calls only see items before the earlier errors.
    """

    __slots__ = ("calls", "offsets")

    def __init__(self, calls: tuple, offsets: tuple[int, ...]) -> None:
        self.calls, self.offsets = calls, offsets

    def __reduce__(self):
        return ChainedCall, (self.calls, self.offsets)

    def run(self, chunk: list, start: int) -> tuple[list, CapturedError | None, float]:
        began, error, items = time.perf_counter(), None, chunk
        for call, offset in zip(self.calls, self.offsets):
            outputs: list = []
            try:
                call.into(outputs, items, start + offset)
            except BaseException as raised:  # a worker reports even SystemExit
                error = capture(raised)
            items = outputs
        return items, error, time.perf_counter() - began


class BatchCall:
    """A chunk of groups of items (each group a batch's worth, as :func:`fpipe.batch` made
    them before the workers) through the item calls, and each group's outputs, as a batch,
    through the combiner's call. ``start`` counts groups: group ``g`` numbers its items from
    ``item_start + g * size`` and is batch ``combine_start + g`` for a seeded combiner.

    As in the consumer, a short group makes a short batch unless ``drop_last``: the last one,
    and one that an error of the item calls cut short (:func:`fpipe.batch` hands out what came
    before an error, then raises it); the error then ends the chunk. An error of the combiner
    ends it after the batches before it, also when it combines what an error cut short (the
    combiner's error comes first there, as in the consumer).

    ``after`` holds the calls of the maps that follow the combiner in the workers (those that
    say ``in_workers=True``), each with the number of its first batch: each batch goes through
    them in turn, and an error of one of them ends the chunk as the combiner's does.
    """

    __slots__ = ("items", "item_start", "size", "drop_last", "combine", "combine_start", "after")

    def __init__(self, items: Any, item_start: int, size: int, drop_last: bool, combine: Any,
                 combine_start: int, after: tuple = ()) -> None:
        self.items, self.item_start, self.size = items, item_start, size
        self.drop_last, self.combine, self.combine_start = drop_last, combine, combine_start
        self.after = after

    def __reduce__(self):
        return BatchCall, (self.items, self.item_start, self.size, self.drop_last, self.combine,
                           self.combine_start, self.after)

    def then(self, call: Any, start: int) -> BatchCall:
        """This call with the map call ``call`` (numbering batches from ``start``) after it."""
        return BatchCall(self.items, self.item_start, self.size, self.drop_last, self.combine,
                         self.combine_start, (*self.after, (call, start)))

    def run(self, groups: list, start: int) -> tuple[list, CapturedError | None, float]:
        began, batches, error = time.perf_counter(), [], None
        for group, number in zip(groups, range(start, start + len(groups))):
            outputs, error, _ = self.items.run(group, self.item_start + number * self.size)
            if outputs and not (self.drop_last and len(outputs) < self.size):
                try:
                    batches.append(self._finished(outputs, number))
                except BaseException as raised:
                    error = capture(raised)
            if error is not None:
                break
        return batches, error, time.perf_counter() - began

    def _finished(self, outputs: list, number: int) -> Any:
        """Group ``number``'s outputs combined, then through the maps after the combiner."""
        batch: list = []
        self.combine.into(batch, [outputs], self.combine_start + number)
        for call, start in self.after:
            value, batch = batch, []
            call.into(batch, value, start + number)
        return batch[0]
