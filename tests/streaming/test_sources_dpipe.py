"""sample and load_by_random_id given dpipe's random_state: dpipe 0.5.0's stream, item for item,
checked against the real package."""

import itertools
import json

import numpy as np
import pytest
from dpipe.batch_iter import load_by_random_id as dpipe_load_by_random_id
from dpipe.batch_iter import sample as dpipe_sample

import fpipe as fp

WEIGHTS = [None, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 3, 0, 1, 0, 0, 2.5, 0, 0, 1e-3],
           np.linspace(0.1, 1, 10)]


def take(stream, n):
    return list(itertools.islice(stream, n))


def test_the_issues_example():
    assert take(fp.sample(range(10), random_state=1), 6) == [4, 7, 0, 3, 1, 0]
    assert take(dpipe_sample(range(10), random_state=1), 6) == [4, 7, 0, 3, 1, 0]


@pytest.mark.parametrize("weights", WEIGHTS, ids=["uniform", "linear", "zeros", "floats"])
@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 - 1])
def test_an_int_random_state_gives_dpipes_stream(seed, weights):
    expected = take(dpipe_sample(list("abcdefghij"), weights, seed), 3000)
    assert fp.sample(list("abcdefghij"), weights, seed).pull(3000) == expected
    assert take(fp.sample(list("abcdefghij"), weights, np.int64(seed)), 3000) == expected


@pytest.mark.parametrize("weights", WEIGHTS[:2], ids=["uniform", "linear"])
def test_a_random_state_is_the_callers_and_advances_as_with_dpipe(weights):
    ours, theirs = np.random.RandomState(7), np.random.RandomState(7)
    a, b = fp.sample(range(10), weights, ours), dpipe_sample(range(10), weights, theirs)
    for n in [1, 5, 64, 3]:
        assert [next(a) for _ in range(n)] == take(b, n)
        assert ours.random_sample() == theirs.random_sample()  # the user draws in between
    assert a.pull(100) == take(b, 100)
    assert ours.get_state()[2] == theirs.get_state()[2]


def test_two_samples_on_one_random_state_interleave_as_with_dpipe():
    ours, theirs = np.random.RandomState(3), np.random.RandomState(3)
    a, b = fp.sample(range(100), random_state=ours), fp.sample("xyz", random_state=ours)
    c, d = dpipe_sample(range(100), random_state=theirs), dpipe_sample("xyz", random_state=theirs)
    assert [(next(a), next(b)) for _ in range(50)] == [(next(c), next(d)) for _ in range(50)]


@pytest.mark.parametrize("weights", WEIGHTS[:3], ids=["uniform", "linear", "zeros"])
@pytest.mark.parametrize("make_state", [lambda: 5, lambda: np.random.RandomState(5)],
                         ids=["int", "RandomState"])
def test_load_by_random_id_gives_dpipes_stream(weights, make_state):
    ids = [f"id{i}" for i in range(10)]
    ours = fp.load_by_random_id(str.upper, len, ids=ids, weights=weights,
                                random_state=make_state())
    theirs = dpipe_load_by_random_id(str.upper, len, ids=ids, weights=weights,
                                     random_state=make_state())
    assert take(ours, 500) == take(theirs, 500)
    one = fp.load_by_random_id(str.upper, ids=ids, weights=weights, random_state=make_state())
    assert one.pull(200) == take(dpipe_load_by_random_id(
        str.upper, ids=ids, weights=weights, random_state=make_state()), 200)


def test_a_failed_load_uses_one_draw_of_the_callers_random_state():
    def load(key):
        if key == 3:
            raise KeyError(key)
        return key

    draws = take(dpipe_sample(range(10), random_state=2), 100)
    mine = np.random.RandomState(2)
    stream = fp.load_by_random_id(load, ids=range(10), random_state=mine)
    first_bad = draws.index(3)
    assert stream.pull(100) == draws[:first_bad]
    with pytest.raises(KeyError):
        stream.pull(1)
    expected = np.random.RandomState(2)
    expected.random_sample(first_bad + 1)
    assert mine.random_sample() == expected.random_sample()


@pytest.mark.parametrize("weights", WEIGHTS[:2], ids=["uniform", "linear"])
@pytest.mark.parametrize("make_state", [lambda: 11, lambda: np.random.RandomState(11)],
                         ids=["int", "RandomState"])
def test_dpipes_stream_resumes_exactly_from_a_constant_size_state(weights, make_state):
    expected = take(dpipe_sample(range(10), weights, 11), 3000)
    for stop in [0, 1, 37, 2500]:
        a = fp.sample(range(10), weights, make_state())
        assert a.pull(stop) == expected[:stop] if stop else True
        state = json.loads(json.dumps(a.state_dict()))  # plain data
        assert len(json.dumps(state)) < 10_000
        b = fp.sample(range(10), weights, random_state=99)
        b.load_state_dict(state)
        assert b.pull(3000 - stop) == expected[stop:]
        c = fp.sample(range(10), weights, seed=1)  # counter-based until it loads dpipe's state
        c.load_state_dict({**state, "position": state["position"] + 5})
        assert c.pull(10) == expected[stop + 5:stop + 15]


def test_a_loaded_state_moves_the_callers_random_state():
    mine = np.random.RandomState(0)
    a = fp.sample(range(10), random_state=mine)
    other = fp.sample(range(10), random_state=4)
    other.pull(10)
    a.load_state_dict(other.state_dict())
    assert mine.get_state()[1].tolist() == other.state_dict()["random_state"]["state"]["key"]


def test_the_two_schemes_are_chosen_by_the_argument():
    counted = fp.sample(range(10**6), seed=1).pull(20)
    assert fp.sample(range(10**6), random_state=np.random.default_rng(1)).pull(20) != counted
    assert fp.sample(range(10**6), random_state=np.random.SeedSequence(1)).pull(20) == \
        fp.sample(range(10**6), seed=np.random.SeedSequence(1)).pull(20)
    assert fp.sample(range(10**6), random_state=1).pull(20) != counted
    with pytest.raises(TypeError, match="random_state .* or seed .* not both"):
        fp.sample(range(3), random_state=1, seed=1)
    with pytest.raises(ValueError, match="epoch numbers the counter-based draws"):
        fp.sample(range(3), random_state=1, epoch=2)
    with pytest.raises(TypeError, match="random_state must be an int, RandomState"):
        fp.sample(range(3), random_state=True)
    with pytest.raises(TypeError, match="random_state must be an int, RandomState"):
        fp.sample(range(3), random_state="1")
    with pytest.raises(ValueError, match=r"random_state must be in \[0, 2\*\*32\)"):
        fp.sample(range(3), random_state=-1)
    with pytest.raises(ValueError, match="cannot go back"):
        fp.sample(range(3)).load_state_dict({**fp.sample(range(3), random_state=1).state_dict(),
                                             "position": 0, "at": 3})


def test_a_schedules_bad_weights_use_no_draw_of_the_callers_random_state():
    mine = np.random.RandomState(8)
    stream = fp.sample("ab", weights=lambda step: [1, 1] if step < 4 else [0, 0], random_state=mine)
    assert len(stream.pull(4)) == 4
    with pytest.raises(ValueError, match=r"weights\(4\)"):
        stream.pull(10)
    expected = np.random.RandomState(8)
    expected.random_sample(4)
    assert mine.random_sample() == expected.random_sample()
