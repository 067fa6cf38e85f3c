"""Labels keep their class names: ``fpipe merge`` renumbers inputs whose class lists differ,
``fpipe write --classes`` reuses another dataset's numbering, ``fpipe info`` says how many
samples its histogram counts."""

import json

import pytest

from fpipe.cli import inspect, main
from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.sets import load_classes

from .conftest import fails, jpeg, keys, leftovers, mistake, ok


def _dataset(path, classes, labels, prefix):
    """A dataset whose samples have ``labels`` (numbers), with the class list ``classes``."""
    with FileWriter(path) as writer:
        for i, label in enumerate(labels):
            writer.write({"key": f"{prefix}{i}", "data": bytes(i % 50), "label": label})
    if classes is not None:
        (path.parent / f"{path.name}.classes.json").write_text(
            json.dumps({"dataset": prefix, "classes": {"label": classes}}))
    return path


def _named(path):
    """Each sample's key and the name of its class."""
    names = load_classes(path)["label"]
    with MsgpackReader(path) as reader:
        return {sample["key"]: names[sample["label"]] for sample in reader}


def _fruit(tmp_path):
    a = _dataset(tmp_path / "a.msgpack", ["apple", "banana"], [0, 1, 1, 0], "a")
    b = _dataset(tmp_path / "b.msgpack", ["banana", "cherry"], [0, 1, 0], "b")
    return a, b


@pytest.mark.parametrize("strategy", ["concat", "random"])
def test_merge_renumbers_labels_by_class_name(tmp_path, strategy):
    a, b = _fruit(tmp_path)
    out = tmp_path / "out.msgpack"
    result = _merge(a, b, out, strategy)
    assert load_classes(out) == {"label": ("apple", "banana", "cherry")}
    assert _named(out) == {**_named(a), **_named(b)}  # banana is banana, whichever input
    assert "labels of" in result.stderr and str(b) in result.stderr and str(a) + " " not in \
        result.stderr
    with MsgpackReader(out) as merged, MsgpackReader(a) as first:
        raw = dict(merged.iter(yield_key=True, raw=True))
        # the first input keeps its numbers and its bytes; only the label's bytes change
        assert all(bytes(raw[key]) == bytes(data) for key, data in first.iter(yield_key=True,
                                                                               raw=True))
    assert ok("verify", out, "-q") == ""


def _merge(a, b, out, strategy):
    from .conftest import fpipe

    extra = ["--strategy", "random", "--seed", "2"] if strategy == "random" else []
    result = fpipe("merge", a, b, out, *extra)
    assert result.returncode == 0, result.stderr
    return result


def test_merge_of_equal_class_lists_copies_the_list_and_the_bytes(tmp_path):
    a = _dataset(tmp_path / "a.msgpack", ["x", "y"], [0, 1], "a")
    b = _dataset(tmp_path / "b.msgpack", ["x", "y"], [1, 1], "b")
    ok("merge", a, b, tmp_path / "out.msgpack")
    assert (tmp_path / "out.msgpack.classes.json").read_text() == \
        (tmp_path / "a.msgpack.classes.json").read_text()
    assert _named(tmp_path / "out.msgpack") == {**_named(a), **_named(b)}


def test_merge_refuses_labels_it_cannot_match_by_name(tmp_path):
    a, _ = _fruit(tmp_path)
    bare = _dataset(tmp_path / "bare.msgpack", None, [0, 1], "c")
    out = tmp_path / "out.msgpack"
    message = fails(1, "merge", a, bare, out)
    assert f"{bare} has no class list" in message and "nothing was written" in message
    wrong = _dataset(tmp_path / "wrong.msgpack", ["banana"], [0, 3], "w")
    message = fails(1, "merge", a, wrong, out)
    assert f"{wrong}: sample 1 (key 'w1'): label is 3, not a class number" in message
    (tmp_path / "bad.msgpack.classes.json").write_text("[1, 2]")
    _dataset(tmp_path / "bad.msgpack", None, [0], "d")
    assert "bad.msgpack.classes.json: not a class list" in fails(1, "merge", a,
                                                                 tmp_path / "bad.msgpack", out)
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_class_list_may_name_a_class_twice_as_imagenets_does(tmp_path, capsys):
    crane = ["crane", "ox", "crane"]  # ImageNet names 'crane' twice (a bird and a machine)
    a = _dataset(tmp_path / "a.msgpack", crane, [0, 1, 2], "a")
    b = _dataset(tmp_path / "b.msgpack", crane, [2, 2], "b")
    ok("merge", a, b, tmp_path / "out.msgpack")  # equal lists: copied, labels untouched
    assert load_classes(tmp_path / "out.msgpack") == {"label": tuple(crane)}
    with MsgpackReader(tmp_path / "out.msgpack") as merged:
        assert [sample["label"] for sample in merged] == [0, 1, 2, 2, 2]
    assert "label" in ok("info", a, "--json")
    other = _dataset(tmp_path / "c.msgpack", ["ox"], [0], "c")
    assert "names the class 'crane' twice" in fails(1, "merge", a, other,
                                                     tmp_path / "o2.msgpack")
    ox = _folder(tmp_path / "ox_only", ["ox"])
    ok("write", ox, tmp_path / "ox.msgpack", "--classes", a, "-q")
    with MsgpackReader(tmp_path / "ox.msgpack") as written:
        assert [sample["label"] for sample in written] == [1]
    cranes = _folder(tmp_path / "cranes", ["crane"])
    assert "names the class 'crane' twice" in fails(1, "write", cranes,
                                                     tmp_path / "c2.msgpack", "--classes", a)


def _folder(root, classes):
    for i, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        (root / name / f"{i}.jpg").write_bytes(jpeg(i))
    return root


def test_write_classes_keeps_the_training_numbering(tmp_path, capsys):
    train = tmp_path / "train.msgpack"
    ok("write", _folder(tmp_path / "train", ["class0", "class1", "class2", "class3"]), train, "-q")
    val = _folder(tmp_path / "val", ["class1", "class3"])  # a validation folder missing classes
    for given in (train, f"{train}.classes.json"):
        out = tmp_path / "val.msgpack"
        ok("write", val, out, "--classes", given, "-y", "-q")
        assert load_classes(out) == load_classes(train)
        assert _named(out) == {"class1/0.jpg": "class1", "class3/1.jpg": "class3"}
    subset = tmp_path / "subset.msgpack"
    ok("write", tmp_path / "train", subset, "--include", "class[12]/*", "--classes", train, "-q")
    with MsgpackReader(subset) as reader:
        assert [sample["label"] for sample in reader] == [1, 2]
    other = _folder(tmp_path / "other", ["class1", "dog", "emu"])
    message = mistake(capsys, 2, "write", other, tmp_path / "x.msgpack", "--classes", train)
    assert "2 label(s) are not among its 4 classes: dog, emu" in message
    assert "not found" in mistake(capsys, 2, "write", val, tmp_path / "x.msgpack", "--classes",
                                  tmp_path / "none.msgpack")
    assert not (tmp_path / "x.msgpack").exists()


def test_write_says_when_include_leaves_classes_empty(tmp_path):
    from .conftest import fpipe

    root = _folder(tmp_path / "train", ["class0", "class1", "class2"])
    result = fpipe("write", root, tmp_path / "out.msgpack", "--include", "class[12]/*")
    assert result.returncode == 0, result.stderr
    assert ("no sample is left in 1 class(es) (class0), so the labels are numbered among the 2 "
            "that are; --classes FILE keeps another dataset's numbering") in result.stderr
    assert keys(tmp_path / "out.msgpack") == ["class1/1.jpg", "class2/2.jpg"]


def test_info_counts_every_label_and_says_how_many(tmp_path, capsys, monkeypatch):
    path = _dataset(tmp_path / "set.msgpack", ["a", "b", "c"], [i % 3 for i in range(3000)], "s")
    summary = json.loads(ok("info", path, "--json", "--samples", "7"))
    assert summary["examined"] == 7  # fields from a few samples, labels from all of them
    assert summary["labels"]["counted"] == 3000
    assert [row["count"] for row in summary["labels"]["counts"]] == [1000, 1000, 1000]
    assert "labels       label: 3 values, counted in all 3000 samples" in ok("info", path)
    assert main(["info", str(path), "--label", "class"]) == 0
    assert "no sample of the 3000 counted has the field 'class'" in capsys.readouterr().err
    # Above the size limit (or for a URL) the histogram counts the examined samples, and says so.
    monkeypatch.setattr(inspect, "_LABEL_SCAN_BYTES", 0)
    assert main(["info", str(path), "--samples", "7"]) == 0
    text = capsys.readouterr().out
    assert ("labels       label: 3 values, counted in 7 of 3000 samples, spread evenly (--all "
            "counts every one)") in text
