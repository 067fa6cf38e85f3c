"""Renamed datasets: a dataset copied under another name verifies, and ``fpipe mv`` renames
every file and the names in the ``.md5``."""

import shutil
import subprocess

from fpipe.dataset import MsgpackReader
from fpipe.files import DatasetFiles

from .conftest import fails, keys, leftovers, make_dataset, ok, ok_or_failure


def test_a_dataset_copied_under_another_name_verifies(tmp_path):
    toy = make_dataset(tmp_path / "toy.msgpack", 30)
    for file in tmp_path.glob("toy.msgpack*"):
        shutil.copy(file, tmp_path / file.name.replace("toy", "train"))
    train = tmp_path / "train.msgpack"
    assert ok("verify", train) == f"{train}: ok (md5 of 6 files, index, 30 samples)\n"
    reader = MsgpackReader(train)
    assert reader.verify_data() and reader.verify_index()
    # the checksums still catch damage under the new name
    with open(DatasetFiles(train).keys, "r+b") as file:
        file.seek(3)
        file.write(b"X")
    assert "train.msgpack.keys: md5 is" in ok_or_failure(1, "verify", train, "--quick")
    assert not MsgpackReader(train).verify_index() and ok("verify", toy, "-q") == ""


def test_mv_renames_every_file_and_the_md5_entries(tmp_path):
    toy = make_dataset(tmp_path / "toy.msgpack", 25)
    (tmp_path / "toy.msgpack.classes.json").write_text('{"classes": ["a", "b", "c"]}')
    (tmp_path / "toys.msgpack").write_bytes(b"another dataset, left alone")
    expected = keys(toy)
    target = tmp_path / "sub" / "train.msgpack"
    assert ok("mv", toy, target) == f"{toy} -> {target}: 8 files\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub", "toys.msgpack"]
    assert sorted(p.name for p in target.parent.iterdir()) == [
        "train.msgpack", "train.msgpack.classes.json", "train.msgpack.filter",
        "train.msgpack.key_hashes", "train.msgpack.key_index", "train.msgpack.keys", "train.msgpack.md5",
        "train.msgpack.offsets"]
    assert keys(target) == expected and ok("verify", target, "-q") == ""
    md5 = subprocess.run(["md5sum", "-c", "train.msgpack.md5"], cwd=target.parent,
                         capture_output=True, text=True)
    assert md5.returncode == 0 and md5.stdout.count(": OK") == 6
    text = DatasetFiles(target).md5.read_text()
    assert "  train.msgpack\n" in text and "toy" not in text


def test_mv_refuses_to_replace_a_dataset_or_find_nothing(tmp_path):
    first, second = make_dataset(tmp_path / "a.msgpack", 5), make_dataset(tmp_path / "b.msgpack", 7)
    before = keys(first)
    assert "exists; pass -y/--overwrite" in fails(2, "mv", first, second)
    assert keys(first) == before and len(keys(second)) == 7
    assert "not found" in fails(2, "mv", tmp_path / "none.msgpack", second)
    assert "an output never replaces an input" in fails(2, "mv", first, first)
    ok("mv", first, second, "-y", "-q")
    assert len(keys(second)) == 5 and not first.exists() and not leftovers(tmp_path)


def test_mv_to_a_name_with_a_line_break_or_backslash_writes_an_md5_that_md5sum_checks(tmp_path):
    from fpipe.cli import main
    from fpipe.files import read_md5

    source = make_dataset(tmp_path / "toy.msgpack", 5)
    expected = keys(source)
    for name in ("two\nlines.msgpack", "back\\slash.msgpack", "carriage\rreturn.msgpack"):
        target = tmp_path / name
        assert main(["mv", str(source), str(target), "-q"]) == 0
        md5 = subprocess.run(["md5sum", "-c", DatasetFiles(target).md5.name], cwd=tmp_path,
                             capture_output=True)
        assert md5.returncode == 0 and md5.stdout.count(b": OK") == 6, (name, md5.stdout)
        assert set(read_md5(target)) == {p.name for p in DatasetFiles(target).all_files[:-1]}
        assert MsgpackReader(target).verify_data() and MsgpackReader(target).verify_index()
        assert keys(target) == expected
        source = target
