"""``fpipe cat`` and ``fpipe info``."""

import json
import subprocess
import sys

from fpipe.cli import main
from fpipe.dataset import FileWriter

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


ODD_KEYS = ["plain/1.jpg", "two\nlines", "cr\rlf", 'say "hi"', '"quoted"', "tab\there",
            "back\\slash", "é ☃", "del\x7f", "nl\u2028sep", "\x1b[31mred"]


def _odd_keys(path):
    with FileWriter(path) as writer:
        for key in ODD_KEYS:
            writer.write({"key": key})
    return path


def test_cat_keys_prints_one_line_per_key_with_odd_ones_as_json(tmp_path):
    result = subprocess.run([sys.executable, "-m", "fpipe", "cat", str(_odd_keys(
        tmp_path / "odd.msgpack")), "--keys"], capture_output=True, env=ENV, timeout=120)
    lines = result.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) == len(ODD_KEYS) + 1
    assert [json.loads(line) if line.startswith('"') else line for line in lines[:-1]] == ODD_KEYS
    quoted = [key for key, line in zip(ODD_KEYS, lines) if line.startswith('"')]
    assert quoted == ["two\nlines", "cr\rlf", '"quoted"', "tab\there", "del\x7f", "\x1b[31mred"]


def test_cat_keys_null_separated_for_xargs(tmp_path, capsys):
    path = _odd_keys(tmp_path / "odd.msgpack")
    result = subprocess.run([sys.executable, "-m", "fpipe", "cat", str(path), "--keys", "-z"],
                            capture_output=True, env=ENV, timeout=120)
    assert result.stdout.decode().split("\0") == [*ODD_KEYS, ""] and result.returncode == 0
    assert main(["cat", str(path), "--keys", "--null", "-n", "2"]) == 0
    assert capsys.readouterr().out == "plain/1.jpg\0two\nlines\0"
    assert "-z/--null has no effect without --keys" in mistake(capsys, 2, "cat", path, "--null")
    with FileWriter(tmp_path / "nul.msgpack") as writer:
        writer.write({"key": "a\0b"})
    assert "holds a NUL character" in fails(1, "cat", tmp_path / "nul.msgpack", "--keys", "-z")
    assert ok("cat", tmp_path / "nul.msgpack", "--keys") == '"a\\u0000b"\n'


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


def test_a_command_out_of_memory_says_so_without_a_traceback(dataset, capsys, monkeypatch):
    import fpipe.cli.inspect as inspect_command

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.45 GiB for an array")

    monkeypatch.setattr(inspect_command, "_info_lines", no_memory)
    error = mistake(capsys, 1, "info", dataset)
    assert error.strip() == "fpipe info: out of memory (Unable to allocate 7.45 GiB for an array)"
