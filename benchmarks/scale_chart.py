"""The growth chart of the scale workloads: time and memory of each per-dataset cost against
the number of samples, measured (dots) and extrapolated to 10B by the fitted growth (dashes).

``python -m benchmarks.scale_chart RUN.json [RUN.json ...] -o docs/img/scale.png`` reads the
JSON files that ``python -m benchmarks.scale`` writes (a later file's figures replace an
earlier one's at the same size) and draws the chart.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .scale import fit

__all__ = ["SERIES", "chart", "merged", "main"]

# (panel, label, figures' key, what to take from a measurement)
SERIES = [
    ("time", "Shuffler: first sample", "first-shuffler", "seconds"),
    ("time", "QuasiShuffler: first sample", "first-quasi", "seconds"),
    ("time", "IndexShuffler: first sample", "first-index", "seconds"),
    ("time", "first key lookup", "lookup", "first_seconds"),
    ("memory", "Shuffler: order state", "first-shuffler", "grew_mb"),
    ("memory", "writer: peak", "write", "peak_mb"),
    ("memory", "fpipe verify: peak", "tool-verify", "peak_mb"),
    ("memory", "DataLoader worker", "loader", "worker_mb"),
]
_LIMITS = {"time": 1e-4, "memory": 0.1}


def merged(paths: list[Path]) -> dict[str, dict[int, dict]]:
    """The figures of the runs in ``paths``, by key and size (later runs win)."""
    figures: dict[str, dict[int, dict]] = {}
    for path in paths:
        for key, by_size in json.loads(Path(path).read_text()).items():
            if isinstance(by_size, dict):
                for n, value in by_size.items():
                    if n.isdigit():
                        figures.setdefault(key, {})[int(n)] = value
    for value in figures.get("loader", {}).values():
        value["worker_mb"] = max(worker.get("VmRSS", 0) for worker in value["worker_rss_mb"])
    return figures


def chart(figures: dict[str, dict[int, dict]], output: Path) -> None:
    """Draw the two panels (seconds, MB) of ``figures`` into the PNG ``output``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, panel, unit in zip(axes, ("time", "memory"), ("seconds", "MB")):
        for label, key, field in (s[1:] for s in SERIES if s[0] == panel):
            points = sorted((n, v[field]) for n, v in figures.get(key, {}).items()
                            if v.get(field) is not None)
            if len(points) < 2:
                continue
            sizes, values = zip(*points)
            shown = [max(v, _LIMITS[panel]) for v in values]
            line, = ax.plot(sizes, shown, "o-", label=label)
            a, b = fit(list(sizes), [max(v, _LIMITS[panel]) for v in values])
            ahead = [sizes[-1], 1e9, 1e10]
            ax.plot(ahead, [max(a * n ** b, _LIMITS[panel]) for n in ahead], "--",
                    color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel="samples", ylabel=unit,
               title=f"{panel}: measured, then extrapolated (dashed)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale_chart", description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.json")
    parser.add_argument("-o", "--output", type=Path, default=Path("docs/img/scale.png"))
    args = parser.parse_args(argv)
    chart(merged(args.runs), args.output)


if __name__ == "__main__":
    main()
