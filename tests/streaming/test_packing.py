"""Examples of the variable-length stages: pack, batch_by_tokens, bucket_by_length; their
states, their errors, and how they combine with shard, processes, Infinite and the combiners."""

import pickle
import re

import numpy as np
import pytest
from toolz import pipe

import fpipe as fp


def tokens(*lengths, start=1):
    """Plain samples whose tokens say where they come from: sample i holds 100 * (i + start) +
    its positions."""
    return [np.arange(n, dtype=np.int64) + 100 * (i + start) for i, n in enumerate(lengths)]


def lists(rows):
    return [tuple(field.tolist() for field in row) for row in rows]


# --- pack -----------------------------------------------------------------------------------


def test_pack_makes_rows_of_the_length_with_segment_ids_and_positions():
    [row] = pipe(tokens(3, 2), fp.pack(6))
    assert lists([row]) == [([100, 101, 102, 200, 201, 0], [1, 1, 1, 2, 2, 0], [0, 1, 2, 0, 1, 0])]
    assert all(field.dtype == dtype for field, dtype in zip(row, (np.int64, np.int32, np.int32)))


def test_dict_samples_give_dict_rows_with_every_field_or_the_named_ones():
    samples = [{"ids": np.arange(3), "mask": np.ones(3, bool), "label": 7}] * 2
    with pytest.raises(ValueError, match="item 0: packed fields must be 1-D"):
        list(fp.pack(8)(samples))  # the scalar label is a field too, unless fields= leaves it out
    [row] = fp.pack(8, fields=["ids", "mask"])(samples)
    assert sorted(row) == ["ids", "mask", "positions", "segment_ids"]
    assert row["ids"].tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    assert row["mask"].dtype == bool and row["mask"].tolist() == [True] * 6 + [False] * 2


def test_best_fit_puts_a_sample_where_it_leaves_the_least_room():
    # rows of 10: 6 opens row A, 5 opens row B, 4 fits both: best fit takes A (room 4)
    rows = list(fp.pack(10)(tokens(6, 5, 4)))
    assert [row[1].tolist() for row in rows] == [[1] * 6 + [2] * 4, [1] * 5 + [0] * 5]
    first = list(fp.pack(10, strategy="first_fit")(tokens(5, 6, 4)))  # 4 goes to the first, B
    assert [row[0].tolist()[:6] for row in first] == [[100, 101, 102, 103, 104, 300],
                                                      [200, 201, 202, 203, 204, 205]]


def test_a_full_buffer_lets_the_fullest_row_go_for_best_fit_and_the_oldest_for_first_fit():
    samples = tokens(7, 8, 9)  # rows of 10, room for two open rows
    best = [row[0][0] for row in fp.pack(10, buffer_size=2)(samples)]
    first = [row[0][0] for row in fp.pack(10, buffer_size=2, strategy="first_fit")(samples)]
    assert best == [200, 100, 300] and first == [100, 200, 300]


def test_concat_fills_rows_in_order_and_goes_on_in_the_next_row():
    rows = lists(fp.pack(4, strategy="concat")(tokens(3, 6)))
    assert rows == [([100, 101, 102, 200], [1, 1, 1, 2], [0, 1, 2, 0]),
                    ([201, 202, 203, 204], [1, 1, 1, 1], [0, 1, 2, 3]),
                    ([205, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0])]


def test_overflow_splits_truncates_or_raises():
    split = lists(fp.pack(4)(tokens(9, 1)))
    assert split == [([100, 101, 102, 103], [1] * 4, [0, 1, 2, 3]),
                     ([104, 105, 106, 107], [1] * 4, [0, 1, 2, 3]),
                     ([108, 200, 0, 0], [1, 2, 0, 0], [0, 0, 0, 0])]
    truncated = lists(fp.pack(4, overflow="truncate")(tokens(9, 1)))
    assert truncated == [([100, 101, 102, 103], [1] * 4, [0, 1, 2, 3]),
                         ([200, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0])]
    with pytest.raises(ValueError, match=r"item 1 has length 9, more than length=4 \(overflow"):
        list(fp.pack(4, overflow="raise")(tokens(1, 9)))


def test_empty_samples_add_nothing_and_an_empty_stream_gives_no_rows():
    assert lists(fp.pack(3)(tokens(0, 2, 0))) == [([200, 201, 0], [1, 1, 0], [0, 1, 0])]
    assert list(fp.pack(3)([])) == []


@pytest.mark.parametrize("arguments, options, error, message", [
    ((0,), {}, ValueError, "length must be >= 1; got length=0"),
    (("8",), {}, TypeError, "length must be an integer; got length='8'"),
    ((8,), {"strategy": "next_fit"}, ValueError, "strategy must be 'best_fit', "
                                                 "'first_fit' or 'concat'; got strategy='next_fit'"),
    ((8,), {"fields": "ids"}, TypeError, "fields must be a sequence of field names or None; "
                                         "got fields='ids'"),
    ((8,), {"fields": ["a", "a"]}, ValueError, "fields must name at least one field, each "
                                               "once; got fields="),
    ((8,), {"buffer_size": 0}, ValueError, "buffer_size must be >= 1; got buffer_size=0"),
    ((8,), {"overflow": "drop"}, ValueError, "overflow must be 'split', 'truncate' or "
                                             "'raise'; got overflow='drop'"),
])
def test_pack_checks_its_arguments_when_it_is_built(arguments, options, error, message):
    with pytest.raises(error, match=message):
        fp.pack(*arguments, **options)


@pytest.mark.parametrize("samples, message", [
    ([np.zeros((2, 2))], r"item 0: packed fields must be 1-D arrays; got shapes \[\(2, 2\)\]"),
    ([{"a": [1, 2], "b": [1]}], r"item 0: packed fields must have one length; got \{'a': 2, 'b': 1\}"),
    ([{"a": [1]}, {"b": [1]}], r"item 1 has the fields \('b',\); the first item had \('a',\)"),
    ([{"a": [1]}, [1]], r"item 1 has the fields None; the first item had \('a',\)"),
    ([{"positions": [1]}], "item 0 has a field named 'segment_ids' or 'positions'"),
])
def test_samples_that_cannot_be_packed_are_named(samples, message):
    with pytest.raises(ValueError, match=message):
        list(fp.pack(4)(samples))


def test_named_fields_must_exist_and_are_for_dict_samples():
    with pytest.raises(ValueError, match=r"item 0 has no field 'ids'; it has \['tokens'\]"):
        list(fp.pack(4, fields=["ids"])([{"tokens": [1]}]))
    with pytest.raises(TypeError, match=r"fields=\('ids',\) is for dict items; item 0 is a list"):
        list(fp.pack(4, fields=["ids"])([[1, 2]]))


def test_rows_made_before_an_error_arrive_first():
    samples = [*tokens(4, 4), np.zeros((1, 1))]
    stream = fp.pack(4)(samples)
    assert len(stream.pull(5)) == 2
    with pytest.raises(ValueError, match="item 2"):
        stream.pull(5)


@pytest.mark.parametrize("samples, values, dtype", [
    ([np.array([1, 2], np.uint8), [300, 70000]], [1, 2, 300, 70000], np.int64),
    ([[1, 2], [0.5, 2.7]], [1, 2, 0.5, 2.7], np.float64),
    ([[], np.array([1, 2], np.int32)], [1, 2], np.int32),            # the empty one adds no dtype
    ([np.array([1], np.uint64), np.array([-1], np.int8)], [1, -1], np.float64),
    ([np.array([True]), np.array([7], np.int16)], [1, 7], np.int16),
])
def test_a_row_holds_its_samples_values_exactly_in_their_common_dtype(samples, values, dtype):
    """Regression: every sample was cast to the first one's dtype, unchecked: [300, 70000] into
    uint8 gave [44, 112], [0.5, 2.7] into int64 gave [0, 2], and an empty first sample made
    every row float64."""
    [row] = fp.pack(4)(samples)
    assert row[0].dtype == dtype and row[0][:len(values)].tolist() == values


def test_rows_keep_their_own_samples_dtype():
    rows = list(fp.pack(2)([np.array([1, 2], np.uint8), [300, 70000]]))
    assert [row[0].dtype for row in rows] == [np.uint8, np.int64]


@pytest.mark.parametrize("samples, message", [
    ([np.array([2**53 + 1]), np.array([1], np.uint64)],
     r"item 0: the item holds values that float64 \(what its row shares with item 0's int64\) "
     r"cannot hold exactly"),
    ([{"ids": [1.5]}, {"ids": np.array([2**63 - 1])}], r"item 1: field 'ids' holds values that float64"),
    ([np.array([1]), np.array(["a"])], r"item 1: the item of dtype <U1 cannot share a row with "
                                       r"item 0's int64"),
    ([[1, None]], r"item 0: the item holds Python objects \(dtype object\)"),
    ([[1, 2], [[1, 2], [3]]], r"item 1: the item is not an array of one shape: .*inhomogeneous"),
    ([{"ids": [1], "mask": [[1], []]}], r"item 0: field 'mask' is not an array of one shape"),
])
def test_values_that_no_common_dtype_holds_exactly_are_refused_naming_the_item(samples, message):
    with pytest.raises(ValueError, match=message):
        list(fp.pack(4)(samples))


def test_dict_samples_may_give_their_fields_in_any_order():
    """Regression: a sample whose keys came in another order was refused ("has the fields
    ('b', 'a'); the first item had ('a', 'b'))"; fields go by name."""
    samples = [{"a": [1], "b": [2]}, {"b": [3], "a": [4]}]
    [row] = fp.pack(3)(samples)
    assert row["a"].tolist() == [1, 4, 0] and row["b"].tolist() == [2, 3, 0]
    assert list(row) == ["a", "b", "segment_ids", "positions"]  # by name when fields= is not given
    [named] = fp.pack(3, fields=["b", "a"])(samples)
    assert list(named)[:2] == ["b", "a"]


def test_a_length_function_that_raises_is_chained_with_the_item_named():
    """Regression: its own error passed through without the item (a bad return value named it)."""
    samples = [{"n": 1}, {"n": 2}, {}]
    for stage in (fp.batch_by_tokens(8, length=lambda s: s["n"]),
                  fp.bucket_by_length([2], [2, 2], length=lambda s: s["n"])):
        with pytest.raises(ValueError, match=r"length raised KeyError for item 2: 'n'") as raised:
            list(stage(samples))
        assert isinstance(raised.value.__cause__, KeyError)


# --- the combiners read packed rows --------------------------------------------------------


def test_combiners_stack_packed_rows():
    tuple_rows = list(fp.pack(4)(tokens(3, 2, 2)))
    ids, segments, positions = fp.combine_pad(tuple_rows)
    assert ids.shape == segments.shape == positions.shape == (2, 4)
    dict_rows = list(fp.pack(4)([{"x": t} for t in tokens(3, 2, 2)]))
    for combine in (fp.combine_pad, fp.combine_to_arrays, fp.combine_dicts):
        batch = combine(dict_rows)
        assert sorted(batch) == ["positions", "segment_ids", "x"]
        assert batch["x"].shape == (2, 4) and np.array_equal(batch["segment_ids"], segments)


def test_combine_pad_pads_token_batches_by_key():
    batches = list(fp.batch_by_tokens(8, length=lambda s: len(s["x"]), seed=0)(
        [{"x": t} for t in tokens(1, 3, 2)]))
    padded = [fp.combine_pad(b, padding_values={"x": -1}, ratio=0) for b in batches]
    assert sorted(b["x"].shape for b in padded) == [(1, 3), (2, 2)]
    assert sorted(b["x"].tolist() for b in padded) == [[[100, -1], [300, 301]], [[200, 201, 202]]]


# --- batch_by_tokens ----------------------------------------------------------------------


def test_token_batches_sort_within_the_buffer_and_shuffle_with_the_seed():
    words = [w * n for w, n in zip("abcdefghij", [1, 5, 2, 4, 3, 1, 2, 5, 3, 4])]
    stage = fp.batch_by_tokens(8, seed=3, buffer_size=5)
    first = list(stage(words))
    again = list(fp.batch_by_tokens(8, seed=3, buffer_size=5)(words))
    later = [list(stage(words)) for _ in range(3)]  # epochs 1, 2, 3
    assert first == again and all(sorted(map(sorted, first)) == sorted(map(sorted, epoch))
                                  for epoch in later)
    assert any(first != epoch for epoch in later)  # the same batches, in new orders
    assert sorted(w for b in first for w in b) == sorted(words)
    assert all(len(b) * max(map(len, b)) <= 8 for b in first)
    # a buffer of 5: the first five words never share a batch with the last five
    assert all(set(b) <= set(words[:5]) or set(b) <= set(words[5:]) for b in first)


def test_an_item_over_the_budget_is_alone_or_an_error():
    assert sorted(fp.batch_by_tokens(4, seed=0)(["aaaaaa", "b", "c"])) == [["aaaaaa"], ["b", "c"]]
    with pytest.raises(ValueError, match="item 1 has length 6, more than max_tokens=4"):
        list(fp.batch_by_tokens(4, overflow="raise")(["b", "aaaaaa"]))


def test_unseeded_token_batches_keep_their_fresh_seed():
    stage = fp.batch_by_tokens(4)
    assert isinstance(stage.seed, int) and f"seed={stage.seed}" in repr(stage)


@pytest.mark.parametrize("arguments, options, error, message", [
    ((0,), {}, ValueError, "max_tokens must be >= 1; got max_tokens=0"),
    ((8,), {"length": 3}, TypeError, "length must be callable; got length=3"),
    ((8,), {"buffer_size": 0}, ValueError, "buffer_size must be >= 1; got buffer_size=0"),
    ((8,), {"seed": -1}, ValueError, "seed must be a non-negative integer; got seed=-1"),
    ((8,), {"overflow": "split"}, ValueError, "overflow must be 'alone' or 'raise'; got "
                                              "overflow='split'"),
])
def test_batch_by_tokens_checks_its_arguments(arguments, options, error, message):
    with pytest.raises(error, match=message):
        fp.batch_by_tokens(*arguments, **options)


def test_a_length_that_is_not_a_count_is_named():
    with pytest.raises(ValueError, match=r"length must give a non-negative integer; got -1 for "
                                         r"item 0"):
        list(fp.batch_by_tokens(4, length=lambda item: -1)(["a"]))


# --- bucket_by_length ---------------------------------------------------------------------


def test_buckets_fill_to_their_batch_size_and_partial_ones_follow_oldest_first():
    words = ["a", "bbbbb", "cc", "dddddd", "e", "fff", "ggggggg", "h", "i", "j"]
    stage = fp.bucket_by_length([2, 5], [2, 2, 2])
    assert list(stage(words)) == [["bbbbb", "dddddd"], ["a", "e"], ["cc", "fff"],
                                  ["h", "i"], ["ggggggg"], ["j"]]
    dropped = fp.bucket_by_length([2, 5], [2, 2, 2], drop_last=True)
    assert list(dropped(words)) == [["bbbbb", "dddddd"], ["a", "e"], ["cc", "fff"], ["h", "i"]]


@pytest.mark.parametrize("arguments, options, error, message", [
    (("5", [1]), {}, TypeError, "boundaries must be a sequence of integers; got boundaries='5'"),
    (([5, 5], [1, 1, 1]), {}, ValueError, r"boundaries must increase strictly; got boundaries=\[5, 5\]"),
    (([-1], [1, 1]), {}, ValueError, r"boundaries\[0\] must be >= 0; got boundaries\[0\]=-1"),
    (([5], 2), {}, TypeError, "batch_sizes must be a sequence of integers; got batch_sizes=2"),
    (([5], [2]), {}, ValueError, r"batch_sizes must have one more entry than boundaries \(2\)"),
    (([5], [2, 0]), {}, ValueError, r"batch_sizes\[1\] must be >= 1; got batch_sizes\[1\]=0"),
    (([5], [2, 2]), {"length": None}, TypeError, "length must be callable; got length=None"),
    (([5], [2, 2]), {"drop_last": 1}, TypeError, "drop_last must be True or False; got drop_last=1"),
])
def test_bucket_by_length_checks_its_arguments(arguments, options, error, message):
    with pytest.raises(error, match=message):
        fp.bucket_by_length(*arguments, **options)


# --- state and resume ---------------------------------------------------------------------


STAGES = {
    "pack": lambda: fp.pack(16, buffer_size=3),
    "first_fit": lambda: fp.pack(16, buffer_size=3, strategy="first_fit"),
    "concat": lambda: fp.pack(16, strategy="concat"),
    "batch_by_tokens": lambda: fp.batch_by_tokens(24, buffer_size=7, seed=5),
    "bucket_by_length": lambda: fp.bucket_by_length([4, 9], [3, 2, 2]),
}


def stream_of_samples():
    lengths = np.random.default_rng(1).integers(0, 30, 60)
    return tokens(*lengths)


def as_lists(outputs):
    return [lists([o])[0] if isinstance(o, tuple) else [x.tolist() for x in o] for o in outputs]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_stream_resumes_from_its_state_after_any_number_of_outputs(name):
    samples = stream_of_samples()
    expected = as_lists(STAGES[name]()(samples))
    for done in range(len(expected) + 1):
        stream = STAGES[name]()(samples)
        head = [next(stream) for _ in range(done)]  # next() reads ahead: the state knows
        state = pickle.loads(pickle.dumps(stream.state_dict()))
        resumed = STAGES[name]()
        resumed.load_state_dict(state)
        assert as_lists(head) + as_lists(resumed(samples)) == expected, done


def test_the_state_names_items_not_tokens_and_a_positioned_input_is_not_read_twice():
    samples = stream_of_samples()
    stage = STAGES["pack"]()
    stream = stage(samples)
    head = [next(stream) for _ in range(10)]
    state = stage.state_dict()
    assert state["type"] == "pack" and state["epoch"] == 0
    assert all(isinstance(i, int) for row in state["open"] for piece in row for i in piece)
    read = []

    def counted(items):
        for item in items:
            read.append(item)
            yield item
    resumed = STAGES["pack"]()
    resumed.load_state_dict(state)
    rest = resumed.apply(counted(samples[state["position"]:]), epoch=0, start=state["position"])
    assert as_lists(head) + as_lists(rest) == as_lists(STAGES["pack"]()(samples))
    assert len(read) == len(samples) - state["position"]


def test_resume_continues_the_epoch_and_the_next_call_the_one_after():
    samples = [w * n for w, n in zip("abcdefghij", [1, 5, 2, 4, 3, 1, 2, 5, 3, 4])]
    stage = fp.batch_by_tokens(8, seed=3, buffer_size=5)
    epochs = [list(stage(samples)) for _ in range(3)]
    stage.set_epoch(1)
    stream = stage(samples)
    _ = next(stream)
    state = stage.state_dict()
    resumed = fp.batch_by_tokens(8, seed=3, buffer_size=5)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and [epochs[1][0], *resumed(samples)] == epochs[1]
    assert list(resumed(samples)) == epochs[2]


def test_a_state_carries_the_seed_of_the_stage_it_came_from():
    words = ["a" * n for n in range(1, 30)]
    stage = fp.batch_by_tokens(12, buffer_size=8)  # fresh entropy
    stream = stage(words)
    head = [next(stream) for _ in range(2)]
    resumed = fp.batch_by_tokens(12, buffer_size=8)  # other fresh entropy
    resumed.load_state_dict(stream.state_dict())
    assert resumed.seed == stage.seed
    assert head + list(resumed(words)) == list(fp.batch_by_tokens(12, buffer_size=8,
                                                                  seed=stage.seed)(words))


def test_a_fresh_stage_and_an_ended_stream_have_states_too():
    stage = fp.bucket_by_length([3], [2, 2])
    assert stage.state_dict() == {"type": "bucket_by_length", "seed": None, "epoch": 0,
                                  "settings": BUCKET_SETTINGS, "position": 0, "consumed": 0,
                                  "open": [], "ready": []}
    stream = stage(["a", "b"])
    assert list(stream) == [["a", "b"]]
    assert stage.state_dict()["position"] == stage.state_dict()["consumed"] == 2


BUCKET_SETTINGS = {"boundaries": [3], "batch_sizes": [2, 2], "drop_last": False}


def bucket_state(**changes) -> dict:
    return {"type": "bucket_by_length", "seed": None, "epoch": 0, "settings": BUCKET_SETTINGS,
            "position": 0, "consumed": 0, "open": [], "ready": [], **changes}


@pytest.mark.parametrize("state, error, message", [
    ([], TypeError, "state must be a dict from state_dict"),
    ({"type": "pack"}, TypeError, "state must be a dict from state_dict"),
    (bucket_state(type="pack"), ValueError, "state is of a 'pack' stage, not of 'bucket_by_length'"),
    (bucket_state(epoch=-1), ValueError, r"state\['epoch'\] must be >= 0"),
    (bucket_state(position=3, consumed=2), ValueError,
     r"state\['position'\] must be <= state\['consumed'\]; got 3 > 2"),
    (bucket_state(consumed=2, open={}), TypeError, r"state\['open'\] and state\['ready'\] must be lists"),
])
def test_load_state_dict_refuses_what_is_not_a_state_of_the_stage(state, error, message):
    with pytest.raises(error, match=message):
        fp.bucket_by_length([3], [2, 2]).load_state_dict(state)


def test_a_resumed_stream_needs_its_input_from_the_state_position():
    stage = fp.pack(4)
    state = {**stage.state_dict(), "position": 2, "consumed": 6, "open": [[[3, 0, 2]]]}
    stage.load_state_dict(state)
    with pytest.raises(ValueError, match="the input ended at item 4, before the 6 items"):
        list(stage(tokens(1, 1, 1, 2)))
    stage.load_state_dict(state)
    with pytest.raises(ValueError, match="needs the input from item 2, but this input begins "
                                         "at item 3"):
        list(stage.apply(tokens(1, 1, 1), start=3))


def saved_state(stage, samples, outputs: int = 1) -> dict:
    stream = stage(samples)
    for _ in range(outputs):
        next(stream)
    return pickle.loads(pickle.dumps(stage.state_dict()))  # the recipes of its latest stream


@pytest.mark.parametrize("other, difference", [
    (fp.pack(6, buffer_size=3), "length=8 (this stage: 6)"),
    (fp.pack(12, buffer_size=3), "length=8 (this stage: 12)"),
    (fp.pack(8, buffer_size=4), "buffer_size=3 (this stage: 4)"),
    (fp.pack(8, buffer_size=3, strategy="first_fit"), "strategy='best_fit' (this stage: 'first_fit')"),
    (fp.pack(8, buffer_size=3, overflow="truncate"), "overflow='split' (this stage: 'truncate')"),
    (fp.pack(8, buffer_size=3, fields=["ids"]), "fields=None (this stage: ['ids'])"),
])
def test_a_pack_state_loads_only_into_a_pack_built_the_same_way(other, difference):
    """Regression: a pack(8) state loaded into pack(6) failed with numpy's "negative dimensions
    are not allowed"; into pack(12) it was taken, and the restored rows became 12 long."""
    state = saved_state(fp.pack(8, buffer_size=3), tokens(5, 2, 7, 6, 3, 4, 5))
    with pytest.raises(ValueError, match=re.escape(f"built otherwise than {other!r}: {difference}")):
        other.load_state_dict(state)


@pytest.mark.parametrize("make, other", [
    (lambda: fp.batch_by_tokens(8, buffer_size=4, seed=0), fp.batch_by_tokens(8, buffer_size=5)),
    (lambda: fp.batch_by_tokens(8, buffer_size=4, seed=0), fp.batch_by_tokens(9, buffer_size=4)),
    (lambda: fp.bucket_by_length([3], [2, 2]), fp.bucket_by_length([3], [2, 3])),
    (lambda: fp.bucket_by_length([3], [2, 2]), fp.bucket_by_length([4], [2, 2])),
])
def test_the_other_stages_states_carry_their_settings_too(make, other):
    state = saved_state(make(), tokens(1, 2, 3, 4, 5, 1, 2, 3))
    with pytest.raises(ValueError, match="built otherwise than"):
        other.load_state_dict(state)
    make().load_state_dict(state)  # the same settings load


@pytest.mark.parametrize("change, message", [
    ({"open": [[[999, 0, 2]]]}, r"state\['open'\] names items outside the 2 to 6 that "
                                    r"the state had read and kept: \[\[999, 0, 2\]\]"),
    ({"ready": [[[2, 0, 2]], [[7, 0, 1]]]}, r"state\['ready'\] names items outside"),
    ({"open": [[[3, 0, 8]]]}, r"state\['open'\] holds the row \[\[3, 0, 8\]\]: not pieces "
                              r"\[item, begin, end\] of at most 7 tokens"),
    ({"ready": [[[3, 2, 1]]]}, r"state\['ready'\] holds the row"),
    ({"ready": [[[3, -1, 1]]]}, r"state\['ready'\] holds the row"),
    ({"ready": [[[3, 0.0, 1]]]}, r"state\['ready'\] holds the row"),
    ({"ready": [[]]}, r"state\['ready'\] holds the row \[\]"),
    ({"open": [[[3, 0]]]}, r"state\['open'\] holds \[\[3, 0\]\], not a recipe"),
    ({"open": [[[3, 0, 1]]] * 4}, r"state\['open'\] holds 4 rows; pack\(8, .*\) keeps at most 3"),
    ({"seed": 5}, r"state\['seed'\] must be None"),
    ({"settings": {"length": 8}}, r"buffer_size=None \(this stage: 3\)"),
])
def test_a_hand_made_pack_state_is_refused_whole_before_anything_changes(change, message):
    """Regression: hand-made spans gave numpy's "negative dimensions" error, and an unknown
    item index KeyError: 999. Loading checks everything first: a refused state leaves the
    stage as it was."""
    samples = tokens(5, 2, 7, 6, 3, 4, 5)
    state = {**saved_state(fp.pack(8, buffer_size=3), samples), "epoch": 4, **change}
    stage = fp.pack(8, buffer_size=3)
    stage.set_epoch(2)
    with pytest.raises(ValueError, match=message):
        stage.load_state_dict(state)
    assert stage.epoch == 2 and stage.state_dict()["consumed"] == 0
    assert lists(stage(samples)) == lists(fp.pack(8, buffer_size=3)(samples))


def test_a_state_whose_spans_the_input_does_not_have_is_refused_before_any_row():
    stage = fp.pack(8)
    stage.load_state_dict({**stage.state_dict(), "position": 1, "consumed": 2,
                           "open": [[[1, 0, 5]]]})
    with pytest.raises(ValueError, match="the state has item 1 up to token 5, but item 1 has 2"):
        next(stage(tokens(3, 2, 4)))


def test_a_state_of_fpipe_0_1_0_without_settings_loads_with_a_warning_and_checked_rows():
    samples = tokens(5, 2, 7, 6, 3, 4, 5)
    state = saved_state(fp.pack(8, buffer_size=3), samples)
    del state["settings"]
    resumed = fp.pack(8, buffer_size=3)
    with pytest.warns(UserWarning, match="records no settings"):
        resumed.load_state_dict(state)
    assert lists(fp.pack(8, buffer_size=3)(samples))[1:] == lists(resumed(samples))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="not pieces"):
        fp.pack(6, buffer_size=3).load_state_dict(state)  # its 7-token row does not fit
    with pytest.raises(TypeError, match=r"state must be a dict from state_dict\(\) \('position' "
                                        r"missing or unknown\)"):
        fp.pack(8).load_state_dict({key: value for key, value in fp.pack(8).state_dict().items()
                                    if key != "position"})


def test_stages_pickle_with_their_settings():
    stage = fp.pack(16, buffer_size=3)
    _ = list(stage(tokens(3, 4)))
    copy = pickle.loads(pickle.dumps(stage))
    assert repr(copy) == repr(stage) == ("pack(16, strategy='best_fit', buffer_size=3, "
                                         "overflow='split')")


# --- with other stages ----------------------------------------------------------------------


def test_the_output_does_not_depend_on_the_workers_upstream():
    samples = stream_of_samples()
    reference = as_lists(fp.pack(16, buffer_size=3)(samples))
    for workers in (1, 2):
        stream = pipe(samples, fp.threads(np.copy, n_workers=workers), fp.pack(16, buffer_size=3))
        assert as_lists(stream) == reference
    with pipe(samples, fp.processes(np.copy, n_workers=2, backend="loky"),
              fp.pack(16, buffer_size=3)) as stream:
        assert as_lists(stream) == reference


def test_shards_pack_apart_and_together_hold_every_token():
    samples = stream_of_samples()
    rows = [row for index in range(3) for row in pipe(samples, fp.shard(index, 3), fp.pack(16))]
    kept = sorted(t for tokens_, ids, _ in rows for t in tokens_[ids > 0].tolist())
    assert kept == sorted(t for sample in samples for t in sample.tolist())


def test_infinite_resumes_a_packing_pipeline_exactly():
    samples = stream_of_samples()

    def make():
        return fp.Infinite(fp.sample(samples, random_state=4), fp.pack(16, buffer_size=3),
                           batch_size=4, batches_per_epoch=5)
    first = make()
    with first:
        _ = list(first())
        state = first.state_dict()
        expected = [list(map(np.ndarray.tolist, batch)) for batch in first()]
    second = make()
    second.load_state_dict(state)
    with second:
        assert [list(map(np.ndarray.tolist, batch)) for batch in second()] == expected


def test_a_streams_state_holds_the_items_of_its_open_and_made_rows_and_no_others():
    docs = [{"tokens": np.arange(1 + i % 13)} for i in range(600)]
    stream = fp.pack(16, buffer_size=3)(docs)
    for _ in range(200):
        next(stream)
    own = stream.state_dict()["own"]
    held = {i for i, _ in own["items"]}
    named = {piece[0] for row in own["open"] + own["ready"] for piece in row}
    assert held == named and 0 < len(held) < 64
    again = fp.pack(16, buffer_size=3)(docs)
    again.load_state_dict(stream.state_dict())
    assert [r["tokens"].tolist() for r in again] == [r["tokens"].tolist() for r in stream]
