"""One stream read from several threads: the readers take turns, each item goes to exactly one
of them, and closing the stream from any thread lets every reader go."""

import threading

import pytest
from toolz import pipe

import fpipe as fp

from .helpers import double

DEADLINE = 60.0


def read_together(stream, readers, use_pull=False):
    """Every reader's items, read by ``readers`` threads at once."""
    got = [[] for _ in range(readers)]
    errors = []

    def read(mine):
        try:
            if use_pull:
                while chunk := stream.pull(7):
                    mine.extend(chunk)
            else:
                mine.extend(stream)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)

    threads = [threading.Thread(target=read, args=(mine,), daemon=True) for mine in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert not any(thread.is_alive() for thread in threads), "a reader hangs"
    assert not errors, errors
    return got


@pytest.mark.parametrize("stages", [
    [fp.stream.map(double)],
    [fp.stream.map(double), fp.stream.filter(lambda x: x % 3), fp.batch(5), fp.unbatch()],
    [fp.threads(double, n_workers=2)],
    [fp.prefetch(16), fp.stream.map(double)],
], ids=["map", "map filter batch unbatch", "threads", "prefetch map"])
@pytest.mark.parametrize("use_pull", [False, True], ids=["next", "pull"])
def test_readers_in_several_threads_share_the_items_without_loss(stages, use_pull):
    n = 200_000
    expected = pipe(range(n), *stages)
    expected = list(expected)
    got = read_together(pipe(list(range(n)), *stages), 3, use_pull)
    everything = [x for mine in got for x in mine]
    assert sorted(everything) == sorted(expected)
    position = {x: i for i, x in enumerate(expected)}
    for mine in got:  # each reader sees its items in the stream's order
        assert [position[x] for x in mine] == sorted(position[x] for x in mine)


def test_readers_of_a_generator_share_its_items():
    got = read_together(fp.stream.map(double)(x for x in range(20_000)), 4)
    assert sorted(x for mine in got for x in mine) == [2 * x for x in range(20_000)]


@pytest.mark.parametrize("stage", [fp.prefetch(2), fp.threads(abs, n_workers=2),
                                   fp.processes(abs, n_workers=2, backend="threading")],
                         ids=repr)
def test_closing_lets_every_waiting_reader_go(stage):
    release = threading.Event()

    def source():
        yield 0
        release.wait(DEADLINE)  # the readers wait for the next item until the stream closes
        yield 1

    stream = stage(source())
    assert next(stream) == 0
    got, done = [], []

    def read():
        got.extend(stream)
        done.append(True)

    readers = [threading.Thread(target=read, daemon=True) for _ in range(3)]
    for reader in readers:
        reader.start()
    stream.close()
    release.set()
    for reader in readers:
        reader.join(DEADLINE)
    assert len(done) == 3 and got == []
