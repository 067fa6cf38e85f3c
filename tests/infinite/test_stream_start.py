"""Stream.start(), added to the streaming layer for Infinite's ``with bi:``."""

import threading
import time

from toolz import pipe

import fpipe as fp


def _feeders() -> int:
    return sum(t.name == "fpipe-feeder" for t in threading.enumerate())


def test_start_begins_a_background_stage_before_the_first_next():
    pulled = []

    def source():
        for i in range(100):
            pulled.append(i)
            yield i

    before = _feeders()
    stream = pipe(source(), fp.prefetch(4))
    assert _feeders() == before and pulled == []
    assert stream.start() is stream
    deadline = time.monotonic() + 5
    while not pulled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pulled and _feeders() == before + 1
    assert list(stream) == list(range(100))
    stream.close()
    assert _feeders() == before


def test_start_is_a_no_op_for_streams_in_the_consumer_thread_and_after_close():
    stream = pipe(range(3), fp.stream.map(abs))
    assert stream.start() is stream and list(stream) == [0, 1, 2]
    closed = pipe(range(3), fp.prefetch(2))
    closed.close()
    before = threading.active_count()
    assert closed.start() is closed and list(closed) == []
    assert threading.active_count() == before
