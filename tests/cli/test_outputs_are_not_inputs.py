"""An output never replaces or grows one of the command's inputs (issue 39, items 4 and 5):
``fpipe write`` onto a WebDataset, Parquet or folder input, ``--append`` into a dataset that
the source lists, ``fpipe export`` onto one of its input shards; and ``export -y`` removes only
shards that an earlier export wrote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fpipe.storage import MsgpackReader, write_parquet, write_webdataset

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
