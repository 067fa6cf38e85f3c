"""``fpipe write <dataset> OUT``: exit status 0, 1 for data errors, 2 for user mistakes."""

import subprocess
import sys

import pytest

import fpipe.sets
from fpipe.cli import main
from fpipe.dataset import MsgpackReader

from .archives import make_cifar10, make_mnist, with_local_md5


def _run(capsys, *argv):
    status = main(["write", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_write_from_local_archives(tmp_path, capsys):
    make_cifar10(tmp_path)
    status, out, err = _run(capsys, "cifar10", tmp_path / "out", "--from", tmp_path, "--no-verify",
                            "--workers", "2", "--shuffle", "--seed", "3")
    assert (status, err) == (0, "")
    assert out.splitlines() == [f"train: {tmp_path}/out/train.msgpack (10 samples)",
                                f"test: {tmp_path}/out/test.msgpack (3 samples)"]
    assert len(MsgpackReader(tmp_path / "out/test.msgpack")) == 3


def test_quiet_prints_nothing_and_split_chooses(tmp_path, capsys):
    make_mnist(tmp_path)
    status, out, err = _run(capsys, "mnist", tmp_path, "--no-verify", "-q", "--split", "test")
    assert (status, out, err) == (0, "", "")
    assert sorted(p.name for p in tmp_path.glob("*.msgpack")) == ["test.msgpack"]


def test_an_existing_dataset_needs_overwrite(tmp_path, capsys):
    make_mnist(tmp_path)
    assert _run(capsys, "mnist", tmp_path, "--no-verify", "-q")[0] == 0
    status, out, err = _run(capsys, "mnist", tmp_path, "--no-verify", "-q")
    assert status == 2
    assert err.startswith("fpipe write: ") and "pass -y/--overwrite" in err
    assert _run(capsys, "mnist", tmp_path, "--no-verify", "-q", "-y")[0] == 0


@pytest.mark.parametrize("argv, message", [
    (["svhn", "out"], "svhn: no such file or folder, and no well-known dataset of that name; "
                      "known: cifar10, cifar100, mnist, fashion-mnist"),
    (["mnist", "out", "--split", "val"], "--split must be one of train, test for mnist; got val"),
    (["mnist", "out"], "train-images-idx3-ubyte.gz not found in out; download it from https://"),
    (["mnist", "out", "--base-url", "ftp://x/"], "base_url must be an http:// or https:// URL"),
    (["imagenet", "out", "--download"], "ImageNet cannot be downloaded automatically"),
])
def test_user_mistakes_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    status, out, err = _run(capsys, *argv)
    assert status == 2
    assert err.count("\n") == 1 and err.startswith("fpipe write: ") and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["--workers", "0"], ["--seed", "-1"]])
def test_bad_option_values_are_usage_errors(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as caught:
        main(["write", "mnist", str(tmp_path), *argv])
    assert caught.value.code == 2 and "must be" in capsys.readouterr().err


def test_a_wrong_md5_exits_1_and_writes_nothing(tmp_path, capsys):
    make_cifar10(tmp_path)
    status, out, err = _run(capsys, "cifar10", tmp_path / "out", "--from", tmp_path)
    assert status == 1
    assert err.count("\n") == 1 and "expected c58f30108f718f92721af3b95e74349a" in err
    assert not (tmp_path / "out").exists()


def test_a_downloaded_archive_with_the_wrong_md5_exits_1_and_leaves_nothing(tmp_path, capsys,
                                                                             file_server):
    (tmp_path / "src").mkdir()
    make_cifar10(tmp_path / "src")
    file_server.serve(tmp_path / "src")
    status, out, err = _run(capsys, "cifar10", tmp_path / "out", "--download", "--base-url",
                            file_server.url, "-q")
    assert status == 1 and "md5 is" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists(), "no dataset, no archive, no .part file"


def test_download_through_the_command(tmp_path, capsys, file_server, monkeypatch):
    (tmp_path / "src").mkdir()
    make_mnist(tmp_path / "src")
    file_server.serve(tmp_path / "src")
    monkeypatch.setitem(fpipe.sets._DATASETS, "mnist", with_local_md5(fpipe.sets.mnist, tmp_path / "src"))
    status, out, err = _run(capsys, "mnist", tmp_path / "out", "--download", "--base-url",
                            file_server.url)
    assert (status, err) == (0, "")
    assert "train: " in out and "(5 samples)" in out
    assert file_server.ranges == [None] * 4


def test_a_corrupt_archive_exits_1_without_a_traceback(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b broken")
    result = subprocess.run([sys.executable, "-m", "fpipe", "write", "cifar10", str(tmp_path / "out"),
                             "--from", str(tmp_path), "--no-verify"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("fpipe write: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_help_lists_the_datasets(capsys):
    with pytest.raises(SystemExit):
        main(["write", "--help"])
    assert "cifar10, cifar100, mnist, fashion-mnist, imagenet" in " ".join(capsys.readouterr().out.split())
