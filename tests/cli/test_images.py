"""Damaged images: ``fpipe write`` names each one it packs (by default, after a cheap look) or
leaves out (``--skip-bad``); ``fpipe verify --images`` finds them in a dataset; ``fpipe bench
--pipeline`` names the sample that does not decode."""

import io

import numpy as np
import pytest
from PIL import Image

from fpipe.dataset import FileWriter, MsgpackReader

from .conftest import fails, fpipe, jpeg, keys, mistake, ok


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (20, 30, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.fixture
def damaged(image_folder):
    """The image folder with a JPEG and a PNG cut short, as an interrupted copy leaves them."""
    whole = jpeg(5, size=(64, 48))
    (image_folder / "b2" / "1.jpg").write_bytes(whole[:len(whole) * 2 // 3])
    (image_folder / "a" / "9.png").write_bytes(_png(3)[:-30])
    return image_folder


def _stderr_lines(*argv):
    result = fpipe(*argv)
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if "note:" not in line]


@pytest.mark.parametrize("workers", ["1", "3"])
def test_write_names_each_damaged_image_it_packs(damaged, tmp_path, workers):
    out = tmp_path / "out.msgpack"
    lines = _stderr_lines("write", damaged, out, "--workers", workers)
    assert lines[0].startswith(f"fpipe write: warning: {damaged / 'a' / '9.png'}: the PNG data "
                               "ends before its IEND chunk")
    assert lines[1].startswith(f"fpipe write: warning: {damaged / 'b2' / '1.jpg'}: the JPEG data "
                               "ends before its end-of-image marker")
    assert lines[2] == ("fpipe write: warning: 2 image(s) look damaged and were packed as they "
                        "are; --skip-bad leaves out the images that do not decode, --check stops "
                        "at the first")
    assert len(keys(out)) == 8  # packed as they are, as the warning says


def test_skip_bad_leaves_out_what_does_not_decode_and_lists_it(damaged, tmp_path):
    out = tmp_path / "out.msgpack"
    result = fpipe("write", damaged, out, "--skip-bad", "--workers", "2")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "note:" not in line]
    assert [line.split(": ")[0:2] for line in lines[:2]] == [
        ["fpipe write", f"left out {damaged / 'a' / '9.png'}"],
        ["fpipe write", f"left out {damaged / 'b2' / '1.jpg'}"]]
    assert lines[2] == "fpipe write: left out 2 image(s) that do not decode (--skip-bad)"
    assert "wrote 6 samples" in result.stdout
    assert "a/9.png" not in keys(out) and "b2/1.jpg" not in keys(out) and len(keys(out)) == 6
    with MsgpackReader(out) as reader:  # the labels of the others are unchanged
        assert [(s["key"], s["label"]) for s in reader][:3] == [("a/0.jpg", 0), ("a/1.jpg", 0),
                                                                 ("b2/0.jpg", 1)]


def test_skip_bad_with_resize_and_nothing_left(damaged, tmp_path, capsys):
    out = tmp_path / "small.msgpack"
    result = fpipe("write", damaged, out, "--skip-bad", "--resize", "8")
    assert result.returncode == 0, result.stderr
    assert "left out 2 image(s)" in result.stderr and len(keys(out)) == 6
    assert "cannot re-encode as an image" in fails(1, "write", damaged, tmp_path / "x.msgpack",
                                                   "--resize", "8")
    broken = tmp_path / "broken"
    (broken / "a").mkdir(parents=True)
    (broken / "a" / "0.jpg").write_bytes(b"\xff\xd8\xff nothing")
    assert "none of the 1 images decodes" in fails(1, "write", broken, tmp_path / "y.msgpack",
                                                   "--skip-bad")
    assert "not allowed with argument" in mistake(capsys, 2, "write", broken, tmp_path / "z",
                                                  "--skip-bad", "--check")
    assert not (tmp_path / "x.msgpack").exists() and not (tmp_path / "y.msgpack").exists()


def _with_cut_image(path):
    whole = jpeg(1, size=(40, 40))
    with FileWriter(path) as writer:
        for i in range(20):
            writer.write({"key": f"k{i}", "image": whole[:len(whole) // 2] if i == 6 else whole,
                          "label": 1})
    return path


def test_verify_images_decodes_every_image(tmp_path, capsys):
    path = _with_cut_image(tmp_path / "set.msgpack")
    assert ok("verify", path).startswith(f"{path}: ok")  # the structure is fine
    result = fpipe("verify", path, "--images")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == f"{path}: 1 problem(s)"
    assert lines[1].startswith("  sample 6 (key 'k6'), field 'image': the JPEG data ends before its "
                        "end-of-image marker (cut off?)")
    assert "--images has no effect with --quick" in mistake(capsys, 2, "verify", path, "--images",
                                                            "--quick")


def test_bench_pipeline_names_the_sample_that_does_not_decode(tmp_path):
    path = _with_cut_image(tmp_path / "set.msgpack")
    message = fails(1, "bench", path, "--pipeline", "--modes", "sequential", "--seconds", "1",
                    "--workers", "1", "-q")
    assert message.startswith("fpipe bench: sample 6 (key 'k6'), field 'image': cannot decode")
    assert len(message.splitlines()) == 1
