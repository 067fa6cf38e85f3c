"""Laws of the expiration pool: every item exactly `repetitions` times, never more than
`pool_size` items in the pool, seeded draws reproducible."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

import fpipe as fp

items = st.lists(st.integers(0, 10**6), unique=True, max_size=80)
pool_sizes, repetitions, iterations = st.integers(1, 10), st.integers(1, 5), st.integers(1, 3)


@given(items, pool_sizes, repetitions, iterations, st.integers(0, 2**32))
def test_every_item_comes_out_exactly_repetitions_times(xs, size, reps, iters, seed):
    out = list(fp.stream.ExpirationPool(size, reps, iters, seed=seed)(xs))
    assert Counter(out) == Counter({x: reps for x in xs})


@given(items, pool_sizes, repetitions, iterations)
def test_the_pool_never_holds_more_than_pool_size_items(xs, size, reps, iters):
    # the pool fed one item at a time (a generator), so that "read" means "in the pool"
    read, used = [0], Counter()

    def source():
        for x in xs:
            read[0] += 1
            yield x

    stream = fp.stream.ExpirationPool(size, reps, iters, seed=0)(source())
    for x in stream:
        used[x] += 1
        expired = sum(count == reps for count in used.values())
        assert read[0] - expired + (used[x] == reps) <= size
        assert len(stream.state_dict()["own"]["live"]) <= size  # what its state says it holds


@given(items, pool_sizes, repetitions, st.integers(0, 2**32))
def test_seeded_pools_repeat_their_draws(xs, size, reps, seed):
    def run():
        return list(fp.stream.ExpirationPool(size, reps, seed=seed)(xs))
    assert run() == run()


@given(items, pool_sizes, repetitions)
def test_the_first_outputs_come_from_the_first_items(xs, size, reps):
    out = list(fp.stream.ExpirationPool(size, reps, seed=1)(xs))
    assert set(out[:size]) <= set(xs[:size])
