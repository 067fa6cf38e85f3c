"""``fpipe write`` checks what it packs: --include/--exclude, non-image files left out of an
ImageFolder tree (or refused with --strict), --check, --append; and ``fpipe demo --data``
names a bad input in one line."""

import pytest

from fpipe.dataset import MsgpackReader
from fpipe.files import DatasetFiles
from fpipe.sets import load_classes

from .conftest import fails, fpipe, jpeg, keys, leftovers, mistake, ok


def _files(path):
    return {file.name: file.read_bytes() for file in DatasetFiles(path).all_files}


def test_files_that_are_not_images_are_left_out_with_a_one_line_note(image_folder, tmp_path):
    (image_folder / "b2" / "notes.txt").write_text("not an image")
    (image_folder / "a" / "Thumbs.db").write_bytes(b"\x00\x01")
    out = tmp_path / "out.msgpack"
    result = fpipe_write(image_folder, out)
    notes = [line for line in result.stderr.splitlines() if line]
    assert notes == [
        f"fpipe write: note: left out 1 file(s) at the top of {image_folder} that are in no class "
        "folder (e.g. README.txt); left out 2 file(s) in the class folders that are not images "
        "(by suffix): a/Thumbs.db, b2/notes.txt"]
    assert len(keys(out)) == 7 and all(key.endswith(".jpg") for key in keys(out))
    message = fails(1, "write", image_folder, tmp_path / "strict.msgpack", "--strict")
    assert "2 file(s) in the class folders that are not images (by suffix): a/Thumbs.db, " \
           "b2/notes.txt; --exclude them" in message and len(message.splitlines()) == 1
    assert not (tmp_path / "strict.msgpack").exists() and leftovers(tmp_path) == []


def fpipe_write(*argv):
    from .conftest import fpipe

    result = fpipe("write", *argv)
    assert result.returncode == 0, result.stderr
    return result


def test_include_and_exclude_choose_files_by_key(image_folder, tmp_path):
    out = tmp_path / "out.msgpack"
    ok("write", image_folder, out, "--include", "b*/*", "--exclude", "*/0.jpg", "-q")
    assert keys(out) == ["b2/1.jpg", "b10/1.jpg", "b10/2.jpg"]
    assert load_classes(out) == {"label": ("b2", "b10")}
    pattern = tmp_path / "p.msgpack"
    ok("write", f"{image_folder}/{{LABEL}}/*", pattern, "--exclude", "a/*", "-q")
    assert keys(pattern) == ["b2/0.jpg", "b2/1.jpg", "b10/0.jpg", "b10/1.jpg", "b10/2.jpg"]
    assert "no samples found (after --include/--exclude)" in fails(
        2, "write", image_folder, tmp_path / "none.msgpack", "--include", "*.png")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_check_decodes_every_image_and_names_the_one_that_fails(image_folder, tmp_path, workers):
    (image_folder / "b2" / "1.jpg").write_bytes(b"\xff\xd8\xff" + bytes(40))
    out = tmp_path / "out.msgpack"
    message = fails(1, "write", image_folder, out, "--check", "--workers", workers, "-q")
    assert message.startswith(f"fpipe write: {image_folder / 'b2' / '1.jpg'}: cannot decode 43 bytes")
    assert message.rstrip().endswith("(--check)") and len(message.splitlines()) == 1
    assert not out.exists() and leftovers(tmp_path) == []
    ok("write", image_folder, out, "-q")  # without --check the bytes are packed as they are
    assert len(keys(out)) == 7


def test_demo_leaves_out_a_bad_input_and_names_it(image_folder):
    (image_folder / "a" / "1.jpg").write_bytes(b"GIF89a broken")
    result = fpipe("demo", "--data", image_folder, "--no-torch", "--workers", "0", "--epochs", "1",
                   "-q")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"fpipe write: left out {image_folder / 'a' / '1.jpg'}: cannot decode 13 bytes starting "
        "b'GIF89a broken' as an image: they begin as GIF data does, but its header is cut off "
        "or damaged",
        "fpipe write: left out 1 image(s) that do not decode (--skip-bad)"]


def test_append_adds_samples_and_keeps_labels_and_checksums(image_folder, tmp_path):
    out = tmp_path / "out.msgpack"
    ok("write", image_folder, out, "--exclude", "*/1.jpg", "-q")
    more = tmp_path / "more"
    for name, seed in (("b10/5.jpg", 1), ("a/7.jpg", 2)):
        (more / name).parent.mkdir(parents=True, exist_ok=True)
        (more / name).write_bytes(jpeg(seed))
    result = ok("write", more, out, "--append")
    assert result.startswith(f"appended 2 samples from folder (ImageFolder layout) {more} to {out}")
    samples = list(MsgpackReader(out))
    assert [(s["key"], s["label"]) for s in samples[-2:]] == [("a/7.jpg", 0), ("b10/5.jpg", 2)]
    assert len(samples) == 6 and ok("verify", out, "-q") == ""


def test_a_failed_append_leaves_the_dataset_as_it_was(image_folder, tmp_path, capsys):
    out = tmp_path / "out.msgpack"
    ok("write", image_folder, out, "-q")
    before = _files(out)
    (image_folder / "a" / "0-new.jpg").write_bytes(jpeg(9))  # new, and written before a/0.jpg
    assert "duplicate key 'a/0.jpg'" in fails(1, "write", image_folder, out, "--append",
                                              "--include", "a/*")
    assert _files(out) == before
    out2 = tmp_path / "two.msgpack"
    ok("write", image_folder, out2, "-q", "--exclude", "b10/*")
    before = _files(out2)
    (tmp_path / "other" / "c").mkdir(parents=True)
    (tmp_path / "other" / "c" / "x.jpg").write_bytes(jpeg(3))
    assert "label(s) c are not among the classes" in mistake(
        capsys, 2, "write", tmp_path / "other", out2, "--append")
    broken = tmp_path / "broken"
    (broken / "a").mkdir(parents=True)
    (broken / "a" / "9.jpg").write_bytes(b"nothing")
    assert "(--check)" in fails(1, "write", broken, out2, "--append", "--check")
    assert _files(out2) == before and ok("verify", out2, "-q") == ""
    assert "pass one of them" in mistake(capsys, 2, "write", broken, out2, "--append", "-y")
