"""The recipes as transforms: every image that loads today still loads, the output's shape,
layout and dtype, the scaled decode, the kernels with and without torch, and clear errors."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import fpipe
from fpipe.image import ImageDecodeError, decode_image, random_resized_crop, resized_center_crop
from fpipe.image import decode as decoders
from fpipe.image.decode import EncodedImage

from .conftest import encode, scene

BACKENDS = ["torch", "pillow"]


def _with_rng(transform, data, index=0):
    with fpipe.using_rng(fpipe.item_rng(0, 0, index)):
        return transform(data)


def _kinds() -> dict[str, bytes]:
    """One image of every kind that CompressedToPIL loads, 120 x 90."""
    rgb = Image.fromarray(scene(120, 90))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees to show
    return {
        "baseline JPEG": encode(rgb, quality=90),
        "progressive JPEG": encode(rgb, quality=90, progressive=True),
        "4:4:4 JPEG": encode(rgb, quality=90, subsampling=0),
        "grayscale JPEG": encode(rgb.convert("L"), quality=90),
        "CMYK JPEG": encode(rgb.convert("CMYK"), quality=95),
        "JPEG with EXIF orientation": encode(rgb, quality=90, exif=exif),
        "RGB PNG": encode(rgb, "PNG"),
        "RGBA PNG": encode(rgb.convert("RGBA"), "PNG"),
        "grayscale PNG": encode(rgb.convert("L"), "PNG"),
        "palette PNG": encode(rgb.convert("P"), "PNG"),
        "BMP": encode(rgb, "BMP"),
        "WebP": encode(rgb, "WEBP", lossless=True),
        "TIFF": encode(rgb, "TIFF"),
    }


KINDS = _kinds()


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_kind_of_image_loads_as_decode_image_sees_it(kind, backend):
    data = KINDS[kind]
    decoded = decode_image(data)  # CompressedToPIL's pixels: what loads today
    size = (64, 48)
    crop = _with_rng(random_resized_crop(size, flip=0.0, backend=backend), data, 3)
    rng = fpipe.item_rng(0, 0, 3)
    from fpipe.image.boxes import random_resized_box

    box = random_resized_box(rng, decoded.width, decoded.height, (0.08, 1.0), (3 / 4, 4 / 3))
    expected = np.asarray(decoded.resize(
        (48, 64), Image.Resampling.BILINEAR,
        box=(box.left, box.top, box.left + box.width, box.top + box.height)))
    assert crop.shape == (64, 48, 3) and crop.dtype == np.uint8
    assert np.abs(crop.astype(int) - expected).mean() <= 1.5
    center = resized_center_crop(32, 40, backend=backend)(data)
    assert center.shape == (32, 32, 3)


def test_exif_orientation_is_not_applied_as_torchvision_does_not():
    plain, oriented = KINDS["baseline JPEG"], KINDS["JPEG with EXIF orientation"]
    for recipe in (random_resized_crop(64), resized_center_crop(64)):
        assert np.array_equal(_with_rng(recipe, plain), _with_rng(recipe, oriented))


@pytest.mark.parametrize("backend", BACKENDS)
def test_layouts_give_the_same_pixels_writable_and_contiguous(backend):
    data = encode(scene())
    for index in range(6):  # flipped and not
        hwc = _with_rng(random_resized_crop((96, 128), backend=backend), data, index)
        chw = _with_rng(random_resized_crop((96, 128), layout="CHW", backend=backend), data, index)
        assert hwc.shape == (96, 128, 3) and chw.shape == (3, 96, 128)
        assert np.array_equal(hwc.transpose(2, 0, 1), chw)
        for array in (hwc, chw):
            assert array.flags.writeable and array.flags.c_contiguous
    center = resized_center_crop((64, 80), 100, layout="CHW", backend=backend)(data)
    assert center.shape == (3, 64, 80) and center.flags.c_contiguous and center.flags.writeable


def test_the_same_item_generator_gives_the_same_crop_and_another_another():
    data, crop = encode(scene()), random_resized_crop(100)
    first, again, other = (_with_rng(crop, data, index) for index in (5, 5, 6))
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_images_smaller_than_the_output_are_enlarged():
    tiny = encode(scene(7, 5), "PNG")
    assert _with_rng(random_resized_crop(32), tiny).shape == (32, 32, 3)
    assert resized_center_crop(32)(tiny).shape == (32, 32, 3)


@pytest.mark.parametrize("jpeg_decoder", ["simplejpeg", "pillow"])
def test_a_large_jpeg_is_decoded_at_the_largest_reduction_that_keeps_the_box(jpeg_decoder,
                                                                             monkeypatch):
    if jpeg_decoder == "pillow":  # as if simplejpeg were not installed: Pillow's draft
        monkeypatch.setattr(decoders, "_simplejpeg", False)
    reductions = []
    decode = EncodedImage.decode

    def recording(self, reduction=1, order="RGB"):
        decoded = decode(self, reduction, order)
        reductions.append((reduction, decoded.pixels.shape))
        return decoded
    monkeypatch.setattr(EncodedImage, "decode", recording)
    data = encode(scene(2003, 1501), quality=90)  # not a multiple of 8: rounded-up sizes
    full = resized_center_crop(224, 256, scaled_decode=False)(data)
    assert reductions.pop() == (1, (1501, 2003, 3))
    reduced = resized_center_crop(224, 256)(data)
    assert reductions.pop() == (4, (376, 501, 3))  # 1501 / 8 < 256 <= 1501 / 4
    assert np.abs(full.astype(int) - reduced).mean() < 6
    for index in range(8):
        _with_rng(random_resized_crop(224), data, index)
        reduction, shape = reductions.pop()
        assert shape == (-(-1501 // reduction), -(-2003 // reduction), 3)
    _with_rng(random_resized_crop(224, scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3)), data)
    assert reductions.pop()[0] == 4  # the whole 2003 x 1501 image: 1501 / 4 >= 224


def test_formats_other_than_jpeg_are_decoded_at_full_size():
    image = EncodedImage(encode(scene(900, 700), "PNG"))
    assert image.reduction_for(100, 100) == 1


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_decode_asked_for_bgr_gives_it_where_the_jpeg_decoder_can_and_says_which_came(kind):
    image = EncodedImage(KINDS[kind])
    rgb, bgr = image.decode(1), EncodedImage(KINDS[kind]).decode(1, "BGR")
    assert rgb.order == "RGB" and bgr.order in ("RGB", "BGR")
    expected = rgb.pixels[:, :, ::-1] if bgr.order == "BGR" else rgb.pixels
    assert np.array_equal(bgr.pixels, expected)
    if kind == "baseline JPEG" or "JPEG" not in kind:  # simplejpeg's, or Pillow's
        assert bgr.order == ("BGR" if "JPEG" in kind else "RGB")


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("box", [(3, 5, 61, 40), (2.5, 4.25, 60.5, 39.75)])  # whole, fractional
@pytest.mark.parametrize("use_torch", [True, False])
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_bgr_pixels_resize_to_the_rgb_pixels_of_their_rgb_twins(flip, box, use_torch, layout):
    from fpipe.image.kernels import resize_box

    rgb = scene(64, 48)
    bgr = np.ascontiguousarray(rgb[:, :, ::-1])
    expected = resize_box(rgb, box, (20, 30), use_torch, flip, layout)
    assert np.array_equal(resize_box(bgr, box, (20, 30), use_torch, flip, layout, "BGR"), expected)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("layout", ["HWC", "CHW"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mirrored_crop_is_the_mirror_of_the_same_crop_unmirrored(kind, layout, backend):
    mirrored = random_resized_crop(24, flip=1.0, layout=layout, backend=backend)
    plain = random_resized_crop(24, flip=0.0, layout=layout, backend=backend)
    for index in range(6):
        expected = np.flip(_with_rng(plain, KINDS[kind], index), 1 if layout == "HWC" else 2)
        assert np.array_equal(_with_rng(mirrored, KINDS[kind], index), expected)


@pytest.mark.parametrize("recipe", [random_resized_crop(32), resized_center_crop(32)])
def test_bytes_that_are_not_an_image_raise_a_decode_error(recipe):
    with pytest.raises(ImageDecodeError, match=r"not an image \(its 12 bytes start with b'not an image'\)"):
        _with_rng(recipe, b"not an image")
    truncated = encode(scene())[:2000]
    with pytest.raises(ImageDecodeError, match="cannot decode 2000 bytes"):
        _with_rng(recipe, truncated)
    with pytest.raises(TypeError, match="an encoded image must be bytes"):
        _with_rng(recipe, 17)


def test_buffers_of_every_kind_are_taken():
    data = encode(scene(80, 60))
    crop = random_resized_crop(32)
    expected = _with_rng(crop, data)
    for buffer in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert np.array_equal(_with_rng(crop, buffer), expected)


@pytest.mark.parametrize("call, error, message", [
    (lambda: random_resized_crop(0), ValueError, "size must be >= 1; got size=0"),
    (lambda: random_resized_crop((224, 0)), ValueError, r"size\[1\] must be >= 1"),
    (lambda: random_resized_crop((1, 2, 3)), TypeError, "size must be an int or"),
    (lambda: random_resized_crop(2.5), TypeError, "size must be an integer"),
    (lambda: random_resized_crop(8, scale=(1.0, 0.5)), ValueError, "scale must be"),
    (lambda: random_resized_crop(8, scale=0.5), TypeError, "scale must be a pair"),
    (lambda: random_resized_crop(8, ratio=(0, 1)), ValueError, "ratio must be .* 0 < low"),
    (lambda: random_resized_crop(8, flip=2), ValueError, "flip must be a probability"),
    (lambda: random_resized_crop(8, layout="NHWC"), ValueError, "layout must be 'HWC' or 'CHW'"),
    (lambda: random_resized_crop(8, backend="cuda"), ValueError, "backend must be"),
    (lambda: random_resized_crop(8, scaled_decode=1), TypeError, "scaled_decode must be True"),
    (lambda: resized_center_crop(224, 200), ValueError, "resize must be at least .* 224"),
    (lambda: resized_center_crop((100, 300), 250), ValueError, "resize must be at least .* 300"),
])
def test_bad_arguments_are_refused_when_the_transform_is_made(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_transforms_pickle_compare_and_show_how_they_were_made():
    crop = random_resized_crop((96, 128), scale=(0.5, 1.0), flip=0.0, layout="CHW")
    assert pickle.loads(pickle.dumps(crop)) == crop and hash(crop) == hash(pickle.loads(pickle.dumps(crop)))
    assert crop != random_resized_crop((96, 128))
    assert repr(crop) == "random_resized_crop((96, 128), scale=(0.5, 1.0), flip=0.0, layout='CHW')"
    assert repr(resized_center_crop(224)) == "resized_center_crop(224)"
    assert repr(resized_center_crop(224, 240, backend="pillow")) == \
        "resized_center_crop(224, resize=240, backend='pillow')"


def test_torch_backend_is_the_default_when_torch_is_installed():
    pytest.importorskip("torch")
    assert random_resized_crop(8)._torch and not random_resized_crop(8, backend="pillow")._torch


def test_without_torch_pillow_does_the_work_and_backend_torch_says_what_is_missing(tmp_path):
    data = tmp_path / "image.jpg"
    data.write_bytes(encode(scene(200, 150)))
    code = f"""
import sys
sys.modules["torch"] = None  # as if torch were not installed
import numpy as np, fpipe
from fpipe.image import random_resized_crop, resized_center_crop, normalize
data = open({str(data)!r}, "rb").read()
with fpipe.using_rng(fpipe.item_rng(0, 0, 0)):
    crop = random_resized_crop(64, layout="CHW")(data)
print(crop.shape, resized_center_crop(64)(data).shape, normalize(crop[None], layout="CHW").dtype)
try:
    random_resized_crop(64, backend="torch")
except ImportError as error:
    print(error)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "(3, 64, 64) (64, 64, 3) float32"
    assert lines[1].startswith("backend='torch' needs PyTorch; install it with: pip install 'fpipe[torch]'")


def test_a_pillow_image_the_decoder_refuses_names_the_bytes():
    broken = io.BytesIO()
    Image.new("RGB", (50, 40)).save(broken, "PNG")
    data = broken.getvalue()[:60]  # the header is there, the pixels are not
    with pytest.raises(ImageDecodeError, match="cannot decode 60 bytes starting"):
        _with_rng(random_resized_crop(16), data)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_pixel_image_with_a_far_ratio_still_gives_a_crop(backend):
    # no try fits (every box rounds to 0 x 1), and torchvision's fallback rounds to 0 x 1 too
    one = encode(np.full((1, 1, 3), 77, np.uint8), "PNG")
    crop = _with_rng(random_resized_crop(16, scale=(0.0, 0.5), ratio=(0.5, 0.5), backend=backend), one)
    assert crop.shape == (16, 16, 3) and (crop == 77).all()
