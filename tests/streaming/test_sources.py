"""sample, load_by_random_id and mix."""

from collections import Counter

import numpy as np
import pytest
from toolz import pipe

import fpipe as fp


def test_sample_is_infinite_weighted_and_never_draws_weight_zero():
    draws = fp.sample("abc", weights=[1, 0, 3], random_state=0).pull(20000)
    counts = Counter(draws)
    assert counts["b"] == 0 and 0.72 < counts["c"] / 20000 < 0.78


def test_sample_is_uniform_without_weights():
    counts = Counter(fp.sample(range(4), random_state=1).pull(40000))
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 9000


@pytest.mark.parametrize("seed", [5, np.random.default_rng(5), np.random.RandomState(5)])
def test_the_same_seed_gives_the_same_stream(seed):
    make = (lambda: fp.sample(range(1000), random_state=seed)) if isinstance(seed, int) else None
    if make is None:  # a generator is drawn from once, so copy it first
        import copy
        a = fp.sample(range(1000), random_state=copy.deepcopy(seed))
        b = fp.sample(range(1000), random_state=copy.deepcopy(seed))
    else:
        a, b = make(), make()
    assert a.pull(50) == b.pull(50)


def test_draws_do_not_depend_on_how_they_are_read():
    a = fp.sample(range(100), random_state=2)
    b = fp.sample(range(100), random_state=2)
    assert a.pull(3000) == [x for _ in range(3000) for x in [next(b)]]


def test_a_sample_resumes_from_its_state():
    a = fp.sample(range(100), weights=np.arange(100), random_state=9)
    a.pull(1500)
    next(a)  # read ahead by next(): the position counts what was delivered
    state = a.state_dict()
    b = fp.sample(range(100), weights=np.arange(100))
    b.load_state_dict(state)
    assert a.pull(40) == b.pull(40)


def test_a_closed_sample_goes_on():
    s = fp.sample([1, 2, 3], random_state=0)
    with pipe(s, fp.stream.map(abs)) as stream:
        next(stream)
    assert len(s.pull(5)) == 5


@pytest.mark.parametrize("weights, message", [
    ([1, 2], "one weight per element: 3"),
    ([1, -1, 1], "non-negative"),
    ([0, 0, 0], "not all zero"),
    ([1, float("nan"), 1], "finite"),
    (["a", "b", "c"], "sequence of numbers"),
])
def test_bad_weights_are_rejected_when_sample_is_called(weights, message):
    with pytest.raises((ValueError, TypeError), match=message):
        fp.sample("abc", weights=weights)


def test_bad_sequences_are_rejected():
    with pytest.raises(ValueError, match="must not be empty"):
        fp.sample([])
    with pytest.raises(TypeError, match="sized sequence"):
        fp.sample(iter([1]))


def test_load_by_random_id_yields_what_the_loaders_make():
    one = fp.load_by_random_id(str.upper, ids=["x"], random_state=0)
    assert one.pull(2) == ["X", "X"]
    two = fp.load_by_random_id(str.upper, len, ids=["ab", "c"], weights=[1, 0])
    assert next(two) == ("AB", 2)
    with pytest.raises(TypeError, match="at least one loader"):
        fp.load_by_random_id(ids=[1])


def test_a_loader_error_arrives_after_the_items_before_it():
    def load(key):
        if key == 6:
            raise KeyError(key)
        return key

    ids = [1, 2, 3, 4, 5, 6]
    stream = fp.load_by_random_id(load, ids=ids, random_state=2)
    draws = fp.sample(ids, random_state=2).pull(100)
    first_bad = draws.index(6)
    assert first_bad > 0 and stream.pull(100) == draws[:first_bad]
    with pytest.raises(KeyError):
        stream.pull(1)
    assert stream.pull(1) == [draws[first_bad + 1]]  # the bad id is skipped


def test_mix_follows_the_weights_and_the_seed():
    a, b = fp.mix(range(0, 10**6), range(10**6, 2 * 10**6), weights=[3, 1], seed=1), None
    draws = a.pull(8000)
    share = sum(x < 10**6 for x in draws) / len(draws)
    assert 0.72 < share < 0.78
    b = fp.mix(range(0, 10**6), range(10**6, 2 * 10**6), weights=[3, 1], seed=1)
    assert b.pull(8000) == draws
    firsts = [x for x in draws if x < 10**6]
    assert firsts == sorted(firsts)  # each source keeps its own order


def test_mix_ends_with_the_first_source_or_goes_on_with_the_others():
    short, long = list(range(5)), list(range(100, 200))
    first = list(fp.mix(short, long, seed=0))
    assert set(short) <= set(first) and len(first) < 105
    every = list(fp.mix(short, long, seed=0, until="all"))
    assert sorted(every) == short + long


def test_mix_closes_its_sources_and_checks_its_arguments():
    closed = []

    def source():
        try:
            yield from iter(int, 1)
        finally:
            closed.append(True)

    with fp.mix(source(), [1, 2], weights=[1, 0], seed=0) as stream:
        next(stream)
    assert closed == [True]
    with pytest.raises(ValueError, match="until must be 'first', 'all' or 'never'"):
        fp.mix([1], until="forever")
    with pytest.raises(ValueError, match=r"until='never' .* got sources\[1\]"):
        fp.mix([1], iter([2]), until="never")
    with pytest.raises(ValueError, match="not empty"):
        fp.mix([1], [], until="never")
    with pytest.raises(TypeError, match="epoch must be an integer"):
        fp.mix([1], epoch="1")
    with pytest.raises(ValueError, match="one weight per element"):
        fp.mix([1], [2], weights=[1])


def test_weights_follow_a_list_of_steps_or_a_function_of_the_step():
    listed = fp.sample("abc", weights=[(0, [1, 0, 0]), (10, [0, 1, 0]), (25, [0, 0, 1])], seed=3)
    assert "".join(listed.pull(40)) == "a" * 10 + "b" * 15 + "c" * 15
    by_parity = fp.sample("ab", weights=lambda step: [step % 2, 1 - step % 2], seed=1)
    assert "".join(by_parity.pull(8)) == "ba" * 4
    mixed = fp.mix("a" * 50, "b" * 50, weights=[(0, [1, 0]), (5, [0, 1])], seed=0)
    assert "".join(mixed.pull(10)) == "aaaaabbbbb"


def test_a_schedule_that_leaves_no_live_source_ends_the_mix():
    mixed = fp.mix("aaa", "b" * 50, weights=[(0, [1, 0]), (10, [0, 1])], seed=0, until="all")
    assert "".join(mixed) == "aaa"


@pytest.mark.parametrize("weights, error, message", [
    ([(1, [1, 1])], ValueError, "must start at 0 and increase"),
    ([(0, [1, 1]), (0, [1, 2])], ValueError, "must start at 0 and increase"),
    ([(0.5, [1, 1])], TypeError, r"weights\[0\]\[0\] must be an integer"),
    ([(0, [1, 1]), (4, [1])], ValueError, r"weights\[1\]\[1\] must hold one weight"),
])
def test_bad_schedules_are_rejected_when_sample_is_called(weights, error, message):
    with pytest.raises(error, match=message):
        fp.sample("ab", weights=weights)


def test_a_functions_bad_weights_are_named_by_their_step():
    stream = fp.sample("ab", weights=lambda step: [1, 1] if step < 3 else [1, -1], seed=0)
    with pytest.raises(ValueError, match=r"weights\(3\) must be finite, non-negative"):
        stream.pull(10)


def test_a_seeded_sample_draws_anew_in_each_epoch_and_resumes_in_it():
    zero, one = fp.sample(range(10**6), seed=2), fp.sample(range(10**6), seed=2, epoch=1)
    assert zero.pull(30) != one.pull(30)
    again = fp.sample(range(10**6))
    again.load_state_dict(one.state_dict())
    assert again.pull(30) == one.pull(30)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        fp.sample("ab", seed=0, epoch=-1)
