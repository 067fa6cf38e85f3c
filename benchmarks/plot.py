"""Plot and tabulate benchmark results.

``python -m benchmarks.plot RESULTS.json [-o FIG.png] [--markdown] [--page PAGE.md]``

The figure shows, for each timed workload, fpipe's speed relative to its reference as a bar and
the target as a tick, grouped by what fpipe is compared with (datadings, dpipe, a torch
DataLoader, a plain Python loop, or fpipe itself in another setting). A miss is drawn in
another colour and kept on the chart.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def _figure(result: dict) -> float:
    return result["value"] if result["value"] is not None else result["ratio"]


def _pretty(target: str) -> str:
    return target.replace(">=", "≥").replace("<=", "≤")


def markdown_table(results: list[dict]) -> str:
    """The results as a Markdown table: workload, reference, figure, target, verdict."""
    rows = ["| workload | what | compared with | fpipe | reference | figure | target | |",
            "| --- | --- | --- | ---: | ---: | ---: | --- | --- |"]
    for r in results:
        if r["value"] is not None:
            times, figure = ("", ""), f"{r['value']:.3g} {r['unit']}"
        else:
            times = tuple(f"{statistics.median(s) * 1e3:.1f} ms"
                          for s in (r["fpipe_seconds"], r["reference_seconds"]))
            figure = f"{r['ratio']:.2f}×"
        verdict = {True: "met", False: "**missed**", None: "information"}[r["met"]]
        rows.append(f"| {r['name']} | {r['description']} | {r['reference']} | {times[0]} | "
                    f"{times[1]} | {figure} | {_pretty(r['target'])} | {verdict} |")
    return "\n".join(rows)


def speed(result: dict) -> tuple[float, float | None]:
    """fpipe's speed relative to its reference and the target's, both as "higher is better":
    a time ratio ``t`` (target ``<= b``) becomes ``1 / t`` (target ``1 / b``). A figure kept
    as information (target ``-``) has no target: None."""
    figure = 1 / result["ratio"] if result["kind"] == "time" else result["ratio"]
    if result["target"] == "-":
        return figure, None
    bound = float(result["target"].split()[1])
    return figure, 1 / bound if result["kind"] == "time" else bound


def _family(reference: str) -> str:
    if reference.startswith("the same"):
        return "itself"  # stats off, one worker: fpipe against another setting of fpipe
    return next((name for name in ("datadings", "dpipe", "torch DataLoader") if name in reference),
                "plain Python")


def plot(results: list[dict], output: Path) -> None:
    """Draw fpipe's speed against each reference (bars) and each target (ticks) into
    ``output`` (PNG), grouped by the library compared with. Memory figures, which have no
    reference, are left to the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = sorted((r for r in results if r["value"] is None),
                   key=lambda r: (_family(r["reference"]), r["name"]), reverse=True)
    speeds, targets = zip(*(speed(r) for r in timed)) if timed else ((), ())
    labels = [f"{r['name']}  vs {_family(r['reference'])}" for r in timed]
    colours = [{True: "#2b8a3e", False: "#c92a2a", None: "#868e96"}[r["met"]] for r in timed]
    ticks = [(target, label) for target, label in zip(targets, labels) if target is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.3 * len(timed) + 1.4))
    # bars grow from 1 (as fast as the reference): right is faster, left is slower
    ax.barh(labels, [s - 1 for s in speeds], left=1, color=colours, height=0.6)
    ax.scatter([t for t, _ in ticks], [label for _, label in ticks], marker="|", s=220,
               color="black", zorder=3, label="target")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for label, figure, target in zip(labels, speeds, targets):
        ax.annotate(f"{figure:.2f}×", (max(figure, target or 1.0, 1.0), label), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(right=max((*speeds, *(t for t, _ in ticks), 1.0)) * 4)  # room for the labels
    ax.set_xlabel("fpipe's speed / the reference's\n(log scale; green: target met, red: missed, "
                  "grey: no target)")
    ax.set_title("fpipe against datadings, dpipe, the torch DataLoader, plain Python and itself\n"
                 "(same-run ratios)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


_BEGIN, _END = "<!-- results:", "<!-- /results -->"


def with_table(page: str, table: str) -> str:
    """``page`` with ``table`` between its results markers (``<!-- results: ... -->`` and
    ``<!-- /results -->``), replacing what was there."""
    begin, end = page.find(_BEGIN), page.find(_END)
    if begin < 0 or end < begin:
        raise ValueError(f"the page has no {_BEGIN} ... {_END} markers")
    head = page.index("\n", begin) + 1
    return page[:head] + table + "\n" + page[end:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__)
    parser.add_argument("results", help="JSON written by python -m benchmarks")
    parser.add_argument("-o", "--output", help="PNG file to draw the chart into")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--page", help="Markdown page whose results markers get the table")
    args = parser.parse_args(argv)
    results = json.loads(Path(args.results).read_text())["results"]
    if args.output:
        plot(results, Path(args.output))
    if args.markdown:
        print(markdown_table(results))
    if args.page:
        page = Path(args.page)
        page.write_text(with_table(page.read_text(), markdown_table(results)))


if __name__ == "__main__":
    main()
