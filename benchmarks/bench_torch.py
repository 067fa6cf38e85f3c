"""Workloads of the torch adapters: T1, T2 (against datadings's), T3 (worker scaling), and T4,
T4n (an fpipe pipeline against a torch DataLoader doing the same image work; T4n, the user's own
``torch.stack`` in the main process, is kept as information, with no target).

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

    import fpipe
    import fpipe.torch

    path = small_path()
    return _pair(lambda: fpipe.torch.IterableDataset(fpipe.dataset.MsgpackReader(path)),
                 lambda: datadings.torch.IterableDataset(datadings.reader.MsgpackReader(path)),
                 100_000, batch_size=BATCH, collate_fn=_as_list)


@workload("T2", description="map-style Dataset over small, DataLoader(shuffle=True), 2 workers, batch 256",
          reference="datadings Dataset", target=">= 1.2")
def map_dataset() -> Pair:
    import datadings.reader
    import datadings.torch

    import fpipe
    import fpipe.torch

    path = small_path()
    return _pair(lambda: fpipe.torch.Dataset(fpipe.dataset.MsgpackReader(path)),
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


def _to_uint8_chw(image) -> np.ndarray:
    return np.asarray(image).transpose(2, 0, 1)


def _augment(last):
    """decode, random resized crop, flip, then ``last`` (to a float tensor, or to uint8 CHW)."""
    from PIL import ImageOps

    import fpipe
    import fpipe.torch

    return fpipe.torch.Compose(fpipe.torch.CompressedToPIL(), _random_resized_crop,
                               fpipe.random_apply(0.5, ImageOps.mirror), last)


def _image_dataset():
    import fpipe
    import fpipe.torch

    return fpipe.torch.Dataset(fpipe.dataset.MsgpackReader(images_path()),
                               {"image": _augment(_to_tensor)}, samples=fpipe.torch.Samples(seed=0))


@workload("T3", description="images: decode + random resized crop 224 + flip + to tensor, "
          "map-style Dataset, batch 32, 2 process workers", reference="the same with 1 worker",
          target=">= 1.7")
def image_workers() -> Pair:
    dataset = _image_dataset()
    items = len(dataset)
    options = {"batch_size": IMAGE_BATCH, "shuffle": True}
    return Pair(fpipe=lambda: _epoch(dataset, 2, items, **options),
                reference=lambda: _epoch(dataset, 1, items, **options), items=items)


class _AugmentedItem:
    """One sample id -> (augmented image, label); picklable (the reader pickles by path)."""

    def __init__(self, reader, augment) -> None:
        self.reader, self.augment = reader, augment

    def __call__(self, index: int) -> tuple:
        sample = self.reader[index]
        return self.augment(sample["image"]), sample["label"]


class _AugmentedBatch:
    """A batch of sample ids -> (uint8 images N x 3 x 224 x 224, labels), made in a worker."""

    def __init__(self, item: _AugmentedItem) -> None:
        self.item = item

    def __call__(self, indices: list) -> tuple:
        images, labels = zip(*map(self.item, indices))
        return np.stack(images), np.asarray(labels)


def _float_batch(batch: tuple) -> tuple:
    import torch

    images, labels = batch
    return torch.from_numpy(images).float().div_(255), torch.from_numpy(labels)


def _stack_batch(batch: list) -> tuple:
    import torch

    images, labels = zip(*batch)
    return torch.stack(images), torch.as_tensor(labels)


def _against_data_loader(stage, before: tuple, after: tuple) -> Pair:
    """An fpipe pipeline over a seeded permutation against a persistent DataLoader (2 workers,
    shuffle, batch 32) over the same images with the same augmentation, to float tensors."""
    from toolz import pipe
    from torch.utils.data import DataLoader

    items = len(_image_dataset())
    loader = DataLoader(_image_dataset(), batch_size=IMAGE_BATCH, shuffle=True, num_workers=2,
                        persistent_workers=True)

    def ours() -> int:
        order = np.random.default_rng(0).permutation(items).tolist()
        return sum(len(labels) for _, labels in pipe(order, *before, stage, *after))
    return Pair(fpipe=ours, reference=lambda: sum(len(b["label"]) for b in loader), items=items,
                teardown=stage.close)


@workload("T4", description="images: decode + random resized crop 224 + flip, batches of 32 float "
          "tensors; fpipe: batch(32), processes(2 workers) making uint8 batches, to float in the "
          "main process", reference="torch DataLoader (2 persistent workers, to_tensor in the workers)",
          target=">= 1.1")
def pipeline_against_data_loader() -> Pair:
    import fpipe
    import fpipe as fp

    reader = fpipe.dataset.MsgpackReader(images_path())
    batch = _AugmentedBatch(_AugmentedItem(reader, _augment(_to_uint8_chw)))
    stage = fp.processes(batch, n_workers=2, seed=0)
    return _against_data_loader(stage, (fp.batch(IMAGE_BATCH),), (fp.stream.map(_float_batch),))


@workload("T4n", description="T4 written naively: processes(2 workers) making one float tensor per "
          "image, batched in the main process by the user's own torch.stack (information: the "
          "target moved to O1d, see the benchmarks page)", reference="torch DataLoader (2 "
          "persistent workers, to_tensor in the workers)", target="-")
def naive_pipeline_against_data_loader() -> Pair:
    import fpipe
    import fpipe as fp

    reader = fpipe.dataset.MsgpackReader(images_path())
    stage = fp.processes(_AugmentedItem(reader, _augment(_to_tensor)), n_workers=2, seed=0)
    return _against_data_loader(stage, (), (fp.batch(IMAGE_BATCH), fp.stream.map(_stack_batch)))
