"""Plot and tabulate benchmark results: ``python -m benchmarks.plot RESULTS.json [-o FIG.png] [--markdown]``.

The figure shows, for each workload, how far its figure is from its target: the ratio
(or value) divided by a ``>=`` target, or a ``<=`` target divided by it. A bar past 1 met its
target; a bar short of it is a miss, drawn in another colour and kept on the chart.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _figure(result: dict) -> float:
    return result["value"] if result["value"] is not None else result["ratio"]


def margin(result: dict) -> float:
    """How many times the figure clears its target (> 1 met, < 1 missed)."""
    op, bound = result["target"].split()
    figure = _figure(result)
    if op == ">=":
        return figure / float(bound)
    return float(bound) / figure if figure > 0 else float("inf")


def markdown_table(results: list[dict]) -> str:
    """The results as a Markdown table: workload, reference, figure, target, verdict."""
    rows = ["| workload | what | reference | fpipe | reference | figure | target | |",
            "| --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in results:
        if r["value"] is not None:
            times, figure = ("", ""), f"{r['value']:.3g} {r['unit']}"
        else:
            times = tuple(f"{statistics.median(s) * 1e3:.1f} ms"
                          for s in (r["fpipe_seconds"], r["reference_seconds"]))
            figure = f"{r['ratio']:.2f}×"
        verdict = "met" if r["met"] else "**missed**"
        rows.append(f"| {r['name']} | {r['description']} | {r['reference']} | {times[0]} | "
                    f"{times[1]} | {figure} | {r['target']} | {verdict} |")
    return "\n".join(rows)


def plot(results: list[dict], output: Path) -> None:
    """Draw the margins of ``results`` as horizontal bars into ``output`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in results][::-1]
    margins = [min(margin(r), 10.0) for r in results][::-1]
    colours = ["#2b8a3e" if m >= 1 else "#c92a2a" for m in margins]
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(names) + 1.2))
    ax.barh(names, margins, color=colours)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("figure / target (log scale; right of the line: target met; capped at 10)")
    ax.set_title("fpipe against its references, same-run ratios")
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__)
    parser.add_argument("results", help="JSON written by python -m benchmarks")
    parser.add_argument("-o", "--output", help="PNG file to draw the margins into")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())["results"]
    if args.output:
        plot(results, Path(args.output))
    if args.markdown:
        print(markdown_table(results))


if __name__ == "__main__":
    main()
