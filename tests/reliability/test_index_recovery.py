"""``fpipe index`` without an old index, on data files with a few damaged bytes: every intact
sample comes back byte for byte, or the recovery refuses and changes nothing.

The campaign runs in a process of its own (``tests/reliability/index_campaign.py``), so that
a crash or a hang is a failing test that names the campaign, not a dead pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SEED, FILES = 39, 150


def campaign(folder, seed: int, count: int) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "tests.reliability.index_campaign", str(seed),
                             str(count), str(folder)], cwd=ROOT, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, f"campaign {seed}: {result.stderr[-2000:]}"
    return json.loads(result.stdout)


def test_a_few_damaged_bytes_never_cost_an_intact_sample(tmp_path, record):
    outcomes = campaign(tmp_path, SEED, FILES)
    assert len(outcomes) == FILES
    tally = Counter()
    for outcome in outcomes:
        for step in ("ask", "drop"):
            result = outcome.get(step)
            if isinstance(result, dict):
                assert result["lost"] == [], f"intact samples lost: {outcome}"
                assert result["verified"] and result["dropped_and_kept"], outcome
                tally[f"{step}: recovered"] += 1
            elif result is not None:
                assert result.startswith(("refused", "FormatError")), outcome
                assert "duplicate key" in result or result.startswith("refused"), outcome
                tally[f"{step}: {result.split(':')[0]}"] += 1
    # a refusal with drop_damaged: what even dropping damaged bytes cannot decide
    assert tally["drop: refused"] <= FILES // 30, tally
    record("fpipe index without an old index: 1-3 bytes changed", tried=FILES, **tally)
