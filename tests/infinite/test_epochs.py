"""Infinite's epochs: windows on one stream, exact sizes, finite sources, argument checks."""

import itertools

import numpy as np
import pytest

from fpipe import Infinite, Iterator, Loky, Threads, batch, sample, threads
from fpipe.stream import filter, map

from .helpers import pairs, square


def counting(*transformers, batch_size=3, batches_per_epoch=4, **kwargs):
    return Infinite(itertools.count(), *transformers, batch_size=batch_size,
                    batches_per_epoch=batches_per_epoch, combiner=list, **kwargs)


def test_each_call_yields_the_next_batches_per_epoch_batches():
    with counting() as batch_iter:
        first, second = list(batch_iter()), list(iter(batch_iter))
    assert first == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert second[0] == [12, 13, 14] and len(second) == 4


def test_breaking_out_of_an_epoch_loses_nothing():
    with counting(batches_per_epoch=3) as batch_iter:
        first = next(iter(batch_iter()))  # and the epoch is dropped
        rest = list(batch_iter())
    assert first == [0, 1, 2] and rest == [[3, 4, 5], [6, 7, 8], [9, 10, 11]]


def test_an_epoch_that_is_never_iterated_takes_nothing():
    with counting(batches_per_epoch=2) as batch_iter:
        batch_iter()
        assert list(batch_iter()) == [[0, 1, 2], [3, 4, 5]]


def test_batches_per_epoch_may_change_between_epochs_and_is_checked():
    with counting(batches_per_epoch=1) as batch_iter:
        assert len(list(batch_iter())) == 1
        batch_iter.batches_per_epoch = np.int64(3)
        assert list(batch_iter()) == [[3, 4, 5], [6, 7, 8], [9, 10, 11]]
        with pytest.raises(ValueError, match="batches_per_epoch must be >= 1"):
            batch_iter.batches_per_epoch = 0


@pytest.mark.parametrize("transformer", [
    square, map(square), Threads(square, n_workers=3), threads(square, n_workers=2),
    Loky(square, n_workers=2)])
def test_order_is_kept_by_every_item_stage(transformer):
    with counting(transformer, batch_size=5, batches_per_epoch=20) as batch_iter:
        items = [x for b in batch_iter() for x in b]
    assert items == [i * i for i in range(100)]


def test_stages_that_change_the_number_of_items():
    with counting(filter(lambda x: x % 2), Iterator(pairs), batch_size=2) as batch_iter:
        assert list(batch_iter())[0] == [(1, 3), (5, 7)]
    with counting(Iterator(pairs, n_workers=2), batch_size=2) as batch_iter:
        assert [p for b in batch_iter() for p in b] == [(2 * i, 2 * i + 1) for i in range(8)]


def test_a_finite_source_ends_the_epoch_with_its_partial_batch_and_restarts():
    batch_iter = Infinite(range(7), batch_size=3, batches_per_epoch=2, combiner=list)
    epochs = [list(batch_iter()) for _ in range(3)]
    assert epochs == [[[0, 1, 2], [3, 4, 5]], [[6]], [[0, 1, 2], [3, 4, 5]]]
    batch_iter.close()


def test_a_finite_source_that_ends_at_an_epoch_boundary_gives_no_empty_epoch():
    batch_iter = Infinite([1, 2, 3, 4], batch_size=2, batches_per_epoch=2, combiner=list)
    assert [list(batch_iter()) for _ in range(3)] == [[[1, 2], [3, 4]]] * 3
    batch_iter.close()


def test_a_spent_iterator_gives_empty_epochs_not_errors_and_a_warning_once():
    batch_iter = Infinite(iter(range(5)), batch_size=2, batches_per_epoch=5, combiner=list)
    assert list(batch_iter()) == [[0, 1], [2, 3], [4]]
    with pytest.warns(RuntimeWarning, match="gave no items: an epoch is empty") as warned:
        assert list(batch_iter()) == [] and list(batch_iter()) == []
    assert len(warned) == 1
    batch_iter.close()


def test_a_source_that_cannot_fill_an_epoch_says_so_once(recwarn):
    batch_iter = Infinite(list(range(10)), batch_size=4, batches_per_epoch=5, combiner=list)
    assert [[len(b) for b in batch_iter()] for _ in range(3)] == [[4, 4, 2]] * 3
    batch_iter.close()
    warned = [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert len(warned) == 1 and "ran out after 3 of batches_per_epoch=5 batches" in warned[0]


def test_a_source_that_fills_its_epochs_exactly_gives_no_warning(recwarn):
    batch_iter = Infinite(range(6), batch_size=3, batches_per_epoch=2, combiner=list)
    assert [len(list(batch_iter())) for _ in range(3)] == [2, 2, 2]
    batch_iter.close()
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_the_default_combiner_stacks_fields_into_arrays():
    with Infinite(sample([(np.zeros((2, 2)), 1)], random_state=0), batch_size=4,
                  batches_per_epoch=1) as batch_iter:
        (xs, ys), = batch_iter()
    assert xs.shape == (4, 2, 2) and ys.tolist() == [1, 1, 1, 1]


def test_a_batch_size_predicate_and_numpy_integers():
    def up_to_ten(chunk, item):
        return sum(chunk) + item <= 10

    with counting(batch_size=up_to_ten, batches_per_epoch=3) as batch_iter:
        assert list(batch_iter()) == [[0, 1, 2, 3, 4], [5], [6]]
    with counting(batch_size=np.int32(2), batches_per_epoch=np.uint8(2),
                  buffer_size=np.int64(3)) as batch_iter:
        assert list(batch_iter()) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"batch_size": 0}, ValueError, "batch_size must be >= 1; got batch_size=0"),
    ({"batch_size": 2.5}, TypeError, "batch_size must be an integer or a predicate"),
    ({"batch_size": True}, TypeError, "batch_size=True"),
    ({"batches_per_epoch": 0}, ValueError, "batches_per_epoch must be >= 1; got"),
    ({"batches_per_epoch": None}, TypeError, "batches_per_epoch must be an integer"),
    ({"batches_per_epoch": 1.0}, TypeError, "batches_per_epoch must be an integer"),
    ({"buffer_size": 0}, ValueError, "buffer_size must be >= 1; got buffer_size=0"),
    ({"buffer_size": -1}, ValueError, "buffer_size must be >= 1"),
    ({"buffer_size": "2"}, TypeError, "buffer_size must be an integer"),
    ({"combiner": 3}, TypeError, "combiner must be callable"),
])
def test_arguments_are_checked_at_construction(kwargs, error, message):
    arguments = {"batch_size": 2, "batches_per_epoch": 1, **kwargs}
    with pytest.raises(error, match=message.replace("(", r"\(")):
        Infinite(itertools.count(), **arguments)


def test_sources_and_transformers_are_checked_at_construction():
    with pytest.raises(TypeError, match="source must be iterable"):
        Infinite(5, batch_size=1, batches_per_epoch=1)
    with pytest.raises(TypeError, match=r"transformers\[1\]=3"):
        Infinite([], square, 3, batch_size=1, batches_per_epoch=1)
    with pytest.raises(ValueError, match="n_workers must be >= 1"):
        Threads(square, n_workers=0)
    with pytest.raises(ValueError, match="buffer_size must be >= 1"):
        Iterator(pairs, buffer_size=0)


def test_threads_gives_each_worker_room_to_finish_ahead(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert Threads(square, n_workers=2).stages[0].buffer_chunks == 1 + 2 * 2
    assert Threads(square, n_workers=-1, buffer_size=3).stages[0].buffer_chunks == 3 + 2 * 4
    with pytest.raises(ValueError, match="buffer_size must be >= 1; got buffer_size=0"):
        Threads(square, buffer_size=0)
    with pytest.raises(TypeError, match="n_workers must be an integer"):
        Threads(square, n_workers=1.5)


def test_loky_counts_negative_workers_back_from_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert Loky(square, n_workers=-2).stages[0].n_workers == 3
    assert Loky(square, n_workers=-9).stages[0].n_workers == 1
    assert Loky(square, n_workers=-1).stages[0].n_workers == -1


def test_keyword_arguments_go_to_the_function_even_when_a_stage_option_has_their_name():
    def tag(x, seed):
        return x, seed

    with counting(Threads(tag, seed="s", n_workers=2), batch_size=2,
                  batches_per_epoch=1) as batch_iter:
        assert list(batch_iter()) == [[(0, "s"), (1, "s")]]
    assert repr(Threads(tag, seed="s", n_workers=2)) == "Threads(tag, n_workers=2, buffer_size=1, seed='s')"


def test_the_stage_classes_work_in_a_plain_pipe():
    from toolz import pipe

    assert list(pipe(range(4), Threads(square, n_workers=2), batch(2))) == [[0, 1], [4, 9]]
    assert list(pipe(range(4), Loky(square))) == [0, 1, 4, 9]
    assert list(pipe(range(6), Iterator(pairs))) == [(0, 1), (2, 3), (4, 5)]


def test_repr_names_the_stages():
    batch_iter = Infinite(range(3), square, batch_size=2, batches_per_epoch=5)
    assert repr(batch_iter) == ("Infinite(range, map(square), batch(2), map(combine_to_arrays), "
                                "prefetch(2), batches_per_epoch=5)")
