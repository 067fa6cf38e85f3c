"""Resume is exact or it refuses (issue 31): an Infinite over any ordering, also one that never
ends, and over stages that skip items, resumes on the batch that was due; a state of another
pipeline, or with malformed values, is refused before anything changes."""

import itertools
import json
import warnings

import pytest

import fpipe
from fpipe import Infinite, Loky, Threads, sample, threads
from fpipe.dataset import ListReader
from fpipe.orderings import Cycler, QuasiShuffler, Range, Repeater, Shuffler
from fpipe.stream import filter, map

from .helpers import noisy

# finite sources are drawn on purpose: the warning that an epoch ran out early is expected
pytestmark = pytest.mark.filterwarnings("ignore:the source of this Infinite:RuntimeWarning")

READER = ListReader([{"key": i} for i in range(10)])
calls = []


def key(sample_):
    return sample_["key"]


def fails_on_fives(x):
    calls.append(x)
    if x % 5 == 0:
        raise ValueError(f"bad item {x}")
    return x


def take(batch_iter, n):
    return list(itertools.islice(batch_iter(), n))


def resumed(make, stop, more):
    """The ``more`` batches after the first ``stop`` of a run, and those of a run restored from
    its state (JSON round-tripped) after ``stop``."""
    original = make()
    take(original, stop)
    state = json.loads(json.dumps(original.state_dict()))
    expected = take(original, more)
    original.close()
    again = make()
    again.load_state_dict(state)
    got = take(again, more)
    again.close()
    return got, expected


ORDERINGS = {
    "Cycler": lambda: Cycler(READER),
    "Cycler(Shuffler)": lambda: Cycler(Shuffler(READER, seed=3)),
    "Cycler(Range)": lambda: Cycler(Range(READER, 2, 9)),
    "Cycler(QuasiShuffler)": lambda: Cycler(QuasiShuffler(READER, 4, 2, seed=1)),
    "Repeater(Cycler)": lambda: Repeater(Cycler(READER), 2),
    "Repeater(Shuffler)": lambda: Repeater(Shuffler(READER, seed=2), 3),
    "Shuffler": lambda: Shuffler(READER, seed=5),
}
STAGES = {
    "function": lambda: [key],
    "threads": lambda: [threads(key, n_workers=2)],
    "Threads-map": lambda: [Threads(key, n_workers=2), map(noisy, seed=1)],
}


@pytest.mark.parametrize("stop", [1, 3, 4, 7, 12])
@pytest.mark.parametrize("stages", list(STAGES))
@pytest.mark.parametrize("ordering", list(ORDERINGS))
def test_an_infinite_over_any_ordering_resumes_on_the_batch_that_was_due(ordering, stages, stop):
    def make():
        return Infinite(ORDERINGS[ordering](), *STAGES[stages](), batch_size=4,
                        batches_per_epoch=5, combiner=list)

    got, expected = resumed(make, stop, 6)
    assert got == expected


def test_the_cycler_of_the_issue_resumes_after_three_batches():
    def make():
        return Infinite(Cycler(READER), key, batch_size=4, batches_per_epoch=5, combiner=list)

    original = make()
    take(original, 3)
    again = make()
    again.load_state_dict(original.state_dict())
    assert take(again, 2) == [[2, 3, 4, 5], [6, 7, 8, 9]]
    original.close(), again.close()


SKIPPING = {
    "map": lambda: [fails_on_fives],
    "threads": lambda: [threads(fails_on_fives, n_workers=2, on_error="skip")],
    "Threads": lambda: [Threads(fails_on_fives, n_workers=2, on_error="skip")],
    "skip-then-map": lambda: [fails_on_fives, map(noisy, seed=2)],
    "two-skips": lambda: [fails_on_fives, map(fpipe.compose(fails_on_fives, abs),
                                              on_error="skip")],
}


@pytest.mark.parametrize("stop", [1, 3, 5, 8])
@pytest.mark.parametrize("source", ["range", "sample", "Cycler"])
@pytest.mark.parametrize("stages", list(SKIPPING))
def test_stages_that_skip_items_resume_on_the_batch_that_was_due(stages, source, stop):
    def make():
        items, first = {
            "range": lambda: (range(100), []),
            "sample": lambda: (sample(range(60), seed=4), []),
            "Cycler": lambda: (Cycler(Shuffler(ListReader([{"key": i} for i in range(30)]),
                                               seed=1)), [key]),
        }[source]()
        return Infinite(items, *first, *SKIPPING[stages](), batch_size=4, batches_per_epoch=50,
                        combiner=list, on_error="skip")

    got, expected = resumed(make, stop, 4)
    assert got == expected


def test_the_skipping_pipeline_of_the_issue_resumes_at_once_without_repeats():
    def make():
        return Infinite(range(100), fails_on_fives, batch_size=4, batches_per_epoch=100,
                        on_error="skip", combiner=list)

    original = make()
    take(original, 3)
    state = original.state_dict()
    assert state["consumed"] == [15, 12]  # items 0 to 14 made the 12 batched: 0, 5, 10 failed
    calls.clear()
    again = make()
    again.load_state_dict(state)
    assert take(again, 2) == [[16, 17, 18, 19], [21, 22, 23, 24]]
    assert min(calls) == 15  # no replay of the items before
    original.close(), again.close()


def test_a_long_skipping_stream_keeps_few_indices_and_still_counts_exactly():
    def make():
        return Infinite(range(10 ** 6), fails_on_fives, batch_size=2, batches_per_epoch=600,
                        on_error="skip", combiner=list)

    original = make()
    take(original, 600)  # past two settlements of the counts
    tracked = [s for s in original._pipeline.skipped if s is not None]
    assert tracked and all(len(s) < 300 for s in tracked)
    got, expected = resumed(make, 600, 3)
    assert got == expected
    original.close()


def make_sampled(batch_size=4, *stages):
    return Infinite(sample(range(100), seed=0), *stages, batch_size=batch_size,
                    batches_per_epoch=4, combiner=list)


def test_a_state_of_another_batch_size_is_refused():
    original = make_sampled(16)
    take(original, 3)
    state = original.state_dict()
    original.close()
    with pytest.raises(ValueError, match="Infinite with batch_size=16; this one has batch_size=8"):
        make_sampled(8).load_state_dict(state)
    predicate = Infinite(sample(range(100), seed=0), batch_size=lambda batch, item: len(batch) < 3,
                         batches_per_epoch=4, combiner=list)
    with pytest.raises(ValueError, match="batch_size=16; this one has batch_size=None"):
        predicate.load_state_dict(state)


def test_a_state_of_another_source_or_stages_is_refused():
    state = make_sampled().state_dict()
    listed = Infinite(list(range(10)), batch_size=4, batches_per_epoch=4).state_dict()
    with pytest.raises(ValueError, match="source_length=10; this one has source_length=12"):
        Infinite(list(range(12)), batch_size=4, batches_per_epoch=4).load_state_dict(listed)
    with pytest.raises(ValueError, match=r"state\['source'\] is the state of a 'Sample', not "
                                         "of a Cycler"):
        Infinite(Cycler(READER), batch_size=4, batches_per_epoch=4).load_state_dict(state)
    other = Infinite(sample(range(99), seed=0), batch_size=4, batches_per_epoch=4)
    with pytest.raises(ValueError, match="Sample with length=100; this one has length=99"):
        other.load_state_dict(state)
    counting = make_sampled(4, map(abs)).state_dict()
    with pytest.raises(ValueError, match=r"state\['consumed'\] is \[0, 0\]: .*, and this one "
                                         "replays them"):
        make_sampled(4, filter(bool)).load_state_dict(counting)


@pytest.mark.parametrize("change, error, message", [
    ({"delivered": 2.9}, TypeError, r"state\['delivered'\] must be an integer"),
    ({"epochs": [0, -1, 0]}, ValueError, r"state\['epochs'\]\[1\] must be >= 0"),
    ({"epochs": "000"}, TypeError, r"state\['epochs'\] must be a list"),
    ({"consumed": [5]}, ValueError, r"state\['consumed'\] must count the items behind"),
    ({"consumed": ["12"]}, TypeError, r"state\['consumed'\]\[0\] must be an integer"),
    ({"version": 2}, ValueError, r"state\['version'\] must be 1"),
    ({"extra": 1}, TypeError, "extra are not of such a state"),
])
def test_malformed_values_are_refused_and_nothing_changes(change, error, message):
    original = make_sampled()
    take(original, 3)
    state = original.state_dict()
    before = original.state_dict()
    expected = take(make_loaded(state), 2)
    with pytest.raises(error, match=message):
        original.load_state_dict({**state, **change})
    assert original.state_dict() == before
    assert take(original, 2) == expected  # the running pipeline went on as it was
    original.close()


def make_loaded(state):
    batch_iter = make_sampled()
    batch_iter.load_state_dict(state)
    return batch_iter


def test_a_bad_source_state_is_refused_before_the_pipeline_stops():
    original = make_sampled()
    take(original, 2)
    state = original.state_dict()
    stream = original._pipeline.stream
    with pytest.raises(ValueError, match=r"state\['source'\]\['seed'\] must be >= 0"):
        original.load_state_dict({**state, "source": {**state["source"], "seed": -1}})
    assert original._pipeline.stream is stream and not stream.closed
    original.close()


def test_a_state_saved_before_states_had_versions_loads_with_a_warning():
    original = make_sampled()
    take(original, 3)
    state = original.state_dict()
    expected = take(original, 2)
    original.close()
    old_source = {k: state["source"][k] for k in ("seed", "epoch", "position")}
    old = {"source": old_source, "epochs": state["epochs"], "delivered": state["delivered"]}
    again = make_sampled()
    with pytest.warns(UserWarning) as caught:
        again.load_state_dict(old)
    assert sorted(str(w.message).split(" does not say the ")[1][:28] for w in caught) == [
        "batch_size of the Infinite i", "length, weights of the Sampl"]
    assert take(again, 2) == expected
    again.close()


def test_an_old_state_of_a_skipping_pipeline_is_replayed_exactly():
    def make():
        return Infinite(range(100), fails_on_fives, batch_size=4, batches_per_epoch=100,
                        on_error="skip", combiner=list)

    original = make()
    take(original, 3)
    state = original.state_dict()
    old = {"source": None, "epochs": state["epochs"], "delivered": state["delivered"]}
    again = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        again.load_state_dict(old)
    before_start = again.state_dict()  # nothing counted yet: it replays too
    assert before_start["consumed"] is None
    assert take(again, 2) == [[16, 17, 18, 19], [21, 22, 23, 24]]
    assert again.state_dict()["consumed"] == [25, 20]  # counted while it replayed
    third = make()
    third.load_state_dict(before_start)
    assert take(third, 1) == [[16, 17, 18, 19]]
    original.close(), again.close(), third.close()


@pytest.mark.parametrize("stop", [2, 5])
def test_a_process_stage_that_skips_items_resumes_on_the_batch_that_was_due(stop):
    def make():
        return Infinite(sample(range(60), seed=4), Loky(fails_on_fives, n_workers=2,
                                                        on_error="skip"),
                        batch_size=4, batches_per_epoch=50, combiner=list)

    got, expected = resumed(make, stop, 4)
    assert got == expected
