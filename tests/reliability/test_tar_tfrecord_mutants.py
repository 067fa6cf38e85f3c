"""Mutation campaigns: a few hundred seeded mutants of a WebDataset tar shard and of a TFRecord
file (flipped bytes, cuts, zeroed spans; headers edited with their checksums made right;
Examples changed with their CRCs made right, so that parsing itself is tried), each read
through fpipe and through the reference reader in a child process with a per-case timeout
(``tests/reliability/tar_tfrecord_mutants.py``). Every read gives exactly what the reference
gives, or raises FormatError naming the file: no crash, no hang, no wrong or lost sample.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = 300


def campaign(kind: str, folder: Path, seed: int, count: int) -> list[dict]:
    """The results of the child process, one a mutant; a crash or a hang fails the test,
    naming the mutant it was on."""
    done = subprocess.run([sys.executable, "-m", "tests.reliability.tar_tfrecord_mutants", kind,
                           str(folder), str(seed), str(count)],
                          cwd=ROOT, capture_output=True, text=True, timeout=500)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        last = lines[-1] if lines else {"what": "before the first mutant"}
        how = (f"died of {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else "hung (stopped after the per-case timeout)" if "Timeout (" in done.stderr
               else f"exited {done.returncode}")
        pytest.fail(f"the reader's process {how} on mutant {last.get('what')!r}: "
                    f"{done.stderr[-3000:]}")
    results = [line for line in lines if "case" in line]
    assert len(results) == count
    return results


def refusal(error: dict | None) -> str | None:
    """Why an error of fpipe's is not the FormatError naming the file that damage must give
    (None when it is)."""
    if error is None or (error["format_error"] and error["names_the_file"]):
        return None
    return f"not a FormatError naming the file: {error['error']}"


def tar_verdict(result: dict) -> str | None:
    """None when fpipe gave exactly what ``tarfile`` gave, or FormatError naming the file."""
    ours, theirs = result["fpipe"], result["reference"]["samples"]
    if ours["open"] is not None:
        return refusal(ours["open"])
    for error in [ours["ended"], *ours["each"]]:
        if refusal(error if error is None or "error" in error else None):
            return refusal(error)
    if ours["iterated"] != theirs[:len(ours["iterated"])]:
        return "iteration gave a sample that tarfile does not"
    if ours["ended"] is None and ours["iterated"] != theirs:
        return f"iteration ended without an error after {len(ours['iterated'])} of {len(theirs)} samples"
    for index, read in enumerate(ours["each"]):
        if "sample" in read and (index >= len(theirs) or read["sample"] != theirs[index]):
            return f"sample {index} is not tarfile's"
    return None


def tfrecord_verdict(result: dict) -> str | None:
    """None when each record fpipe gave is protobuf's reading of it, every error is a
    FormatError naming the file, no record is lost without one, and a record whose framing
    is whole is refused exactly when protobuf refuses it."""
    ours, theirs = result["fpipe"], result["reference"]["records"]
    if ours["open"] is not None:
        return refusal(ours["open"])
    for error in [ours["ended"], *ours["each"]]:
        if error is not None and "error" in error and refusal(error):
            return refusal(error)
    if ours["ended"] is None and len(ours["iterated"]) != len(theirs):
        return f"iteration ended without an error after {len(ours['iterated'])} of {len(theirs)} records"
    if ours["iterated"] != [record for record in theirs[:len(ours["iterated"])]]:
        return "iteration gave a record that is not protobuf's"
    for index, read in enumerate(ours["each"]):
        record = theirs[index] if index < len(theirs) else "past the records"
        if "sample" in read and read["sample"] != record:
            return f"record {index} is not protobuf's: {read['sample']} against {record}"
        if "sample" not in read and isinstance(record, dict):
            return f"record {index}, which protobuf reads, was refused: {read['error']}"
    return None


@pytest.mark.parametrize("kind, verdict", [("tar", tar_verdict), ("tfrecord", tfrecord_verdict)])
def test_damaged_files_read_as_the_reference_reads_them_or_raise_format_error(
        tmp_path, record, kind, verdict):
    results = campaign(kind, tmp_path, seed=39, count=MUTANTS)
    wrong = [(result["what"], why) for result in results if (why := verdict(result))]
    refused = sum(1 for result in results if result["fpipe"]["open"] is not None
                  or result["fpipe"]["ended"] is not None)
    record(f"{kind} mutants", tried=len(results), failures=len(wrong), refused=refused)
    assert not wrong, f"{len(wrong)} of {len(results)} mutants: {wrong[:5]}"
    assert refused > MUTANTS // 10  # the mutants do damage, and it is found
