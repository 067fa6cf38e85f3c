"""MNIST and Fashion-MNIST: gzipped IDX files, written and read back."""

import gzip
import io

import numpy as np
import pytest
from PIL import Image

from fpipe.dataset import MsgpackReader
from fpipe.sets import ArchiveError, fashion_mnist, load_classes, mnist
from fpipe.sets.mnist import read_idx

from .archives import idx_bytes, make_mnist, with_local_md5


@pytest.mark.parametrize("dataset", [mnist, fashion_mnist], ids=lambda d: d.name)
def test_round_trip(tmp_path, dataset):
    expected = make_mnist(tmp_path)
    written = with_local_md5(dataset, tmp_path).write(tmp_path / "out", tmp_path)
    for split, (images, labels) in expected.items():
        samples = MsgpackReader(written[split])[:]
        assert [s["key"] for s in samples] == [f"{split}_{i:05d}" for i in range(len(labels))]
        assert [s["label"] for s in samples] == labels.tolist()
        for sample, image in zip(samples, images):
            with Image.open(io.BytesIO(sample["image"])) as decoded:
                assert (decoded.format, decoded.mode) == ("PNG", "L")
                assert np.array_equal(np.asarray(decoded), image)
        assert load_classes(written[split]) == {"label": dataset.CLASSES}


def test_class_names_and_official_files():
    assert mnist.CLASSES == tuple("0123456789")
    assert fashion_mnist.CLASSES[0] == "T-shirt/top" and fashion_mnist.CLASSES[-1] == "Ankle boot"
    assert [a.filename for a in mnist.archives] == [
        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    assert all(a.url.startswith("https://") for d in (mnist, fashion_mnist) for a in d.archives)
    assert fashion_mnist.archives[0].md5 == "8d4fb7e6c68d591d4c3dfef9ec88bf0d"


def test_only_the_archives_of_the_chosen_split_are_needed(tmp_path):
    make_mnist(tmp_path)
    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    written = with_local_md5(mnist, tmp_path).write(tmp_path / "out", tmp_path, splits=("test",))
    assert len(MsgpackReader(written["test"])) == 3
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz not found"):
        mnist.write(tmp_path / "out2", tmp_path, verify=False)
    assert not (tmp_path / "out2").exists()


def _gz(path, data):
    with gzip.open(path, "wb") as file:
        file.write(data)


@pytest.mark.parametrize("content, message", [
    (idx_bytes(np.zeros((2, 3), np.uint8))[:-1], "holds 5 bytes of data, its header says"),
    (idx_bytes(np.zeros((2, 3, 4), np.uint8)), "not an IDX file of 2-d unsigned bytes"),
    (b"\0\0\x0d\2" + bytes(8), "not an IDX file"),  # floats
    (b"", "not an IDX file"),
])
def test_read_idx_rejects_what_is_not_the_expected_idx(tmp_path, content, message):
    _gz(tmp_path / "x.gz", content)
    with pytest.raises(ArchiveError, match=message):
        read_idx(tmp_path / "x.gz", 2)


def test_read_idx_rejects_what_is_not_gzip(tmp_path):
    (tmp_path / "x.gz").write_bytes(idx_bytes(np.zeros(3, np.uint8)))
    with pytest.raises(ArchiveError, match="x.gz: not a gzipped IDX file"):
        read_idx(tmp_path / "x.gz", 1)


@pytest.mark.parametrize("labels, message", [
    (np.zeros(4, np.uint8), "4 labels for 5 images"),
    (np.array([0, 1, 2, 3, 10], np.uint8), "label 10 is not one of the 10 classes"),
])
def test_labels_that_do_not_fit_are_a_clear_error_and_leave_no_dataset(tmp_path, labels, message):
    make_mnist(tmp_path)
    _gz(tmp_path / "train-labels-idx1-ubyte.gz", idx_bytes(labels))
    (tmp_path / "out").mkdir()
    with pytest.raises(ArchiveError, match=message):
        mnist.write(tmp_path / "out", tmp_path, verify=False)
    assert list((tmp_path / "out").iterdir()) == [], "an output folder that existed stays, empty"


def test_download_resumes_an_interrupted_archive(tmp_path, file_server):
    (tmp_path / "src").mkdir()
    make_mnist(tmp_path / "src")
    local = with_local_md5(mnist, tmp_path / "src")
    file_server.serve(tmp_path / "src")
    file_server.cut["train-images-idx3-ubyte.gz"] = 1000
    with pytest.raises(OSError, match="interrupted after 1000 of "):
        local.write(tmp_path / "out", download=True, base_url=file_server.url)
    assert (tmp_path / "out/train-images-idx3-ubyte.gz.part").stat().st_size == 1000
    assert not list((tmp_path / "out").glob("*.msgpack*"))
    written = local.write(tmp_path / "out", download=True, base_url=file_server.url)
    assert "bytes=1000-" in file_server.ranges
    assert [len(MsgpackReader(path)) for path in written.values()] == [5, 3]
    assert not list((tmp_path / "out").glob("*.part"))
