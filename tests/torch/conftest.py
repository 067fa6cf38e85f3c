"""Helpers for the torch adapter tests: tiny packed datasets and image bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fpipe.dataset import FileWriter, MsgpackReader


def write_numbers(path, n: int) -> str:
    """A packed dataset of ``n`` samples ``{"key": "0007", "x": 7}``."""
    with FileWriter(path) as writer:
        for i in range(n):
            writer.write({"key": f"{i:04d}", "x": i})
    return str(path)


def encode(pixels: np.ndarray, format: str, **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=format, **options)
    return buffer.getvalue()


def pixels(height: int = 6, width: int = 8, channels: int = 3, seed: int = 0) -> np.ndarray:
    shape = (height, width) if channels == 1 else (height, width, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.fixture
def numbers(tmp_path) -> MsgpackReader:
    """A reader over 23 samples (an awkward count: shards of unequal length)."""
    return MsgpackReader(write_numbers(tmp_path / "numbers.msgpack", 23))
