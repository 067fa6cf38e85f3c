"""What a stream measures for :func:`fpipe.stats`: the items it delivers and, for one pull in
16, the time of the pull and the part of it spent waiting for its upstream; from these, the
shares of a stream's time spent working, waiting for its input and waiting for its consumer.
:class:`~fpipe.stream.core.Stream` holds a :class:`Meter` and calls it at the pulls it times;
this module keeps the timing itself out of the stream core.

>>> meter = Meter()
>>> start = meter.begin(10.0)
>>> meter.end(start, 4, 10.5)
>>> meter.measure(12.0), meter.shares(2.0)
((4, 2.0), (0.25, 0.0, 0.75))
"""

from __future__ import annotations

__all__: list[str] = []  # private: the stream core and the stats are its users

TIMED_EVERY = 16  # a stream times one pull in 16; that keeps stats under 5 % on cheap stages


class Meter:
    """What a stream measures: the items it delivers, and for one pull in 16, the time of
    the pull and the part of it spent waiting for the upstream. (One class for every stream,
    so that the attribute access of the hot path stays specialized; the stream counts
    ``items`` and ``until_timed`` itself, and adds to ``waited`` while ``timing``.)"""

    __slots__ = ("items", "seconds", "started", "timed", "timing", "until_timed", "waited")

    def __init__(self) -> None:
        self.items = self.timed = 0
        self.until_timed = 1  # the first pull is timed
        self.seconds = self.waited = 0.0
        self.started, self.timing = None, False

    def begin(self, now: float) -> float:
        """Start timing a pull at ``time.perf_counter()`` value ``now``; return ``now``."""
        if self.started is None:
            self.started = now
        self.until_timed, self.timing = TIMED_EVERY, True
        return now

    def end(self, start: float, items: int, now: float) -> None:
        """The timed pull that began at ``start`` gave ``items`` items by ``now``."""
        self.seconds += now - start
        self.timed += 1
        self.items += items

    def scale(self) -> float:
        """Pulls per timed pull, to scale the sampled times up to all pulls."""
        return (self.timed * TIMED_EVERY - self.until_timed + 1) / self.timed if self.timed else 0.0

    def measure(self, now: float) -> tuple[int, float]:
        """The items delivered and the seconds since the first pull, at ``now``."""
        return self.items, now - self.started if self.started is not None else 0.0

    def shares(self, wall: float) -> tuple[float, float, float]:
        """The shares of ``wall`` seconds spent working, waiting for the input, and waiting
        for the consumer (between pulls); estimated from the timed pulls."""
        scale = self.scale()
        busy, waited = (self.seconds - self.waited) * scale, self.waited * scale
        return busy / wall, waited / wall, max(wall - busy - waited, 0.0) / wall
