"""The expiration pool: dpipe's semantics, a bound, seeds."""

from collections import Counter

import pytest
from toolz import pipe

import fpipe as fp


def test_every_item_comes_out_repetitions_times():
    out = list(fp.stream.ExpirationPool(pool_size=5, repetitions=3, seed=0)(range(40)))
    assert Counter(out) == Counter({i: 3 for i in range(40)})


def test_the_first_outputs_come_from_the_first_pool_size_items():
    out = list(fp.stream.ExpirationPool(pool_size=10, repetitions=4, seed=1)(range(100)))
    assert set(out[:10]) <= set(range(10))


def test_seeded_pools_repeat_and_epochs_differ():
    stage = fp.stream.ExpirationPool(8, 2, seed=4)
    first, second = list(stage(range(50))), list(stage(range(50)))
    assert first != second
    stage.set_epoch(0)
    assert list(stage(range(50))) == first


def test_dpipe_names():
    out = list(fp.expiration_pool(range(6), pool_size=2, repetitions=2))
    assert sorted(out) == sorted(list(range(6)) * 2)
    stage = fp.ExpirationPool(3, 2, iterations=2)
    assert sorted(stage("abcd")) == sorted("aabbccdd")
    assert repr(stage) == "ExpirationPool(3, 2, iterations=2)"


def test_unhashable_items_are_fine():
    out = list(fp.stream.ExpirationPool(2, 2, seed=0)([[1], [2]]))
    assert sorted(out) == [[1], [1], [2], [2]]


def test_the_pool_reads_no_further_than_it_must_from_an_expensive_upstream():
    read = []

    def expensive(x):
        read.append(x)
        import time
        time.sleep(0.001)  # slow enough that the stream reads one item at a time
        return x

    stream = pipe(range(100), fp.stream.map(expensive),
                  fp.stream.ExpirationPool(pool_size=4, repetitions=2, seed=0))
    for _ in range(6):
        next(stream)
    assert len(read) <= 4 + 2


@pytest.mark.parametrize("args, message", [
    ((0, 1), "pool_size must be >= 1; got pool_size=0"),
    ((1, 0), "repetitions must be >= 1"),
    ((1, 1, 0), "iterations must be >= 1"),
])
def test_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        fp.stream.ExpirationPool(*args)


@pytest.mark.parametrize("seed", [3, None])
def test_a_pool_stream_resumes_from_its_state_after_any_output(seed):
    import pickle

    def make(state=None):
        stream = fp.stream.ExpirationPool(4, 3, iterations=2, seed=seed)(range(40))
        if state is not None:
            stream.load_state_dict(state)
        return stream

    for stop in (0, 1, 7, 50, 119):
        first = make()
        head = [next(first) for _ in range(stop)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        rest = list(make(state))
        assert head + rest == head + list(first)  # unseeded too: the state holds the generator
        assert sorted(head + rest) == sorted(list(range(40)) * 3)
    with pytest.raises(ValueError, match=r"state\['own'\]\['live'\] must be at most 5"):
        make({**state, "own": {**state["own"], "live": [[0, 1]] * 9}})
