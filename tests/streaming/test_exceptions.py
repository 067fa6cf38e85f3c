"""Exceptions that a loop must not mistake: a StopIteration from a stage's function, a
KeyboardInterrupt or SystemExit in the middle of a chunk, and an error from the source's
close(), in every stage kind."""

import pytest
from toolz import pipe

import fpipe as fp

from .helpers import double


def stop_at_five(x):
    if x == 5:
        raise StopIteration("not the end of the stream")
    return x


def keep_below_five(x):
    return stop_at_five(x) >= 0


FOUR = fp.ParallelOptions(chunk_size=4)
PARALLEL = {
    "threads": lambda: fp.threads(stop_at_five, n_workers=2, options=FOUR),
    "threads seeded": lambda: fp.threads(stop_at_five, n_workers=2, options=FOUR, seed=0),
    "processes threading": lambda: fp.processes(stop_at_five, n_workers=2, backend="threading",
                                                options=FOUR),
    "processes loky": lambda: fp.processes(stop_at_five, n_workers=2, options=FOUR),
}
STOPPING = {
    "map": lambda: fp.stream.map(stop_at_five),
    "map seeded": lambda: fp.stream.map(stop_at_five, seed=0),
    "map with arguments": lambda: fp.stream.map(lambda x, y: stop_at_five(x) + y, 0),
    "filter": lambda: fp.stream.filter(keep_below_five),
    "batch predicate": lambda: fp.batch(lambda batch, x: stop_at_five(x) < 100),
    **PARALLEL,
}


@pytest.mark.parametrize("name", list(STOPPING))
def test_a_stop_iteration_in_a_function_is_an_error_that_names_the_item(name):
    got = []
    with pytest.raises(RuntimeError, match="StopIteration") as raised:
        for x in STOPPING[name]()(range(12)):
            got.append(x)
    before = [list(range(5))] if name == "batch predicate" else [0, 1, 2, 3, 4]
    assert got == before or (name == "filter" and got == [0, 1, 2, 3, 4])
    message, chain = str(raised.value), raised.value.__cause__
    if name != "batch predicate":
        assert "on item 5 (5)" in message
    if name in PARALLEL:  # the worker's traceback, with the StopIteration it began with
        assert "StopIteration: not the end of the stream" in str(chain)
    else:
        assert isinstance(chain, StopIteration)


def test_a_stop_iteration_is_skipped_like_any_error_with_on_error_skip():
    stream = fp.stream.map(stop_at_five, on_error="skip")(range(8))
    assert list(stream) == [0, 1, 2, 3, 4, 6, 7]
    (skipped,) = fp.stats(stream)[-1].skipped_items
    assert skipped.index == 5 and "StopIteration" in skipped.error


def test_a_loader_that_raises_stop_iteration_does_not_end_the_source():
    source = fp.load_by_random_id(stop_at_five, ids=[5], random_state=0)
    with pytest.raises(RuntimeError, match="StopIteration on id 5"):
        source.pull(3)


class Interrupted(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


class InterruptAt50:
    """Raises ``kind`` at item 50 (a class, so that it pickles)."""

    def __init__(self, kind):
        self.kind = kind

    def __call__(self, x):
        if x == 50:
            raise self.kind("at 50")
        return x


def interrupting_source(kind):
    yield from range(50)
    raise kind("at 50")


INTERRUPTED_STAGES = {
    "map": lambda f: [fp.stream.map(f)],
    "map seeded": lambda f: [fp.stream.map(f, seed=1)],
    "filter": lambda f: [fp.stream.filter(lambda x: f(x) >= 0)],
    "transform_stream": lambda f: [fp.transform_stream(lambda items: map(f, items))],
    "threads": lambda f: [fp.threads(f, n_workers=2)],
    "processes": lambda f: [fp.processes(f, n_workers=2, backend="threading")],
    "batch then unbatch": lambda f: [fp.stream.map(f), fp.batch(16), fp.unbatch()],
}


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit, Interrupted])
@pytest.mark.parametrize("name", list(INTERRUPTED_STAGES))
def test_a_base_exception_in_a_function_comes_after_every_item_before_it(name, kind):
    got = []
    with pytest.raises(kind):
        for x in pipe(list(range(100)), *INTERRUPTED_STAGES[name](InterruptAt50(kind))):
            got.append(x)
    assert got == list(range(50))


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("stages", [[], [fp.stream.map(double)], [fp.prefetch(8)],
                                    [fp.threads(double, n_workers=2)], [fp.batch(7), fp.unbatch()]],
                         ids=["none", "map", "prefetch", "threads", "batch"])
@pytest.mark.parametrize("waits", [None, False], ids=["read as it comes", "read ahead"])
def test_a_keyboard_interrupt_or_exit_in_the_source_comes_after_every_item_before_it(kind,
                                                                                     stages, waits):
    got = []
    source = interrupting_source(kind)
    stream = pipe(fp.as_stream(source) if waits is None else fp.as_stream(source, waits=waits),
                  *stages)
    with pytest.raises(kind, match="at 50"):
        for x in stream:
            got.append(x)
    assert sorted(got) == sorted(double(x) if "double" in repr(stages) else x
                                 for x in range(50))


class ClosingFails:
    """A source whose close() fails, as a file on a lost disk may."""

    def __init__(self):
        self.closed = False

    def __iter__(self):
        return self

    def __next__(self):
        return 1

    def close(self):
        self.closed = True
        raise OSError("the source could not close")


CLOSING_STAGES = {
    "none": [],
    "map": [fp.stream.map(abs)],
    "prefetch": [fp.prefetch(4)],
    "threads": [fp.threads(abs, n_workers=2)],
    "processes threading": [fp.processes(abs, backend="threading")],
    "processes loky": [fp.processes(abs, n_workers=2)],
    "map prefetch threads": [fp.stream.map(abs), fp.prefetch(4), fp.threads(abs)],
}


@pytest.mark.parametrize("name", list(CLOSING_STAGES))
def test_an_error_in_closing_the_source_is_raised_by_close(name):
    source = ClosingFails()
    stream = pipe(fp.as_stream(source), *CLOSING_STAGES[name])
    assert next(stream) == 1
    with pytest.raises(OSError, match="the source could not close"):
        stream.close()
    assert source.closed
    stream.close()  # once is enough


@pytest.mark.parametrize("name", list(CLOSING_STAGES))
def test_an_error_in_closing_does_not_hide_the_error_of_the_with_block(name):
    source = ClosingFails()
    with pytest.raises(ValueError, match="the loop failed") as raised:
        with pipe(fp.as_stream(source), *CLOSING_STAGES[name]) as stream:
            next(stream)
            raise ValueError("the loop failed")
    assert source.closed
    assert isinstance(raised.value.__context__, OSError)


def test_an_error_in_closing_does_not_hide_the_error_that_ended_the_stream():
    class FailsThenCloses(ClosingFails):
        def __next__(self):
            raise KeyError("read failed")

    with pytest.raises(KeyError, match="read failed") as raised:
        next(fp.stream.map(abs)(FailsThenCloses()))
    assert isinstance(raised.value.__context__, OSError)
