"""How close fpipe's image recipes come to the reference pipeline: a full-size decode, then
Pillow's antialiased bilinear resize of the same box (and the same flip).

``python -m benchmarks.image_quality`` prints, for each recipe, kernel and decode scale, the
mean absolute difference in levels (0-255) and the PSNR over the photographs of
:mod:`benchmarks.data`: the nine at about 500 px on the long side (as in ``photos``), the same
at their own size (up to 1411 px), and six 6-megapixel mosaics (as in ``photos6mp``).
"""

from __future__ import annotations

import argparse
import io
import math
from collections import defaultdict

import numpy as np

from .data import _tiled, jpeg, photographs

__all__ = ["compare", "psnr", "quality_photos", "reference_center_crop", "reference_random_crop",
           "table"]

SIZE = 224


def psnr(pixels: np.ndarray, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB (inf for equal images)."""
    error = np.mean((pixels.astype(np.float64) - reference) ** 2)
    return math.inf if error == 0 else 10 * math.log10(255 ** 2 / error)


def _full_size(data: bytes):
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def reference_random_crop(data: bytes, box, flip: bool, size: int = SIZE) -> np.ndarray:
    """The reference's random resized crop of ``box`` (left, top, width, height)."""
    from PIL import Image

    image = _full_size(data).resize((size, size), Image.Resampling.BILINEAR,
                                    box=(box[0], box[1], box[0] + box[2], box[1] + box[3]))
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image)


def reference_center_crop(data: bytes, size: int = SIZE, resize: int = 256) -> np.ndarray:
    """The reference's evaluation recipe: shorter side to ``resize``, centre crop ``size``."""
    from PIL import Image

    from fpipe.image.boxes import center_box, resized_size

    image = _full_size(data)
    image = image.resize(resized_size(image.width, image.height, resize), Image.Resampling.BILINEAR)
    left, top, width, height = center_box(image.width, image.height, (size, size))
    return np.asarray(image)[top:top + height, left:left + width]


def quality_photos(mosaics: int = 6) -> dict[str, list[bytes]]:
    """The test photographs, JPEG quality 90, by kind."""
    from PIL import Image

    photos = photographs()
    small = []
    for photo in photos:
        factor = 500 / max(photo.shape[:2])
        size = (round(photo.shape[1] * factor), round(photo.shape[0] * factor))
        small.append(jpeg(np.asarray(Image.fromarray(photo).resize(size, Image.Resampling.LANCZOS))))
    rng = np.random.default_rng(6)
    return {"500 px": small, "own size": [jpeg(photo) for photo in photos],
            "6 MP": [jpeg(_tiled(photos, rng)) for _ in range(mosaics)]}


def _reduction(data: bytes, box, size: int) -> int:
    from fpipe.image.decode import EncodedImage

    image = EncodedImage(data)
    return image.reduction_for(image.width * size / box[2], image.height * size / box[3])


def _random_crop_rows(kind: str, images: list[bytes], backend: str, draws: int) -> dict:
    import fpipe
    from fpipe.image import random_resized_crop
    from fpipe.image.boxes import random_resized_box
    from fpipe.image.decode import EncodedImage

    crop = random_resized_crop(SIZE, backend=backend)
    rows = defaultdict(list)
    for n in range(draws * len(images)):
        data = images[n % len(images)]
        with fpipe.using_rng(fpipe.item_rng(0, 0, n)):
            ours = crop(data)
        rng = fpipe.item_rng(0, 0, n)
        header = EncodedImage(data)
        box = random_resized_box(rng, header.width, header.height, (0.08, 1.0), (3 / 4, 4 / 3))
        reference = reference_random_crop(data, box, rng.random() < 0.5)
        rows[("random_resized_crop", kind, backend, _reduction(data, box, SIZE))].append(
            (np.abs(ours.astype(np.int16) - reference).mean(), psnr(ours, reference)))
    return rows


def _center_crop_rows(kind: str, images: list[bytes], backend: str) -> dict:
    from fpipe.image import resized_center_crop
    from fpipe.image.boxes import resized_size
    from fpipe.image.decode import EncodedImage

    center = resized_center_crop(SIZE, 256, backend=backend)
    rows = defaultdict(list)
    for data in images:
        header = EncodedImage(data)
        reduction = header.reduction_for(*resized_size(header.width, header.height, 256))
        ours, reference = center(data), reference_center_crop(data)
        rows[("resized_center_crop", kind, backend, reduction)].append(
            (np.abs(ours.astype(np.int16) - reference).mean(), psnr(ours, reference)))
    return rows


def compare(photos: dict[str, list[bytes]], backends: tuple[str, ...] = ("torch", "pillow"),
            draws: int = 4) -> list[dict]:
    """One row per recipe, photographs, kernel and decode reduction: how many crops, and
    their mean absolute difference (mean and worst) and PSNR (worst and median)."""
    rows: dict = defaultdict(list)
    for kind, images in photos.items():
        for backend in backends:
            for part in (_random_crop_rows(kind, images, backend, draws),
                         _center_crop_rows(kind, images, backend)):
                for key, values in part.items():
                    rows[key] += values
    return [{"recipe": recipe, "photos": kind, "backend": backend, "reduction": reduction,
             "crops": len(values), "mad_mean": float(np.mean([v[0] for v in values])),
             "mad_max": float(max(v[0] for v in values)),
             "psnr_min": float(min(v[1] for v in values)),
             "psnr_median": float(np.median([v[1] for v in values]))}
            for (recipe, kind, backend, reduction), values in sorted(rows.items())]


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| recipe | photographs | kernel | decoded at | crops | mean abs. difference "
             "(mean / worst) | PSNR (worst / median) |", "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for row in rows:
        scale = "full size" if row["reduction"] == 1 else f"1/{row['reduction']}"
        lines.append(f"| `{row['recipe']}` | {row['photos']} | {row['backend']} | {scale} | "
                     f"{row['crops']} | {row['mad_mean']:.2f} / {row['mad_max']:.2f} | "
                     f"{row['psnr_min']:.1f} / {row['psnr_median']:.1f} dB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.image_quality", description=__doc__)
    parser.add_argument("--draws", type=int, default=8, help="crops per photograph (default 8)")
    args = parser.parse_args(argv)
    print(table(compare(quality_photos(), draws=args.draws)))


if __name__ == "__main__":
    main()
