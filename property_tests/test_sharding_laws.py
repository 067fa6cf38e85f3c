"""Laws of fpipe.sharding: partition, balance, even lengths, and composition of strided shards."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from fpipe.sharding import shard, shard_range
from property_tests.strategies import evens, roundings, shard_counts, sized_inputs


def _strided(xs, count, even=None):
    return [list(shard(i, count, even=even)(iter(xs))) for i in range(count)]


def _contiguous(n, count, even=None, rounding="balanced"):
    return [shard_range(n, i, count, even=even, rounding=rounding) for i in range(count)]


def _is_subsequence(part, whole):
    rest = iter(whole)
    return all(any(x == y for y in rest) for x in part)


@given(sized_inputs, shard_counts)
def test_strided_shards_partition_the_input_in_order(xs, count):
    shards = _strided(xs, count)
    assert sorted(x for s in shards for x in s) == xs
    assert all(_is_subsequence(s, xs) for s in shards)


@given(sized_inputs, shard_counts)
def test_strided_shard_sizes_differ_by_at_most_one(xs, count):
    sizes = [len(s) for s in _strided(xs, count)]
    assert max(sizes) - min(sizes) <= 1


@given(st.integers(0, 500), shard_counts, roundings)
def test_contiguous_shards_partition_range_n_into_adjacent_pieces(n, count, rounding):
    shards = _contiguous(n, count, rounding=rounding)
    assert [x for r in shards for x in r] == list(range(n))
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))


@given(st.integers(0, 500), shard_counts, roundings)
def test_contiguous_shard_sizes_differ_by_at_most_one(n, count, rounding):
    sizes = [len(r) for r in _contiguous(n, count, rounding=rounding)]
    assert max(sizes) - min(sizes) <= 1


@given(sized_inputs, shard_counts, evens)
def test_even_strided_shards_all_have_the_same_length(xs, count, even):
    shards = _strided(xs, count, even)
    target = len(xs) // count if even == "drop" else -(-len(xs) // count)
    assert [len(s) for s in shards] == [target] * count
    seen = Counter(x for s in shards for x in s)
    assert set(seen) <= set(xs)
    if even == "drop":
        assert max(seen.values(), default=1) == 1
    else:
        assert set(seen) == set(xs)


@given(st.integers(0, 500), shard_counts, evens, roundings)
def test_even_contiguous_shards_all_have_the_same_length(n, count, even, rounding):
    shards = _contiguous(n, count, even, rounding)
    target = n // count if even == "drop" else -(-n // count)
    assert [len(r) for r in shards] == [target] * count
    assert all(0 <= r.start and r.stop <= n for r in shards)
    covered = set().union(*shards)
    if even == "pad":
        assert covered == set(range(n))
    else:
        assert sum(map(len, shards)) == len(covered)


@given(sized_inputs, shard_counts, shard_counts, st.data())
def test_sharding_a_shard_multiplies_the_strides(xs, a, b, data):
    i = data.draw(st.integers(0, a - 1), label="i")
    j = data.draw(st.integers(0, b - 1), label="j")
    assert list(shard(j, b)(shard(i, a)(xs))) == list(shard(i + a * j, a * b)(xs))
