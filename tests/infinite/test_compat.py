"""dpipe compatibility: every example of dpipe's batch-iterator API page, and the patterns of its
batch-iterator tutorial, run with ``from fpipe import ...`` in place of the dpipe imports."""

from collections import Counter

import numpy as np
import pytest

from fpipe import (
    ExpirationPool,
    Infinite,
    Iterator,
    Loky,
    Threads,
    apply_at,
    combine_batches,
    combine_pad,
    combine_to_arrays,
    expiration_pool,
    load_by_random_id,
    multiply,
    pad_batch_equal,
    random_apply,
    sample,
    sample_args,
    unpack_args,
    zip_apply,
)

from .helpers import timed_sleep

# a small MNIST stand-in: the tutorial loads MNIST with transform=np.array
DATASET = [(np.full((28, 28), i, dtype=np.uint8), i % 10) for i in range(100)]


# --- the API page's examples ------------------------------------------------------------------


def test_unpack_args_example():
    def add(x, y):
        return x + y

    add_ = unpack_args(add)
    assert add(1, 2) == add_([1, 2])


def test_apply_at_example():
    first_sqr = apply_at(0, np.square)
    assert first_sqr([3, 2, 1]) == (9, 2, 1)


def test_zip_apply_example():
    zipper = zip_apply(np.square, np.sqrt)
    assert zipper([4, 9]) == (16, 3)


def test_sample_args_example():
    rotate = pytest.importorskip("scipy.ndimage").rotate
    x = np.arange(16.0).reshape(4, 4)
    random_rotate = sample_args(rotate, angle=np.random.normal)
    assert random_rotate(x).shape == rotate(x, angle=np.random.normal()).shape


def test_expiration_pool_example_inside_infinite():
    pool_size, repetitions = 4, 3
    loads = Counter()

    def expensive(i):
        loads[i] += 1
        return (i,)

    with Infinite(iter(range(8)), expensive, ExpirationPool(pool_size, repetitions),
                  lambda pair: (pair[0] * 10,), batch_size=4, batches_per_epoch=100) as batch_iter:
        values = [int(v) for (xs,) in batch_iter() for v in xs]
    assert Counter(values) == {10 * i: repetitions for i in range(8)}
    assert loads == dict.fromkeys(range(8), 1)


def test_the_remaining_names_with_their_documented_signatures():
    assert combine_batches([(1, "a"), (2, "b")]) == ((1, 2), ("a", "b"))
    xs, ys = combine_to_arrays([(np.zeros(2), 0), (np.ones(2), 1)])
    assert xs.shape == (2, 2) and list(ys) == [0, 1]
    padded, labels = combine_pad([(np.ones(1), 0), (np.ones(3), 1)], padding_values=0, ratio=0.5)
    assert padded.tolist() == [[0, 1, 0], [1, 1, 1]] and list(labels) == [0, 1]
    assert pad_batch_equal([np.ones(1), np.ones(2)], padding_values=5, ratio=0).tolist() == \
        [[1, 5], [1, 1]]
    first = sample([1, 2, 3], weights=[0, 1, 0], random_state=np.random.RandomState(0))
    assert [next(first) for _ in range(3)] == [2, 2, 2]
    loaded = load_by_random_id(str, len, ids=["ab", "c"], weights=[1, 0], random_state=0)
    assert next(loaded) == ("ab", 2)
    assert sorted(expiration_pool(range(3), pool_size=2, repetitions=2)) == [0, 0, 1, 1, 2, 2]
    assert multiply(np.square)([2, 3]) == (4, 9)
    assert random_apply(1, np.negative)(3) == -3 and random_apply(0, np.negative)(3) == 3


# --- the tutorial -------------------------------------------------------------------------------


def test_sampling_iterating_and_closing():
    batch_iter = Infinite(sample(DATASET), batch_size=30, batches_per_epoch=10)
    shapes = [(xs.shape, ys.shape) for xs, ys in batch_iter()]
    assert shapes == [((30, 28, 28), (30,))] * 10
    assert len(list(batch_iter())) == 10  # calling it again gives the next 10
    batch_iter.close()
    with batch_iter:
        assert len(list(batch_iter())) == 10


def zoom(image, scale_factor):
    # nearest-neighbour zoom by integer factors, as a stand-in for an image library's zoom
    for axis, factor in enumerate(scale_factor):
        image = np.repeat(image, factor, axis=axis)
    return image


def zoom_image(pair):
    image, label = pair
    return zoom(image, scale_factor=[2, 2]), label


def zoom_image_args(image, label):
    return zoom(image, scale_factor=[2, 2]), label


@pytest.mark.parametrize("transform", [
    zoom_image,
    unpack_args(zoom_image_args),
    lambda pair: (zoom(pair[0], scale_factor=[2, 2]), pair[1]),
    apply_at(0, zoom, scale_factor=[2, 2]),
], ids=["pair", "unpack_args", "lambda", "apply_at"])
def test_transformations(transform):
    with Infinite(sample(DATASET, random_state=0), transform, batch_size=8,
                  batches_per_epoch=3) as batch_iter:
        for xs, ys in batch_iter():
            assert xs.shape == (8, 56, 56) and ys.shape == (8,)
            assert all((x == x[0, 0]).all() for x in xs)


def test_training_tutorial_pipeline():
    with Infinite(sample(DATASET), apply_at(0, lambda x: x[None].astype("float32")),
                  batch_size=30, batches_per_epoch=10) as batch_iter:
        xs, ys = next(iter(batch_iter()))
    assert xs.shape == (30, 1, 28, 28) and xs.dtype == np.float32


def _call_intervals(*transformers) -> list:
    # the tutorial's set-up: a finite range, one batch of all of it
    with Infinite(range(12), *transformers, batch_size=12, batches_per_epoch=1,
                  combiner=list) as batch_iter:
        (batch,) = batch_iter()
    assert [item for item, _, _ in batch] == list(range(12))
    return [(start, end) for _, start, end in batch]


def _overlapping(intervals: list) -> bool:
    return any(a_start < b_end and b_start < a_end
               for i, (a_start, a_end) in enumerate(intervals)
               for b_start, b_end in intervals[i + 1:])


@pytest.mark.parametrize("stage", [Threads, Loky], ids=["threads", "loky"])
def test_threads_and_loky_run_two_calls_at_once(stage):
    # dpipe's tutorial halves a sleep-bound pipeline with two workers; what makes that possible
    # is calls that overlap in time, which a loaded machine cannot take away (a speed-up can)
    _call_intervals(stage(timed_sleep, 0.001, n_workers=2))  # start the workers first
    assert _overlapping(_call_intervals(stage(timed_sleep, n_workers=2)))
    assert not _overlapping(_call_intervals(timed_sleep))


def test_combine_pad_pads_each_batch_to_its_largest_image():
    rng = np.random.default_rng(0)
    images = [(rng.random((10, 10, int(rng.integers(20, 40)))), i) for i in range(20)]
    with Infinite(iter(images), batch_size=5, batches_per_epoch=4,
                  combiner=combine_pad) as batch_iter:
        batches = list(batch_iter())
    for k, (xs, ys) in enumerate(batches):
        widths = [image.shape[-1] for image, _ in images[5 * k:5 * k + 5]]
        assert xs.shape == (5, 10, 10, max(widths))
        assert list(ys) == list(range(5 * k, 5 * k + 5))


def test_combiner_keyword_arguments_are_forwarded_and_a_stage_combiner_takes_its_own():
    items = [(np.ones(1), 0), (np.ones(3), 1)]
    with Infinite(iter(items), batch_size=2, batches_per_epoch=1, combiner=combine_pad,
                  padding_values=-1, ratio=0) as batch_iter:
        (xs, _), = batch_iter()
    assert xs.tolist() == [[1, -1, -1], [1, 1, 1]]
    stage = Threads(combine_pad, n_workers=2, padding_values=-1, ratio=0)
    with Infinite(iter(items), batch_size=2, batches_per_epoch=1, combiner=stage) as batch_iter:
        (same, _), = batch_iter()
    assert same.tolist() == xs.tolist()
    with pytest.raises(TypeError, match="'padding_values': combiner .* already a stage"):
        Infinite(iter(items), batch_size=2, batches_per_epoch=1, combiner=stage, padding_values=0)
    with pytest.raises(TypeError, match="combine_pad does not take"):
        Infinite(iter(items), batch_size=2, batches_per_epoch=1, combiner=combine_pad, size=3)


def test_adaptive_batch_size_caps_the_total_width():
    rng = np.random.default_rng(1)
    images = [(rng.random((3, int(rng.integers(15, 40)))), i) for i in range(60)]

    def should_add(seq, item):
        return sum(x.shape[-1] for x, _ in seq) + item[0].shape[-1] <= 100

    with Infinite(iter(images), batch_size=should_add, batches_per_epoch=100,
                  combiner=combine_pad) as batch_iter:
        batches = list(batch_iter())
    sizes = [len(ys) for _, ys in batches]
    assert sum(sizes) == 60 and all(size >= 1 for size in sizes)
    labels = [int(y) for _, ys in batches for y in ys]
    assert labels == list(range(60))
    start = 0
    for size in sizes:
        widths = [images[i][0].shape[-1] for i in range(start, start + size)]
        assert size == 1 or sum(widths) <= 100
        if start + size < 60:  # maximal: the next image would not have fitted
            assert sum(widths) + images[start + size][0].shape[-1] > 100
        start += size


def test_iterator_hands_the_transform_the_whole_stream():
    with Infinite(range(10), Iterator(lambda items: (x for x in items if x % 3)),
                  batch_size=3, batches_per_epoch=5, combiner=list) as batch_iter:
        assert list(batch_iter()) == [[1, 2, 4], [5, 7, 8]]
