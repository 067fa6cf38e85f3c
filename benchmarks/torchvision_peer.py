"""I5's peer: a torch DataLoader running torchvision's tensor path, in an environment with a
torchvision that matches its torch (it needs neither fpipe nor msgpack).

``python torchvision_peer.py JPEGS.npy OFFSETS.npy ORDER.npy uint8|float``: reads one line per
epoch on stdin and answers each with the number of images the epoch gave. The workers decode
with ``torchvision.io.decode_jpeg``, then ``v2.RandomResizedCrop(224, antialias=True)`` and
``v2.RandomHorizontalFlip()``, and for ``float`` ``v2.ToDtype(torch.float32, scale=True)`` and
``v2.Normalize`` with ImageNet's mean and std: torchvision's fastest documented CPU path.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from torch.utils.data import DataLoader
from torchvision.io import decode_jpeg
from torchvision.transforms import v2

__all__ = ["Photos", "main"]


class Photos(torch.utils.data.Dataset):
    """Sample ``i``: (the transformed image, 0), from JPEG bytes held in memory."""

    def __init__(self, jpegs: np.ndarray, offsets: np.ndarray, transform) -> None:
        self.jpegs, self.offsets, self.transform = jpegs, offsets, transform

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> tuple:
        data = torch.from_numpy(self.jpegs[self.offsets[index]:self.offsets[index + 1]].copy())
        return self.transform(decode_jpeg(data)), 0


def main(argv: list[str]) -> None:
    jpegs, offsets, order = (np.load(path) for path in argv[:3])
    steps = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
    if argv[3] == "float":
        steps += [v2.ToDtype(torch.float32, scale=True),
                  v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])]
    loader = DataLoader(Photos(jpegs, offsets, v2.Compose(steps)), batch_size=32,
                        sampler=order.tolist(), num_workers=2, persistent_workers=True)
    for _ in sys.stdin:
        count = sum(len(labels) for _, labels in loader)
        print(count, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
