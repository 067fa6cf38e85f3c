"""``fpipe write SOURCE OUT`` from folders, glob patterns, list files and JSON lines."""

import io
import json

from PIL import Image

from fpipe.dataset import MsgpackReader
from fpipe.sets import load_classes

from .conftest import fails, keys, leftovers, mistake, ok


def _samples(path):
    with MsgpackReader(path) as reader:
        return list(reader)


def test_an_image_folder_becomes_a_labelled_dataset_with_its_class_names(image_folder, tmp_path):
    out = tmp_path / "out" / "images.msgpack"
    result = ok("write", image_folder, out)
    assert "wrote 7 samples" in result and "3 labels" in result
    # Natural order of the class names: a < b2 < b10; the names are stored beside the dataset.
    assert load_classes(out) == {"label": ("a", "b2", "b10")}
    samples = _samples(out)
    assert [(s["key"], s["label"]) for s in samples] == [
        ("a/0.jpg", 0), ("a/1.jpg", 0), ("b2/0.jpg", 1), ("b2/1.jpg", 1),
        ("b10/0.jpg", 2), ("b10/1.jpg", 2), ("b10/2.jpg", 2)]
    # The original bytes, untouched.
    assert samples[0]["image"] == (image_folder / "a" / "0.jpg").read_bytes()


def test_shuffle_is_seeded_and_workers_do_not_change_the_output(image_folder, tmp_path):
    ok("write", image_folder, tmp_path / "one.msgpack", "--shuffle", "--seed", "4", "-q")
    ok("write", image_folder, tmp_path / "two.msgpack", "--shuffle", "--seed", "4", "--workers", "3")
    ok("write", image_folder, tmp_path / "other.msgpack", "--shuffle", "--seed", "5", "-q")
    one = keys(tmp_path / "one.msgpack")
    assert one == keys(tmp_path / "two.msgpack")
    assert one != keys(tmp_path / "other.msgpack") and sorted(one) == sorted(keys(tmp_path / "other.msgpack"))
    assert (tmp_path / "one.msgpack").read_bytes() == (tmp_path / "two.msgpack").read_bytes()


def test_glob_patterns_resize_and_reencode(image_folder, tmp_path):
    out = tmp_path / "small.msgpack"
    ok("write", f"{image_folder}/{{LABEL}}/*.jpg", out, "--resize", "5", "--encode", "png",
       "--field", "pixels")
    samples = _samples(out)
    assert len(samples) == 7 and samples[0]["key"] == "a/0.jpg"
    image = Image.open(io.BytesIO(samples[0]["pixels"]))
    assert image.format == "PNG" and min(image.size) == 5
    unlabelled = tmp_path / "flat.msgpack"
    ok("write", f"{image_folder}/b*/*.jpg", unlabelled)
    assert [s.get("label") for s in _samples(unlabelled)] == [None] * 5
    assert keys(unlabelled)[:3] == ["b2/0.jpg", "b2/1.jpg", "b10/0.jpg"]


def test_list_files_and_json_lines(image_folder, tmp_path):
    (tmp_path / "list.csv").write_text(
        "path,label\nimages/b2/0.jpg,dog\n\"images/a/1.jpg\",cat\nimages/b10/2.jpg,dog\n")
    ok("write", tmp_path / "list.csv", tmp_path / "list.msgpack", cwd="/")
    assert [(s["key"], s["label"]) for s in _samples(tmp_path / "list.msgpack")] == [
        ("images/b2/0.jpg", 1), ("images/a/1.jpg", 0), ("images/b10/2.jpg", 1)]
    (tmp_path / "tabs.txt").write_text("images/a/0.jpg\nimages/a/1.jpg\n")
    ok("write", tmp_path / "tabs.txt", tmp_path / "tabs.msgpack")
    assert keys(tmp_path / "tabs.msgpack") == ["images/a/0.jpg", "images/a/1.jpg"]
    lines = [{"key": "x", "label": "b", "values": [1, 2]}, {"label": "a", "text": "hi"}]
    (tmp_path / "s.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n\n")
    ok("write", tmp_path / "s.jsonl", tmp_path / "json.msgpack")
    assert _samples(tmp_path / "json.msgpack") == [
        {"key": "x", "label": 1, "values": [1, 2]}, {"label": 0, "text": "hi", "key": "1"}]
    assert load_classes(tmp_path / "json.msgpack") == {"label": ("a", "b")}


def test_user_mistakes_exit_2_and_write_nothing(image_folder, tmp_path, capsys):
    out = tmp_path / "out.msgpack"
    assert "no such file or folder" in fails(2, "write", tmp_path / "missing", out)
    assert "svhn: no such file or folder, and no well-known dataset of that name" in mistake(
        capsys, 2, "write", "svhn", out)
    assert "matches no files" in mistake(capsys, 2, "write", f"{image_folder}/{{LABEL}}", out)
    assert "--quality must be between 1 and 100" in mistake(
        capsys, 2, "write", image_folder, out, "--resize", "4", "--quality", "101")
    assert "--download has no effect with files (only with a well-known dataset)" in mistake(
        capsys, 2, "write", image_folder, out, "--download")
    assert "must be between 1 and 256" in mistake(capsys, 2, "write", image_folder, out,
                                                  "--workers", "0")
    assert "is a folder" in mistake(capsys, 2, "write", image_folder, tmp_path)
    assert "--resize has no effect with the well-known dataset mnist" in mistake(
        capsys, 2, "write", "mnist", tmp_path, "--resize", "8")
    assert not out.exists() and leftovers(tmp_path) == []


def test_an_existing_dataset_is_replaced_only_with_overwrite(image_folder, tmp_path):
    out = tmp_path / "out.msgpack"
    ok("write", image_folder, out, "-q")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("out.msgpack*")}
    assert "pass -y/--overwrite" in fails(2, "write", image_folder, out, "--shuffle")
    assert {p.name: p.read_bytes() for p in tmp_path.glob("out.msgpack*")} == before
    ok("write", image_folder, out, "--shuffle", "-y", "-q")
    assert keys(out) != [s for s in before] and len(keys(out)) == 7


def test_a_failed_run_leaves_no_dataset_and_keeps_the_old_one(image_folder, tmp_path):
    (tmp_path / "list.csv").write_text("images/a/0.jpg,x\nimages/nothere.jpg,y\n")
    out = tmp_path / "out.msgpack"
    assert "cannot read" in fails(1, "write", tmp_path / "list.csv", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "list.csv"]
    ok("write", image_folder, out, "-q")
    before = out.read_bytes()
    (image_folder / "b10" / "broken.jpg").write_text("not an image")
    assert "cannot re-encode" in fails(1, "write", image_folder, out, "-y", "--resize", "4",
                                       "--workers", "2")
    assert out.read_bytes() == before and leftovers(tmp_path) == []
    (tmp_path / "bad.jsonl").write_text('{"key": "a"}\n[1, 2]\n')
    assert "line 2: a sample is a JSON object" in fails(1, "write", tmp_path / "bad.jsonl",
                                                        tmp_path / "j.msgpack")
