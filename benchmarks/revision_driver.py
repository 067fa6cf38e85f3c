"""The side of :mod:`benchmarks.revisions` that runs inside one revision's checkout.

:mod:`benchmarks.revisions` runs this file's source with ``python -c``, in a temporary
checkout of a revision, with ``PYTHONPATH`` set to that checkout, so that ``fpipe`` and
``benchmarks`` are that revision's. It needs nothing of the revision but what the spec's code
imports. The spec (JSON, the first argument) names a mode:

``time``
    runs ``setup`` (code that defines ``work``, a zero-argument callable, and may define
    ``items`` and ``teardown``), calls ``work`` once to warm up, then ``samples`` times
    ``loops`` calls, and reports the seconds of one call in each sample;
``prepare``
    runs ``setup`` (code that writes the benchmark datasets), then syncs the disks;
``bytes``
    writes the samples that the code ``samples`` makes (its ``byte_samples()``) with
    ``FileWriter`` (as ``fpipe`` and as ported code imports it, ``fpipe.storage``) and
    ``ShardedWriter``, and runs ``fpipe write`` on the folder ``folder`` (in order, and with
    ``--shuffle --seed 1``), under ``out``.

The last line of its output is ``MARKER`` and the result as JSON, ``{"error": ...}`` on failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

MARKER = "FPIPE-REVISIONS-RESULT "


def _outside(root: str) -> list[str]:
    """fpipe modules loaded from anywhere but ``root`` (another checkout's, an installed one)."""
    root = os.path.realpath(root)
    outside = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "fpipe" or name.startswith("fpipe.")) and path:
            if not os.path.realpath(path).startswith(root + os.sep):
                outside.append(f"{name} from {path}")
    return outside


def _timed(spec: dict) -> dict:
    namespace: dict = {"__name__": "revision_workload"}
    exec(spec["setup"], namespace)
    work, teardown = namespace["work"], namespace.get("teardown")
    seconds = []
    try:
        work()  # warm-up
        for _ in range(spec["samples"]):
            start = time.perf_counter()
            for _ in range(spec["loops"]):
                work()
            seconds.append((time.perf_counter() - start) / spec["loops"])
    finally:
        if teardown is not None:
            teardown()
    return {"seconds": seconds, "items": int(namespace.get("items") or 1)}


def _prepare(spec: dict) -> dict:
    exec(spec["setup"], {"__name__": "revision_prepare"})
    os.sync()  # written out now, not while a workload is timed
    return {}


def _write_bytes(spec: dict) -> dict:
    import subprocess

    import fpipe
    import fpipe.storage

    namespace: dict = {}
    exec(spec["samples"], namespace)
    samples = namespace["byte_samples"]()
    out = spec["out"]

    def folder(name: str) -> str:
        path = os.path.join(out, name)
        os.makedirs(path, exist_ok=True)
        return path

    for name, writer_class in (("file", fpipe.FileWriter), ("ported", fpipe.storage.FileWriter)):
        with writer_class(os.path.join(folder(name), "data.msgpack")) as writer:
            for sample in samples:
                writer.write(sample)
    with fpipe.ShardedWriter(os.path.join(folder("sharded"), "data"),
                             shard_size=spec["shard_size"]) as writer:
        for sample in samples:
            writer.write(sample)
    for name, options in (("cli", []), ("cli-shuffled", ["--shuffle", "--seed", "1"])):
        subprocess.run([sys.executable, "-m", "fpipe", "write", spec["folder"],
                        os.path.join(folder(name), "data.msgpack"), "-q", *options],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return {}


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        result = {"time": _timed, "prepare": _prepare, "bytes": _write_bytes}[spec["mode"]](spec)
        outside = _outside(spec["root"])
        if outside:
            result = {"error": "fpipe modules were not the revision's: " + "; ".join(outside[:3])}
    except BaseException as error:  # reported to the parent, which goes on with the others
        detail = getattr(error, "stderr", None)
        message = traceback.format_exc(limit=4)
        if detail:
            message += "\n" + (detail.decode(errors="replace") if isinstance(detail, bytes) else detail)
        result = {"error": message}
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
