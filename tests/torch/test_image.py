"""CompressedToPIL and decode_image: every format Pillow reads, to RGB; clear errors."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from fpipe.dataset import ListReader
from fpipe.image import CompressedToPIL, ImageDecodeError, decode, decode_image
from fpipe.torch import Compose, Dataset, IterableDataset

from .conftest import encode, pixels


@pytest.fixture(params=["simplejpeg", "pillow"])
def jpeg_decoder(request, monkeypatch):
    """Run a test with simplejpeg, and again as if it were not installed."""
    if request.param == "pillow":
        monkeypatch.setattr(decode, "_simplejpeg", False)
    return request.param


def test_simplejpeg_is_used_when_installed():
    pytest.importorskip("simplejpeg")  # the test and bench extras install it
    decode.jpeg_decoder()
    assert decode._simplejpeg.__name__ == "simplejpeg"


@pytest.mark.parametrize("mode, format, options", [
    ("RGB", "PNG", {}),
    ("L", "PNG", {}),
    ("RGBA", "PNG", {}),
    ("RGB", "BMP", {}),
    ("RGB", "TIFF", {}),
    ("RGB", "WEBP", {"lossless": True}),
    ("L", "GIF", {}),
])
def test_lossless_formats_decode_to_the_same_rgb_pixels(mode, format, options):
    source = Image.fromarray(pixels(channels={"L": 1, "RGB": 3, "RGBA": 4}[mode]))
    expected = np.asarray(source.convert("RGB"))
    decoded = CompressedToPIL()(encode(np.asarray(source), format, **options))
    assert decoded.mode == "RGB"
    assert np.array_equal(np.asarray(decoded), expected)


@pytest.mark.parametrize("channels", [1, 3])
def test_jpeg_decodes_to_rgb_with_or_without_simplejpeg(jpeg_decoder, channels):
    shape = (64, 48) if channels == 1 else (64, 48, channels)
    smooth = np.linspace(0, 255, 64 * 48 * channels).reshape(shape).astype(np.uint8)
    data = encode(smooth, "JPEG", quality=95)
    decoded = decode_image(data)
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.int16)
    assert decoded.mode == "RGB" and decoded.size == (48, 64)
    assert np.abs(np.asarray(decoded, np.int16) - reference).max() <= 2


def test_cmyk_jpeg_which_simplejpeg_refuses_still_decodes(jpeg_decoder):
    cmyk = Image.fromarray(pixels(16, 16)).convert("CMYK")
    buffer = io.BytesIO()
    cmyk.save(buffer, format="JPEG")
    assert decode_image(buffer.getvalue()).mode == "RGB"


def test_any_buffer_is_accepted():
    data = encode(pixels(), "PNG")
    for buffer in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8)):
        assert decode_image(buffer).size == (8, 6)
    assert decode_image(data, mode="L").mode == "L"


@pytest.mark.parametrize(("data", "message"), [
    (b"", "empty (0 bytes), not an image"),
    (b"hello world", "not an image (its 11 bytes start with b'hello world')"),
    (encode(pixels(), "PNG")[:40], "cannot decode 40 bytes starting b'\\x89PNG"),
    (b"\xff\xd8\xff\xe0 a jpeg header and then nothing",
     "cannot decode 35 bytes starting b'\\xff\\xd8\\xff")])
def test_bytes_that_are_not_an_image_raise_a_value_error_describing_them(jpeg_decoder, data,
                                                                          message):
    with pytest.raises(ImageDecodeError) as raised:
        decode_image(data)
    assert isinstance(raised.value, ValueError)
    assert str(raised.value).startswith(message), str(raised.value)
    assert "<_io." not in str(raised.value)  # Pillow's internal buffer object is no news


def test_a_value_that_is_not_bytes_is_a_type_error():
    with pytest.raises(TypeError, match="must be bytes.*got str"):
        CompressedToPIL()("image.jpg")


def test_the_datasets_name_the_sample_whose_bytes_are_not_an_image():
    reader = ListReader([{"key": "good", "image": encode(pixels(), "PNG")},
                         {"key": "broken", "image": b"garbage"}])
    transforms = {"image": Compose(CompressedToPIL())}
    with pytest.raises(ImageDecodeError) as raised:
        Dataset(reader, transforms)[1]
    message = str(raised.value)
    assert message.startswith("sample 1 (key 'broken'), field 'image': not an image (its 7 bytes "
                              "start with b'garbage')")
    assert raised.value.sample == "sample 1 (key 'broken'), field 'image'"
    with pytest.raises(ImageDecodeError, match=r"^sample 1 \(key 'broken'\)"):
        list(IterableDataset(reader, transforms))
    again = pickle.loads(pickle.dumps(raised.value))
    assert (str(again), again.reason) == (message, raised.value.reason)


def test_compressed_to_pil_matches_datadings_repr_and_pickles():
    transform = CompressedToPIL()
    assert repr(transform) == "CompressedToPIL()"
    assert pickle.loads(pickle.dumps(transform)) == transform


def test_importing_the_image_module_does_not_import_pillow():
    code = "import sys, fpipe.image; print('PIL' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("format", ["PNG", "BMP", "TIFF", "GIF", "WEBP", "JPEG"])
def test_every_format_decodes_to_a_plain_image_as_datadings_gives(format, jpeg_decoder):
    """Regression: a PNG came back as a PngImageFile (with the file's ``format`` and ``info``),
    where datadings gives a plain Image."""
    from datadings.torch import CompressedToPIL as DatadingsCompressedToPIL

    data = encode(pixels(), format)
    ours, theirs = CompressedToPIL()(data), DatadingsCompressedToPIL()(data)
    assert type(ours) is type(theirs) is Image.Image
    assert ours.mode == "RGB" and ours.format is None


def test_making_the_transform_loads_the_decoders_for_the_workers_forked_later():
    """Regression: every fresh DataLoader worker imported Pillow (and its plugins) at its first
    decode, 0.12 s each. Making a CompressedToPIL imports them in the process that makes it,
    so forked workers inherit them; importing fpipe.torch still imports none."""
    code = ("import sys, importlib.util; import fpipe.torch; print('PIL' in sys.modules); "
            "fpipe.torch.CompressedToPIL(); "
            "print(all(name in sys.modules for name in ('PIL.Image', 'PIL.PngImagePlugin', "
            "'PIL.JpegImagePlugin', 'PIL.WebPImagePlugin')), "
            "'simplejpeg' in sys.modules or importlib.util.find_spec('simplejpeg') is None)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True", "True"]
