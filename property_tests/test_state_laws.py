"""Laws of saved states: a state loaded into something built another way either continues
exactly as the saved run would have, or the load raises and changes nothing; built the same
way (seeds aside, which a state brings along), it always loads. Elastic states are the ones
that may move: onto another grid and batch size, they carry on with the rest of the epoch."""

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpipe
from fpipe.sharding import elastic_position
from property_tests.strategies import (
    IndexReader,
    build,
    make_source,
    ordering_lengths,
    ordering_specs,
    round_robin,
)

# finite sources are drawn on purpose: the warning that an epoch ran out early is expected
pytestmark = pytest.mark.filterwarnings("ignore:the source of this Infinite:RuntimeWarning")

REFUSED = (TypeError, ValueError)


def _loads(target, state) -> bool:
    """Whether ``target`` took ``state``; when it refused, it was left as it was."""
    before = json.dumps(target.state_dict(), sort_keys=True)
    try:
        target.load_state_dict(json.loads(json.dumps(state)))
    except REFUSED:
        assert json.dumps(target.state_dict(), sort_keys=True) == before
        return False
    return True


@st.composite
def ordering_pairs(draw: st.DrawFn) -> tuple:
    """Two ordering builds: the second is the first, or another (spec, length)."""
    first = (draw(ordering_specs), draw(ordering_lengths))
    second = draw(st.one_of(st.just(first), st.tuples(ordering_specs, ordering_lengths),
                            st.tuples(st.just(first[0]), ordering_lengths)))
    return first, second, draw(st.integers(0, 5)), draw(st.integers(0, 5)), draw(st.integers(0, 90))


@given(ordering_pairs())
def test_an_ordering_state_continues_exactly_or_is_refused(case):
    (spec, n), (other_spec, other_n), seed, other_seed, taken = case
    ordering = build(spec, IndexReader(n), seed=seed)
    stream = iter(ordering)
    list(itertools.islice(stream, taken))
    target = build(other_spec, IndexReader(other_n), seed=other_seed)
    if _loads(target, ordering.state_dict()):
        # the rest of the iteration under way; if it has ended, the next one
        expected = list(itertools.islice(stream, 40)) or list(itertools.islice(ordering, 40))
        assert list(itertools.islice(target, 40)) == expected
    else:
        assert (other_spec, other_n) != (spec, n)  # built the same way: it must load


weights = st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=1, max_size=6))


@st.composite
def sample_builds(draw: st.DrawFn) -> tuple:
    chosen = draw(weights)
    return (len(chosen) if chosen else draw(st.integers(1, 6))), chosen


@given(sample_builds(), st.one_of(st.none(), sample_builds()), st.booleans(),
       st.integers(0, 50))
def test_a_sample_state_continues_exactly_or_is_refused(first, second, dpipe, taken):
    second = first if second is None else second

    def make(n, chosen, **seed):
        return fpipe.sample(range(n), weights=chosen, **seed)

    original = make(*first, **({"random_state": 3} if dpipe else {"seed": 3}))
    original.pull(taken) if taken else None
    target = make(*second, seed=8)
    if _loads(target, original.state_dict()):
        assert target.pull(30) == original.pull(30)
    else:
        assert second != first


@st.composite
def mix_builds(draw: st.DrawFn) -> tuple:
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))
    chosen = draw(st.one_of(st.none(), st.lists(st.integers(1, 4), min_size=len(lengths),
                                                 max_size=len(lengths))))
    return tuple(lengths), chosen, draw(st.sampled_from(["first", "all", "never"]))


@given(mix_builds(), st.one_of(st.none(), mix_builds()), st.integers(0, 40))
def test_a_mix_state_continues_exactly_or_is_refused(first, second, taken):
    second = first if second is None else second

    def make(lengths, chosen, until, seed):
        sources = [range(100 * k, 100 * k + n) for k, n in enumerate(lengths)]
        return fpipe.mix(*sources, weights=chosen, until=until, seed=seed)

    original = make(*first, seed=1)
    original.pull(taken) if taken else None
    target = make(*second, seed=2)
    if _loads(target, original.state_dict()):
        assert target.pull(30) == original.pull(30)
    else:
        assert second != first


infinite_sources = st.one_of(
    st.tuples(st.just("sample"), st.integers(0, 3)),
    st.tuples(st.just("list"), st.integers(1, 12)),
    st.tuples(st.sampled_from(["shuffler", "index"]), st.integers(1, 12), st.integers(0, 3)),
)
# what a state of an Infinite can tell apart: its source, its batch size, its stages up to the
# batch (how many, and filters where it counted); not what its functions compute
infinite_builds = st.tuples(infinite_sources, st.integers(1, 5),
                            st.lists(st.sampled_from(["map", "filter"]), max_size=2))


@st.composite
def infinite_pairs(draw: st.DrawFn) -> tuple:
    """Two Infinite builds: the second is the first, or differs in its source, batch size,
    number of stages, or has filters for its maps."""
    first = source, batch_size, stages = draw(infinite_builds)
    other_stages = st.sampled_from([stages, [*stages, "map"], stages[:-1],
                                    ["filter" if kind == "map" else kind for kind in stages]])
    second = (draw(st.one_of(st.just(source), infinite_sources)),
              draw(st.one_of(st.just(batch_size), st.integers(1, 5))), draw(other_stages))
    return first, second


def _infinite(source_spec, batch_size, stages):
    source, first = make_source(source_spec)
    made = [fpipe.stream.map(abs) if kind == "map" else fpipe.stream.filter(bool) for kind in stages]
    return fpipe.Infinite(source, *first, *made, batch_size=batch_size, batches_per_epoch=3,
                          combiner=list)


def _take(batch_iter, n):
    out = []
    for _ in range(20):
        out += itertools.islice(batch_iter(), n - len(out))
        if len(out) == n:
            break
    return out


@settings(max_examples=40)
@given(infinite_pairs(), st.integers(0, 7))
def test_an_infinite_state_continues_exactly_or_is_refused(pair, taken):
    first, second = pair
    original = _infinite(*first)
    _take(original, taken)
    state = original.state_dict()
    target = _infinite(*second)
    try:
        target.load_state_dict(json.loads(json.dumps(state)))
    except REFUSED:
        assert second != first
    else:
        assert _take(target, 4) == _take(original, 4)
    original.close(), target.close()


grids = st.tuples(st.integers(1, 3), st.integers(1, 5))  # ranks, batch size


@settings(max_examples=40)
@given(st.integers(1, 40), st.integers(1, 40), grids, grids, st.integers(0, 6), st.integers(0, 3))
def test_an_elastic_state_moves_to_any_grid_and_batch_size_of_the_same_length(
        n, other_n, grid, other_grid, steps, epoch):
    pytest.importorskip("torch")
    from fpipe.dataset import ListReader
    from fpipe.torch import Elastic, IterableDataset

    def ranks(length, world_size, batch_size):
        reader = ListReader([{"x": i} for i in range(length)])
        return [IterableDataset(reader, batch_size=batch_size,
                                layout=Elastic(rank=r, world_size=world_size)) for r in range(world_size)]

    before = ranks(n, *grid)
    for data in before:
        data.set_epoch(epoch)
    # each rank is handed its first `steps` batches, as a DataLoader without workers hands them
    done = [s["x"] for data in before for s in itertools.islice(data, steps * grid[1])]
    state = before[0].state_dict(batches=steps)
    assert state["position"] == elastic_position(n, 0, steps, grid[1], grid[0])
    after = ranks(other_n, *other_grid)
    if other_n != n:
        with pytest.raises(ValueError, match=f"length={n}; this one has length={other_n}"):
            after[0].load_state_dict(state)
        return
    for data in after:
        data.load_state_dict(state)
        data.set_epoch(epoch)  # the state's epoch keeps it
    rest = round_robin([[s["x"] for s in data] for data in after])
    assert sorted(done + rest) == list(range(n))
