"""``fpipe cat`` and ``fpipe info``."""

import json
import subprocess
import sys

from fpipe.storage import FileWriter

from .conftest import ENV, fails, make_dataset, mistake, ok


def test_cat_prints_one_readable_line_per_sample(dataset, capsys):
    lines = ok("cat", dataset, "--start", "2", "-n", "3", "-s", "4").splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("{'key': 's0002', 'data': b'") and "...(22 bytes)" in lines[0]
    assert lines[0].endswith("'label': 2}")
    assert ok("cat", dataset, "--keys", "-n", "2").splitlines() == ["s0000", "s0001"]
    assert ok("cat", dataset, "--key", "s0049", "--key", "s0003", "--keys").split() == ["s0049", "s0003"]
    assert "has no sample with key 'nope'" in fails(2, "cat", dataset, "--key", "nope")
    assert "not found" in mistake(capsys, 2, "cat", dataset.with_name("missing.msgpack"))
    assert "is a folder, not a dataset (it holds set.msgpack)" in mistake(capsys, 2, "cat",
                                                                           dataset.parent)
    assert "must be >= 0" in mistake(capsys, 2, "cat", dataset, "-n", "-1")
    # a non-UTF-8 byte in an argument arrives as a lone surrogate, which no dataset holds
    assert "has no sample with key 's0001\\udcff'" in mistake(capsys, 2, "cat", dataset, "--key",
                                                               "s0001\udcff")


def test_cat_survives_a_closed_pipe(tmp_path):
    big = make_dataset(tmp_path / "big.msgpack", 3000)  # far more than a pipe buffer of output
    process = subprocess.Popen([sys.executable, "-m", "fpipe", "cat", str(big)], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()
    process.stdout.close()  # what `| head -1` does
    stderr = process.stderr.read().decode()
    process.wait(timeout=60)
    process.stderr.close()
    assert first.startswith(b"{'key': 's0000'")
    assert process.returncode == 141 and stderr == ""


def test_info_counts_sizes_keys_fields_and_labels(tmp_path, capsys):
    path = tmp_path / "mixed.msgpack"
    with FileWriter(path) as writer:
        for i in range(30):
            writer.write({"key": f"k{i:02d}", "label": i % 3, "score": i / 10,
                          "image": b"\x89PNG\r\n\x1a\n" + bytes(i)})
    (tmp_path / "mixed.msgpack.classes.json").write_text(
        json.dumps({"classes": {"label": ["cat", "dog", "emu"]}}))
    summary = json.loads(ok("info", path, "--json"))
    assert summary["samples"] == 30 and summary["examined"] == 30
    assert summary["keys"] == {"first": "k00", "last": "k29", "min": "k00", "max": "k29"}
    assert summary["data_bytes"] == path.stat().st_size
    assert summary["fields"]["score"]["types"]["float"]["range"] == [0.0, 2.9]
    assert summary["fields"]["image"]["types"]["bytes"]["kinds"] == {"PNG": 30}
    assert summary["labels"]["counts"] == [{"value": 0, "count": 10, "name": "cat"},
                                           {"value": 1, "count": 10, "name": "dog"},
                                           {"value": 2, "count": 10, "name": "emu"}]
    text = ok("info", path, "--samples", "7")
    assert "samples      30" in text and "(from 7 of 30 samples)" in text
    assert "  label  int 7 (0 .. 2)" in text and "  0 cat" in text
    assert "not found" in mistake(capsys, 2, "info", tmp_path / "nothing.msgpack")
