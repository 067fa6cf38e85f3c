"""CIFAR-10/100: small archives in the official python format, written and read back."""

import io
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

import fpipe.sets
from fpipe.dataset import MsgpackReader
from fpipe.sets import ArchiveError, ChecksumError, cifar10, cifar100, load_classes

from .archives import make_cifar10, make_cifar100, with_local_md5


def _pixels(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG"
        return np.asarray(image)


def test_class_names_are_exposed():
    assert fpipe.sets.cifar10.CLASSES == ("airplane", "automobile", "bird", "cat", "deer", "dog",
                                          "frog", "horse", "ship", "truck")
    assert len(cifar100.CLASSES) == len(set(cifar100.CLASSES)) == 100
    assert cifar100.CLASSES[:2] == ("apple", "aquarium_fish") and cifar100.CLASSES[-1] == "worm"
    assert len(cifar100.COARSE_CLASSES) == 20 and cifar100.COARSE_CLASSES[-1] == "vehicles_2"
    assert cifar10.archives[0].md5 == "c58f30108f718f92721af3b95e74349a"
    assert cifar100.archives[0].url == "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"


def test_cifar10_round_trip(tmp_path):
    expected = make_cifar10(tmp_path)
    written = with_local_md5(cifar10, tmp_path).write(tmp_path / "out", tmp_path)
    assert written == {"train": tmp_path / "out/train.msgpack", "test": tmp_path / "out/test.msgpack"}
    for split, rows in expected.items():
        samples = MsgpackReader(written[split])[:]
        assert [sorted(s) for s in samples] == [["image", "key", "label"]] * len(rows)
        assert [(s["key"], s["label"]) for s in samples] == [(key, label) for key, _, label in rows]
        for sample, (_, pixels, _) in zip(samples, rows):
            assert np.array_equal(_pixels(sample["image"]), pixels)
        assert load_classes(written[split]) == {"label": cifar10.CLASSES}
    assert len(expected["train"]) == 10 and len(expected["test"]) == 3


def test_cifar100_has_coarse_labels_and_unique_keys(tmp_path):
    expected = make_cifar100(tmp_path)
    written = with_local_md5(cifar100, tmp_path).write(tmp_path / "out", tmp_path, workers=2)
    for split, rows in expected.items():
        samples = MsgpackReader(written[split])[:]
        assert [(s["key"], s["label"], s["coarse_label"]) for s in samples] == \
            [(key, fine, coarse) for key, _, fine, coarse in rows]
        assert all(np.array_equal(_pixels(s["image"]), row[1]) for s, row in zip(samples, rows))
    assert [s["key"] for s in MsgpackReader(written["train"])][:2] == \
        ["thing_s_000000.png", "thing_s_000000-2.png"]
    assert load_classes(written["test"]) == {"label": cifar100.CLASSES,
                                            "coarse_label": cifar100.COARSE_CLASSES}


def test_the_official_md5_is_checked(tmp_path):
    make_cifar10(tmp_path)
    with pytest.raises(ChecksumError, match="expected c58f30108f718f92721af3b95e74349a"):
        cifar10.write(tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()
    cifar10.write(tmp_path / "out", tmp_path, verify=False)
    assert len(MsgpackReader(tmp_path / "out/train.msgpack")) == 10


def _rewrite(path, change):
    """Rewrite the tar.gz at ``path`` with ``change(files)`` applied to its {name: bytes}."""
    with tarfile.open(path) as archive:
        files = {m.name: archive.extractfile(m).read() for m in archive if m.isfile()}
    change(files)
    with tarfile.open(path, "w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


TEST_BATCH = "cifar-10-batches-py/test_batch"
DAMAGES = {
    "truncated": lambda path: path.write_bytes(path.read_bytes()[:-200]),
    "not gzip": lambda path: path.write_bytes(b"<html>not found</html>"),
    "missing batch": lambda path: _rewrite(path, lambda files: files.pop(TEST_BATCH)),
    "evil pickle": lambda path: _rewrite(path, lambda files: files.update(
        {TEST_BATCH: pickle.dumps(_Evil())})),
    "wrong shape": lambda path: _rewrite(path, lambda files: files.update({TEST_BATCH: pickle.dumps(
        {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1], b"filenames": [b"a", b"b"]}, 3)})),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_corrupt_archive_is_a_clear_error_and_leaves_no_dataset(tmp_path, damage, capsys):
    make_cifar10(tmp_path)
    DAMAGES[damage](tmp_path / "cifar-10-python.tar.gz")
    with pytest.raises(ArchiveError, match="cifar-10-python.tar.gz: "):
        cifar10.write(tmp_path / "out", tmp_path, verify=False)
    assert not (tmp_path / "out").exists()
    assert "unpickled!" not in capsys.readouterr().out


def test_download_from_a_mirror(tmp_path, file_server):
    make_cifar10(tmp_path)
    local = with_local_md5(cifar10, tmp_path)
    file_server.serve(tmp_path)
    written = local.write(tmp_path / "out", download=True, base_url=file_server.url)
    assert len(MsgpackReader(written["train"])) == 10
    assert (tmp_path / "out/cifar-10-python.tar.gz").exists(), "archives are kept for next time"


def test_a_download_with_the_wrong_md5_writes_nothing(tmp_path, file_server):
    make_cifar10(tmp_path)
    file_server.serve(tmp_path)
    with pytest.raises(ChecksumError):
        cifar10.write(tmp_path / "out", download=True, base_url=file_server.url)
    assert not (tmp_path / "out").exists()


def test_one_split_alone(tmp_path):
    make_cifar10(tmp_path)
    written = cifar10.write(tmp_path / "out", tmp_path, splits=["test"], verify=False)
    assert list(written) == ["test"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if "train" in p.name) == []
