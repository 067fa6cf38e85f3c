"""Infinite.state_dict() / load_state_dict(): a restored pipeline continues exactly."""

import re

import pytest

from fpipe import ExpirationPool, Infinite, Iterator, Loky, Threads, processes, sample, threads
from fpipe.stream import filter, map

from .helpers import noisy, pairs, square

calls = []


def counted(x):
    calls.append(x)
    return x


def build(*transformers, seed=0, batch_size=3, combiner=list):
    return Infinite(sample(range(1000), random_state=seed), *transformers,
                    batch_size=batch_size, batches_per_epoch=4, combiner=combiner)


def _take(batch_iter, n):
    out = []
    while len(out) < n:
        before = len(out)
        for b in batch_iter():
            out.append(b)
            if len(out) == n:
                break
        if len(out) == before:
            break
    return out


def restored(make, state):
    batch_iter = make()
    batch_iter.load_state_dict(state)
    return batch_iter


@pytest.mark.parametrize("make", [
    lambda: build(square, map(noisy, seed=1), threads(noisy, seed=2, n_workers=2)),
    lambda: build(Threads(square, n_workers=2), counted),
    lambda: build(processes(noisy, seed=3, n_workers=2)),
    lambda: build(Loky(square, n_workers=2), combiner=Threads(list, n_workers=2)),
], ids=["map-threads", "Threads", "processes", "Loky-combiner"])
def test_a_restored_pipeline_continues_with_the_same_batches(make):
    original = make()
    _take(original, 6)  # one epoch and a half
    state = original.state_dict()
    expected = _take(original, 10)
    original.close()
    again = restored(make, state)
    assert _take(again, 4) == expected[:4]
    second = again.state_dict()  # the law holds after a second save and restore
    again.close()
    third = restored(make, second)
    assert _take(third, 6) == expected[4:]
    third.close()


def test_item_stages_skip_ahead_without_making_the_batches_again():
    original = build(counted)
    _take(original, 50)
    state = original.state_dict()
    expected = _take(original, 2)
    original.close()
    calls.clear()
    again = restored(lambda: build(counted), state)
    assert _take(again, 2) == expected
    again.close()
    assert len(calls) < 150  # no replay of the 150 items before


@pytest.mark.parametrize("make", [
    lambda: build(filter(lambda x: x % 2), counted),
    lambda: build(ExpirationPool(4, 2, seed=5), counted),
    lambda: build(Iterator(pairs), counted),
    lambda: build(counted, batch_size=lambda chunk, item: len(chunk) < 2),
], ids=["filter", "pool", "Iterator", "predicate"])
def test_other_stages_are_restored_by_replaying(make):
    original = make()
    _take(original, 5)
    state = original.state_dict()
    expected = _take(original, 7)
    original.close()
    calls.clear()
    again = restored(make, state)
    assert _take(again, 7) == expected
    third = restored(make, again.state_dict())
    assert _take(third, 3) == _take(again, 3)
    again.close()
    third.close()


def test_states_before_the_start_after_close_and_after_a_load():
    def make():
        return build(map(noisy, seed=4))

    fresh = make()
    state = fresh.state_dict()
    assert state["delivered"] == 0 and state["source"]["position"] == 0
    assert _take(restored(make, state), 3) == _take(fresh, 3)
    fresh.close()
    after_close = fresh.state_dict()  # where the next start will begin
    assert after_close["delivered"] == 0 and after_close["source"]["position"] > 0
    loaded = restored(make, after_close)
    assert loaded.state_dict() == after_close  # a load that has not started yet
    assert _take(loaded, 3) == _take(fresh, 3)
    loaded.close()
    fresh.close()


def test_a_list_source_is_restored_by_position_and_a_finite_end_is_kept():
    def make():
        return Infinite(list(range(20)), square, batch_size=3, batches_per_epoch=2,
                        combiner=list)

    original = make()
    list(original())
    state = original.state_dict()
    assert state["source"] is None
    rest = [list(original()) for _ in range(4)]
    again = restored(make, state)
    assert [list(again()) for _ in range(4)] == rest
    original.close()
    again.close()


def test_unrestorable_sources_and_foreign_states_are_refused():
    generator = Infinite((i for i in range(9)), batch_size=2, batches_per_epoch=1)
    with pytest.raises(TypeError, match="a state needs a source with state_dict"):
        generator.state_dict()
    with pytest.raises(TypeError, match="a state needs a source"):
        generator.load_state_dict({"source": None, "epochs": [0, 0, 0], "delivered": 0})
    batch_iter = build(square)
    with pytest.raises(TypeError, match="state must be a dict"):
        batch_iter.load_state_dict({"delivered": 1})
    state = batch_iter.state_dict()
    with pytest.raises(ValueError, match="4 stages; this one has 5"):
        build(square, square).load_state_dict(state)
    with pytest.raises(ValueError, match="source_length=None; this one has source_length=5"):
        Infinite(range(5), square, batch_size=3, batches_per_epoch=4,
                 combiner=list).load_state_dict(state)
    with pytest.raises(ValueError, match="does not fit"):
        Infinite(range(5), square, batch_size=3, batches_per_epoch=4,
                 combiner=list).load_state_dict({**state, "source_length": 5})
    with pytest.raises(ValueError, match="delivered"):
        batch_iter.load_state_dict({**state, "delivered": -1})


def test_an_ordering_source_is_restored_by_seeking_also_at_the_end_of_its_epoch():
    from fpipe.dataset import ListReader
    from fpipe.orderings import Shuffler

    def make():
        ordering = Shuffler(ListReader([{"key": i} for i in range(10)]), seed=1)
        return Infinite(ordering, lambda sample: sample["key"], batch_size=3,
                        batches_per_epoch=4, combiner=list)

    order = [sample["key"] for sample in Shuffler(ListReader([{"key": i} for i in range(10)]), seed=1)]
    original = make()
    # the end is not seen yet
    assert list(original()) == [order[0:3], order[3:6], order[6:9], order[9:]]
    state = original.state_dict()
    assert state["delivered"] == 4  # 12 items by count, but the epoch had only 10
    expected = [list(original()) for _ in range(3)]
    again = restored(make, state)
    assert [list(again()) for _ in range(3)] == expected
    original.close()
    again.close()


# --- resuming with other worker counts, and what cannot be resumed exactly ---

def _workers(n):
    """Pipelines with ``n`` workers in every parallel stage; the same stream for any n >= 2."""
    return {
        "threads": lambda: build(threads(noisy, seed=2, n_workers=n), map(noisy, seed=1)),
        "processes": lambda: build(processes(noisy, seed=3, n_workers=n)),
        "Threads-Loky": lambda: build(Threads(square, n_workers=n), Loky(square, n_workers=n)),
        "filter": lambda: build(filter(lambda x: x % 3), threads(noisy, seed=2, n_workers=n)),
        "pool": lambda: build(threads(noisy, seed=2, n_workers=n), ExpirationPool(4, 2, seed=5)),
        "Iterator": lambda: build(Iterator(pairs, n_workers=n), threads(noisy, seed=2, n_workers=n)),
        "predicate": lambda: build(threads(noisy, seed=2, n_workers=n),
                                   batch_size=lambda chunk, item: len(chunk) < 2),
    }


@pytest.mark.parametrize("name", list(_workers(2)))
def test_a_state_carries_on_with_other_worker_counts(name):
    original = _workers(2)[name]()
    _take(original, 5)
    state = original.state_dict()
    expected = _take(original, 6)
    original.close()
    for n in (3, 4):
        again = restored(_workers(n)[name], state)
        assert _take(again, 6) == expected, n
        again.close()


@pytest.mark.parametrize("make, stage", [
    (lambda: build(threads(square, n_workers=2, ordered=False)), "ordered=False"),
    (lambda: build(processes(square, n_workers=2, ordered=False)), "ordered=False"),
    (lambda: build(ExpirationPool(4, 2)), "ExpirationPool(4, 2) draws without a seed"),
], ids=["threads", "processes", "pool"])
def test_pipelines_that_cannot_be_made_again_exactly_have_no_state(make, stage):
    batch_iter = make()
    _take(batch_iter, 2)
    with pytest.raises(ValueError, match=f"cannot be resumed exactly: .*{re.escape(stage)}"):
        batch_iter.state_dict()
    state = build().state_dict()
    with pytest.raises(ValueError, match=f"cannot be resumed exactly: .*{re.escape(stage)}"):
        batch_iter.load_state_dict(state)
    batch_iter.close()


def test_a_stage_pipeline_started_at_an_index_is_the_rest_of_the_whole_run_for_any_worker_count():
    def stages(n):
        return [threads(noisy, seed=2, n_workers=n), map(noisy, seed=1),
                processes(noisy, seed=3, n_workers=n)]

    def run(n, start):
        stream = range(start, 40)
        for stage in stages(n):
            stream = stage.apply(stream, epoch=1, start=start)
        return list(stream)

    whole = run(2, 0)
    assert all(run(n, 15) == whole[15:] for n in (1, 3))
