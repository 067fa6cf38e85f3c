"""Laws of Infinite: epochs are windows on one stream, every full epoch has exactly
batches_per_epoch batches, and a saved state restores the exact continuation (twice), over any
source (Cyclers and Repeaters included) and through stages that drop items."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from toolz import pipe

from fpipe import Infinite, Stage, batch
from fpipe.stream import map as fp_map
from property_tests.strategies import (
    batch_iter_sources,
    dropping_transformers,
    epoch_plans,
    infinite_batch_sizes,
    make_dropping_transformer,
    make_resume_source,
    make_source,
    make_transformer,
    ordering_sources,
    plain_transformers,
    resume_sources,
    seeded_transformers,
)

# finite sources are drawn on purpose: the warning that an epoch ran out early is expected
pytestmark = pytest.mark.filterwarnings("ignore:the source of this Infinite:RuntimeWarning")


def consume(batch_iter: Infinite, plan: list) -> tuple[list, list]:
    """The batches taken following ``plan``, and the sizes of the epochs read to the end."""
    taken, full = [], []
    for take in plan:
        epoch = batch_iter()
        if take is None:
            batches = list(epoch)
            full.append(len(batches))
        else:
            batches = list(itertools.islice(epoch, take))
        taken += batches
    return taken, full


def take(batch_iter: Infinite, n: int) -> list:
    """The next ``n`` batches, over as many epochs as it needs (at most 100: a finite source
    whose items are all filtered out gives nothing, ever)."""
    out: list = []
    for _ in range(100):
        if len(out) == n:
            break
        out += itertools.islice(batch_iter(), n - len(out))
    return out


@st.composite
def continuity_cases(draw: st.DrawFn) -> tuple:
    specs = draw(st.lists(plain_transformers, max_size=3))
    batches_per_epoch = draw(st.integers(1, 6))
    return specs, draw(infinite_batch_sizes), batches_per_epoch, draw(epoch_plans(
        batches_per_epoch))


@given(continuity_cases())
def test_epochs_are_windows_on_one_stream_and_full_epochs_are_exact(case):
    specs, batch_size, batches_per_epoch, plan = case
    with Infinite(itertools.count(), *map(make_transformer, specs), batch_size=batch_size,
                  batches_per_epoch=batches_per_epoch, combiner=list) as batch_iter:
        taken, full = consume(batch_iter, plan)
    stages = [t if isinstance(t, Stage) else fp_map(t) for t in map(make_transformer, specs)]
    stream = pipe(itertools.count(), *stages, batch(batch_size))
    expected = list(itertools.islice(stream, len(taken)))
    stream.close()
    assert taken == expected  # nothing lost or repeated, whatever the breaks
    assert full == [batches_per_epoch] * len(full)


def build(source_spec: tuple, specs: list, batch_size, batches_per_epoch: int) -> Infinite:
    source, first = make_source(source_spec)
    return Infinite(source, *first, *map(make_transformer, specs), batch_size=batch_size,
                    batches_per_epoch=batches_per_epoch, combiner=list)


@st.composite
def resume_cases(draw: st.DrawFn, transformers: st.SearchStrategy = seeded_transformers,
                 sources: st.SearchStrategy = batch_iter_sources,
                 specs: st.SearchStrategy | None = None) -> tuple:
    specs = draw(st.lists(transformers, max_size=3) if specs is None else specs)
    batches_per_epoch = draw(st.integers(1, 5))
    n = draw(st.integers(1, 8))
    return (draw(sources), specs, draw(infinite_batch_sizes), batches_per_epoch,
            draw(epoch_plans(batches_per_epoch, max_epochs=4)), draw(st.booleans()), n,
            draw(st.integers(0, n)))


def build_dropping(source_spec: tuple, specs: list, batch_size, batches_per_epoch: int) -> Infinite:
    source, first = make_resume_source(source_spec)
    return Infinite(source, *first, *map(make_dropping_transformer, specs), batch_size=batch_size,
                    batches_per_epoch=batches_per_epoch, combiner=list, on_error="skip")


def check_resume(case: tuple, make_infinite=build) -> None:
    source, specs, batch_size, batches_per_epoch, plan, close_first, n, split = case

    def make() -> Infinite:
        return make_infinite(source, specs, batch_size, batches_per_epoch)

    original = make()
    consume(original, plan)
    if close_first:  # a state saved after close: the next start begins where that one does
        original.close()
    state = original.state_dict()
    expected = take(original, n)
    original.close()
    restored = make()
    restored.load_state_dict(state)
    got = take(restored, split)
    second = restored.state_dict()  # save and restore once more
    restored.close()
    again = make()
    again.load_state_dict(second)
    got += take(again, n - split)
    again.close()
    assert got == expected


@given(resume_cases())
def test_a_restored_infinite_continues_with_the_original_batches(case):
    check_resume(case)


@settings(max_examples=4)
@given(resume_cases(st.tuples(st.just("processes"), st.integers(0, 9), st.integers(1, 2)),
                    st.tuples(st.just("sample"), st.integers(0, 2**32 - 1))))
def test_the_resume_law_holds_with_worker_processes(case):
    check_resume(case)


@pytest.mark.timeout(900)
@given(resume_cases(dropping_transformers, ordering_sources))
def test_a_restored_infinite_over_any_ordering_continues_exactly(case):
    check_resume(case, build_dropping)


def _drops_items(specs: list) -> bool:
    return any(spec[0] in ("drop", "skip", "threads-skip") for spec in specs)


@pytest.mark.timeout(900)
@given(resume_cases(sources=resume_sources, specs=st.lists(
    dropping_transformers, min_size=1, max_size=3).filter(_drops_items)))
def test_a_restored_infinite_through_stages_that_drop_items_continues_exactly(case):
    check_resume(case, build_dropping)
