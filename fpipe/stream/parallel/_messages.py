"""The messages on a background run's results queue, from its feeder, its workers and the
process pool to the consuming stream."""

from __future__ import annotations

from typing import NamedTuple

from fpipe.errors import CapturedError


class Message(NamedTuple):
    """One entry of a run's results queue: the outputs of chunk ``seq`` (and the error that
    cut it short, the seconds of work, the slots it held, and of the seconds of work those on a
    core and those waiting for one), or one of the markers that the named constructors make."""

    seq: int | None
    outputs: list | None
    error: CapturedError | None
    seconds: float
    slots: int
    cpu: float = 0.0
    queued: float = 0.0

    @classmethod
    def end(cls, seq: int, slots: int) -> Message:
        """The input ended: ``seq`` chunks came before."""
        return cls(seq, None, None, 0.0, slots)

    @classmethod
    def failure(cls, error: CapturedError) -> Message:
        """The process pool failed: sent to every run, outside the order of the chunks."""
        return cls(None, [], error, 0.0, 0)

    @classmethod
    def wake(cls) -> Message:
        """Nothing but a wake-up for a consumer that waits (the run is stopping)."""
        return cls(None, None, None, 0.0, 0)

    @property
    def is_end(self) -> bool:
        return self.seq is not None and self.outputs is None

    @property
    def is_failure(self) -> bool:
        return self.seq is None and self.error is not None

    @property
    def is_wake(self) -> bool:
        return self.seq is None and self.error is None
