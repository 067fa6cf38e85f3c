"""A newcomer's first session: a folder of photos, some of them damaged (cut off, empty, a text
file named .jpg), packed, verified, demonstrated, benchmarked; and a file that is no dataset
handed to verify and index."""

import io
import re

import numpy as np
import pytest
from PIL import Image

from fpipe.cli import main

from .conftest import fails, fpipe, jpeg, make_dataset, mistake, ok


def _encoded(seed: int, kind: str) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, kind)
    return buffer.getvalue()


# the six damaged files of the folder, and what both checks say of each
DAMAGED = {
    "cat/cut.jpg": "the JPEG data ends before its end-of-image marker (cut off?)",
    "cat/notes.jpg": "not an image (its 15 bytes start with b'shopping list\\n\\n')",
    "dog/cut.png": "the PNG data ends before its IEND chunk (cut off?)",
    "dog/empty.jpg": "empty file (0 bytes)",
    "dog/cut.gif": "the GIF data ends without its trailer (cut off?)",
    "cat/zeros.jpg": "cannot decode 203 bytes starting b'\\xff\\xd8\\xff\\x00",
}


@pytest.fixture
def photos(tmp_path):
    root = tmp_path / "photos"
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            (root / label / f"{i}.jpg").write_bytes(jpeg(i + 10 * len(label), size=(32, 24)))
    whole = _encoded(1, "JPEG")
    (root / "cat" / "cut.jpg").write_bytes(whole[:len(whole) // 2])
    (root / "cat" / "notes.jpg").write_text("shopping list\n\n")
    (root / "cat" / "zeros.jpg").write_bytes(b"\xff\xd8\xff" + bytes(200))
    (root / "dog" / "cut.png").write_bytes(_encoded(2, "PNG")[:-30])
    (root / "dog" / "empty.jpg").write_bytes(b"")
    gif = _encoded(3, "GIF")
    (root / "dog" / "cut.gif").write_bytes(gif[:len(gif) // 2])
    return root


def _reasons(lines, pattern):
    found = {}
    for line in lines:
        match = re.match(pattern, line)
        if match:
            found[match["name"]] = match["reason"]
    return found


def test_verify_images_finds_the_problems_that_write_found_in_the_same_words(photos, tmp_path):
    out = tmp_path / "photos.msgpack"
    written = fpipe("write", photos, out)
    assert written.returncode == 0, written.stderr
    packed = _reasons(written.stderr.splitlines(),
                      rf"fpipe write: warning: {re.escape(str(photos))}/(?P<name>\S+): (?P<reason>.*)")
    verified = fpipe("verify", out, "--images")
    assert verified.returncode == 1
    found = _reasons(verified.stdout.splitlines(),
                     r"  sample \d+ \(key '(?P<name>[^']+)'\), field 'image': (?P<reason>.*)")
    assert sorted(found) == sorted(packed) == sorted(DAMAGED)
    assert found == packed
    for name, reason in found.items():
        assert reason.startswith(DAMAGED[name]), (name, reason)
    assert verified.stdout.splitlines()[0] == f"{out}: 6 problem(s)"
    assert "hint" not in verified.stdout  # fpipe index rebuilds an index; it mends no image
    assert "<_io." not in written.stderr + verified.stdout


def test_check_and_skip_bad_name_the_empty_file_and_the_text_file_plainly(photos, tmp_path):
    for name in ("cut.jpg", "zeros.jpg"):
        (photos / "cat" / name).unlink()
    for name in ("cut.png", "cut.gif"):
        (photos / "dog" / name).unlink()
    message = fails(1, "write", photos, tmp_path / "a.msgpack", "--check", "-q")
    assert message == f"fpipe write: {photos / 'cat' / 'notes.jpg'}: {DAMAGED['cat/notes.jpg']} (--check)\n"
    skipped = fpipe("write", photos, tmp_path / "b.msgpack", "--skip-bad")
    assert f"fpipe write: left out {photos / 'dog' / 'empty.jpg'}: empty file (0 bytes)" \
        in skipped.stderr.splitlines()


@pytest.mark.parametrize(("content", "kind"), [
    (b"hello\nworld\n", "a text file (it begins 'hello\\nworld\\n')"),
    (jpeg(1), "a JPEG image"),
    (b"PAR1" + bytes(100), "a Parquet file"),
])
def test_verify_and_index_say_a_file_is_not_a_dataset_and_change_nothing(tmp_path, capsys,
                                                                          content, kind):
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    expected = f"{path} is not an fpipe dataset: it is {kind}; a dataset's data file holds msgpack samples"
    for argv in (["verify", path], ["index", path], ["index", path, "-y"], ["index", path, "--dry-run"]):
        message = mistake(capsys, 2, *argv)
        assert message == f"fpipe {argv[0]}: {expected}\n"
        assert "hint" not in message and "repair" not in message
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert path.read_bytes() == content


def test_a_data_file_without_its_index_is_still_a_dataset_to_index(tmp_path, capsys):
    path = make_dataset(tmp_path / "set.msgpack", 20)
    for side in tmp_path.iterdir():
        if side != path:
            side.unlink()
    assert "fpipe index DATASET" in fpipe("verify", path).stdout
    assert "indexed 20 samples" in ok("index", path)


def _table(out: str) -> dict[str, int]:
    """The busy share (percent) of each row of the per-stage table in ``out``."""
    lines = out.split("\nstage ", 1)[1].splitlines()[1:]
    rows = [line.rsplit(None, 5) for line in lines if not line.startswith("bottleneck:")]
    return {name: int(busy.rstrip("%")) for name, _, _, busy, _, _ in rows}


def test_bench_of_a_small_dataset_says_it_is_too_small_and_names_functions_as_its_table(
        tmp_path, capsys, monkeypatch):
    import fpipe.cli.bench as bench

    # a pass over 51 samples is over in about a millisecond, far below the least time; the
    # least is made an hour here so that a busy machine cannot make the pass long enough
    monkeypatch.setattr(bench, "_LEAST_SECONDS", 3600.0)
    path = make_dataset(tmp_path / "small.msgpack", 51)
    assert main(["bench", str(path), "--pipeline", "--workers", "1", "-q"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for line in lines[2:5]:
        assert re.fullmatch(r"\w+ +51  too few samples to measure \(took [\d.]+ ms; give more "
                            r"with a dataset of more samples\)", line), line
    first_batch = next(line for line in lines if line.startswith("first batch after"))
    assert first_batch.endswith("give more with a dataset of more samples)"), first_batch
    assert "samples/s" not in first_batch
    header = next(line for line in lines if line.startswith("pipeline: "))
    table = _table(out)
    assert header.split(" -> ")[1:] == list(table)[1:]  # the same names for the same stages
    bottleneck = lines[-1].removeprefix("bottleneck: ")
    assert bottleneck.startswith("none (") or table[bottleneck] >= 50, (bottleneck, table)


def test_demo_on_a_folder_with_bad_images_leaves_them_out_counted_and_says_why(photos):
    result = fpipe("demo", "--data", photos, "--no-torch", "--workers", "0", "--epochs", "1")
    assert result.returncode == 0, result.stderr
    assert "--skip-bad" in result.stdout.splitlines()[0]
    assert ("(--skip-bad decodes every image and leaves out those that do not decode; without "
            "it, 'fpipe write' packs them as they are with a warning, and --check stops at the "
            "first)") in result.stdout
    lines = result.stderr.splitlines()
    named = [line for line in lines if line.startswith(f"fpipe write: left out {photos}")]
    assert len(named) == 5 and {line.split(": ")[1].removeprefix(f"left out {photos}/")
                                for line in named} < set(DAMAGED)
    assert lines[-2:] == ["fpipe write: ... and 1 more",
                          "fpipe write: left out 6 image(s) that do not decode (--skip-bad)"]
    assert "wrote 6 samples" in result.stdout and "accuracy" in result.stdout


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_demo_epochs_show_their_progress_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    argv = ["demo", "--no-torch", "--workers", "0", "--images", "40", "--classes", "2",
            "--epochs", "2", "--batch-size", "8"]
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(argv) == 0
    shown = terminal.getvalue()
    for epoch in (1, 2):  # each epoch's bar counts the samples of the 40 it will take
        assert re.search(rf"epoch {epoch}/2: +0%\|[^|]*\| 0/40 \[", shown), shown
    monkeypatch.undo()
    assert main(argv) == 0
    assert "epoch 1/2: " not in capsys.readouterr().err  # not a terminal: no bars
