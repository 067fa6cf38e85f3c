"""Small archives in each dataset's official format, and what a writer should make of them.

The CIFAR batches are pickled the way Python 2 and numpy 1 wrote the official ones."""

from __future__ import annotations

import dataclasses
import gzip
import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image

from fpipe.sets import KnownDataset, md5sum


def with_local_md5(dataset: KnownDataset, folder: Path) -> KnownDataset:
    """``dataset`` whose archives' md5 are those of the files made in ``folder``."""
    archives = tuple(dataclasses.replace(a, md5=md5sum(folder / a.filename))
                     if (folder / a.filename).exists() else a for a in dataset.archives)
    return dataclasses.replace(dataset, archives=archives)


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def _py2_str(data: bytes) -> bytes:
    # Python 2 pickled its str (bytes) as BINSTRING; Python 3 cannot write that opcode itself.
    return b"T" + len(data).to_bytes(4, "little") + data


def _py2_value(value) -> bytes:
    if isinstance(value, bytes):
        return _py2_str(value)
    if isinstance(value, list):
        return b"](" + b"".join(_py2_value(item) for item in value) + b"e"
    if isinstance(value, int):
        return b"J" + value.to_bytes(4, "little", signed=True)
    # numpy 1.x under Python 2: _reconstruct(ndarray, (0,), 'b'), then the state
    # (1, shape, dtype('u1', 0, 1) with its own state, fortran=False, raw bytes).
    assert value.dtype == np.uint8 and value.ndim == 2
    dtype = (b"cnumpy\ndtype\n" + _py2_str(b"u1") + b"K\x00K\x01\x87R(K\x03" + _py2_str(b"|")
             + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    shape = b"".join(b"J" + n.to_bytes(4, "little") for n in value.shape) + b"\x86"
    return (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + _py2_str(b"b")
            + b"\x87R(K\x01" + shape + dtype + b"\x89" + _py2_str(value.tobytes()) + b"tb")


def py2_pickle(batch: dict) -> bytes:
    """``batch`` pickled as Python 2 (protocol 2) wrote the official CIFAR batches."""
    items = b"".join(_py2_value(key) + _py2_value(value) for key, value in batch.items())
    return b"\x80\x02}(" + items + b"u."


def _cifar_batch(rng: np.random.Generator, n: int, first: int, fields: dict) -> dict:
    batch = {b"batch_label": b"testing batch", b"data": rng.integers(0, 256, (n, 3072), np.uint8),
             b"filenames": [f"thing_s_{first + i:06d}.png".encode() for i in range(n)]}
    batch.update({field: [int(v) for v in values] for field, values in fields.items()})
    return batch


def make_cifar10(folder: Path, per_batch: int = 2, test: int = 3, seed: int = 0) -> dict:
    """``cifar-10-python.tar.gz`` in ``folder``; returns ``{split: [(key, HxWx3, label)]}``."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    sizes = [per_batch] * 5 + [test]
    expected: dict[str, list] = {"train": [], "test": []}
    path = folder / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        _add(archive, "cifar-10-batches-py/batches.meta", py2_pickle({b"label_names": [b"x"]}))
        for number, (name, n) in enumerate(zip(names, sizes)):
            batch = _cifar_batch(rng, n, 100 * number, {b"labels": rng.integers(0, 10, n)})
            _add(archive, f"cifar-10-batches-py/{name}", py2_pickle(batch))
            split = "test" if name == "test_batch" else "train"
            expected[split] += _expected_rows(batch, b"labels")
    return expected


def _expected_rows(batch: dict, label: bytes, coarse: bytes | None = None) -> list:
    rows = []
    for i, row in enumerate(batch[b"data"]):
        pixels = row.reshape(3, 32, 32).transpose(1, 2, 0)
        labels = (batch[label][i],) + ((batch[coarse][i],) if coarse else ())
        rows.append((batch[b"filenames"][i].decode(), pixels, *labels))
    return rows


def make_cifar100(folder: Path, train: int = 4, test: int = 2, seed: int = 1) -> dict:
    """``cifar-100-python.tar.gz``; the train batch repeats its first file name (as the real one
    does). Returns ``{split: [(key, HxWx3, fine, coarse)]}`` with the repeat as ``…-2.png``."""
    rng = np.random.default_rng(seed)
    expected = {}
    path = folder / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        _add(archive, "cifar-100-python/meta", py2_pickle({b"fine_label_names": [b"x"]}))
        for split, n in (("train", train), ("test", test)):
            fields = {b"fine_labels": rng.integers(0, 100, n), b"coarse_labels": rng.integers(0, 20, n)}
            batch = _cifar_batch(rng, n, 0 if split == "train" else 500, fields)
            if split == "train":
                batch[b"filenames"][1] = batch[b"filenames"][0]
            _add(archive, f"cifar-100-python/{split}", py2_pickle(batch))
            expected[split] = _expected_rows(batch, b"fine_labels", b"coarse_labels")
    first = expected["train"][1]
    expected["train"][1] = (first[0].replace(".png", "-2.png"), *first[1:])
    return expected


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8) in the IDX format."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def make_mnist(folder: Path, train: int = 5, test: int = 3, seed: int = 2) -> dict:
    """The four gzipped IDX files; returns ``{split: (images n×28×28, labels n)}``."""
    rng = np.random.default_rng(seed)
    expected = {}
    for split, prefix, n in (("train", "train", train), ("test", "t10k", test)):
        images, labels = rng.integers(0, 256, (n, 28, 28), np.uint8), rng.integers(0, 10, n, np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            with gzip.open(folder / f"{prefix}-{kind}-ubyte.gz", "wb") as file:
                file.write(idx_bytes(array))
        expected[split] = (images, labels)
    return expected


# ---------------------------------------------------------------------------------- ImageNet

WNIDS = ("n01440764", "n01443537", "n01484850")  # labels 0, 1, 2 among the 1000
# The devkit numbers classes in its own order: ILSVRC2012_ID 1, 2, 3 are these WordNet ids.
DEVKIT_IDS = {1: "n01484850", 2: "n01440764", 3: "n01443537"}


def jpeg(seed: int, mode: str = "RGB", size: tuple[int, int] = (20, 12)) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), np.uint8).squeeze()
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, "JPEG", quality=80)
    return buffer.getvalue()


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), seed, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def imagenet_images() -> dict:
    """``{"train": {wnid: {file: bytes}}, "val": {file: (wnid, bytes)}}``: RGB, grey, one CMYK
    JPEG and one PNG named .JPEG, as in the real archives."""
    train = {wnid: {} for wnid in WNIDS}
    for number, (wnid, mode) in enumerate([(w, m) for w in WNIDS for m in ("RGB", "L")]):
        train[wnid][f"{wnid}_{100 - number}.JPEG"] = jpeg(number, mode)
    train[WNIDS[1]][f"{WNIDS[1]}_7.JPEG"] = jpeg(50, "CMYK")
    train[WNIDS[2]][f"{WNIDS[2]}_8.JPEG"] = png(9)
    val_wnids = (WNIDS[2], WNIDS[0], WNIDS[1], WNIDS[0])
    val = {f"ILSVRC2012_val_{i:08d}.JPEG": (wnid, jpeg(60 + i))
           for i, wnid in enumerate(val_wnids, 1)}
    return {"train": train, "val": val}


def _tar_bytes(files: dict[str, bytes], prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            _add(archive, prefix + name, data)
    return buffer.getvalue()


def _meta_mat() -> bytes:
    from scipy.io import savemat

    rows = [(id_, wnid, "words", "gloss", 0) for id_, wnid in DEVKIT_IDS.items()]
    rows.append((1001, "n00001740", "entity", "gloss", 3))  # an inner node: not a class
    dtype = [("ILSVRC2012_ID", "O"), ("WNID", "O"), ("words", "O"), ("gloss", "O"),
             ("num_children", "O")]
    buffer = io.BytesIO()
    savemat(buffer, {"synsets": np.array(rows, dtype=dtype).reshape(-1, 1)})
    return buffer.getvalue()


def _ground_truth(images: dict) -> str:
    ids = {wnid: id_ for id_, wnid in DEVKIT_IDS.items()}
    return "".join(f"{ids[wnid]}\n" for wnid, _ in images["val"].values())


def make_imagenet_tars(folder: Path) -> dict:
    """The train and val tars and the devkit tar.gz; returns :func:`imagenet_images`."""
    images = imagenet_images()
    inner = {f"{wnid}.tar": _tar_bytes(files) for wnid, files in images["train"].items()}
    (folder / "ILSVRC2012_img_train.tar").write_bytes(_tar_bytes(dict(reversed(inner.items()))))
    val = {name: data for name, (_, data) in reversed(images["val"].items())}
    (folder / "ILSVRC2012_img_val.tar").write_bytes(_tar_bytes(val))
    devkit = {"meta.mat": _meta_mat(),
              "ILSVRC2012_validation_ground_truth.txt": _ground_truth(images).encode()}
    with tarfile.open(folder / "ILSVRC2012_devkit_t12.tar.gz", "w:gz") as archive:
        for name, data in devkit.items():
            _add(archive, f"ILSVRC2012_devkit_t12/data/{name}", data)
    return images


def make_imagenet_folders(folder: Path, val_labels: str = "devkit") -> dict:
    """Extracted ``train/<wnid>/`` and ``val/`` (flat, with ``val_labels`` "devkit" folder or
    "kaggle" csv; or "sorted" into ``val/<wnid>/``); returns :func:`imagenet_images`."""
    images = imagenet_images()
    for wnid, files in images["train"].items():
        (folder / "train" / wnid).mkdir(parents=True)
        for name, data in files.items():
            (folder / "train" / wnid / name).write_bytes(data)
    for name, (wnid, data) in images["val"].items():
        target = folder / "val" / (wnid if val_labels == "sorted" else "") / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if val_labels == "devkit":
        data = folder / "ILSVRC2012_devkit_t12" / "data"
        data.mkdir(parents=True)
        (data / "meta.mat").write_bytes(_meta_mat())
        (data / "ILSVRC2012_validation_ground_truth.txt").write_text(_ground_truth(images))
    elif val_labels == "kaggle":
        rows = [f"{name[:-5]},{wnid} 1 2 3 4" for name, (wnid, _) in images["val"].items()]
        (folder / "LOC_val_solution.csv").write_text("\n".join(["ImageId,PredictionString", *rows]))
    return images
