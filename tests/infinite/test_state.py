"""Infinite.state_dict() / load_state_dict(): a restored pipeline continues exactly."""

import pytest

from fpipe import (
    ExpirationPool,
    Infinite,
    Iterator,
    Loky,
    Threads,
    filter,
    map,
    processes,
    sample,
    threads,
)

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
    with pytest.raises(ValueError, match="does not fit"):
        Infinite(range(5), square, batch_size=3, batches_per_epoch=4,
                 combiner=list).load_state_dict(state)
    with pytest.raises(ValueError, match="delivered"):
        batch_iter.load_state_dict({**state, "delivered": -1})


def test_an_ordering_source_is_restored_by_seeking_also_at_the_end_of_its_epoch():
    from fpipe.storage import ListReader, Shuffler

    def make():
        ordering = Shuffler(ListReader([{"key": i} for i in range(10)]), seed=1)
        return Infinite(ordering, lambda sample: sample["key"], batch_size=3,
                        batches_per_epoch=4, combiner=list)

    original = make()
    assert list(original()) == [[5, 4, 3], [2, 6, 9], [0, 1, 7], [8]]  # the end is not seen yet
    state = original.state_dict()
    assert state["delivered"] == 4  # 12 items by count, but the epoch had only 10
    expected = [list(original()) for _ in range(3)]
    again = restored(make, state)
    assert [list(again()) for _ in range(3)] == expected
    original.close()
    again.close()
