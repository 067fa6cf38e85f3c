"""Commands that find the disk full (issue 39, item 14): ``fpipe write`` (also with
``--shuffle``) and ``fpipe export`` say that the disk is full, name the output (not a staging
file that is gone), say how much they had written and how much room there is, suggest
nothing about a file that no longer exists, and leave nothing behind: no staging folder, no
partial file, no empty folder, and an existing output as it was.

The full disk is simulated where the bytes are written (the data file's writes, a shard's
writes), so the tests run anywhere; as root, the same commands also fill a real 256 KiB tmpfs.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import fpipe.dataset._indexing as indexing_module
import fpipe.dataset.writer as writer_module
import fpipe.formats.webdataset as webdataset_module
from fpipe.cli import main

from .files import file_bytes
from .test_writer_faults import _full_after

IMAGES = 60


def _inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    rng = __import__("random").Random(0)
    for i in range(IMAGES):
        (folder / f"f{i:03d}.bin").write_bytes(rng.randbytes(20_000))
    return folder


def _everything(folder: Path) -> set[str]:
    return {str(path.relative_to(folder)) for path in folder.rglob("*")}


def _check_message(message: str, target: Path) -> None:
    assert f"{target}: No space left on device" in message, message
    assert "bytes written" in message and "bytes are free there" in message, message
    assert ".fpipe-" not in message and "fpipe index" not in message, message
    assert "closed file" not in message and "Traceback" not in message, message


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("budget", [0, 100_000])
@pytest.mark.parametrize("existing", [False, True])
def test_write_to_a_full_disk(tmp_path, capsys, monkeypatch, shuffle, budget, existing):
    source = _inputs(tmp_path)
    out = tmp_path / "out" / "data.msgpack"
    out.parent.mkdir()
    if existing:
        assert main(["write", str(source), str(out), "-q"]) == 0
    before, files = _everything(tmp_path), file_bytes(out)
    monkeypatch.setattr(writer_module, "_write_all", _full_after(budget))
    status = main(["write", str(source), str(out), "-q", "-y"] + ["--shuffle"] * shuffle)
    assert status == 1
    _check_message(capsys.readouterr().err, out)
    assert _everything(tmp_path) == before, "nothing is left behind"
    assert file_bytes(out) == files, "the dataset is as it was"


@pytest.mark.parametrize("shuffle", [False, True])
def test_write_whose_index_files_fill_the_disk(tmp_path, capsys, monkeypatch, shuffle):
    """The index's staging files fill the same disk: the writer stops there, and writes
    nothing more to the index files it closed."""
    source = _inputs(tmp_path)
    out = tmp_path / "out" / "data.msgpack"
    before = _everything(tmp_path)

    real, calls = indexing_module.IndexBuilder.add, []

    def full_once(builder, *args, **kwargs):  # later writes find the files it closed
        calls.append(args)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(builder, *args, **kwargs)
    monkeypatch.setattr(indexing_module.IndexBuilder, "add", full_once)
    assert main(["write", str(source), str(out), "-q"] + ["--shuffle"] * shuffle) == 1
    _check_message(capsys.readouterr().err, out)
    assert _everything(tmp_path) == before


def _shard_full_after(budget: int):
    """A ``_TarShard.write`` for a disk with room for ``budget`` bytes of shards."""
    real = webdataset_module._TarShard.write
    left = [budget]

    def write(shard, sample: dict) -> None:
        before = shard.file.tell()
        real(shard, sample)
        shard.file.flush()
        left[0] -= shard.file.tell() - before
        if left[0] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write


@pytest.mark.parametrize("budget", [0, 300_000])
def test_export_to_a_full_disk(tmp_path, capsys, monkeypatch, budget):
    source = _inputs(tmp_path)
    dataset = tmp_path / "data.msgpack"
    assert main(["write", str(source), str(dataset), "-q"]) == 0
    before = _everything(tmp_path)
    monkeypatch.setattr(webdataset_module._TarShard, "write", _shard_full_after(budget))
    status = main(["export", str(dataset), str(tmp_path / "shards" / "p-%03d.tar"),
                   "--rename", "image=bin", "--shard-size", "10", "-q"])
    assert status == 1
    message = capsys.readouterr().err
    _check_message(message, tmp_path / "shards" / f"p-{(budget // 200_000):03d}.tar")
    assert _everything(tmp_path) == before, "no shard, no staging folder, no empty folder"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"),
                    reason="mounting a tiny tmpfs needs root")
def test_commands_that_fill_a_real_tmpfs(tmp_path, capsys):
    source = _inputs(tmp_path)
    dataset = tmp_path / "data.msgpack"
    assert main(["write", str(source), str(dataset), "-q"]) == 0
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        runs = {disk / "out.msgpack": ["write", str(source), str(disk / "out.msgpack"), "-q"],
                disk / "s" / "p-000.tar": ["export", str(dataset), str(disk / "s" / "p-%03d.tar"),
                                           "--rename", "image=bin", "-q"]}
        runs[disk / "shuffled.msgpack"] = ["write", str(source), str(disk / "shuffled.msgpack"),
                                           "--shuffle", "-q"]
        for target, args in runs.items():
            assert main(args) == 1, args
            _check_message(capsys.readouterr().err, target)
            assert os.listdir(disk) == [], (args, os.listdir(disk))
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)  # also with files held open
