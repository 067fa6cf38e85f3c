"""The states of sample and mix name what made them, and every value is checked at load,
all of it before anything changes (issue 31): no coercion, no failure at the first draw."""

import json

import pytest

import fpipe as fp
from fpipe.dataset import ListReader
from fpipe.orderings import Shuffler


def sampled(**options):
    stream = fp.sample(range(10), **{"seed": 1, **options})
    stream.pull(7)
    return stream


def mixed(until="first", weights=None, seed=2):
    stream = fp.mix(range(10), range(100, 120), weights=weights, seed=seed, until=until)
    stream.pull(6)
    return stream


@pytest.mark.parametrize("other, difference", [
    (lambda: fp.sample(range(11), seed=1), "Sample with length=10; this one has length=11"),
    (lambda: fp.sample(range(10), weights=[2] + [1] * 9, seed=1), "weights="),
    (lambda: fp.sample(range(10), weights=lambda step: [1] * 10, seed=1),
     "weights='uniform'; this one has weights='function'"),
    (lambda: fp.mix(range(10), seed=1), "state is the state of a 'Sample', not of a Mix"),
])
def test_a_sample_state_loads_only_into_the_same_sample(other, difference):
    target = other()
    with pytest.raises(ValueError, match=difference):
        target.load_state_dict(sampled().state_dict())
    assert target.position == 0


def test_a_sample_refuses_the_states_of_a_shuffler_and_a_mix():
    shuffler = Shuffler(ListReader([{"key": i} for i in range(10)]), seed=0)
    with pytest.raises(ValueError, match="the state of a 'Shuffler', not of a Sample"):
        fp.sample(range(10)).load_state_dict(shuffler.state_dict())
    with pytest.raises(ValueError, match="the state of a 'Mix', not of a Sample"):
        fp.sample(range(10)).load_state_dict(mixed().state_dict())


def test_weights_in_proportion_make_the_same_draws_and_may_load_each_other_s_state():
    state = sampled(weights=[1, 3] * 5).state_dict()
    again = fp.sample(range(10), weights=[2, 6] * 5)
    again.load_state_dict(state)
    assert again.pull(20) == sampled(weights=[1, 3] * 5).pull(20)


@pytest.mark.parametrize("change, error, message", [
    ({"seed": "12"}, TypeError, r"state\['seed'\] must be an integer; got state\['seed'\]='12'"),
    ({"epoch": 2.9}, TypeError, r"state\['epoch'\] must be an integer"),
    ({"seed": -1}, ValueError, r"state\['seed'\] must be >= 0"),
    ({"epoch": -1}, ValueError, r"state\['epoch'\] must be >= 0"),
    ({"position": "7"}, TypeError, r"state\['position'\] must be an integer"),
    ({"length": True}, ValueError, "length=True; this one has length=10"),
])
def test_malformed_sample_values_are_refused_at_load(change, error, message):
    target = fp.sample(range(10), seed=5)
    expected = fp.sample(range(10), seed=5).pull(4)
    with pytest.raises(error, match=message):
        target.load_state_dict({**sampled().state_dict(), **change})
    assert target.pull(4) == expected  # nothing changed, and no error at the first draw


def dpipe_state():
    stream = fp.sample(range(10), random_state=3)
    stream.pull(5)
    return stream.state_dict()


@pytest.mark.parametrize("path, value, error, message", [
    (("random_state",), [1, 2], TypeError, r"state\['random_state'\] must be a dict of "),
    (("random_state", "state"), [1, 2], TypeError,
     r"state\['random_state'\]\['state'\] must be a dict of 'key' and 'pos'"),
    (("random_state", "state", "key"), [1, 2], TypeError,
     r"state\['random_state'\]\['state'\]\['key'\] must be a list of 624 integers"),
    (("random_state", "state", "key"), [-1] * 624, ValueError, r"\['key'\] must hold integers in"),
    (("random_state", "state", "pos"), 625, ValueError, r"\['pos'\] must be <= 624"),
    (("random_state", "state", "pos"), "1", TypeError, r"\['pos'\] must be an integer"),
    (("random_state", "bit_generator"), "PCG64", ValueError, r"\['bit_generator'\] must be"),
    (("random_state", "has_gauss"), 2, ValueError, r"\['has_gauss'\] must be <= 1"),
    (("random_state", "gauss"), "0", TypeError, r"\['gauss'\] must be a real number"),
    (("at",), -1, ValueError, r"state\['at'\] must be >= 0"),
])
def test_a_garbage_dpipe_random_state_is_refused_naming_the_field(path, value, error, message):
    state = json.loads(json.dumps(dpipe_state()))
    target = state
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    mine = fp.sample(range(10), random_state=8)
    expected = fp.sample(range(10), random_state=8).pull(3)
    with pytest.raises(error, match=message):
        mine.load_state_dict(state)
    assert mine.pull(3) == expected


@pytest.mark.parametrize("change, error, message", [
    ({"taken": [-1, 0]}, ValueError, r"state\['taken'\]\[0\] must be >= 0"),
    ({"taken": [11, 0]}, ValueError, r"state\['taken'\]\[0\] must be at most the length of "
                                     r"sources\[0\], 10"),
    ({"taken": [1]}, TypeError, r"state\['taken'\] must be a list of one value per source \(2\)"),
    ({"ended": "no"}, TypeError, r"state\['ended'\] must be True or False; got state\['ended'\]='no'"),
    ({"alive": [1, 1]}, TypeError, r"state\['alive'\]\[0\] must be True or False"),
    ({"alive": [True]}, TypeError, r"state\['alive'\] must be a list of one value per source"),
    ({"alive": "yes"}, TypeError, r"state\['alive'\] must be a list"),
    ({"seed": -4}, ValueError, r"state\['seed'\] must be >= 0"),
    ({"epoch": -1}, ValueError, r"state\['epoch'\] must be >= 0"),
    ({"epoch": 1.0}, TypeError, r"state\['epoch'\] must be an integer"),
    ({"sources": [None, 3]}, ValueError, r"state\['sources'\]\[1\] must be None"),
    ({"position": 2}, ValueError, r"state\['position'\] must not be before state\['at'\]"),
])
def test_malformed_mix_values_are_refused_at_load(change, error, message):
    target = fp.mix(range(10), range(100, 120), seed=9)
    expected = fp.mix(range(10), range(100, 120), seed=9).pull(5)
    with pytest.raises(error, match=message):
        target.load_state_dict({**mixed().state_dict(), **change})
    assert target.pull(5) == expected


def test_negative_taken_cannot_repeat_items_until_all():
    state = mixed(until="all").state_dict()
    with pytest.raises(ValueError, match=r"state\['taken'\]\[0\] must be >= 0"):
        fp.mix(range(10), range(100, 120), until="all").load_state_dict({**state, "taken": [-2, 0]})


@pytest.mark.parametrize("other, difference", [
    (lambda: fp.mix(range(10), range(100, 120), until="all"), "until='first'; this one has until='all'"),
    (lambda: fp.mix(range(10), range(100, 121)), r"lengths=\[10, 20\]; this one has lengths=\[10, 21\]"),
    (lambda: fp.mix(range(10), range(100, 120), weights=[1, 2]), "weights="),
    (lambda: fp.mix(range(10), range(100, 120), range(5)), r"lengths=\[10, 20\]; this one has "),
])
def test_a_mix_state_loads_only_into_the_same_mix(other, difference):
    with pytest.raises(ValueError, match=difference):
        other().load_state_dict(mixed().state_dict())


def test_a_mix_loads_all_its_sources_or_none():
    def make():
        return fp.mix(fp.sample(range(5), seed=1), fp.sample(range(7), seed=2), seed=3)

    original = make()
    original.pull(9)
    state = original.state_dict()
    state["sources"][1]["epoch"] = -1  # the second source's state is bad
    target = make()
    expected = make().pull(6)
    with pytest.raises(ValueError, match=r"state\['sources'\]\[1\]\['epoch'\] must be >= 0"):
        target.load_state_dict(state)
    assert target.pull(6) == expected  # the first source was not loaded either


def test_states_saved_before_they_had_versions_load_with_a_warning():
    for stream, make in ((sampled(), lambda: fp.sample(range(10))),
                         (fp.sample(range(10), random_state=3), lambda: fp.sample(range(10))),
                         (mixed(), lambda: fp.mix(range(10), range(100, 120)))):
        stream.pull(3)
        state = stream.state_dict()
        old = {k: v for k, v in state.items()
               if k not in ("type", "version", "length", "weights", "until", "lengths")}
        again = make()
        with pytest.warns(UserWarning, match="saved by fpipe 0.1.0 .* could not|does not say"):
            again.load_state_dict(old)
        assert again.pull(10) == stream.pull(10)
    state = sampled().state_dict()
    with pytest.raises(TypeError, match="it lacks length, type, weights"):
        fp.sample(range(10)).load_state_dict({key: state[key] for key in (
            "version", "seed", "epoch", "position")})
