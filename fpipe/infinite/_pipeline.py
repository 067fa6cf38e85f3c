"""What an :class:`fpipe.Infinite` runs (:class:`Pipeline`): its stages, the live stream, and
where it stands, counted so that a saved state resumes at once where it can.

>>> from fpipe.stream import batch
>>> pipeline = Pipeline(range(5), [batch(2)], batch_at=0, batch_size=2)
>>> [pipeline.next_batch(first=True) for _ in range(2)], pipeline.consumed()
([[0, 1], [2, 3]], [4])
>>> pipeline.close()
"""

from __future__ import annotations

import warnings
from typing import Any

from fpipe.errors import close_after
from fpipe.skipping import SkippedIndices
from fpipe.stream import Stage, Stream, as_stream

__all__: list[str] = []  # private: Infinite is its user

_SKIP_CHUNK = 1024  # items read at a time when a source is fast-forwarded by reading
_SETTLE_EVERY = 256  # batches between two settlements of the skip counts (see Pipeline)


def restorable(source: Any) -> bool:
    return callable(getattr(source, "state_dict", None)) and \
        callable(getattr(source, "load_state_dict", None))


def _skip_counter(stream: Stream, inputs: int, outputs: int) -> SkippedIndices | None:
    """What counts the items ``stream`` skips (``on_error``), which took ``inputs`` items
    since the origin for ``outputs`` it made; None if it skips none."""
    skips = getattr(stream, "skips", None)
    return None if skips is None else skips.track(inputs, outputs)


def _discard(stream: Stream, n: int) -> None:
    while n > 0:
        items = stream.pull(min(n, _SKIP_CHUNK), full=True)
        if not items:
            return
        n -= len(items)


def _drops(stage: Stage) -> bool:
    """Whether ``stage`` leaves out the items on which its function raises (``on_error``)."""
    return any(getattr(part, "on_error", "raise") != "raise"
               for part in getattr(stage, "stages", [stage]))


class Pipeline:
    """What an :class:`Infinite` runs: its stages, the live stream, and where it stands.

    It holds no reference to the ``Infinite``, so a forgotten ``Infinite`` is collected and its
    finalizer closes this. ``origin`` is the state of the source and the epochs of the stages
    when the stream was built; ``delivered`` counts the batches handed out since then.

    When the batch size is a number and the stages up to the batch take one item per item
    (apart from the items they skip, which their streams log), the pipeline counts the items
    each of those stages took from its upstream since the origin (:meth:`consumed`): ``counts``
    when the stream was built, the skip logs since. A state then resumes at once. Otherwise
    ``counts`` is None, and a resume replays the batches delivered.
    """

    def __init__(self, source: Any, stages: list[Stage], batch_at: int, batch_size: Any) -> None:
        self.source, self.stages, self.batch_at = source, stages, batch_at
        self.per_batch = None if callable(batch_size) else int(batch_size)
        self.countable = self._countable()
        self.stream: Stream | None = None
        self.last: Stream | None = None  # the latest stream, for stats()
        self.origin: tuple = (None, [])
        self.delivered = self.skip = 0  # skip: batches a restored state has delivered
        self.resume_counts: list[int] | None = None  # the counts of a restored state
        self.counts: list[int] | None = None
        self.skipped: list = []  # per stage up to the batch: its SkippedIndices, or None
        self.warned_empty = self.warned_short = False

    def ensure(self) -> Stream:
        """The live stream, built and started if there is none."""
        if self.stream is None:
            self.stream = self.last = self._build().start()
        return self.stream

    def _build(self) -> Stream:
        state = self.source_state()
        if state is not None:
            self.source.load_state_dict(state)  # the place the stream starts from, exactly
        epochs = [stage.epoch for stage in self.stages]
        skip, self.skip = self.skip, 0
        counts = self.start_counts(skip)
        self.resume_counts = None
        fast = counts is not None
        if not fast and self.countable:
            counts = [0] * (self.batch_at + 1)  # count from the origin while the replay runs
        stream = self._source_stream(state, counts[0] if fast else 0)
        self.skipped = []
        for at, (stage, epoch) in enumerate(zip(self.stages, epochs)):
            start = (counts[at] if at < self.batch_at else skip) if fast else 0
            stream = stage.apply(stream, epoch=epoch, start=start)
            stage.set_epoch(epoch + 1)
            if counts is not None and at < self.batch_at:
                self.skipped.append(_skip_counter(stream, counts[at], counts[at + 1]))
        self.origin, self.delivered, self.counts = (state, epochs), skip, counts
        if not fast:
            self._replay(stream, skip)
        return stream

    def _countable(self) -> bool:
        before, after = self.stages[:self.batch_at], self.stages[self.batch_at + 1:-1]
        return self.per_batch is not None and all(stage.one_to_one for stage in before) and \
            all(stage.one_to_one and not _drops(stage) for stage in after)

    def start_counts(self, skip: int) -> list[int] | None:
        """The items each stage up to the batch (and the batch) has taken when a stream
        begins after ``skip`` batches: a restored state's counts, or ``skip`` batches' worth
        where no stage skips; None when the stream must replay them (then a pipeline that
        counts counts them anew as it replays)."""
        if not self.countable:
            return None
        if self.resume_counts is not None:
            return list(self.resume_counts)
        if skip and any(_drops(stage) for stage in self.stages[:self.batch_at]):
            return None  # a state of fpipe 0.1.0 has no counts: replay what it delivered
        return [skip * self.per_batch] * (self.batch_at + 1)

    def consumed(self) -> list[int] | None:
        """The items that each stage up to the batch, and the batch, took from its upstream
        since the origin to make the batches delivered; None when the stream replays."""
        if self.counts is None:
            return None
        counts = [self.delivered * self.per_batch]
        for skipped in reversed(self.skipped):
            counts.insert(0, counts[0] if skipped is None else skipped.inputs_for(counts[0]))
        return counts

    def _settle(self) -> None:
        # a long stream that skips keeps only the indices ahead of what was delivered
        if self.counts is not None and any(self.skipped):
            consumed = self.consumed()
            for at, skipped in enumerate(self.skipped):
                if skipped is not None:
                    skipped.settle(consumed[at + 1])

    def _source_stream(self, state: dict | None, skip: int) -> Stream:
        """The source as a stream, moved ``skip`` items on: in O(1) when the source can seek or
        counts its place in ``state['position']``, else by reading."""
        position = state.get("position") if isinstance(state, dict) else None
        if skip and isinstance(position, int):
            if callable(getattr(self.source, "seek", None)):
                return self._seek(position + skip)
            self.source.load_state_dict({**state, "position": position + skip})
            return as_stream(self.source)
        stream = as_stream(self.source)
        _discard(stream, skip)
        return stream

    def _seek(self, position: int) -> Stream:
        # an ordering's iteration ends with its epoch, where seek() would carry on into the
        # next one: a place at or past the end is an iteration that has ended, unless the
        # ordering is endless (a Cycler), whose iteration carries on as seek() does
        length = len(self.source) if hasattr(self.source, "__len__") else None
        ended = length is not None and position >= length and \
            not getattr(self.source, "endless", False)
        self.source.seek(length if ended else position)
        return as_stream([] if ended else self.source)

    @staticmethod
    def _replay(stream: Stream, batches: int) -> None:
        for _ in range(batches):
            if not stream.pull(1):
                return

    def source_state(self) -> dict | None:
        return self.source.state_dict() if restorable(self.source) else None

    def next_batch(self, first: bool) -> Any:
        """The next batch; StopIteration when a finite source has ended (the next call then
        starts it again). The first batch of an epoch does that at once."""
        stream = self.ensure()
        try:
            item = next(stream)
        except StopIteration:
            again = first and self.delivered > 0
            if not self.delivered:  # this stream gave nothing at all
                self._warn_empty()
            self.close()
            if not again:
                raise
            return self.next_batch(first=False)
        except BaseException as error:
            close_after(self.close, error)  # the next epoch starts cleanly
            raise
        self.delivered += 1
        if not self.delivered % _SETTLE_EVERY:
            self._settle()
        return item

    def _warn_empty(self) -> None:
        if not self.warned_empty:
            self.warned_empty = True
            warnings.warn(f"the source of this Infinite, {self.source!r:.80}, gave no items: an "
                          "epoch is empty (an iterator that has run out stays empty; pass a "
                          "list or a range to start it again each epoch). This is said once.",
                          RuntimeWarning, stacklevel=4)

    def warn_short(self, batches: int, wanted: int) -> None:
        """An epoch ended after ``batches`` of ``wanted`` batches: the source ran out."""
        if not self.warned_short:
            self.warned_short = True
            warnings.warn(f"the source of this Infinite, {self.source!r:.80}, ran out after "
                          f"{batches} of batches_per_epoch={wanted} batches: the epochs of a "
                          f"finite source end where it does (use an infinite source such as "
                          f"fpipe.sample, or fewer batches_per_epoch). This is said once.",
                          RuntimeWarning, stacklevel=4)

    def close(self) -> None:
        stream, self.stream = self.stream, None
        try:
            if stream is not None:
                stream.close()
        finally:
            for stage in self.stages:
                stage.close()
