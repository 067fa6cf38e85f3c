"""An ordering's state names the settings that shape its order, all the way in; loading it
into an ordering built another way is refused, naming the difference, and a refused load
changes nothing (issue 31)."""

import warnings

import pytest

from fpipe.orderings import Cycler, QuasiShuffler, Range, Repeater, Shuffler
from property_tests.strategies import IndexReader


def keys(ordering, n):
    stream = iter(ordering)
    return [next(stream) for _ in range(n)]


@pytest.mark.parametrize("saved, other, difference", [
    (lambda r: QuasiShuffler(r, 16, 4, seed=1), lambda r: QuasiShuffler(r, 32, 8, seed=1),
     "buffer_size=16, chunk_size=4; this one has buffer_size=32, chunk_size=8"),
    (lambda r: QuasiShuffler(r, 16, 4, seed=1), lambda r: QuasiShuffler(r, 16, 8, seed=1),
     "chunk_size=4; this one has chunk_size=8"),
    (lambda r: Range(r, 0, 50), lambda r: Range(r, 50, 100),
     "start=0, stop=50; this one has start=50, stop=100"),
    (lambda r: Repeater(Range(r, 0, 20), 5), lambda r: Repeater(Range(r, 0, 50), 2),
     "times=5; this one has times=2"),
    (lambda r: Cycler(Range(r, 0, 50)), lambda r: Cycler(Range(r, 10, 60)),
     r"state\['reader'\] is of a Range with start=0, stop=50; this one has start=10, stop=60"),
    (lambda r: Cycler(Shuffler(r, seed=1)), lambda r: Cycler(QuasiShuffler(r, seed=1)),
     r"state\['reader'\] is the state of a 'Shuffler', not of a QuasiShuffler"),
    (lambda r: Shuffler(r, seed=1), lambda r: Cycler(r),
     "state is the state of a 'Shuffler', not of a Cycler"),
])
def test_a_state_loads_only_into_an_ordering_built_the_same_way(saved, other, difference):
    reader = IndexReader(100)
    ordering = saved(reader)
    stream = iter(ordering)
    [next(stream) for _ in range(7)]
    target = other(reader)
    expected = keys(other(reader), 3)
    with pytest.raises(ValueError, match=difference):
        target.load_state_dict(ordering.state_dict())
    assert keys(target, 3) == expected  # untouched
    again = saved(reader)
    again.load_state_dict(ordering.state_dict())
    assert keys(again, 20) == [next(stream) for _ in range(20)]


def test_the_quasi_shuffler_of_the_issue_loses_and_repeats_nothing():
    reader = IndexReader(100)
    first = QuasiShuffler(reader, 16, 4, seed=0)
    taken = keys(first, 40)
    state = first.state_dict()
    with pytest.raises(ValueError, match="buffer_size=16"):
        QuasiShuffler(reader, 32, 8, seed=0).load_state_dict(state)
    same = QuasiShuffler(reader, 16, 4, seed=0)
    same.load_state_dict(state)
    assert sorted(taken + list(same)) == list(range(100))


def test_a_refused_load_changes_nothing_also_the_seeds_deep_inside():
    reader = IndexReader(30)
    shuffler = Shuffler(reader, seed=1)
    expected = list(Shuffler(reader, seed=1))
    state = Shuffler(reader, seed=99).state_dict()
    with pytest.raises(ValueError, match=r"state\['epoch'\] must be >= 0"):
        shuffler.load_state_dict({**state, "epoch": -1})
    assert shuffler.seed == 1 and list(shuffler) == expected
    nested = Cycler(Shuffler(reader, seed=1))
    saved = Cycler(Shuffler(reader, seed=99)).state_dict()
    with pytest.raises(ValueError, match=r"state\['position'\] must be < 30"):
        nested.load_state_dict({**saved, "position": 30})
    assert nested.reader.seed == 1


@pytest.mark.parametrize("change, error, message", [
    ({"seed": "12"}, TypeError, r"state\['seed'\] must be an integer; got state\['seed'\]='12'"),
    ({"seed": -3}, ValueError, r"state\['seed'\] must be >= 0"),
    ({"seed": 1.5}, TypeError, r"state\['seed'\] must be an integer"),
    ({"epoch": 2.9}, TypeError, r"state\['epoch'\] must be an integer"),
    ({"position": True}, TypeError, r"state\['position'\] must be an integer"),
    ({"length": True}, ValueError, "length=True; this one has length=1"),
    ({"reader": {"type": "Range"}}, ValueError, r"state\['reader'\] describes an ordering"),
    ({"version": "1"}, ValueError, r"state\['version'\] must be 1"),
])
def test_malformed_values_are_refused_not_coerced(change, error, message):
    shuffler = Shuffler(IndexReader(1), seed=4)
    state = shuffler.state_dict()
    with pytest.raises(error, match=message):
        shuffler.load_state_dict({**state, **change})
    assert shuffler.seed == 4


def test_a_range_inside_a_state_cannot_stand_for_an_unseeded_ordering_with_a_seed():
    reader = IndexReader(10)
    state = Cycler(Range(reader)).state_dict()
    state["reader"]["seed"] = 5
    with pytest.raises(ValueError, match="a Range has no seed"):
        Cycler(Range(reader)).load_state_dict(state)


def old(state):
    """``state`` as fpipe 0.1.0 saved it: no version, no settings."""
    kept = {k: v for k, v in state.items() if k in ("type", "length", "seed", "epoch", "position")}
    return {**kept, "reader": None if state["reader"] is None else old(state["reader"])}


def test_a_state_without_version_loads_and_names_the_settings_it_could_not_check():
    reader = IndexReader(40)
    for make in (lambda: Shuffler(reader, seed=2), lambda: Cycler(Shuffler(reader, seed=2))):
        ordering = make()
        stream = iter(ordering)
        [next(stream) for _ in range(9)]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a Shuffler's and a Cycler's states say it all
            again = make()
            again.load_state_dict(old(ordering.state_dict()))
        assert keys(again, 31) == [next(stream) for _ in range(31)]
    window = Range(QuasiShuffler(reader, 8, 2, seed=1), 5, 30)
    keys(window, 4)
    with pytest.warns(UserWarning) as caught:
        Range(QuasiShuffler(reader, 8, 2), 5, 30).load_state_dict(old(window.state_dict()))
    assert sorted(str(w.message).split(" does not say the ")[1][:30] for w in caught) == [
        "buffer_size, chunk_size of the", "start, stop of the Range it is"]
    with pytest.raises(ValueError, match="state is of a Range with length=25; this one has length=3"):
        Range(reader, 0, 3).load_state_dict(old(window.state_dict()))


def test_an_ordering_says_whether_it_ends_with_its_epoch():
    reader = IndexReader(3)
    assert Cycler(reader).endless and Cycler(Shuffler(reader)).endless
    assert not any(o.endless for o in (Cycler(IndexReader(0)), Repeater(Cycler(reader), 2),
                                       Range(reader), Shuffler(reader)))
