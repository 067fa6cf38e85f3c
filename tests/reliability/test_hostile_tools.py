"""Hostile side files against the tools, not only the readers: malformed ``.keys`` and
``.classes.json``, ``.md5`` entries that name other files, and side files that are FIFOs,
devices or folders.

Each command ends in bounded time with one line on stderr that names the file, and exit
status 1 (data) or 2 (usage) — never a traceback, never a hang, never a read of a file that is
not the dataset's own. The library raises :class:`~fpipe.errors.FormatError` naming the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from fpipe.cli import main
from fpipe.dataset import FileWriter, MsgpackReader, read_classes, read_keys
from fpipe.errors import FormatError
from fpipe.files import DatasetFiles
from fpipe.sets import load_classes

from .files import KEY_INDEX_LEFT_ASIDE

pytestmark = [pytest.mark.timeout(600), KEY_INDEX_LEFT_ASIDE]

ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def dataset(folder: Path, name: str = "d.msgpack", n: int = 3) -> Path:
    path = folder / name
    with FileWriter(path) as writer:
        for i in range(n):
            writer.write({"key": f"{name[0]}{i}", "label": i % 2})
    return path


def one_line_error(capsys, status: int, *argv) -> str:
    """Run ``fpipe argv`` in this process; it returns ``status`` with one line on stderr."""
    try:
        code = main([str(arg) for arg in argv])
    except SystemExit as exit:
        code = exit.code
    err = capsys.readouterr().err
    assert code == status, (argv, code, err)
    assert len(err.strip().splitlines()) == 1, err
    return err


def bounded(*argv, timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m fpipe argv`` in a subprocess that must end within ``timeout`` seconds."""
    try:
        return subprocess.run([sys.executable, "-m", "fpipe", *map(str, argv)],
                              capture_output=True, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"fpipe {' '.join(map(str, argv))} hung") from None


RUN_ALL = """
import contextlib, io, json, sys
from fpipe.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    results.append([status, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def bounded_all(commands: list[list], timeout: float = 120) -> list[tuple[int, str, str]]:
    """``(status, stdout, stderr)`` of each command, run one after the other by ``fpipe.cli.main``
    in one subprocess that must end within ``timeout`` seconds."""
    argvs = json.dumps([[str(arg) for arg in argv] for argv in commands])
    try:
        result = subprocess.run([sys.executable, "-c", RUN_ALL, argvs], capture_output=True,
                                text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"one of {commands} hung") from None
    assert result.returncode == 0, result.stderr
    return [tuple(row) for row in json.loads(result.stdout)]


# --- .keys ---------------------------------------------------------------------------------

BAD_KEYS = {
    "bin keys": msgpack.packb([b"d0", b"d1", b"d2"], use_bin_type=True),
    "one bin key": msgpack.packb(["d0", b"d1", "d2"], use_bin_type=True),
    "mixed types": msgpack.packb(["k0", 1, None], use_bin_type=True),
    "nested": msgpack.packb(["k0", ["k1"], {"k": 2}], use_bin_type=True),
    "empty list": msgpack.packb([]),
    "too few": msgpack.packb(["k0"]),
    "a map": msgpack.packb({"k0": 0}),
    "a number": msgpack.packb(5),
    "a string": msgpack.packb("k0"),
    "not msgpack": b"\xc1\xc1",
    "empty file": b"",
    "invalid UTF-8": msgpack.packb([b"d\xff", "d1", "d2"], use_bin_type=False),
}

KEY_COMMANDS = [("info",), ("cat", "--keys"), ("verify",), ("merge", "OTHER", "OUT")]


@pytest.mark.parametrize("content", sorted(BAD_KEYS))
def test_malformed_keys_give_one_line_naming_the_file(tmp_path, capsys, content):
    path = dataset(tmp_path)
    other = dataset(tmp_path, "other.msgpack")
    keys_file = DatasetFiles(path).keys
    keys_file.write_bytes(BAD_KEYS[content])
    for command in KEY_COMMANDS:
        argv = [{"OTHER": other, "OUT": tmp_path / "out.msgpack"}.get(a, a) for a in command]
        argv.insert(1, path)
        if command[0] == "verify":  # problems are listed, one per line, and the status is 1
            result = bounded(*argv)
            assert result.returncode == 1 and "Traceback" not in result.stderr, result
            assert "d.msgpack.keys" in result.stdout, result.stdout
            continue
        assert keys_file.name in one_line_error(capsys, 1, *argv), (content, command)
    assert not (tmp_path / "out.msgpack").exists()


@pytest.mark.parametrize("content", sorted(BAD_KEYS))
def test_malformed_keys_raise_format_error_in_the_library(tmp_path, content):
    path = dataset(tmp_path)
    DatasetFiles(path).keys.write_bytes(BAD_KEYS[content])
    reader = MsgpackReader(path)
    for read in (lambda: reader.find_key(0), lambda: list(reader.iter(yield_key=True))):
        with pytest.raises(FormatError, match="d.msgpack.keys"):
            read()
    if content not in ("empty list", "too few"):  # the count is a reader's check
        with pytest.raises(FormatError, match="d.msgpack.keys"):
            read_keys(path)


# --- .classes.json -------------------------------------------------------------------------

BAD_CLASSES = {
    "a list of numbers": "[1, 2]",
    "a list of names": '["cat", "dog"]',
    "a number": "7",
    "null": "null",
    "no classes": '{"dataset": "x"}',
    "classes a list": '{"classes": ["cat", "dog"]}',
    "names numbers": '{"classes": {"label": [1, 2]}}',
    "names nested": '{"classes": {"label": [["cat"], {"dog": 1}]}}',
    "names a map": '{"classes": {"label": {"0": "cat"}}}',
    "not JSON": '{"classes": ',
    "not UTF-8": b'{"classes": {"label": ["\xff"]}}',
    "empty": "",
}


def _put_classes(path: Path, content) -> Path:
    file = DatasetFiles(path).classes
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content)
    return file


@pytest.mark.parametrize("content", sorted(BAD_CLASSES))
def test_malformed_classes_give_one_line_naming_the_file(tmp_path, capsys, content):
    path = dataset(tmp_path)
    file = _put_classes(path, BAD_CLASSES[content])
    (tmp_path / "more.jsonl").write_text('{"key": "new", "label": "cat"}\n')
    for argv in (["info", path], ["shuffle", path, tmp_path / "out.msgpack"],
                 ["merge", path, dataset(tmp_path, "other.msgpack"), tmp_path / "out.msgpack"],
                 ["write", tmp_path / "more.jsonl", path, "--append"]):
        assert file.name in one_line_error(capsys, 1, *argv), (content, argv)
    assert not (tmp_path / "out.msgpack").exists() and len(MsgpackReader(path)) == 3
    for read in (read_classes, load_classes):
        with pytest.raises(FormatError, match="d.msgpack.classes.json"):
            read(path)


# --- .md5 entries --------------------------------------------------------------------------


def _md5_entry(path: Path, name: str) -> None:
    with open(DatasetFiles(path).md5, "a", encoding="utf-8") as file:
        file.write(f"d41d8cd98f00b204e9800998ecf8427e  {name}\n")


def test_verify_reads_only_the_datasets_own_regular_files(tmp_path):
    """Entries that name files outside the dataset are reported and never opened; the
    dataset's own names that are a FIFO, a device or a folder are reported without a read."""
    (tmp_path / "secret.txt").write_text("not the dataset's")
    named = {"../../etc/hostname": "not a file of this dataset",
             "/etc/hostname": "not a file of this dataset",
             "secret.txt": "not a file of this dataset",
             "other.msgpack": "not a file of this dataset",
             "d.msgpack.classes.json": "not a regular file but a FIFO",
             "d.msgpack.index": "not a regular file but a device"}
    path = dataset(tmp_path)
    dataset(tmp_path, "other.msgpack")
    os.mkfifo(DatasetFiles(path).classes)
    os.symlink("/dev/zero", DatasetFiles(path).legacy_index)
    for name in named:
        _md5_entry(path, name)
    result = bounded("verify", path)
    assert result.returncode == 1 and not result.stderr, result
    for name, problem in named.items():
        line = next(line for line in result.stdout.splitlines() if name in line)
        assert problem in line, line
    assert f"{len(named)} problem(s)" in result.stdout


@pytest.mark.parametrize("suffix", [".keys", ".key_hashes", ".filter", ".md5", ".classes.json"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "folder"])
def test_side_files_that_are_not_regular_files_never_hang_a_command(tmp_path, suffix, kind):
    path = dataset(tmp_path)
    side = path.with_name(path.name + suffix)
    side.unlink(missing_ok=True)
    {"fifo": os.mkfifo, "folder": os.mkdir,
     "/dev/zero": lambda p: os.symlink("/dev/zero", p)}[kind](side)
    commands = [["verify", path], ["info", path], ["cat", path, "--keys"],
                ["shuffle", path, tmp_path / "out.msgpack"], ["cp", path, tmp_path / "copy"],
                ["mv", path, tmp_path / "moved"]]
    for argv, (status, out, err) in zip(commands, bounded_all(commands)):
        assert "Traceback" not in err and len(err.splitlines()) <= 1, (argv, err)
        if status:
            assert side.name in out + err, (argv, status, out, err)


# --- folders -------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["verify", "index", "cat", "info", "shuffle", "cp", "mv"])
def test_a_folder_given_as_a_dataset_is_called_a_folder(tmp_path, capsys, command):
    (tmp_path / "sets").mkdir()
    dataset(tmp_path / "sets", "train.msgpack")
    dataset(tmp_path / "sets", "val.msgpack")
    argv = [command, tmp_path / "sets"] + ([tmp_path / "x.msgpack"] * (command in ("shuffle", "cp", "mv")))
    message = one_line_error(capsys, 2, *argv)
    assert "is a folder, not a dataset (it holds train.msgpack, val.msgpack)" in message
    assert "not found" not in message
