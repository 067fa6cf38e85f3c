"""Examples for fpipe.sharding: the strided stage, contiguous ranges, even shards, bad arguments."""

import pickle

import numpy as np
import pytest

from fpipe.sharding import shard, shard_range


def test_strided_shards_take_every_count_th_element():
    assert [list(shard(i, 4)(range(10))) for i in range(4)] == [
        [0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


def test_shard_is_lazy_and_reads_only_what_it_needs():
    pulled = []

    def source():
        for x in range(100):
            pulled.append(x)
            yield x

    stream = shard(1, 3)(source())
    assert pulled == []
    assert next(stream) == 1
    assert pulled == [0, 1]


def test_shard_works_on_infinite_streams():
    from itertools import count, islice
    assert list(islice(shard(2, 5)(count()), 3)) == [2, 7, 12]
    assert list(islice(shard(2, 5, even="drop")(count()), 3)) == [2, 7, 12]
    assert list(islice(shard(2, 5, even="pad")(count()), 3)) == [2, 7, 12]


def test_closing_the_shard_closes_its_input():
    closed = []

    def source():
        try:
            yield from range(10)
        finally:
            closed.append(True)

    stream = shard(0, 2)(source())
    next(stream)
    stream.close()
    assert closed == [True]


def test_drop_cuts_every_shard_to_the_shortest():
    shards = [list(shard(i, 3, even="drop")(range(7))) for i in range(3)]
    assert shards == [[0, 3], [1, 4], [2, 5]]


def test_pad_repeats_the_first_elements_like_distributed_sampler():
    shards = [list(shard(i, 4, even="pad")("abcdef")) for i in range(4)]
    assert shards == [["a", "e"], ["b", "f"], ["c", "a"], ["d", "b"]]


def test_pad_with_fewer_elements_than_shards_cycles_the_input():
    assert [list(shard(i, 5, even="pad")("ab")) for i in range(5)] == [
        ["a"], ["b"], ["a"], ["b"], ["a"]]


def test_even_options_on_empty_input_give_empty_shards():
    for even in (None, "drop", "pad"):
        assert list(shard(0, 3, even=even)([])) == []


def test_the_stage_pickles_and_says_what_it_is():
    stage = pickle.loads(pickle.dumps(shard(1, 3, even="pad")))
    assert list(stage(range(5))) == [1, 4]
    assert repr(stage) == "shard(1, 3, even='pad')"


def test_numpy_integers_are_accepted():
    assert list(shard(np.int64(1), np.int32(2))(range(4))) == [1, 3]
    assert shard_range(np.int64(4), np.int8(1), np.uint16(2)) == range(2, 4)


@pytest.mark.parametrize(("index", "count", "message"), [
    (-1, 3, "index must be in [0, count); got index=-1 with count=3"),
    (3, 3, "index must be in [0, count); got index=3 with count=3"),
    (0, 0, "count must be >= 1; got count=0"),
    (0, -2, "count must be >= 1; got count=-2"),
    (1.0, 3, "index must be an integer; got index=1.0"),
    (0, 2.5, "count must be an integer; got count=2.5"),
    ("0", 3, "index must be an integer; got index='0'"),
    (True, 3, "index must be an integer; got index=True"),
])
def test_bad_arguments_are_rejected_at_the_call(index, count, message):
    # the house rule: a wrong type is a TypeError, a bad value a ValueError
    error = TypeError if "must be an integer" in message else ValueError
    with pytest.raises(error, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        shard(index, count)
    with pytest.raises(error, match="must be"):
        shard_range(10, index, count)


def test_bad_even_rounding_and_n_are_rejected():
    with pytest.raises(ValueError, match="even must be None, 'drop' or 'pad'; got even='all'"):
        shard(0, 2, even="all")
    with pytest.raises(ValueError, match="rounding must be"):
        shard_range(5, 0, 2, rounding="up")
    with pytest.raises(ValueError, match="n must be >= 0; got n=-1"):
        shard_range(-1, 0, 2)
    with pytest.raises(TypeError, match="n must be an integer; got n=5.0"):
        shard_range(5.0, 0, 2)


def test_datadings_rounding_matches_its_verified_examples():
    # datadings-notes 2: n=10 over 4 shards, and n=10 over 3 workers
    assert [shard_range(10, i, 4, rounding="datadings") for i in range(4)] == [
        range(0, 2), range(2, 5), range(5, 8), range(8, 10)]
    assert [shard_range(10, i, 3, rounding="datadings") for i in range(3)] == [
        range(0, 3), range(3, 7), range(7, 10)]


def test_datadings_rounding_agrees_with_datadings_itself():
    torch = pytest.importorskip("torch")
    datadings_torch = pytest.importorskip("datadings.torch")
    del torch
    for n in (0, 1, 7, 10, 98, 100, 1001):
        for count in (1, 2, 3, 4, 7):
            for index in range(count):
                dataset = datadings_torch.IterableDataset(list(range(n)))
                dataset.world_size, dataset.rank = count, index
                start, stop = dataset._start_stop()
                assert shard_range(n, index, count, rounding="datadings") == range(start, stop)


def test_more_shards_than_elements_gives_empty_ranges_not_errors():
    assert [shard_range(2, i, 4) for i in range(4)] == [
        range(0, 1), range(1, 2), range(2, 2), range(2, 2)]
    assert [len(shard_range(2, i, 4, even="pad")) for i in range(4)] == [1, 1, 1, 1]
    assert [len(shard_range(2, i, 4, even="drop")) for i in range(4)] == [0, 0, 0, 0]


def test_contiguous_even_options():
    assert [shard_range(7, i, 3, even="drop") for i in range(3)] == [
        range(0, 2), range(3, 5), range(5, 7)]
    # a short shard takes in the last index of its left neighbour
    assert [shard_range(7, i, 3, even="pad") for i in range(3)] == [
        range(0, 3), range(2, 5), range(4, 7)]
