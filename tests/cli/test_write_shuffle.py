"""``fpipe write --shuffle`` from files: the listed samples in another order, the same for a
seed, dealt into bucket files beside OUT that are gone when the command ends, however it ends
(the memory it takes is in test_bounded_tools.py)."""

import io
import json
import os

import pytest
from PIL import Image

import fpipe.cli.write as write_command
from fpipe.cli import main
from fpipe.dataset import MsgpackReader


def _pngs(folder, n: int, broken: int | None = None):
    """``n`` small PNG files ``0.png``... of distinct colours; the one numbered ``broken`` is
    not a PNG inside."""
    os.makedirs(folder)
    for i in range(n):
        buffer = io.BytesIO()
        Image.new("RGB", (4, 4), (i, 255 - i, 7)).save(buffer, "PNG")
        data = b"not a PNG at all" if i == broken else buffer.getvalue()
        with open(os.path.join(folder, f"{i}.png"), "wb") as file:
            file.write(data)
    return folder


def _json_lines(path, n: int):
    """``n`` samples of JSON values that must come back as they were: labels, floats,
    nested lists and objects, keys that are not ASCII."""
    with open(path, "w", encoding="utf-8") as file:
        for i in range(n):
            file.write(json.dumps({"key": f"clé-{i}", "label": f"c{i % 3}", "x": i / 7,
                                   "nested": {"list": [i, None, True, "ü"]}}) + "\n")
    return path


def _samples(path) -> list:
    with MsgpackReader(path) as reader:
        return [reader[i] for i in range(len(reader))]


@pytest.fixture
def seen_buckets(monkeypatch, tmp_path):
    """The names of the bucket files beside OUT (in ``tmp_path``) when the first sample is
    made, recorded by a spy on the samples' maker."""
    seen: list[str] = []
    make = write_command.SampleMaker.__call__

    def spy(self, entry):
        if not seen:
            seen.extend(sorted(f"{folder}/{name}" for folder in os.listdir(tmp_path)
                               if folder.startswith(".fpipe-shuffle-")
                               for name in os.listdir(tmp_path / folder)))
        return make(self, entry)

    monkeypatch.setattr(write_command.SampleMaker, "__call__", spy)
    return seen


def _hidden(folder) -> list[str]:
    return [name for name in os.listdir(folder) if name.startswith(".")]


@pytest.mark.parametrize("source", ["folder", "JSON lines"])
def test_shuffle_is_a_permutation_of_the_listed_samples_the_same_for_a_seed(
        tmp_path, monkeypatch, seen_buckets, source):
    monkeypatch.setattr("fpipe.cli._shuffle.BUCKET_ENTRIES", 16)  # 7 buckets of 100
    path = _pngs(tmp_path / "pngs", 100) if source == "folder" else \
        _json_lines(tmp_path / "samples.jsonl", 100)
    written = {}
    for name, order in {"listed": [], "one": ["--seed", "1"], "again": ["--seed", "1"],
                        "two": ["--seed", "2"]}.items():
        shuffle = ["--shuffle", *order] if order else []
        assert main(["write", str(path), str(tmp_path / f"{name}.msgpack"), "-q", *shuffle]) == 0
        written[name] = _samples(tmp_path / f"{name}.msgpack")
    assert len({name.split("/")[1] for name in seen_buckets}) == 7  # dealt into 7 buckets
    keys = {name: [sample["key"] for sample in samples] for name, samples in written.items()}
    by_key = {sample["key"]: sample for sample in written["listed"]}
    assert sorted(keys["one"]) == sorted(keys["listed"])  # the same samples, whole
    assert all(sample == by_key[sample["key"]] for sample in written["one"])
    assert keys["one"] == keys["again"] and keys["one"] != keys["two"]
    assert keys["one"] != keys["listed"] and keys["two"] != keys["listed"]
    assert not _hidden(tmp_path)


def test_shuffle_removes_its_buckets_after_success(tmp_path, seen_buckets):
    assert main(["write", str(_pngs(tmp_path / "pngs", 30)), str(tmp_path / "out.msgpack"),
                 "-q", "--shuffle"]) == 0
    assert len(seen_buckets) == 1  # one bucket file, beside OUT, while the samples were made
    assert not _hidden(tmp_path) and len(_samples(tmp_path / "out.msgpack")) == 30


def test_shuffle_removes_its_buckets_when_a_file_stops_the_run(tmp_path, seen_buckets, capsys):
    pngs = _pngs(tmp_path / "pngs", 30, broken=17)
    assert main(["write", str(pngs), str(tmp_path / "out.msgpack"), "-q", "--shuffle",
                 "--check"]) == 1
    assert "17.png" in capsys.readouterr().err
    assert seen_buckets and not _hidden(tmp_path) and not (tmp_path / "out.msgpack").exists()


def test_shuffle_removes_its_buckets_when_interrupted(tmp_path, monkeypatch, seen_buckets,
                                                      capsys):
    make, made = write_command.SampleMaker.__call__, []  # the spy of seen_buckets

    def interrupted(self, entry):
        made.append(entry)
        if len(made) == 10:
            raise KeyboardInterrupt
        return make(self, entry)

    monkeypatch.setattr(write_command.SampleMaker, "__call__", interrupted)
    assert main(["write", str(_pngs(tmp_path / "pngs", 30)), str(tmp_path / "out.msgpack"),
                 "-q", "--shuffle"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert seen_buckets and not _hidden(tmp_path) and not (tmp_path / "out.msgpack").exists()
