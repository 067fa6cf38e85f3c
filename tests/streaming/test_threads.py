"""prefetch and threads: order, seeds, errors, back-pressure, closing and leaks."""

import functools
import itertools
import threading
import time
from collections import Counter

import pytest
from toolz import pipe

import fpipe as fp

from .helpers import double, fail_at, fpipe_threads, jitter, noisy, slow_double


def counting_source(counter):
    for i in itertools.count():
        counter[0] = i + 1
        yield i


@pytest.mark.parametrize("stage", [fp.prefetch(5), fp.threads(double, n_workers=3),
                                   fp.threads(jitter, n_workers=4, options=fp.ParallelOptions(chunk_size=1))])
def test_background_stages_keep_the_input_order(stage):
    out = list(stage(range(300)))
    expected = [2 * x for x in range(300)] if "double" in repr(stage) else list(range(300))
    assert out == expected


def test_unordered_threads_yield_every_result_once():
    stage = fp.threads(jitter, n_workers=4, ordered=False, options=fp.ParallelOptions(chunk_size=1))
    out = list(stage(range(200)))
    assert Counter(out) == Counter(range(200))


def test_threads_take_a_partial_with_extra_arguments():
    assert list(fp.threads(functools.partial(slow_double, seconds=0.0), n_workers=2)(range(4))) \
        == [0, 2, 4, 6]


@pytest.mark.parametrize("n_workers", [1, 2, 4])
@pytest.mark.parametrize("ordered", [True, False])
def test_seeded_threads_draw_the_same_for_any_number_of_workers(n_workers, ordered):
    reference = list(fp.stream.map(noisy, seed=7)(range(40)))
    stage = fp.threads(noisy, n_workers=n_workers, ordered=ordered, seed=7,
                       options=fp.ParallelOptions(chunk_size=3))
    out = list(stage(range(40)))
    assert sorted(out) == sorted(reference)
    if ordered:
        assert out == reference


def test_nothing_starts_before_the_first_next():
    before = len(fpipe_threads())
    stream = pipe(range(10), fp.prefetch(2), fp.threads(double, n_workers=2))
    assert len(fpipe_threads()) == before
    assert next(stream) == 0
    assert len(fpipe_threads()) > before
    stream.close()


def test_close_joins_the_threads_and_closes_upstream():
    closed = []

    def source():
        try:
            yield from itertools.count()
        finally:
            closed.append(True)

    before = set(fpipe_threads())
    stream = pipe(source(), fp.prefetch(8), fp.threads(double, n_workers=3), fp.batch(4))
    assert next(stream) == [0, 2, 4, 6]
    stream.close()
    assert set(fpipe_threads()) == before and closed == [True]


def test_a_stream_that_ends_releases_its_threads():
    before = set(fpipe_threads())
    assert list(pipe(range(50), fp.prefetch(3), fp.threads(double, n_workers=2)))[-1] == 98
    assert set(fpipe_threads()) == before


def test_no_thread_leaks_after_100_cycles():
    before = threading.active_count()
    for _ in range(100):
        with pipe(range(1000), fp.prefetch(4), fp.threads(double, n_workers=2), fp.batch(8)) as s:
            next(s)
            next(s)
    assert threading.active_count() == before


@pytest.mark.parametrize("options", [{"n_workers": 2},
                                     {"n_workers": "auto", "buffer_chunks": "auto",
                                      "options": fp.ParallelOptions(memory_budget=1 << 24)}])
def test_a_forgotten_stream_is_stopped_when_collected(options):
    before = set(fpipe_threads())
    stream = pipe(itertools.count(), fp.threads(double, **options))
    next(stream)
    del stream
    for _ in range(100):  # the finalizer stops them; they exit on their own
        if set(fpipe_threads()) == before:
            break
        time.sleep(0.02)
    assert set(fpipe_threads()) == before


@pytest.mark.parametrize("stage", [fp.threads(fail_at, n_workers=3, options=fp.ParallelOptions(chunk_size=2)),
                                   fp.threads(fail_at, n_workers=2, ordered=False,
                                              options=fp.ParallelOptions(chunk_size=1))])
def test_a_worker_error_arrives_whole_after_the_items_before_it(stage):
    got = []
    with pytest.raises(KeyError, match="bad item 7") as raised:
        for x in stage(range(20)):
            got.append(x)
    assert "fail_at" in str(raised.value.__cause__)  # the worker's traceback
    if stage.ordered:
        assert got == list(range(7))
    assert set(fpipe_threads()) <= set(threading.enumerate())


def test_an_upstream_error_passes_through_background_stages():
    def source():
        yield from range(5)
        raise OSError("source broke")

    got = []
    with pytest.raises(OSError, match="source broke"):
        for x in pipe(source(), fp.prefetch(2), fp.threads(double, n_workers=2)):
            got.append(x)
    assert got == [0, 2, 4, 6, 8]


def test_errors_release_the_threads():
    before = set(fpipe_threads())
    with pytest.raises(KeyError):
        list(pipe(range(100), fp.prefetch(4), fp.threads(fail_at, n_workers=2)))
    assert set(fpipe_threads()) == before


def test_an_error_reaches_an_idle_consumer_without_a_hang():
    stream = fp.threads(functools.partial(fail_at, bad=0))(itertools.count())
    done = threading.Event()

    def consume():
        with pytest.raises(KeyError):
            next(stream)
        done.set()

    threading.Thread(target=consume).start()
    assert done.wait(10)


@pytest.mark.parametrize("make, bound", [
    (lambda: fp.prefetch(10), 10),
    # (n_workers + buffer_size) chunks of at most chunk_size items
    (lambda: fp.threads(double, n_workers=2, buffer_chunks=1, options=fp.ParallelOptions(chunk_size=4)),
     (2 + 1) * 4),
])
def test_back_pressure_bounds_what_is_read_ahead(make, bound):
    counter = [0]
    stream = make()(counting_source(counter))
    taken = len(stream.pull(1))
    time.sleep(0.2)  # the consumer is idle
    assert bound // 2 < counter[0] - taken <= bound
    stream.close()


@pytest.mark.parametrize("make, message", [
    (lambda: fp.threads(double, n_workers=0), "n_workers must be >= 1 or -1; got n_workers=0"),
    (lambda: fp.threads(double, n_workers=1.5), "n_workers must be an integer"),
    (lambda: fp.threads(double, buffer_chunks=0), "buffer_chunks must be >= 1; got buffer_chunks=0"),
    (lambda: fp.threads(double, options=fp.ParallelOptions(chunk_size=0)), "chunk_size must be >= 1"),
    (lambda: fp.threads(double, ordered="yes"), "ordered must be True or False"),
    (lambda: fp.threads("f"), "func must be callable"),
])
def test_bad_arguments_are_rejected_at_construction(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_all_cores_and_repr():
    stage = fp.threads(double, n_workers=-1, ordered=False, seed=1)
    assert list(sorted(stage(range(10)))) == [2 * x for x in range(10)]
    assert repr(stage) == "threads(double, n_workers=-1, ordered=False, seed=1)"


def test_start_reaches_background_stages_upstream():
    before = len(fpipe_threads())
    stream = pipe(range(10), fp.prefetch(2), fp.stream.map(abs), fp.batch(3)).start()
    assert len(fpipe_threads()) == before + 1
    assert list(stream) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(fpipe_threads()) == before
