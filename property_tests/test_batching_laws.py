"""Laws of batching and combining: sizes, maximal predicate batches, round trips, pad geometry."""

import functools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import fpipe as fp
from property_tests.strategies import batch_sizes, same_rank_shapes, stream_items


@given(stream_items, batch_sizes, st.booleans())
def test_int_batches_have_the_size_and_concatenate_to_the_stream(items, size, drop_last):
    batches = list(fp.batch(size, drop_last=drop_last)(items))
    assert all(len(b) == size for b in batches[:-1])
    kept = len(items) - len(items) % size if drop_last else len(items)
    assert [x for b in batches for x in b] == items[:kept]
    if batches:
        assert len(batches[-1]) == (size if drop_last or len(items) % size == 0 else len(items) % size)


@given(st.lists(st.integers(1, 9), max_size=50), st.integers(1, 20))
def test_predicate_batches_are_non_empty_capped_maximal_and_the_stream(sizes, cap):
    def fits(chunk, item):
        return sum(chunk) + item <= cap

    batches = list(fp.batch(fits)(sizes))
    assert [x for b in batches for x in b] == sizes
    assert all(b and (len(b) == 1 or sum(b) <= cap) for b in batches)
    assert all(sum(b) + nxt[0] > cap for b, nxt in zip(batches, batches[1:]))  # maximal


@given(stream_items, batch_sizes)
def test_unbatch_undoes_batch(items, size):
    assert list(fp.unbatch()(fp.batch(size)(items))) == items


# numpy drops trailing NUL characters of strings, so texts here end otherwise
texts = st.text(max_size=3).filter(lambda text: not text.endswith("\x00"))


@given(st.lists(st.tuples(st.integers(), st.floats(allow_nan=False), texts), min_size=1,
                max_size=10))
def test_uncombine_undoes_combine_to_arrays(items):
    assert fp.stream.uncombine(fp.combine_to_arrays(items)) == items


@given(st.lists(st.fixed_dictionaries({"a": st.integers(), "b": st.booleans()}),
                min_size=1, max_size=10))
def test_uncombine_undoes_combine_dicts(items):
    assert fp.stream.uncombine(fp.combine_dicts(items)) == items


@given(same_rank_shapes(), st.data())
def test_padding_puts_each_array_at_its_offset_in_the_largest_shape(shapes, data):
    ndim = len(shapes[0])
    ratio = data.draw(st.floats(0, 1) | st.lists(st.floats(0, 1), min_size=ndim, max_size=ndim))
    arrays = [np.full(shape, i + 1) for i, shape in enumerate(shapes)]
    batch = fp.pad_batch_equal(arrays, padding_values=-7, ratio=ratio)
    target = np.max(shapes, axis=0) if ndim else ()
    assert batch.shape == (len(shapes), *target)
    for i, (array, padded) in enumerate(zip(arrays, batch)):
        offset = (np.subtract(target, array.shape) * np.broadcast_to(ratio, (ndim,))).astype(int)
        inside = tuple(slice(o, o + s) for o, s in zip(offset, array.shape))
        assert (padded[inside] == i + 1).all()
        outside = np.ones(padded.shape, bool)
        outside[inside] = False
        assert (padded[outside] == -7).all()


def _item(x, bad):
    """A field of a shape that depends on ``x`` (so some batches are ragged), and ``x``;
    a KeyError at the values in ``bad``."""
    if x in bad:
        raise KeyError(f"bad item {x}")
    return np.full((2, 1 + (x % 7 == 0)), x), x


def _outcome(stream):
    batches = []
    try:
        for batch in stream:
            batches.append(tuple(field.tolist() for field in batch))
    except (KeyError, ValueError) as error:
        return batches, (type(error), str(error))
    return batches, None


@given(stream_items, batch_sizes, st.booleans(), st.sets(st.integers(-1000, 1000), max_size=2),
       st.sampled_from(["combine_to_arrays", "combine_pad"]), st.booleans())
def test_fused_batches_are_the_batches_and_errors_of_the_stages_one_after_another(
        items, size, drop_last, bad, combiner, fold):
    from toolz import pipe

    combine = getattr(fp, combiner)
    after = [fp.batch(size, drop_last=drop_last), fp.stream.map(combine)]
    fused = pipe(items, fp.stream.map(_item, bad, in_workers=fold),
                 fp.processes(fp.identity, n_workers=2, backend="threading",
                              options=fp.ParallelOptions(chunk_size=5)),
                 *after)
    reference = pipe(items, fp.stream.map(_item, bad), *after)
    assert _outcome(fused) == _outcome(reference)
    assert "fused" in str(fp.explain(fused))


def _batch_checked(batch, bad):
    """``batch``, except a KeyError naming the batch when its first label is in ``bad``."""
    first = int(batch[1][0])
    if first in bad:
        raise KeyError(f"bad batch from {first}")
    return batch


@given(stream_items, batch_sizes, st.sets(st.integers(-1000, 1000), max_size=2),
       st.sets(st.integers(-1000, 1000), max_size=2))
def test_maps_folded_after_a_fused_combiner_give_the_batches_and_errors_of_the_stages(
        items, size, bad_items, bad_batches):
    from toolz import pipe

    def stages(folded):
        return [fp.processes(functools.partial(_item, bad=bad_items), n_workers=2,
                             backend="threading", options=fp.ParallelOptions(chunk_size=5)),
                fp.batch(size), fp.stream.map(fp.combine_pad),
                fp.stream.map(_batch_checked, bad_batches, in_workers=folded)]
    fused = pipe(items, *stages(True))
    assert _outcome(fused) == _outcome(pipe(items, *stages(False)))
    assert "runs in the workers, on each batch" in str(fp.explain(fused))
