"""I5's peers, run in an environment of their own (a torchvision that matches its torch, and
FFCV); they need neither fpipe nor msgpack.

``python peer_loaders.py SYSTEM KIND JPEGS.npy OFFSETS.npy ORDER.npy``, with SYSTEM
``torchvision`` or ``ffcv`` and KIND ``uint8`` or ``float``: builds the loader, prints
``ready``, then reads one line per epoch on stdin and answers each with the number of images
the epoch gave. Both read the images of ORDER in batches of 32 with 2 workers and make a
random resized crop of 224 and a flip, then for ``float`` normalise with ImageNet's mean and
std:

* ``torchvision``: a torch DataLoader (2 persistent workers) whose dataset decodes with
  ``torchvision.io.decode_jpeg`` and applies ``v2.RandomResizedCrop(224, antialias=True)``,
  ``v2.RandomHorizontalFlip()`` (and ``v2.ToDtype(torch.float32, scale=True)``,
  ``v2.Normalize``): uint8 CHW, torchvision's fastest documented CPU path;
* ``ffcv``: FFCV's ``Loader`` (2 threads, random order, ``os_cache=True``) over a ``.beton``
  written beside JPEGS.npy from the same photographs (``RGBImageField(write_mode="jpg",
  jpeg_quality=90)``: FFCV re-encodes them), with ``RandomResizedCropRGBImageDecoder``,
  ``RandomHorizontalFlip`` and ``ToTensor`` (uint8 HWC), and for ``float`` ``NormalizeImage``
  first (its CPU form takes numpy batches; after ``ToTensor`` the loader hung here) and
  ``ToTorchImage`` last (channels first).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

__all__ = ["main"]

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _torchvision(kind: str, jpegs: np.ndarray, offsets: np.ndarray, order: list):
    import torch
    from torch.utils.data import DataLoader, Dataset
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    steps = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
    if kind == "float":
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=MEAN, std=STD)]
    transform = v2.Compose(steps)

    class Photos(Dataset):
        def __len__(self) -> int:
            return len(offsets) - 1

        def __getitem__(self, index: int) -> tuple:
            data = torch.from_numpy(jpegs[offsets[index]:offsets[index + 1]].copy())
            return transform(decode_jpeg(data)), 0

    return DataLoader(Photos(), batch_size=32, sampler=order, num_workers=2,
                      persistent_workers=True)


def _write_beton(path: Path, jpegs: np.ndarray, offsets: np.ndarray) -> None:
    import io

    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from PIL import Image

    class Photos:
        def __len__(self) -> int:
            return len(offsets) - 1

        def __getitem__(self, index: int) -> tuple:
            data = jpegs[offsets[index]:offsets[index + 1]].tobytes()
            return Image.open(io.BytesIO(data)).convert("RGB"), 0

    part = path.with_name(path.name + ".part")
    fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
    DatasetWriter(str(part), fields, num_workers=2).from_indexed_dataset(Photos())
    part.rename(path)


def _ffcv(kind: str, jpegs: np.ndarray, offsets: np.ndarray, order: list, beton: Path):
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

    if not beton.exists():
        _write_beton(beton, jpegs, offsets)
    image = [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip()]
    if kind == "float":  # on the CPU FFCV normalises numpy batches, before ToTensor
        image += [NormalizeImage(np.array(MEAN) * 255, np.array(STD) * 255, np.float32),
                  ToTensor(), ToTorchImage()]
    else:
        image += [ToTensor()]
    return Loader(str(beton), batch_size=32, num_workers=2, order=OrderOption.RANDOM,
                  os_cache=True, indices=order,
                  pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})


def main(argv: list[str]) -> None:
    system, kind, data, offsets_file, order_file = argv
    jpegs, offsets, order = (np.load(path) for path in (data, offsets_file, order_file))
    if system == "torchvision":
        loader = _torchvision(kind, jpegs, offsets, order.tolist())
    else:
        loader = _ffcv(kind, jpegs, offsets, order.tolist(), Path(data).with_name("photos.beton"))
    print("ready", flush=True)
    for _ in sys.stdin:
        print(sum(len(labels) for _, labels in loader), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
