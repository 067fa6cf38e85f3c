"""``fpipe write`` from WebDataset, Parquet/Arrow and TFRecord files, and ``fpipe export`` to
WebDataset shards and Parquet files: round trips, shard sizes, fields a format cannot carry."""

import io
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fpipe.cli import main
from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.formats import ParquetReader, TFRecordFileReader, TFRecordWriter, WebDatasetReader

from .conftest import fpipe, mistake, ok


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FPIPE_CACHE_DIR", str(tmp_path / "cache"))


def _run_ok(*argv, cwd=None):
    return ok(*argv, cwd=cwd, env={"FPIPE_CACHE_DIR": str(cwd or ".") + "/cache"})


def _shards(folder, n_shards=3, per_shard=10):
    for shard in range(n_shards):
        with tarfile.open(folder / f"shards-{shard:03d}.tar", "w") as tar:
            for i in range(shard * per_shard, (shard + 1) * per_shard):
                for extension, data in (("jpg", bytes([i]) * (10 + i)), ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"{i:04d}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _packed(path, n=25):
    with FileWriter(path) as writer:
        for i in range(n):
            writer.write({"key": f"img/{i:03d}.jpg", "image": bytes([i]) * (5 + i), "label": i % 4,
                          "score": i / 8, "caption": f"picture {i}", "box": np.arange(4.0) + i})
    return path


def _all(path):
    with MsgpackReader(path) as reader:
        return list(reader)


def test_write_from_webdataset_shards_pattern_or_several(tmp_path):
    _shards(tmp_path)
    out = _run_ok("write", "shards-{000..002}.tar", "w.msgpack", cwd=tmp_path)
    assert "wrote 30 samples from WebDataset shards" in out
    expected = list(WebDatasetReader(str(tmp_path / "shards-*.tar")))
    assert _all(tmp_path / "w.msgpack") == expected
    _run_ok("write", "shards-000.tar", "shards-001.tar", "shards-002.tar", "two.msgpack", cwd=tmp_path)
    assert (tmp_path / "two.msgpack").read_bytes() == (tmp_path / "w.msgpack").read_bytes()
    _run_ok("write", "shards-*.tar", "s.msgpack", "--shuffle", "--seed", "3", cwd=tmp_path)
    shuffled = [s["key"] for s in _all(tmp_path / "s.msgpack")]
    assert sorted(shuffled) == [s["key"] for s in expected] and shuffled != sorted(shuffled)


def test_write_from_parquet_folder_and_tfrecord_without_suffix(tmp_path):
    folder = tmp_path / "hub"
    folder.mkdir()
    for part in range(2):
        table = pa.table({"text": [f"t{part}{i}" for i in range(5)], "n": list(range(5))})
        pq.write_table(table, folder / f"train-{part:05d}-of-00002.parquet")
    _run_ok("write", "hub", "p.msgpack", cwd=tmp_path)
    samples = _all(tmp_path / "p.msgpack")
    assert [s["text"] for s in samples] == [f"t{p}{i}" for p in range(2) for i in range(5)]
    assert samples[6]["key"] == "train-00001-of-00002.parquet:1"
    with TFRecordWriter(tmp_path / "train-00000-of-00001") as writer:
        for i in range(4):
            writer.write({"image": bytes([i]), "label": i})
    _run_ok("write", "train-00000-of-00001", "t.msgpack", cwd=tmp_path)
    samples = _all(tmp_path / "t.msgpack")
    assert samples[3]["image"] == b"\x03" and samples[3]["label"].tolist() == [3]


def test_write_from_a_damaged_shard_names_file_and_sample_and_writes_nothing(tmp_path):
    _shards(tmp_path, 1)
    data = (tmp_path / "shards-000.tar").read_bytes()
    (tmp_path / "shards-000.tar").write_bytes(data[: data.index(b"0005.jpg") + 512 + 3])
    result = fpipe("write", "shards-000.tar", "w.msgpack", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "shards-000.tar: sample 5" in result.stderr and "truncated" in result.stderr
    assert not (tmp_path / "w.msgpack").exists()


def test_write_refuses_image_options_and_mixed_formats(tmp_path):
    _shards(tmp_path, 1)
    result = fpipe("write", "shards-000.tar", "w.msgpack", "--resize", "64", cwd=tmp_path)
    assert result.returncode == 2 and "--resize has no effect with WebDataset shards" in result.stderr
    result = fpipe("write", "shards-000.tar", "x.parquet", "w.msgpack", cwd=tmp_path)
    assert result.returncode == 2 and "of one format" in result.stderr


def test_export_webdataset_round_trip_with_renamed_fields(tmp_path):
    packed = _packed(tmp_path / "train.msgpack")
    out = _run_ok("export", "train.msgpack", "wds/train-%04d.tar", "--shard-size", "10",
                  "--rename", "label=label.cls", "--rename", "caption=caption.txt",
                  "--rename", "score=score.json", "--rename", "box=box.npy", cwd=tmp_path)
    assert "wrote 25 samples to 3 webdataset shard(s)" in out
    assert sorted(p.name for p in (tmp_path / "wds").iterdir()) == [
        ".train-%04d.tar.shards.json", "train-0000.tar", "train-0001.tar", "train-0002.tar"]
    back = list(WebDatasetReader(str(tmp_path / "wds" / "train-*.tar"), decode=True))
    for original, read in zip(_all(packed), back):
        assert read["key"] == original["key"].replace(".jpg", "_jpg")
        assert read["image"] == original["image"] and read["label.cls"] == original["label"]
        assert read["caption.txt"] == original["caption"] and read["score.json"] == original["score"]
        assert np.array_equal(read["box.npy"], original["box"])


def test_export_parquet_round_trip_is_exact(tmp_path):
    packed = _packed(tmp_path / "train.msgpack")
    _run_ok("export", "train.msgpack", "pq", "--format", "parquet", "--shard-size", "8",
            "--row-group-size", "3", cwd=tmp_path)
    files = sorted((tmp_path / "pq").iterdir())
    assert [p.name for p in files] == [".train-%06d.parquet.shards.json",
                                       *(f"train-{i:06d}.parquet" for i in range(4))]
    reader = ParquetReader(tmp_path / "pq")
    for original, read in zip(_all(packed), reader):
        assert read.keys() == original.keys()
        assert all(np.array_equal(read[k], original[k]) if isinstance(original[k], np.ndarray)
                   else read[k] == original[k] and type(read[k]) is type(original[k]) for k in original)
    assert reader.find_index("img/007.jpg") == 7


def test_export_by_bytes(tmp_path):
    _packed(tmp_path / "train.msgpack", 40)
    _run_ok("export", "train.msgpack", "w/x-%d.tar", "--shard-size", "8KB", "--rename", "label=cls",
            "--rename", "caption=txt", "--rename", "score=s.json", "--rename", "box=npy", cwd=tmp_path)
    sizes = [p.stat().st_size for p in (tmp_path / "w").iterdir()]
    # a shard ends after the sample that takes it past 8 KB, padded to tar's 10 KiB records
    assert len(sizes) > 2 and max(sizes) <= 8000 + 6 * 1024 + 10240


def test_a_field_a_format_cannot_carry_stops_the_run_and_leaves_no_shard(tmp_path):
    _packed(tmp_path / "train.msgpack")
    result = fpipe("export", "train.msgpack", "wds/t-%03d.tar", "--shard-size", "5", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "field 'label' holds int" in result.stderr and "--rename label=label.cls" in result.stderr
    assert not (tmp_path / "wds").exists(), "the folder it made is gone too"
    with FileWriter(tmp_path / "mixed.msgpack") as writer:
        writer.write({"key": "a", "x": 1})
        writer.write({"key": "b", "x": "one"})
    result = fpipe("export", "mixed.msgpack", "pq/m-%d.parquet", cwd=tmp_path)
    assert result.returncode == 1 and "field 'x' holds int and str" in result.stderr
    assert not (tmp_path / "pq").exists()


def test_export_never_clobbers_unless_asked_and_then_removes_stale_shards(tmp_path):
    _packed(tmp_path / "train.msgpack", 20)
    args = ["export", "train.msgpack", "pq/t-%02d.parquet", "--shard-size"]
    _run_ok(*args, "5", cwd=tmp_path)
    result = fpipe(*args, "10", cwd=tmp_path)
    assert result.returncode == 2 and "exist" in result.stderr
    assert len(list((tmp_path / "pq").iterdir())) == 5, "4 shards and their manifest"
    (tmp_path / "pq" / "t-other.parquet").write_bytes(b"not ours")
    _run_ok(*args, "10", "-y", cwd=tmp_path)
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == [
        ".t-%02d.parquet.shards.json", "t-00.parquet", "t-01.parquet", "t-other.parquet"]
    assert len(ParquetReader(str(tmp_path / "pq" / "t-0*.parquet"))) == 20


def test_export_reads_other_formats_and_checks_its_arguments(tmp_path):
    with TFRecordWriter(tmp_path / "a.tfrecord") as writer:
        writer.write({"x": [1, 2]})
    _run_ok("export", "a.tfrecord", "o/a-%d.parquet", cwd=tmp_path)
    assert list(ParquetReader(tmp_path / "o"))[0]["x"].tolist() == [1, 2]
    for argv, message in [(["o2"], "pass --format"), (["o/x.tar"], "%d-style"),
                          (["o/x-%d.zip"], "--format is needed"),
                          (["o/x-%d.tar", "--shard-size", "0"], "must be >= 1"),
                          (["o/x-%d.tar", "--shard-size", "3parsecs"], "a size such as 500MB"),
                          (["o/x-%d.tar", "--rename", "x"], "OLD=NEW")]:
        result = fpipe("export", "a.tfrecord", *argv, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (argv, result.stderr)
    assert TFRecordFileReader(tmp_path / "a.tfrecord")[0]["x"].tolist() == [1, 2]


def _sources_of_30(folder):
    """The same 30 samples' worth of each format: shards, a Parquet file, a TFRecord file."""
    _shards(folder)
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(30)], "n": list(range(30))}),
                   folder / "rows.parquet", row_group_size=7)
    with TFRecordWriter(folder / "records.tfrecord") as writer:
        for i in range(30):
            writer.write({"image": bytes([i]) * (i + 1), "label": i})
    return ["shards-{000..002}.tar", "rows.parquet", "records.tfrecord"]


@pytest.mark.parametrize("order", [[], ["--shuffle", "--seed", "3"]])
def test_write_with_workers_writes_the_same_dataset_byte_for_byte(tmp_path, monkeypatch, order):
    import fpipe.cli._formats as formats_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(formats_command, "WORKER_CHUNK", 4)  # several tasks for each worker
    # paths from the root: the worker processes may have started in another test's folder
    for n, source in enumerate(str(tmp_path / name) for name in _sources_of_30(tmp_path)):
        assert main(["write", source, f"one{n}.msgpack", "-q", *order]) == 0
        assert main(["write", source, f"two{n}.msgpack", "-q", "--workers", "2", *order]) == 0
        for suffix in ("", ".offsets", ".keys"):
            one, two = (tmp_path / f"{name}{n}.msgpack{suffix}" for name in ("one", "two"))
            assert one.read_bytes() == two.read_bytes(), (source, suffix)
        assert len(_all(tmp_path / f"two{n}.msgpack")) == 30


def test_write_with_workers_names_a_field_that_cannot_be_packed_and_writes_nothing(
        tmp_path, monkeypatch, capsys):
    import decimal

    import fpipe.cli._formats as formats_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(formats_command, "WORKER_CHUNK", 4)
    prices = [decimal.Decimal(i) for i in range(10)]
    pq.write_table(pa.table({"n": list(range(10)), "price": pa.array(prices, pa.decimal128(5, 0))}),
                   tmp_path / "prices.parquet")
    for workers in ("1", "2"):
        # a path from the root: the worker processes may have started in another test's folder
        error = mistake(capsys, 1, "write", tmp_path / "prices.parquet", "p.msgpack",
                        "--workers", workers)
        assert "sample 'prices.parquet:0': field 'price' holds Decimal" in error, error
        assert "Traceback" not in error
        assert not (tmp_path / "p.msgpack").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_write_from_tfrecord_packs_every_feature_kind_as_the_parsed_samples_pack(
        tmp_path, monkeypatch, workers):
    import fpipe.cli._formats as formats_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(formats_command, "WORKER_CHUNK", 3)
    with TFRecordWriter(tmp_path / "all.tfrecord") as writer:
        for i in range(7):
            writer.write({"image": bytes([i]) * 200, "tags": [b"a", b"b" * i], "label": i,
                          "ids": np.array([-(2**63), 2**63 - 1, i * 1000]), "empty": [],
                          "box": np.array([0.5, -i, np.nan], np.float32), "key": b"its own"})
    source = str(tmp_path / "all.tfrecord")  # from the root: workers may live in another folder
    assert main(["write", source, "out.msgpack", "-q", "--workers", workers]) == 0
    with FileWriter(tmp_path / "expected.msgpack") as expected:
        for key, sample in TFRecordFileReader(source).iter(yield_key=True):
            expected.write({**sample, "key": key})
    for suffix in ("", ".offsets", ".keys"):
        assert ((tmp_path / f"out.msgpack{suffix}").read_bytes()
                == (tmp_path / f"expected.msgpack{suffix}").read_bytes()), suffix
    assert _all(tmp_path / "out.msgpack")[6]["ids"].tolist() == [-(2**63), 2**63 - 1, 6000]


def test_write_reads_tar_member_names_that_are_not_utf8_as_latin1(tmp_path, capsys):
    with tarfile.open(tmp_path / "latin.tar", "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tar:
        for name, data in [("café.jpg", b"x" * 100), ("café.cls", b"1"), ("naïve.jpg", b"y")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}.msgpack"
        assert main(["write", str(tmp_path / "latin.tar"), str(out), "--workers", workers, "-q"]) == 0
        with MsgpackReader(out) as reader:
            assert list(reader.iter(yield_key=True)) == [
                ("café", {"key": "café", "jpg": b"x" * 100, "cls": b"1"}),
                ("naïve", {"key": "naïve", "jpg": b"y"})]


def test_write_names_a_text_file_named_tar(tmp_path, capsys):
    (tmp_path / "notes.tar").write_text("my notes\n" * 100)
    message = mistake(capsys, 1, "write", tmp_path / "notes.tar", tmp_path / "out.msgpack")
    assert "notes.tar: byte 0: not a tar file" in message and "base 8" not in message


def test_write_reads_a_packed_dataset_with_its_keys_and_class_names(tmp_path, capsys):
    from fpipe.dataset import pack_sample

    source = _packed(tmp_path / "a.msgpack")
    classes = '{"dataset": "a", "classes": {"label": ["w", "x", "y", "z"]}}\n'
    (tmp_path / "a.msgpack.classes.json").write_text(classes)
    for argv in (["b.msgpack"], ["c.msgpack", "--shuffle", "--seed", "1", "--workers", "2"]):
        assert main(["write", str(source), str(tmp_path / argv[0]), *argv[1:], "-q"]) == 0
        assert (tmp_path / f"{argv[0]}.classes.json").read_text() == classes
    with MsgpackReader(source) as a, MsgpackReader(tmp_path / "b.msgpack") as b:
        assert [(k, pack_sample(s)) for k, s in a.iter(yield_key=True)] == [
            (k, pack_sample(s)) for k, s in b.iter(yield_key=True)]
    with MsgpackReader(tmp_path / "c.msgpack") as c:
        keys = [c.find_key(i) for i in range(len(c))]
        assert sorted(keys) == [f"img/{i:03d}.jpg" for i in range(25)] != keys
