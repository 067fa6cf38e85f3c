"""The planner's fusions: a process stage, batch(size) and one of fpipe's combiners make whole
batches in the workers; map(..., in_workers=True) runs in the workers of the process stage after
it. Fused or not, the output is the same: items, batches, order, errors."""

import functools
import os

import numpy as np
import pytest
from toolz import pipe

import fpipe as fp
from fpipe.stream.parallel._shm import is_shared

from .fusion_work import (
    bad_at,
    bad_batch_at,
    drawn,
    image,
    labelled,
    noisy_batch,
    pad_value,
    ragged,
    stacked_here,
    twice,
    where,
)


def loky(func, **options):
    """The process stage of ``func`` on two loky workers."""
    return fp.processes(func, n_workers=2, **options)


def serial(items, func, combiner, size, drop_last=False, seed=None, **options):
    """What the pipeline gives with every stage in this process (the reference)."""
    return pipe(items, fp.stream.map(func, seed=seed), fp.batch(size, drop_last=drop_last),
                fp.stream.map(combiner, **options))


def outcome(stream):
    """The batches a stream gives, and the error that ended it (type and message), if any."""
    batches = []
    try:
        for batch in stream:
            batches.append(batch)
    except Exception as error:
        return batches, (type(error), str(error))
    return batches, None


def same(ours, theirs):
    """Whether two batches are equal all through: arrays of the same dtype and values,
    containers of the same type and contents."""
    if isinstance(theirs, np.ndarray):
        return (isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype
                and np.array_equal(ours, theirs))
    if isinstance(theirs, (list, tuple)):
        return (type(ours) is type(theirs) and len(ours) == len(theirs)
                and all(same(a, b) for a, b in zip(ours, theirs)))
    if isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(same(ours[k], theirs[k]) for k in theirs)
    return ours == theirs


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    assert all(same(ours, theirs) for ours, theirs in zip(got, expected))


def plan_text(stream):
    return str(fp.explain(stream))


@pytest.mark.parametrize("combiner, func, options", [
    (fp.combine_to_arrays, image, {}),
    (fp.combine_pad, labelled, {"padding_values": -1}),
    (fp.combine_pad, ragged, {"padding_values": 7, "ratio": 0}),
    (fp.combine_batches, image, {}),
    (fp.combine_dicts, labelled, {"padding_values": 0}),
])
@pytest.mark.parametrize("size, drop_last", [(1, False), (4, False), (5, True), (7, False)])
def test_the_natural_idiom_makes_the_same_batches_in_the_workers(combiner, func, options, size,
                                                                  drop_last):
    items = range(23)
    stream = pipe(items, loky(func, seed=3), fp.batch(size, drop_last=drop_last),
                  fp.stream.map(combiner, **options))
    got = list(stream)
    assert_same_batches(got, list(serial(items, func, combiner, size, drop_last, seed=3,
                                         **options)))
    assert f"fused: the workers make whole batches of {size}" in plan_text(stream)


def test_fused_batches_cross_in_shared_memory_as_one_piece():
    stream = pipe(range(64), loky(image), fp.batch(16), fp.stream.map(fp.combine_to_arrays))
    images = [images for images, _ in stream]
    assert len(images) == 4 and all(is_shared(array) for array in images)


@pytest.mark.parametrize("bad", [0, 3, 4, 9, 22])
def test_an_item_that_fails_ends_the_same_batches_with_the_same_error(bad):
    items = range(23)
    stream = pipe(items, loky(functools.partial(bad_at, bad=bad)), fp.batch(4),
                  fp.stream.map(fp.combine_to_arrays))
    got, error = outcome(stream)
    expected, expected_error = outcome(pipe(items, fp.stream.map(bad_at, bad), fp.batch(4),
                                            fp.stream.map(fp.combine_to_arrays)))
    assert_same_batches(got, expected)
    assert error == expected_error and "bad item" in error[1]
    assert "fused" in plan_text(stream)


@pytest.mark.parametrize("bad", [20, 21])
def test_an_item_of_a_short_last_batch_that_drop_last_leaves_out_still_raises(bad):
    # the consumer's map raises at the item before batch() drops the short batch: so do the
    # workers (hypothesis found it: items [0], batch(2, drop_last=True))
    items = range(22)
    stream = pipe(items, loky(functools.partial(bad_at, bad=bad)), fp.batch(4, drop_last=True),
                  fp.stream.map(fp.combine_to_arrays))
    got, error = outcome(stream)
    expected, expected_error = outcome(pipe(items, fp.stream.map(bad_at, bad),
                                            fp.batch(4, drop_last=True),
                                            fp.stream.map(fp.combine_to_arrays)))
    assert_same_batches(got, expected) and len(got) == 5
    assert error == expected_error and "bad item" in error[1]
    assert "fused" in plan_text(stream) and "batch(4, drop_last=True)" in plan_text(stream)


def test_a_combiner_that_fails_ends_the_same_batches_with_the_same_error():
    stream = pipe(range(12), loky(ragged), fp.batch(4), fp.stream.map(fp.combine_to_arrays))
    got, error = outcome(stream)
    expected, expected_error = outcome(serial(range(12), ragged, fp.combine_to_arrays, 4))
    assert_same_batches(got, expected)
    assert error == expected_error and error[0] is ValueError and "field 0" in error[1]
    assert "fused" in plan_text(stream)


def test_an_upstream_that_fails_ends_the_same_batches_with_its_error():
    def source():
        yield from range(10)
        raise OSError("the disk went away")

    got, error = outcome(pipe(source(), loky(image), fp.batch(4), fp.stream.map(fp.combine_to_arrays)))
    expected, expected_error = outcome(serial(source(), image, fp.combine_to_arrays, 4))
    assert_same_batches(got, expected)
    assert error == expected_error == (OSError, "the disk went away")


def test_a_fused_stage_numbers_items_from_where_it_starts():
    # as Infinite resumes a pipeline: the process stage and the map each start elsewhere
    process, batching, combining = (fp.processes(drawn, n_workers=2, seed=5), fp.batch(3),
                                    fp.stream.map(fp.combine_batches))
    stream = combining.apply(batching.apply(process.apply(range(9), epoch=2, start=30)),
                             start=10)
    reference = pipe(fp.stream.map(drawn, seed=5).apply(range(9), epoch=2, start=30), fp.batch(3),
                     fp.stream.map(fp.combine_batches))
    assert list(stream) == list(reference)
    assert "fused" in plan_text(stream)


@pytest.mark.parametrize("stages, reason", [
    ([loky(image, on_error="skip"), fp.batch(4), fp.stream.map(fp.combine_to_arrays)],
     "on_error='skip'"),
    ([loky(image, ordered=False), fp.batch(4), fp.stream.map(fp.combine_to_arrays)], "ordered=False"),
    ([loky(image), fp.batch(lambda batch, item: len(batch) < 3), fp.stream.map(fp.combine_to_arrays)],
     "predicate"),
    ([loky(image), fp.batch(4), fp.stream.map(fp.combine_to_arrays, on_error="skip")],
     "the map has on_error"),
    ([loky(image), fp.batch(4), fp.stream.map(stacked_here)], "stacked_here is your function"),
    ([loky(labelled), fp.batch(4), fp.stream.map(fp.combine_pad, padding_values=pad_value)],
     "combine_pad's padding_values=pad_value is your function"),
])
def test_what_does_not_fuse_runs_as_written_and_the_plan_says_why(stages, reason):
    stream = pipe(range(13), *stages)
    got = list(stream)
    firsts = [next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
              for batch in got]
    assert sum(map(len, firsts)) == 13
    text = plan_text(stream)
    assert "not fused" in text and reason in text, text


def test_a_user_combiner_runs_in_the_workers_only_when_its_map_says_so():
    here = pipe(range(8), loky(image), fp.batch(4), fp.stream.map(stacked_here))
    assert {pid for _, pid in here} == {os.getpid()}
    there = pipe(range(8), loky(image), fp.batch(4), fp.stream.map(stacked_here, in_workers=True))
    batches = list(there)
    assert os.getpid() not in {pid for _, pid in batches}
    assert_same_batches([images for images, _ in batches],
                        [images for images, _ in serial(range(8), image, stacked_here, 4)])
    assert "fused" in plan_text(there)


def test_a_map_before_a_process_stage_runs_in_its_workers_only_when_it_says_so():
    here = pipe(range(20), fp.stream.map(where), loky(fp.identity))
    assert {pid for _, pid in here} == {os.getpid()}
    assert "not folded in: map(where)" in plan_text(here)
    there = pipe(range(20), fp.stream.map(where, in_workers=True), loky(fp.identity))
    assert [i for i, _ in there] == list(range(20))
    assert os.getpid() not in {pid for _, pid in there}
    text = plan_text(there)
    assert "folded in: map(where, in_workers=True) runs in the workers" in text


def test_folded_maps_keep_their_draws_and_their_errors():
    def stages(folded):
        return [fp.stream.map(twice, in_workers=folded), fp.stream.map(drawn, seed=1, in_workers=folded),
                fp.processes(fp.identity, n_workers=2), fp.batch(4), fp.stream.map(fp.combine_batches)]
    folded = pipe(range(30), *stages(True))
    assert list(folded) == list(pipe(range(30), *stages(False)))
    assert plan_text(folded).count("folded in") == 2 and "fused" in plan_text(folded)

    got, error = outcome(pipe(range(30), fp.stream.map(bad_at, 13, in_workers=True), loky(fp.identity),
                              fp.batch(4), fp.stream.map(fp.combine_to_arrays)))
    expected, expected_error = outcome(serial(range(30), lambda i: bad_at(i, 13),
                                              fp.combine_to_arrays, 4))
    assert_same_batches(got, expected)
    assert error == expected_error


def test_maps_after_a_fused_combiner_run_in_the_workers_only_when_they_say_so():
    def stages(folded):
        return [loky(image), fp.batch(4), fp.stream.map(fp.combine_to_arrays),
                fp.stream.map(bad_batch_at, 100, in_workers=folded),
                fp.stream.map(noisy_batch, seed=2, in_workers=folded)]
    there, here = pipe(range(22), *stages(True)), pipe(range(22), *stages(False))
    got, expected = list(there), list(here)
    assert_same_batches([batch[:2] for batch in got], [batch[:2] for batch in expected])
    assert os.getpid() not in {pid for *_, pid in got}
    assert {pid for *_, pid in expected} == {os.getpid()}
    text = plan_text(there)
    assert text.count("runs in the workers, on each batch") == 2 and "fused" in text
    assert "not folded in: map(bad_batch_at, 100) runs in this process" in plan_text(here)


@pytest.mark.parametrize("bad", [0, 8, 20])
def test_a_map_after_a_fused_combiner_that_fails_ends_the_same_batches_with_its_error(bad):
    def stages(folded):
        return [loky(image), fp.batch(4), fp.stream.map(fp.combine_to_arrays),
                fp.stream.map(bad_batch_at, bad, in_workers=folded)]
    got, error = outcome(pipe(range(22), *stages(True)))
    expected, expected_error = outcome(pipe(range(22), *stages(False)))
    assert_same_batches(got, expected)
    assert len(got) == bad // 4
    assert error == expected_error == (KeyError, f"'bad batch from {bad}'")


def test_a_stream_read_already_is_not_fused():
    head = pipe(range(12), loky(image), fp.batch(4))
    first = next(head)
    stream = fp.stream.map(fp.combine_to_arrays)(head)
    assert len(list(stream)) == 2 and len(first) == 4
    assert "not fused: the stream before the map had been read already" in plan_text(stream)


def test_infinite_with_loky_and_the_default_combiner_fuses_and_resumes_exactly():
    def build():
        return fp.Infinite(fp.sample(range(1000), random_state=0),
                           fp.processes(image, n_workers=2, seed=4), batch_size=8,
                           batches_per_epoch=3)

    first = build()
    with first:
        list(first())
        state = first.state_dict()
        expected = list(first())
        assert "fused: the workers make whole batches of 8" in str(first.explain())
    second = build()
    with second:
        second.load_state_dict(state)
        assert_same_batches(list(second()), expected)
