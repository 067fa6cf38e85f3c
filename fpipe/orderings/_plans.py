"""The random draws of the shufflers, on indices: datadings's per-epoch ``random.Random``,
shuffles kept in compact arrays, and a :class:`~fpipe.orderings.order.QuasiShuffler`'s plan of an
epoch, with the replay that finds what its buffer holds at any position without reading a
sample. Private: :mod:`fpipe.orderings.order` uses it.

>>> order = shuffled(epoch_random(seed=3, epoch=1, n=6), 6)
>>> sorted(order.tolist()), order.tolist() == shuffled(epoch_random(3, 1, 6), 6).tolist()
([0, 1, 2, 3, 4, 5], True)
"""

from __future__ import annotations

import array
import math
import random
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

__all__ = ["BLOCK", "NO_SLOTS", "Plan", "buffer_samples", "epoch_random", "replayed_slots",
           "shuffled", "slot_blocks"]

# indices become Python ints this many at a time, so that no pass holds n of them at once
BLOCK = 1 << 14


class Plan(NamedTuple):
    """One epoch of a QuasiShuffler in terms of indices.

    Chunks are read in the shuffled ``order``; the *read position* of a sample is its place
    in that sequence, and ``starts[j]`` is the read position of chunk ``order[j]``'s first
    sample. Read positions ``[0, fill)`` fill the buffer; each later one replaces a random slot.
    """

    order: np.ndarray
    starts: np.ndarray
    fill: int
    chunk_size: int
    slot_state: tuple  # the Mersenne Twister's state when the first slot is drawn
    flush: np.ndarray  # the order in which the buffer's slots go out at the end

    def pieces(self, low: int, high: int) -> Iterator[tuple[int, int]]:
        """The sample ranges ``(first, stop)`` that read positions ``[low, high)`` cover, one
        contiguous range per chunk."""
        if low >= high:
            return
        for block in range(int(np.searchsorted(self.starts, low, side="right")) - 1,
                           len(self.order), BLOCK):
            chunks = self.order[block:block + BLOCK].tolist()
            starts = self.starts[block:block + BLOCK + 1].tolist()
            for chunk, start, end in zip(chunks, starts, starts[1:]):
                if start >= high:
                    return
                begin = max(low, start)
                first = chunk * self.chunk_size + begin - start
                yield first, first + min(high, end) - begin

    def samples(self, positions: np.ndarray) -> np.ndarray:
        chunks = np.searchsorted(self.starts, positions, side="right") - 1
        return (self.order[chunks].astype(np.int64) * self.chunk_size
                + (positions - self.starts[chunks]))


NO_SLOTS = np.empty(0, dtype=np.uint64)


def epoch_random(seed: int, epoch: int, n: int) -> random.Random:
    # datadings seeds each pass with seed + offset, the offset growing by n a pass
    return random.Random(seed + epoch * n)


def shuffled(rand: random.Random, n: int) -> np.ndarray:
    """``rand.shuffle`` of ``range(n)``, in a compact array (a list would take 9 times the
    memory while it is shuffled)."""
    order = array.array("i" if n < 2 ** 31 else "q", range(n))
    rand.shuffle(order)
    return np.frombuffer(order, dtype=order.typecode)


def slot_blocks(state: tuple, slots: int) -> Iterator[np.ndarray]:
    """Endless ``randrange(slots)`` draws of a ``random.Random`` in ``state``, a block at a
    time. numpy's MT19937 is the same generator: started from the same state it gives the
    same 32-bit words, and ``randrange(m)`` keeps the top ``m.bit_length()`` bits of a word
    when they are below ``m`` and tries the next word otherwise."""
    words = np.random.MT19937()
    words.state = {"bit_generator": "MT19937",
                   "state": {"key": np.array(state[1][:-1], dtype=np.uint32), "pos": state[1][-1]}}
    shift = np.uint64(32 - slots.bit_length())
    while True:
        drawn = words.random_raw(BLOCK) >> shift
        yield drawn[drawn < slots]


def replayed_slots(plan: Plan, blocks: Iterator[np.ndarray], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The sample index in each buffer slot after ``steps`` replacements, replayed on indices
    (the last replacement of a slot decides what it holds), and the slot choices left over
    from the last block drawn."""
    held, done, rest = np.arange(plan.fill, dtype=np.int64), 0, NO_SLOTS
    while done < steps:
        drawn = next(blocks)
        taken, rest = drawn[:steps - done], drawn[steps - done:]
        chosen, last_from_end = np.unique(taken[::-1], return_index=True)
        held[chosen] = plan.fill + done + len(taken) - 1 - last_from_end
        done += len(taken)
    return plan.samples(held), rest


def buffer_samples(buf_size: float, n: int) -> int:
    if isinstance(buf_size, (bool, np.bool_)) or not isinstance(
            buf_size, (int, float, np.integer, np.floating)):
        raise TypeError(f"buf_size must be a number; got buf_size={buf_size!r}")
    if 0 < buf_size < 1:
        return math.ceil(buf_size * n)
    if not (buf_size >= 1 and float(buf_size).is_integer()):
        raise ValueError("buf_size must be a fraction in (0, 1) or a whole number of samples "
                         f">= 1; got buf_size={buf_size!r}")
    return int(buf_size)
