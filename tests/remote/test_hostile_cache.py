"""The block cache among things it did not make: files and folders of the user's, look-alikes,
links, entries of another user, blocks truncated or rewritten on disk, temporaries of killed
readers. It reads only what it made and can recognise, removes nothing else, and never kills
the process."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path

import msgpack
import pytest

from fpipe.errors import FormatError
from fpipe.orderings import Shuffler
from fpipe.remote import cache as blocks_module

from .conftest import BLOCK, N, sample
from .test_http import block_files, reader

ROOT = Path(__file__).resolve().parents[2]
OTHER_UID = 65534  # nobody


def dataset_folder(cache: Path) -> Path:
    (folder,) = [p for p in cache.iterdir() if (p / ".complete").exists()]
    return folder


def plant(path: Path, data: bytes, mode: int = 0o600) -> bytes:
    path.write_bytes(data)
    path.chmod(mode)
    return data


def test_eviction_removes_only_blocks_of_the_cache(http, cache):
    """Files of the user's in folders that look like the cache's (even named like its dataset
    folders, or like blocks) survive evictions, and a folder among them breaks nothing."""
    mine = cache / "myproject" / "blocks"
    mine.mkdir(parents=True)
    kept = {mine / "0": plant(mine / "0", b"x" * 4000), mine / "notes.txt": plant(mine / "notes.txt", b"n")}
    (mine / "1").mkdir()
    look_alike = cache / ("ab" * 16) / "blocks"  # a dataset folder's name, but no marker
    look_alike.mkdir(parents=True)
    kept[look_alike / "2"] = plant(look_alike / "2", b"y" * 4000)
    remote = reader(http, cache, cache_bytes=3 * BLOCK)
    assert sorted(s["key"] for s in Shuffler(remote, seed=4)) == [sample(i)["key"] for i in range(N)]
    assert all(path.read_bytes() == data for path, data in kept.items())
    assert (mine / "1").is_dir()
    assert int((cache / ".usage").read_text()) <= 3 * BLOCK


def test_entries_in_the_place_of_blocks_are_left_alone_and_read_around(http, cache, tmp_path):
    remote = reader(http, cache, read_ahead=0)
    assert remote.get(0) == sample(0)
    blocks = dataset_folder(cache) / "blocks"
    (blocks / "3").mkdir()
    (blocks / "4").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_bytes(b"z" * 100)
    os.mkfifo(blocks / "5")
    fresh = reader(http, cache, read_ahead=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(fresh.iter()) == [sample(i) for i in range(N)]
    warned = " ".join(str(w.message) for w in caught)
    assert all(f"{blocks / name}'" in warned for name in "345"), warned
    assert (blocks / "3").is_dir() and (blocks / "4").is_symlink() and stat.S_ISFIFO(
        os.lstat(blocks / "5").st_mode)
    assert (tmp_path / "elsewhere").read_bytes() == b"z" * 100


def _truncating_script(url: str, cache: Path) -> str:
    return f"""
import os, sys
from pathlib import Path
from fpipe.dataset import MsgpackReader
from fpipe.remote import RemoteOptions
from tests.remote.conftest import BLOCK, sample
reader = MsgpackReader({url!r}, remote=RemoteOptions(cache_dir={str(cache)!r}, block_size=BLOCK,
                                                     read_ahead=0))
assert reader.get(0) == sample(0)
(block,) = Path({str(cache)!r}).glob("*/blocks/0")
os.truncate(block, 100)
assert reader.get(60) == sample(60), "wrong sample"  # in block 0, past its first page
again = MsgpackReader({url!r}, remote=RemoteOptions(cache_dir={str(cache)!r}))
assert reader.get(1, raw=True) == again.get(1, raw=True)
print("read on")
"""


def test_a_block_truncated_under_the_reader_is_fetched_again_not_a_crash(http, cache):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-c", _truncating_script(http.url("train.msgpack"), cache)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])  # SIGBUS: -7
    assert "read on" in result.stdout


def _after_a_clock_tick(path: Path, probe: Path) -> None:
    """Wait until a file written now gets a later modification time than ``path`` has (file
    times advance in ticks of a few milliseconds)."""
    while True:
        probe.write_bytes(b"")
        if probe.stat().st_mtime_ns > path.stat().st_mtime_ns:
            return


def test_a_block_rewritten_under_the_reader_never_gives_a_wrong_sample(http, served, cache, tmp_path):
    remote = reader(http, cache, read_ahead=0)
    assert remote.get(0) == sample(0)
    (block,) = dataset_folder(cache).glob("blocks/0")
    _after_a_clock_tick(block, tmp_path / "probe")
    first, second = msgpack.packb(sample(1)), msgpack.packb(sample(2))
    data = block.read_bytes()
    start = data.index(first)
    with open(block, "r+b") as file:  # in place, the same length: sample 1 now reads as 2
        file.seek(start)
        file.write(second)
    before = http.faults.ranged_gets
    assert remote.get(1) == sample(1)
    assert http.faults.ranged_gets == before + 1  # the damaged block was fetched again
    assert remote.get(2) == sample(2)


def test_a_block_that_keeps_changing_is_a_format_error_naming_the_url_and_block(http, cache,
                                                                             monkeypatch):
    remote = reader(http, cache, read_ahead=0)
    assert remote.get(0) == sample(0)
    changes = itertools.count()  # a new modification time at every look
    monkeypatch.setattr(blocks_module, "_identity",
                        lambda stat: (stat.st_size, next(changes), stat.st_ino))
    with pytest.raises(FormatError, match=r"train\.msgpack: .*cached block 0 .*changed on disk"):
        remote.get(1)


def test_what_the_cache_makes_is_private(http, cache):
    old = os.umask(0o022)
    try:
        assert reader(http, cache).get(N - 1) == sample(N - 1)
    finally:
        os.umask(old)
    made = [cache, *cache.rglob("*")]
    folders = [p for p in made if p.is_dir()]
    files = [p for p in made if p.is_file()]
    assert len(folders) == 3 and len(files) > 10
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in folders} == {"0o700"}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o600"}


def test_a_cache_folder_of_another_user_or_open_to_others_is_refused(http, cache):
    cache.mkdir()
    os.chown(cache, OTHER_UID, -1)
    with pytest.raises(PermissionError, match=f"owned by uid {OTHER_UID}"):
        reader(http, cache)
    os.chown(cache, os.geteuid(), -1)
    cache.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by others"):
        reader(http, cache)
    assert list(cache.iterdir()) == []


def test_a_dataset_folder_of_another_user_is_refused(http, cache):
    reader(http, cache).get(0)
    folder = dataset_folder(cache)
    os.chown(folder, OTHER_UID, -1)
    with pytest.raises(PermissionError, match=f"not fpipe's cache .*uid {OTHER_UID}") as caught:
        reader(http, cache)
    assert caught.value.filename == str(folder)


def test_a_block_planted_by_another_user_is_never_read(http, cache):
    """A block with a correct CRC but other labels, owned by another user, is ignored (with
    a warning) and left alone: the samples come from the server."""
    reader(http, cache, read_ahead=0).get(0)
    (block,) = dataset_folder(cache).glob("blocks/0")
    body = block.read_bytes()[:-4].replace(msgpack.packb(sample(0)), msgpack.packb({**sample(0), "label": 7}))
    block.unlink()
    planted = plant(block, body + zlib.crc32(body).to_bytes(4, "big"), 0o644)
    os.chown(block, OTHER_UID, -1)
    with pytest.warns(RuntimeWarning, match=f"owned by uid {OTHER_UID}"):
        assert reader(http, cache, read_ahead=0).get(0) == sample(0)
    assert block.read_bytes() == planted and block.stat().st_uid == OTHER_UID


def test_stale_temporaries_are_swept_and_fresh_ones_kept(http, cache):
    reader(http, cache).get(0)
    folder = dataset_folder(cache)
    gone = _pid_not_running()
    old = time.time() - 2 * 3600
    doomed = [folder / "blocks" / f".7.{os.getpid()}.1.tmp",  # older than any write lasts
              folder / "blocks" / f".8.{gone}.2.tmp",  # its writer is gone
              folder / f".train.msgpack.keys.{gone}.3.tmp",
              cache / f".usage.{gone}.4.tmp"]
    kept = [folder / "blocks" / f".9.{os.getpid()}.5.tmp",  # being written
            # not the cache's names
            folder / "blocks" / ".notes.tmp", folder / "blocks" / f".notes.{gone}.6.tmp",
            cache / "notes.12.34.tmp", cache / f".report.{gone}.7.tmp"]
    for path in doomed + kept:
        plant(path, b"t" * 1000)
    for path in doomed:
        os.utime(path, (old, old) if path.name.startswith(".7.") else (time.time() - 120,) * 2)
    for path in kept[1:]:
        os.utime(path, (old, old))
    assert reader(http, cache).get(N - 1) == sample(N - 1)
    assert [p for p in doomed if p.exists()] == []
    assert all(p.exists() for p in kept)


def _pid_not_running() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        pid -= 1


def test_lock_files_do_not_pile_up_one_per_block(http, cache):
    remote = reader(http, cache, block_size=1024)
    assert [s["key"] for s in remote.iter()] == [sample(i)["key"] for i in range(N)]
    assert len(block_files(cache)) > 100
    locks = [p for p in cache.rglob("*") if "lock" in p.name]
    assert len(locks) <= 20, sorted(p.name for p in locks)[:30]
