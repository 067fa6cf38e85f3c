"""Arrays users can change: decoded arrays are writable copies by default, so torch's collate
makes tensors without its "non-writable NumPy array" warning, in real DataLoader workers."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

from fpipe.dataset import FileWriter, MsgpackReader
from fpipe.torch import Dataset, IterableDataset


@pytest.fixture
def images(tmp_path) -> str:
    path = tmp_path / "images.msgpack"
    with FileWriter(path) as writer:
        for i in range(12):
            writer.write({"key": f"{i:02d}", "image": np.full((2, 3), i, np.uint8), "label": i})
    return str(path)


def _brighten(sample: dict) -> dict:
    sample["image"] += 1  # in place, as augmentations do
    return sample


@pytest.mark.filterwarnings("error")  # forked workers inherit the filter
@pytest.mark.parametrize("make", [
    lambda path: Dataset(MsgpackReader(path), transforms=_brighten),
    lambda path: IterableDataset(MsgpackReader(path), transforms=_brighten),
], ids=["Dataset", "IterableDataset"])
def test_two_workers_change_arrays_in_place_and_torch_does_not_warn(images, make):
    data_loader = DataLoader(make(images), batch_size=4, num_workers=2,
                             multiprocessing_context="fork")
    batches = list(data_loader)
    labels = [int(x) for batch in batches for x in batch["label"]]
    pixels = {int(x): int(image[0, 0]) for batch in batches
              for x, image in zip(batch["label"], batch["image"])}
    assert sorted(labels) == list(range(12)) and pixels == {i: i + 1 for i in range(12)}


@pytest.mark.filterwarnings("error")
def test_zero_copy_arrays_are_read_only_and_torch_says_so(images):
    # the control: without the copy, torch's warning is there to be turned into an error
    data_loader = DataLoader(IterableDataset(MsgpackReader(images), copy=False), batch_size=4)
    with pytest.raises(UserWarning, match="not writable"):
        list(data_loader)
