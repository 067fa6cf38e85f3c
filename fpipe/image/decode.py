"""Decode encoded images (JPEG, PNG and every other format Pillow reads): whole, to an RGB
Pillow image (:func:`decode_image`, raising :class:`ImageDecodeError` for bytes that are not an
image), or at a reduced scale after reading the header (:class:`EncodedImage`).

JPEG can be decoded at 1/2, 1/4 or 1/8 of its size for a fraction of the cost of a full
decode (the DCT blocks are inverse-transformed at that size). A recipe reads the header,
draws its box, and asks for the largest of these reductions that keeps the box at least its
output size. simplejpeg decodes JPEG when it is installed; Pillow (with ``draft``, which
picks the same reductions) takes the rest: JPEG that simplejpeg refuses, and every other
format, always at full size.

>>> import io
>>> from PIL import Image
>>> buffer = io.BytesIO()
>>> Image.new("RGB", (400, 300), (10, 200, 30)).save(buffer, format="JPEG")
>>> image = EncodedImage(buffer.getvalue())
>>> image.width, image.height, image.reduction_for(100, 70)
(400, 300, 4)
>>> decoded = image.decode(4)
>>> decoded.pixels.shape, decoded.x_scale, decoded.y_scale
((75, 100, 3), 4.0, 4.0)
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from fpipe.errors import FpipeError

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["Decoded", "EncodedImage", "ImageDecodeError", "REDUCTIONS", "decode_image"]

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

    __module__ = "fpipe.image"  # where users import it, so tracebacks name it as they know it

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


# libjpeg-turbo's fast reductions; it has others (3/8, 5/8, ...), but those decode slower
# than the full size does
REDUCTIONS = (8, 4, 2, 1)


class Decoded(NamedTuple):
    """Pixels (height, width, 3) uint8, how many full-size pixels each one spans, and the
    order of their channels: ``"RGB"``, or ``"BGR"`` when asked for and the decoder gives it."""

    pixels: np.ndarray
    x_scale: float
    y_scale: float
    order: str = "RGB"


class EncodedImage:
    """Encoded bytes whose header has been read: ``width`` and ``height`` at full size, and
    :meth:`decode` at a reduced scale. Bytes that are not an image raise
    :class:`~fpipe.image.ImageDecodeError` here or in :meth:`decode`."""

    def __init__(self, data: Any) -> None:
        self.view = as_buffer(data)
        self._pillow: Any = None  # the Pillow image, opened once its header is wanted
        self._jpeg = self._simplejpeg_header()
        if self._jpeg is None:
            self._pillow = _open_with_pillow(self.view)
            self.width, self.height = self._pillow.size

    def _simplejpeg_header(self) -> tuple | None:
        if self.view[:3] != JPEG_MAGIC:
            return None
        simplejpeg = jpeg_decoder()
        if not simplejpeg:
            return None
        try:
            self.height, self.width, *_ = header = simplejpeg.decode_jpeg_header(self.view)
        except ValueError:
            return None  # one that libjpeg-turbo will not read; Pillow may
        return header

    @property
    def scalable(self) -> bool:
        """Whether the decoder can reduce the scale (JPEG)."""
        return self._jpeg is not None or self._pillow.format in ("JPEG", "MPO")

    def reduction_for(self, width: float, height: float) -> int:
        """The largest reduction (8, 4, 2 or 1) at which the full image is still at least
        ``width`` x ``height`` pixels; 1 for formats that cannot be decoded reduced."""
        if self.scalable:
            for reduction in REDUCTIONS:
                if self.width / reduction >= width and self.height / reduction >= height:
                    return reduction
        return 1

    def decode(self, reduction: int = 1, order: str = "RGB") -> Decoded:
        """The pixels at ``1 / reduction`` of the full size (rounded up), RGB; ``order="BGR"``
        asks for the channels reversed, which the JPEG decoder gives at no cost and Pillow
        does not: :attr:`Decoded.order` says which came."""
        if self._jpeg is not None:
            try:
                pixels = jpeg_decoder().decode_jpeg(
                    self.view, colorspace=order, min_height=-(-self.height // reduction),
                    min_width=-(-self.width // reduction))
                return self._decoded(pixels, order)
            except ValueError:
                self._pillow = _open_with_pillow(self.view)  # Pillow may read what it refuses
        return self._decoded(_pillow_pixels(self._pillow, self.view, reduction), "RGB")

    def _decoded(self, pixels: np.ndarray, order: str) -> Decoded:
        height, width = pixels.shape[:2]
        return Decoded(pixels, *_scales(self.width, self.height, width, height), order)


def _scales(full_width: int, full_height: int, width: int, height: int) -> tuple[float, float]:
    """Full-size pixels per decoded pixel. A reduced JPEG is ``ceil(full / r)`` pixels, each
    spanning ``r`` full-size pixels (the last one fewer): r, not ``full / decoded``."""
    scales = []
    for full, decoded in ((full_width, width), (full_height, height)):
        reduction = round(full / decoded)
        scales.append(float(reduction) if -(-full // reduction) == decoded else full / decoded)
    return scales[0], scales[1]


def _open_with_pillow(view: memoryview) -> Any:
    from PIL import Image, UnidentifiedImageError
    try:
        return Image.open(io.BytesIO(view))
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise undecodable(view, error) from error


def _pillow_pixels(image: Any, view: memoryview, reduction: int) -> np.ndarray:
    try:
        if reduction > 1:
            # at least full // reduction on each side picks exactly this reduction
            image.draft("RGB", (max(1, image.width // reduction), max(1, image.height // reduction)))
        return np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, ValueError) as error:
        raise undecodable(view, error) from error
    finally:
        image.close()
