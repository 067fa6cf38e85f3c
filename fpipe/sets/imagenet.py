"""ImageNet (ILSVRC2012 classification) from its official tar files or their extracted folders.

Writes ``train.msgpack`` and ``val.msgpack``. The sources, looked up in the source folder:

- train: ``ILSVRC2012_img_train.tar`` (a tar of one tar per class), or a ``train/`` folder with
  one sub-folder per class named by its WordNet id (``train/n01440764/*.JPEG``);
- val: ``ILSVRC2012_img_val.tar``, or a ``val/`` folder holding either the 50 000 images or one
  sub-folder per class. Flat images take their labels from the devkit
  (``ILSVRC2012_devkit_t12.tar.gz`` or its extracted ``ILSVRC2012_devkit_t12/`` folder; reading
  its ``meta.mat`` needs scipy) or from ``LOC_val_solution.csv``.

ImageNet cannot be downloaded automatically (the archives need a registration). Samples are
``{"key", "image", "label"}``: ``key`` is the image's file name, ``image`` its original JPEG
bytes (an image that is CMYK, not a JPEG, or not RGB/grey is re-encoded as JPEG, quality 95,
4:4:4), ``label`` the position of its WordNet id in ``imagenet.WNIDS`` (the sorted ids; their
names are ``imagenet.CLASSES``). The order is fixed whatever the form of the source: train by label then key,
val by key.

>>> imagenet.WNIDS[0], imagenet.CLASSES[0]
('n01440764', 'tench, Tinca tinca')
"""

from __future__ import annotations

import csv
import io
import os
import tarfile
import zlib
from array import array
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from fpipe.sets._fetch import Archive, ArchiveError, progress_bar
from fpipe.sets._imagenet_synsets import SYNSETS
from fpipe.sets._writing import KnownDataset, WriteOptions

__all__ = ["ImageNetDataset", "imagenet"]

_WNIDS = tuple(wnid for wnid, _ in SYNSETS)
_LABELS = {wnid: label for label, wnid in enumerate(_WNIDS)}

_TRAIN = Archive("ILSVRC2012_img_train.tar", "1d675b47d978889d74fa0da5fadfb00e", splits=("train",))
_VAL = Archive("ILSVRC2012_img_val.tar", "29b22e2961454d5413ddabcf34fc5622", splits=("val",))
_DEVKIT = Archive("ILSVRC2012_devkit_t12.tar.gz", "fa75699e90414af021442c21a62c3abf",
                  splits=("val",))
_DEVKIT_DATA = "ILSVRC2012_devkit_t12/data/"
_KAGGLE_LABELS = "LOC_val_solution.csv"
_REENCODE = {"quality": 95, "subsampling": 0}


@dataclass(frozen=True)
class ImageNetDataset(KnownDataset):
    """ILSVRC2012: its archives or extracted folders, labels by sorted WordNet id.

    >>> len(imagenet.WNIDS), imagenet.splits
    (1000, ('train', 'val'))
    """

    WNIDS: tuple[str, ...] = ()

    def _classes_extra(self) -> dict:
        return {"wnids": list(self.WNIDS)}

    def _open(self, source: Path, options: WriteOptions, stack: ExitStack) -> dict[str, Callable]:
        return {split: self._locate(split, source, options, stack) for split in options.splits}

    def _records(self, opened: dict[str, Callable[[], _Images]], split: str) -> _Images:
        return opened[split]()

    def _archive(self, split: str) -> Archive:
        (archive,) = (a for a in self.archives if a.splits == (split,) and a.filename.endswith(".tar"))
        return archive

    def _locate(self, split: str, source: Path, options: WriteOptions, stack: ExitStack) -> Callable:
        """A function that scans ``split``'s images once everything needed has been found."""
        archive, folder = self._archive(split), source / split
        if (source / archive.filename).is_file():
            path = self._fetch(archive, source, options)
            fd = os.open(path, os.O_RDONLY)
            stack.callback(os.close, fd)
            if split == "train":
                return partial(_scan_train_tar, path, fd, options.progress)
            return partial(_scan_flat_tar, path, fd, self._val_labels(source, options))
        if folder.is_dir():
            if split == "train" or any(entry.is_dir() for entry in os.scandir(folder)):
                return partial(_scan_class_folders, folder, by_label=split == "train")
            return partial(_scan_flat_folder, folder, self._val_labels(source, options))
        raise FileNotFoundError(
            f"imagenet {split}: neither {archive.filename} nor a {split}/ folder in {source}; "
            f"ImageNet cannot be downloaded automatically: get the ILSVRC2012 archives from "
            f"https://image-net.org (registration needed) and put them there")

    def _val_labels(self, source: Path, options: WriteOptions) -> dict[str, int]:
        """The label of each val image file name, from the devkit or Kaggle's solution file."""
        devkit = next(a for a in self.archives if a.filename.endswith(".tar.gz"))
        if (source / devkit.filename).is_file():
            path = self._fetch(devkit, source, options)
            return _devkit_labels(*_read_devkit_tar(path), where=path)
        folder = source / _DEVKIT_DATA
        if folder.is_dir():
            meta, truth = folder / "meta.mat", folder / "ILSVRC2012_validation_ground_truth.txt"
            return _devkit_labels(meta.read_bytes(), truth.read_text(), where=folder)
        if (source / _KAGGLE_LABELS).is_file():
            return _kaggle_labels(source / _KAGGLE_LABELS)
        raise FileNotFoundError(
            f"imagenet val: the images have no labels: put {devkit.filename} (or its extracted "
            f"ILSVRC2012_devkit_t12/ folder) or {_KAGGLE_LABELS} in {source}, or sort the "
            f"images into val/<wnid>/ folders")


@dataclass(frozen=True)
class _TarSlices:
    """Member contents read straight from the tar file by offset (safe from many threads)."""

    path: Path
    fd: int
    offsets: np.ndarray
    sizes: np.ndarray

    def __call__(self, index: int) -> bytes:
        size = int(self.sizes[index])
        data = os.pread(self.fd, size, int(self.offsets[index]))
        if len(data) != size:
            raise ArchiveError(f"truncated: {len(data)} of {size} bytes at byte "
                               f"{int(self.offsets[index])}", path=self.path)
        return data

    def where(self, index: int) -> Path:
        return self.path

    def take(self, order: np.ndarray) -> _TarSlices:
        return replace(self, offsets=self.offsets[order], sizes=self.sizes[order])


@dataclass(frozen=True)
class _Files:
    paths: tuple[Path, ...]

    def __call__(self, index: int) -> bytes:
        return self.paths[index].read_bytes()

    def where(self, index: int) -> Path:
        return self.paths[index]

    def take(self, order: np.ndarray) -> _Files:
        return _Files(tuple(self.paths[i] for i in order))


@dataclass(frozen=True)
class _Images:
    """One split's images: keys, labels, and how to read each one's bytes."""

    keys: tuple[str, ...]
    labels: np.ndarray
    load: _TarSlices | _Files

    @classmethod
    def ordered(cls, keys: list[str], labels: list[int], load: Any, by_label: bool) -> _Images:
        labels = np.asarray(labels, np.int64)
        order = np.array(sorted(range(len(keys)), key=(lambda i: (labels[i], keys[i])) if by_label
                                else keys.__getitem__), np.int64)
        return cls(tuple(keys[i] for i in order), labels[order], load.take(order))

    def __len__(self) -> int:
        return len(self.keys)

    def sample(self, index: int) -> dict:
        """The sample at ``index``: its key, JPEG bytes (checked, re-encoded if needed), label."""
        key = self.keys[index]
        image = _checked_jpeg(self.load(index), key, self.load.where(index))
        return {"key": key, "image": image, "label": int(self.labels[index])}


def _checked_jpeg(data: bytes, key: str, where: Path) -> bytes:
    """``data`` itself when it is a decodable RGB or grey JPEG, else re-encoded as JPEG."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format == "JPEG" and image.mode in ("RGB", "L"):
                # A 1/8-scale decode still reads every coded block, so corruption shows, cheaply.
                image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
                image.load()
                return data
            buffer = io.BytesIO()
            image.convert("RGB").save(buffer, "JPEG", **_REENCODE)
            return buffer.getvalue()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ArchiveError(f"{key}: not a readable image ({error})", path=where) from None


@contextmanager
def _archive_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except (tarfile.TarError, EOFError, zlib.error) as error:
        raise ArchiveError(f"unreadable archive ({error})", path=path) from None


def _label(labels: dict[str, int], name: str, where: Path) -> int:
    try:
        return labels[name]
    except KeyError:
        raise ArchiveError(f"{name!r} is not one of the 1000 ILSVRC2012 classes or has no label",
                           path=where) from None


def _scan_train_tar(path: Path, fd: int, progress: bool | None) -> _Images:
    """Index the images of the tar of class tars: reading 1.3 million headers takes a while."""
    keys: list[str] = []
    labels, offsets, sizes = array("q"), array("q"), array("q")
    shown = progress_bar(progress, total=len(_LABELS), desc="imagenet train: index", unit=" classes")
    with _archive_errors(path), tarfile.open(path, "r:") as outer, shown as bar:
        for member in outer:
            if not member.isfile():
                continue
            label = _label(_LABELS, Path(member.name).name.removesuffix(".tar"), path)
            with tarfile.open(fileobj=outer.extractfile(member), mode="r:") as inner:
                for image in inner:
                    if image.isfile():
                        keys.append(Path(image.name).name)
                        labels.append(label)
                        offsets.append(member.offset_data + image.offset_data)
                        sizes.append(image.size)
            bar.update(1)
    slices = _TarSlices(path, fd, np.asarray(offsets, np.int64), np.asarray(sizes, np.int64))
    return _Images.ordered(keys, labels, slices, by_label=True)


def _scan_flat_tar(path: Path, fd: int, labels: dict[str, int]) -> _Images:
    keys: list[str] = []
    found, offsets, sizes = array("q"), array("q"), array("q")
    with _archive_errors(path), tarfile.open(path, "r:") as archive:
        for member in archive:
            if member.isfile():
                keys.append(Path(member.name).name)
                found.append(_label(labels, keys[-1], path))
                offsets.append(member.offset_data)
                sizes.append(member.size)
    slices = _TarSlices(path, fd, np.asarray(offsets, np.int64), np.asarray(sizes, np.int64))
    return _Images.ordered(keys, found, slices, by_label=False)


def _scan_class_folders(folder: Path, by_label: bool) -> _Images:
    keys, labels, paths = [], [], []
    for entry in sorted(os.scandir(folder), key=lambda entry: entry.name):
        if entry.is_dir():
            label = _label(_LABELS, entry.name, folder)
            for file in sorted(Path(entry.path).iterdir()):
                if file.is_file():
                    keys.append(file.name)
                    labels.append(label)
                    paths.append(file)
    return _Images.ordered(keys, labels, _Files(tuple(paths)), by_label)


def _scan_flat_folder(folder: Path, labels: dict[str, int]) -> _Images:
    paths = [file for file in sorted(folder.iterdir()) if file.is_file()]
    keys = [file.name for file in paths]
    found = [_label(labels, key, folder) for key in keys]
    return _Images.ordered(keys, found, _Files(tuple(paths)), by_label=False)


def _read_devkit_tar(path: Path) -> tuple[bytes, str]:
    names = (_DEVKIT_DATA + "meta.mat", _DEVKIT_DATA + "ILSVRC2012_validation_ground_truth.txt")
    with _archive_errors(path), tarfile.open(path, "r:gz") as archive:
        try:
            meta, truth = (archive.extractfile(name).read() for name in names)
        except KeyError as error:
            raise ArchiveError(f"no member {error}: not the ILSVRC2012 devkit", path=path) from None
    return meta, truth.decode("ascii", errors="replace")


def _devkit_wnids(meta: bytes, where: Path) -> dict[int, str]:
    """ILSVRC2012_ID → WordNet id of the 1000 leaf classes in the devkit's ``meta.mat``."""
    try:
        from scipy.io import loadmat
    except ImportError:
        raise ModuleNotFoundError("reading the ImageNet devkit's meta.mat needs scipy: "
                                  "pip install 'fpipe[imagenet]'", name="scipy") from None
    try:
        synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
        return {int(row["ILSVRC2012_ID"]): str(row["WNID"]) for row in np.atleast_1d(synsets)
                if int(row["num_children"]) == 0}
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ArchiveError(f"meta.mat has no ILSVRC2012 synsets table ({error})",
                           path=where) from None


def _devkit_labels(meta: bytes, truth: str, where: Path) -> dict[str, int]:
    wnids = _devkit_wnids(meta, where)
    labels = {}
    for number, text in enumerate(truth.split(), 1):
        wnid = wnids.get(int(text)) if text.isdigit() else None
        if wnid is None:
            raise ArchiveError(f"ground truth line {number}: {text!r} is not a class id of "
                               f"meta.mat", path=where)
        labels[f"ILSVRC2012_val_{number:08d}.JPEG"] = _label(_LABELS, wnid, where)
    return labels


def _kaggle_labels(path: Path) -> dict[str, int]:
    """Labels from Kaggle's ``LOC_val_solution.csv``: image id, then boxes led by a WordNet id."""
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    if not rows or rows[0][:2] != ["ImageId", "PredictionString"]:
        raise ArchiveError("not a LOC_val_solution.csv (header ImageId,PredictionString)", path=path)
    try:
        return {f"{image}.JPEG": _label(_LABELS, boxes.split()[0], path) for image, boxes in rows[1:]}
    except (ValueError, IndexError):
        raise ArchiveError("rows must be: image id, WordNet id and box", path=path) from None


imagenet = ImageNetDataset(
    name="imagenet",
    splits=("train", "val"),
    archives=(_TRAIN, _VAL, _DEVKIT),
    CLASSES=tuple(words for _, words in SYNSETS),
    WNIDS=_WNIDS,
)
