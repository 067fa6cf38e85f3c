"""An output never replaces or grows one of the command's inputs (issue 39, items 4 and 5):
``fpipe write`` onto a WebDataset, Parquet or folder input, ``--append`` into a dataset that
the source lists, ``fpipe export`` onto one of its input shards; and ``export -y`` removes only
shards that an earlier export wrote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fpipe.cli import main
from fpipe.dataset import MsgpackReader
from fpipe.formats import write_parquet, write_webdataset

from .conftest import make_dataset, mistake

SAMPLES = [{"key": f"s{i}", "txt": f"text {i}"} for i in range(3)]


def _contents(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


@pytest.mark.parametrize("kind", ["tar", "parquet"])
@pytest.mark.parametrize("spelling", ["./{}", "{}", "sub/../{}"])
def test_write_refuses_to_replace_a_foreign_input(tmp_path, capsys, monkeypatch, kind, spelling):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    name = f"shard.{kind}"
    write = write_webdataset if kind == "tar" else write_parquet
    os.replace(write(SAMPLES, f"shard-%d.{kind}")[0], name)
    before = _contents(tmp_path)
    message = mistake(capsys, 2, "write", name, spelling.format(name), "-y")
    assert "an output never replaces an input" in message and name in message
    assert _contents(tmp_path) == before, "nothing written, nothing removed"


def test_write_refuses_to_replace_a_hard_link_of_a_foreign_input(tmp_path, capsys):
    shard = write_webdataset(SAMPLES, tmp_path / "shard-%d.tar")[0]
    os.link(shard, tmp_path / "other.tar")
    before = _contents(tmp_path)
    assert "an output never replaces an input" in mistake(capsys, 2, "write", shard,
                                                          tmp_path / "other.tar", "-y")
    assert _contents(tmp_path) == before


def test_append_refuses_a_dataset_that_the_source_folder_lists(tmp_path, capsys):
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(3):
        (folder / f"note{i}.txt").write_text(f"note {i}")
    dataset = make_dataset(folder / "out.msgpack", 4)
    before = _contents(folder)
    message = mistake(capsys, 2, "write", folder, dataset, "--append")
    assert "an output never replaces an input" in message and "out.msgpack" in message
    assert _contents(folder) == before
    assert len(MsgpackReader(dataset)) == 4


def test_append_refuses_a_foreign_input_as_its_output(tmp_path, capsys):
    shard = Path(write_webdataset(SAMPLES, tmp_path / "shard-%d.tar")[0])
    before = _contents(tmp_path)
    assert "an output never replaces an input" in mistake(capsys, 2, "write", shard, shard,
                                                          "--append")
    assert _contents(tmp_path) == before


def _shards(folder: Path, count: int, prefix: str = "s") -> list[str]:
    samples = [{"key": f"{prefix}{i}", "txt": f"text {i}"} for i in range(count)]
    return write_webdataset(samples, folder / "shard-%06d.tar", shard_size=1)


def test_export_refuses_a_pattern_that_names_one_of_its_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _shards(tmp_path, 3)
    before = _contents(tmp_path)
    message = mistake(capsys, 2, "export", "shard-000000.tar", "shard-%06d.tar", "-y")
    assert "an output never replaces an input" in message and "shard-000000.tar" in message
    assert _contents(tmp_path) == before, "the input and the other shards are as they were"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".fpipe-")] == []


def test_export_removes_only_the_shards_an_earlier_export_lists(tmp_path, capsys):
    """Shards past the new ones go only if the earlier export's manifest lists them, as it
    wrote them; the others stay, named in a warning."""
    dataset = make_dataset(tmp_path / "train.msgpack", 4)
    pattern = tmp_path / "out" / "t-%02d.tar"
    args = ["export", dataset, pattern, "--rename", "data=bin", "--rename", "label=cls", "-y"]
    assert main([str(a) for a in args + ["--shard-size", "1"]]) == 0  # 4 shards, listed
    by_hand = tmp_path / "out" / "t-04.tar"
    by_hand.write_bytes(b"not from an export")
    changed = tmp_path / "out" / "t-03.tar"
    changed.write_bytes(b"changed since the export")
    capsys.readouterr()
    assert main([str(a) for a in args + ["--shard-size", "2"]]) == 0
    err = capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".t-%02d.tar.shards.json", "t-00.tar", "t-01.tar", "t-03.tar", "t-04.tar"]
    assert by_hand.read_bytes() == b"not from an export"
    assert changed.read_bytes() == b"changed since the export"
    assert "t-03.tar" in err and "t-04.tar" in err and "left as they are" in err


def test_export_without_a_manifest_removes_nothing(tmp_path, capsys, monkeypatch):
    """Shards from before manifests (or made by hand) are not known to be an export's."""
    monkeypatch.chdir(tmp_path)
    _shards(tmp_path, 3, prefix="old")
    (tmp_path / ".shard-%06d.tar.shards.json").unlink(missing_ok=True)  # none before manifests
    make_dataset(tmp_path / "train.msgpack", 2)
    assert main(["export", "train.msgpack", "shard-%06d.tar", "--shard-size", "1",
                 "--rename", "data=bin", "--rename", "label=cls", "-y"]) == 0
    assert "shard-000002.tar" in capsys.readouterr().err
    assert (tmp_path / "shard-000002.tar").exists()
