"""The stream protocol and the stages that run in the consumer's thread."""

import functools
import inspect
import itertools
import pickle

import pytest
from toolz import pipe

import fpipe as fp
from fpipe.stream import Stream

from .helpers import double, fail_at, maybe_negate, noisy


def test_a_pipeline_is_a_lazy_stream():
    log = []

    def source():
        log.append("started")
        yield from range(5)

    stream = pipe(source(), fp.stream.map(double), fp.stream.filter(bool), fp.take(3))
    assert isinstance(stream, Stream) and log == []
    assert list(stream) == [2, 4, 6] and log == ["started"]


def test_stage_and_stream_are_abstract_and_subclasses_fill_them_in():
    with pytest.raises(TypeError, match="apply"):
        fp.Stage()

    class NoPull(Stream):
        pass

    with pytest.raises(TypeError, match="_pull"):
        NoPull(None, "no pull")

    class Doubled(fp.Stage):
        def apply(self, iterable, *, epoch=0, start=0):
            return fp.stream.map(double).apply(iterable, epoch=epoch, start=start)

    assert list(Doubled()(range(3))) == [0, 2, 4]
    for stage in (fp.stream.map(double), fp.threads(double, n_workers=2), fp.batch(2)):
        assert list(pickle.loads(pickle.dumps(stage))(range(3))) == list(stage(range(3)))


def test_pull_returns_between_one_and_n_items_then_empty():
    stream = fp.stream.map(double)(range(5))
    assert stream.pull(2) == [0, 2]
    assert stream.pull(10) == [4, 6, 8]
    assert stream.pull(3) == [] and stream.pull(3) == []


def test_next_and_pull_share_one_position():
    stream = fp.as_stream(range(10))
    assert next(stream) == 0
    assert stream.pull(2) == [1, 2]
    assert next(stream) == 3 and list(stream) == [4, 5, 6, 7, 8, 9]


def test_filter_keeps_what_the_predicate_accepts_across_chunks():
    stream = fp.stream.filter(lambda x: x % 100 == 0)(range(1000))
    assert list(stream) == list(range(0, 1000, 100))


def test_take_reads_no_more_than_n_items():
    source = iter(range(10))
    assert list(fp.take(3)(source)) == [0, 1, 2]
    assert next(source) == 3


def test_map_passes_extra_arguments_after_the_item():
    assert list(fp.stream.map(pow, 2)(range(4))) == [0, 1, 4, 9]
    assert list(fp.stream.map(int, base=2)(["10", "11"])) == [2, 3]


def test_transform_stream_hands_over_the_whole_stream():
    def running_sum(items, start):
        total = start
        for x in items:
            total += x
            yield total

    assert list(fp.transform_stream(running_sum, 100)(range(4))) == [100, 101, 103, 106]
    assert list(fp.transform_stream(itertools.chain.from_iterable)([[1], [2, 3]])) == [1, 2, 3]


def test_closing_a_pipeline_closes_its_source():
    closed = []

    def source():
        try:
            yield from itertools.count()
        finally:
            closed.append(True)

    with pipe(source(), fp.stream.map(double), fp.stream.filter(bool)) as stream:
        assert next(stream) == 2
    assert closed == [True]
    assert stream.pull(1) == [] and list(stream) == []


def test_close_twice_and_close_before_start_do_nothing():
    stream = fp.stream.map(double)(range(3))
    stream.close()
    stream.close()
    assert list(stream) == []


@pytest.mark.parametrize("stage, before", [
    (fp.stream.map(fail_at), list(range(7))),
    (fp.stream.filter(fail_at), list(range(1, 7))),
    (fp.transform_stream(lambda items: map(fail_at, items)), list(range(7))),
])
def test_an_error_arrives_after_the_items_before_it(stage, before):
    got = []
    with pytest.raises(KeyError, match="bad item 7"):
        for x in stage(range(20)):
            got.append(x)
    assert got == before


def test_an_error_in_the_source_arrives_after_its_items_and_closes_the_stream():
    def source():
        yield from range(3)
        raise OSError("disk gone")

    stream = pipe(source(), fp.stream.map(double))
    got = []
    with pytest.raises(OSError, match="disk gone"):
        for x in stream:
            got.append(x)
    assert got == [0, 2, 4] and list(stream) == []


def test_epochs_count_applications_and_can_be_set():
    stage = fp.stream.map(noisy, seed=3)
    first, second = list(stage(range(4))), list(stage(range(4)))
    assert first != second and stage.epoch == 2
    stage.set_epoch(0)
    assert list(stage(range(4))) == first
    assert list(stage.apply(range(4), epoch=1)) == second and stage.epoch == 1


def test_apply_start_numbers_the_items_for_resuming():
    stage = fp.stream.map(noisy, seed=3)
    whole = list(stage.apply(range(10)))
    assert list(stage.apply(range(6, 10), start=6)) == whole[6:]


def test_a_seeded_map_draws_from_each_items_generator():
    outputs = [list(fp.stream.map(maybe_negate, seed=11)(range(1, 50))) for _ in range(2)]
    assert outputs[0] == outputs[1]
    assert {x < 0 for x in outputs[0]} == {True, False}


def test_unseeded_stages_leave_randomness_to_fresh_entropy():
    assert list(fp.stream.map(noisy)(range(3))) != list(fp.stream.map(noisy)(range(3)))


@pytest.mark.parametrize("make, message", [
    (lambda: fp.stream.map(3), "func must be callable; got func=3"),
    (lambda: fp.stream.filter(None), "predicate must be callable"),
    (lambda: fp.take(-1), "n must be >= 0; got n=-1"),
    (lambda: fp.take(2.5), "n must be an integer; got n=2.5"),
    (lambda: fp.prefetch(0), "n must be >= 1; got n=0"),
    (lambda: fp.stream.map(double).set_epoch(-1), "epoch must be >= 0"),
])
def test_bad_arguments_are_rejected_at_construction(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def load(path):
    return path


@pytest.mark.parametrize("make, message", [
    (lambda: fp.threads(load, 2), r"threads\(load, 2\): threads takes the function alone: give "
                                  r"it its arguments with functools.partial\(load, 2\), or did "
                                  r"you mean threads\(load, n_workers=2\)\?"),
    (lambda: fp.processes(load, 4), r"did you mean processes\(load, n_workers=4\)\?"),
    (lambda: fp.threads(functools.partial(load, 2)), r"threads\(partial\(load, 2\)\): "
                                                     r"partial\(load, 2\)\(item\) does not fit "
                                                     r"partial\(load, 2\)'s signature \(too many "
                                                     r"positional arguments\)$"),
    (lambda: fp.Threads(load, 2), r"did you mean threads\(load, n_workers=2\)\?"),
    (lambda: fp.stream.map(load, 2), r"map\(load, 2\): load\(item, 2\) does not fit"),
    (lambda: fp.threads(load, size=3), r"threads\(\) got an unexpected keyword argument 'size': "
                                       r"its options are n_workers, .*; the function's own "
                                       r"keywords go in with functools.partial\(func, size=...\)"),
    (lambda: fp.processes(load, "x"), r"processes takes the function alone: give it its "
                                      r"arguments with functools.partial\(load, 'x'\)$"),
    (lambda: fp.threads(load, shared_memory=False), r"threads\(\) got an unexpected keyword "
                                                    r"argument 'shared_memory': pass "
                                                    r"options=ParallelOptions\(shared_memory=False\)"),
    (lambda: fp.processes(load, buffer_size=4), r"'buffer_size': pass buffer_chunks=4 \(the "
                                                r"same count, in chunks\)"),
    (lambda: fp.threads(load, options=fp.ParallelOptions(shared_memory=False)),
     r"shared_memory of ParallelOptions are options of processes"),
    (lambda: fp.transform_stream(load, 1), r"load\(stream, 1\) does not fit"),
])
def test_arguments_that_the_function_cannot_take_are_rejected_at_construction(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_arguments_the_function_takes_and_functions_without_signatures_pass():
    import numpy as np

    class Scaled:
        def __call__(self, x, factor=2):
            return x * factor

    assert list(fp.threads(functools.partial(pow, exp=2))(range(3))) == [0, 1, 4]
    assert list(fp.stream.map(Scaled(), factor=3)([1])) == [3]
    assert list(fp.stream.map(np.sqrt)([4.0])) == [2.0]  # a ufunc has no signature to check


def test_stages_and_streams_have_readable_reprs():
    assert repr(fp.stream.map(pow, 2, seed=5)) == "map(pow, 2, seed=5)"
    assert repr(fp.stream.filter(bool)) == "filter(bool)" and repr(fp.take(3)) == "take(3)"
    assert repr(fp.take(3)([])) == "<take(3) stream>"


# --- the contract for writing a stream, and the queue messages of background stages -------


class _Halving(Stream):
    """A stream written against the contract alone: pull_upstream and defer_error."""

    def _pull(self, n):
        items = []
        try:
            items.extend(10 // x for x in self.pull_upstream(n))
        except ZeroDivisionError as error:
            if not self.defer_error(error, items):
                raise
        return items


def test_a_stream_written_against_the_contract_delivers_then_raises():
    stream = _Halving(fp.as_stream([1, 2, 0, 5]), "halving")
    assert stream.pull(4) == [10, 5]
    with pytest.raises(ZeroDivisionError):
        stream.pull(4)
    assert stream.closed and stream.pull(4) == []
    assert [row.name for row in fp.stats(stream)] == ["source(list)", "halving"]


def test_read_ahead_counts_what_next_holds_back_and_can_be_discarded():
    stream = fp.as_stream(range(100))
    assert [next(stream), next(stream)] == [0, 1]  # the second next() reads ahead
    held = stream.read_ahead
    assert held >= 1
    stream.discard_read_ahead()
    assert stream.read_ahead == 0 and next(stream) == 2 + held


def test_reads_passes_on_waiting_for_other_threads():
    class Reader(Stream):
        def _pull(self, n):
            return []

    reader = Reader(None, "reader")
    assert not reader.waits
    reader.reads(fp.prefetch(2)([1]))
    assert reader.waits


def test_queue_messages_say_what_they_are():
    from fpipe.errors import capture
    from fpipe.stream.parallel._messages import Message

    end, wake = Message.end(3, 2), Message.wake()
    failure = Message.failure(capture(ValueError("x")))
    result = Message(0, [1], None, 0.1, 1)
    assert (end.is_end, end.is_failure, end.is_wake) == (True, False, False)
    assert (wake.is_end, wake.is_failure, wake.is_wake) == (False, False, True)
    assert (failure.is_end, failure.is_failure, failure.is_wake) == (False, True, False)
    assert not (result.is_end or result.is_failure or result.is_wake)


@pytest.mark.parametrize("factory", [fp.stream.map, fp.threads, fp.processes])
def test_epoch_sets_the_first_application_and_is_checked(factory):
    stage = factory(abs, epoch=3)
    assert stage.epoch == 3
    with pytest.raises(ValueError, match="epoch must be >= 0; got epoch=-1"):
        factory(abs, epoch=-1)
    with pytest.raises(TypeError, match="epoch must be an integer"):
        factory(abs, epoch=1.0)


def test_the_dpipe_classes_still_pass_epoch_to_the_function():
    def tagged(x, epoch):
        return (x, epoch)

    assert list(fp.Threads(tagged, epoch=5)([1, 2])) == [(1, 5), (2, 5)]


def _size(func) -> tuple[int, list[str]]:
    """The parameters of ``func`` but ``*args`` and ``**kwargs``, and the names of those two."""
    parameters = inspect.signature(func).parameters.values()
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return (sum(p.kind not in variadic for p in parameters),
            [p.name for p in parameters if p.kind in variadic])


def test_the_public_callables_of_the_stream_package_take_at_most_ten_parameters():
    sizes = {name: _size(getattr(fp.stream, name)) for name in fp.stream.__all__
             if callable(getattr(fp.stream, name))}
    assert {name: size for name, size in sizes.items() if size[0] > 10} == {}
    # the background stages take their function alone: its arguments go in with partial
    assert sizes["threads"][1] == sizes["processes"][1] == []


def test_dpipe_stage_classes_keep_their_signatures():
    for cls in (fp.Threads, fp.Loky, fp.Iterator):
        parameters = inspect.signature(cls).parameters
        assert list(parameters)[1:3] == ["args", "n_workers"] and "buffer_size" in parameters
        assert list(parameters)[-1] == "kwargs"
