"""What ``fpipe write`` reads: glob patterns take what class folders take, suffixes match in
either case, a missing folder is named as one, a list file's header is recognised."""

from fpipe.dataset import MsgpackReader

from .conftest import fails, fpipe, jpeg, keys, mistake, ok


def _photos(root):
    """Class folders with a JPEG each, an upper-case .JPG with a Cyrillic name, and files that
    are not images."""
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        (root / label / "1.jpg").write_bytes(jpeg(len(label)))
    (root / "dog" / "кофе.JPG").write_bytes(jpeg(7))
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "dog" / "Thumbs.db").write_bytes(b"\x00\x01")
    return root


def test_a_label_pattern_leaves_out_what_class_folders_leave_out(tmp_path, capsys):
    root = _photos(tmp_path / "photos")
    folder, pattern = tmp_path / "folder.msgpack", tmp_path / "pattern.msgpack"
    ok("write", root, folder, "-q")
    result = fpipe("write", f"{root}/{{LABEL}}/*", pattern)
    assert result.returncode == 0, result.stderr
    assert keys(pattern) == keys(folder) == ["cat/1.jpg", "dog/1.jpg", "dog/кофе.JPG"]
    assert "left out 2 file(s) in the class folders that are not images (by suffix): " \
           "cat/notes.txt, dog/Thumbs.db" in result.stderr
    message = fails(1, "write", f"{root}/{{LABEL}}/*", tmp_path / "strict.msgpack", "--strict")
    assert "2 file(s) in the class folders that are not images" in message
    assert "--strict is for class folders" in mistake(capsys, 2, "write", f"{root}/*/*.jpg",
                                                      tmp_path / "flat.msgpack", "--strict")
    assert not (tmp_path / "strict.msgpack").exists()


def test_a_pattern_suffix_matches_in_either_case(tmp_path):
    root = _photos(tmp_path / "photos")
    ok("write", f"{root}/{{LABEL}}/*.jpg", tmp_path / "lower.msgpack", "-q")
    ok("write", f"{root}/*/*.JPG", tmp_path / "upper.msgpack", "-q")
    assert keys(tmp_path / "lower.msgpack") == ["cat/1.jpg", "dog/1.jpg", "dog/кофе.JPG"]
    assert keys(tmp_path / "upper.msgpack") == ["cat/1.jpg", "dog/1.jpg", "dog/кофе.JPG"]
    ok("write", root, tmp_path / "include.msgpack", "--include", "dog/*.jpg", "-q")
    assert keys(tmp_path / "include.msgpack") == ["dog/1.jpg", "dog/кофе.JPG"]
    assert "no samples found" in fails(2, "write", root, tmp_path / "none.msgpack",
                                       "--exclude", "*.jpg")  # .JPG is gone too


def test_a_missing_folder_is_named_as_one(tmp_path, capsys):
    out = tmp_path / "out.msgpack"
    for source in ("missing_dir/", "missing_dir/sub", "missing.csv"):
        assert mistake(capsys, 2, "write", source, out) == \
            f"fpipe write: {source}: no such file or folder\n"
    assert "(did you mean cifar10?)" in mistake(capsys, 2, "write", "cifar01", out)
    assert mistake(capsys, 2, "write", "missing_dir/{LABEL}/*.jpg", out) == \
        "fpipe write: missing_dir: no such folder (in the pattern missing_dir/{LABEL}/*.jpg)\n"
    assert "matches no files" in mistake(capsys, 2, "write", f"{tmp_path}/*.png", out)
    assert not out.exists()


def test_a_list_file_header_is_recognised(image_folder, tmp_path):
    for header in ("filename,label", "image path,class", "Path,label"):
        (tmp_path / "list.csv").write_text(f"{header}\nimages/b2/0.jpg,dog\nimages/a/1.jpg,cat\n")
        result = fpipe("write", tmp_path / "list.csv", tmp_path / "list.msgpack", "-y")
        assert result.returncode == 0, result.stderr
        assert ("as a header" in result.stderr) == (header != "Path,label")
        with MsgpackReader(tmp_path / "list.msgpack") as reader:
            assert [(s["key"], s["label"]) for s in reader] == [("images/b2/0.jpg", 1),
                                                                  ("images/a/1.jpg", 0)]
    # a first line naming a file is a sample, not a header, even without a suffix
    (tmp_path / "images" / "plain").write_bytes(jpeg(1))
    (tmp_path / "list.csv").write_text("images/plain\nimages/a/1.jpg\n")
    ok("write", tmp_path / "list.csv", tmp_path / "plain.msgpack", "-q")
    assert keys(tmp_path / "plain.msgpack") == ["images/plain", "images/a/1.jpg"]
