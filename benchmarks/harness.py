"""Time fpipe against a reference in the same run, and keep the figures.

A workload module registers workloads with :func:`workload`. A workload function takes no
argument and returns either

* ``Pair(fpipe=..., reference=..., items=...)``: two zero-argument callables doing the same
  work. They run alternately, after one warm-up each, ``repetitions`` times; the table
  reports both medians and the ratio ``fpipe / reference`` of throughput (higher is better),
  or of time for workloads whose target is a time (``kind="time"``). An optional ``settle``
  runs, untimed, before every timed run (to let a reference's background work end, say);
* ``Value(value=..., unit=...)``: a measured figure with no reference (memory growth, say).

A build that raises :class:`Unavailable` (a reference that needs another environment, say) is
skipped with the reason it gives.

Targets are written as ``">= 1.5"`` or ``"<= 0.5"`` and checked against the ratio (or value);
``"-"`` marks a figure kept as information, with no target (a retired one, say).
Each workload starts once the machine is quiet (:func:`wait_until_quiet`), so that what the one
before it left winding down is not timed with it.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["WORKLOADS", "Pair", "Result", "Unavailable", "Value", "run", "workload"]


@dataclass(frozen=True)
class Pair:
    fpipe: Callable[[], object]
    reference: Callable[[], object]
    items: int = 1
    teardown: Callable[[], object] | None = None
    settle: Callable[[], object] | None = None  # untimed, before each timed run


class Unavailable(Exception):
    """Raised by a workload's build when its reference cannot run here; the message says
    why and how to provide it, and the workload is skipped with that note."""


@dataclass(frozen=True)
class Value:
    value: float
    unit: str


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    reference: str
    target: str
    kind: str  # "throughput", "time" or "value"
    build: Callable[[], Pair | Value]


@dataclass
class Result:
    name: str
    description: str
    reference: str
    target: str
    kind: str
    fpipe_seconds: list[float] = field(default_factory=list)
    reference_seconds: list[float] = field(default_factory=list)
    items: int = 1
    ratio: float | None = None
    value: float | None = None
    unit: str = ""
    met: bool | None = None


WORKLOADS: dict[str, Workload] = {}


def workload(name: str, *, description: str, reference: str, target: str,
             kind: str = "throughput") -> Callable:
    """Register the decorated function as workload ``name``."""
    if kind not in ("throughput", "time", "value"):
        raise ValueError(f"kind must be 'throughput', 'time' or 'value'; got kind={kind!r}")

    def register(build: Callable[[], Pair | Value]) -> Callable[[], Pair | Value]:
        WORKLOADS[name] = Workload(name, description, reference, target, kind, build)
        return build
    return register


def _seconds(func: Callable[[], object]) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def _meets(target: str, figure: float) -> bool | None:
    if target == "-":  # information: nothing to meet
        return None
    op, bound = target.split()
    return figure >= float(bound) if op == ">=" else figure <= float(bound)


def _settled_seconds(pair: Pair, func: Callable[[], object]) -> float:
    if pair.settle is not None:
        pair.settle()
    return _seconds(func)


def _time_pair(result: Result, pair: Pair, repetitions: int) -> None:
    _seconds(pair.fpipe), _seconds(pair.reference)  # warm-up
    for _ in range(repetitions):
        result.fpipe_seconds.append(_settled_seconds(pair, pair.fpipe))
        result.reference_seconds.append(_settled_seconds(pair, pair.reference))
    fpipe_median = statistics.median(result.fpipe_seconds)
    reference_median = statistics.median(result.reference_seconds)
    result.items = pair.items
    result.ratio = (fpipe_median / reference_median if result.kind == "time"
                    else reference_median / fpipe_median)


_QUIET_SHARE = 0.15  # of the machine's CPU time, over one window
_QUIET_WINDOW = 0.2  # seconds
_QUIET_DEADLINE = 10.0  # seconds: past it the workload runs anyway


def _busy_and_total() -> tuple[int, int]:
    """The machine's busy and total CPU time so far, in clock ticks (from /proc/stat)."""
    with open("/proc/stat") as file:
        ticks = [int(field) for field in file.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # less idle and iowait


def wait_until_quiet() -> float:
    """Wait until the whole machine used at most 15 % of its CPU time over 0.2 s (at most
    10 s; not on systems without /proc/stat), and return the seconds waited. A dpipe pipeline
    goes on working for a while after it is closed, and would otherwise be timed with the
    next workload."""
    began = time.monotonic()
    if not os.path.exists("/proc/stat"):
        return 0.0
    while time.monotonic() - began < _QUIET_DEADLINE:
        busy, total = _busy_and_total()
        time.sleep(_QUIET_WINDOW)
        busy_after, total_after = _busy_and_total()
        if busy_after - busy <= _QUIET_SHARE * max(1, total_after - total):
            break
    return time.monotonic() - began


def run_one(load: Workload, repetitions: int) -> Result:
    result = Result(load.name, load.description, load.reference, load.target, load.kind)
    built = load.build()
    if isinstance(built, Value):
        result.value, result.unit = built.value, built.unit
        result.met = _meets(load.target, built.value)
        return result
    try:
        _time_pair(result, built, repetitions)
    finally:
        if built.teardown is not None:
            built.teardown()
    result.met = _meets(load.target, result.ratio)
    return result


def _row(result: Result) -> str:
    if result.value is not None:
        figure, timing = f"{result.value:.3g} {result.unit}", ""
    else:
        fp, ref = (statistics.median(s) for s in (result.fpipe_seconds, result.reference_seconds))
        figure = f"{result.ratio:.2f}x"
        timing = f"fpipe {fp * 1e3:.1f} ms, ref {ref * 1e3:.1f} ms"
    verdict = {True: "met", False: "MISSED", None: "info"}[result.met]
    return f"{result.name:<6} {figure:>12}  target {result.target:<8} {verdict:<7} {timing}"


def run(names: list[str], repetitions: int = 5, output: str | None = None) -> list[Result]:
    """Run the named workloads, print a table, and write JSON to ``output`` if given."""
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {sorted(WORKLOADS)}")
    results = []
    for name in names:
        wait_until_quiet()
        try:
            result = run_one(WORKLOADS[name], repetitions)
        except ModuleNotFoundError as error:  # a reference that is not installed here
            print(f"{name:<6} skipped: {error.name} is not installed (see docs/benchmarks.md)",
                  flush=True)
            continue
        except Unavailable as error:
            print(f"{name:<6} skipped: {error}", flush=True)
            continue
        print(_row(result), flush=True)
        results.append(result)
    if output:
        machine = {"python": platform.python_version(), "machine": platform.machine(),
                   "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                   "load_average_at_end": [round(load, 2) for load in os.getloadavg()]}
        with open(output, "w") as file:
            json.dump({"machine": machine, "results": [asdict(r) for r in results]}, file, indent=1)
    return results
