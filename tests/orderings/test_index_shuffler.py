"""IndexShuffler: a true shuffle per epoch computed position by position, for any length; its
states, its speed of start and its memory, and its place among the orderings."""

import collections
import itertools
import json
import tracemalloc

import numpy as np
import pytest

from fpipe.dataset import ListReader
from fpipe.orderings import Cycler, IndexShuffler, QuasiShuffler, Range, Repeater, Shuffler
from fpipe.orderings.permutation import TABLE_MAX, Permutation


class Huge:
    """A reader of ``n`` samples that are their indices, with no storage at all."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def get(self, index, yield_key=False, raw=False, copy=True):
        if not 0 <= index < self.n:
            raise IndexError(index)
        return (f"{index}", index) if yield_key else index

    def iter(self, start=None, stop=None, yield_key=False, raw=False, copy=True, chunk_size=16):
        return (self.get(i, yield_key) for i in range(self.n)[start:stop])


def numbers(n):
    return ListReader([{"key": i} for i in range(n)])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, TABLE_MAX, TABLE_MAX + 1, 100_003, 1 << 17])
def test_every_epoch_is_a_permutation_and_get_agrees_with_iteration(n):
    shuffler = IndexShuffler(Huge(n), seed=11)
    for epoch in range(2):
        order = list(shuffler)
        assert sorted(order) == list(range(n))
        shuffler.set_epoch(epoch)
        picks = range(0, n, max(1, n // 50))
        assert [shuffler.get(p) for p in picks] == [order[p] for p in picks]
        shuffler.set_epoch(epoch + 1)


def test_the_order_is_a_function_of_seed_epoch_and_length():
    one, two = IndexShuffler(Huge(1000), seed=5), IndexShuffler(Huge(1000), seed=5)
    two.set_epoch(3)
    passes = [list(one) for _ in range(4)]
    assert passes[3] == list(two)
    assert len({tuple(p) for p in passes}) == 4
    assert list(IndexShuffler(Huge(1000), seed=6)) != passes[0]
    big = [IndexShuffler(Huge(10**6), seed=s).get(0) for s in range(20)]
    assert len(set(big)) > 15


def test_a_billion_samples_start_at_once_in_little_memory():
    shuffler = IndexShuffler(Huge(10**9), seed=1)
    tracemalloc.start()
    try:
        stream = iter(shuffler)
        first = next(stream)
        rest = list(itertools.islice(stream, 40_000))  # past two blocks of positions
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # a Shuffler would hold 4 GB
    assert len(set([first, *rest])) == 40_001 and all(0 <= i < 10**9 for i in rest)
    state = shuffler.state_dict()
    assert state["position"] == 40_001 and state["length"] == 10**9


def test_small_lengths_give_every_order_about_equally_often():
    counts = collections.Counter(tuple(IndexShuffler(Huge(3), seed=s)) for s in range(3000))
    assert len(counts) == 6 and min(counts.values()) > 400  # 500 each on average


def test_past_the_table_each_sample_lands_anywhere_alike():
    n, seeds = TABLE_MAX + 7, 2000
    first = np.array([Permutation(n, s, 0).index(0) for s in range(seeds)])
    spread = np.bincount(first * 10 // n, minlength=10)
    assert spread.min() > 140 and spread.max() < 260  # 200 each on average
    # and consecutive positions are unrelated
    order = Permutation(n, 3, 0).take(np.arange(n))
    assert abs(np.corrcoef(order[:-1], order[1:])[0, 1]) < 0.02


def test_resume_from_the_position_alone():
    reader = numbers(200_000)
    shuffler = IndexShuffler(reader, seed=9)
    shuffler.set_epoch(4)
    stream = iter(shuffler)
    head = [next(stream)["key"] for _ in range(12_345)]
    state = json.loads(json.dumps(shuffler.state_dict()))
    assert state == {"type": "IndexShuffler", "version": 1, "length": 200_000, "seed": 9,
                     "reader": None, "epoch": 4, "position": 12_345}
    restored = IndexShuffler(reader)
    restored.load_state_dict(state)
    tail = [s["key"] for s in restored]
    whole = IndexShuffler(reader, seed=9)
    whole.set_epoch(4)
    assert head + tail == [s["key"] for s in whole]


@pytest.mark.parametrize("other", [
    lambda r: Shuffler(r, seed=9), lambda r: IndexShuffler(Range(r, 0, 9), seed=9),
    lambda r: QuasiShuffler(r, seed=9), lambda r: IndexShuffler(numbers(11), seed=9)])
def test_a_state_of_another_ordering_is_refused_and_changes_nothing(other):
    reader = numbers(10)
    shuffler = IndexShuffler(reader, seed=1)
    before = shuffler.state_dict()
    with pytest.raises(ValueError):
        shuffler.load_state_dict(other(reader).state_dict())
    assert shuffler.state_dict() == before and shuffler.seed == 1
    with pytest.raises(ValueError, match="IndexShuffler"):
        Shuffler(reader).load_state_dict(before)


def test_it_nests_with_the_other_orderings():
    reader = numbers(30)
    repeated = Repeater(IndexShuffler(Range(reader, 5, 25), seed=2), 2)
    keys = [s["key"] for s in repeated]
    assert sorted(keys) == sorted(list(range(5, 25)) * 2) and keys[:20] != keys[20:]
    cycled = Cycler(IndexShuffler(reader, seed=2))
    assert sorted(s["key"] for s in itertools.islice(cycled, 60)) == sorted(list(range(30)) * 2)
    outer = IndexShuffler(Shuffler(reader, seed=1), seed=2)
    assert sorted(s["key"] for s in outer) == list(range(30))
    with pytest.raises(TypeError, match="random access"):
        IndexShuffler(QuasiShuffler(reader))


def test_bad_arguments_are_refused_when_it_is_made():
    with pytest.raises(ValueError, match="seed"):
        IndexShuffler(numbers(3), seed=-1)
    with pytest.raises(TypeError, match="reader"):
        IndexShuffler([1, 2, 3])
    with pytest.raises(IndexError):
        IndexShuffler(numbers(3), seed=0).get(3)
