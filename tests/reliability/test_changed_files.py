"""A dataset changed under an open reader raises FormatError naming the file, and never kills
the process: truncated, rewritten in place with another dataset, deleted and replaced, read
from four threads, and read by two DataLoader workers.

Each scenario runs in a process of its own (``tests/reliability/changes.py``): a reader that
regressed to touching a mapped file would die there of SIGBUS, and the test would fail on the
signal rather than take pytest down with it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fpipe.dataset import MsgpackReader, ShardedReader
from fpipe.orderings import QuasiShuffler, Shuffler

from .changes import first
from .files import write_dataset

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]


def scenario(name: str, folder: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.reliability.changes", name, str(folder)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode < 0:
        pytest.fail(f"the reader's process died of {signal.Signals(-done.returncode).name}: "
                    f"{done.stderr[-2000:]}")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def format_error(outcome: str, path: str, reason: str) -> bool:
    return (outcome.startswith(f"FormatError: {path}: ")
            and re.search(reason, outcome) is not None)


def test_a_data_file_truncated_under_a_reader_raises_at_every_read(tmp_path):
    result = scenario("truncate", tmp_path)
    shrank = "the data file shrank from [0-9]+ to 100 bytes while the reader had it open"
    assert all(format_error(o, result["path"], shrank) for o in result["reads"].values()), result


def test_a_dataset_rewritten_in_place_raises_and_a_new_reader_reads_it(tmp_path):
    result = scenario("rewrite", tmp_path)
    changed = "the data file changed while the reader had it open"
    assert all(format_error(o, result["path"], changed) for o in result["reads"].values()), result
    assert set(result["new reader"].values()) == {"ok"}, result


def test_a_replaced_dataset_is_read_whole_from_the_open_files_and_refused_when_reopened(tmp_path):
    result = scenario("replace", tmp_path)
    assert set(result["reads"].values()) == {"ok"}, result
    refused = "the data file changed since the reader was made"
    assert format_error(result["reopened"], result["path"], refused), result
    assert format_error(result["unpickled"], result["path"], refused), result
    assert set(result["new reader"].values()) == {"ok"}, result


def test_readers_in_threads_get_samples_or_format_errors_while_the_file_changes(tmp_path):
    outcomes = scenario("threads", tmp_path)["outcomes"]
    assert set(outcomes) == {"ok", "FormatError"}, outcomes  # never a wrong sample


def test_dataloader_workers_raise_format_error_when_the_file_is_truncated(tmp_path):
    pytest.importorskip("torch")
    result = scenario("dataloader", tmp_path)
    assert result["first"] == ["k0", "k1"] and result["rest"] is None, result
    assert result["error"].startswith("FormatError: Caught FormatError in DataLoader worker"), result
    # a worker that had opened the file before it was cut: "shrank"; one that opens it after
    # (workers open their files at their first read): it refuses the changed file
    reasons = "sample [0-9]+ at byte [0-9]+: the data file shrank|the data file changed since"
    assert re.search(f"{re.escape(result['path'])}: ({reasons})", result["error"]), result


def test_no_dataset_file_is_mapped_into_memory(tmp_path):
    path = write_dataset(tmp_path / "set.msgpack", first(3))
    reader = MsgpackReader(path)
    reader.get(2), reader[0:2], list(reader), reader.find_index("k1"), reader.find_key(0)
    assert "k1" in reader and reader.verify_data() and reader.verify_index()
    sharded = ShardedReader([path, write_dataset(tmp_path / "two.msgpack", first(2))])
    for ordering in (Shuffler(sharded, seed=0), QuasiShuffler(sharded, seed=0)):
        assert len(list(ordering)) == 5
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps to list the mappings on this system")
    assert str(tmp_path) not in maps.read_text()
