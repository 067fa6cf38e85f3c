"""A command stopped while it renames its new files into place: Ctrl-C (SIGINT), SIGTERM and
SIGKILL at every step of the commit of ``fpipe write -y``, ``fpipe export -y`` and ``fpipe mv``.

Each run is a fresh interpreter (``tests/reliability/interrupting.py``) that sends itself the
signal just before its Nth rename or removal in the output folder, for every N the commit has,
so no step is left to chance. Afterwards the output must be entirely the old dataset or
entirely the new one, read sample by sample and key by key; SIGINT must end with status 130,
and nothing of the run (staging folders, partial files) may be left. SIGKILL cannot be held
off: what it leaves must be one of the two datasets, or a missing data file whose reader
error says how to finish the commit, which ``fpipe index`` then does; for an export, shards
that ``fpipe verify`` refuses, naming the hidden folder, until the next export to the pattern
finishes the killed one's commit first: its shards and manifest, whole, and nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fpipe.cli import main
from fpipe.dataset import MsgpackReader

from ..signals import default_sigint
from .files import write_dataset

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 120
SAMPLES = 30


def _samples(generation: str) -> list[dict]:
    """Samples of one generation; both have the same sizes, so that offsets of one fit the
    data of the other and only the contents tell them apart."""
    return [{"key": f"{generation}-{i:03d}", "v": f"{generation}-{i:03d}"} for i in range(SAMPLES)]


def run_interrupted(n: int, name: str, folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tests.reliability.interrupting", str(n), name, str(folder),
               *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE,
                          preexec_fn=default_sigint)


def counted_renames(folder: Path, args: list[str]) -> int:
    """How many renames and removals in ``folder`` the command makes when nothing stops it."""
    done = run_interrupted(0, "INT", folder, args)
    assert done.returncode == 0, done.stderr
    return int(re.search(r"renames: (\d+)", done.stderr).group(1))


def whole_samples(path: Path) -> list[dict]:
    """The samples of dataset ``path``, checked to agree with its index: each sample where
    its key's index says, each key where the sample says, and the checksums."""
    with MsgpackReader(path) as reader:
        samples = list(reader)
        for i, sample in enumerate(samples):
            assert reader.find_index(sample["key"]) == i, f"find_index({sample['key']!r})"
            assert reader.get(i) == sample and reader.find_key(i) == sample["key"]
        assert reader.verify_data() and reader.verify_index(), "checksums"
        return samples


def generation(path: Path) -> str:
    """``"old"`` or ``"new"``: which whole dataset ``path`` is; fails on anything else."""
    samples = whole_samples(path)
    assert len(samples) == SAMPLES, f"{len(samples)} samples"
    which = samples[0]["key"].split("-")[0]
    assert samples == _samples(which), "a mix of samples"
    return which


def _leftovers(folder: Path, expected: set[str]) -> set[str]:
    return set(os.listdir(folder)) - expected


def _bystanders(folder: Path, stem: str) -> dict[str, bytes]:
    """Files of the user's beside the output, named like it (the same stem with other
    suffixes, a folder): no commit may touch them. Returns what each holds."""
    files = {f"{stem}.notes": b"mine", f"{stem}.msgpack.notes": b"mine too",
             f"{stem}.d/inside.txt": b"a folder named like the output"}
    for name, data in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    return files


def _check_bystanders(folder: Path, files: dict[str, bytes]) -> None:
    changed = [name for name, data in files.items()
               if not (folder / name).is_file() or (folder / name).read_bytes() != data]
    assert not changed, f"a commit touched files that are not its own: {changed}"


def _new_source(tmp_path: Path) -> Path:
    source = tmp_path / "new.jsonl"
    source.write_text("".join(json.dumps(s) + "\n" for s in _samples("new")), encoding="utf-8")
    return source


def _write_setup(tmp_path: Path) -> tuple[Path, list[str], set[str]]:
    folder = tmp_path / "out"
    folder.mkdir()
    _bystanders(folder, "data")
    target = write_dataset(folder / "data.msgpack", _samples("old"))
    args = ["write", str(_new_source(tmp_path)), str(target), "-y", "-q"]
    return target, args, set(os.listdir(folder))


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_a_signal_at_any_step_of_write_leaves_one_whole_dataset(tmp_path, name, record):
    target, args, names = _write_setup(tmp_path)
    bystanders = _bystanders(target.parent, "data")
    steps = counted_renames(target.parent, args)
    write_dataset(target, _samples("old"))
    seen = set()
    for n in range(1, steps + 1) if name == "INT" else (1, steps // 2, steps):
        done = run_interrupted(n, name, target.parent, args)
        status = 130 if name == "INT" else -signal.SIGTERM
        assert done.returncode == status, (n, done.returncode, done.stderr)
        if name == "INT":
            assert "interrupted (during the commit, which was finished first: the new dataset " \
                   "is in place" in done.stderr, done.stderr
        seen.add(generation(target))
        assert not _leftovers(target.parent, names), (n, _leftovers(target.parent, names))
        _check_bystanders(target.parent, bystanders)
        write_dataset(target, _samples("old"))
    assert seen == {"new"}, "the commit was deferred, so the new dataset is in place"
    record(f"SIG{name} at each step of 'fpipe write -y''s commit", tried=steps)


@pytest.mark.slow
def test_sigkill_at_any_step_of_write_is_detected_and_finished(tmp_path, record):
    target, args, names = _write_setup(tmp_path)
    steps = counted_renames(target.parent, args)
    finished = 0
    for n in range(1, steps + 1):
        write_dataset(target, _samples("old"))
        done = run_interrupted(n, "KILL", target.parent, args)
        assert done.returncode == -signal.SIGKILL, (n, done.stderr)
        try:
            before = generation(target)
        except FileNotFoundError as error:  # killed between the two data files
            assert f"'fpipe index {target}' finishes it" in str(error), str(error)
            before = "new"
            finished += 1
        assert main(["index", str(target), "-q"]) == 0
        assert generation(target) == before, n
        assert not _leftovers(target.parent, names), (n, _leftovers(target.parent, names))
        _check_bystanders(target.parent, _bystanders(target.parent, "data"))
    assert finished == steps - 1, "every step but the first comes after the old data file went"
    record("SIGKILL at each step of 'fpipe write -y''s commit", tried=steps)


def test_ctrl_c_at_any_step_of_an_append_leaves_one_whole_dataset(tmp_path, record):
    folder = tmp_path / "out"
    folder.mkdir()
    bystanders = _bystanders(folder, "data")
    target = write_dataset(folder / "data.msgpack", _samples("old"))
    names = set(os.listdir(folder))
    args = ["write", str(_new_source(tmp_path)), str(target), "--append", "-q"]
    steps = counted_renames(folder, args)
    for n in (1, steps // 2, steps):
        write_dataset(target, _samples("old"))
        done = run_interrupted(n, "INT", folder, args)
        assert done.returncode == 130, (n, done.stderr)
        assert whole_samples(target) == _samples("old") + _samples("new"), n
        assert not _leftovers(folder, names), (n, _leftovers(folder, names))
        _check_bystanders(folder, bystanders)
    record("SIGINT at steps of 'fpipe write --append''s commit", tried=3)


def _export_setup(tmp_path: Path) -> tuple[Path, dict[str, list[str]]]:
    """Datasets old (30 samples) and new (30 others) and the arguments that export each to
    the shards out/part-%06d.tar: 4 shards of old, 2 of new. Files of the user's named like
    the shards sit beside them: every check of the folder's files sees that they survive."""
    (tmp_path / "out").mkdir()
    _bystanders(tmp_path / "out", "part-000001.tar")
    _bystanders(tmp_path / "out", "part")
    runs = {}
    for which, size in (("old", 8), ("new", 15)):
        write_dataset(tmp_path / f"{which}.msgpack", _samples(which))
        runs[which] = ["export", str(tmp_path / f"{which}.msgpack"),
                       str(tmp_path / "out" / "part-%06d.tar"), "--shard-size", str(size),
                       "--rename", "v=txt", "-y", "-q"]
    return tmp_path / "out", runs


def export_generation(folder: Path, names: dict[str, set[str]]) -> str:
    """Which whole export the shards in ``folder`` are: every file is one export's (its
    shards and manifest, nothing else) and the shards read back as its samples."""
    from fpipe.formats import WebDatasetReader

    present = set(os.listdir(folder))
    which = next((which for which, files in names.items() if present == files), None)
    assert which is not None, f"a mix of files: {sorted(present)}"
    samples = list(WebDatasetReader(str(folder / "part-*.tar"), decode=True))
    assert [(s["key"], s["txt"]) for s in samples] == [(s["key"], s["v"]) for s in _samples(which)]
    return which


@pytest.mark.parametrize("name", ["INT", "TERM"])
def test_a_signal_at_any_step_of_export_leaves_one_whole_export(tmp_path, name, record):
    folder, runs = _export_setup(tmp_path)
    names = {}
    for which in ("new", "old"):
        assert main(runs[which]) == 0
        names[which] = set(os.listdir(folder))
    steps = counted_renames(folder, runs["new"])
    for n in range(1, steps + 1) if name == "INT" else (1, steps):
        assert main(runs["old"]) == 0
        done = run_interrupted(n, name, folder, runs["new"])
        assert done.returncode == (130 if name == "INT" else -signal.SIGTERM), (n, done.stderr)
        assert export_generation(folder, names) == "new", n
    record(f"SIG{name} at steps of 'fpipe export -y''s commit", tried=steps)


def test_ctrl_c_at_steps_of_mv_leaves_the_dataset_whole_under_one_name_or_both(tmp_path, record):
    folder = tmp_path / "out"
    folder.mkdir()
    source, target = folder / "a.msgpack", folder / "b.msgpack"
    args = ["mv", str(source), str(target), "-q"]
    write_dataset(source, _samples("old"))
    steps = counted_renames(folder, args)
    for n in range(1, steps + 1, 2):
        for path in folder.iterdir():
            path.unlink()
        write_dataset(source, _samples("old"))
        done = run_interrupted(n, "INT", folder, args)
        assert done.returncode == 130, (n, done.stderr)
        assert generation(target) == "old", n
        left = {path.name for path in folder.iterdir() if not path.name.startswith("b.msgpack")}
        assert not left or generation(source) == "old", (n, left)
        assert not left or left == {path.name for path in folder.glob("a.msgpack*")}, left
    record("SIGINT at steps of 'fpipe mv''s commit", tried=len(range(1, steps + 1, 2)))


def test_sigkill_at_any_step_of_export_is_finished_by_the_next_export(tmp_path, record, capsys):
    from fpipe.formats._foreign import ShardFiles

    folder, runs = _export_setup(tmp_path)
    names = {}
    for which in ("new", "old"):
        assert main(runs[which]) == 0
        names[which] = set(os.listdir(folder))
    pattern = str(folder / "part-%06d.tar")
    steps = counted_renames(folder, runs["new"])
    for n in range(1, steps + 1):
        assert main(runs["old"]) == 0
        done = run_interrupted(n, "KILL", folder, runs["new"])
        assert done.returncode == -signal.SIGKILL, (n, done.stderr)
        staging = [name for name in os.listdir(folder) if name.startswith(".fpipe-")]
        assert len(staging) == 1, (n, staging)
        capsys.readouterr()
        assert main(["verify", str(folder / "part-000001.tar")]) != 0
        error = capsys.readouterr().err
        assert "was killed while it renamed its shards" in error and staging[0] in error, error
        if n % 2:  # the next export to the pattern finishes the commit first, then runs
            assert main(runs["new"]) == 0, n
            notice = capsys.readouterr().err
            assert notice.count("\n") == 1 and staging[0] in notice, notice
        else:  # or anything that makes the pattern's ShardFiles
            with pytest.warns(UserWarning, match=re.escape(staging[0])):
                ShardFiles(pattern)
        assert export_generation(folder, names) == "new", n
    record("SIGKILL at each step of 'fpipe export -y''s commit", tried=steps)
