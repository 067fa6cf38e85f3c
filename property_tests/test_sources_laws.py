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
    draws = fp.sample(range(len(weights)), weights=weights, random_state=seed).pull(300)
    assert {i for i in draws} <= {i for i, w in enumerate(weights) if w > 0}


@given(positive_weights, seeds)
@settings(max_examples=20)
def test_sample_frequencies_follow_the_weights(weights, seed):
    n = 20000
    counts = Counter(fp.sample(range(len(weights)), weights=weights, random_state=seed).pull(n))
    expected = np.array(weights) / sum(weights)
    observed = np.array([counts[i] for i in range(len(weights))]) / n
    assert np.abs(observed - expected).max() < 0.03  # about 8 standard deviations


@given(seeds, pull_sizes)
def test_the_draws_do_not_depend_on_the_pull_sizes(seed, sizes):
    whole = fp.sample(range(50), random_state=seed).pull(sum(sizes))
    parts = fp.sample(range(50), random_state=seed)
    assert [x for n in sizes for x in parts.pull(n)] == whole


@given(seeds, st.integers(0, 3000), st.integers(1, 50))
def test_a_restored_sample_continues_the_stream(seed, skip, n):
    a = fp.sample(range(10), weights=range(1, 11), random_state=seed)
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
