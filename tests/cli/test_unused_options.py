"""An option that would be silently ignored is an error that names it: every command."""

import json

import pytest

from .conftest import make_dataset, mistake, ok


@pytest.fixture
def files(tmp_path, image_folder, dataset):
    (tmp_path / "s.jsonl").write_text(json.dumps({"key": "a", "label": 1}) + "\n")
    return {"images": image_folder, "dataset": dataset, "jsonl": tmp_path / "s.jsonl",
            "out": tmp_path / "out.msgpack", "tmp": tmp_path}


CASES = [
    # write
    (["write", "{images}", "{out}", "--seed", "3"], "--seed has no effect without --shuffle"),
    (["write", "{images}", "{out}", "--quality", "50"],
     "--quality has no effect without --encode or --resize"),
    (["write", "{images}", "{out}", "--quality", "50", "--encode", "png"],
     "--quality has no effect with --encode png"),
    (["write", "{images}", "{out}", "--append"], "--append: {out} does not exist"),
    (["write", "{images}", "{tmp}", "--append"], "--append: {tmp} is a folder, not a dataset"),
    (["write", "{images}", "{out}", "--separator", ";"],
     "--separator has no effect on a folder (ImageFolder layout)"),
    (["write", "{jsonl}", "{out}", "--field", "pixels", "--check"],
     "--field, --check have no effect on JSON lines"),
    (["write", "{images}", "{out}", "--no-verify", "--split", "train"],
     "--no-verify, --split have no effect with files"),
    (["write", "mnist", "{tmp}", "--quality", "50", "--skip-bad"],
     "--skip-bad, --quality have no effect with the well-known dataset mnist"),
    (["write", "{jsonl}", "{out}", "--classes", "{dataset}"], "--classes: {jsonl} has no label names"),
    # cat and info
    (["cat", "{dataset}", "--start", "50"], "--start 50 is past the end: {dataset} has 50 samples"),
    (["cat", "{dataset}", "--key", "s0001", "--start", "1", "-n", "2"],
     "--start, -n/--limit have no effect with --key"),
    (["cat", "{dataset}", "--keys", "-s", "10"], "-s/--max-string has no effect with --keys"),
    (["info", "{dataset}", "--all", "--samples", "10"], "--samples has no effect with --all"),
    # datasets from datasets
    (["merge", "{dataset}", "{dataset}", "{out}", "--seed", "1"],
     "--seed has no effect with --strategy concat"),
    (["split", "{dataset}", "--counts", "10", "-o", "{out}", "{tmp}/b.msgpack", "--seed", "1"],
     "--seed has no effect without --shuffle"),
    (["shuffle", "{dataset}", "{out}", "--buf-size", "0.5"],
     "--buf-size has no effect with --mode true"),
    # bench and demo
    (["bench", "{dataset}", "--workers", "3"], "--workers has no effect without --pipeline"),
    (["bench", "{dataset}", "--modes", "sequential", "--seed", "1"],
     "--seed has no effect without a shuffled read"),
    (["demo", "--data", "{images}", "--images", "10"], "--images has no effect with --data"),
    (["demo", "-y"], "-y/--overwrite has no effect without --keep"),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(case[0]) for case in CASES])
def test_an_option_that_would_be_ignored_is_refused(files, capsys, argv, message):
    error = mistake(capsys, 2, *[arg.format(**files) for arg in argv])
    assert message.format(**files) in error and len(error.splitlines()) == 1
    assert not files["out"].exists()


def test_the_same_options_work_where_they_apply(files, tmp_path):
    ok("write", files["images"], files["out"], "--shuffle", "--seed", "3", "--resize", "4",
       "--quality", "50", "-q")
    assert ok("cat", files["dataset"], "--start", "49", "--keys") == "s0049\n"
    assert ok("cat", make_dataset(tmp_path / "empty.msgpack", 0)) == ""
    ok("merge", files["dataset"], make_dataset(tmp_path / "b.msgpack", 3, prefix="b"),
       tmp_path / "m.msgpack", "--strategy", "random", "--seed", "1", "-q")
    ok("shuffle", files["dataset"], tmp_path / "q.msgpack", "--mode", "quasi", "--buf-size",
       "0.5", "-q")
