"""normalize: torchvision's ToTensor then Normalize, for a whole batch in one pass; numpy and
torch on any device; in place for floats."""

from __future__ import annotations

import numpy as np
import pytest

from fpipe.image import IMAGENET_MEAN, IMAGENET_STD, normalize

MEAN, STD = np.array(IMAGENET_MEAN), np.array(IMAGENET_STD)


def _reference(batch_hwc: np.ndarray) -> np.ndarray:
    """ToTensor (CHW, / 255) then Normalize ((x - mean) / std), image by image, in float64."""
    images = [(image.transpose(2, 0, 1) / 255 - MEAN[:, None, None]) / STD[:, None, None]
              for image in batch_hwc]
    return np.stack(images)


BATCH = np.random.default_rng(0).integers(0, 256, (5, 6, 7, 3), dtype=np.uint8)


def test_uint8_hwc_and_chw_batches_give_float32_nchw_as_torchvision_computes_it():
    expected = _reference(BATCH)
    for batch, layout in ((BATCH, "HWC"), (np.ascontiguousarray(BATCH.transpose(0, 3, 1, 2)), "CHW")):
        out = normalize(batch, layout=layout)
        assert out.shape == (5, 3, 6, 7) and out.dtype == np.float32 and out.flags.c_contiguous
        assert np.abs(out - expected).max() < 1e-5
        assert batch.dtype == np.uint8  # the input is left alone


def test_one_image_gives_one_image_and_mean_std_can_be_one_value():
    out = normalize(BATCH[0], mean=0.5, std=0.25)
    assert out.shape == (3, 6, 7)
    assert np.allclose(out, (BATCH[0].transpose(2, 0, 1) / 255 - 0.5) / 0.25, atol=1e-5)


def test_floats_are_normalised_in_place():
    floats = (BATCH / 255).astype(np.float32)
    out = normalize(floats)
    assert out.base is floats and out.shape == (5, 3, 6, 7)
    assert np.abs(out - _reference(BATCH)).max() < 1e-5
    assert np.abs(floats.transpose(0, 3, 1, 2) - _reference(BATCH)).max() < 1e-5


def test_torch_tensors_on_the_cpu_and_on_another_device():
    torch = pytest.importorskip("torch")
    out = normalize(torch.from_numpy(BATCH))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.is_contiguous()
    assert np.abs(out.numpy() - _reference(BATCH)).max() < 1e-5
    floats = torch.from_numpy(BATCH).permute(0, 3, 1, 2).float().div(255)
    assert normalize(floats, layout="CHW") is floats  # in place
    assert np.abs(floats.numpy() - _reference(BATCH)).max() < 1e-5
    # a device without data: every step must be a torch operation on that device
    meta = normalize(torch.empty((4, 10, 12, 3), dtype=torch.uint8, device="meta"))
    assert meta.device.type == "meta" and meta.shape == (4, 3, 10, 12) and meta.dtype == torch.float32
    half = torch.empty((4, 3, 10, 12), dtype=torch.float16, device="meta")
    assert normalize(half, layout="CHW") is half


def test_tensors_that_need_gradients_are_normalised_by_torch():
    torch = pytest.importorskip("torch")
    floats = torch.rand(2, 3, 4, 4, requires_grad=True)
    out = normalize(floats.clone(), layout="CHW")
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    expected = (floats - mean) / std
    assert torch.allclose(out, expected, atol=1e-5) and out.requires_grad


@pytest.mark.parametrize("call, error, message", [
    (lambda: normalize(BATCH.astype(np.int32)), TypeError, "uint8 pixels .* got dtype int32"),
    (lambda: normalize(BATCH, mean=(0.5, 0.5)), ValueError, "mean must have 1 or 3 values"),
    (lambda: normalize(BATCH, std=(1, 0, 1)), ValueError, "std must be positive"),
    (lambda: normalize(BATCH, layout="NHWC"), ValueError, "layout must be 'HWC' or 'CHW'"),
    (lambda: normalize(BATCH[0, 0]), ValueError, "got shape \\(7, 3\\)"),
    (lambda: normalize([[1, 2]]), TypeError, "a numpy array or a torch tensor; got list"),
])
def test_bad_input_is_refused_with_its_name(call, error, message):
    with pytest.raises(error, match=message):
        call()
