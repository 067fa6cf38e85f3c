"""Workloads of the fused image recipes (I1u, I1f, I2, I3, I4u, I4f, I5u, I5f) on real
photographs (``photos`` and ``photos6mp`` of :mod:`benchmarks.data`).

The reference is the Pillow pipeline doing the same recipe: decode (fpipe's
``CompressedToPIL``: simplejpeg for JPEG), torchvision's RandomResizedCrop box draw from the
same item generator, ``Image.resize`` bilinear with antialias, the flip, and for float output
torchvision's ``ToTensor`` and ``Normalize`` computed per image. fpipe's side is
``fpipe.image.random_resized_crop`` (or ``resized_center_crop``), stacked, then
``fpipe.image.normalize`` on the whole batch. Serial workloads run with one torch thread on
both sides (one core); I4 and I5 run two worker processes.

I5 compares with a DataLoader running torchvision's tensor path (``decode_jpeg`` and
``transforms.v2``) and with FFCV's loader (see :mod:`benchmarks.peer_loaders`). They need a
torchvision that matches torch, so they run in another Python environment, named by
``$FPIPE_PEERS_PYTHON`` (see docs/benchmarks.md), and are skipped with a note when it is not
set or lacks them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np

from .data import cache_folder, photos6mp_path, photos_path
from .harness import Pair, Unavailable, workload

BATCH = 32
CROP = 224
SERIAL_IMAGES = 512  # per timed run of I1 and I3
WORKER_IMAGES = 1024  # per epoch of I4 and I5
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _encoded(path: str, count: int | None = None) -> list[bytes]:
    import fpipe

    with fpipe.dataset.MsgpackReader(path) as reader:
        count = len(reader) if count is None else count
        return [reader[i]["image"] for i in range(count)]


class PillowRecipe:
    """The reference: encoded bytes -> a Pillow image, by the training recipe (``train``) or
    the evaluation one, drawing from :func:`fpipe.current_rng` as fpipe's recipe does."""

    def __init__(self, train: bool = True, size: int = CROP, resize: int = 256) -> None:
        self.train, self.size, self.resize = train, size, resize

    def __call__(self, data: bytes):
        from PIL import Image

        import fpipe
        from fpipe.image import decode_image
        from fpipe.image.boxes import center_box, random_resized_box, resized_size

        image = decode_image(data)
        if not self.train:
            image = image.resize(resized_size(image.width, image.height, self.resize),
                                 Image.Resampling.BILINEAR)
            left, top, width, height = center_box(image.width, image.height, (self.size, self.size))
            return image.crop((left, top, left + width, top + height))
        rng = fpipe.current_rng()
        box = random_resized_box(rng, image.width, image.height, (0.08, 1.0), (3 / 4, 4 / 3))
        image = image.resize((self.size, self.size), Image.Resampling.BILINEAR,
                             box=(box.left, box.top, box.left + box.width, box.top + box.height))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image


def uint8_hwc(image) -> np.ndarray:
    return np.array(image)  # writable, as a consumer may normalise in place


def to_normalized_tensor(image):
    """torchvision's ToTensor then Normalize(MEAN, STD), as they compute it, on one image."""
    import torch

    tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous().float().div(255)
    mean = torch.as_tensor(MEAN).view(-1, 1, 1)
    std = torch.as_tensor(STD).view(-1, 1, 1)
    return tensor.sub_(mean).div_(std)


def _stack(images: list):
    import torch

    return torch.stack(images) if isinstance(images[0], torch.Tensor) else np.stack(images)


class SerialBatches:
    """Batches of ``BATCH`` made one image after another in this process, each image under
    its item generator ``(0, 0, i)``: ``transform`` per image, ``last`` per image (the
    reference) or ``finish`` per batch (fpipe)."""

    def __init__(self, encoded: list[bytes], transform, last=None, finish=None) -> None:
        self.encoded, self.transform, self.last, self.finish = encoded, transform, last, finish

    def __call__(self) -> int:
        import fpipe

        count = 0
        for start in range(0, len(self.encoded), BATCH):
            images = []
            for i in range(start, min(start + BATCH, len(self.encoded))):
                with fpipe.using_rng(fpipe.item_rng(0, 0, i)):
                    image = self.transform(self.encoded[i])
                images.append(self.last(image) if self.last else image)
            batch = _stack(images)
            count += len(self.finish(batch) if self.finish else batch)
        return count


def _one_thread_pair(ours, reference, items: int) -> Pair:
    """A serial pair, run with one torch thread (one core), the setting restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return Pair(fpipe=ours, reference=reference, items=items,
                teardown=lambda: torch.set_num_threads(threads))


def _serial_training(encoded: list[bytes], floats: bool) -> Pair:
    from fpipe.image import normalize, random_resized_crop

    finish = (lambda batch: normalize(batch, MEAN, STD)) if floats else None
    ours = SerialBatches(encoded, random_resized_crop(CROP), finish=finish)
    reference = SerialBatches(encoded, PillowRecipe(), to_normalized_tensor if floats else uint8_hwc)
    return _one_thread_pair(ours, reference, len(encoded))


@workload("I1u", description="serial, one core: photos (500 px) -> random resized crop 224 + "
          "flip -> uint8 HWC, batches of 32", reference="the Pillow pipeline", target=">= 1.6")
def serial_uint8() -> Pair:
    return _serial_training(_encoded(photos_path(), SERIAL_IMAGES), floats=False)


@workload("I1f", description="I1u ending in normalised float32 CHW (fpipe: normalize per batch)",
          reference="the Pillow pipeline, ToTensor + Normalize per image", target=">= 2.0")
def serial_float() -> Pair:
    return _serial_training(_encoded(photos_path(), SERIAL_IMAGES), floats=True)


@workload("I2", description="serial, one core: 6 MP photos -> random resized crop 224 + flip "
          "-> uint8 HWC", reference="the Pillow pipeline", target=">= 2.0")
def serial_six_megapixels() -> Pair:
    return _serial_training(_encoded(photos6mp_path()), floats=False)


@workload("I3", description="serial, one core: photos -> shorter side 256, centre crop 224 -> "
          "uint8 HWC", reference="the Pillow pipeline", target=">= 1.5")
def serial_evaluation() -> Pair:
    from fpipe.image import resized_center_crop

    encoded = _encoded(photos_path(), SERIAL_IMAGES)
    ours = SerialBatches(encoded, resized_center_crop(CROP, 256))
    reference = SerialBatches(encoded, PillowRecipe(train=False), uint8_hwc)
    return _one_thread_pair(ours, reference, len(encoded))


class RecipeBatch:
    """A batch of sample ids -> (images, labels), made in a worker: fpipe's recipe for each
    image, stacked into the batch (in shared memory, by ``combine_to_arrays``), normalised
    as a whole when ``floats`` (with ``mean`` and ``std``)."""

    def __init__(self, path: str, layout: str, floats: bool, mean=MEAN, std=STD) -> None:
        import fpipe
        from fpipe.image import random_resized_crop

        self.reader = fpipe.dataset.MsgpackReader(path)
        self.crop, self.layout, self.floats = random_resized_crop(CROP, layout=layout), layout, floats
        self.mean, self.std = mean, std

    def __call__(self, indices: list) -> tuple:
        import fpipe
        from fpipe.image import normalize

        samples = [self.reader[int(i)] for i in indices]
        images, labels = fpipe.combine_to_arrays([(self.crop(s["image"]), s["label"]) for s in samples])
        if self.floats:
            images = normalize(images, self.mean, self.std, layout=self.layout)
        return images, labels


def _fpipe_epochs(layout: str, floats: bool, order: list):
    from toolz import pipe

    import fpipe as fp

    stage = fp.processes(RecipeBatch(photos_path(), layout, floats), n_workers=2, seed=0)

    def epoch() -> int:
        return sum(len(labels) for _, labels in pipe(order, fp.batch(BATCH), stage))
    return epoch, stage.close


class PillowSample:
    """The reference's map-style dataset: sample ``i`` -> (Pillow recipe, then ``last``, label)."""

    def __init__(self, path: str, last) -> None:
        import fpipe

        self.reader, self.last, self.recipe = fpipe.dataset.MsgpackReader(path), last, PillowRecipe()

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> tuple:
        sample = self.reader[index]
        return self.last(self.recipe(sample["image"])), sample["label"]


def _against_data_loader(floats: bool) -> Pair:
    from torch.utils.data import DataLoader

    order = np.random.default_rng(0).permutation(WORKER_IMAGES).tolist()
    ours, close = _fpipe_epochs("HWC", floats, order)
    dataset = PillowSample(photos_path(), to_normalized_tensor if floats else uint8_hwc)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=order, num_workers=2,
                        persistent_workers=True)
    return Pair(fpipe=ours, reference=lambda: sum(len(labels) for _, labels in loader),
                items=len(order), teardown=close)


@workload("I4u", description="2 workers, batches of 32: photos -> random resized crop 224 + flip "
          "-> uint8 HWC; fpipe: batch(32), processes(2) making each batch with the recipe",
          reference="torch DataLoader (2 persistent workers) running the Pillow pipeline",
          target=">= 1.6")
def workers_uint8() -> Pair:
    return _against_data_loader(floats=False)


@workload("I4f", description="I4u ending in normalised float32 CHW (fpipe: normalize per batch, "
          "in the worker)", reference="torch DataLoader running the Pillow pipeline, ToTensor + "
          "Normalize per image", target=">= 2.0")
def workers_float() -> Pair:
    return _against_data_loader(floats=True)


# --- I5: torchvision's tensor path and FFCV, in the peers' environment ----------------------


_PEERS = Path(__file__).with_name("peer_loaders.py")


def peers_python(system: str) -> str:
    """The peers' interpreter (``$FPIPE_PEERS_PYTHON``), or :class:`Unavailable` saying how
    to make one."""
    python = os.environ.get("FPIPE_PEERS_PYTHON")
    if not python:
        raise Unavailable(f"{system} runs in an environment of its own (a torchvision that "
                          "matches its torch); set FPIPE_PEERS_PYTHON to its python (see "
                          "docs/benchmarks.md)")
    if not os.access(python, os.X_OK):
        raise Unavailable(f"FPIPE_PEERS_PYTHON={python} is not an executable file")
    module = "ffcv" if system == "ffcv" else "torchvision"
    if subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode:
        raise Unavailable(f"{module} is not installed in FPIPE_PEERS_PYTHON={python}")
    return python


def flat_photos() -> tuple[Path, Path]:
    """The JPEGs of ``photos`` as one flat file of bytes and an array of offsets (``.npy``),
    for a peer that has neither fpipe nor msgpack."""
    folder = cache_folder() / "photos-flat"
    data, offsets = folder / "jpegs.npy", folder / "offsets.npy"
    if not offsets.exists():
        encoded = _encoded(photos_path())
        folder.mkdir(parents=True, exist_ok=True)
        bounds = np.cumsum([0] + [len(e) for e in encoded])
        np.save(data, np.frombuffer(b"".join(encoded), np.uint8))
        np.save(str(offsets) + ".part.npy", bounds)
        os.replace(str(offsets) + ".part.npy", offsets)  # written last: the pair is complete
    return data, offsets


class PeerProcess:
    """A peer's loader in the peers' interpreter, kept running: each call reads one epoch
    there and returns the number of images it gave."""

    def __init__(self, python: str, system: str, kind: str, order: list) -> None:
        data, offsets = flat_photos()
        order_file = data.with_name(f"order-{len(order)}.npy")
        np.save(order_file, np.asarray(order))
        self.process = subprocess.Popen(
            [python, str(_PEERS), system, kind, str(data), str(offsets), str(order_file)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._answer()  # "ready": the loader is built (and FFCV's file written)

    def _answer(self) -> str:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer process ended (exit status {self.process.wait()})")
        return line

    def __call__(self) -> int:
        self.process.stdin.write("epoch\n")
        self.process.stdin.flush()
        return int(self._answer())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=120)


def _against_peer(system: str, floats: bool) -> Pair:
    python = peers_python(system)
    order = np.random.default_rng(0).permutation(WORKER_IMAGES).tolist()
    # torchvision's tensors are CHW; FFCV's ToTensor gives HWC: fpipe makes the same
    layout = "HWC" if system == "ffcv" else "CHW"
    peer = PeerProcess(python, system, "float" if floats else "uint8", order)
    ours, close = _fpipe_epochs(layout, floats, order)

    def teardown() -> None:
        close()
        peer.close()
    return Pair(fpipe=ours, reference=peer, items=len(order), teardown=teardown)


_TORCHVISION = ("torch DataLoader (2 persistent workers) running torchvision's decode_jpeg + "
                "v2.RandomResizedCrop(antialias=True) + v2.RandomHorizontalFlip, in "
                "$FPIPE_PEERS_PYTHON")
_FFCV = ("FFCV Loader (2 threads, os_cache) with RandomResizedCropRGBImageDecoder + "
         "RandomHorizontalFlip + ToTensor, in $FPIPE_PEERS_PYTHON")


@workload("I5u", description="I4u with uint8 CHW output", reference=_TORCHVISION, target=">= 1.15")
def torchvision_uint8() -> Pair:
    return _against_peer("torchvision", floats=False)


@workload("I5f", description="I4f", reference=_TORCHVISION + ", then v2.ToDtype(float32, "
          "scale=True) + v2.Normalize per image", target=">= 1.15")
def torchvision_float() -> Pair:
    return _against_peer("torchvision", floats=True)


@workload("I5u-ffcv", description="I4u (uint8 HWC)", reference=_FFCV, target=">= 1.15")
def ffcv_uint8() -> Pair:
    return _against_peer("ffcv", floats=False)


@workload("I5f-ffcv", description="I4f", reference=_FFCV.replace(
          "ToTensor", "NormalizeImage (its CPU form, on the numpy batch) + ToTensor + ToTorchImage"),
          target=">= 1.15")
def ffcv_float() -> Pair:
    return _against_peer("ffcv", floats=True)
