"""The crop boxes are torchvision's: a reference of its documented RandomResizedCrop algorithm,
written here, fed the same draws, gives the same boxes; and the recipe's pixels are those of
the reference box."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

import fpipe
from fpipe.image import decode_image, random_resized_crop
from fpipe.image.boxes import center_box, random_resized_box, resized_size

from .conftest import encode, scene


def torchvision_get_params(rng, height, width, scale, ratio):
    """torchvision's documented ``RandomResizedCrop.get_params``, returning ``(i, j, h, w)``
    (top, left, height, width), with its draws taken from ``rng`` in the documented order:
    the area fraction, the log aspect ratio, then the top and the left of a box that fits."""
    area = height * width
    low, high = math.log(ratio[0]), math.log(ratio[1])
    for _attempt in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(low, high))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    # fallback to a central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


SIZES = [(500, 375), (375, 500), (1000, 10), (10, 1000), (1, 1), (3, 2), (224, 224), (4000, 3000)]
SETTINGS = [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.9, 1.0), (1.0, 1.0)), ((0.5, 2.0), (0.1, 10.0)),
            ((1.0, 1.0), (3 / 4, 4 / 3)), ((0.0, 0.01), (3 / 4, 4 / 3))]


@pytest.mark.parametrize("width, height", SIZES)
@pytest.mark.parametrize("scale, ratio", SETTINGS)
def test_boxes_equal_the_reference_fed_the_same_draws(width, height, scale, ratio):
    fallbacks = 0
    for seed in range(60):
        ours_rng, reference_rng = np.random.default_rng(seed), np.random.default_rng(seed)
        box = random_resized_box(ours_rng, width, height, scale, ratio)
        i, j, h, w = torchvision_get_params(reference_rng, height, width, scale, ratio)
        assert tuple(box) == (j, i, w, h)
        # the same number of draws too: what comes next is the same
        assert ours_rng.random() == reference_rng.random()
        fallbacks += (i, j) == ((height - h) // 2, (width - w) // 2) and (w, h) != (1, 1)
    if (width, height) in ((1000, 10), (10, 1000)) and scale == (0.08, 1.0):
        assert fallbacks > 0  # the fallback is exercised


def _reference_pixels(data, n, size, flip_probability=0.5):
    rng = fpipe.item_rng(0, 0, n)
    image = decode_image(data)
    i, j, h, w = torchvision_get_params(rng, image.height, image.width, (0.08, 1.0), (3 / 4, 4 / 3))
    resized = image.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=(j, i, j + w, i + h))
    if rng.random() < flip_probability:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


@pytest.mark.parametrize("size", [(224, 224), (96, 160)])
def test_the_recipe_crops_the_reference_box_and_flips_with_the_next_draw(size):
    data = encode(scene(), quality=92)
    pillow = random_resized_crop(size, backend="pillow", scaled_decode=False)
    torch = random_resized_crop(size, backend="torch", scaled_decode=False)
    flipped = 0
    for n in range(24):
        expected = _reference_pixels(data, n, size)
        with fpipe.using_rng(fpipe.item_rng(0, 0, n)):
            assert np.array_equal(pillow(data), expected)  # Pillow's kernel: the same pixels
        with fpipe.using_rng(fpipe.item_rng(0, 0, n)):
            assert np.abs(torch(data).astype(int) - expected).mean() <= 0.2
        flipped += not np.array_equal(expected, _reference_pixels(data, n, size, 0.0))
    assert 0 < flipped < 24


def test_flip_zero_and_one_still_draw_once():
    data = encode(scene(64, 48))
    for flip in (0.0, 1.0):
        with fpipe.using_rng(fpipe.item_rng(0, 0, 1)) as rng:
            random_resized_crop(32, flip=flip)(data)
            after = rng.random()
        reference = fpipe.item_rng(0, 0, 1)
        torchvision_get_params(reference, 48, 64, (0.08, 1.0), (3 / 4, 4 / 3))
        reference.random()
        assert after == reference.random()


def test_evaluation_box_is_resize_then_center_crop():
    # torchvision: Resize(256) makes 500 x 375 into 341 x 256 (rounded down), CenterCrop(224)
    # starts at round((341 - 224) / 2) = 58 (Python rounds half to even) and 16
    assert resized_size(500, 375, 256) == (341, 256)
    assert resized_size(375, 500, 256) == (256, 341)
    assert resized_size(300, 299, 256) == (256, 256)
    assert tuple(center_box(341, 256, (224, 224))) == (58, 16, 224, 224)
    assert tuple(center_box(256, 341, (224, 200))) == (28, 58, 200, 224)
