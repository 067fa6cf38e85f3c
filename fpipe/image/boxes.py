"""Where the recipes crop: torchvision's RandomResizedCrop box draw, and the sizes and box of
its Resize then CenterCrop.

A box is ``(left, top, width, height)`` in pixels.

>>> import numpy as np
>>> random_resized_box(np.random.default_rng(0), 500, 375, (0.08, 1.0), (3 / 4, 4 / 3))
Box(left=302, top=35, width=129, height=171)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["ATTEMPTS", "Box", "center_box", "random_resized_box", "resized_size"]

ATTEMPTS = 10  # torchvision's tries at a box before its centre-crop fallback


class Box(NamedTuple):
    """A rectangle of an image, in pixels: ``(left, top, width, height)``."""

    left: float
    top: float
    width: float
    height: float


def random_resized_box(rng: np.random.Generator, width: int, height: int,
                       scale: tuple[float, float], ratio: tuple[float, float]) -> Box:
    """torchvision's ``RandomResizedCrop.get_params``, drawing from ``rng``: up to ten tries
    of an area fraction (uniform in ``scale``) and an aspect ratio (log-uniform in ``ratio``)
    whose rounded box fits, placed uniformly (top first, then left); else the largest centred
    box whose aspect ratio is within ``ratio``.

    >>> random_resized_box(np.random.default_rng(1), 10, 1000, (0.9, 1.0), (1.0, 1.0))
    Box(left=0, top=495, width=10, height=10)
    """
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(ATTEMPTS):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return Box(left, top, w, h)
    return _central_box(width, height, ratio)


def _central_box(width: int, height: int, ratio: tuple[float, float]) -> Box:
    """torchvision's fallback: the whole image, cut to the nearest aspect ratio in ``ratio``."""
    aspect = width / height
    if aspect < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif aspect > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    # torchvision's rounding leaves a side of 0 on an image of a pixel or two with a ratio far
    # from its own (1 x 1 with ratio (1/2, 1/2)), which no resize takes: one pixel instead
    w, h = max(w, 1), max(h, 1)
    return Box((width - w) // 2, (height - h) // 2, w, h)


def resized_size(width: int, height: int, shorter: int) -> tuple[int, int]:
    """``(width, height)`` after torchvision's ``Resize(shorter)``: the shorter side becomes
    ``shorter``, the longer one keeps the aspect ratio, rounded down.

    >>> resized_size(500, 375, 256)
    (341, 256)
    """
    if width <= height:
        return shorter, int(shorter * height / width)
    return int(shorter * width / height), shorter


def center_box(width: int, height: int, size: tuple[int, int]) -> Box:
    """torchvision's ``CenterCrop(size)`` (``size`` is ``(height, width)``) of a ``width`` x
    ``height`` image: the offsets rounded as Python rounds, half to even.

    >>> center_box(341, 256, (224, 224))
    Box(left=58, top=16, width=224, height=224)
    """
    crop_height, crop_width = size
    top = int(round((height - crop_height) / 2.0))
    left = int(round((width - crop_width) / 2.0))
    return Box(left, top, crop_width, crop_height)
