"""Laws of the stages: conservation and order, the pull contract, seeds that do not depend on
workers or backends, the prefetch bound, the items before an error of any kind, and sources
that wait for their consumer."""

import itertools
import queue
import time
from collections import Counter
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from toolz import pipe

import fpipe as fp
from fpipe.stream.parallel import _tuner
from property_tests.strategies import (
    add_three,
    background_stages,
    chunk_sizes,
    error_kinds,
    fails_on_multiples_of_seven,
    item_stages,
    noisy,
    pull_sizes,
    regroupings,
    stream_items,
)


def _reference(items, chain):
    for kind, func in chain:
        items = [func(x) for x in items] if kind == "map" else [x for x in items if func(x)]
    return items


def _build(chain, background, regrouping=None):
    stages = [fp.stream.map(func) if kind == "map" else fp.stream.filter(func) for kind, func in chain]
    if regrouping is not None:
        stages += [fp.batch(regrouping), fp.unbatch()]
    for spec in background:
        stages.append(fp.prefetch(spec[1]) if spec[0] == "prefetch" else fp.threads(
            add_three, n_workers=spec[1], buffer_chunks=spec[2],
            options=fp.ParallelOptions(chunk_size=spec[3])))
        chain = [*chain, ("map", add_three)] if spec[0] == "threads" else chain
    return stages, chain


@given(stream_items, st.lists(item_stages, max_size=3), st.lists(background_stages(), max_size=2))
@settings(max_examples=40)
def test_ordered_stages_conserve_the_stream_in_order(items, chain, background):
    stages, full_chain = _build(chain, background)
    with pipe(fp.as_stream(items), *stages) as stream:
        assert list(stream) == _reference(items, full_chain)


@given(stream_items, st.integers(1, 4), chunk_sizes)
@settings(max_examples=25)
def test_unordered_threads_conserve_the_multiset(items, n_workers, chunk_size):
    stage = fp.threads(add_three, n_workers=n_workers, ordered=False,
                       options=fp.ParallelOptions(chunk_size=chunk_size))
    assert Counter(stage(items)) == Counter(x + 3 for x in items)


@given(stream_items, st.lists(item_stages, max_size=2), st.lists(background_stages(), max_size=1),
       pull_sizes)
@settings(max_examples=40)
def test_pull_gives_one_to_n_items_until_it_gives_none(items, chain, background, sizes):
    stages, full_chain = _build(chain, background)
    got = []
    with pipe(fp.as_stream(items), *stages) as stream:
        for n in itertools.cycle(sizes):
            chunk = stream.pull(n)
            if not chunk:
                break
            assert 1 <= len(chunk) <= n
            got += chunk
        assert stream.pull(1) == []
    assert got == _reference(items, full_chain)


@given(stream_items, st.lists(st.booleans(), max_size=40))
def test_next_and_pull_can_be_mixed(items, use_next):
    stream, got = fp.stream.map(add_three)(items), []
    for by_next in itertools.chain(use_next, itertools.repeat(False)):
        chunk = [next(stream, None)] if by_next else stream.pull(3)
        chunk = [x for x in chunk if x is not None]
        if not chunk:
            break
        got += chunk
    assert got == [x + 3 for x in items]


@given(st.lists(st.integers(0, 100), max_size=40), st.integers(0, 2**32), st.booleans())
@settings(max_examples=5, deadline=None)
def test_seeded_stages_give_the_same_output_for_any_workers_and_backend(items, seed, ordered):
    reference = list(fp.stream.map(noisy, seed=seed)(items))
    stages = [fp.threads(noisy, n_workers=n, seed=seed, ordered=ordered,
                         options=fp.ParallelOptions(chunk_size=3))
              for n in (1, 2, 4)]
    stages += [fp.processes(noisy, n_workers=n, backend=backend, seed=seed, ordered=ordered,
                            options=fp.ParallelOptions(chunk_size=5))
               for backend in ("threading", "loky") for n in (1, 2, 4)]
    for stage in stages:
        out = list(stage(items))
        assert (out if ordered else sorted(out)) == (reference if ordered else sorted(reference))


def _scripted(settings):
    """Tuner.decide returning ``settings`` in turn, then the last: a run resized at every
    chunk, whatever its measurements say."""
    script = iter(settings)

    def decide(self, window):
        self.decisions += 1
        setting = next(script, self.setting)
        self.history.append(_tuner.Decision(setting, "scripted", window))
        return setting
    return decide


@given(st.lists(st.integers(0, 100), max_size=60), st.integers(0, 2**32),
       st.lists(st.tuples(st.integers(1, 6), st.integers(1, 4)), min_size=1, max_size=20),
       st.sampled_from(["threads", "processes"]), st.booleans())
@settings(max_examples=10, deadline=None)
def test_seeded_stages_give_the_same_output_whatever_the_tuner_chooses(items, seed, choices,
                                                                        kind, fused):
    reference = list(fp.stream.map(noisy, seed=seed)(items))
    per_worker = 2 if kind == "processes" else 1
    settings = [_tuner.Setting(w, b, per_worker * w + b) for w, b in choices]
    factory = fp.processes if kind == "processes" else fp.threads
    budget = {"cpu_budget": 2} if kind == "processes" else {}
    stage = factory(noisy, n_workers="auto", buffer_chunks="auto", seed=seed,
                    options=fp.ParallelOptions(chunk_size=3, **budget))
    after = [fp.batch(4), fp.stream.map(fp.combine_batches)] if fused else []
    expected = list(pipe(reference, *after))
    with mock.patch.multiple(_tuner, WINDOW_SECONDS=0.0, WINDOW_CHUNKS=1), \
            mock.patch.object(_tuner.Tuner, "decide", _scripted(settings)):
        assert list(pipe(stage.apply(items), *after)) == expected
    # the tuner itself, from where the scripted run left the stage
    assert list(pipe(stage.apply(items), *after)) == expected


@given(st.integers(1, 12))
@settings(max_examples=5, deadline=None)
def test_prefetch_holds_at_most_n_items_ahead_of_an_idle_consumer(n):
    read = [0]

    def source():
        for i in itertools.count():
            read[0] = i + 1
            yield i

    with fp.prefetch(n)(source()) as stream:
        taken = len(stream.pull(1))
        time.sleep(0.05)
        assert read[0] - taken <= n


@given(st.lists(st.integers(0, 100), min_size=1, max_size=30), st.integers(0, 2**32),
       st.integers(0, 6), st.sampled_from(["map", "threads"]))
@settings(max_examples=20, deadline=None)
def test_a_stage_built_at_epoch_e_draws_what_one_stage_object_draws_in_its_epoch_e(
        items, seed, epoch, kind):
    def build(**options):
        if kind == "map":
            return fp.stream.map(noisy, seed=seed, **options)
        return fp.threads(noisy, n_workers=2, seed=seed,
                          options=fp.ParallelOptions(chunk_size=2), **options)

    reused = build()
    outputs = [list(reused(items)) for _ in range(epoch + 1)]
    assert list(build(epoch=epoch)(items)) == outputs[epoch]
    # built anew without epoch=, a stage is at epoch 0 again: the same draws, by design
    assert list(build()(items)) == outputs[0]
    assert epoch == 0 or outputs[epoch] != outputs[0]


@given(stream_items, st.sampled_from(["map", "threads", "processes"]), st.integers(1, 3),
       chunk_sizes)
@settings(max_examples=15, deadline=None)
def test_skipping_keeps_exactly_the_good_items_in_order_and_counts_the_rest(
        items, kind, n_workers, chunk_size):
    if kind == "map":
        stage = fp.stream.map(fails_on_multiples_of_seven, on_error="skip")
    else:
        factory = fp.threads if kind == "threads" else fp.processes
        options = {} if kind == "threads" else {"backend": "threading"}
        stage = factory(fails_on_multiples_of_seven, n_workers=n_workers,
                        options=fp.ParallelOptions(chunk_size=chunk_size), on_error="skip",
                        **options)
    with stage(items) as stream:
        assert list(stream) == [x + 3 for x in items if x % 7]
        row = fp.stats(stream)[-1]
    bad = [i for i, x in enumerate(items) if x % 7 == 0]
    assert row.skipped == len(bad) and [r.index for r in row.skipped_items] == bad


def _failing_source(items, kind):
    yield from items
    raise kind("the source failed")


@given(stream_items, st.lists(item_stages, max_size=3), st.lists(background_stages(), max_size=2),
       regroupings, error_kinds, st.booleans())
@settings(max_examples=40, deadline=None)
def test_every_stage_delivers_the_items_before_an_error_of_any_kind(items, chain, background,
                                                                     regrouping, kind, waits):
    stages, full_chain = _build(chain, background, regrouping)
    got = []
    source = fp.as_stream(_failing_source(items, kind), waits=waits)
    try:
        with pipe(source, *stages) as stream:
            for x in stream:
                got.append(x)
    except kind as error:
        assert "the source failed" in str(error)
    else:
        raise AssertionError(f"{kind.__name__} was not raised")
    assert got == _reference(items, full_chain)


def _waiting_source(answers):
    while (x := answers.get(timeout=60)) is not None:  # a hang fails the law with queue.Empty
        yield x


def _passes(x):
    return True


@given(st.lists(st.sampled_from([("map", add_three), ("map", abs), ("filter", _passes)]),
                max_size=3),
       st.lists(background_stages(), max_size=2), st.one_of(st.none(), st.just(1)),
       st.integers(1, 30))
@settings(max_examples=30, deadline=None)
def test_a_source_that_waits_for_the_consumer_runs_through_any_stages(chain, background,
                                                                       regrouping, steps):
    # the source gives item k+1 only once the consumer has item k, so no stage may hold an
    # item back to wait for the next one (a filter keeps them all: the consumer answers each)
    stages, _ = _build(chain, background, regrouping)
    answers = queue.Queue()
    answers.put(0)
    got = 0
    with pipe(fp.as_stream(_waiting_source(answers)), *stages) as stream:
        for _ in stream:
            got += 1
            answers.put(got if got < steps else None)
    assert got == steps
