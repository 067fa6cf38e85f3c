"""The recipes in every shape fpipe has: a function in map, threads and processes; a field
transform of the torch datasets, alone and in Compose with a prefix; inside a worker-side
batch function. A seeded stage gives the same crops whatever runs it."""

from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest
from toolz import pipe

import fpipe as fp
from fpipe.dataset import ListReader
from fpipe.image import normalize, random_resized_crop, resized_center_crop

from .conftest import encode, scene

IMAGES = [encode(scene(160 + 8 * i, 120, seed=i)) for i in range(10)]


def _expected(crop, epoch=0):
    """Item i's crop under the generator a seeded stage gives it: (seed 0, epoch, i)."""
    out = []
    for index, data in enumerate(IMAGES):
        with fp.using_rng(fp.item_rng(0, epoch, index)):
            out.append(crop(data))
    return out


def _equal(got, expected):
    return len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))


@pytest.mark.timeout(240)
def test_the_same_crops_in_map_threads_and_processes_of_any_size():
    crop = random_resized_crop(48)
    expected = _expected(crop)
    assert _equal(list(pipe(IMAGES, fp.stream.map(crop, seed=0))), expected)
    assert _equal(list(pipe(IMAGES, fp.threads(crop, n_workers=2, seed=0))), expected)
    for workers in (1, 2):
        with closing(fp.processes(crop, n_workers=workers, seed=0,
                                  options=fp.ParallelOptions(chunk_size=3))) as stage:
            assert _equal(list(stage(IMAGES)), expected)


class CropBatch:
    """A worker-side batch function: crop each image of the batch, stack, normalise."""

    def __init__(self, crop) -> None:
        self.crop = crop

    def __call__(self, batch: list) -> np.ndarray:
        return normalize(np.stack([self.crop(data) for data in batch]), layout="CHW")


@pytest.mark.timeout(240)
def test_inside_a_worker_side_batch_function_the_batches_are_reproducible():
    make = CropBatch(random_resized_crop(40, layout="CHW"))
    serial = list(pipe(IMAGES, fp.batch(4), fp.stream.map(make, seed=0)))
    with closing(fp.processes(make, n_workers=2, seed=0)) as stage:
        parallel = list(pipe(IMAGES, fp.batch(4), stage))
    assert [b.shape for b in parallel] == [(4, 3, 40, 40), (4, 3, 40, 40), (2, 3, 40, 40)]
    assert _equal(parallel, serial) and parallel[0].dtype == np.float32


def _samples():
    return ListReader([{"key": f"k{i}", "image": data, "label": i} for i, data in enumerate(IMAGES)])


def test_a_field_transform_of_the_torch_dataset_alone_and_in_compose_with_a_prefix():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from fpipe.torch import Compose, Dataset, Samples

    crop = random_resized_crop(32, layout="CHW")
    expected = _expected(crop, epoch=1)

    def tag(value, number):
        return value, number

    for transform in (crop, Compose(crop, prefix="image_"), Compose(crop, tag, prefix="image_")):
        dataset = Dataset(_samples(), transforms={"image": transform}, epoch=1,
                          rng=lambda sample: {"image_number": 7}, samples=Samples(seed=0))
        got = [dataset[i]["image"] for i in range(len(dataset))]
        if transform.__class__ is Compose and len(transform.funcs) == 2:
            assert {number for _, number in got} == {7}
            got = [value for value, _ in got]
        assert _equal(got, expected)
    loaded = DataLoader(Dataset(_samples(), transforms={"image": crop}, epoch=1, samples=Samples(seed=0)),
                        batch_size=5, num_workers=2)
    batches = [batch["image"] for batch in loaded]
    assert isinstance(batches[0], torch.Tensor)
    assert _equal([image.numpy() for batch in batches for image in batch], expected)


def test_the_evaluation_recipe_is_the_same_everywhere():
    center = resized_center_crop(48, 56)
    expected = [center(data) for data in IMAGES]
    assert _equal(list(pipe(IMAGES, fp.threads(center, n_workers=2))), expected)
