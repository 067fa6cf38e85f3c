"""Laws of the variable-length stages: packing conserves tokens (or truncates them as asked),
rows have their length and consistent segment ids and positions, and hold their samples' values
exactly whatever their dtypes; token batches keep their budget, buckets keep their lengths;
every stage is deterministic and resumes exactly, and a pack's state loads only into a pack
built the same way."""

import itertools
import pickle
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fpipe as fp
from property_tests.strategies import (
    pack_options,
    regroup_specs,
    regroup_stage,
    row_lengths,
    sequence_lengths,
    traced_sequences,
    traced_values,
    typed_sequences,
)


def pieces_of(rows: list, length: int) -> dict:
    """Each sample's pieces ``(first offset, size)``, checking every row on the way: its
    length, segment ids 1, 2, ... then padding, and positions counting within each segment."""
    pieces: dict = {}
    for row in rows:
        ids, positions = row["segment_ids"], row["positions"]
        assert all(len(row[key]) == length for key in row)
        used = int(np.count_nonzero(ids))
        assert np.all(ids[used:] == 0) and np.all(positions[used:] == 0)
        assert np.all(np.diff(ids[:used]) >= 0) and np.all(np.diff(ids[:used]) <= 1)
        for segment in range(1, int(ids.max(initial=0)) + 1):
            where = ids == segment
            origin, offset = row["origin"][where], row["offset"][where]
            assert len(set(origin.tolist())) == 1  # one sample per segment
            assert np.array_equal(positions[where], np.arange(where.sum()))
            assert np.array_equal(offset, offset[0] + np.arange(where.sum()))  # in order
            pieces.setdefault(int(origin[0]), []).append((int(offset[0]), int(where.sum())))
    return pieces


@given(sequence_lengths, row_lengths, pack_options)
def test_packing_conserves_every_token_or_truncates_as_asked(lengths, length, options):
    rows = list(fp.pack(length, **options)(traced_sequences(lengths)))
    pieces = pieces_of(rows, length)
    for origin, n in enumerate(lengths):
        kept = min(n, length) if options["overflow"] == "truncate" else n
        covered = sorted(pieces.get(origin, []))
        assert sum(size for _, size in covered) == kept
        assert [first for first, _ in covered] == list(np.cumsum([0] + [s for _, s in covered])[:-1])
    assert set(pieces) <= {i for i, n in enumerate(lengths) if n}


@given(sequence_lengths, row_lengths, st.integers(1, 6))
def test_concat_leaves_padding_only_in_its_last_row(lengths, length, buffer_size):
    rows = list(fp.pack(length, strategy="concat", buffer_size=buffer_size)(
        traced_sequences(lengths)))
    assert all(np.all(row["segment_ids"] > 0) for row in rows[:-1])
    assert len(rows) == -(-sum(lengths) // length)


@given(st.lists(st.integers(0, 30), max_size=40), st.integers(1, 60), st.integers(1, 8),
       st.integers(0, 2**32))
def test_token_batches_hold_every_item_once_within_the_budget(lengths, budget, buffer, seed):
    items = [(i, n) for i, n in enumerate(lengths)]
    stage = fp.batch_by_tokens(budget, length=lambda item: item[1], buffer_size=buffer, seed=seed)
    batches = list(stage(items))
    assert sorted(item for b in batches for item in b) == items
    assert all(len(b) == 1 or len(b) * max(n for _, n in b) <= budget for b in batches)
    assert all(min(i for i, _ in b) // buffer == max(i for i, _ in b) // buffer for b in batches)


@given(st.lists(st.integers(0, 30), max_size=40), st.lists(st.integers(1, 4), min_size=3,
                                                            max_size=3), st.booleans())
def test_buckets_hold_items_of_their_lengths_and_partial_batches_only_at_the_end(
        lengths, sizes, drop_last):
    items = [(i, n) for i, n in enumerate(lengths)]
    stage = fp.bucket_by_length([5, 15], sizes, length=lambda item: item[1], drop_last=drop_last)
    batches = list(stage(items))
    bucket_of = [int(np.searchsorted([5, 15], n, side="right")) for n in lengths]
    buckets = [{bucket_of[i] for i, _ in b} for b in batches]
    assert all(len(bucket) == 1 for bucket in buckets)
    full = [len(b) == sizes[min(bucket)] for b, bucket in zip(batches, buckets)]
    partial = full.index(False) if False in full else len(full)
    assert not any(full[partial:])  # the partial batches come last, one per bucket at most
    assert len({min(bucket) for bucket in buckets[partial:]}) == len(batches) - partial
    assert not drop_last or partial == len(batches)
    dropped = sum(bucket_of.count(at) % size for at, size in enumerate(sizes)) if drop_last else 0
    kept = sorted(item for b in batches for item in b)
    assert len(kept) == len(items) - dropped and set(kept) <= set(items)


def outputs(stream) -> list:
    """Outputs as plain lists: rows (dicts of arrays) or batches (lists of such samples)."""
    def plain(sample: dict) -> list:
        return sorted((key, value.tolist()) for key, value in sample.items())
    return [plain(o) if isinstance(o, dict) else [plain(x) for x in o] for o in stream]
@settings(max_examples=30)
@given(regroup_specs, sequence_lengths, st.integers(1, 5))
def test_the_output_is_the_same_whatever_the_chunks_it_is_read_in(spec, lengths, chunk):
    samples = traced_sequences(lengths)
    rechunked = fp.unbatch()(fp.batch(chunk)(iter(samples)))
    assert outputs(regroup_stage(spec)(rechunked)) == outputs(regroup_stage(spec)(samples))


@given(regroup_specs, sequence_lengths, st.data())
def test_a_stream_resumed_from_its_state_gives_what_the_rest_would_have_been(spec, lengths,
                                                                              data):
    samples = traced_sequences(lengths)
    expected = list(regroup_stage(spec)(samples))
    done = data.draw(st.integers(0, len(expected)), label="outputs before the state")
    stream = regroup_stage(spec)(samples)
    head = [next(stream) for _ in range(done)]
    resumed = regroup_stage(spec)
    resumed.load_state_dict(pickle.loads(pickle.dumps(stream.state_dict())))
    assert outputs(head) + outputs(resumed(samples)) == outputs(expected)


def same_numbers(a: list, b: list) -> bool:
    """Equal as Python numbers (exact across int and float), NaN equal to NaN."""
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


def holds_exactly(values: np.ndarray, dtype: np.dtype) -> bool:
    with np.errstate(all="ignore"):
        return same_numbers(values.astype(dtype).tolist(), values.tolist())


@given(typed_sequences, row_lengths, pack_options)
def test_packed_values_are_the_inputs_values_exactly_whatever_their_dtypes(values, length,
                                                                             options):
    """Each row holds its samples' values in the dtype numpy promotes theirs to; a sample whose
    values that dtype cannot hold exactly is refused, named."""
    try:
        rows = list(fp.pack(length, **options)(traced_values(values)))
    except ValueError as error:
        item, dtype = re.match(r"item (\d+): field 'value' holds values that (\w+) ",
                               str(error)).groups()
        assert not holds_exactly(values[int(item)], np.dtype(dtype))
        return
    for row in rows:
        ids = row["segment_ids"]
        origins = sorted({int(o) for o in row["origin"][ids > 0]})
        assert row["value"].dtype == np.result_type(*(values[o].dtype for o in origins))
        for segment in range(1, int(ids.max(initial=0)) + 1):
            where = ids == segment
            expected = values[int(row["origin"][where][0])][row["offset"][where]]
            assert same_numbers(row["value"][where].tolist(), expected.tolist())


def exactly(row: dict) -> list:
    return sorted((key, str(value.dtype), value.tobytes()) for key, value in row.items())


@given(typed_sequences, row_lengths, pack_options, st.data())
def test_a_resumed_pack_gives_the_uninterrupted_rows_dtypes_included(values, length, options,
                                                                     data):
    samples = traced_values(values)
    try:
        expected = list(fp.pack(length, **options)(samples))
    except ValueError:
        return  # values no row dtype holds: the law above
    done = data.draw(st.integers(0, len(expected)), label="rows before the state")
    stream = fp.pack(length, **options)(samples)
    head = list(itertools.islice(stream, done))
    resumed = fp.pack(length, **options)
    resumed.load_state_dict(pickle.loads(pickle.dumps(stream.state_dict())))
    assert [exactly(row) for row in head + list(resumed(samples))] == list(map(exactly, expected))


@given(sequence_lengths, row_lengths, pack_options, row_lengths, pack_options,
       st.integers(0, 3))
def test_a_pack_state_loads_only_into_a_pack_built_the_same_way(lengths, length, options,
                                                                other_length, other_options,
                                                                done):
    stream = fp.pack(length, **options)(traced_sequences(lengths))
    list(itertools.islice(stream, done))
    state = stream.state_dict()
    other = fp.pack(other_length, **other_options)
    if (other_length, other_options) == (length, options):
        other.load_state_dict(state)
    else:
        with pytest.raises(ValueError, match="the state is of a stage built otherwise"):
            other.load_state_dict(state)
