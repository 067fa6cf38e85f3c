"""A bounded run of the coverage-guided fuzzer (``fuzz_reader.py``), when atheris is installed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .fuzz_reader import decode, encode, seeds

ROOT = Path(__file__).resolve().parents[2]
RUNS = 100_000


def test_inputs_stand_for_a_data_file_and_its_offsets():
    assert decode(encode(b"abc", [0, 1, 3])) == {"": b"abc", ".offsets": bytes(
        [0] * 7 + [0] + [0] * 7 + [1] + [0] * 7 + [3])}
    assert decode(b"") == {"": b"", ".offsets": b""} and decode(b"\x05\x00") == {
        "": b"\x00", ".offsets": b""}
    assert all(decode(seed)[".offsets"] for seed in seeds())


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_atheris_finds_nothing_in_a_bounded_run(tmp_path, record):
    pytest.importorskip("atheris")
    done = subprocess.run([sys.executable, "-m", "tests.reliability.fuzz_reader",
                           f"-atheris_runs={RUNS}", f"-artifact_prefix={tmp_path}/",
                           str(tmp_path / "corpus")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = int(re.search(r"Done (\d+)", done.stderr).group(1))
    coverage = re.findall(r"cov: (\d+) ft: (\d+)", done.stderr)[-1]
    assert ran >= RUNS
    record("atheris, coverage-guided (data file and offsets)", tried=ran,
           edges_covered=int(coverage[0]), features=int(coverage[1]))
