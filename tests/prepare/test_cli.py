"""fpipe write SOURCE... OUT --processes N / --cluster ADDRESS / --restart, and fpipe verify of
a prepared dataset."""

from __future__ import annotations

import pytest

from fpipe.cli import main
from fpipe.dataset import MsgpackReader, ShardedReader
from fpipe.formats import TFRecordWriter


@pytest.fixture
def records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for part in range(3):
        with TFRecordWriter(tmp_path / f"r-{part}.tfrecord") as writer:
            for i in range(30):
                writer.write({"x": [part * 100 + i]})
    return str(tmp_path / "r-*.tfrecord")


def _run(capsys, *argv) -> tuple[int, str, str]:
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_write_with_processes_prepares_resumes_and_reports(records, tmp_path, capsys):
    status, out, err = _run(capsys, "write", records, "out", "--processes", "2", "--shard-size", "20")
    assert status == 0, err
    assert out.startswith(f"prepared {tmp_path / 'out' / 'dataset.shards'}: 3 partitions "
                          "(3 written, 0 already committed), 90 samples")
    assert err.count("fpipe prepare: ") == 3 and "3/3 partitions, 90 samples" in err
    assert "samples/s, ETA 0:00:00" in err
    assert main(["write", records, "whole.msgpack", "-q"]) == 0
    prepared = list(ShardedReader(str(tmp_path / "out" / "dataset.shards")))
    assert [s["x"] for s in prepared] == [s["x"] for s in MsgpackReader(tmp_path / "whole.msgpack")]
    status, out, _ = _run(capsys, "write", records, "out", "--processes", "2", "--shard-size", "20")
    assert status == 0 and "(0 written, 3 already committed)" in out
    status, out, err = _run(capsys, "verify", "out")
    assert status == 0 and out.startswith("out: ok (3 partitions, 6 shards, 90 samples")


def test_a_rerun_with_another_shard_size_is_refused_until_restart(records, capsys):
    assert _run(capsys, "write", records, "out", "--processes", "1", "-q")[0] == 0
    status, out, err = _run(capsys, "write", records, "out", "--processes", "1", "--shard-size", "7")
    assert status == 1 and "shard_size (was 10000, now 7)" in err and "--restart" in err
    status, out, err = _run(capsys, "write", records, "out", "--processes", "1", "--shard-size", "7",
                            "--restart", "-q")
    assert (status, out) == (0, "")


def test_verify_names_a_damaged_shard_of_a_prepared_dataset(records, tmp_path, capsys):
    assert _run(capsys, "write", records, "out", "--processes", "1", "-q")[0] == 0
    shard = tmp_path / "out" / "part-000002" / "00000.msgpack"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    status, out, _ = _run(capsys, "verify", "out")
    assert status == 1 and "out: 1 problem(s)" in out and f"{shard}: its MD5 is" in out


@pytest.mark.parametrize("argv, says", [
    (["--restart"], "--restart has no effect without --processes or --cluster"),
    (["--shard-size", "5"], "--shard-size has no effect without --processes or --cluster"),
    (["--processes", "2", "--shuffle"], "--shuffle has no effect with --processes or --cluster"),
    (["--processes", "2", "--workers", "2"], "--workers has no effect with --processes"),
    (["--processes", "2", "--append"], "--append has no effect with --processes"),
])
def test_options_that_do_not_go_together_are_usage_errors(records, tmp_path, capsys, argv, says):
    status, _, err = _run(capsys, "write", records, "out", *argv)
    assert status == 2 and says in err, err
    assert not (tmp_path / "out").exists()


def test_processes_and_cluster_together_are_a_usage_error(records, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["write", records, "out", "--processes", "2", "--cluster", "tcp://127.0.0.1:1"])
    assert raised.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _class_folders(root) -> None:
    import io

    from PIL import Image

    for number, label in enumerate(("cat", "dog")):
        (root / label).mkdir(parents=True)
        for i in range(5):
            encoded = io.BytesIO()
            Image.new("RGB", (4, 4), (number * 100, i * 40, 0)).save(encoded, "JPEG")
            (root / label / f"{i}.jpg").write_bytes(encoded.getvalue())


def _samples(out) -> list[dict]:
    return list(ShardedReader(str(out / "dataset.shards")))


@pytest.mark.parametrize("kind", ["folder", "list", "jsonl"])
def test_folders_list_and_json_lines_files_by_ranges_of_entries(kind, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _class_folders(tmp_path / "photos")
    source = {"folder": "photos", "list": "files.tsv", "jsonl": "rows.jsonl"}[kind]
    if kind == "list":
        (tmp_path / source).write_text("".join(f"photos/dog/{i}.jpg\t{i % 2}\n" for i in range(5)))
    elif kind == "jsonl":
        (tmp_path / source).write_text("".join(f'{{"key": "r{i}", "x": {i}}}\n' for i in range(7)))
    assert _run(capsys, "write", source, "whole.msgpack", "-q")[0] == 0
    status, out, err = _run(capsys, "write", source, "out", "--processes", "2", "--ranges", "3")
    assert status == 0, err
    assert "3 partitions (3 written, 0 already committed)" in out
    whole = list(MsgpackReader("whole.msgpack"))
    assert _samples(tmp_path / "out") == whole
    status, _, err = _run(capsys, "write", source, "out", "--processes", "2", "--ranges", "4")
    assert status != 0 and "prepared with other settings" in err


def test_entries_default_to_one_partition_a_block_of_entries(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _class_folders(tmp_path / "photos")
    status, out, err = _run(capsys, "write", "photos", "out", "--processes", "1")
    assert status == 0, err
    assert "1 partitions (1 written" in out
    assert [s["label"] for s in _samples(tmp_path / "out")] == [0] * 5 + [1] * 5


def test_the_files_that_include_and_exclude_choose_are_prepared_and_a_changed_choice_refused(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _class_folders(tmp_path / "photos")
    (tmp_path / "photos" / "dog" / "3.txt").write_text("not an image")
    choice = ["--include", "*/[0-3].*", "--exclude", "cat/1.jpg"]
    assert _run(capsys, "write", "photos", "whole.msgpack", *choice, "-q")[0] == 0
    status, out, err = _run(capsys, "write", "photos", "out", "--processes", "2", "--ranges", "2",
                            *choice)
    assert status == 0, err
    assert "fpipe write: note: " in err and "dog/3.txt" in err, err
    whole = list(MsgpackReader("whole.msgpack"))
    assert len(whole) == 7 and _samples(tmp_path / "out") == whole
    status, out, _ = _run(capsys, "write", "photos", "out", "--processes", "2", "--ranges", "2",
                          *choice)
    assert status == 0 and "(0 written, 2 already committed)" in out
    status, _, err = _run(capsys, "write", "photos", "out", "--processes", "2", "--ranges", "2",
                          "--include", "*/[0-3].*", "--exclude", "cat/2.jpg")
    assert status == 1 and "prepared with other settings" in err, err
    status, _, err = _run(capsys, "write", "photos", "strict", "--processes", "1", "--strict")
    assert status != 0 and "3.txt" in err, err


def test_class_lists_and_several_folders_are_refused_when_preparing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _class_folders(tmp_path / "photos")
    status, _, err = _run(capsys, "write", "photos", "out", "--processes", "2", "--classes",
                          "photos")
    assert status == 2 and "--classes" in err
    _class_folders(tmp_path / "more")
    status, _, err = _run(capsys, "write", "photos", "more", "out", "--processes", "2")
    assert status == 2 and "give one folder, glob pattern, list file or JSON-lines file" in err


@pytest.mark.slow
def test_write_on_a_cluster_by_its_address(records, tmp_path, capsys):
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        status, out, err = _run(capsys, "write", records, "out", "--cluster",
                                cluster.scheduler_address, "--shard-size", "20")
    assert status == 0, err
    assert "3 partitions (3 written, 0 already committed), 90 samples" in out
    assert _run(capsys, "write", records, "local", "--processes", "1", "--shard-size", "20", "-q")[0] == 0
    from .jobs import tree

    assert tree(tmp_path / "out") == tree(tmp_path / "local")


def _photos(root, *, damaged: bool = False) -> None:
    import io

    from PIL import Image

    (root / "cat").mkdir(parents=True)
    for i in range(6):
        encoded = io.BytesIO()
        Image.new("RGB", (8 + 2 * i, 12), (i * 40, 0, 0)).save(encoded, "PNG")
        (root / "cat" / f"{i}.png").write_bytes(encoded.getvalue())
    if damaged:
        (root / "cat" / "3.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)


def test_resize_and_encode_run_in_the_workers_as_they_do_in_one_process(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _photos(tmp_path / "photos")
    recode = ["--resize", "4", "--encode", "jpeg", "--quality", "80"]
    assert _run(capsys, "write", "photos", "whole.msgpack", *recode, "-q")[0] == 0
    status, out, err = _run(capsys, "write", "photos", "out", "--processes", "2", "--ranges", "3",
                            *recode)
    assert status == 0, err
    assert _samples(tmp_path / "out") == list(MsgpackReader("whole.msgpack"))
    assert all(image.startswith(b"\xff\xd8") for image in
               (s["image"] for s in _samples(tmp_path / "out")))
    status, out, err = _run(capsys, "write", "photos", "out", "--processes", "2", "--ranges", "3",
                            "--resize", "5", "--encode", "jpeg", "--quality", "80")
    assert status == 1 and "transform (was" in err and "size=4" in err and "size=5" in err, err


def test_a_damaged_image_stops_the_job_by_name_unless_skip_bad_leaves_it_out(tmp_path, capsys,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    _photos(tmp_path / "photos", damaged=True)
    status, _, err = _run(capsys, "write", "photos", "out", "--processes", "1", "--resize", "4")
    assert status == 1 and "cat/3.png: cannot re-encode" in err and "--skip-bad" in err, err
    status, _, err = _run(capsys, "write", "photos", "out", "--processes", "1", "--check",
                          "--restart")
    assert status == 1 and "cat/3.png" in err and "(--check)" in err, err
    status, out, err = _run(capsys, "write", "photos", "out", "--processes", "1", "--skip-bad",
                            "--restart")
    assert status == 0 and "5 samples" in out, (out, err)
    assert "fpipe write: left out cat/3.png" in err
    assert [s["key"] for s in _samples(tmp_path / "out")] == [f"cat/{i}.png" for i in (0, 1, 2, 4, 5)]
    status, out, err = _run(capsys, "write", "photos", "out2", "--processes", "2", "--ranges", "2",
                            "--resize", "4", "--skip-bad")
    assert status == 0 and "5 samples" in out, (out, err)


@pytest.mark.parametrize("source, option, says", [
    ("records", ["--resize", "4"], "--resize has no effect on WebDataset, Parquet/Arrow or TFRecord"),
    ("records", ["--skip-bad"], "--skip-bad has no effect on WebDataset"),
    ("records", ["--include", "*"], "--include has no effect on WebDataset"),
    ("photos", ["--separator", ";"], "--separator has no effect on a folder"),
    ("rows.jsonl", ["--encode", "png"], "no effect on JSON lines"),
    ("photos", ["--quality", "80"], "--quality has no effect without --encode or --resize"),
])
def test_image_options_where_they_mean_nothing_are_usage_errors(records, tmp_path, capsys, source,
                                                                option, says):
    _photos(tmp_path / "photos")
    (tmp_path / "rows.jsonl").write_text('{"key": "r0", "x": 0}\n')
    source = records if source == "records" else source
    status, _, err = _run(capsys, "write", source, "out", "--processes", "1", *option)
    assert status == 2 and says in err, err
    assert not (tmp_path / "out").exists()
