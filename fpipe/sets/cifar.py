"""CIFAR-10 and CIFAR-100 from their official python archives.

Each writes ``train.msgpack`` (50 000 samples) and ``test.msgpack`` (10 000) from
``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz``. Samples are
``{"key", "image", "label"}`` (plus ``"coarse_label"`` for CIFAR-100): ``image`` is the
32×32 RGB picture as PNG bytes, ``key`` the file name the archive gives it (a repeated name gets
``-2``, ``-3``… before its extension), labels index :attr:`~KnownDataset.CLASSES` (and
``COARSE_CLASSES``), in the archive's own order.

>>> cifar10.CLASSES[:3]
('airplane', 'automobile', 'bird')
>>> len(cifar100.CLASSES), len(cifar100.COARSE_CLASSES)
(100, 20)
"""

from __future__ import annotations

import pickle
import tarfile
import zlib
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fpipe.sets._fetch import Archive, ArchiveError
from fpipe.sets._writing import KnownDataset, WriteOptions, encode_png

__all__ = ["CifarDataset", "cifar10", "cifar100"]

_BASE_URL = "https://www.cs.toronto.edu/~kriz/"

_CIFAR10_CLASSES = tuple("airplane automobile bird cat deer dog frog horse ship truck".split())

_CIFAR100_CLASSES = tuple("""
    apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo
    keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse
    mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
    porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper
    snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television
    tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm
    """.split())

_CIFAR100_COARSE_CLASSES = tuple("""
    aquatic_mammals fish flowers food_containers fruit_and_vegetables
    household_electrical_devices household_furniture insects large_carnivores
    large_man-made_outdoor_things large_natural_outdoor_scenes large_omnivores_and_herbivores
    medium_mammals non-insect_invertebrates people reptiles small_mammals trees vehicles_1
    vehicles_2
    """.split())

_SIDE = 32
_ROW = 3 * _SIDE * _SIDE

# The batches are pickles; unpickling runs whatever they name, so only what numpy needs to
# rebuild an array is allowed.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if name == "_reconstruct":
            # The running numpy's own array rebuilder: its module moved in numpy 2.
            return np.empty(0).__reduce__()[0]
        return getattr(np, name)


@dataclass(frozen=True)
class CifarDataset(KnownDataset):
    """A CIFAR dataset: its archive's top folder, batch files and label fields.

    >>> cifar100.fields
    ('key', 'image', 'label', 'coarse_label')
    """

    folder: str = ""
    batches: tuple[tuple[str, tuple[str, ...]], ...] = ()
    label_field: str = "labels"
    COARSE_CLASSES: tuple[str, ...] = ()

    def classes(self) -> dict[str, tuple[str, ...]]:
        """The class names of ``label`` (and ``coarse_label`` for CIFAR-100)."""
        if self.COARSE_CLASSES:
            return {"label": self.CLASSES, "coarse_label": self.COARSE_CLASSES}
        return {"label": self.CLASSES}

    def _open(self, source: Path, options: WriteOptions, stack: ExitStack) -> Path:
        (path,) = self._fetch_all(source, options).values()
        return path

    def _records(self, opened: Path, split: str) -> _Rows:
        names = dict(self.batches)[split]
        try:
            with tarfile.open(opened, "r:gz") as archive:
                batches = [_load_batch(archive, f"{self.folder}/{name}") for name in names]
        except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
            raise ArchiveError(f"unreadable archive ({error})", path=opened) from None
        return _Rows.join(batches, self.label_field, coarse=bool(self.COARSE_CLASSES), path=opened)


def _load_batch(archive: tarfile.TarFile, member: str) -> dict:
    try:
        file = archive.extractfile(member)
    except KeyError:
        raise ArchiveError(f"no member {member!r}: not a CIFAR python archive",
                           path=archive.name) from None
    try:
        batch = _BatchUnpickler(file, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
        raise ArchiveError(f"{member}: not a CIFAR batch ({error})", path=archive.name) from None
    if not isinstance(batch, dict):
        raise ArchiveError(f"{member}: not a CIFAR batch (a {type(batch).__name__})",
                           path=archive.name)
    return {key.decode() if isinstance(key, bytes) else key: value for key, value in batch.items()}


@dataclass(frozen=True)
class _Rows:
    """The rows of one split: pixels (n×3072, channel planes), labels, keys."""

    data: np.ndarray
    labels: np.ndarray
    coarse: np.ndarray | None
    keys: tuple[str, ...]

    @classmethod
    def join(cls, batches: list[dict], label_field: str, coarse: bool, path: Path) -> _Rows:
        try:
            data = np.concatenate([np.asarray(batch["data"], np.uint8) for batch in batches])
            labels = np.concatenate([np.asarray(batch[label_field], np.int64) for batch in batches])
            names = [name for batch in batches for name in batch["filenames"]]
            coarse_labels = (np.concatenate([np.asarray(b["coarse_labels"], np.int64) for b in batches])
                             if coarse else None)
        except (KeyError, ValueError, TypeError) as error:
            raise ArchiveError(f"not a CIFAR batch (field {error})", path=path) from None
        if data.ndim != 2 or data.shape[1] != _ROW or not len(data) == len(labels) == len(names):
            raise ArchiveError(f"not a CIFAR batch (data {data.shape}, {len(labels)} labels, "
                               f"{len(names)} file names)", path=path)
        return cls(data, labels, coarse_labels, _unique_keys(names))

    def __len__(self) -> int:
        return len(self.keys)

    def sample(self, index: int) -> dict:
        """The sample at ``index``: its key, PNG image and label(s)."""
        pixels = self.data[index].reshape(3, _SIDE, _SIDE).transpose(1, 2, 0)
        sample = {"key": self.keys[index], "image": encode_png(pixels), "label": int(self.labels[index])}
        if self.coarse is not None:
            sample["coarse_label"] = int(self.coarse[index])
        return sample


def _unique_keys(names: list) -> tuple[str, ...]:
    """File names as keys; CIFAR-100 repeats some, so a repeat gets ``-2``, ``-3``… added."""
    keys: dict[str, None] = {}
    for raw in names:
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        stem, dot, extension = name.rpartition(".")
        stem, dot = (stem, dot) if dot else (name, "")
        candidate, copy = name, 1
        while candidate in keys:
            copy += 1
            candidate = f"{stem}-{copy}{dot}{extension}"
        keys[candidate] = None
    return tuple(keys)


cifar10 = CifarDataset(
    name="cifar10",
    splits=("train", "test"),
    archives=(Archive("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
                      _BASE_URL + "cifar-10-python.tar.gz"),),
    CLASSES=_CIFAR10_CLASSES,
    folder="cifar-10-batches-py",
    batches=(("train", tuple(f"data_batch_{i}" for i in range(1, 6))), ("test", ("test_batch",))),
)

cifar100 = CifarDataset(
    name="cifar100",
    splits=("train", "test"),
    archives=(Archive("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
                      _BASE_URL + "cifar-100-python.tar.gz"),),
    CLASSES=_CIFAR100_CLASSES,
    fields=("key", "image", "label", "coarse_label"),
    folder="cifar-100-python",
    batches=(("train", ("train",)), ("test", ("test",))),
    label_field="fine_labels",
    COARSE_CLASSES=_CIFAR100_COARSE_CLASSES,
)
