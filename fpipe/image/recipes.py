"""The two standard image recipes as fused, seeded transforms from encoded bytes to uint8
pixels: :func:`random_resized_crop` for training and :func:`resized_center_crop` for
evaluation.

Each reads the image's header, works out the box it keeps, decodes a JPEG at the largest
reduction (1/2, 1/4, 1/8) that leaves the box at least the output size, and resizes the box
with an antialiased bilinear kernel (torch's when torch is installed, Pillow's otherwise).

>>> import io
>>> from PIL import Image
>>> buffer = io.BytesIO()
>>> Image.new("RGB", (500, 375), (200, 30, 10)).save(buffer, format="JPEG")
>>> crop = random_resized_crop(224)
>>> crop(buffer.getvalue()).shape
(224, 224, 3)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fpipe.errors import check_bool, check_choice, check_integer, check_interval, check_probability
from fpipe.image.boxes import Box, center_box, random_resized_box, resized_size
from fpipe.image.decode import EncodedImage, load_decoders
from fpipe.image.kernels import load_torch, resize_box, resize_scaled
from fpipe.random import current_rng

__all__ = ["random_resized_crop", "resized_center_crop"]

_LAYOUTS = ("HWC", "CHW")
_BACKENDS = ("auto", "torch", "pillow")
_EVAL_CROP_FRACTION = 0.875  # 224 of 256: the share of the resized image the usual recipe keeps


def _checked_size(size: Any) -> tuple[int, int]:
    """``size`` as ``(height, width)``: an int is a square."""
    if isinstance(size, (tuple, list)) and len(size) == 2:
        return check_integer("size[0]", size[0], 1), check_integer("size[1]", size[1], 1)
    if isinstance(size, (tuple, list)):
        raise TypeError(f"size must be an int or (height, width); got size={size!r}")
    side = check_integer("size", size, 1)
    return side, side


def _use_torch(backend: str) -> bool:
    """Whether to resize with torch's kernel, importing torch now (once per process) so that
    forked workers find it loaded."""
    check_choice("backend", backend, _BACKENDS)
    if backend == "pillow":
        return False
    if load_torch():
        return True
    if backend == "torch":
        raise ImportError("backend='torch' needs PyTorch; install it with: pip install "
                          "'fpipe[torch]', or pass backend='auto' to use Pillow without it")
    return False


class _Recipe:
    """What the recipes share: the output size and layout, the decode and the kernel."""

    _name = ""
    _defaults: dict[str, Any] = {}

    def __init__(self, size: Any, layout: str, scaled_decode: bool, backend: str) -> None:
        self.size = _checked_size(size)
        self.layout = check_choice("layout", layout, _LAYOUTS)
        self.scaled_decode = check_bool("scaled_decode", scaled_decode)
        self.backend = backend
        self._torch = _use_torch(backend)
        load_decoders()  # here, once: forked workers find them loaded

    def _options(self) -> dict[str, Any]:
        return {"layout": self.layout, "scaled_decode": self.scaled_decode, "backend": self.backend}

    def __repr__(self) -> str:
        height, width = self.size
        shown = [repr(height if height == width else self.size)]
        shown += [f"{name}={value!r}" for name, value in self._options().items()
                  if self._defaults.get(name) != value]
        return f"{self._name}({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self.size == other.size
                and self._options() == other._options())

    def __hash__(self) -> int:
        return hash((type(self), self.size, tuple(self._options().items())))


class _RandomResizedCrop(_Recipe):
    _name = "random_resized_crop"
    _defaults = {"scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3), "flip": 0.5, "layout": "HWC",
                 "scaled_decode": True, "backend": "auto"}

    def __init__(self, size: Any, scale: Any, ratio: Any, flip: float, layout: str,
                 scaled_decode: bool, backend: str) -> None:
        super().__init__(size, layout, scaled_decode, backend)
        self.scale = check_interval("scale", scale)
        self.ratio = check_interval("ratio", ratio, positive=True)
        self.flip = check_probability("flip", flip)

    def _options(self) -> dict[str, Any]:
        return {"scale": self.scale, "ratio": self.ratio, "flip": self.flip, **super()._options()}

    def __call__(self, data: bytes | bytearray | memoryview, params: Any = None, /) -> np.ndarray:
        image = EncodedImage(data)
        rng = current_rng()
        box = random_resized_box(rng, image.width, image.height, self.scale, self.ratio)
        flip = rng.random() < self.flip
        return self._resized(image, box, flip)

    def _resized(self, image: EncodedImage, box: Box, flip: bool) -> np.ndarray:
        height, width = self.size
        reduction = 1
        if self.scaled_decode:
            reduction = image.reduction_for(image.width * width / box.width,
                                            image.height * height / box.height)
        edges = (box.left, box.top, box.left + box.width, box.top + box.height)
        # mirrored by torch (a box on whole decoded pixels), BGR pixels cost less (see
        # kernels._mirrored), and the JPEG decoder gives them at no cost
        whole = all(edge % reduction == 0 for edge in edges)
        decoded = image.decode(reduction, "BGR" if flip and self._torch and whole else "RGB")
        x_scale, y_scale = decoded.x_scale, decoded.y_scale
        region = (edges[0] / x_scale, edges[1] / y_scale, edges[2] / x_scale, edges[3] / y_scale)
        return resize_box(decoded.pixels, region, self.size, self._torch, flip, self.layout,
                          decoded.order)


class _ResizedCenterCrop(_Recipe):
    _name = "resized_center_crop"
    _defaults = {"layout": "HWC", "scaled_decode": True, "backend": "auto"}

    def __init__(self, size: Any, resize: int | None, layout: str, scaled_decode: bool,
                 backend: str) -> None:
        super().__init__(size, layout, scaled_decode, backend)
        longest = max(self.size)
        if resize is None:
            resize = int(longest / _EVAL_CROP_FRACTION)
        self.resize = check_integer("resize", resize, 1)
        if self.resize < longest:
            raise ValueError(f"resize must be at least the crop's longer side {longest}, so "
                             f"that the crop lies inside the resized image; got resize={resize!r}")
        self._defaults = {**self._defaults, "resize": int(longest / _EVAL_CROP_FRACTION)}

    def _options(self) -> dict[str, Any]:
        return {"resize": self.resize, **super()._options()}

    def __call__(self, data: bytes | bytearray | memoryview, params: Any = None, /) -> np.ndarray:
        image = EncodedImage(data)
        new_width, new_height = resized_size(image.width, image.height, self.resize)
        reduction = image.reduction_for(new_width, new_height) if self.scaled_decode else 1
        pixels, x_scale, y_scale, _ = image.decode(reduction)
        crop = center_box(new_width, new_height, self.size)
        scale = (new_width / image.width * x_scale, new_height / image.height * y_scale)
        return resize_scaled(pixels, scale, crop, self._torch, self.layout)


def random_resized_crop(size: int | tuple[int, int], scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3), flip: float = 0.5, *,
                        layout: str = "HWC", scaled_decode: bool = True,
                        backend: str = "auto") -> Any:
    """The training recipe, fused: a transform from an encoded image (JPEG, PNG or any format
    Pillow reads) to a random resized crop of ``size`` (an int, or ``(height, width)``),
    mirrored left to right with probability ``flip``, as uint8 RGB pixels in ``layout``
    (``"HWC"`` or ``"CHW"``).

    The box is torchvision's ``RandomResizedCrop(size, scale, ratio)``: ten tries of an area
    fraction uniform in ``scale`` and an aspect ratio log-uniform in ``ratio``, then its
    centre-crop fallback, drawn in that order from :func:`fpipe.current_rng` and then the
    flip. So a seeded stage or torch dataset gives every item the same crop whichever
    worker, backend or resume makes it. A JPEG is decoded at the largest reduction (1/2,
    1/4, 1/8) that keeps the box at least ``size`` (``scaled_decode=False`` always decodes
    the full size). The box is resized with antialiased bilinear filtering: torch's uint8
    kernel when torch is installed (``backend="auto"``; ``"torch"`` insists,
    ``"pillow"`` never uses it), Pillow's otherwise and for boxes that a reduced decode puts
    between pixels. Bytes that are not an image raise
    :class:`~fpipe.image.ImageDecodeError`; EXIF orientation is not applied, as torchvision
    does not apply it.

    The transform pickles (for process stages) and takes ``(value, params)`` as a field
    transform of :class:`fpipe.torch.Dataset` does (``params`` is not used).

    >>> import io, fpipe
    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("L", (640, 480), 90).save(buffer, format="PNG")
    >>> crop = random_resized_crop(224, layout="CHW")
    >>> with fpipe.using_rng(fpipe.item_rng(0, epoch=0, index=7)):
    ...     pixels = crop(buffer.getvalue())
    >>> pixels.shape, pixels.dtype, int(pixels[0, 0, 0])
    ((3, 224, 224), dtype('uint8'), 90)
    >>> crop
    random_resized_crop(224, layout='CHW')
    """
    return _RandomResizedCrop(size, scale, ratio, flip, layout, scaled_decode, backend)


def resized_center_crop(size: int | tuple[int, int], resize: int | None = None, *,
                        layout: str = "HWC", scaled_decode: bool = True,
                        backend: str = "auto") -> Any:
    """The evaluation recipe, fused: a transform from an encoded image to the centre crop of
    ``size`` of the image resized so that its shorter side is ``resize`` (by default
    ``size / 0.875``: 256 for 224), as uint8 RGB pixels in ``layout`` — torchvision's
    ``Resize(resize)`` then ``CenterCrop(size)``, with bilinear antialiased filtering.

    A JPEG is decoded at the largest reduction (1/2, 1/4, 1/8) that keeps it at least the
    resized size; ``backend`` and ``scaled_decode`` are as in :func:`random_resized_crop`.
    Nothing is random.

    >>> import io
    >>> from PIL import Image
    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (1000, 750), (0, 128, 255)).save(buffer, format="JPEG", quality=95)
    >>> center = resized_center_crop(224)
    >>> pixels = center(buffer.getvalue())
    >>> pixels.shape, pixels.dtype
    ((224, 224, 3), dtype('uint8'))
    >>> center
    resized_center_crop(224)
    """
    return _ResizedCenterCrop(size, resize, layout, scaled_decode, backend)
