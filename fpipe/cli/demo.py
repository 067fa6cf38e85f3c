"""``fpipe demo``: fpipe's main job, end to end, on images it makes itself (or yours).

1. make a small labelled image dataset: smooth random images in a few colour classes, as JPEG
   files in an ImageFolder tree (skipped with ``--data DIR``);
2. pack it with ``fpipe write`` (shuffled, read by worker threads);
3. read it for a few epochs through a seeded augmentation pipeline with process workers into
   batches, and train a small model on them: a CNN fed by a torch ``DataLoader`` over
   :class:`fpipe.torch.IterableDataset` when torch is installed, or else a numpy softmax
   regression fed by :class:`fpipe.Infinite` (a ``processes`` stage, batches, ``combine_to_arrays``);
4. print throughput, accuracy, the per-stage table of the pipeline and its plan
   (:func:`fpipe.explain`: which stages run in the workers, with how many workers).

Everything goes into a temporary folder that is removed at the end, unless ``--keep DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fpipe.cli import write
from fpipe.cli._common import (
    UsageError,
    add_command,
    int_between,
    load_classes,
    non_negative_int,
    positive_int,
    progress_bar,
    refuse_options,
    say,
)
from fpipe.cli._formats import source_format
from fpipe.dataset import MsgpackReader, unpack_sample
from fpipe.image import normalize, random_resized_crop
from fpipe.infinite import Infinite
from fpipe.orderings import Cycler, Shuffler
from fpipe.stream import explain, map, processes, stats

__all__ = ["Augment", "add_parsers", "make_images"]

_IMAGES, _CLASSES = 512, 4  # what the demo makes unless --images, --classes
_NAMED_IMAGES = 5  # images of --data that do not decode, named before the count

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220),
           "yellow": (230, 210, 40), "magenta": (200, 50, 200), "cyan": (40, 200, 210),
           "orange": (240, 140, 30), "grey": (128, 128, 128)}


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Register ``fpipe demo``."""
    parser = add_command(
        commands, "demo", "see fpipe at work: make images, pack them, train on them",
        "fpipe's main job on data it makes itself: generate a small labelled image dataset "
        "(smooth random JPEG images in a few colour classes), pack it with 'fpipe write', then "
        "read it for a few epochs through a seeded augmentation pipeline with process workers "
        "into batches and train a small model: a CNN through a torch DataLoader when torch is "
        "installed, else a numpy model fed by fpipe's Infinite. Prints throughput, "
        "accuracy, the per-stage table and the plan (fpipe.explain). Takes seconds and leaves "
        "nothing behind, unless --keep DIR.",
        "  fpipe demo\n  fpipe demo --keep demo-files --epochs 5\n"
        "  fpipe demo --data my-photos/ --size 64 --no-torch", _run_demo)
    _add_data_options(parser)
    _add_training_options(parser)
    parser.add_argument("-y", "--overwrite", action="store_true",
                        help="replace a dataset left in --keep DIR by an earlier run")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars or output")


def _add_data_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", metavar="DIR",
                        help="use your own image folder (ImageFolder layout, or anything "
                             "'fpipe write' reads: a packed .msgpack dataset too, whose samples "
                             "have an 'image' and a 'label') instead of generated images")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the images and the packed dataset into DIR and keep them")
    parser.add_argument("--images", type=positive_int,
                        help=f"how many images to generate ({_IMAGES})")
    parser.add_argument("--classes", type=positive_int,
                        help=f"how many classes to generate, at most {len(COLOURS)} ({_CLASSES})")


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=int_between(1, 1024), default=32,
                        help="side of the square images the model sees (32)")
    parser.add_argument("--epochs", type=positive_int, default=3, help="epochs to train (3)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="batch size (32)")
    parser.add_argument("--workers", type=int_between(0, 256), default=2,
                        help="worker processes that read and augment (2)")
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the images, the shuffles and the augmentation (0)")
    parser.add_argument("--no-torch", dest="torch", action="store_false",
                        help="use fpipe's own stages and a numpy model even if torch is installed")


def _run_demo(args: argparse.Namespace) -> int:
    _check_options(args)
    if args.data is not None and not Path(args.data).exists():
        raise FileNotFoundError(f"--data {args.data}: no such file or folder")
    use_torch = args.torch and importlib.util.find_spec("torch") is not None
    started = time.perf_counter()
    with _workspace(args.keep) as folder:
        source = args.data or make_images(folder / "images", args.images or _IMAGES,
                                          args.classes or _CLASSES, args.seed, args)
        dataset = folder / "demo.msgpack"
        pack = _pack if args.data is None or source_format([args.data]) is None else _rewrite
        pack(source, dataset, args)
        classes = _class_count(dataset)
        train = _train_torch if use_torch else _train_numpy
        with _torch_cache_folder() if use_torch else contextlib.nullcontext():
            seen, seconds = train(dataset, classes, args)
    say(args, f"\ndone in {time.perf_counter() - started:.1f} s: {seen} samples in {args.epochs} "
              f"epoch(s) through the pipeline at {seen / max(seconds, 1e-9):,.0f} samples/s "
              "(worker start-up included)"
        + (f"; the files are in {args.keep}" if args.keep else "; nothing was left behind"))
    return 0


def _check_options(args: argparse.Namespace) -> None:
    if args.classes is not None and args.classes > len(COLOURS):
        raise UsageError(f"--classes must be at most {len(COLOURS)}; got {args.classes}")
    if args.data is not None:
        refuse_options({"--images": args.images, "--classes": args.classes},
                       "with --data: they describe the images the demo makes")
    if args.keep is None:
        refuse_options({"-y/--overwrite": args.overwrite},
                       "without --keep: the demo works in a new temporary folder")


@contextlib.contextmanager
def _workspace(keep: str | None) -> Iterator[Path]:
    if keep is not None:
        folder = Path(keep)
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="fpipe-demo-") as name:
        yield Path(name)


@contextlib.contextmanager
def _torch_cache_folder() -> Iterator[None]:
    """torch makes its compiler cache folder (``torchinductor_<user>``) in the temporary folder
    when an optimizer is made, and leaves it there: while the demo trains, that cache is a
    folder of its own, removed at the end (unless ``TORCHINDUCTOR_CACHE_DIR`` says where)."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="fpipe-demo-torch-") as name:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = name
        try:
            yield
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


# --- 1. images --------------------------------------------------------------------------


def make_images(root: Path, count: int, classes: int, seed: int,
                args: argparse.Namespace | None = None) -> str:
    """Write ``count`` smooth random JPEG images in ``classes`` colour classes under ``root``
    (``root/<colour>/<i>.jpg``) and return ``root``. Each image is random 4x4 noise pulled
    towards its class colour and smoothly enlarged to 48x48.

    >>> import tempfile, os
    >>> root = make_images(Path(tempfile.mkdtemp()) / "images", 4, 2, seed=0)
    >>> sorted(os.listdir(root)), sorted(os.listdir(os.path.join(root, "red")))
    (['green', 'red'], ['0000.jpg', '0002.jpg'])
    """
    from PIL import Image

    names = list(COLOURS)[:classes]
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    items = range(count) if args is None else progress_bar(args, range(count), desc="images")
    for i in items:
        name = names[i % classes]
        noise = rng.integers(0, 256, (4, 4, 3)).astype(np.float64)
        tint = np.clip(0.45 * noise + 0.55 * np.array(COLOURS[name]), 0, 255).astype(np.uint8)
        image = Image.fromarray(tint).resize((48, 48), Image.Resampling.BICUBIC)
        image.save(root / name / f"{i:04d}.jpg", quality=90)
    if args is not None:
        say(args, f"1. made {count} smooth random 48x48 JPEG images in {classes} classes "
                  f"({', '.join(names)}) in {root}")
    return str(root)


# --- 2. packing -------------------------------------------------------------------------


def _write_parser() -> argparse.ArgumentParser:
    """A parser of ``fpipe write`` alone, for the command line the demo shows and runs (not
    the whole command's parser: fpipe/cli.py imports this module)."""
    parser = argparse.ArgumentParser(prog="fpipe")
    write.add_parsers(parser.add_subparsers(dest="command"))
    return parser


def _pack(source: str, dataset: Path, args: argparse.Namespace) -> None:
    argv = ["write", source, str(dataset), "--shuffle", "--seed", str(args.seed), "--workers", "2"]
    argv += ["-y"] if args.overwrite else []
    # someone else's images may not decode: leave those out at packing, counted, the first
    # few named, rather than stop there or in a training worker
    argv += ["--skip-bad"] if args.data is not None else []
    say(args, f"2. $ fpipe {' '.join(argv)}")
    if args.data is not None:
        say(args, "   (--skip-bad decodes every image and leaves out those that do not decode; "
                  "without it, 'fpipe write' packs them as they are with a warning, and "
                  "--check stops at the first)")
    written = _write_parser().parse_args(argv + (["-q"] if args.quiet else []))
    written.named_images = _NAMED_IMAGES
    status = written.run(written)
    if status:
        raise UsageError(f"packing {source} failed (exit status {status})")


def _class_count(dataset: Path) -> int:
    """The number of classes: the names stored beside the dataset, else the largest label and
    one (a dataset of yours may come without names)."""
    stored = load_classes(dataset) or {}
    named = len((stored.get("classes") or {}).get("label", []))
    if named:
        return named
    with MsgpackReader(dataset) as reader:
        return 1 + max((int(sample.get("label", 0)) for sample in reader), default=0)


def _rewrite(source: str, dataset: Path, args: argparse.Namespace) -> None:
    """Write ``source``, a dataset in a training format (a packed one too), into ``dataset``,
    shuffled: its samples as they are read (the image options of ``_pack`` are for files)."""
    argv = ["write", source, str(dataset), "--shuffle", "--seed", str(args.seed), "--workers", "2"]
    argv += ["-y"] if args.overwrite else []
    say(args, f"2. $ fpipe {' '.join(argv)}")
    written = _write_parser().parse_args(argv + (["-q"] if args.quiet else []))
    if written.run(written):
        raise UsageError(f"writing {source} failed")


# --- 3. augmentation --------------------------------------------------------------------


class Augment:
    """Decode a sample's image by fpipe's training recipe,
    :func:`fpipe.image.random_resized_crop`: a random crop of half to all of the image's area,
    of aspect 3:4 to 4:3, mirrored half of the time, resized to ``size`` x ``size``. Returns
    ``(image, label)``, the image uint8 CHW; the training step normalises whole batches
    with :func:`fpipe.image.normalize`.

    Draws from :func:`fpipe.current_rng`, so a seeded stage makes it reproducible per
    sample. Takes a sample dict or its packed bytes (decoded in the worker); ``backend`` is
    the recipe's (``"pillow"`` keeps torch out of a run without it).

    >>> import io
    >>> from PIL import Image
    >>> from fpipe.random import using_rng
    >>> buffer = io.BytesIO()
    >>> Image.new("RGB", (20, 10), (255, 0, 0)).save(buffer, "PNG")
    >>> with using_rng(np.random.default_rng(0)):
    ...     image, label = Augment(8)({"image": buffer.getvalue(), "label": 3})
    >>> image.shape, image.dtype, label
    ((3, 8, 8), dtype('uint8'), 3)
    """

    def __init__(self, size: int, field: str = "image", backend: str = "auto") -> None:
        self.size, self.field = size, field
        self.crop = random_resized_crop(size, scale=(0.5, 1.0), layout="CHW", backend=backend)

    def __repr__(self) -> str:
        return f"Augment({self.size})"

    def __call__(self, sample: Any) -> tuple[np.ndarray, int]:
        if not isinstance(sample, dict):
            sample = unpack_sample(sample)
        return self.crop(sample[self.field]), int(sample.get("label", 0))


# --- 4a. torch --------------------------------------------------------------------------


def _train_torch(dataset: Path, classes: int, args: argparse.Namespace) -> tuple[int, float]:
    import torch
    from torch.utils.data import DataLoader

    from fpipe.torch import IterableDataset, Samples, Shards

    stream_set = IterableDataset(MsgpackReader(dataset), transforms=Augment(args.size),
                                 chunk_size=8, layout=Shards(shuffle=True, buffer_samples=0.5),
                                 samples=Samples(seed=args.seed))
    loader = DataLoader(stream_set, batch_size=args.batch_size, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    say(args, f"3. IterableDataset(transforms={Augment(args.size)}, layout=Shards(shuffle=True), "
              f"samples=Samples(seed={args.seed})) "
              f"-> DataLoader(batch_size={args.batch_size}, num_workers={args.workers}) -> "
              f"a small CNN (torch {torch.__version__})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = _cnn(torch, classes)
        optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
        step = _TorchStep(torch, model, optimiser)
        where = (f"in {args.workers} DataLoader worker processes" if args.workers else
                 "in this process (--workers 0)")
        inside = (f"{where}: IterableDataset(layout=Shards(shuffle=True)) -> {Augment(args.size)} "
                  f"-> batches of {args.batch_size} (torch's collate)")
        try:
            return _epochs(_Epochs(stream_set, loader), step, args, len(stream_set),
                           inside=inside)
        finally:
            del loader  # stops the persistent workers now, not at exit


class _Epochs:
    """``epochs(e)``: the DataLoader's batches of epoch ``e``."""

    def __init__(self, dataset: Any, loader: Any) -> None:
        self.dataset, self.loader = dataset, loader

    def __call__(self, epoch: int) -> Any:
        self.dataset.set_epoch(epoch)
        return self.loader


def _cnn(torch: Any, classes: int) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, classes))


class _TorchStep:
    """One training step on a batch ``(images, labels)``: returns loss, hits, count."""

    def __init__(self, torch: Any, model: Any, optimiser: Any) -> None:
        self.torch, self.model, self.optimiser = torch, model, optimiser

    def __call__(self, batch: Any) -> tuple[float, int, int]:
        images, labels = batch
        logits = self.model(normalize(images, layout="CHW"))
        loss = self.torch.nn.functional.cross_entropy(logits, labels)
        self.optimiser.zero_grad()
        loss.backward()
        self.optimiser.step()
        return float(loss.detach()), int((logits.argmax(1) == labels).sum()), len(labels)

    def __repr__(self) -> str:
        return "train_step"


# --- 4b. numpy through fpipe's stages ---------------------------------------------------


def _train_numpy(dataset: Path, classes: int, args: argparse.Namespace) -> tuple[int, float]:
    reader = MsgpackReader(dataset)
    source = Cycler(Shuffler(reader, seed=args.seed))  # a new permutation every pass
    augment_image = Augment(args.size, backend="pillow")  # no torch in this run
    augment = (processes(augment_image, n_workers=args.workers, seed=args.seed)
               if args.workers else map(augment_image, seed=args.seed))
    per_epoch = -(-len(reader) // args.batch_size)
    batch_iter = Infinite(source.iter(raw=True), augment, batch_size=args.batch_size,
                          batches_per_epoch=per_epoch)
    say(args, f"3. Infinite(Cycler(Shuffler(seed={args.seed})), {augment!r}, "
              f"batch_size={args.batch_size}, batches_per_epoch={per_epoch}) -> "
              "a softmax regression (numpy)")
    model = _SoftmaxRegression(classes)
    try:
        with batch_iter:
            return _epochs(lambda epoch: batch_iter(), model.step, args,
                           per_epoch * args.batch_size, batch_iter)
    finally:
        if hasattr(augment, "close"):
            augment.close()
        reader.close()


class _SoftmaxRegression:
    """Multinomial logistic regression on 4x4-pooled colour features, by plain gradient steps."""

    def __init__(self, classes: int, rate: float = 0.5) -> None:
        self.classes, self.rate = classes, rate
        self.weights: np.ndarray | None = None
        self.bias = np.zeros(classes)

    def step(self, batch: tuple[np.ndarray, np.ndarray]) -> tuple[float, int, int]:
        images, labels = batch
        features = _pooled(normalize(images, layout="CHW"))
        if self.weights is None:
            self.weights = np.zeros((features.shape[1], self.classes))
        logits = features @ self.weights + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        rows = np.arange(len(labels))
        loss = float(-np.log(probabilities[rows, labels] + 1e-12).mean())
        hits = int((probabilities.argmax(axis=1) == labels).sum())
        probabilities[rows, labels] -= 1
        gradient = probabilities / len(labels)
        self.weights -= self.rate * features.T @ gradient
        self.bias -= self.rate * gradient.sum(axis=0)
        return loss, hits, len(labels)


def _pooled(images: np.ndarray) -> np.ndarray:
    """The mean of each channel over a 4x4 grid of cells: ``(n, c, h, w)`` -> ``(n, c * 16)``."""
    count, channels, height, width = images.shape
    rows, columns = min(4, height), min(4, width)
    cropped = images[:, :, :height - height % rows, :width - width % columns]
    cells = cropped.reshape(count, channels, rows, -1, columns, cropped.shape[3] // columns)
    return cells.mean(axis=(3, 5)).reshape(count, -1)


# --- the epochs -------------------------------------------------------------------------


def _epochs(make_source: Any, step: Any, args: argparse.Namespace, samples: int,
            pipeline: Any = None, inside: str | None = None) -> tuple[int, float]:
    """Train ``args.epochs`` epochs of ``samples`` samples, each through
    ``pipe(make_source(epoch), map(step))``; print a line per epoch, then the per-stage table
    and the plan: those of ``pipeline``, an Infinite, which runs through all the epochs, or
    else of the last epoch's stream, whose source runs ``inside`` (what the DataLoader's
    workers do); return samples and seconds."""
    seen, seconds, table, plan = 0, 0.0, None, None
    for epoch in range(args.epochs):
        start = time.perf_counter()
        with map(step)(make_source(epoch)) as stream:
            loss, hits, count = _run_epoch(stream, epoch, samples, args)
            table = pipeline.stats() if pipeline is not None else stats(stream)
            plan = pipeline.explain() if pipeline is not None else explain(stream)
        elapsed = time.perf_counter() - start
        seen, seconds = seen + count, seconds + elapsed
        say(args, f"   epoch {epoch + 1}/{args.epochs}: {count} samples in {elapsed:.2f} s "
                  f"({count / max(elapsed, 1e-9):,.0f} samples/s), loss {loss:.3f}, "
                  f"accuracy {hits / max(count, 1):.0%}")
    if table is not None:
        scope = (f"over all {args.epochs} epoch(s), worker start-up included" if pipeline
                 is not None else f"in the last epoch ({args.epochs}/{args.epochs}) alone")
        say(args, f"4. where the time went, per stage, {scope}:\n{table}")
        say(args, f"5. the plan (fpipe.explain: what runs where, with how many workers):\n"
                  f"{_with_source_inside(str(plan), inside)}")
    return seen, seconds


def _with_source_inside(plan: str, inside: str | None) -> str:
    """``plan`` with what runs inside its source (the first line) written under it.

    >>> print(_with_source_inside("source(DataLoader)\\nmap(step)", "in 2 workers: f -> g"))
    source(DataLoader)
        in 2 workers: f -> g
    map(step)
    """
    if inside is None:
        return plan
    first, _, rest = plan.partition("\n")
    return f"{first}\n    {inside}" + (f"\n{rest}" if rest else "")


def _run_epoch(stream: Iterator, epoch: int, samples: int, args: argparse.Namespace) -> tuple:
    """Train on the batches of ``stream``, an epoch of about ``samples`` samples, with a
    progress bar of the samples on a terminal; the mean loss, hits and samples."""
    total_loss = hits = count = 0
    with progress_bar(args, total=samples, desc=f"epoch {epoch + 1}/{args.epochs}",
                      unit=" samples") as bar:
        for loss, batch_hits, batch_count in stream:
            total_loss += loss * batch_count
            hits += batch_hits
            count += batch_count
            bar.update(batch_count)
    return total_loss / max(count, 1), hits, count
