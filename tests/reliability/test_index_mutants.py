"""Mutation campaigns over the indexes that fpipe keeps beside the data: a few hundred seeded
mutants of a key index (bit flips, zeroed spans, truncations, bytes appended) must each give
every key's right sample and index (from the key index, or from ``.keys`` after a warning
naming it) or a FormatError naming it; a few hundred of a shard index (the same over its
bytes, and stale, impossible, missing and repeated counts and names) must give the right
samples, with a warning when a count was corrected, or a FormatError naming the index (a
FileNotFoundError for a shard name changed into the name of no file). Never a wrong answer,
a present key reported absent, a crash or a hang.

The mutants run in a child process per batch (``tests/reliability/index_mutants.py``), each
with 60 s: a mutant that kills or hangs it fails the test, named.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]
MUTANTS, BATCH = 300, 100


def campaign(kind: str, folder: Path) -> tuple[dict[int, str], dict[int, str]]:
    """The damage and the outcome of each mutant, batch by batch; a batch whose process
    died or hung names the mutant it was reading."""
    damages, outcomes = {}, {}
    for first in range(0, MUTANTS, BATCH):
        batch = folder / f"batch-{first}"
        batch.mkdir()
        command = [sys.executable, "-m", "tests.reliability.index_mutants", kind, str(batch),
                   str(first), str(BATCH)]
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
            output, errors, ending = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as expired:  # the child's own 60 s did not end it
            output, errors, ending = _text(expired.stdout), _text(expired.stderr), "a hang"
        for row in map(json.loads, output.splitlines()):
            if "damage" in row:
                damages[row["mutant"]] = row["damage"]
            else:
                outcomes[row["mutant"]] = row["outcome"]
        if ending != 0:
            died = signal.Signals(-ending).name if isinstance(ending, int) and ending < 0 else ending
            last = max((m for m in damages if m >= first), default=None)
            named = f"mutant {last} ({damages[last]})" if last is not None else "the process"
            pytest.fail(f"{kind} {named} ended its batch ({died}): {errors[-2000:]}")
    return damages, outcomes


def _text(output: bytes | str | None) -> str:
    return output.decode() if isinstance(output, bytes) else output or ""


def failures(damages: dict[int, str], outcomes: dict[int, str]) -> list[str]:
    return [f"mutant {m} ({damages[m]}): {outcome}" for m, outcome in outcomes.items()
            if outcome not in ("ok", "warned", "error")]


def test_key_index_mutants_give_the_right_sample_or_a_warning_or_an_error(tmp_path, record):
    damages, outcomes = campaign("key_index", tmp_path)
    counts = Counter(outcomes.values())
    failed = failures(damages, outcomes)
    record("key index mutants", tried=len(outcomes), failures=len(failed), **counts)
    assert len(outcomes) == MUTANTS and not failed, failed[:10]
    assert counts["warned"] > MUTANTS / 2, counts  # the damage is found, not stepped over


def test_shard_index_mutants_give_the_right_samples_or_an_error_naming_the_index(tmp_path, record):
    damages, outcomes = campaign("shard_index", tmp_path)
    counts = Counter(outcomes.values())
    failed = failures(damages, outcomes)
    record("shard index mutants", tried=len(outcomes), failures=len(failed), **counts)
    assert len(outcomes) == MUTANTS and not failed, failed[:10]
    assert counts["warned"] and counts["error"], counts
