"""ImageNet: a tiny ILSVRC2012 layout (tars with the devkit, or extracted folders), written and
read back."""

import io
import tarfile

import pytest
from PIL import Image

from fpipe.dataset import MsgpackReader
from fpipe.sets import ArchiveError, imagenet, load_classes

from .archives import WNIDS, jpeg, make_imagenet_folders, make_imagenet_tars, with_local_md5

LABEL = {wnid: imagenet.WNIDS.index(wnid) for wnid in WNIDS}


def _expected(images):
    """``{split: [(key, label)]}`` in the documented order: train by label then key, val by key."""
    train = sorted((LABEL[wnid], key) for wnid, files in images["train"].items() for key in files)
    val = sorted((key, LABEL[wnid]) for key, (wnid, _) in images["val"].items())
    return {"train": [(key, label) for label, key in train], "val": val}


def _originals(images):
    return {**{key: data for files in images["train"].values() for key, data in files.items()},
            **{key: data for key, (_, data) in images["val"].items()}}


def _read(written):
    return {split: MsgpackReader(path)[:] for split, path in written.items()}


def test_tars_with_the_devkit(tmp_path):
    images = make_imagenet_tars(tmp_path)
    samples = _read(with_local_md5(imagenet, tmp_path).write(tmp_path / "out", tmp_path))
    for split, expected in _expected(images).items():
        assert [(s["key"], s["label"]) for s in samples[split]] == expected
        assert all(sorted(s) == ["image", "key", "label"] for s in samples[split])
    classes = load_classes(tmp_path / "out/train.msgpack")
    assert classes == {"label": imagenet.CLASSES} and classes["label"][0] == "tench, Tinca tinca"


def test_jpegs_are_kept_as_they_are_and_the_rest_re_encoded(tmp_path):
    images = make_imagenet_tars(tmp_path)
    samples = _read(with_local_md5(imagenet, tmp_path).write(tmp_path / "out", tmp_path, workers=2))
    originals = _originals(images)
    reencoded = {f"{WNIDS[1]}_7.JPEG", f"{WNIDS[2]}_8.JPEG"}  # the CMYK JPEG and the PNG
    for sample in samples["train"] + samples["val"]:
        kept = sample["image"] == originals[sample["key"]]
        assert kept == (sample["key"] not in reencoded), sample["key"]
        with Image.open(io.BytesIO(sample["image"])) as image:
            assert image.format == "JPEG" and image.mode in ("RGB", "L")
            image.load()


@pytest.mark.parametrize("labels", ["devkit", "kaggle", "sorted"])
def test_extracted_folders_give_the_same_datasets_as_the_tars(tmp_path, labels):
    (tmp_path / "tars").mkdir()
    (tmp_path / "folders").mkdir()
    make_imagenet_tars(tmp_path / "tars")
    make_imagenet_folders(tmp_path / "folders", val_labels=labels)
    from_tars = with_local_md5(imagenet, tmp_path / "tars").write(tmp_path / "a", tmp_path / "tars")
    from_folders = imagenet.write(tmp_path / "b", tmp_path / "folders")
    for split in ("train", "val"):
        assert (from_tars[split].read_bytes() == from_folders[split].read_bytes()), split


def test_shuffle_is_seeded_and_the_same_for_any_number_of_workers(tmp_path):
    make_imagenet_folders(tmp_path)
    runs = [imagenet.write(tmp_path / f"out{workers}", tmp_path, shuffle=True, seed=5,
                           workers=workers)["train"].read_bytes() for workers in (1, 3)]
    assert runs[0] == runs[1]
    plain = imagenet.write(tmp_path / "plain", tmp_path, splits=["train"])["train"]
    plain_keys = [s["key"] for s in MsgpackReader(plain)]
    shuffled_keys = [s["key"] for s in MsgpackReader(tmp_path / "out1/train.msgpack")]
    assert sorted(shuffled_keys) == sorted(plain_keys) and shuffled_keys != plain_keys


def test_flat_val_images_without_labels_are_refused(tmp_path):
    make_imagenet_folders(tmp_path, val_labels="none")
    with pytest.raises(FileNotFoundError, match="imagenet val: the images have no labels"):
        imagenet.write(tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()
    assert list(imagenet.write(tmp_path / "out", tmp_path, splits=["train"])) == ["train"]


def test_missing_sources_say_imagenet_cannot_be_downloaded(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither ILSVRC2012_img_train.tar nor a train/ "
                                                "folder .* cannot be downloaded automatically"):
        imagenet.write(tmp_path / "out", tmp_path, download=True)


def test_the_official_md5_of_the_tars_is_checked(tmp_path):
    make_imagenet_tars(tmp_path)
    with pytest.raises(ArchiveError, match="expected 1d675b47d978889d74fa0da5fadfb00e"):
        imagenet.write(tmp_path / "out", tmp_path)
    written = imagenet.write(tmp_path / "out", tmp_path, verify=False)
    assert [len(MsgpackReader(path)) for path in written.values()] == [8, 4]


def test_an_unknown_class_folder_is_refused(tmp_path):
    make_imagenet_folders(tmp_path)
    (tmp_path / "train" / WNIDS[0]).rename(tmp_path / "train" / "n99999999")
    with pytest.raises(ArchiveError, match="'n99999999' is not one of the 1000 ILSVRC2012 classes"):
        imagenet.write(tmp_path / "out", tmp_path)


def test_an_unreadable_image_names_its_file_and_leaves_no_dataset(tmp_path):
    images = make_imagenet_folders(tmp_path)
    (name, data), = list(images["train"][WNIDS[0]].items())[:1]
    (tmp_path / "train" / WNIDS[0] / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(ArchiveError, match=f"{name}: not a readable image"):
        imagenet.write(tmp_path / "out", tmp_path, workers=2)
    assert not (tmp_path / "out").exists()


def test_a_truncated_tar_is_a_clear_error(tmp_path):
    make_imagenet_tars(tmp_path)
    path = tmp_path / "ILSVRC2012_img_val.tar"
    path.write_bytes(path.read_bytes()[:1500])
    with pytest.raises(ArchiveError, match="ILSVRC2012_img_val.tar: "):
        imagenet.write(tmp_path / "out", tmp_path, splits=["val"], verify=False)


def test_a_devkit_without_its_files_is_refused(tmp_path):
    make_imagenet_tars(tmp_path)
    with tarfile.open(tmp_path / "ILSVRC2012_devkit_t12.tar.gz", "w:gz"):
        pass
    with pytest.raises(ArchiveError, match="not the ILSVRC2012 devkit"):
        imagenet.write(tmp_path / "out", tmp_path, verify=False)


def test_grey_jpegs_stay_grey_and_cmyk_becomes_rgb(tmp_path):
    from fpipe.sets.imagenet import _checked_jpeg

    grey, cmyk = jpeg(1, "L"), jpeg(2, "CMYK")
    assert _checked_jpeg(grey, "g", tmp_path) is grey
    with Image.open(io.BytesIO(_checked_jpeg(cmyk, "c", tmp_path))) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (20, 12))
