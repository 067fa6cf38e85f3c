"""MNIST and Fashion-MNIST from their official gzipped IDX files.

Each writes ``train.msgpack`` (60 000 samples) and ``test.msgpack`` (10 000) from the four
files ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz``. Samples are
``{"key", "image", "label"}``: ``image`` is the 28×28 grey picture as PNG bytes, ``key`` is
``"<split>_<index>"`` with the index zero-padded to five digits, ``label`` indexes
:attr:`~KnownDataset.CLASSES`; the order is the files' own.

>>> mnist.CLASSES[:3], fashion_mnist.CLASSES[:3]
(('0', '1', '2'), ('T-shirt/top', 'Trouser', 'Pullover'))
"""

from __future__ import annotations

import gzip
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fpipe.sets._fetch import Archive, ArchiveError
from fpipe.sets._writing import KnownDataset, WriteOptions, encode_png

__all__ = ["FASHION_MNIST_CLASSES", "MNIST_CLASSES", "MnistDataset", "fashion_mnist", "mnist",
           "read_idx"]

MNIST_CLASSES = tuple("0123456789")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")

_PREFIX = {"train": "train", "test": "t10k"}
_UBYTE = 0x08


def read_idx(path: str | Path, ndim: int) -> np.ndarray:
    """The unsigned-byte array in the gzipped IDX file ``path``, which must have ``ndim``
    dimensions; anything else raises :class:`ArchiveError`.

    >>> import gzip, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "labels-idx1-ubyte.gz")
    >>> with gzip.open(path, "wb") as file:
    ...     _ = file.write(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 0, 9]))
    >>> read_idx(path, 1)
    array([7, 0, 9], dtype=uint8)
    """
    try:
        with gzip.open(path, "rb") as file:
            content = file.read()
    except (OSError, EOFError, zlib.error) as error:
        raise ArchiveError(f"not a gzipped IDX file ({error})", path=path) from None
    header = 4 + 4 * ndim
    if len(content) < header or content[:4] != bytes([0, 0, _UBYTE, ndim]):
        raise ArchiveError(f"not an IDX file of {ndim}-d unsigned bytes (header "
                           f"{content[:4].hex()})", path=path)
    shape = tuple(int(n) for n in np.frombuffer(content, ">u4", ndim, offset=4))
    size = int(np.prod(shape))
    if len(content) != header + size:
        raise ArchiveError(f"holds {len(content) - header} bytes of data, its header says "
                           f"{shape} = {size}", path=path)
    return np.frombuffer(content, np.uint8, size, offset=header).reshape(shape)


@dataclass(frozen=True)
class MnistDataset(KnownDataset):
    """An MNIST-style dataset: four gzipped IDX files, images and labels per split.

    >>> mnist.archives[0].filename
    'train-images-idx3-ubyte.gz'
    """

    def _open(self, source: Path, options: WriteOptions, stack: ExitStack) -> dict[str, Path]:
        return self._fetch_all(source, options)

    def _records(self, opened: dict[str, Path], split: str) -> _Digits:
        images = read_idx(opened[f"{_PREFIX[split]}-images-idx3-ubyte.gz"], 3)
        labels_path = opened[f"{_PREFIX[split]}-labels-idx1-ubyte.gz"]
        labels = read_idx(labels_path, 1)
        if len(images) != len(labels):
            raise ArchiveError(f"{len(labels)} labels for {len(images)} images", path=labels_path)
        if labels.size and labels.max() >= len(self.CLASSES):
            raise ArchiveError(f"label {labels.max()} is not one of the {len(self.CLASSES)} "
                               f"classes", path=labels_path)
        return _Digits(images, labels, split)


@dataclass(frozen=True)
class _Digits:
    images: np.ndarray
    labels: np.ndarray
    split: str

    def __len__(self) -> int:
        return len(self.labels)

    def sample(self, index: int) -> dict:
        """The sample at ``index``: its key, PNG image and label."""
        return {"key": f"{self.split}_{int(index):05d}", "image": encode_png(self.images[index]),
                "label": int(self.labels[index])}


def _archives(base_url: str, md5s: dict[str, str]) -> tuple[Archive, ...]:
    return tuple(Archive(f"{_PREFIX[split]}-{kind}-ubyte.gz", md5s[f"{split} {kind}"],
                         f"{base_url}{_PREFIX[split]}-{kind}-ubyte.gz", splits=(split,))
                 for split in ("train", "test") for kind in ("images-idx3", "labels-idx1"))


mnist = MnistDataset(
    name="mnist",
    splits=("train", "test"),
    archives=_archives("https://ossci-datasets.s3.amazonaws.com/mnist/", {
        "train images-idx3": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train labels-idx1": "d53e105ee54ea40749a09fcbcd1e9432",
        "test images-idx3": "9fb629c4189551a2d022fa330f9573f3",
        "test labels-idx1": "ec29112dd5afa0611ce80d1b7f02629c",
    }),
    CLASSES=MNIST_CLASSES,
)

# Zalando publishes the files on a plain-http site; the same files (same md5) are served over
# https from the project's repository, so certificates are checked.
fashion_mnist = MnistDataset(
    name="fashion-mnist",
    splits=("train", "test"),
    archives=_archives("https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/"
                       "data/fashion/", {
                           "train images-idx3": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                           "train labels-idx1": "25c81989df183df01b3e8a0aad5dffbe",
                           "test images-idx3": "bef4ecab320f06d8554ea6380940ec79",
                           "test labels-idx1": "bb300cfdad3c16e7a12a480ee83cd310",
                       }),
    CLASSES=FASHION_MNIST_CLASSES,
)
