"""T5f and T5u: the image workload run by fpipe and by the loaders users would pick instead, in
one run, alternating, with the two-core limit measured in the same run.

``python -m benchmarks.peers [T5f] [T5u] [--images N] [--repetitions N] [--json FILE]`` measures;
``python -m benchmarks.peers --report RUN.json... [--data FILE] [-o FIG.png] [--page PAGE.md]``
gathers runs into one file, draws the chart and puts the table in the page.

Every system decodes the packed JPEGs of ``images``, draws a random resized crop of 224 and a
flip, and ends in float32 CHW in [0, 1] (T5f) or uint8 HWC (T5u); the consumer gets batches of
32 as arrays or tensors. Each system runs at its documented defaults with 2 worker processes:

* ``serial``: one process does the work and stacks the batches; the two-core limit is twice its
  rate;
* ``two processes``: two processes do the serial work at once, on alternate images, and nothing
  crosses between them: what two cores give when both work at once with no loader at all
  (they share the memory, the last-level cache and the host);
* ``DataLoader``: torch's, map-style dataset, ``batch_size=32``, 2 persistent workers (the
  default collate, which hands the batch over in shared memory);
* ``fpipe item``: ``processes(augment, n_workers=2)`` then ``batch(32)`` and
  ``combine_to_arrays``;
* ``fpipe batch``: ``batch(32)`` then ``processes(augment_batch, n_workers=2)``, where
  ``augment_batch`` stacks with ``combine_to_arrays`` (the workers hand over whole batches,
  stacked straight into the shared memory they cross in);
* ``fpipe recipe``: ``fpipe batch`` with fpipe's fused recipe in place of the Pillow work:
  ``fpipe.image.random_resized_crop(224)`` for each image (the same box draw and flip; the
  decode, crop and resize fused, torch's resize kernel), and for T5f
  ``fpipe.image.normalize(mean=0, std=1)`` of each whole batch;
* ``Grain``: ``MapDataset.source(ids).map(augment).batch(32).to_iter_dataset()
  .mp_prefetch(MultiprocessingOptions(num_workers=2))``;
* ``torchdata.nodes``: ``ParallelMapper(ids, augment, num_workers=2, method="process")``, then
  ``Batcher(32)`` and a stack, through a ``Loader``.

A system that is not installed is left out. Figures: images per second, median of the timed
epochs; ratios are of medians measured in this run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from .bench_torch import CROP, IMAGE_BATCH, _random_resized_crop
from .data import images_path


def _float_chw(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float32).transpose(2, 0, 1) * np.float32(1 / 255)


def _uint8_hwc(image) -> np.ndarray:
    return np.array(image)  # writable, as the consumer may normalise in place


OUTPUTS = {"T5f": _float_chw, "T5u": _uint8_hwc}


class Augment:
    """One sample id -> (augmented image, label). Picklable: the reader pickles by path."""

    def __init__(self, last: Callable) -> None:
        import fpipe

        self.reader, self.last = fpipe.dataset.MsgpackReader(images_path()), last

    def __call__(self, index: int) -> tuple:
        from PIL import ImageOps

        import fpipe
        from fpipe.image import CompressedToPIL

        sample = self.reader[int(index)]
        image = _random_resized_crop(CompressedToPIL()(sample["image"]), CROP)
        if fpipe.current_rng().random() < 0.5:
            image = ImageOps.mirror(image)
        return self.last(image), sample["label"]


class AugmentBatch:
    """A list of sample ids -> (stacked images, labels), stacked by ``combine`` (default
    ``np.stack``; fpipe's systems use its ``combine_to_arrays``)."""

    def __init__(self, augment: Augment, combine: Callable[[list], tuple] | None = None) -> None:
        self.augment, self.combine = augment, combine or stack

    def __call__(self, indices: list) -> tuple:
        return self.combine(list(map(self.augment, indices)))


def stack(samples: list) -> tuple:
    images, labels = zip(*samples)
    return np.stack(images), np.asarray(labels)


def _count(batches) -> int:
    return sum(len(labels) for _, labels in batches)


def _serial(augment: Augment, order: list) -> Callable[[], int]:
    batch = AugmentBatch(augment)
    return lambda: _count(batch(order[i:i + IMAGE_BATCH]) for i in range(0, len(order), IMAGE_BATCH))


def _two_processes(augment: Augment, order: list) -> Callable[[], int]:
    """Each epoch, two persistent processes (started by the first) do the serial work on
    alternate images, at the same time."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    connections = []

    def epoch() -> int:
        if not connections:
            for half in (order[0::2], order[1::2]):
                ours, theirs = context.Pipe()
                context.Process(target=_serve_half, args=(augment, half, theirs), daemon=True).start()
                connections.append(ours)
        for connection in connections:
            connection.send(True)
        return sum(connection.recv() for connection in connections)
    return epoch


def _serve_half(augment: Augment, half: list, connection) -> None:
    epoch = _serial(augment, half)
    try:
        while connection.recv():
            connection.send(epoch())
    except EOFError:  # the benchmark is over
        pass


def _data_loader(augment: Augment, order: list) -> Callable[[], int]:
    from torch.utils.data import DataLoader

    class Images:  # map-style, as the DataLoader's documentation writes it
        def __len__(self) -> int:
            return len(augment.reader)

        def __getitem__(self, index: int) -> tuple:
            return augment(index)

    loader = DataLoader(Images(), batch_size=IMAGE_BATCH, sampler=order, num_workers=2,
                        persistent_workers=True)
    return lambda: _count(loader)


def _fpipe_items(augment: Augment, order: list) -> Callable[[], int]:
    from toolz import pipe

    import fpipe as fp

    stage = fp.processes(augment, n_workers=2, seed=0)
    return lambda: _count(pipe(order, stage, fp.batch(IMAGE_BATCH), fp.stream.map(fp.combine_to_arrays)))


def _fpipe_batches(augment: Augment, order: list) -> Callable[[], int]:
    from toolz import pipe

    import fpipe as fp

    stage = fp.processes(AugmentBatch(augment, fp.combine_to_arrays), n_workers=2, seed=0)
    return lambda: _count(pipe(order, fp.batch(IMAGE_BATCH), stage))


def _fpipe_recipe(augment: Augment, order: list) -> Callable[[], int]:
    from toolz import pipe

    import fpipe as fp

    from .bench_images import RecipeBatch

    batch = RecipeBatch(images_path(), "HWC" if augment.last is _uint8_hwc else "CHW",
                        floats=augment.last is _float_chw, mean=0.0, std=1.0)
    stage = fp.processes(batch, n_workers=2, seed=0)
    return lambda: _count(pipe(order, fp.batch(IMAGE_BATCH), stage))


def _grain(augment: Augment, order: list) -> Callable[[], int]:
    import grain

    def epoch() -> int:
        dataset = (grain.MapDataset.source(order).map(augment).batch(IMAGE_BATCH)
                   .to_iter_dataset()
                   .mp_prefetch(grain.multiprocessing.MultiprocessingOptions(num_workers=2)))
        return _count(dataset)
    return epoch


def _torchdata_nodes(augment: Augment, order: list) -> Callable[[], int]:
    import torchdata.nodes as nodes

    def epoch() -> int:
        mapped = nodes.ParallelMapper(nodes.IterableWrapper(order), augment, num_workers=2,
                                      method="process")
        return _count(nodes.Loader(nodes.Mapper(nodes.Batcher(mapped, IMAGE_BATCH, drop_last=False), stack)))
    return epoch


SYSTEMS = {"serial": (_serial, None), "two processes": (_two_processes, None),
           "DataLoader": (_data_loader, "torch"), "fpipe item": (_fpipe_items, None),
           "fpipe batch": (_fpipe_batches, None), "fpipe recipe": (_fpipe_recipe, None),
           "Grain": (_grain, "grain"), "torchdata.nodes": (_torchdata_nodes, "torchdata")}


def _installed(module: str | None) -> bool:
    import importlib.util

    return module is None or importlib.util.find_spec(module) is not None


def measure(kind: str, images: int, repetitions: int) -> dict:
    """Images per second of every installed system on ``kind``, alternating epochs."""
    augment = Augment(OUTPUTS[kind])
    order = np.random.default_rng(0).permutation(len(augment.reader))[:images].tolist()
    runs = {name: make(augment, order) for name, (make, module) in SYSTEMS.items()
            if _installed(module)}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for repetition in range(repetitions + 1):  # the first is a warm-up
        for name, epoch in runs.items():
            began = time.perf_counter()
            count = epoch()
            gc.collect()  # a peer's finished iterators go now, not inside another's forked worker
            if count != len(order):
                raise AssertionError(f"{name} gave {count} images, not {len(order)}")
            if repetition:
                seconds[name].append(time.perf_counter() - began)
    rates = {name: len(order) / statistics.median(times) for name, times in seconds.items()}
    return {"kind": kind, "images": len(order), "images_per_second": rates,
            "limit": 2 * rates["serial"], "seconds": seconds}


def table(result: dict) -> str:
    rates, limit = result["images_per_second"], result["limit"]
    loader = rates.get("DataLoader")
    lines = [f"{result['kind']}: {result['images']} images, two-core limit {limit:.0f} img/s"]
    for name, rate in rates.items():
        versus = f"{rate / loader:5.2f}x DataLoader" if loader else ""
        lines.append(f"  {name:<16} {rate:7.0f} img/s  {rate / limit:5.0%} of the limit  {versus}")
    return "\n".join(lines)


def markdown_table(runs: list[dict]) -> str:
    """Each run's images per second, ratio to the DataLoader and share of the two-core limit,
    one row per workload and system, one column per run."""
    header = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    rows = [f"| workload | system | {header} |", "| --- | --- |" + " ---: |" * len(runs)]
    for k, first in enumerate(runs[0]["results"]):
        for name in first["images_per_second"]:
            cells = []
            for run in runs:
                result = run["results"][k]
                rate = result["images_per_second"][name]
                versus = rate / result["images_per_second"]["DataLoader"]
                cells.append(f"{rate:.0f} img/s, {versus:.2f}×, {rate / result['limit']:.0%}")
            rows.append(f"| {first['kind']} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(runs: list[dict], output: str) -> None:
    """Each system's share of the two-core limit, per workload: the median over the runs as a
    bar, every run as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [result["kind"] for result in runs[0]["results"]]
    names = [name for name in runs[0]["results"][0]["images_per_second"] if name != "serial"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.2), sharey=True)
    for ax, (k, kind) in zip(np.atleast_1d(axes), enumerate(kinds)):
        shares = [[run["results"][k]["images_per_second"][name] / run["results"][k]["limit"]
                   for run in runs] for name in names]
        colours = [_COLOURS.get(name, "#868e96") for name in names]
        ax.bar(names, [statistics.median(s) for s in shares], color=colours)
        for x, share in enumerate(shares):
            ax.scatter([x] * len(share), share, color="black", s=8, zorder=3)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(f"{kind}: {OUTPUT_NAMES[kind]}", fontsize=9)
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
    np.atleast_1d(axes)[0].set_ylabel("share of the two-core limit\n(2 × one process, same run)")
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


_COLOURS = {"fpipe item": "#1c7ed6", "fpipe batch": "#1c7ed6", "fpipe recipe": "#1864ab",
            "two processes": "#ced4da"}
OUTPUT_NAMES = {"T5f": "float32 CHW", "T5u": "uint8 HWC"}
_BEGIN, _END = "<!-- peers:", "<!-- /peers -->"


def with_table(page: str, table: str) -> str:
    """``page`` with ``table`` between its peers markers, replacing what was there."""
    begin, end = page.find(_BEGIN), page.find(_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the page has no {_BEGIN} ... {_END} markers")
    head = page.index("\n", begin) + 1
    return page[:head] + table + "\n" + page[end:]


def report(args: argparse.Namespace) -> None:
    runs = [json.loads(open(path).read()) for path in args.report]
    if args.data:
        with open(args.data, "w") as file:
            json.dump({"runs": runs}, file, indent=1)
    if args.output:
        plot(runs, args.output)
    if args.page:
        with open(args.page) as file:
            page = file.read()
        with open(args.page, "w") as file:
            file.write(with_table(page, markdown_table(runs)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("kinds", nargs="*", default=list(OUTPUTS), help="T5f, T5u (default both)")
    parser.add_argument("--images", type=int, default=1000, help="images per epoch (default 1000)")
    parser.add_argument("--repetitions", type=int, default=5, help="timed epochs (default 5)")
    parser.add_argument("--json", default="benchmarks/results/peers.json", help="where to write JSON")
    parser.add_argument("--report", nargs="+", help="runs' JSON files to report instead")
    parser.add_argument("--data", help="with --report: write the runs into this one file")
    parser.add_argument("-o", "--output", help="with --report: the chart (PNG)")
    parser.add_argument("--page", help="with --report: the page whose peers markers get the table")
    args = parser.parse_args(argv)
    if args.report:
        report(args)
        return
    results = []
    for kind in args.kinds:
        results.append(measure(kind, args.images, args.repetitions))
        print(table(results[-1]), flush=True)
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(),
               "date": time.strftime("%Y-%m-%d %H:%M"),
               "load_average_at_end": [round(load, 2) for load in os.getloadavg()]}
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as file:
        json.dump({"machine": machine, "results": results}, file, indent=1)


if __name__ == "__main__":
    main()
