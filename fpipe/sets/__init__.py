"""Writers for well-known datasets: CIFAR-10/100, MNIST, Fashion-MNIST and ImageNet.

Each dataset is an object with its class names and a ``write`` method that turns the official
archives (found in a folder, or downloaded when asked) into packed datasets, one per split;
``fpipe write <name> OUT`` does the same from the command line. ``import fpipe`` does not import
this package; importing it loads no image library (Pillow is imported when images are encoded):

>>> import fpipe.sets
>>> fpipe.sets.cifar10.CLASSES[:2]
('airplane', 'automobile')
>>> fpipe.sets.get("fashion-mnist") is fpipe.sets.fashion_mnist
True
>>> fpipe.sets.names()
('cifar10', 'cifar100', 'mnist', 'fashion-mnist', 'imagenet')
"""

from __future__ import annotations

# Importing a family module binds its name here, then the dataset object of the same name
# (``mnist``, ``imagenet``) replaces it: ``fpipe.sets.mnist`` is the dataset, and the module stays
# importable as ``from fpipe.sets.mnist import read_idx``.
from fpipe.sets._fetch import Archive, ArchiveError, ChecksumError, DownloadError, download, fetch, md5sum
from fpipe.sets._writing import KnownDataset, classes_path, load_classes
from fpipe.sets.cifar import cifar10, cifar100
from fpipe.sets.imagenet import imagenet
from fpipe.sets.mnist import fashion_mnist, mnist

__all__ = [
    "Archive",
    "ArchiveError",
    "ChecksumError",
    "DownloadError",
    "KnownDataset",
    "cifar10",
    "cifar100",
    "classes_path",
    "download",
    "fashion_mnist",
    "fetch",
    "get",
    "imagenet",
    "load_classes",
    "md5sum",
    "mnist",
    "names",
]

_DATASETS = {dataset.name: dataset for dataset in (cifar10, cifar100, mnist, fashion_mnist, imagenet)}



def names() -> tuple[str, ...]:
    """The command-line names of the datasets, as :func:`get` takes them.

    >>> "cifar10" in names()
    True
    """
    return tuple(_DATASETS)


def get(name: str) -> KnownDataset:
    """The dataset called ``name`` on the command line (one of :func:`names`).

    >>> get("cifar100").COARSE_CLASSES[0]
    'aquatic_mammals'
    >>> get("svhn")
    Traceback (most recent call last):
    ...
    ValueError: unknown dataset 'svhn'; known: cifar10, cifar100, mnist, fashion-mnist, imagenet
    """
    if name not in _DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(names())}")
    return _DATASETS[name]
