"""Damaged Parquet and Arrow IPC files: seeded campaigns of byte flips, truncations and zeroed
spans, each mutant read by fpipe and by pyarrow with full validation (the reference), in a
child process (``tests/reliability/foreign_mutants.py``) with a per-mutant deadline.

fpipe gives exactly the reference's rows, or raises FormatError naming the file: no crash of
the interpreter, no hang, no other exception, no row that pyarrow's validation rejects, and no
FormatError for a part that pyarrow reads (but a file whose part headers are damaged may be
refused when the reader is made).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from .foreign_mutants import CASE_SECONDS

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGNS = {"parquet": (390, 300), "arrow-file": (391, 160), "arrow-stream": (392, 160)}


def _child(*arguments: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.reliability.foreign_mutants",
                           *map(str, arguments)], cwd=ROOT, capture_output=True, text=True,
                          timeout=CASE_SECONDS * 5)


def _death(done: subprocess.CompletedProcess) -> str:
    if done.returncode < 0:
        return f"crashed ({signal.Signals(-done.returncode).name})"
    if "Timeout" in done.stderr:
        return f"hung for {CASE_SECONDS} s"
    return f"ended with exit code {done.returncode}: {done.stderr[-1500:]}"


def run_campaign(kind: str, folder: Path) -> tuple[Counter, list[str]]:
    """Every mutant's verdict, and the failures (a mutant whose read crashed or hung ends its
    child process; the campaign goes on in a new one from the next mutant)."""
    seed, count = CAMPAIGNS[kind]
    verdicts: Counter = Counter()
    failures: list[str] = []
    first = 0
    while first < count:
        done = _child(kind, folder, seed, count, first)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        started = {line["start"]: line["what"] for line in lines if "start" in line}
        for line in lines:
            if "done" in line:
                verdicts[line["verdict"]] += 1
                if line["problem"]:
                    failures.append(f"mutant {line['done']} ({started[line['done']]}): "
                                    f"{line['problem']}")
        unfinished = sorted(set(started) - {line["done"] for line in lines if "done" in line})
        if not unfinished:
            assert done.returncode == 0, done.stderr[-3000:]
            break
        number = unfinished[0]
        verdicts["crash or hang"] += 1
        failures.append(f"mutant {number} ({started[number]}): the read {_death(done)}")
        first = number + 1
    return verdicts, failures


@pytest.mark.parametrize("kind", sorted(CAMPAIGNS))
def test_damaged_files_read_as_pyarrow_validates_them_or_raise_format_error(kind, tmp_path,
                                                                              record):
    verdicts, failures = run_campaign(kind, tmp_path)
    tried = sum(verdicts.values())
    record(f"{kind} mutants", tried=tried, failures=len(failures), **verdicts)
    assert tried == CAMPAIGNS[kind][1]
    assert not failures, f"{len(failures)} of {tried} mutants:\n" + "\n".join(failures[:40])
    assert verdicts["read"] > 0 and verdicts["refused"] > 0, verdicts  # the campaign bites
    assert not list(tmp_path.glob("mutant-*")), "a mutant file was left behind"


@pytest.mark.parametrize("kind", sorted(CAMPAIGNS))
def test_a_file_cut_under_an_open_reader_raises_format_error(kind, tmp_path):
    done = _child("truncated", kind, tmp_path)
    assert done.returncode == 0, f"the reader's process {_death(done)}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = result["reads"]
    cut = [index for index, outcome in outcomes.items() if outcome != "ok"]
    assert result["first"] == "k0000" and cut, result
    for index in cut:
        assert re.match(rf"FormatError: {re.escape(result['path'])}: sample {index}: "
                        r"(record batch|row group) [0-9]+ does not decode", outcomes[index]), outcomes
