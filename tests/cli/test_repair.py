"""``fpipe verify`` and ``fpipe index``: finding damage, recovering a cut data file, legacy indexes."""

import msgpack

from fpipe.storage import DatasetFiles, MsgpackReader, read_offsets

from .conftest import fails, keys, leftovers, make_dataset, ok, ok_or_failure


def test_verify_passes_a_good_dataset_and_names_the_damage_in_a_bad_one(tmp_path):
    good = make_dataset(tmp_path / "good.msgpack", 40)
    assert ok("verify", good) == f"{good}: ok (md5 of 5 files, index, 40 samples)\n"
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
    assert "cut off 9 bytes of an incomplete sample" in ok("index", path)
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
    assert "sample 1 at byte 7" in message and "without a str \"key\"" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nokeys.msgpack"]
    assert "not found" in fails(2, "index", tmp_path / "none.msgpack")
