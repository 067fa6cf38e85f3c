"""Laws of the sources: support, frequencies, seeds, resumption, and mixing."""

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import fpipe as fp
from property_tests.strategies import positive_weights, pull_sizes

seeds = st.integers(0, 2**63 - 1)


@given(st.lists(st.floats(0, 5), min_size=1, max_size=8).filter(lambda w: sum(w) > 0), seeds)
def test_sample_draws_only_elements_of_positive_weight(weights, seed):
    draws = fp.sample(range(len(weights)), weights=weights, seed=seed).pull(300)
    assert {i for i in draws} <= {i for i, w in enumerate(weights) if w > 0}


@given(positive_weights, seeds)
@settings(max_examples=20)
def test_sample_frequencies_follow_the_weights(weights, seed):
    n = 20000
    counts = Counter(fp.sample(range(len(weights)), weights=weights, seed=seed).pull(n))
    expected = np.array(weights) / sum(weights)
    observed = np.array([counts[i] for i in range(len(weights))]) / n
    assert np.abs(observed - expected).max() < 0.03  # about 8 standard deviations


@given(seeds, pull_sizes)
def test_the_draws_do_not_depend_on_the_pull_sizes(seed, sizes):
    whole = fp.sample(range(50), seed=seed).pull(sum(sizes))
    parts = fp.sample(range(50), seed=seed)
    assert [x for n in sizes for x in parts.pull(n)] == whole


@given(seeds, st.integers(0, 3000), st.integers(1, 50))
def test_a_restored_sample_continues_the_stream(seed, skip, n):
    a = fp.sample(range(10), weights=range(1, 11), seed=seed)
    a.pull(skip) if skip else None
    b = fp.sample(range(10), weights=range(1, 11))
    b.load_state_dict(a.state_dict())
    assert a.pull(n) == b.pull(n)


@given(st.lists(st.integers(0, 30), min_size=1, max_size=4), st.sampled_from(["first", "all"]),
       seeds)
def test_mix_keeps_each_sources_order_and_loses_nothing_with_until_all(lengths, until, seed):
    sources = [[(k, i) for i in range(n)] for k, n in enumerate(lengths)]
    out = list(fp.mix(*sources, seed=seed, until=until))
    for k, source in enumerate(sources):
        assert [x for x in out if x[0] == k] == source[:len([x for x in out if x[0] == k])]
    if until == "all":
        assert sorted(out) == sorted(x for s in sources for x in s)


lengths = st.lists(st.integers(1, 12), min_size=1, max_size=4)


def _mix(lengths, seed, until="never", weights=None, epoch=0):
    sources = [[(k, i) for i in range(n)] for k, n in enumerate(lengths)]
    return fp.mix(*sources, weights=weights, seed=seed, until=until, epoch=epoch)


@given(lengths, seeds, st.integers(0, 3), st.integers(0, 120), st.sampled_from(["first", "all", "never"]))
@settings(max_examples=40)
def test_a_restored_mix_continues_the_stream_at_any_position(lengths, seed, epoch, stop, until):
    whole = _mix(lengths, seed, until, epoch=epoch).pull(10**4)[:150]
    stop = min(stop, len(whole))
    first = _mix(lengths, seed, until, epoch=epoch)
    done = [x for _ in range(stop) for x in first.pull(1)]
    second = _mix(lengths, seed + 1, until)
    second.load_state_dict(first.state_dict())
    assert done + second.pull(10**4)[:150 - stop] == whole
    jumped = _mix(lengths, seed + 1, until)
    jumped.load_state_dict({**_mix(lengths, seed, until, epoch=epoch).state_dict(), "position": stop})
    assert jumped.pull(10**4)[:150 - stop] == whole[stop:]


@given(seeds, st.sampled_from(["int", "RandomState", "seed"]), st.integers(0, 3000),
       st.integers(1, 50))
def test_a_restored_sample_continues_either_stream(seed, kind, skip, n):
    seed %= 2**32
    def make(seed):
        if kind == "seed":
            return fp.sample(range(10), weights=range(1, 11), seed=seed)
        state = np.random.RandomState(seed) if kind == "RandomState" else seed
        return fp.sample(range(10), weights=range(1, 11), random_state=state)
    a = make(seed)
    a.pull(skip) if skip else None
    b = make((seed + 1) % 2**32)
    b.load_state_dict(a.state_dict())
    assert a.pull(n) == b.pull(n)


@given(st.lists(st.integers(1, 30), min_size=1, max_size=5), st.integers(2, 4), seeds)
def test_the_schedule_decides_each_step(segments, count, seed):
    steps = [sum(segments[:j]) for j in range(len(segments))]
    picks = [(j * 7 + seed) % count for j in range(len(segments))]
    schedule = [(step, [int(k == pick) for k in range(count)]) for step, pick in zip(steps, picks)]
    sources = [[k] * 200 for k in range(count)]
    out = fp.mix(*sources, weights=schedule, seed=seed).pull(sum(segments))
    expected = [pick for size, pick in zip(segments, picks) for _ in range(size)]
    assert out == expected
    drawn = fp.sample(range(count), weights=schedule, seed=seed).pull(sum(segments))
    assert drawn == expected


@given(lengths, seeds, pull_sizes)
def test_a_mix_is_a_function_of_seed_and_epoch_alone(lengths, seed, sizes):
    whole = _mix(lengths, seed).pull(sum(sizes))
    parts = _mix(lengths, seed)
    assert [x for n in sizes for x in parts.pull(n)] == whole
    assert [next(_m) for _m in [_mix(lengths, seed)] for _ in range(len(whole))] == whole
