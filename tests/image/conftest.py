"""Helpers for the image recipe tests: encoded images of every kind, and photographs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image


def encode(image: Image.Image | np.ndarray, format: str = "JPEG", **options) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, format=format, **options)
    return buffer.getvalue()


def scene(width: int = 500, height: int = 375, seed: int = 0) -> np.ndarray:
    """A photo-like RGB image: smooth colour fields, edges and fine grain."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC),
                       np.int16)
    y, x = np.mgrid[:height, :width]
    stripes = np.where((x // 7 + y // 11) % 2, 40, -40)[..., None]
    grain = rng.normal(0, 8, (height, width, 3))
    return np.clip(field + stripes + grain, 0, 255).astype(np.uint8)


@pytest.fixture(scope="session")
def photos():
    """scikit-image's photographs, JPEG quality 90, at 500 px, their own size and 6 MP."""
    pytest.importorskip("skimage")  # in the test extra
    from benchmarks.image_quality import quality_photos

    return quality_photos(mosaics=2)
