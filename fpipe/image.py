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

import io
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .errors import FpipeError

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["CompressedToPIL", "IMAGENET_MEAN", "IMAGENET_STD", "ImageDecodeError", "decode_image",
           "normalize", "random_resized_crop", "resized_center_crop"]

JPEG_MAGIC = b"\xff\xd8\xff"
_SIGNATURES = ((JPEG_MAGIC, "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF8", "GIF"),
               (b"RIFF", "RIFF (WebP)"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))
_simplejpeg: Any = None  # the module once looked up; False when it is not installed


class ImageDecodeError(FpipeError, ValueError):
    """Bytes that no image decoder accepts.

    ``reason`` says what was wrong; ``sample`` names the dataset sample the bytes came from
    (the torch adapters fill it in), and both are in the message.

    >>> str(ImageDecodeError("not an image", sample="sample 3 (key 'a'), field 'image'"))
    "sample 3 (key 'a'), field 'image': not an image"
    """

    def __init__(self, reason: str, *, sample: str | None = None) -> None:
        self.reason, self.sample = reason, sample
        super().__init__(reason if sample is None else f"{sample}: {reason}")

    def __reduce__(self):
        return _rebuild_decode_error, (self.reason, self.sample)


def _rebuild_decode_error(reason: str, sample: str | None) -> ImageDecodeError:
    return ImageDecodeError(reason, sample=sample)


def jpeg_decoder() -> Any:
    """The simplejpeg module, imported once, or False when it is not installed (not in
    ``__all__``: fpipe's decoders use it).

    >>> jpeg_decoder() is jpeg_decoder()
    True
    """
    global _simplejpeg
    if _simplejpeg is None:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = False
        _simplejpeg = simplejpeg
    return _simplejpeg


def as_buffer(data: Any) -> memoryview:
    """``data`` as a memoryview of bytes, or a ``TypeError`` saying what an encoded image must
    be (not in ``__all__``: fpipe's decoders use it).

    >>> as_buffer(b"abc")[0], as_buffer(bytearray(2)).nbytes
    (97, 2)
    """
    try:
        return memoryview(data).cast("B")
    except TypeError:
        raise TypeError("an encoded image must be bytes, bytearray, memoryview or another "
                        f"buffer; got {type(data).__name__} {data!r:.60}") from None


def decode_image(data: bytes | bytearray | memoryview, mode: str = "RGB") -> Image:
    """Decode an encoded image to a Pillow image in ``mode`` (``"RGB"`` by default).

    JPEG goes through simplejpeg when it is installed; Pillow takes what simplejpeg refuses
    (CMYK JPEG, say) and every other format. Bytes that are not an image raise
    :class:`ImageDecodeError` describing them; a value that is not a buffer raises
    :class:`TypeError`.

    >>> decode_image(b"not an image at all")
    Traceback (most recent call last):
    ...
    fpipe.image.ImageDecodeError: not an image (its 19 bytes start with b'not an image at a')
    """
    view = as_buffer(data)
    if mode == "RGB" and view[:3] == JPEG_MAGIC:
        simplejpeg = jpeg_decoder()
        if simplejpeg:
            try:
                return _from_array(simplejpeg.decode_jpeg(view, colorspace="RGB"))
            except ValueError:
                pass  # a JPEG that libjpeg-turbo will not convert to RGB; Pillow can
    return _pillow_decode(view, mode)


def load_decoders() -> None:
    """Import Pillow with all its format plugins, and simplejpeg when installed: what a decode
    needs, loaded once in this process (and so in processes forked from it)."""
    from PIL import Image
    Image.init()
    jpeg_decoder()


def _from_array(pixels: Any) -> Image:
    from PIL import Image
    return Image.fromarray(pixels)


def _pillow_decode(view: memoryview, mode: str) -> Image:
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(io.BytesIO(view)) as image:
            # a plain Image, whatever the format (not a PngImageFile), as datadings gives
            return image.convert(mode)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise undecodable(view, error) from error


def undecodable(view: memoryview, error: Exception) -> ImageDecodeError:
    """The error for bytes that Pillow could not decode (not in ``__all__``: the decoders
    raise it), naming their length and first bytes: in plain words when they are empty or no
    image at all (Pillow's message names its internal buffer object), else with Pillow's reason.

    >>> undecodable(memoryview(b"GIF89a..."), OSError("truncated"))
    ImageDecodeError("cannot decode 9 bytes starting b'GIF89a...' as an image: truncated")
    >>> undecodable(memoryview(b""), OSError("cannot decode"))
    ImageDecodeError('empty (0 bytes), not an image')
    """
    from PIL import UnidentifiedImageError

    head = bytes(view[:17])
    if not len(view):
        return ImageDecodeError("empty (0 bytes), not an image")
    kind = next((kind for magic, kind in _SIGNATURES if head.startswith(magic)), None)
    if isinstance(error, UnidentifiedImageError):
        if kind is None:
            return ImageDecodeError(f"not an image (its {len(view)} bytes start with {head!r})")
        error = f"they begin as {kind} data does, but its header is cut off or damaged"
    return ImageDecodeError(f"cannot decode {len(view)} bytes starting {head!r} as an image: {error}")


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


# The fused recipes live in fpipe/_image/, whose decoder builds on this module's: so last.
from ._image.normalize import IMAGENET_MEAN, IMAGENET_STD, normalize  # noqa: E402
from ._image.recipes import random_resized_crop, resized_center_crop  # noqa: E402
