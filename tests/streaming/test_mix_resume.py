"""A weighted mix over three sources, stopped in the middle of its second epoch, resumes exactly:
directly, and through an Infinite whose items go through worker processes."""

import itertools
import json

import pytest

import fpipe as fp

from .helpers import double

SOURCES = (list(range(0, 7)), range(100, 113), tuple(range(200, 229)))  # different lengths
WEIGHTS = [(0, [1, 2, 3]), (40, [3, 1, 1]), (90, [1, 1, 4])]  # a schedule by step


def make_mix(seed=4, epoch=0, until="never", weights=WEIGHTS):
    return fp.mix(*SOURCES, weights=weights, seed=seed, until=until, epoch=epoch)


@pytest.mark.parametrize("epoch", [0, 1])
@pytest.mark.parametrize("stop", [0, 1, 9, 55, 130])
def test_a_mix_resumes_at_any_position(epoch, stop):
    whole = make_mix(epoch=epoch).pull(200)
    first = make_mix(epoch=epoch)
    got = []
    while len(got) < stop:
        got.extend(first.pull(stop - len(got)))
    state = json.loads(json.dumps(first.state_dict()))  # plain data, a few counters
    second = make_mix(seed=99)
    second.load_state_dict(state)
    assert got + second.pull(200 - stop) == whole
    jumped = make_mix(seed=98)
    jumped.load_state_dict({**make_mix(epoch=epoch).state_dict(), "position": stop})
    assert jumped.pull(200 - stop) == whole[stop:]


def test_the_last_stop_falls_in_a_later_epoch_of_every_source():
    mix = make_mix()
    mix.pull(130)
    taken = mix.state_dict()["taken"]
    assert all(t > len(s) for t, s in zip(taken, SOURCES))


def test_epochs_draw_anew():
    assert make_mix(epoch=0).pull(50) != make_mix(epoch=1).pull(50)
    assert make_mix(epoch=1).pull(50) == make_mix(epoch=1).pull(50)


@pytest.mark.parametrize("until", ["first", "all"])
def test_a_mix_resumes_across_the_end_of_a_source(until):
    whole = list(make_mix(until=until, weights=[1, 2, 3]))
    for stop in [5, 20, len(whole) - 1]:
        first = make_mix(until=until, weights=[1, 2, 3])
        got = [next(first) for _ in range(stop)]
        second = make_mix(seed=0, until=until, weights=[1, 2, 3])
        second.load_state_dict(first.state_dict())
        assert got + list(second) == whole


def test_stream_sources_are_restored_from_their_own_state():
    def make():
        return fp.mix(fp.sample(range(10), seed=1), fp.sample("abc", random_state=2),
                      fp.mix([1, 2, 3], "xy", until="never", seed=3), weights=[1, 1, 2], seed=0)

    whole = make().pull(300)
    first = make()
    got = [next(first) for _ in range(120)]
    second = make()
    second.load_state_dict(first.state_dict())
    assert got + second.pull(180) == whole
    # an iterator is a stream that counts what it gave: a fresh one skips as many
    whole = list(fp.mix(iter(range(20)), [30, 31, 32], seed=5, until="all"))
    first = fp.mix(iter(range(20)), [30, 31, 32], seed=5, until="all")
    got = [next(first) for _ in range(7)]
    second = fp.mix(iter(range(20)), [30, 31, 32], seed=5, until="all")
    second.load_state_dict(first.state_dict())
    assert got + list(second) == whole
    # work in threads cannot name its place: refused, naming the stage
    with pytest.raises(TypeError, match=r"cannot save its place"):
        fp.mix(fp.threads(abs)(range(3)), [3]).state_dict()


def batch_iter(seed=4):
    return fp.Infinite(make_mix(seed=seed), fp.processes(double, n_workers=2),
                       batch_size=4, batches_per_epoch=6, combiner=list)


def test_an_infinite_with_worker_processes_resumes_the_mix_in_its_second_epoch():
    with batch_iter() as whole_run:
        whole = [b for _ in range(3) for b in whole_run()]
    with batch_iter() as first:
        done = list(first())
        epoch = first()
        done += [next(epoch), next(epoch)]  # the middle of the second epoch
        epoch.close()
        state = json.loads(json.dumps(first.state_dict()))
    assert done == whole[:8]
    with batch_iter(seed=0) as second:
        second.load_state_dict(state)
        rest = list(itertools.islice(second(), 4)) + list(second())
    assert done + rest == whole
