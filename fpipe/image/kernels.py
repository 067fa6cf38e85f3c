"""Antialiased bilinear resizing of uint8 RGB pixels: torch's kernel when torch is installed,
Pillow's otherwise (and for boxes that do not fall on whole pixels, which torch's cannot
take).

Both compute the same filter (a triangle stretched over the reduction, as Pillow defines it;
torch's ``antialias=True`` is a port of Pillow's); torch's uint8 kernel on channels-last data
takes about a third of Pillow's time.

>>> import numpy as np
>>> pixels = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
>>> resize_box(pixels, (0, 0, 8, 8), (4, 4), use_torch=False).shape
(4, 4, 3)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["REDUCING_GAP", "load_torch", "resize_box", "resize_scaled"]

# Pillow first averages whole blocks while the reduction stays at least this large, then
# filters: "indistinguishable from fair resampling in most cases" at 3 (Pillow's docs)
REDUCING_GAP = 3.0

_torch: Any = None  # (torch, torch.nn.functional) once looked up; False when not installed


def load_torch() -> Any:
    """``(torch, torch.nn.functional)``, imported once, or False when torch is not installed.

    >>> load_torch() is not None
    True
    """
    global _torch
    if _torch is None:
        try:
            import torch
            import torch.nn.functional
        except ImportError:
            _torch = False
        else:
            _torch = (torch, torch.nn.functional)
    return _torch


def _whole(box: tuple[float, float, float, float]) -> bool:
    return all(float(edge).is_integer() for edge in box)


def resize_box(pixels: np.ndarray, box: tuple[float, float, float, float],
               size: tuple[int, int], use_torch: bool, flip: bool = False,
               layout: str = "HWC", order: str = "RGB") -> np.ndarray:
    """The part ``box = (left, top, right, bottom)`` of ``pixels`` (height, width, 3),
    resized to ``size = (height, width)``, mirrored left to right if ``flip``, as a new
    uint8 RGB array in ``layout`` (``"HWC"`` or ``"CHW"``). torch's kernel takes boxes on
    whole pixels; Pillow's takes any box, and uses the pixels around it as a resize of the
    whole image would. ``order`` is the channels' order in ``pixels``, ``"RGB"`` or
    ``"BGR"``: BGR pixels mirrored by torch cost less than RGB ones (see :func:`_mirrored`).

    >>> pixels = np.zeros((10, 10, 3), np.uint8)
    >>> pixels[:, 5:] = 200
    >>> resize_box(pixels, (4, 0, 6, 10), (1, 1), use_torch=True)[0, 0].tolist()
    [100, 100, 100]
    >>> pixels[:, :, 0] = 9   # as BGR: red is the last channel
    >>> resize_box(pixels, (4, 0, 6, 10), (1, 2), True, flip=True, order="BGR")[0].tolist()
    [[200, 200, 9], [0, 0, 9]]
    """
    torch_box = use_torch and _whole(box)
    if order == "BGR" and not (torch_box and flip):
        pixels = np.ascontiguousarray(pixels[:, :, ::-1])  # RGB: only _mirrored reads BGR
    if torch_box:
        left, top, right, bottom = (int(edge) for edge in box)
        resized = _torch_resize(pixels[top:bottom, left:right], size, None)
        return _in_layout(_mirrored(resized, order) if flip else _hwc(resized), layout)
    return _from_pillow(_pillow_resize(pixels, box, size), flip, layout)


def resize_scaled(pixels: np.ndarray, scale: tuple[float, float], crop: tuple[int, int, int, int],
                  use_torch: bool, layout: str = "HWC") -> np.ndarray:
    """The whole of ``pixels`` resized by ``scale = (x, y)`` output pixels per pixel, then
    cut to ``crop = (left, top, width, height)`` in output pixels, as a new uint8 array in
    ``layout``.

    >>> pixels = np.full((20, 30, 3), 7, np.uint8)
    >>> resize_scaled(pixels, (0.5, 0.5), (1, 2, 12, 6), use_torch=True).shape
    (6, 12, 3)
    """
    left, top, width, height = crop
    if not use_torch:
        box = (left / scale[0], top / scale[1], (left + width) / scale[0], (top + height) / scale[1])
        return _from_pillow(_pillow_resize(pixels, box, (height, width)), False, layout)
    factors = (_factor(pixels.shape[0], scale[1], top + height),
               _factor(pixels.shape[1], scale[0], left + width))
    resized = _torch_resize(pixels, None, factors)
    return _in_layout(_hwc(resized[:, :, top:top + height, left:left + width]), layout)


def _factor(length: int, scale: float, needed: int) -> float:
    """``scale``, nudged up by the least float if need be so that torch's output,
    ``floor(length * scale)``, holds ``needed`` pixels despite rounding."""
    while math.floor(length * scale) < needed:
        scale = math.nextafter(scale, math.inf)
    return scale


def _torch_resize(pixels: np.ndarray, size: tuple[int, int] | None,
                  factors: tuple[float, float] | None) -> Any:
    """``pixels`` resized, as a (1, C, H, W) tensor in channels-last memory."""
    torch, functional = load_torch()
    if not pixels.flags.writeable:  # Pillow's pixels: torch warns about read-only arrays
        pixels = np.array(pixels)
    # the fast uint8 kernel reads channels-last memory, which is contiguous HWC: a cropped
    # view is not, so numpy copies it once (views in numpy cost a fraction of torch's calls).
    # A reshape, not [None]: torch takes a batch stride of 0 for another memory format
    region = np.ascontiguousarray(pixels)
    region = torch.from_numpy(region.reshape(1, *region.shape).transpose(0, 3, 1, 2))
    return functional.interpolate(region, size=size, scale_factor=factors, mode="bilinear",
                                  antialias=True, align_corners=False,
                                  recompute_scale_factor=False if factors else None)


def _hwc(resized: Any) -> np.ndarray:
    """A (1, C, H, W) tensor as an (H, W, C) array: in channels-last memory, the memory itself."""
    return np.ascontiguousarray(resized.numpy()[0].transpose(1, 2, 0))


def _mirrored(resized: Any, order: str) -> np.ndarray:
    """A (1, 3, H, W) tensor in channels-last memory mirrored left to right, as a new RGB
    (H, W, 3) array. Reversing the bytes of each row of BGR pixels mirrors the row and puts
    its channels in RGB order at once, and torch reverses an innermost dimension about three
    times as fast as it mirrors the width across the channels."""
    torch = load_torch()[0]
    if order != "BGR":
        return _hwc(resized.flip(3))
    pixels = _hwc(resized)
    rows = torch.from_numpy(pixels.reshape(pixels.shape[0], -1)).flip(1)
    return rows.numpy().reshape(pixels.shape)


def _in_layout(pixels: np.ndarray, layout: str) -> np.ndarray:
    """HWC ``pixels`` in ``layout``; numpy's transpose copy to CHW is several times faster
    than torch's."""
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)) if layout == "CHW" else pixels


def _pillow_resize(pixels: np.ndarray, box: tuple[float, float, float, float],
                   size: tuple[int, int]) -> Any:
    from PIL import Image

    image = Image.fromarray(pixels)
    return image.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=box,
                        reducing_gap=REDUCING_GAP)


def _from_pillow(image: Any, flip: bool, layout: str) -> np.ndarray:
    from PIL import Image

    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pixels = np.asarray(image)  # read-only: Pillow's bytes
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)) if layout == "CHW" else np.array(pixels)
