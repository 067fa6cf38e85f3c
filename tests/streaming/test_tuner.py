"""n_workers="auto", buffer_chunks="auto", cpu_budget and memory_budget: the tuner's decisions on
windows of measurements made up here (no clock is read), the stages that run them, and the
argument checks."""

import functools
import re
import sys
import threading
import types
from unittest import mock

import numpy as np
import pytest

import fpipe as fp
from fpipe.stream.parallel import _tuner
from fpipe.stream.parallel._shm import is_shared
from fpipe.stream.parallel._tuner import Gauge, Limits, Setting, Tuner, Watch, Window

from .helpers import double, large


def limits(**changes):
    values = {"workers": None, "buffer": None, "cpu": 2.0, "memory": None, "most": 64,
              "per_worker": 1}
    return Limits(**{**values, **changes})


def window(seconds=0.1, items=100, work_per_item=0.01, cpu_share=1.0, queued=0.0,
           starved=0.0, reading=0.0, waited_room=0.0, item_bytes=1000):
    """A window of ``seconds`` in which the consumer took ``items`` and the workers did as
    many, each ``work_per_item`` seconds, ``cpu_share`` of them on a core."""
    work = items * work_per_item
    return Window(seconds, items, max(1, items // 10), items, work + queued * items,
                  work * cpu_share, queued * items, starved * seconds, reading * seconds,
                  waited_room * seconds, item_bytes)


def test_a_waiting_consumer_gets_as_many_workers_as_the_cores_run():
    cpu_bound = Tuner(limits())
    assert cpu_bound.decide(window(starved=0.5)).workers == 2
    assert "2 cores" in cpu_bound.history[-1].reason
    waiting_for_io = Tuner(limits())
    assert waiting_for_io.decide(window(starved=0.5, cpu_share=0.01)).workers == 64
    half = Tuner(limits(cpu=3.0))
    assert half.decide(window(starved=0.5, cpu_share=0.5)).workers == 6
    processes = Tuner(limits(most=2, per_worker=2))
    assert processes.decide(window(starved=0.5, cpu_share=0.01)) == Setting(2, 2, 6)


def test_time_waiting_for_a_core_is_not_taken_for_io():
    # 10 ms on a core and 30 ms in the run queue per item: one core's worth per worker
    tuner = Tuner(limits())
    assert tuner.decide(window(starved=0.5, work_per_item=0.01, queued=0.03)).workers == 2


def test_a_slow_consumer_gets_no_more_workers_than_keep_up_with_it():
    tuner = Tuner(limits(), start=Setting(16, 2, 18))
    # 100 items/s, 10 ms each: one worker busy; with the margin, 2; shrinking by half at most
    assert [tuner.decide(window(items=10)).workers for _ in range(4)] == [8, 4, 2, 2]
    assert "keep 1.00 workers busy" in tuner.history[-1].reason
    assert Tuner(limits()).decide(window(items=10)).workers == 2


def test_a_slower_upstream_is_not_answered_with_workers():
    tuner = Tuner(limits(), start=Setting(3, 2, 5))
    setting = tuner.decide(window(items=10, starved=0.9, reading=0.95))
    assert setting.workers == 2 and "upstream is slower" in tuner.history[-1].reason


def test_a_growth_that_does_not_pay_is_undone_and_tried_again_later():
    tuner = Tuner(limits())
    assert tuner.decide(window(starved=0.5)).workers == 2  # from 1: 100 items/s
    assert tuner.decide(window(starved=0.5, items=105)).workers == 1  # 2 made 105: back
    assert "not more than 1 did" in tuner.history[-1].reason
    held = [tuner.decide(window(starved=0.5)).workers for _ in range(10)]
    assert held[:8] == [1] * 8 and held[-1] == 2
    grown = Tuner(limits())
    grown.decide(window(starved=0.5))
    assert grown.decide(window(starved=0.5, items=190)).workers == 2  # it paid: kept


def test_the_buffer_grows_while_the_consumer_and_the_workers_wait():
    tuner = Tuner(limits(workers=2))
    buffers = [tuner.decide(window(starved=0.5, waited_room=0.5)).buffer for _ in range(4)]
    assert buffers == [4, 8, 8, 8]
    assert Tuner(limits(workers=2)).decide(window(starved=0.5)).buffer == 2
    assert Tuner(limits(workers=2, buffer=1)).decide(window(starved=0.5, waited_room=0.5)) \
        == Setting(2, 1, 3)


def test_fixed_settings_stay_as_they_are():
    tuner = Tuner(limits(workers=3, buffer=1))
    assert not tuner.auto and tuner.setting == Setting(3, 1, 4)
    assert tuner.decide(window(starved=0.9, cpu_share=0.01)) == Setting(3, 1, 4)


def test_a_memory_budget_bounds_the_chunks_held_and_their_size():
    mib = 1 << 20
    first = Tuner(limits(memory=512 * mib, most=2, per_worker=2))
    assert first.setting == Setting(1, 2, 1, 1)  # one item until its size is known
    large = first.decide(window(starved=0.5, item_bytes=128 * mib))
    # 128 MiB an item: 3 chunks of one item, and one with the consumer
    assert large == Setting(2, 0, 3, 1)
    assert "fit the memory budget" not in first.history[-1].reason
    small = Tuner(limits(memory=512 * mib, workers=4, buffer=2))
    setting = small.decide(window(item_bytes=1000))
    assert setting.slots == 6 and setting.chunk == 512 * mib // (7 * 1000)
    tight = Tuner(limits(memory=64 * mib, workers=8, buffer=2))
    setting = tight.decide(window(item_bytes=32 * mib))
    assert setting == Setting(1, 0, 1, 1) and "1 fit the memory budget" in tight.history[-1].reason


def _eight_mib(i):
    return np.full(1 << 20, i, np.float64)


def test_the_plan_names_a_byte_budget_in_binary_units_and_counts_in_the_singular():
    stage = fp.threads(_eight_mib, n_workers="auto", options=fp.ParallelOptions(memory_budget=64 << 20))
    with stage(range(40)) as stream:
        total = sum(int(array[0]) for array in stream)
        setting = fp.explain(stream)[-1]
        text = str(fp.explain(stream))
    assert total == 780 and setting.chunk_size == 1
    assert text.splitlines()[1] == ("threads(_eight_mib, n_workers='auto', "
                                    "options=ParallelOptions(memory_budget=64 MiB))")
    # a count of one in the singular ("131.1 items/s" is a rate, not a count)
    assert ", chunks of at most 1 item\n" in text + "\n" and not re.search(r"(?<![\d.])1 items", text)
    assert f"room for {setting.slots} chunk{'' if setting.slots == 1 else 's'} " in text


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_windows_close_after_the_first_chunk_then_on_time_and_chunks():
    clock, decided = FakeClock(), []
    tuner = Tuner(limits())
    watch = Watch(tuner, Gauge(clock), decided.append, lambda: 0, lambda: (0.0, 0.0))
    clock.now = 0.01
    watch.received([1], 0.01, 0.01, 0.0)
    assert tuner.decisions == 1  # the first chunk: as soon as there is a measurement
    for _ in range(10):  # many chunks, too little time
        clock.now += 0.001
        watch.received([1], 0.01, 0.01, 0.0)
    assert tuner.decisions == 1
    clock.now += _tuner.WINDOW_SECONDS
    watch.received([1], 0.01, 0.01, 0.0)
    assert tuner.decisions == 2
    clock.now += _tuner.LONGEST_WINDOW  # a long time, one chunk
    watch.received([1], 0.01, 0.01, 0.0)
    assert tuner.decisions == 3 and tuner.history[-1].window.chunks == 1


def scripted(settings):
    """A Tuner.decide that returns ``settings`` in turn (then the last), so that runs resize
    at every chunk, whatever the clock says."""
    script = iter(settings)

    def decide(self, window):
        self.decisions += 1
        setting = next(script, self.setting)
        self.history.append(_tuner.Decision(setting, "scripted", window))
        return setting
    return decide


def every_chunk():
    return mock.patch.multiple(_tuner, WINDOW_SECONDS=0.0, WINDOW_CHUNKS=1)


@pytest.mark.parametrize("factory", [fp.threads, fp.processes])
def test_a_stage_resized_while_it_runs_keeps_every_item_in_order(factory):
    settings = [Setting(w, b, w * (2 if factory is fp.processes else 1) + b)
                for w, b in [(2, 1), (1, 1), (2, 4), (1, 2), (2, 2)] * 4]
    with every_chunk(), mock.patch.object(Tuner, "decide", scripted(settings)):
        budget = {"cpu_budget": 2} if factory is fp.processes else {}
        stage = factory(double, n_workers="auto", buffer_chunks="auto",
                        options=fp.ParallelOptions(chunk_size=2, **budget))
        with stage(range(300)) as stream:
            assert list(stream) == [2 * x for x in range(300)]
            assert stream.watch.tuner.decisions > 5


def test_threads_come_and_go_as_the_tuner_says():
    settings = [Setting(6, 2, 8)] * 60 + [Setting(1, 2, 3)] * 400
    seen = []

    def work(x):
        seen.append(sum(t.name == "fpipe-worker" for t in threading.enumerate()))
        return x

    with every_chunk(), mock.patch.object(Tuner, "decide", scripted(settings)):
        with fp.threads(work, n_workers="auto",
                        options=fp.ParallelOptions(chunk_size=1))(range(400)) as stream:
            assert list(stream) == list(range(400))
    assert max(seen) == 6 and seen[-1] <= 2


def test_a_memory_budget_bounds_what_a_thread_stage_holds():
    mib, held, lock = 1 << 20, [0, 0], threading.Lock()

    def make(x):
        with lock:
            held[0] += 1
            held[1] = max(held[1], held[0])
        return np.full(4 * mib, x % 256, np.uint8)

    stage = fp.threads(make, n_workers=4, buffer_chunks=4, options=fp.ParallelOptions(memory_budget=48 * mib))
    with stage(range(60)) as stream:
        for array in stream:
            with lock:
                held[0] -= 1
            del array
    # an item counts 8 MiB in the stage (its 4 MiB output, and again on its way); the
    # budget holds six, one of them in the consumer's hands
    assert (held[1] + 1) * 8 * mib <= 48 * mib


def test_explain_shows_the_tuners_choice_and_its_measurements():
    with fp.threads(double, n_workers="auto", buffer_chunks="auto")(range(2000)) as stream:
        assert len(list(stream)) == 2000
        text = str(fp.explain(stream))
    assert "threads(double, n_workers='auto', buffer_chunks='auto')" in text
    assert "(auto: " in text and "measured: " in text and "items/s to the consumer" in text


@pytest.mark.parametrize("options, error, message", [
    ({"n_workers": "all"}, ValueError, "n_workers must be an integer or 'auto'; got n_workers='all'"),
    ({"buffer_size": "max"}, ValueError, "buffer_size must be an integer or 'auto'"),
    ({"buffer_size": 0}, ValueError, "buffer_size must be >= 1"),
    ({"n_workers": "auto", "cpu_budget": 0}, ValueError, "cpu_budget must be > 0"),
    ({"n_workers": "auto", "cpu_budget": "2"}, TypeError, "cpu_budget must be a number"),
    ({"n_workers": 2, "cpu_budget": 2}, ValueError, "with n_workers=2 it has nothing to bound"),
    ({"memory_budget": 512}, ValueError, "memory_budget must be >= 1048576"),
    ({"memory_budget": 1.5e9}, TypeError, "memory_budget must be an integer"),
])
@pytest.mark.parametrize("factory", [fp.threads, fp.processes, fp.Threads, fp.Loky])
def test_settings_and_budgets_are_checked_when_the_stage_is_built(factory, options, error, message):
    def build():
        if factory not in (fp.threads, fp.processes):
            return factory(double, **options)
        # fpipe's own stages: buffer_chunks, and the budgets in their options
        keywords = {"buffer_chunks" if name == "buffer_size" else name: value
                    for name, value in options.items() if not name.endswith("_budget")}
        budgets = {name: value for name, value in options.items() if name.endswith("_budget")}
        return factory(double, **keywords, options=fp.ParallelOptions(**budgets))

    if factory in (fp.threads, fp.processes):
        message = message.replace("buffer_size", "buffer_chunks")
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_auto_settings_and_budgets_show_in_the_repr():
    stage = fp.processes(double, n_workers="auto", buffer_chunks="auto",
                         options=fp.ParallelOptions(cpu_budget=1.5, memory_budget=1 << 30))
    assert repr(stage) == ("processes(double, n_workers='auto', buffer_chunks='auto', "
                           "options=ParallelOptions(cpu_budget=1.5, memory_budget=1 GiB))")


def test_the_stage_classes_of_infinite_take_the_same():
    with fp.Infinite(range(40), fp.Threads(double, n_workers="auto", memory_budget=1 << 26),
                     fp.Loky(double, n_workers="auto", buffer_size="auto", cpu_budget=2),
                     batch_size=8, batches_per_epoch=5, combiner=list) as batch_iter:
        batches = list(batch_iter())
        text = str(batch_iter.explain())
    assert [x for batch in batches for x in batch] == [4 * x for x in range(40)]
    assert "memory_budget=64 MiB" in text and "cpu_budget=2" in text


def doubled_all(items):
    return [2 * x for x in items]


def test_infinites_iterator_takes_the_same():
    with fp.Infinite(range(300), fp.Iterator(doubled_all, n_workers="auto", buffer_size="auto",
                                             cpu_budget=1.5, memory_budget=1 << 26),
                     batch_size=100, batches_per_epoch=3, combiner=list) as batch_iter:
        batches = list(batch_iter())
        text = str(batch_iter.explain())
    assert [x for batch in batches for x in batch] == [2 * x for x in range(300)]
    assert ("threads(doubled_all (per chunk), n_workers='auto', buffer_chunks='auto', "
            "options=ParallelOptions(cpu_budget=1.5, memory_budget=64 MiB))") in text
    assert "(auto: " in text


@pytest.mark.parametrize("options, error, message", [
    ({"n_workers": "all"}, ValueError, "n_workers must be an integer or 'auto'; got n_workers='all'"),
    ({"n_workers": 2, "buffer_size": "max"}, ValueError,
     "buffer_size must be an integer or 'auto'; got buffer_size='max'"),
    ({"memory_budget": 1 << 26}, ValueError,
     "memory_budget bounds the threads of Iterator.*got memory_budget=67108864"),
    ({"cpu_budget": 2}, ValueError, "cpu_budget bounds the threads of Iterator"),
    ({"n_workers": 2, "cpu_budget": 2}, ValueError, "with n_workers=2 it has nothing to bound"),
    ({"n_workers": "auto", "memory_budget": 10}, ValueError, "memory_budget must be >= 1048576"),
])
def test_infinites_iterator_checks_its_settings_and_budgets(options, error, message):
    with pytest.raises(error, match=message):
        fp.Iterator(doubled_all, **options)


def test_in_a_dataloader_worker_the_cores_are_shared_between_the_workers(monkeypatch):
    cores = _tuner.default_cpu_budget()
    info = types.SimpleNamespace(num_workers=2, id=0)
    fake = types.SimpleNamespace(get_worker_info=lambda: info)
    monkeypatch.setitem(sys.modules, "torch.utils.data", fake)
    assert _tuner.default_cpu_budget() == max(1.0, cores / 2)


def test_a_process_stage_within_a_memory_budget_sends_results_in_shared_memory(recwarn):
    mib = 1 << 20
    stage = fp.processes(functools.partial(large, nbytes=8 * mib), n_workers=2, buffer_chunks=4,
                         options=fp.ParallelOptions(memory_budget=96 * mib))
    with stage(range(30)) as stream:
        shared = [is_shared(array) for array in stream]
    # the first results make the slabs (with a copy); none goes through the pipe for want of
    # room: a worker's shared memory is the stage's budget, which bounds its chunks
    assert len(shared) == 30 and all(shared[4:])
    assert not [w for w in recwarn if "no room in shared memory" in str(w.message)]
    setting = fp.explain(stream)[-1]
    # an item counts 16 MiB (8 MiB, and again on its way); besides the chunks held, the budget
    # keeps room for the consumer's and a free slab per worker (2 items): 4 chunks of one
    assert (setting.slots, setting.chunk_size) == (4, 1)
