"""``fpipe verify`` and ``fpipe index``: finding damage, recovering a cut data file, legacy indexes."""

import msgpack
import pytest

from fpipe.cli import main
from fpipe.dataset import MsgpackReader, pack_sample, read_offsets
from fpipe.files import DatasetFiles

from .conftest import fails, keys, leftovers, make_dataset, ok, ok_or_failure


def test_verify_passes_a_good_dataset_and_names_the_damage_in_a_bad_one(tmp_path):
    good = make_dataset(tmp_path / "good.msgpack", 40)
    assert ok("verify", good) == f"{good}: ok (md5 of 6 files, index, 40 samples)\n"
    assert ok("verify", good, "-q", "--quick") == ""
    bad = make_dataset(tmp_path / "bad.msgpack", 40)
    offsets = read_offsets(bad)
    with open(bad, "r+b") as file:  # sample 7 becomes two messages: its map header shrinks
        file.seek(int(offsets[7]))
        file.write(b"\x81")
    result = ok_or_failure(1, "verify", good, bad)
    assert f"{good}: ok" in result
    assert f"{bad}: 2 problem(s)" in result
    assert "bad.msgpack: md5 is " in result
    assert f"{bad}: sample 7 at byte {offsets[7]}: corrupt sample" in result
    quick = ok_or_failure(1, "verify", bad, "--quick")
    assert "1 problem(s)" in quick and "corrupt sample" not in quick
    assert f"{bad}: sample 7 at byte {offsets[7]}: corrupt sample" in fails(1, "cat", bad)


def test_verify_reports_a_truncated_file_and_points_to_index(tmp_path):
    path = make_dataset(tmp_path / "cut.msgpack", 20)
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size - 5)
    report = ok_or_failure(1, "verify", path)
    assert f"data file is truncated: the index ends at byte {size}, the file has {size - 5} bytes" in report
    assert "hint: 'fpipe index DATASET' rebuilds the index" in report
    assert "not found" in fails(2, "verify", tmp_path / "nothing.msgpack")


def test_index_recovers_a_data_file_cut_mid_sample(tmp_path):
    path = make_dataset(tmp_path / "killed.msgpack", 30)
    offsets = read_offsets(path)
    for index_file in (*DatasetFiles(path).index_files, DatasetFiles(path).md5):
        index_file.unlink()  # the writer was killed before it wrote the index
    with open(path, "r+b") as file:
        file.truncate(int(offsets[21]) + 9)  # in the middle of sample 21
    data = path.read_bytes()
    dry = ok("index", path, "--dry-run")
    assert "would index 21 samples" in dry and "would cut off 9 bytes" in dry
    assert path.read_bytes() == data and not DatasetFiles(path).offsets.exists()
    assert f"cut off 9 bytes of an incomplete sample at byte {offsets[21]} (kept them as " \
           f"{path}.incomplete)" in ok("index", path)
    assert (tmp_path / "killed.msgpack.incomplete").read_bytes() == data[offsets[21]:]
    assert keys(path) == [f"s{i:04d}" for i in range(21)]
    assert path.stat().st_size == offsets[21]
    assert ok("verify", path).startswith(f"{path}: ok")
    assert leftovers(tmp_path) == []


def test_index_converts_a_legacy_index(tmp_path):
    path = make_dataset(tmp_path / "old.msgpack", 12)
    offsets = read_offsets(path).tolist()
    legacy = {key: offset for key, offset in zip(keys(path), offsets)}
    files = DatasetFiles(path)
    for index_file in (*files.index_files, files.md5):
        index_file.unlink()
    files.legacy_index.write_bytes(msgpack.packb(legacy))
    assert "converted the legacy index (12 samples)" in ok("index", path)
    assert read_offsets(path).tolist() == offsets
    with MsgpackReader(path) as reader:
        assert reader.find_index("s0005") == 5 and "s0011" in reader
    assert ok("verify", path).startswith(f"{path}: ok")


def test_index_refuses_samples_without_keys_and_changes_nothing(tmp_path):
    path = tmp_path / "nokeys.msgpack"
    path.write_bytes(msgpack.packb({"key": "a"}) + msgpack.packb({"value": 1}))
    message = fails(1, "index", path)
    assert "the first at bytes 7-15" in message and "not a map with a str \"key\"" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nokeys.msgpack"]
    assert "not found" in fails(2, "index", tmp_path / "none.msgpack")


def _one_byte_changed(path, n: int, hit: int):
    """Dataset ``path`` of ``n`` samples with one byte of sample ``hit`` changed (its map
    header: no msgpack message begins with 0xc1); the samples' bytes as written."""
    make_dataset(path, n)
    offsets = read_offsets(path).tolist()
    data = path.read_bytes()
    spans = [data[a:b] for a, b in zip(offsets, offsets[1:])]
    with open(path, "r+b") as file:
        file.seek(offsets[hit])
        file.write(b"\xc1")
    return spans


def _everything(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def run(capsys, status: int, *argv) -> tuple[str, str]:
    """``fpipe argv`` in this process: it returns ``status``, with at most one line on stderr;
    its stdout and stderr."""
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    assert code == status and len(err.splitlines()) <= 1, (code, out, err)
    return out, err


@pytest.mark.parametrize("n, hit", [(1000, 10), (212, 100), (50, 0), (50, 49), (3, 1)])
def test_index_keeps_every_intact_sample_and_drops_damage_only_when_asked(tmp_path, capsys, n,
                                                                          hit):
    path = tmp_path / "hurt.msgpack"
    spans = _one_byte_changed(path, n, hit)
    before = _everything(tmp_path)
    dry, _ = run(capsys, 0, "index", path, "--dry-run")
    assert f"would index {n - 1} samples" in dry and "would drop 1 damaged region(s)" in dry
    assert f"damaged: bytes {sum(map(len, spans[:hit]))}-" in dry
    _, message = run(capsys, 1, "index", path)
    assert f"{path}: 1 damaged region ({len(spans[hit])} bytes)" in message
    assert f"keeps the {n - 1} intact samples and the original as {path}.damaged" in message
    assert _everything(tmp_path) == before, "a refused rebuild changed a file"
    done, _ = run(capsys, 0, "index", path, "-y")
    assert f"dropped 1 damaged region(s), {len(spans[hit])} bytes" in done
    with MsgpackReader(path) as reader:
        assert list(reader.iter(raw=True)) == spans[:hit] + spans[hit + 1:]
    assert (tmp_path / "hurt.msgpack.damaged").read_bytes() == before["hurt.msgpack"]
    assert run(capsys, 0, "verify", path)[0].startswith(f"{path}: ok")
    assert leftovers(tmp_path) == []


def test_index_errors_name_the_users_file_not_a_staging_copy(tmp_path):
    path = tmp_path / "twice.msgpack"
    path.write_bytes(msgpack.packb({"key": "a"}) + msgpack.packb({"key": "b"})
                     + msgpack.packb({"key": "a"}))
    for dry in ((), ("--dry-run",)):
        message = fails(1, "index", path, *dry)
        assert f"{path}: sample 2 at byte 14: duplicate key 'a'" in message
        assert ".fpipe-" not in message
    path.write_bytes(msgpack.packb({"key": "a"}) + msgpack.packb({"key": 7}))
    for dry in ((), ("--dry-run",)):
        output = ok_or_failure(1 if not dry else 0, "index", path, *dry)
        assert ".fpipe-" not in output
    assert ".fpipe-" not in fails(1, "index", path) and str(path) in fails(1, "index", path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["twice.msgpack"]


def test_index_keys_adds_the_key_index_reading_only_the_index_files(tmp_path, capsys):
    from datadings.writer import FileWriter as DatadingsWriter

    path = tmp_path / "dd.msgpack"
    with DatadingsWriter(str(path), overwrite=True) as writer:
        for i in range(50):
            writer.write({"key": f"k{i:03d}", "x": i})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert not (tmp_path / "dd.msgpack.key_index").exists()
    with open(path, "r+b") as data:  # a damaged sample: --keys never reads the samples
        data.seek(3)
        data.write(b"\xc1")
    assert main(["index", str(path), "--keys", "-q"]) == 0
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(set(after) - set(before)) == ["dd.msgpack.key_index"]
    assert all(after[name] == before[name] for name in before if name not in ("dd.msgpack", "dd.msgpack.md5"))
    assert MsgpackReader(path).find_index("k042") == 42
    assert main(["index", str(path), "--keys", "--scan"]) == 2
    assert "--scan has no effect with --keys" in capsys.readouterr().err


def test_index_without_offsets_keeps_later_samples_that_look_different(tmp_path):
    """Regression: one changed byte made sample 59 claim more bytes than the file has, and the
    samples after it have a field the first 60 lack: ``fpipe index`` cut them all off as one
    incomplete sample and exited 0."""
    spans = [pack_sample({"key": f"k{i:03d}", "x": bytes(50), **({"extra": i} if i >= 60 else {})})
             for i in range(120)]
    data = bytearray(b"".join(spans))
    data[sum(map(len, spans[:59]))] = 0xDB  # a str 32 header
    path = tmp_path / "hurt.msgpack"
    path.write_bytes(data)
    refusal = fails(1, "index", path)
    assert "1 damaged region (" in refusal and "Nothing was changed" in refusal
    assert path.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    assert "indexed 119 samples" in ok("index", path, "-y")
    with MsgpackReader(path) as reader:
        assert list(reader.iter(raw=True)) == spans[:59] + spans[60:]
    assert (tmp_path / "hurt.msgpack.damaged").read_bytes() == data


def test_index_refuses_what_it_cannot_tell_with_or_without_y(tmp_path):
    spans = [pack_sample({"key": f"n{i}", "meta": {"key": f"m{i}"}}) for i in range(4)]
    data = bytearray(b"".join(spans))
    data[len(spans[0])] = 0xC1
    path = tmp_path / "nested.msgpack"
    path.write_bytes(data)
    for y in ((), ("-y",)):
        refusal = fails(1, "index", path, *y)
        assert f"{path}: after damage, the sample at byte " in refusal
        assert "cannot be told, so nothing was changed" in refusal
        assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == [path.name]
