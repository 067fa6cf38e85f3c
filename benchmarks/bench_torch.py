"""Workloads of the torch adapters: T1, T2 (against datadings's) and T3 (worker scaling).

Every timed call builds a fresh DataLoader and reads one epoch, so worker start-up counts, as
it does for a user whose workers are not persistent. Samples are collated into lists (T1, T2)
so that the figures measure reading and moving samples, not collation.
"""

from __future__ import annotations

import math

import numpy as np

from .data import images_path, small_path
from .harness import Pair, workload

BATCH = 256
IMAGE_BATCH = 32
CROP = 224


def _as_list(samples: list) -> list:
    return samples


def _epoch(dataset, workers: int, expected: int, **options) -> int:
    from torch.utils.data import DataLoader

    data_loader = DataLoader(dataset, num_workers=workers, **options)
    count = sum(len(batch["label"]) if isinstance(batch, dict) else len(batch) for batch in data_loader)
    if count != expected:
        raise AssertionError(f"an epoch gave {count} samples, not {expected}")
    return count


def _pair(make_fpipe, make_reference, items: int, **options) -> Pair:
    return Pair(fpipe=lambda: _epoch(make_fpipe(), 2, items, **options),
                reference=lambda: _epoch(make_reference(), 2, items, **options), items=items)


@workload("T1", description="IterableDataset over small in a DataLoader, 2 workers, batch 256",
          reference="datadings IterableDataset", target=">= 1.2")
def iterable_dataset() -> Pair:
    import datadings.reader
    import datadings.torch

    import fpipe.storage
    import fpipe.torch

    path = small_path()
    return _pair(lambda: fpipe.torch.IterableDataset(fpipe.storage.MsgpackReader(path)),
                 lambda: datadings.torch.IterableDataset(datadings.reader.MsgpackReader(path)),
                 100_000, batch_size=BATCH, collate_fn=_as_list)


@workload("T2", description="map-style Dataset over small, DataLoader(shuffle=True), 2 workers, batch 256",
          reference="datadings Dataset", target=">= 1.2")
def map_dataset() -> Pair:
    import datadings.reader
    import datadings.torch

    import fpipe.storage
    import fpipe.torch

    path = small_path()
    return _pair(lambda: fpipe.torch.Dataset(fpipe.storage.MsgpackReader(path)),
                 lambda: datadings.torch.Dataset(datadings.reader.MsgpackReader(path)),
                 100_000, batch_size=BATCH, collate_fn=_as_list, shuffle=True)


def _random_resized_crop(image, size: int = CROP, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision's RandomResizedCrop (bilinear), drawing from fpipe's item generator."""
    from PIL import Image

    import fpipe

    rng = fpipe.current_rng()
    width, height = image.size
    for _ in range(10):
        area = width * height * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            return image.resize((size, size), Image.BILINEAR, box=(x, y, x + w, y + h))
    side = min(width, height)
    x, y = (width - side) // 2, (height - side) // 2
    return image.resize((size, size), Image.BILINEAR, box=(x, y, x + side, y + side))


def _to_tensor(image):
    """torchvision's ToTensor: float CHW in [0, 1] (numpy does it without torch's threads)."""
    import torch

    return torch.from_numpy(np.array(image).transpose(2, 0, 1).astype(np.float32)).div_(255)


def _image_dataset():
    from PIL import ImageOps

    import fpipe
    import fpipe.storage
    import fpipe.torch

    augment = fpipe.torch.Compose(fpipe.torch.CompressedToPIL(), _random_resized_crop,
                                  fpipe.random_apply(0.5, ImageOps.mirror), _to_tensor)
    return fpipe.torch.Dataset(fpipe.storage.MsgpackReader(images_path()), {"image": augment}, seed=0)


@workload("T3", description="images: decode + random resized crop 224 + flip + to tensor, "
          "map-style Dataset, batch 32, 2 process workers", reference="the same with 1 worker",
          target=">= 1.7")
def image_workers() -> Pair:
    dataset = _image_dataset()
    items = len(dataset)
    options = {"batch_size": IMAGE_BATCH, "shuffle": True}
    return Pair(fpipe=lambda: _epoch(dataset, 2, items, **options),
                reference=lambda: _epoch(dataset, 1, items, **options), items=items)
