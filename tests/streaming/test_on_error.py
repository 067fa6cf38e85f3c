"""on_error and max_errors on map, threads, processes and the dpipe stage classes: the output
holds exactly the good items, in order, and fpipe.stats counts and names the skipped ones."""

from __future__ import annotations

import pickle

import pytest
from toolz import pipe

import fpipe
from fpipe import Infinite, Loky, ParallelOptions, Threads, processes, stats, threads
from fpipe.dataset import MsgpackReader
from fpipe.skipping import TooManyErrors
from fpipe.stream import map

from ..torch.test_on_error import BAD, decode, write_images


def tenth(x: int) -> int:
    if x % 10 == 7:
        raise ValueError(f"bad item {x}")
    return x


GOOD = [x for x in range(40) if x % 10 != 7]

STAGES = {
    "map": lambda **options: map(tenth, **options),
    "threads": lambda **options: threads(tenth, n_workers=2, options=ParallelOptions(chunk_size=3),
                                         **options),
    "processes": lambda **options: processes(tenth, n_workers=2, options=ParallelOptions(chunk_size=3),
                                             backend="threading", **options),
    "Threads": lambda **options: Threads(tenth, n_workers=2, **options),
}


@pytest.mark.parametrize("kind", STAGES)
def test_skip_keeps_the_good_items_in_order_and_counts_the_rest(kind):
    with STAGES[kind](on_error="skip")(range(40)) as stream:
        assert list(stream) == GOOD
        row = stats(stream)[-1]
    assert row.skipped == 4
    assert [record.index for record in row.skipped_items] == [7, 17, 27, 37]
    assert row.skipped_items[0].error == "ValueError: bad item 7"
    assert "skipped 4: item 7, item 17, item 27, item 37" in str(stats(stream))


@pytest.mark.parametrize("kind", STAGES)
def test_max_errors_raises_once_passed(kind):
    with STAGES[kind](on_error="skip", max_errors=2)(range(40)) as stream:
        with pytest.raises(TooManyErrors, match="3 items failed, more than max_errors=2; the "
                                                "last: item 27: ValueError: bad item 27"):
            list(stream)
    with STAGES[kind](on_error="skip", max_errors=4)(range(40)) as stream:
        assert list(stream) == GOOD


@pytest.mark.parametrize("kind", STAGES)
def test_raise_is_the_default(kind):
    with STAGES[kind]()(range(40)) as stream, pytest.raises(ValueError, match="bad item 7"):
        list(stream)


def test_the_stage_number_of_the_items_counts_from_start():
    stream = map(tenth, on_error="skip").apply(range(30, 40), start=30)
    assert list(stream) == [x for x in range(30, 40) if x != 37]
    assert [r.index for r in stats(stream)[-1].skipped_items] == [37]


calls: list = []


def remember(error, item, index):
    calls.append((type(error).__name__, item, index))


def test_a_callable_gets_error_item_and_index_and_its_return_is_ignored():
    calls.clear()
    assert list(map(tenth, on_error=remember)(range(20))) == [x for x in range(20) if x % 10 != 7]
    assert calls == [("ValueError", 7, 7), ("ValueError", 17, 17)]


def test_a_callable_that_raises_ends_the_stream_with_what_it_raised():
    def stop(error, item, index):
        raise error

    with pytest.raises(ValueError, match="bad item 7"):
        list(threads(tenth, on_error=stop)(range(20)))


def test_corrupt_images_through_processes_leave_the_good_ones_in_order(tmp_path):
    reader = write_images(tmp_path / "images.msgpack")
    stage = processes(decode, n_workers=2, options=ParallelOptions(chunk_size=2), on_error="skip")
    try:
        with pipe(reader, stage) as stream:
            assert [s["label"] for s in stream] == [i for i in range(20) if i not in BAD]
            row = stats(stream)[-1]
    finally:
        stage.close()
    assert row.skipped == 2
    assert [(r.index, r.key) for r in row.skipped_items] == [(7, "img07"), (13, "img13")]
    assert row.skipped_items[0].error.startswith("UnidentifiedImageError")


def test_loky_skips_in_worker_processes(tmp_path):
    reader = MsgpackReader(write_images(tmp_path / "images.msgpack").path)
    stage = Loky(decode, n_workers=2, on_error="skip")
    try:
        with pipe(reader, stage) as stream:
            assert [s["label"] for s in stream] == [i for i in range(20) if i not in BAD]
            assert stats(stream)[-1].skipped == 2
    finally:
        stage.close()
    assert "on_error='skip'" in repr(stage)


def test_infinite_skips_in_its_plain_transformers_and_reports_them():
    with Infinite(range(40), tenth, batch_size=6, batches_per_epoch=6, combiner=list,
                  on_error="skip") as batch_iter:
        batches = list(batch_iter())
        report = batch_iter.stats()
    assert sum(batches, []) == GOOD
    assert [row.skipped for row in report] == [0, 4, 0, 0, 0]


def test_skipped_records_pickle_and_say_where():
    record = fpipe.skipping.Skipped(3, "a.jpg", "OSError: truncated")
    assert pickle.loads(pickle.dumps(record)) == record
    assert record.where() == "item 3 (key 'a.jpg')"


@pytest.mark.parametrize("factory", [map, threads, processes, Threads, Loky])
@pytest.mark.parametrize(("options", "error", "match"), [
    ({"on_error": "warn"}, ValueError, "on_error must be 'raise', 'skip' or a callable; "
                                       "got on_error='warn'"),
    ({"on_error": None}, TypeError, "got on_error=None"),
    ({"max_errors": "3"}, TypeError, "max_errors must be an integer"),
    ({"max_errors": -2}, ValueError, "max_errors must be >= 0"),
])
def test_bad_options_are_refused_when_the_stage_is_built(factory, options, error, match):
    with pytest.raises(error, match=match):
        factory(tenth, **options)


def test_infinite_checks_on_error_even_without_plain_transformers():
    with pytest.raises(ValueError, match="on_error must be"):
        Infinite(range(3), batch_size=1, batches_per_epoch=1, on_error="ignore")
