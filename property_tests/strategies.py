"""Shared Hypothesis strategies for the laws in property_tests/ (strategies only, no tests).

Each area keeps its strategies in its own section below.
"""

from __future__ import annotations

from hypothesis import strategies as st

# --- functional core -------------------------------------------------------------------
# Module-level functions, so that they pickle and can cross processes.


def inc(x: int) -> int:
    return x + 1


def double(x: int) -> int:
    return 2 * x


def negate(x: int) -> int:
    return -x


def halve(x: int) -> int:
    return x // 2


def shift(x: int, by: int) -> int:
    return x + by


def scale(x: int, factor: int = 3) -> int:
    return x * factor


def offset(x: int, *, delta: int) -> int:
    return x - delta


def pair_sum(x: int, y: int) -> int:
    return x + y


plain_funcs = st.sampled_from([inc, double, negate, halve, abs])
parametrized_funcs = st.sampled_from([shift, scale, offset])
composable_funcs = plain_funcs | parametrized_funcs
prefixes = st.sampled_from(["", "a_", "b_", "mask_"])
ints = st.integers(-10**6, 10**6)
seeds = st.integers(0, 2**63 - 1)
probabilities = st.floats(0, 1)
_routed_keys = [f"{outer}{inner}{name}" for outer in ["", "a_", "b_", "mask_"]
                for inner in ["", "a_", "b_", "mask_"] for name in ["by", "factor", "delta"]]
params = st.dictionaries(st.sampled_from(_routed_keys), st.integers(-100, 100))
int_tuples = st.lists(ints, min_size=1, max_size=6).map(tuple)


@st.composite
def tuples_with_index(draw: st.DrawFn) -> tuple[tuple, int]:
    """A non-empty tuple and a valid (possibly negative) index into it."""
    values = draw(int_tuples)
    return values, draw(st.integers(-len(values), len(values) - 1))


# --- orderings and sharding --------------------------------------------------------------
# Inputs are lists of distinct ints, so "every element exactly once" is checkable by sorting.

sized_inputs = st.integers(0, 60).map(lambda n: list(range(n)))
shard_counts = st.integers(1, 9)
evens = st.sampled_from(["drop", "pad"])
roundings = st.sampled_from(["balanced", "datadings"])
