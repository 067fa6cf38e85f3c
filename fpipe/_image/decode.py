"""Read an encoded image's size from its header, then decode it at a reduced scale.

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
from typing import Any, NamedTuple

import numpy as np

from ..image import JPEG_MAGIC, as_buffer, jpeg_decoder, undecodable

__all__ = ["Decoded", "EncodedImage", "REDUCTIONS"]

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
