"""Infinite's lifecycle: lazy start, synchronous close, reuse, clean-up without close, errors."""

import gc
import itertools
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import weakref

import pytest

from fpipe import Infinite, Iterator, Loky, Threads, processes

from .helpers import fail_at, fail_on_batch, fpipe_threads, pairs, square, wait_until

psutil = pytest.importorskip("psutil")


def alive() -> tuple:
    """The threads and child processes alive now."""
    return set(threading.enumerate()), {p.pid for p in psutil.Process().children(recursive=True)}


def back_to(baseline: tuple) -> bool:
    """Whether no thread or process is alive that was not at ``baseline`` (ones that other
    tests left running may have ended since)."""
    threads, processes = alive()
    return threads <= baseline[0] and processes <= baseline[1]


def every_kind(**kwargs) -> Infinite:
    return Infinite(itertools.count(), square, Threads(square, n_workers=2),
                    Loky(square, n_workers=2), Iterator(pairs, n_workers=2), batch_size=4,
                    batches_per_epoch=3, combiner=list, **kwargs)


@pytest.fixture(autouse=True)
def settled():
    """Each test begins when the threads of earlier tests are gone (a process stage used
    without Infinite, for one, ends its joblib generator a second after its last task)."""
    assert wait_until(lambda: not fpipe_threads())


@pytest.fixture(scope="module")
def warm_workers():
    """Loky's workers stay warm in joblib's pool once started: baselines are taken after."""
    assert wait_until(lambda: not fpipe_threads())
    batch_iter = every_kind()
    list(batch_iter())
    batch_iter.close()
    return alive()


def test_nothing_starts_at_construction_and_with_starts_it():
    pulled = []

    def source():
        for i in itertools.count():
            pulled.append(i)
            yield i

    batch_iter = Infinite(source(), Threads(square, n_workers=2), batch_size=2,
                          batches_per_epoch=1, combiner=list)
    assert fpipe_threads() == [] and pulled == []
    with batch_iter as entered:
        assert entered is batch_iter
        assert wait_until(lambda: len(pulled) >= 2)  # it works ahead before the first next()
        assert len(fpipe_threads()) == 4  # two feeders (the pipeline, Threads) and 2 workers
    assert fpipe_threads() == []


def test_calling_it_starts_the_pipeline_too():
    batch_iter = Infinite(itertools.count(), batch_size=2, batches_per_epoch=1, combiner=list)
    before = len(fpipe_threads())
    epoch = batch_iter()
    assert len(fpipe_threads()) == before + 1
    batch_iter.close()
    assert len(fpipe_threads()) == before and list(epoch)  # an epoch object starts it again
    batch_iter.close()


def test_close_joins_every_thread_before_it_returns(warm_workers):
    for _ in range(3):  # and repeated cycles leave nothing behind (dpipe leaks threads)
        batch_iter = every_kind()
        assert len(list(batch_iter())) == 3
        batch_iter.close()
        assert back_to(warm_workers)
        assert fpipe_threads() == []


def test_close_is_idempotent_and_the_object_is_reusable(warm_workers):
    batch_iter = Infinite(range(100), square, batch_size=2, batches_per_epoch=2, combiner=list)
    batch_iter.close()  # before any start
    assert list(batch_iter()) == [[0, 1], [4, 9]]
    batch_iter.close()
    batch_iter.close()
    assert list(batch_iter()) == [[0, 1], [4, 9]]  # a list starts again
    batch_iter.close()
    counter = itertools.count()
    batch_iter = Infinite(counter, batch_size=2, batches_per_epoch=1, combiner=list)
    with batch_iter:
        first = list(batch_iter())
    with batch_iter:
        second = list(batch_iter())
    assert first == [[0, 1]] and second[0][0] > 1  # an iterator goes on (read-ahead is dropped)
    assert back_to(warm_workers)


def test_an_inner_with_of_the_same_object_leaves_it_open():
    def train(batch_iter):  # a function that opens what its caller may have opened
        with batch_iter:
            return list(batch_iter())

    with Infinite(range(1000), batch_size=2, batches_per_epoch=2,
                  combiner=list) as batch_iter:
        first = list(batch_iter())
        inner = train(batch_iter)
        assert fpipe_threads()  # still running
        after = list(batch_iter())
    assert [first, inner, after] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert wait_until(lambda: not fpipe_threads())  # the outer block closed it
    with batch_iter:  # and it starts over when used again
        assert list(batch_iter()) == [[0, 1], [2, 3]]


class _ClosingFails:
    def __iter__(self):
        return self

    def __next__(self):
        return 1

    def close(self):
        raise OSError("the source could not close")


def test_an_error_in_closing_does_not_hide_the_error_of_the_with_block():
    with pytest.raises(ValueError, match="the loop failed") as raised:
        with Infinite(_ClosingFails(), batch_size=2, batches_per_epoch=2,
                      combiner=list) as batch_iter:
            list(batch_iter())
            raise ValueError("the loop failed")
    assert isinstance(raised.value.__context__, OSError)
    batch_iter = Infinite(_ClosingFails(), batch_size=2, batches_per_epoch=2, combiner=list)
    list(batch_iter())
    with pytest.raises(OSError, match="the source could not close"):
        batch_iter.close()


def test_an_error_in_closing_does_not_hide_the_error_that_ended_the_epoch():
    class FailsAtThree(_ClosingFails):
        count = 0

        def __next__(self):
            self.count += 1
            if self.count == 3:
                raise KeyError("bad item")
            return self.count

    batch_iter = Infinite(FailsAtThree(), batch_size=1, batches_per_epoch=5, combiner=list)
    with pytest.raises(KeyError, match="bad item") as raised:
        list(batch_iter())
    assert isinstance(raised.value.__context__, OSError)


def test_two_open_epochs_share_one_stream():
    with Infinite(itertools.count(), batch_size=1, batches_per_epoch=3,
                  combiner=list) as batch_iter:
        a, b = batch_iter(), batch_iter()
        taken = [next(a), next(b), next(a), next(b)]
    assert taken == [[0], [1], [2], [3]]


def test_a_forgotten_infinite_is_cleaned_up_when_collected(warm_workers):
    def train():
        batch_iter = every_kind()
        list(batch_iter())

    train()
    assert back_to(warm_workers) and fpipe_threads() == []
    batch_iter = every_kind()
    list(batch_iter())
    del batch_iter
    assert back_to(warm_workers)


def test_no_reference_cycle_keeps_it_alive():
    gc.disable()  # so that only reference counting can free it
    try:
        batch_iter = Infinite(itertools.count(), Threads(square, n_workers=2), batch_size=2,
                              batches_per_epoch=2, combiner=list)
        list(batch_iter())
        ref = weakref.ref(batch_iter)
        del batch_iter
        collected = ref() is None
    finally:
        gc.enable()
    assert collected and fpipe_threads() == []


EXIT_SCRIPT = """
import itertools, time
from fpipe import Infinite, Iterator, Loky, Threads

def square(x):
    time.sleep(0.001)
    return x * x

def pairs(items):
    items = iter(items)
    return zip(items, items)

def make():
    return Infinite(itertools.count(), square, Threads(square, n_workers=2),
                    Loky(square, n_workers=2), Iterator(pairs), batch_size=4,
                    batches_per_epoch=3, combiner=list)
"""


@pytest.mark.parametrize("scope", ["module", "function"])
def test_the_interpreter_exits_without_close(scope):
    if scope == "module":
        body = "batch_iter = make()\nlist(batch_iter())\n"
    else:
        body = "def main():\n    batch_iter = make()\n    list(batch_iter())\n    return 0\nmain()\n"
    body += "print(time.monotonic(), flush=True)\n"
    result = subprocess.run([sys.executable, "-c", EXIT_SCRIPT + body], capture_output=True,
                            text=True, timeout=60)
    ended = time.monotonic()
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # a hang, not slowness: exit takes well under a second on an idle machine and seconds on
    # a loaded one; time.monotonic() is system-wide on Linux
    assert ended - float(result.stdout) < 30.0


def test_the_interpreter_exits_when_the_loop_is_left_by_an_exception():
    code = textwrap.dedent("""
    import itertools
    from fpipe import Infinite, Threads

    def train():
        batch_iter = Infinite(itertools.count(), Threads(abs, n_workers=2), batch_size=4,
                              batches_per_epoch=3, combiner=list)
        for batch in batch_iter():
            raise SystemExit(7)
    train()
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 7 and result.stderr == ""


# --- errors -------------------------------------------------------------------------------------


def bad_predicate(chunk, item):
    if item == 5:
        raise KeyError(f"bad item {item}")
    return len(chunk) < 2


def raising_source():
    yield from range(5)
    raise KeyError("bad item 5")


def failing_iterator(items):
    for item in items:
        yield fail_at(item)


KINDS = {
    "source": lambda: Infinite(raising_source(), batch_size=2, batches_per_epoch=9,
                               combiner=list),
    "function": lambda: Infinite(itertools.count(), fail_at, batch_size=2, batches_per_epoch=9,
                                 combiner=list),
    "Threads": lambda: Infinite(itertools.count(), Threads(fail_at, n_workers=2), batch_size=2,
                                batches_per_epoch=9, combiner=list),
    "Loky": lambda: Infinite(itertools.count(), Loky(fail_at, n_workers=2), batch_size=2,
                             batches_per_epoch=9, combiner=list),
    "processes": lambda: Infinite(itertools.count(), processes(fail_at, n_workers=2),
                                  batch_size=2, batches_per_epoch=9, combiner=list),
    "Iterator": lambda: Infinite(itertools.count(), Iterator(failing_iterator), batch_size=2,
                                 batches_per_epoch=9, combiner=list),
    "Iterator(n_workers=2)": lambda: Infinite(itertools.count(),
                                              Iterator(failing_iterator, n_workers=2),
                                              batch_size=2, batches_per_epoch=9, combiner=list),
    "batch_size": lambda: Infinite(itertools.count(), batch_size=bad_predicate,
                                   batches_per_epoch=9, combiner=list),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_original_exception_reaches_the_caller_and_the_next_epoch_starts_cleanly(
        kind, warm_workers):
    batch_iter = KINDS[kind]()
    got = []
    with pytest.raises(KeyError, match="bad item 5") as info:
        for b in batch_iter():
            got.append(b)
    # every item before the failing one arrives first, the last in a partial batch (a chunked
    # Iterator loses its chunk)
    assert got == ([] if kind == "Iterator(n_workers=2)" else [[0, 1], [2, 3], [4]])
    text = "".join(traceback.format_exception(info.value))
    assert "fail_at" in text or "raising_source" in text or "bad_predicate" in text
    assert fpipe_threads() == []  # the failed pipeline is closed
    if kind == "source":  # a generator that raised has ended: an empty epoch, said once
        with pytest.warns(RuntimeWarning, match="gave no items"):
            after = list(batch_iter())
    else:
        after = list(batch_iter())  # starts cleanly: the iterator source goes on past the bad item
    assert len(after) == 9 or kind == "source"
    assert all(5 not in b for b in after)
    batch_iter.close()
    assert back_to(warm_workers)


def test_a_worker_error_carries_the_worker_traceback():
    batch_iter = KINDS["Loky"]()
    with pytest.raises(KeyError) as info:
        list(batch_iter())
    text = "".join(traceback.format_exception(info.value))
    assert "RemoteTraceback" in text and 'raise KeyError(f"bad item {x}")' in text
    # once, whole: the worker's traceback, then the error raised here (not again for each
    # background stage that the error crossed on its way)
    assert text.count("KeyError: 'bad item 5'") == 2 and text.count("errors.RemoteTraceback:") == 1
    batch_iter.close()


def test_a_failing_combiner():
    batch_iter = Infinite(itertools.count(), batch_size=3, batches_per_epoch=2,
                          combiner=fail_on_batch)
    with pytest.raises(ZeroDivisionError, match="cannot combine 3 items"):
        list(batch_iter())
    with pytest.raises(ZeroDivisionError):  # every epoch fails the same way, none hangs
        list(batch_iter())
    batch_iter.close()
    stage = Threads(fail_on_batch, n_workers=2)
    with Infinite(range(4), batch_size=2, batches_per_epoch=2, combiner=stage) as batch_iter:
        with pytest.raises(ZeroDivisionError, match="cannot combine 2 items"):
            list(batch_iter())


def test_an_interrupted_epoch_closes_the_pipeline():
    def interrupting(x):
        if x == 3:
            raise KeyboardInterrupt
        return x

    batch_iter = Infinite(itertools.count(), Threads(interrupting), batch_size=1,
                          batches_per_epoch=9, combiner=list)
    with pytest.raises(KeyboardInterrupt):
        list(batch_iter())
    assert fpipe_threads() == []
    batch_iter.close()


def test_stats_report_every_stage():
    batch_iter = Infinite(itertools.count(), square, Threads(square, n_workers=2), batch_size=4,
                          batches_per_epoch=5, combiner=list)
    assert list(batch_iter.stats()) == []
    list(batch_iter())
    table = batch_iter.stats()
    names = [row.name for row in table]
    assert names == ["source(count)", "map(square)", "threads(square, n_workers=2)", "batch(4)",
                     "map(list)", "prefetch(2)"]
    assert table[-1].items >= 5 and "bottleneck" in str(table)
    batch_iter.close()
    assert [row.name for row in batch_iter.stats()] == names  # the last pipeline's, after close
