"""Laws of the combinators in fpipe.functional."""

import pickle

import toolz
from hypothesis import given
from hypothesis import strategies as st

from fpipe import (
    apply_at,
    compose,
    identity,
    multiply,
    random_apply,
    sample_args,
    unpack_args,
    zip_apply,
)
from fpipe.errors import MissingParameterError
from fpipe.functional import Compose
from fpipe.random import integers, item_rng, uniform, using_rng
from property_tests.strategies import (
    composable_funcs,
    int_tuples,
    ints,
    pair_sum,
    params,
    plain_funcs,
    prefixes,
    seeds,
    shift,
    tuples_with_index,
)


def outcome(func, *args):
    """The value of ``func(*args)``, or the key a missing parameter was looked up under."""
    try:
        return ("value", func(*args))
    except MissingParameterError as error:
        return ("missing", error.key)


prefixed = st.builds(lambda f, p: Compose(f, prefix=p), composable_funcs, prefixes)


@given(a=prefixed, b=prefixed, c=prefixed, x=ints, p=params)
def test_associative_compose(a, b, c, x, p):
    left, right = compose(a, compose(b, c)), compose(compose(a, b), c)
    assert left == right
    assert outcome(left, x, p) == outcome(right, x, p)


@given(a=prefixed, b=prefixed, prefix=prefixes, x=ints, p=params)
def test_distributive_prefix_compose(a, b, prefix, x, p):
    left = Compose(a, b, prefix=prefix)
    right = Compose(Compose(a, prefix=prefix), Compose(b, prefix=prefix))
    assert outcome(left, x, p) == outcome(right, x, p)


@given(f=prefixed, x=ints, p=params)
def test_identity_compose(f, x, p):
    assert compose()(x) == x
    assert outcome(compose(identity, f), x, p) == outcome(f, x, p) == outcome(compose(f, identity), x, p)


@given(fs=st.lists(plain_funcs, max_size=6), x=ints)
def test_equivalent_compose_pipe(fs, x):
    assert compose(*fs)(x) == toolz.pipe(x, *fs)
    assert compose(fs)(x) == toolz.pipe(x, *fs)


@given(prefix=prefixes, x=ints, by=ints)
def test_routing_compose(prefix, x, by):
    decoy = {"by": by + 1} if prefix else {}
    assert Compose(shift, prefix=prefix)(x, {**decoy, prefix + "by": by}) == shift(x, by)


@given(data=tuples_with_index())
def test_identity_apply_at(data):
    values, index = data
    assert apply_at(index, identity)(values) == values


@given(data=tuples_with_index(), f=plain_funcs)
def test_locality_apply_at(data, f):
    values, index = data
    result = apply_at(index, f)(values)
    position = index % len(values)
    assert result[position] == f(values[position])
    assert [v for j, v in enumerate(result) if j != position] == [
        v for j, v in enumerate(values) if j != position]


@given(data=tuples_with_index(), f=plain_funcs, g=plain_funcs)
def test_fusion_apply_at(data, f, g):
    values, index = data
    assert apply_at(index, f)(apply_at(index, g)(values)) == apply_at(index, compose(g, f))(values)


@given(values=int_tuples, f=plain_funcs, g=plain_funcs, data=st.data())
def test_commute_apply_at(values, f, g, data):
    i = data.draw(st.integers(0, len(values) - 1))
    j = data.draw(st.integers(0, len(values) - 1).filter(lambda j: j != i) if len(values) > 1
                  else st.just(i))
    if i != j:
        assert apply_at(i, f)(apply_at(j, g)(values)) == apply_at(j, g)(apply_at(i, f)(values))


@given(values=int_tuples, fs=st.data())
def test_shape_zip_apply(values, fs):
    funcs = fs.draw(st.lists(plain_funcs, min_size=len(values), max_size=len(values)))
    assert zip_apply(*[identity] * len(values))(values) == values
    assert zip_apply(*funcs)(values) == tuple(f(v) for f, v in zip(funcs, values))


@given(values=st.lists(ints, max_size=8), f=plain_funcs)
def test_shape_multiply(values, f):
    result = multiply(f)(values)
    assert isinstance(result, tuple) and len(result) == len(values)
    assert result == tuple(map(f, values))


@given(x=ints, y=ints)
def test_spread_unpack_args(x, y):
    assert unpack_args(pair_sum)((x, y)) == pair_sum(x, y)
    assert unpack_args(pair_sum)({"x": x, "y": y}) == pair_sum(x, y)


@given(seed=seeds, x=ints, f=plain_funcs)
def test_bounds_random_apply(seed, x, f):
    with using_rng(item_rng(seed, 0, 0)):
        assert random_apply(0.0, f)(x) == x
        assert random_apply(1.0, f)(x) == f(x)


@given(seed=seeds, epoch=st.integers(0, 1000), index=st.integers(0, 10**9),
       before=st.lists(st.integers(0, 10**9), max_size=5))
def test_determinism_item_rng(seed, epoch, index, before):
    alone = item_rng(seed, epoch, index).random(3).tolist()
    for other in before:
        item_rng(seed, epoch, other).random(5)
    assert item_rng(seed, epoch, index).random(3).tolist() == alone


@given(seed=seeds, index=st.integers(0, 10**6), x=ints)
def test_determinism_sample_args(seed, index, x):
    transform = sample_args(shift, by=uniform(-1, 1))
    with using_rng(item_rng(seed, 0, index)):
        first = transform(x)
    with using_rng(item_rng(seed, 0, index)):
        assert transform(x) == first
    assert x - 1 <= first < x + 1


# (combinator, how to call it on a tuple of ints and a params mapping)
calls = st.one_of(
    st.builds(lambda c: (c, lambda f, xs, p: f(xs[0], p)),
              st.builds(Compose, composable_funcs, prefix=prefixes)),
    st.builds(lambda c: (c, lambda f, xs, p: f(xs)), st.one_of(
        st.builds(apply_at, st.integers(-1, 0), plain_funcs),
        st.builds(multiply, plain_funcs),
        st.just(unpack_args(min, 10**9)))),
    st.builds(lambda c: (c, lambda f, xs, p: f(xs[:1])), st.builds(zip_apply, plain_funcs)),
    st.builds(lambda c: (c, lambda f, xs, p: f(xs[0])), st.one_of(
        st.builds(random_apply, st.sampled_from([0.0, 1.0]), plain_funcs),
        st.just(sample_args(shift, by=integers(0, 1))))),
)


@given(call=calls, values=int_tuples, p=params)
def test_roundtrip_pickle(call, values, p):
    combinator, apply = call
    clone = pickle.loads(pickle.dumps(combinator))
    assert clone == combinator and repr(clone) == repr(combinator)
    assert outcome(apply, clone, values, p) == outcome(apply, combinator, values, p)
