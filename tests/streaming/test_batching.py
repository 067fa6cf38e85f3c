"""batch, unbatch, the combiners and padding: dpipe's semantics and geometry, clear errors."""

import numpy as np
import pytest
from toolz import pipe

import fpipe as fp


def test_int_batches_and_the_partial_last_batch():
    assert list(fp.batch(3)(range(7))) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(fp.batch(3, drop_last=True)(range(7))) == [[0, 1, 2], [3, 4, 5]]
    assert list(fp.batch(np.int64(2))(range(3))) == [[0, 1], [2]]
    assert list(fp.batch(5)([])) == []


def test_a_full_batch_is_released_without_waiting_for_the_next_item():
    def source():
        yield from range(3)
        raise AssertionError("read past the full batch")

    assert next(fp.batch(3)(source())) == [0, 1, 2]


def test_batches_gather_across_chunks_of_a_background_stage():
    out = list(pipe(range(100), fp.threads(abs, n_workers=2, options=fp.ParallelOptions(chunk_size=3)),
                    fp.batch(10)))
    assert out == [list(range(i, i + 10)) for i in range(0, 100, 10)]


def test_a_predicate_batch_follows_dpipes_rule():
    def fits(chunk, item):
        return sum(chunk) + item <= 3

    assert list(fp.batch(fits)([1, 1, 1, 5, 2, 1, 1])) == [[1, 1, 1], [5], [2, 1], [1]]
    assert list(fp.batch(lambda chunk, item: False)("abc")) == [["a"], ["b"], ["c"]]


def test_a_predicate_error_reaches_the_consumer_after_the_items_before_it():
    def picky(chunk, item):
        if item == 5:
            raise ValueError("cannot judge 5")
        return len(chunk) < 2

    got = []
    with pytest.raises(ValueError, match="cannot judge 5"):
        for b in fp.batch(picky)(range(10)):
            got.append(b)
    assert got == [[0, 1], [2, 3], [4]]  # the batch it was making goes out, as at the end


@pytest.mark.parametrize("size, error, message", [
    (0, ValueError, "batch_size must be >= 1; got batch_size=0"),
    (2.5, TypeError, "batch_size must be an integer or a predicate"),
    (True, TypeError, "batch_size must be an integer or a predicate"),
])
def test_bad_batch_sizes_are_rejected_at_construction(size, error, message):
    with pytest.raises(error, match=message):
        fp.batch(size)


def test_unbatch_is_the_inverse_of_batch():
    assert list(fp.unbatch()(fp.batch(3)(range(8)))) == list(range(8))


def test_combine_batches_and_to_arrays_stack_fields():
    items = [(np.zeros(2), 1, "a"), (np.ones(2), 2, "b")]
    xs, ys, names = fp.combine_to_arrays(items)
    assert xs.shape == (2, 2) and ys.tolist() == [1, 2] and names.tolist() == ["a", "b"]
    assert fp.combine_batches(items)[1] == (1, 2)


def test_mismatched_and_ragged_items_name_the_problem():
    with pytest.raises(ValueError, match="item 0 has 2, item 1 has 3"):
        fp.combine_batches([(1, 2), (1, 2, 3)])
    with pytest.raises(ValueError, match=r"field 0 has items of different shapes \[\(2,\), \(3,\)\]"):
        fp.combine_to_arrays([(np.zeros(2),), (np.zeros(3),)])
    with pytest.raises(ValueError, match="'x' has items of different shapes"):
        fp.combine_dicts([{"x": [1]}, {"x": [1, 2]}])
    with pytest.raises(ValueError, match="different keys"):
        fp.combine_dicts([{"x": 1}, {"y": 1}])
    with pytest.raises(ValueError, match="different numbers of dimensions"):
        fp.pad_batch_equal([np.zeros(2), np.zeros((2, 2))])
    with pytest.raises(ValueError, match="padding_values must be one value or one per field"):
        fp.combine_pad([(1, 2)], padding_values=[0, 0, 0])


def test_pad_to_shape_follows_dpipes_geometry():
    x = np.arange(1, 4)
    assert fp.stream.pad_to_shape(x, [6]).tolist() == [0, 1, 2, 3, 0, 0]  # odd: the extra goes after
    assert fp.stream.pad_to_shape(x, [5], ratio=0).tolist() == [1, 2, 3, 0, 0]
    assert fp.stream.pad_to_shape(x, [5], ratio=1).tolist() == [0, 0, 1, 2, 3]
    assert fp.stream.pad_to_shape(np.ones((1, 2)), [3], axis=0).shape == (3, 2)
    assert fp.stream.pad_to_shape(np.ones(2, np.uint8), [3], padding_values=-1).tolist() == [1, 1, 255]
    assert fp.stream.pad_to_shape(np.array([2, 5]), [4], padding_values=np.min).tolist() == [2, 2, 5, 2]
    with pytest.raises(ValueError, match="to the smaller shape"):
        fp.stream.pad_to_shape(x, [2])


def test_large_integers_keep_every_digit_where_numpy_would_make_floats():
    # numpy makes float64 of a mix of int64 and uint64 values: 2**63 + 1 would become 2**63
    ids, labels = fp.combine_to_arrays([(0, 1), (2 ** 63 + 1, 2)])
    assert ids.dtype == np.uint64 and ids.tolist() == [0, 2 ** 63 + 1]
    assert labels.dtype == np.int64
    signed = fp.combine_dicts([{"id": -1}, {"id": 2 ** 63 + 1}])["id"]
    assert signed.dtype == object and signed.tolist() == [-1, 2 ** 63 + 1]
    assert fp.combine_to_arrays([(1.5,), (2,)])[0].dtype == np.float64  # real floats stay


def test_combine_pad_pads_each_field_with_its_own_value():
    items = [(np.ones((1, 2)), np.ones(1)), (np.ones((3, 1)), np.ones(2))]
    images, masks = fp.combine_pad(items, padding_values=[0, -1])
    assert images.shape == (2, 3, 2) and masks.shape == (2, 2)
    assert masks.tolist() == [[1, -1], [1, 1]]
    scalars = fp.combine_pad([(1, 2.0), (3, 4.0)])
    assert [s.tolist() for s in scalars] == [[1, 3], [2.0, 4.0]]


def test_combine_dicts_pads_when_asked():
    items = [{"x": np.ones(1), "y": 0}, {"x": np.ones(3), "y": 1}]
    batch = fp.combine_dicts(items, padding_values={"x": 9}, ratio=0)
    assert batch["x"].tolist() == [[1, 9, 9], [1, 1, 1]] and batch["y"].tolist() == [0, 1]


def test_uncombine_undoes_the_combiners():
    items = [(1, "a"), (2, "b")]
    assert fp.stream.uncombine(fp.combine_to_arrays(items)) == items
    dicts = [{"x": 1.5, "y": 0}, {"x": 2.5, "y": 1}]
    assert fp.stream.uncombine(fp.combine_dicts(dicts)) == dicts
    with pytest.raises(ValueError, match="fields have different lengths"):
        fp.stream.uncombine(([1, 2], [1]))


def test_a_combiner_error_reaches_the_consumer():
    with pytest.raises(ValueError, match="different shapes"):
        list(pipe([(np.zeros(1),), (np.zeros(2),)], fp.batch(2), fp.stream.map(fp.combine_to_arrays)))


@pytest.mark.parametrize("combiner", [fp.combine_batches, fp.combine_to_arrays,
                                      fp.combine_pad])
def test_combiners_on_scalar_items_name_themselves_and_what_they_expect(combiner):
    with pytest.raises(TypeError, match=rf"{combiner.__name__} expects items that are sequences "
                                        r"of fields.*item 1 is 4 \(int\)"):
        combiner([(1,), 4])
