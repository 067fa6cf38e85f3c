"""``fpipe shuffle``, ``merge``, ``split`` and ``sample``: every sample exactly once, by key."""

import json
from collections import Counter

from fpipe.dataset import MsgpackReader

from .conftest import fails, keys, leftovers, make_dataset, mistake, ok


def _raw(path):
    with MsgpackReader(path) as reader:
        return dict(reader.iter(yield_key=True, raw=True))


def test_shuffle_true_and_quasi_keep_every_sample_and_follow_the_seed(dataset, tmp_path):
    original = keys(dataset)
    (tmp_path / "set.msgpack.classes.json").write_text(json.dumps({"classes": {"label": ["a"]}}))
    for mode, reads in (("true", []), ("quasi", ["--buf-size", "8", "--chunk-size", "4"])):
        ok("shuffle", dataset, tmp_path / f"{mode}-1.msgpack", "--mode", mode, "--seed", "1", *reads)
        ok("shuffle", dataset, tmp_path / f"{mode}-1b.msgpack", "--mode", mode, "--seed", "1",
           *reads, "-q")
        shuffled = keys(tmp_path / f"{mode}-1.msgpack")
        assert sorted(shuffled) == original and shuffled != original
        assert shuffled == keys(tmp_path / f"{mode}-1b.msgpack")
        assert _raw(tmp_path / f"{mode}-1.msgpack") == _raw(dataset)  # bytes copied as they are
        assert (tmp_path / f"{mode}-1.msgpack.classes.json").exists()
    assert keys(tmp_path / "true-1.msgpack") != keys(tmp_path / "quasi-1.msgpack")
    ok("shuffle", dataset, tmp_path / "true-2.msgpack", "-q", "--seed", "2")
    assert keys(tmp_path / "true-2.msgpack") != keys(tmp_path / "true-1.msgpack")


def test_shuffle_never_writes_over_its_input_but_mv_puts_the_result_there(dataset, tmp_path,
                                                                          capsys):
    raw, files = _raw(dataset), {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for spelling in (dataset, tmp_path / "." / dataset.name):
        for overwrite in ((), ("-y",)):
            assert "an output never replaces an input" in fails(2, "shuffle", dataset, spelling,
                                                                *overwrite)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    ok("shuffle", dataset, tmp_path / "new.msgpack", "-q")
    ok("mv", tmp_path / "new.msgpack", dataset, "-y", "-q")
    assert _raw(dataset) == raw and list(_raw(dataset)) != list(raw)
    assert ok("verify", dataset).startswith(f"{dataset}: ok")
    assert "--buf-size: must be a finite number > 0" in mistake(
        capsys, 2, "shuffle", dataset, tmp_path / "x.msgpack", "--mode", "quasi", "--buf-size", "0")
    assert "invalid choice" in mistake(capsys, 2, "shuffle", dataset, tmp_path / "x.msgpack",
                                       "--mode", "fast")
    assert leftovers(tmp_path) == []


def test_merge_concat_and_random_keep_every_sample(tmp_path):
    a = make_dataset(tmp_path / "a.msgpack", 30, prefix="a")
    b = make_dataset(tmp_path / "b.msgpack", 10, prefix="b")
    ok("merge", a, b, tmp_path / "concat.msgpack")
    assert keys(tmp_path / "concat.msgpack") == keys(a) + keys(b)
    ok("merge", a, b, tmp_path / "random.msgpack", "--strategy", "random", "--seed", "3")
    mixed = keys(tmp_path / "random.msgpack")
    assert sorted(mixed) == sorted(keys(a) + keys(b)) and mixed != keys(a) + keys(b)
    # Each input keeps its own order, and is spread over the whole output.
    assert [k for k in mixed if k[0] == "a"] == keys(a) and [k for k in mixed if k[0] == "b"] == keys(b)
    assert {k[0] for k in mixed[:20]} == {"a", "b"}
    assert _raw(tmp_path / "random.msgpack") == {**_raw(a), **_raw(b)}


def test_merge_reports_duplicate_keys_and_writes_nothing(tmp_path):
    a = make_dataset(tmp_path / "a.msgpack", 10)
    b = make_dataset(tmp_path / "b.msgpack", 4)
    message = fails(1, "merge", a, b, tmp_path / "out.msgpack")
    assert "4 duplicate key(s), nothing was written" in message
    assert f"'s0000' is sample 0 of {a} and sample 0 of {b}" in message
    assert not (tmp_path / "out.msgpack").exists()
    assert "not found" in fails(2, "merge", a, tmp_path / "none.msgpack", tmp_path / "out.msgpack")


def test_split_puts_every_sample_in_exactly_one_part(dataset, tmp_path):
    parts = [tmp_path / f"part{i}.msgpack" for i in range(3)]
    ok("split", dataset, "--counts", "10", "15", "-o", *parts)
    assert [keys(p) for p in parts] == [keys(dataset)[:10], keys(dataset)[10:25], keys(dataset)[25:]]
    ok("split", dataset, "--fractions", "0.8", "0.2", "-o", *parts[:2], "--shuffle", "-y", "-q")
    train, val = keys(parts[0]), keys(parts[1])
    assert (len(train), len(val)) == (40, 10)
    assert Counter(train + val) == Counter(keys(dataset))
    assert train == sorted(train) and train != keys(dataset)[:40]  # a random subset, in order
    ok("split", dataset, "--fractions", "0.5", "-o", tmp_path / "x.msgpack", tmp_path / "y.msgpack")
    assert len(keys(tmp_path / "x.msgpack")) == len(keys(tmp_path / "y.msgpack")) == 25


def test_split_mistakes_exit_2_and_write_nothing(dataset, tmp_path, capsys):
    out = [tmp_path / "p.msgpack", tmp_path / "q.msgpack"]
    assert "add up to 30 but IN has 50 samples" in fails(2, "split", dataset, "--counts", "10", "20",
                                                        "-o", *out)
    assert "add up to 60 samples, but IN has 50" in mistake(capsys, 2, "split", dataset, "--counts",
                                                           "60", "-o", *out)
    assert "add up to 0.9, not 1" in mistake(capsys, 2, "split", dataset, "--fractions", "0.4",
                                             "0.5", "-o", *out)
    assert "needs 2 or 1 values" in mistake(capsys, 2, "split", dataset, "--counts", "1", "2", "3",
                                            "-o", *out)
    assert "one of the arguments --counts --fractions is required" in mistake(
        capsys, 2, "split", dataset, "-o", *out)
    assert "is given twice" in mistake(capsys, 2, "split", dataset, "--counts", "5", "-o", out[0],
                                       out[0])
    assert not out[0].exists() and not out[1].exists() and leftovers(tmp_path) == []


def test_sample_draws_a_seeded_subset_in_order(dataset, tmp_path):
    ok("sample", dataset, tmp_path / "s1.msgpack", "7", "--seed", "1")
    ok("sample", dataset, tmp_path / "s1b.msgpack", "7", "--seed", "1")
    ok("sample", dataset, tmp_path / "s2.msgpack", "7", "--seed", "2")
    drawn = keys(tmp_path / "s1.msgpack")
    assert len(drawn) == 7 and drawn == sorted(drawn) and set(drawn) <= set(keys(dataset))
    assert drawn == keys(tmp_path / "s1b.msgpack") != keys(tmp_path / "s2.msgpack")
    assert "N is 51 but" in fails(2, "sample", dataset, tmp_path / "big.msgpack", "51")
    assert not (tmp_path / "big.msgpack").exists()
