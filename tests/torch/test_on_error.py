"""on_error on the torch adapters: corrupt images in the middle of an epoch, read through a
real DataLoader with two workers, leave exactly the good samples, in order, and are counted."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.skipping import TooManyErrors
from fpipe.torch import Dataset, IterableDataset, Samples

from .conftest import encode, pixels

BAD = (7, 13)  # 7: bytes that are no image; 13: a JPEG cut in half


def write_images(path, n: int = 20) -> MsgpackReader:
    with FileWriter(path) as writer:
        for i in range(n):
            image = encode(pixels(seed=i), "JPEG")
            if i == BAD[0]:
                image = b"not an image at all"
            elif i == BAD[1]:
                image = image[: len(image) // 2]
            writer.write({"key": f"img{i:02d}", "image": image, "label": i})
    return MsgpackReader(path)


def decode(sample: dict) -> dict:
    with Image.open(io.BytesIO(sample["image"])) as image:
        return {"pixels": np.array(image.convert("RGB")), "label": sample["label"]}


def labels(loader) -> list[int]:
    return [int(label) for batch in loader for label in batch["label"]]


def test_dataloader_with_two_workers_skips_the_corrupt_images_in_order(tmp_path):
    dataset = Dataset(write_images(tmp_path / "images.msgpack"), decode, samples=Samples(on_error="skip"))
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    good = [i for i in range(20) if i not in BAD]
    assert labels(loader) == good
    assert dataset.skipped == 2 and dataset.skipped_indices == list(BAD)
    assert labels(loader) == good  # a second epoch: same output, the count goes on
    assert dataset.skipped == 4


def test_skipped_counts_every_epoch_and_skipped_indices_names_each_sample_once(tmp_path):
    dataset = Dataset(write_images(tmp_path / "images.msgpack"), decode, samples=Samples(on_error="skip"))
    for epoch in range(3):
        dataset.set_epoch(epoch)
        assert labels(DataLoader(dataset, batch_size=4, num_workers=2)) == [
            i for i in range(20) if i not in BAD]
    assert dataset.skipped == 3 * len(BAD)
    assert dataset.skipped_indices == list(BAD)  # not [7, 7, 7, 13, 13, 13]


def test_iterable_dataset_with_two_workers_skips_the_corrupt_images(tmp_path):
    dataset = IterableDataset(write_images(tmp_path / "images.msgpack"), decode,
                              samples=Samples(on_error="skip"))
    loader = DataLoader(dataset, batch_size=3, num_workers=2)
    seen = labels(loader)
    # each worker reads one half in order; the DataLoader takes their batches in turn
    assert sorted(seen) == [i for i in range(20) if i not in BAD]
    assert [x for x in seen if x < 10] == [i for i in range(10) if i not in BAD]
    assert dataset.skipped == 2 and dataset.skipped_indices == list(BAD)


def test_max_errors_raises_in_the_consumer_once_passed(tmp_path):
    dataset = Dataset(write_images(tmp_path / "images.msgpack"), decode,
                      samples=Samples(on_error="skip", max_errors=1))
    with pytest.raises(TooManyErrors, match=r"2 samples failed, more than max_errors=1.*sample 13"):
        labels(DataLoader(dataset, batch_size=4, num_workers=2))


def _remember(error, sample, index):
    remembered.append((type(error).__name__, sample["key"], index))


remembered: list = []


def test_a_callable_gets_the_error_the_sample_and_its_index(tmp_path):
    remembered.clear()
    dataset = Dataset(write_images(tmp_path / "images.msgpack"), decode,
                      samples=Samples(on_error=_remember))
    assert labels(DataLoader(dataset, batch_size=5)) == [i for i in range(20) if i not in BAD]
    assert [(key, index) for _, key, index in remembered] == [("img07", 7), ("img13", 13)]
    assert remembered[0][0] == "UnidentifiedImageError"


def test_a_callable_that_raises_stops_the_epoch(tmp_path):
    def stop(error, sample, index):
        raise RuntimeError(f"stop at {index}") from error

    dataset = Dataset(write_images(tmp_path / "images.msgpack"), decode, samples=Samples(on_error=stop))
    with pytest.raises(RuntimeError, match="stop at 7"):
        labels(DataLoader(dataset, batch_size=5))


def test_without_on_error_a_corrupt_image_still_raises_naming_the_sample(tmp_path):
    dataset = Dataset(write_images(tmp_path / "images.msgpack"), decode)
    with pytest.raises(Image.UnidentifiedImageError):
        labels(DataLoader(dataset, batch_size=5))
    with pytest.raises(Image.UnidentifiedImageError):
        Dataset(write_images(tmp_path / "again.msgpack"), decode, samples=Samples(on_error="skip"))[7]


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"on_error": "ignore"}, ValueError, "on_error must be 'raise', 'skip' or a callable"),
    ({"on_error": 1}, TypeError, "on_error=1"),
    ({"max_errors": -1}, ValueError, "max_errors must be >= 0"),
])
def test_bad_options_are_refused_at_construction(options, error, match):
    with pytest.raises(error, match=match):
        Samples(**options)  # before either dataset exists
