"""Laws of the image recipes' boxes and output: whatever the image's size and the settings,
the box lies inside the image and is torchvision's (the reference of tests/image fed the same
draws; where torchvision's fallback would leave an empty box on an image of a pixel or two,
one pixel), the draws that follow are the same, and the output has the size asked for."""

from __future__ import annotations

import io

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import fpipe
from fpipe.image import random_resized_crop, resized_center_crop
from fpipe.image.boxes import random_resized_box
from tests.image.test_boxes import torchvision_get_params

sides = st.integers(1, 5000)
fractions = st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 2.0)).map(sorted).filter(lambda p: p[1] > 0)
ratios = st.tuples(st.floats(0.05, 20.0), st.floats(0.05, 20.0)).map(sorted)


@given(sides, sides, fractions, ratios, st.integers(0, 2 ** 32))
def test_the_box_is_inside_the_image_and_is_torchvisions(width, height, scale, ratio, seed):
    ours, reference = np.random.default_rng(seed), np.random.default_rng(seed)
    box = random_resized_box(ours, width, height, tuple(scale), tuple(ratio))
    assert 0 <= box.left and box.left + box.width <= width and box.width >= 1
    assert 0 <= box.top and box.top + box.height <= height and box.height >= 1
    i, j, h, w = torchvision_get_params(reference, height, width, scale, ratio)
    if 0 in (w, h):  # torchvision's empty fallback box on a tiny image: one pixel instead
        w, h = max(w, 1), max(h, 1)
        i, j = (height - h) // 2, (width - w) // 2
    assert tuple(box) == (j, i, w, h)
    assert ours.random() == reference.random()


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


@settings(max_examples=30)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 64), st.integers(1, 64),
       st.sampled_from(["torch", "pillow"]), st.integers(0, 1000))
def test_the_output_has_the_size_asked_for_whatever_the_image(width, height, out_h, out_w,
                                                              backend, index):
    data = _png(width, height)
    with fpipe.using_rng(fpipe.item_rng(0, 0, index)):
        crop = random_resized_crop((out_h, out_w), backend=backend)(data)
    assert crop.shape == (out_h, out_w, 3) and (crop == (10, 20, 30)).all()
    center = resized_center_crop((out_h, out_w), max(out_h, out_w), backend=backend)(data)
    assert center.shape == (out_h, out_w, 3) and (center == (10, 20, 30)).all()


def _torch_reference(pixels: np.ndarray, box: tuple, size: tuple, flip: bool, layout: str):
    """torch's kernel called the plain way: the box of the (1, C, H, W) channels-last tensor,
    interpolated, mirrored, then as (H, W, C) or (C, H, W)."""
    import torch

    left, top, right, bottom = box
    region = torch.from_numpy(pixels).permute(2, 0, 1)[None, :, top:bottom, left:right]
    region = region.contiguous(memory_format=torch.channels_last)
    out = torch.nn.functional.interpolate(region, size=size, mode="bilinear", antialias=True,
                                          align_corners=False)
    out = (out.flip(3) if flip else out)[0]
    return (out if layout == "CHW" else out.permute(1, 2, 0)).contiguous().numpy()


@settings(max_examples=40)
@given(st.integers(1, 80), st.integers(1, 80), st.data(), st.integers(1, 50), st.integers(1, 50),
       st.booleans(), st.sampled_from(["HWC", "CHW"]), st.integers(0, 2 ** 32))
def test_the_torch_kernel_gives_the_pixels_of_torch_called_the_plain_way(
        width, height, data, out_h, out_w, flip, layout, seed):
    from fpipe.image.kernels import resize_box

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)
    left = data.draw(st.integers(0, width - 1))
    top = data.draw(st.integers(0, height - 1))
    box = (left, top, data.draw(st.integers(left + 1, width)), data.draw(st.integers(top + 1, height)))
    out = resize_box(pixels, box, (out_h, out_w), use_torch=True, flip=flip, layout=layout)
    assert out.flags.c_contiguous and out.flags.writeable
    assert np.array_equal(out, _torch_reference(pixels, box, (out_h, out_w), flip, layout))
    if layout == "HWC" and min(box[2] - box[0], box[3] - box[1]) > 1:
        # the kernel read channels-last memory, so it wrote HWC: the pixels are its own
        assert out.base is not None
