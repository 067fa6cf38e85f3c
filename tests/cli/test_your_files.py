"""Every command that writes a dataset touches exactly the files of the dataset it names, as the
format lists them: with ``-y`` it replaces those and nothing else (not ``report.pdf`` beside
``report``, not ``a.msgpack.bak`` beside ``a.msgpack``), and an output is never one of the
command's inputs, however it is spelled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fpipe.cli import main
from fpipe.files import DatasetFiles

from .conftest import keys, leftovers, make_dataset, mistake

FORMAT_SUFFIXES = ["", ".offsets", ".keys", ".key_hashes", ".filter", ".key_index", ".md5"]


def run(capsys, *argv) -> str:
    """``fpipe argv`` in this process; check that it succeeds, return stdout."""
    code = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``folder`` with its bytes (None for a folder)."""
    found = {}
    for root, folders, files in os.walk(folder):
        for name in folders:
            found[os.path.relpath(os.path.join(root, name), folder)] = None
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = Path(path).read_bytes()
    return found


def bystanders(folder: Path, output: str) -> dict[str, bytes | None]:
    """Files beside dataset ``output`` that are not its files, though their names share its
    stem or begin with its name; returns what :func:`snapshot` gives for them."""
    stem = output.split(".")[0]
    names = [f"{stem}.pdf", f"{stem}.txt", f"{output}.bak", f"{output}.bak2", f"{output}.txt",
             f"{output}s", f"{output}.keys.old", f"{output}.offsets~"]
    for name in names:
        (folder / name).write_bytes(f"the user's {name}".encode())
    (folder / f"{output}.d").mkdir()
    (folder / f"{output}.d" / "inside.txt").write_text("kept")
    return {name: data for name, data in snapshot(folder).items()
            if name.split(os.sep)[0] in names + [f"{output}.d"]}


def old_dataset(folder: Path, output: str) -> None:
    """A dataset at ``output`` with every side file the format names, for -y to replace."""
    make_dataset(folder / output, 3, prefix="old")
    (folder / f"{output}.classes.json").write_text(json.dumps({"classes": {"label": ["x"]}}))
    (folder / f"{output}.index").write_bytes(b"a stale legacy index")


def inputs(folder: Path) -> dict[str, Path]:
    folder.mkdir()
    found = {"a": make_dataset(folder / "in-a.msgpack", 12, prefix="a"),
             "b": make_dataset(folder / "in-b.msgpack", 5, prefix="b")}
    (folder / "in.jsonl").write_text("".join(json.dumps({"key": f"j{i}", "x": i}) + "\n"
                                             for i in range(4)))
    return found


COMMANDS = {
    "cp": lambda i, out: ["cp", i["a"], out],
    "mv": lambda i, out: ["mv", i["a"], out],
    "write": lambda i, out: ["write", i["a"].parent / "in.jsonl", out],
    # --shuffle deals its entries into a bucket folder beside OUT, which goes at the end
    "write --shuffle": lambda i, out: ["write", i["a"].parent / "in.jsonl", out, "--shuffle"],
    "merge": lambda i, out: ["merge", i["a"], i["b"], out],
    "split": lambda i, out: ["split", i["a"], "--counts", "4", "-o", out, out.parent / "rest.msgpack"],
    "shuffle": lambda i, out: ["shuffle", i["a"], out],
    "sample": lambda i, out: ["sample", i["a"], out, "3"],
}


@pytest.mark.parametrize("output", ["report", "a.msgpack"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_overwrite_replaces_the_dataset_and_nothing_beside_it(tmp_path, capsys, command, output):
    given = inputs(tmp_path / "in")
    folder = tmp_path / "out"
    folder.mkdir()
    old_dataset(folder, output)
    kept = bystanders(folder, output)
    target = folder / output
    assert "exists; pass -y/--overwrite" in mistake(capsys, 2, *COMMANDS[command](given, target))
    run(capsys, *COMMANDS[command](given, target), "-y", "-q")
    after = snapshot(folder)
    assert {name: after.get(name) for name in kept} == kept
    # the old dataset's .classes.json and .index are gone: the new one has none
    written = sorted(set(after) - set(kept) - {"rest.msgpack" + s for s in FORMAT_SUFFIXES})
    assert written == sorted(output + suffix for suffix in FORMAT_SUFFIXES)
    assert not keys(target)[0].startswith("old") and leftovers(folder) == []


def test_a_stale_side_file_goes_and_a_copied_one_replaces_it(tmp_path, capsys):
    source = make_dataset(tmp_path / "a.msgpack", 4)
    (tmp_path / "a.msgpack.classes.json").write_text(json.dumps({"classes": {"label": ["n"]}}))
    old_dataset(tmp_path, "b.msgpack")
    run(capsys, "cp", source, tmp_path / "b.msgpack", "-y")
    assert (tmp_path / "b.msgpack.classes.json").read_text() == \
        (tmp_path / "a.msgpack.classes.json").read_text()
    assert not (tmp_path / "b.msgpack.index").exists() and keys(tmp_path / "b.msgpack") == keys(source)


def test_a_name_is_the_data_file_it_names(tmp_path, capsys):
    """``b`` is the dataset whose data file is ``b``: ``b.msgpack`` beside it is another one."""
    source = make_dataset(tmp_path / "a.msgpack", 4)
    other = make_dataset(tmp_path / "b.msgpack", 2, prefix="b")
    before = snapshot(tmp_path)
    run(capsys, "cp", source, tmp_path / "b")
    assert keys(tmp_path / "b") == keys(source) and keys(other) == ["b0000", "b0001"]
    assert {name: snapshot(tmp_path)[name] for name in before} == before
    assert sorted(set(snapshot(tmp_path)) - set(before)) == sorted("b" + s for s in FORMAT_SUFFIXES)


def test_a_lone_side_file_is_a_dataset_file_that_needs_overwrite(tmp_path, capsys):
    source = make_dataset(tmp_path / "a.msgpack", 4)
    (tmp_path / "b.msgpack.md5").write_text("mine")
    message = mistake(capsys, 2, "cp", source, tmp_path / "b.msgpack")
    assert "b.msgpack.md5 (a file of dataset" in message and "pass -y/--overwrite" in message
    assert (tmp_path / "b.msgpack.md5").read_text() == "mine"


def test_a_folder_where_a_dataset_file_belongs_is_left_alone(tmp_path, capsys):
    source = make_dataset(tmp_path / "a.msgpack", 4)
    make_dataset(tmp_path / "b.msgpack", 2)
    (tmp_path / "b.msgpack.offsets").unlink()
    (tmp_path / "b.msgpack.offsets").mkdir()
    (tmp_path / "b.msgpack.offsets" / "mine.txt").write_text("kept")
    before = snapshot(tmp_path)
    assert "is a folder" in mistake(capsys, 2, "cp", source, tmp_path / "b.msgpack", "-y")
    assert snapshot(tmp_path) == before


def spellings(source: Path) -> dict[str, Path]:
    """Other names of ``source``'s files: another path, a symlink, a hard link, and a side file
    of it (which as a data file name would be replaced)."""
    folder = source.parent
    (folder / "linked").mkdir()
    os.symlink(source, folder / "linked" / "symlink.msgpack")
    os.link(source, folder / "linked" / "hardlink.msgpack")
    os.symlink(folder, folder / "linked" / "same-folder")
    return {"itself": source, "dot": folder / "." / source.name,
            "parent": folder / "linked" / ".." / source.name,
            "symlink": folder / "linked" / "symlink.msgpack",
            "hardlink": folder / "linked" / "hardlink.msgpack",
            "folder symlink": folder / "linked" / "same-folder" / source.name,
            "side file": DatasetFiles(source).keys}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_is_never_an_input(tmp_path, capsys, command):
    given = inputs(tmp_path / "in")
    if command.startswith("write"):  # its input is a JSON lines file, which has no side files
        names = spellings(given["a"].parent / "in.jsonl")
        del names["side file"]
    else:
        names = spellings(given["a"])
    for name, target in names.items():
        before = snapshot(tmp_path)
        argv = COMMANDS[command](given, target)
        for overwrite in ((), ("-y",)):
            message = mistake(capsys, 2, *argv, *overwrite)
            assert "an output never replaces an input" in message, (name, message)
        assert snapshot(tmp_path) == before, name


def test_write_keeps_notes_beside_its_output(tmp_path, capsys):
    (tmp_path / "x.jsonl").write_text('{"key": "k", "n": 1}\n')
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "notes.pdf").write_bytes(b"%PDF")
    run(capsys, "write", tmp_path / "x.jsonl", tmp_path / "notes", "-q")
    run(capsys, "write", tmp_path / "x.jsonl", tmp_path / "notes", "-y", "-q")
    assert (tmp_path / "notes.txt").read_text() == "my notes"
    assert (tmp_path / "notes.pdf").read_bytes() == b"%PDF" and keys(tmp_path / "notes") == ["k"]


@pytest.mark.parametrize("options", [[], ["--dry-run"], ["-y"]])
def test_index_rebuilding_touches_nothing_beside_the_dataset(tmp_path, capsys, options):
    folder = tmp_path / "data"
    folder.mkdir()
    path = make_dataset(folder / "killed.msgpack", 30)
    for index_file in DatasetFiles(path).index_files:
        index_file.unlink()  # the writer was killed before it wrote the index
    with open(path, "r+b") as file:
        file.truncate(path.stat().st_size - 7)  # and in the middle of its last sample
    kept = bystanders(folder, "killed.msgpack")
    run(capsys, "index", path, *options)
    after = snapshot(folder)
    assert {name: after.get(name) for name in kept} == kept
    assert leftovers(folder) == []
