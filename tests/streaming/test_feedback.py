"""Read-ahead never holds back an item the source gave: sources that wait for what the consumer
does with the items (reinforcement learning, active learning, curricula) run through every
stage, and a slow item does not keep the ones before it from the consumer."""

import itertools
import queue
import threading
import time

import pytest
from toolz import pipe

import fpipe as fp

from .helpers import double

DEADLINE = 60.0  # seconds a source waits for feedback before it gives up (a hang otherwise)
STEPS = 40


def feedback_source(answers):
    """Yields what the consumer answered to the previous item: the loop of an agent and its
    environment. It gives up (queue.Empty) if no answer comes within the deadline."""
    while (x := answers.get(timeout=DEADLINE)) is not None:
        yield x


def first(batch):
    return batch[0]


def unchanged(stream):
    return (x for x in stream)


def halve(x):
    return x // 2


STAGES = {
    "none": [],
    "map": [fp.stream.map(double), fp.stream.map(halve)],
    "map seeded": [fp.stream.map(abs, seed=0)],
    "filter": [fp.stream.filter(lambda x: x >= 0)],
    "take": [fp.take(10 * STEPS)],
    "batch(1)": [fp.batch(1), fp.stream.map(first)],
    "batch(1) unbatch": [fp.batch(1), fp.unbatch()],
    "transform_stream": [fp.transform_stream(unchanged)],
    "Iterator": [fp.Iterator(unchanged)],
    "shard": [fp.shard(0, 1), fp.stream.map(abs)],
    "prefetch": [fp.prefetch(4)],
    "threads": [fp.threads(abs, n_workers=2)],
    "threads unordered": [fp.threads(abs, n_workers=2, ordered=False)],
    "Threads": [fp.Threads(abs, n_workers=2)],
    "processes threading": [fp.processes(abs, n_workers=2, backend="threading")],
    "prefetch threads map": [fp.prefetch(8), fp.threads(abs, n_workers=2), fp.stream.map(abs)],
    "map prefetch batch(1)": [fp.stream.map(abs), fp.prefetch(3), fp.batch(1), fp.stream.map(first)],
}


def run_loop(stages):
    answers = queue.Queue()
    answers.put(0)
    got = []
    with pipe(fp.as_stream(feedback_source(answers)), *stages) as stream:
        for x in stream:
            got.append(x)
            answers.put(len(got) if len(got) < STEPS else None)
    return got


@pytest.mark.parametrize("name", list(STAGES))
def test_a_source_that_waits_for_the_consumer_runs_through(name):
    got = run_loop(STAGES[name])
    assert len(got) == STEPS


@pytest.mark.timeout(300)
def test_a_source_that_waits_for_the_consumer_runs_through_worker_processes():
    got = run_loop([fp.processes(abs, n_workers=2)])
    assert got == list(range(STEPS))


def test_an_infinite_batch_iterator_over_a_source_that_waits_for_the_consumer():
    answers = queue.Queue()
    answers.put(0)
    got = []
    with fp.Infinite(feedback_source(answers), abs, batch_size=1, batches_per_epoch=STEPS,
                     combiner=first) as batch_iter:
        for x in batch_iter():
            got.append(x)
            answers.put(x + 1)
    assert got == list(range(STEPS))


def test_next_reads_a_generator_one_item_at_a_time_and_a_list_ahead():
    read = []

    def source():
        for i in itertools.count():
            read.append(i)
            yield i

    stream = fp.stream.map(abs)(source())
    assert [next(stream) for _ in range(5)] == list(range(5)) and len(read) == 5
    ahead = fp.stream.map(abs)(list(range(100)))
    assert [next(ahead) for _ in range(5)] == list(range(5)) and ahead.read_ahead > 0


@pytest.mark.parametrize("stage", [fp.prefetch(4), fp.threads(abs, n_workers=2),
                                   fp.processes(abs, n_workers=2, backend="threading")],
                         ids=repr)
def test_an_item_read_is_not_held_back_while_the_next_one_is_slow(stage):
    # item 2 comes only once the consumer has item 1: holding item 1 back hangs the loop
    # (and before, it stood for a source whose third item takes 30 s)
    had_one = threading.Event()

    def source():
        yield 0
        yield 1
        if not had_one.wait(DEADLINE):
            raise TimeoutError("item 1 was held back")
        yield 2

    got = []
    with stage(source()) as stream:
        for x in stream:
            got.append(x)
            if x == 1:
                had_one.set()
    assert got == [0, 1, 2]


def test_a_generator_that_never_waits_can_be_read_ahead():
    source = fp.as_stream((x for x in range(10)), waits=False)
    assert source.pull(4) == [0, 1, 2, 3] and not source.waits
    assert fp.as_stream(x for x in range(3)).waits
    with pytest.raises(TypeError, match="waits must be True or False; got waits=1"):
        fp.as_stream([], waits=1)


def test_a_background_stage_over_a_waiting_source_still_sends_chunks():
    # chunks fill while the consumer is busy; only a consumer that waits takes them early
    def slow_consumer_sizes(stage):
        sizes, seen = [], 0
        with stage(x for x in range(2000)) as stream:
            while True:
                chunk = stream.pull(10_000)
                if not chunk:
                    break
                sizes.append(len(chunk))
                seen += len(chunk)
                time.sleep(0.002)
        return seen, max(sizes)

    assert slow_consumer_sizes(fp.prefetch(64))[0] == 2000
    seen, biggest = slow_consumer_sizes(fp.threads(abs, n_workers=1,
                                                   options=fp.ParallelOptions(chunk_size=32)))
    assert seen == 2000 and biggest > 1
