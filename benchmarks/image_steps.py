"""What each step of an image pipeline costs, per image, on one core.

``python -m benchmarks.image_steps [--images N] [--repetitions N]`` times each step over the
same photographs (``photos``: 500 px JPEGs; ``photos6mp``: 6-megapixel ones), every step once
per round, rounds repeated, and prints the median milliseconds per image as a Markdown table.
Every crop box is the training recipe's, drawn from the item generator ``(0, 0, i)``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from .bench_images import MEAN, STD, PillowRecipe, _encoded, to_normalized_tensor
from .data import photos6mp_path, photos_path

__all__ = ["steps", "table"]

SIZE = 224


def _boxes(encoded: list[bytes]) -> list:
    import fpipe
    from fpipe.image.boxes import random_resized_box
    from fpipe.image.decode import EncodedImage

    boxes = []
    for i, data in enumerate(encoded):
        image = EncodedImage(data)
        boxes.append(random_resized_box(fpipe.item_rng(0, 0, i), image.width, image.height,
                                        (0.08, 1.0), (3 / 4, 4 / 3)))
    return boxes


def _recipe_steps(encoded: list[bytes]) -> dict[str, Callable[[], object]]:
    """The steps of one list of photographs, each a function over all of them."""
    import simplejpeg
    from PIL import Image

    import fpipe
    from fpipe.image import normalize, random_resized_crop
    from fpipe.image.kernels import resize_box

    boxes = _boxes(encoded)
    decoded = [simplejpeg.decode_jpeg(data) for data in encoded]
    pillow_images = [Image.fromarray(pixels) for pixels in decoded]
    edges = [(b.left, b.top, b.left + b.width, b.top + b.height) for b in boxes]
    recipe, reference = random_resized_crop(SIZE), PillowRecipe()
    crops = [recipe(data) for data in encoded]

    def seeded(transform):
        def run():
            for i, data in enumerate(encoded):
                with fpipe.using_rng(fpipe.item_rng(0, 0, i)):
                    transform(data)
        return run

    quarter = [(-(-p.shape[0] // 4), -(-p.shape[1] // 4)) for p in decoded]
    return {
        "simplejpeg decode, full size": lambda: [simplejpeg.decode_jpeg(d) for d in encoded],
        "simplejpeg decode at 1/4 (DCT scaling)": lambda: [
            simplejpeg.decode_jpeg(d, min_height=h, min_width=w) for d, (h, w) in zip(encoded, quarter)],
        "Pillow antialiased bilinear crop-resize to 224 (`Image.resize(box=...)`)": lambda: [
            image.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)
            for image, box in zip(pillow_images, edges)],
        "torch's uint8 antialiased bilinear kernel, same boxes (channels-last)": lambda: [
            resize_box(pixels, box, (SIZE, SIZE), use_torch=True) for pixels, box in zip(decoded, edges)],
        "the Pillow pipeline: decode, box, resize, flip, to array": seeded(lambda d: np.array(reference(d))),
        "`random_resized_crop(224)`: the same, fused": seeded(recipe),
        "float32 CHW normalisation, per image (`ToTensor` + `Normalize`)": lambda: [
            to_normalized_tensor(crop) for crop in crops],
        "float32 CHW normalisation, per batch of 32 (`normalize`)": lambda: [
            normalize(np.stack(crops[i:i + 32]), MEAN, STD) for i in range(0, len(crops), 32)],
    }


def _time(functions: dict[str, Callable[[], object]], count: int, repetitions: int) -> dict[str, float]:
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repetitions + 1):  # the first round warms up
        for name, function in functions.items():
            began = time.perf_counter()
            function()
            seconds[name].append(time.perf_counter() - began)
    return {name: statistics.median(values[1:]) / count * 1e3 for name, values in seconds.items()}


def steps(images: int = 256, repetitions: int = 5) -> dict[str, dict[str, float]]:
    """Median milliseconds per image of each step, for the 500 px and the 6 MP photographs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        small = _encoded(photos_path(), images)
        large = _encoded(photos6mp_path())
        return {"500 px": _time(_recipe_steps(small), len(small), repetitions),
                "6 MP": _time(_recipe_steps(large), len(large), repetitions)}
    finally:
        torch.set_num_threads(threads)


def table(figures: dict[str, dict[str, float]]) -> str:
    kinds = list(figures)
    lines = ["| step | " + " | ".join(f"{kind}, ms per image" for kind in kinds) + " |",
             "| --- |" + " ---: |" * len(kinds)]
    for name in figures[kinds[0]]:
        lines.append(f"| {name} | " + " | ".join(f"{figures[k][name]:.2f}" for k in kinds) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.image_steps", description=__doc__)
    parser.add_argument("--images", type=int, default=256, help="500 px photographs (default 256)")
    parser.add_argument("--repetitions", type=int, default=5, help="timed rounds (default 5)")
    args = parser.parse_args(argv)
    print(table(steps(args.images, args.repetitions)))


if __name__ == "__main__":
    main()
