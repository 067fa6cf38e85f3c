"""The benchmark datasets (``../shared/BENCHMARKS.md``), written once and cached.

``small_path()``, ``large_path()``, ``compact_path()``, ``images_path()`` and ``tiny_path()``
return the path of a packed dataset, writing it on first use into ``$FPIPE_BENCH_DATA``
(default: a folder in the system's temporary directory). Each dataset is built in a private
folder and renamed into place, so concurrent benchmark runs never see a half-written one.
``small_samples()`` gives the samples of ``small`` in memory (for write benchmarks).

=========  ==========================================================================
``small``  100,000 samples ``{"key": f"{i:08d}", "data": 1,024 random bytes, "label": i % 1000}``
``large``  10,000 samples like ``small`` with 102,400 random bytes
``images`` 2,000 labelled JPEGs (about 500 px long side, quality 90) of smooth random fields
``compact`` 100,000 samples like ``small`` with 100 random bytes (the resume workloads C2, C4)
``tiny``   2,000,000 samples ``{"key": f"{i:08d}", "data": 16 random bytes}`` (workload M1)
``photos`` 2,000 labelled JPEGs cut from scikit-image's nine sample photographs (300-500 px
           long side, quality 90), for the image recipes (workloads I1-I5)
``photos6mp`` 18 JPEGs of 3000 x 2000 pixels tiled from the same photographs (I2)
=========  ==========================================================================

``photographs()`` gives the nine photographs themselves (RGB arrays, 300 to 1411 px).
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from fpipe.dataset import FileWriter

__all__ = ["cache_folder", "compact_path", "images_path", "large_path", "photographs", "photos6mp_path",
           "photos_path", "small_path", "small_samples", "tiny_path"]

# Bump when a dataset's definition changes, so stale caches are not reused.
_VERSION = "v1"


def cache_folder() -> Path:
    """Where the datasets live: ``$FPIPE_BENCH_DATA`` or ``<tmp>/fpipe-bench-data``."""
    default = Path(tempfile.gettempdir()) / "fpipe-bench-data"
    return Path(os.environ.get("FPIPE_BENCH_DATA", default)) / _VERSION


def _random_samples(n: int, size: int, seed: int, label: bool = True) -> Iterator[dict]:
    rng = np.random.default_rng(seed)
    for i in range(n):
        sample = {"key": f"{i:08d}", "data": rng.bytes(size)}
        if label:
            sample["label"] = i % 1000
        yield sample


def small_samples() -> list[dict]:
    """The samples of ``small``, in memory."""
    return list(_random_samples(100_000, 1024, seed=0))


def _cached(name: str, make: Callable[[], Iterator[dict]]) -> str:
    folder = cache_folder() / name
    path = folder / f"{name}.msgpack"
    if path.with_name(path.name + ".md5").exists():
        return str(path)
    cache_folder().mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_folder()))
    try:
        with FileWriter(building / path.name) as writer:
            for sample in make():
                writer.write(sample)
        try:
            os.rename(building, folder)
        except OSError:  # another run built it first
            pass
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return str(path)


def small_path() -> str:
    """Path of ``small`` (about 106 MB)."""
    return _cached("small", lambda: _random_samples(100_000, 1024, seed=0))


def large_path() -> str:
    """Path of ``large`` (about 1 GB)."""
    return _cached("large", lambda: _random_samples(10_000, 102_400, seed=1))


def compact_path() -> str:
    """``compact``: 100,000 samples of a key, 100 random bytes and a label."""
    return _cached("compact", lambda: _random_samples(100_000, 100, seed=3))


def tiny_path() -> str:
    """Path of ``tiny``: two million samples of 16-byte payloads (about 70 MB)."""
    return _cached("tiny", lambda: _random_samples(2_000_000, 16, seed=2, label=False))


def images_path() -> str:
    """Path of ``images``: 2,000 labelled JPEGs of smooth random fields."""
    return _cached("images", _image_samples)


def _image_samples() -> Iterator[dict]:
    from PIL import Image  # Pillow only for this dataset

    rng = np.random.default_rng(3)
    for i in range(2000):
        long_side, short_side = 500, int(rng.integers(300, 500))
        width, height = (long_side, short_side) if rng.random() < 0.5 else (short_side, long_side)
        # Upsampled coarse noise plus fine grain: compresses like a photograph, not like noise.
        coarse = rng.integers(0, 256, (int(rng.integers(3, 12)), int(rng.integers(3, 12)), 3), np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.int16)
        grain = rng.normal(0, 6, field.shape).astype(np.int16)
        pixels = np.clip(field + grain, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        yield {"key": f"{i:08d}", "image": buffer.getvalue(), "label": i % 10}


# scikit-image's colour photographs that ship inside its wheel (the others are downloaded)
PHOTOGRAPHS = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
               "immunohistochemistry", "retina", "stereo_motorcycle")


def photographs() -> list[np.ndarray]:
    """scikit-image's nine colour sample photographs (the stereo pair counts two), RGB uint8."""
    import skimage.data

    photos = []
    for name in PHOTOGRAPHS:
        photo = getattr(skimage.data, name)()
        photos.extend(photo[:2] if name == "stereo_motorcycle" else [photo])
    return photos


def jpeg(pixels: np.ndarray, quality: int = 90) -> bytes:
    """``pixels`` (H, W, 3 uint8) encoded as JPEG with Pillow."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _cut(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random 70-100 % of each side of ``photo``, maybe mirrored, resized so that its long
    side is 300-500 px (ImageNet's photos are mostly 500 px on their long side)."""
    from PIL import Image

    height, width = photo.shape[:2]
    h, w = (int(side * rng.uniform(0.7, 1.0)) for side in (height, width))
    top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
    piece = Image.fromarray(photo[top:top + h, left:left + w])
    if rng.random() < 0.5:
        piece = piece.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    long_side = 500 if rng.random() < 0.7 else int(rng.integers(300, 500))
    factor = long_side / max(w, h)
    return np.asarray(piece.resize((max(1, round(w * factor)), max(1, round(h * factor))),
                                   Image.Resampling.LANCZOS))


def _photo_samples() -> Iterator[dict]:
    rng = np.random.default_rng(4)
    photos = photographs()
    for i in range(2000):
        label = i % len(photos)
        yield {"key": f"{i:08d}", "image": jpeg(_cut(photos[label], rng)), "label": label}


def photos_path() -> str:
    """Path of ``photos``: 2,000 JPEGs cut from the nine photographs, labelled by photograph."""
    return _cached("photos", _photo_samples)


def _tiled(photos: list[np.ndarray], rng: np.random.Generator, width: int = 3000,
           height: int = 2000, tile: int = 250) -> np.ndarray:
    """A ``width`` x ``height`` mosaic of ``tile``-pixel squares, each cut at a random place
    from a random photograph at its own resolution (a photograph's detail, not an
    enlargement's: every photograph is at least 300 px on its short side)."""
    mosaic = np.empty((height, width, 3), np.uint8)
    for top in range(0, height, tile):
        for left in range(0, width, tile):
            photo = photos[int(rng.integers(len(photos)))]
            y = int(rng.integers(0, photo.shape[0] - tile + 1))
            x = int(rng.integers(0, photo.shape[1] - tile + 1))
            mosaic[top:top + tile, left:left + tile] = photo[y:y + tile, x:x + tile]
    return mosaic


def _photo6mp_samples() -> Iterator[dict]:
    photos, rng = photographs(), np.random.default_rng(5)
    for i in range(18):
        mosaic = _tiled(photos, rng)
        upright = mosaic.transpose(1, 0, 2) if i % 2 else mosaic
        yield {"key": f"{i:08d}", "image": jpeg(np.ascontiguousarray(upright)), "label": 0}


def photos6mp_path() -> str:
    """Path of ``photos6mp``: 18 six-megapixel JPEG mosaics of the photographs, half of them
    upright (2000 x 3000)."""
    return _cached("photos6mp", _photo6mp_samples)
