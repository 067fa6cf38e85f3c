"""Decode compressed images (JPEG, PNG and every other format Pillow reads) to RGB.

Packed datasets store images as their compressed bytes; a data-loader worker decodes them.
:class:`CompressedToPIL` is datadings's transform of that name (also exported by
:mod:`fpipe.torch`): it decodes JPEG with simplejpeg when that is installed (several times
faster than Pillow) and everything else with Pillow, and always returns an RGB image.

The fused recipes go from the encoded bytes straight to the pixels a model takes, decoding a
JPEG at the scale its crop needs: :func:`random_resized_crop` (training) and
:func:`resized_center_crop` (evaluation), with :func:`normalize` for whole batches (see the
docs' "Fast image pipelines" page).

Pillow (and for the recipes torch) is imported when a transform is made (or at the first
decode), so importing this module costs nothing; ``import fpipe`` does not import them at all.
Making the transform in the main process imports the decoders there, once, and DataLoader
workers forked from it find them loaded instead of importing them at their first sample.

>>> import io
>>> from PIL import Image
>>> buffer = io.BytesIO()
>>> Image.new("L", (4, 3), 200).save(buffer, format="PNG")
>>> image = decode_image(buffer.getvalue())
>>> image.mode, image.size, image.getpixel((0, 0))
('RGB', (4, 3), (200, 200, 200))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fpipe.image.decode import ImageDecodeError, decode_image, load_decoders
from fpipe.image.normalize import IMAGENET_MEAN, IMAGENET_STD, normalize
from fpipe.image.recipes import random_resized_crop, resized_center_crop

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["CompressedToPIL", "IMAGENET_MEAN", "IMAGENET_STD", "ImageDecodeError", "decode_image",
           "normalize", "random_resized_crop", "resized_center_crop"]

class CompressedToPIL:
    """A transform from an encoded image (bytes or any buffer) to an RGB Pillow image.

    The same as datadings's ``CompressedToPIL`` (JPEG through simplejpeg when installed,
    other formats through Pillow, always RGB), with a clear :class:`ImageDecodeError` for
    bytes that are not an image; the torch datasets add the sample's index, key and field.

    >>> import io
    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (5, 2), (255, 0, 0)).save(buffer, format="JPEG")
    >>> CompressedToPIL()(buffer.getvalue()).size
    (5, 2)
    >>> CompressedToPIL()
    CompressedToPIL()
    """

    def __init__(self) -> None:
        load_decoders()

    def __call__(self, buf: bytes | bytearray | memoryview) -> Image:
        return decode_image(buf)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return "CompressedToPIL()"


def with_sample_named(error: Exception, index: int, sample: Any, field: Any) -> Exception:
    """``error`` raised by a transform of sample ``index`` (its ``field``, if not None), with
    the sample named: in the message of an image error, as a note otherwise.

    >>> str(with_sample_named(ImageDecodeError("not a JPEG"), 3, {"key": "a"}, "image"))
    "sample 3 (key 'a'), field 'image': not a JPEG"
    """
    where = f"sample {index}"
    if isinstance(sample, Mapping) and "key" in sample:
        where += f" (key {sample['key']!r})"
    if field is not None:
        where += f", field {field!r}"
    if isinstance(error, ImageDecodeError) and error.sample is None:
        return ImageDecodeError(error.reason, sample=where).with_traceback(error.__traceback__)
    if hasattr(error, "add_note"):
        error.add_note(f"raised while transforming {where}")
    return error

