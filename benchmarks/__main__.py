"""``python -m benchmarks [NAME ...] [--repetitions N] [--json FILE]``: run workloads, print a table.

With no names, every registered workload runs. ``--list`` shows them.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from pathlib import Path

from .harness import WORKLOADS, run


def _load_workload_modules() -> None:
    package = Path(__file__).parent
    for module in pkgutil.iter_modules([str(package)]):
        if module.name.startswith("bench_"):
            importlib.import_module(f"benchmarks.{module.name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", help="workload names (default: all)")
    parser.add_argument("--repetitions", type=int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--json", default="benchmarks/results/latest.json", help="where to write JSON")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = parser.parse_args(argv)
    if args.repetitions < 5:
        parser.error(f"--repetitions must be at least 5; got {args.repetitions}")
    _load_workload_modules()
    if args.list:
        for load in WORKLOADS.values():
            print(f"{load.name:<6} {load.target:<8} vs {load.reference}: {load.description}")
        return
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    run(args.names or list(WORKLOADS), args.repetitions, args.json)


if __name__ == "__main__":
    main()
