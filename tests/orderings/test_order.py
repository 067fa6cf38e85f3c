"""Examples for fpipe.orderings.order: the iteration API, random access, epochs, resume, and the
datadings defects that fpipe fixes (notes section 1.5)."""

import copy
import json
import pickle
from itertools import islice

import numpy as np
import pytest

from fpipe.orderings.order import Cycler, QuasiShuffler, Range, Repeater, Shuffler, _Ordering
from property_tests.strategies import IndexReader


def take(ordering, count):
    taken = []
    while len(taken) < count:
        before = len(taken)
        taken.extend(islice(iter(ordering), count - len(taken)))
        if len(taken) == before:
            break
    return taken


def all_kinds(n=20, seed=0):
    reader = IndexReader(n)
    return [Range(reader, 3, 17), Repeater(reader, 2), Cycler(reader), Shuffler(reader, seed),
            QuasiShuffler(reader, 0.25, 4, seed)]


# --- the iteration API ---------------------------------------------------------------------

@pytest.mark.parametrize("ordering", all_kinds(), ids=lambda o: type(o).__name__)
def test_every_ordering_offers_the_reader_iteration_api(ordering):
    first = list(islice(ordering.iter(0), len(ordering)))
    assert list(ordering.iter(2, 6)) == first[2:6]
    keyed = list(ordering.iter(2, 6, yield_key=True))
    assert keyed == [(f"{i:08d}", i) for i in first[2:6]]
    assert list(islice(ordering.iter(0, chunk_size=1), len(ordering))) == first
    assert list(islice(ordering.rawiter(), 3)) == first[:3]


def test_len_is_one_pass():
    reader = IndexReader(20)
    assert [len(o) for o in all_kinds()] == [14, 40, 20, 20, 20]
    assert len(Repeater(Range(reader, 0, 5), 3)) == 15
    assert len(Range(reader, 30)) == 0


def test_windows_follow_range_semantics():
    shuffler = Shuffler(IndexReader(10), seed=1)
    order = list(shuffler.iter(0))
    assert list(shuffler.iter(-3)) == order[-3:]
    assert list(shuffler.iter(4, 100)) == order[4:]
    assert list(shuffler.iter(12)) == []
    assert list(shuffler.iter(6, 2)) == []


def test_options_reach_the_reader():
    class Spy(IndexReader):
        def iter(self, start=None, stop=None, yield_key=False, raw=False, copy=True,
                 chunk_size=16):
            self.options = ("iter", raw, copy, chunk_size)
            return super().iter(start, stop, yield_key, raw, copy, chunk_size)

        def get_slice(self, start, stop, yield_key=False, raw=False, copy=True):
            self.options = ("get_slice", raw, copy)
            return list(super().iter(start, stop, yield_key, raw, copy))

    reader = Spy(10)
    list(Range(reader, 1).iter(raw=True, copy=False, chunk_size=5))
    assert reader.options == ("iter", True, False, 5)
    # datadings ignored copy; a QuasiShuffler reads each chunk with one get_slice
    list(QuasiShuffler(reader, 4, 2, seed=0).iter(copy=False, chunk_size=7))
    assert reader.options == ("get_slice", False, False)


def test_quasi_shuffler_reads_chunks_with_iter_when_the_reader_has_no_get_slice():
    class Plain(IndexReader):
        get_slice = None

    plain, sliced = Plain(50), IndexReader(50)
    orders = [list(QuasiShuffler(r, 8, 4, seed=1)) for r in (plain, sliced)]
    assert orders[0] == orders[1]
    assert sorted(plain.reads) == sorted(sliced.reads)


def test_iterators_are_independent():
    for ordering in all_kinds():
        a, b = iter(ordering), iter(ordering)
        head = [next(a) for _ in range(3)]
        assert [next(b) for _ in range(3)] == head
        assert [next(a) for _ in range(2)] == list(islice(ordering.iter(3), 2))


def test_cycler_is_endless_and_positions_count_on_across_epochs():
    cycler = Cycler(Shuffler(IndexReader(5), seed=2))
    stream = list(islice(iter(cycler), 15))
    assert [sorted(stream[i:i + 5]) for i in (0, 5, 10)] == [list(range(5))] * 3
    assert stream[:5] != stream[5:10]
    assert cycler.epoch == 3
    cycler.set_epoch(0)
    assert list(cycler.iter(3, 12)) == stream[3:12]
    assert list(Cycler(IndexReader(0))) == []


def test_repeater_reads_a_new_epoch_for_every_repetition():
    repeated = list(Repeater(Shuffler(IndexReader(12), seed=4), 3))
    passes = [repeated[i:i + 12] for i in (0, 12, 24)]
    assert all(sorted(p) == list(range(12)) for p in passes)
    assert len({tuple(p) for p in passes}) == 3
    assert list(Repeater(IndexReader(5), 0)) == []


def test_orderings_nest():
    reader = IndexReader(50)
    nested = QuasiShuffler(Range(Shuffler(reader, seed=1), 10, 40), 8, 4, seed=2)
    assert sorted(nested) == sorted(list(Shuffler(reader, seed=1).iter(0))[10:40])


# --- random access -------------------------------------------------------------------------

def test_range_and_shuffler_get_positions_of_the_current_epoch():
    reader = IndexReader(10)
    assert [Range(reader, 4).get(i) for i in (0, -1)] == [4, 9]
    shuffler = Shuffler(reader, seed=5)
    shuffler.set_epoch(3)
    order = list(shuffler.iter(0))
    assert [shuffler.get(i) for i in range(10)] == order
    assert shuffler.get(-1) == order[-1]
    assert shuffler.get(2, yield_key=True) == (f"{order[2]:08d}", order[2])


def test_get_out_of_range_raises_index_error():
    with pytest.raises(IndexError, match=r"index must be in \[-4, 4\); got index=4"):
        Range(IndexReader(10), 2, 6).get(4)
    with pytest.raises(IndexError):
        Shuffler(IndexReader(0), seed=0).get(0)


def test_random_access_needs_a_reader_that_has_it():
    quasi = QuasiShuffler(IndexReader(10), 2, 2, seed=0)
    with pytest.raises(TypeError, match="Shuffler needs a reader with random access"):
        Shuffler(quasi)
    with pytest.raises(TypeError, match="has no random access"):
        Range(quasi).get(0)
    assert Shuffler(Repeater(Range(IndexReader(10), 0, 3), 2), seed=0).get(0) in range(3)


# --- seeds and epochs ----------------------------------------------------------------------

def test_without_a_seed_fresh_entropy_is_drawn_and_kept():
    a, b = Shuffler(IndexReader(30)), Shuffler(IndexReader(30))
    assert isinstance(a.seed, int) and a.seed != b.seed
    assert list(Shuffler(IndexReader(30), seed=a.seed)) == list(a)
    generator_seeded = QuasiShuffler(IndexReader(30), seed=np.random.default_rng(0))
    assert generator_seeded.seed == QuasiShuffler(IndexReader(30),
                                                  seed=np.random.default_rng(0)).seed


@pytest.mark.parametrize("make", [lambda r: Shuffler(r, seed=9),
                                  lambda r: QuasiShuffler(r, 5, 3, seed=9)])
def test_each_pass_is_the_next_epoch_and_set_epoch_goes_back(make):
    shuffler = make(IndexReader(40))
    passes = [list(shuffler) for _ in range(3)]
    assert shuffler.epoch == 3 and len({tuple(p) for p in passes}) == 3
    shuffler.set_epoch(1)
    assert list(shuffler) == passes[1]
    abandoned = iter(shuffler)
    next(abandoned)
    assert shuffler.epoch == 2  # an unfinished pass does not move on
    assert list(make(IndexReader(40)).iter(0)) == passes[0]


def test_moving_the_start_point_during_a_pass_wins_over_the_pass():
    shuffler = Shuffler(IndexReader(6), seed=0)
    stream = iter(shuffler)
    next(stream)
    shuffler.set_epoch(7)
    list(stream)
    assert shuffler.epoch == 7


# --- resume --------------------------------------------------------------------------------

def _resume_everywhere(make, n, limit):
    reference = take(make(None), limit)
    for first in range(limit):
        ordering = make(None)
        ordering.set_epoch(0)
        head = take(ordering, first)
        restored = make(None)
        restored.load_state_dict(json.loads(json.dumps(ordering.state_dict())))
        assert head + take(restored, limit - first) == reference, first


def test_quasi_shuffler_resumes_at_every_position_chunk_boundaries_included():
    # datadings lost one sample and repeated another when resuming at 8, 16, 24, 32 here
    seed = 11
    _resume_everywhere(lambda _: QuasiShuffler(IndexReader(37), 16, 8, seed=seed), 37, 2 * 37 + 5)
    _resume_everywhere(lambda _: QuasiShuffler(IndexReader(37), 64, 8, seed=seed), 37, 40)


def test_quasi_shuffler_seek_equals_the_tail_of_the_pass_for_every_k():
    shuffler = QuasiShuffler(IndexReader(100), 0.2, 8, seed=3)
    whole = list(shuffler.iter(0))
    for k in range(100):
        shuffler.set_epoch(0)  # the previous pass moved the start point on to epoch 1
        shuffler.seek(k)
        assert list(shuffler) == whole[k:], k


def test_shuffler_seek_past_the_end_carries_on_into_the_next_epoch():
    # datadings' Shuffler yielded nothing after seek(k >= n)
    reference = take(Shuffler(IndexReader(10), seed=0), 20)
    shuffler = Shuffler(IndexReader(10), seed=0)
    shuffler.seek(13)
    assert list(shuffler) == reference[13:]
    assert shuffler.epoch == 2


def test_state_dict_is_plain_data_with_the_seeds():
    ordering = Cycler(Range(QuasiShuffler(IndexReader(20), 4, 2, seed=7), 2, 18))
    stream = iter(ordering)
    for _ in range(21):
        next(stream)
    assert ordering.state_dict() == {
        "type": "Cycler", "version": 1, "length": 16, "seed": None, "epoch": 1, "position": 5,
        "reader": {"type": "Range", "version": 1, "length": 16, "start": 2, "stop": 18,
                   "seed": None, "reader": {
                       "type": "QuasiShuffler", "version": 1, "length": 20, "buffer_size": 4,
                       "chunk_size": 2, "seed": 7, "reader": None}}}


def test_state_dict_before_any_iteration_is_the_start_point():
    shuffler = Shuffler(IndexReader(10), seed=1)
    shuffler.seek(4)
    assert (shuffler.state_dict()["epoch"], shuffler.state_dict()["position"]) == (0, 4)


def test_loading_a_state_of_another_ordering_is_refused():
    state = Shuffler(IndexReader(10), seed=1).state_dict()
    with pytest.raises(ValueError, match="state is the state of a 'Shuffler', not of a QuasiShuffler"):
        QuasiShuffler(IndexReader(10)).load_state_dict(state)
    with pytest.raises(ValueError, match="state is of a Shuffler with length=10; this one has length=11"):
        Shuffler(IndexReader(11)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state\['position'\] must be < 10; got 10"):
        Shuffler(IndexReader(10)).load_state_dict({**state, "position": 10})
    with pytest.raises(TypeError, match="state must be a dict"):
        Shuffler(IndexReader(10)).load_state_dict([0, 1])


def test_orderings_pickle_and_copy_with_their_start_point():
    shuffler = QuasiShuffler(IndexReader(30), 6, 3, seed=5)
    shuffler.seek(7)
    expected = list(QuasiShuffler(IndexReader(30), 6, 3, seed=5).iter(7))
    assert list(pickle.loads(pickle.dumps(shuffler))) == expected
    assert list(copy.copy(shuffler)) == expected


def test_an_ordering_must_say_its_length_and_how_it_reads():
    class LengthOnly(_Ordering):
        def __len__(self):
            return 3

    with pytest.raises(TypeError, match="_read"):
        LengthOnly(IndexReader(3))


# --- QuasiShuffler specifics ---------------------------------------------------------------

def test_a_fractional_buffer_is_that_fraction_rounded_up_to_whole_chunks():
    # datadings used 1 % for every fraction
    assert QuasiShuffler(IndexReader(1000), 0.5, 16).buffer_size == 512
    assert QuasiShuffler(IndexReader(1000), 0.01, 16).buffer_size == 16
    assert QuasiShuffler(IndexReader(1000), 17, 16).buffer_size == 32
    assert QuasiShuffler(IndexReader(0), 0.5, 16).buffer_size == 16
    assert QuasiShuffler(IndexReader(10), 1e3, 16).buffer_size == 1008


@pytest.mark.parametrize(("n", "buf_size", "chunk"), [
    (37, 8, 8), (100, 1000, 16), (33, 0.9, 7), (1, 1, 1), (17, 1, 16), (64, 16, 16)])
def test_every_sample_once_for_any_length_buffer_and_chunk(n, buf_size, chunk):
    shuffler = QuasiShuffler(IndexReader(n), buf_size, chunk, seed=0)
    for chunk_size in (1, 3, chunk, 64):  # datadings dropped samples when these differed
        assert sorted(shuffler.iter(0, chunk_size=chunk_size)) == list(range(n))


def test_quasi_shuffler_mixes_chunks_less_than_shuffler_but_still_mixes():
    n, chunk = 4000, 16
    quasi = list(QuasiShuffler(IndexReader(n), 0.1, chunk, seed=0))
    true = list(Shuffler(IndexReader(n), seed=0))
    same_chunk = [np.mean(np.diff(np.array(o) // chunk) == 0) for o in (quasi, true)]
    assert same_chunk[1] < same_chunk[0] < 0.05
    distinct = [len(set(np.array(o[:400]) // chunk)) for o in (quasi, true)]
    assert 25 < distinct[0] < distinct[1]


# --- argument checks -----------------------------------------------------------------------

@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda r: Repeater(r, -1), ValueError, "times must be >= 0; got times=-1"),
    (lambda r: Repeater(r, 1.5), TypeError, "times must be an integer; got times=1.5"),
    (lambda r: Range(r, "1"), TypeError, "start must be an integer; got start='1'"),
    (lambda r: QuasiShuffler(r, 0), ValueError, "buf_size must be a fraction in (0, 1)"),
    (lambda r: QuasiShuffler(r, 2.5), ValueError, "got buf_size=2.5"),
    (lambda r: QuasiShuffler(r, float("nan")), ValueError, "got buf_size=nan"),
    (lambda r: QuasiShuffler(r, "1%"), TypeError, "buf_size must be a number; got buf_size='1%'"),
    (lambda r: QuasiShuffler(r, 4, 0), ValueError, "chunk_size must be >= 1; got chunk_size=0"),
    (lambda r: Shuffler(r, seed=-1), ValueError, "seed must be a non-negative integer"),
    (lambda r: Shuffler([1, 2]), TypeError, "reader must be a reader or an ordering"),
    (lambda r: Range(r).iter(chunk_size=0), ValueError, "chunk_size must be >= 1"),
    (lambda r: Shuffler(r).set_epoch(-1), ValueError, "epoch must be >= 0; got epoch=-1"),
    (lambda r: Shuffler(r).seek(-1), ValueError, "index must be >= 0; got index=-1"),
    (lambda r: Cycler(r).iter(-1), ValueError, "start must be >= 0; got start=-1"),
])
def test_bad_arguments_are_rejected_at_the_call(build, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(IndexReader(10))


def test_context_manager_reaches_the_reader():
    class Closing(IndexReader):
        events: list = []

        def __enter__(self):
            self.events.append("enter")
            return self

        def __exit__(self, *exc_info):
            self.events.append("exit")

    reader = Closing(4)
    with Shuffler(Range(reader), seed=0) as shuffler:
        assert sorted(shuffler) == [0, 1, 2, 3]
    assert reader.events == ["enter", "exit"]
    assert repr(shuffler).startswith("Shuffler(Range(") and repr(shuffler).endswith(
        ", 0, 4), seed=0)")
