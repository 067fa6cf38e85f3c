"""random_apply and sample_args given dpipe's random_state draw exactly what dpipe 0.5.0 draws
after np.random.seed (checked against the real package, item for item); inside a seeded stage,
NumPy's global samplers draw from the item's generator, or fail loudly."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
from dpipe.batch_iter import random_apply as dpipe_random_apply
from dpipe.batch_iter import sample_args as dpipe_sample_args

import fpipe


def negate(x):
    return -x


def shift(x, *bys, **named):
    return (x, *bys, *sorted(named.items()))


def dpipe_outputs(transform, n, state):
    """dpipe's transform run n times with the global state set to ``state``; the caller's
    global state is put back."""
    saved = np.random.get_state()
    np.random.set_state(np.random.RandomState(state).get_state()
                        if isinstance(state, int) else state.get_state())
    try:
        return [transform(i) for i in range(n)]
    finally:
        np.random.set_state(saved)


@pytest.mark.parametrize("seed", [0, 1, 42, 2 ** 32 - 1])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.93])
def test_random_apply_with_an_int_draws_dpipes_coins(seed, p):
    ours = fpipe.random_apply(p, negate, random_state=seed)
    assert [ours(i) for i in range(200)] == dpipe_outputs(dpipe_random_apply(p, negate), 200, seed)


def test_random_apply_with_a_random_state_draws_from_it_as_dpipe_from_the_global_one():
    state = np.random.RandomState(7)
    state.uniform(size=3)  # a state in the middle of its stream
    expected = dpipe_outputs(dpipe_random_apply(0.5, negate), 100, state)
    ours = fpipe.random_apply(0.5, negate, random_state=state)
    assert [ours(i) for i in range(100)] == expected


SAMPLERS = [
    ((np.random.uniform,), {}),
    ((), {"angle": np.random.normal}),
    ((functools.partial(np.random.uniform, -10, 10), np.random.rand),
     {"k": functools.partial(np.random.randint, 0, 5), "z": np.random.standard_normal}),
    ((functools.partial(np.random.choice, [1, 2, 3]),), {"b": functools.partial(np.random.binomial, 4, 0.3)}),
]


@pytest.mark.parametrize(("args", "kwargs"), SAMPLERS)
@pytest.mark.parametrize("seed", [0, 3])
def test_sample_args_with_an_int_draws_dpipes_arguments(args, kwargs, seed):
    ours = fpipe.sample_args(shift, *args, random_state=seed, **kwargs)
    expected = dpipe_outputs(dpipe_sample_args(shift, *args, **kwargs), 50, seed)
    assert [ours(i) for i in range(50)] == expected


def test_sample_args_with_a_random_state_and_a_lambda_sampler_calls_it_as_dpipe_does():
    count = iter(range(100))
    ours = fpipe.sample_args(shift, lambda: next(count), random_state=np.random.RandomState(0))
    assert [ours(0)[1] for _ in range(3)] == [0, 1, 2]


def test_random_state_copies_pickle_with_their_state():
    flip = fpipe.random_apply(0.5, negate, random_state=3)
    first = [flip(i) for i in range(5)]
    copy = pickle.loads(pickle.dumps(flip))
    assert [copy(1) for _ in range(20)] == [flip(1) for _ in range(20)]
    assert first == dpipe_outputs(dpipe_random_apply(0.5, negate), 5, 3)


@pytest.mark.parametrize(("value", "error", "match"), [
    (np.random.default_rng(0), TypeError, "random_state must be an int or a numpy.random.RandomState"),
    (True, TypeError, "got random_state=True"),
    (-1, ValueError, r"random_state must be in \[0, 2\*\*32\)"),
    (2 ** 32, ValueError, "got random_state=4294967296"),
])
def test_bad_random_states_are_refused_at_construction(value, error, match):
    with pytest.raises(error, match=match):
        fpipe.random_apply(0.5, negate, random_state=value)
    with pytest.raises(error, match=match):
        fpipe.sample_args(shift, np.random.uniform, random_state=value)


def test_a_string_probability_is_a_clear_type_error():
    with pytest.raises(TypeError, match="p must be a real number; got p='0.5'"):
        fpipe.random_apply("0.5", negate)


# --- NumPy's global samplers inside a seeded stage --------------------------------------


def add(x, s):
    return x + s


@pytest.mark.parametrize("sampler", [np.random.uniform, np.random.normal, np.random.rand,
                                     functools.partial(np.random.randint, 0, 100),
                                     functools.partial(np.random.randn, 2)])
def test_global_samplers_in_a_seeded_stage_reproduce_and_leave_the_global_state(sampler):
    transform = fpipe.sample_args(add, s=sampler)
    before = np.random.get_state()[1].copy()
    one = list(fpipe.stream.map(transform, seed=0)(range(8)))
    two = list(fpipe.threads(transform, n_workers=2, options=fpipe.ParallelOptions(chunk_size=1),
                             seed=0)(range(8)))
    np.testing.assert_array_equal(np.array(one), np.array(two))
    assert np.array_equal(np.random.get_state()[1], before)
    assert not np.array_equal(np.array(one), np.array(list(fpipe.stream.map(transform, seed=1)(range(8)))))


def test_a_global_sampler_draws_the_generator_method_of_the_same_meaning():
    transform = fpipe.sample_args(add, s=functools.partial(np.random.uniform, 5, 6))
    out = list(fpipe.stream.map(transform, seed=3)(range(3)))
    assert out == [i + fpipe.item_rng(3, 0, i).uniform(5, 6) for i in range(3)]


def test_a_lambda_that_draws_from_the_global_state_in_a_seeded_stage_is_refused():
    transform = fpipe.sample_args(add, s=lambda: np.random.uniform(0, 2))
    with pytest.raises(RuntimeError, match="drew from NumPy's global random state inside a "
                                           "seeded stage"):
        list(fpipe.stream.map(transform, seed=0)(range(3)))
    assert len(list(fpipe.stream.map(transform)(range(3)))) == 3  # unseeded: as in dpipe


def test_a_global_function_without_a_generator_counterpart_is_refused():
    transform = fpipe.sample_args(add, s=functools.partial(np.random.random_integers, 1, 3))
    with pytest.raises(TypeError, match="np.random.random_integers has no numpy.random.Generator"):
        list(fpipe.stream.map(transform, seed=0)(range(3)))
