"""Batch normalisation: uint8 pixels to float32 ``(x / 255 - mean) / std``, channels first,
in one vectorised pass over the whole batch — numpy arrays, or torch tensors on any device.

>>> import numpy as np
>>> batch = np.full((2, 4, 4, 3), 255, np.uint8)      # two 4x4 RGB images, HWC
>>> out = normalize(batch, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
>>> out.shape, out.dtype, float(out.max())
((2, 3, 4, 4), dtype('float32'), 1.0)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fpipe.errors import check_choice

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "normalize"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _is_tensor(batch: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor means torch is imported already
    return torch is not None and isinstance(batch, torch.Tensor)


def _coefficients(mean: Sequence[float], std: Sequence[float], channels: int,
                  integer: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, shift)`` per channel, float32, with ``x * scale - shift`` the result."""
    mean_, std_ = (np.asarray(v, np.float64).reshape(-1) for v in (mean, std))
    for name, values in (("mean", mean_), ("std", std_)):
        if len(values) not in (1, channels):
            raise ValueError(f"{name} must have 1 or {channels} values (one per channel); "
                             f"got {name}={tuple(values.tolist())}")
    if not np.all(std_ > 0):
        raise ValueError(f"std must be positive; got std={tuple(std_.tolist())}")
    scale = 1 / (std_ * (255 if integer else 1))
    return (np.broadcast_to(scale, channels).astype(np.float32),
            np.broadcast_to(mean_ / std_, channels).astype(np.float32))


def _channels_first(batch: Any, layout: str) -> tuple[Any, bool]:
    """A view of ``batch`` as (N, C, H, W), and whether ``batch`` was one image."""
    if batch.ndim not in (3, 4):
        raise ValueError(f"batch must be a batch (N, H, W, C or N, C, H, W) or one image "
                         f"(3 dimensions); got shape {tuple(batch.shape)}")
    single = batch.ndim == 3
    view = batch[None] if single else batch
    if layout == "HWC":
        view = view.permute(0, 3, 1, 2) if _is_tensor(view) else view.transpose(0, 3, 1, 2)
    return view, single


def _kind(dtype: Any, is_tensor: bool) -> str:
    """"uint8", "float" (normalised in place) or a TypeError naming the dtype."""
    if is_tensor:
        if dtype.is_floating_point:
            return "float"
        name = str(dtype).replace("torch.", "")
    else:
        if np.issubdtype(dtype, np.floating):
            return "float"
        name = str(dtype)
    if name != "uint8":
        raise TypeError(f"normalize takes uint8 pixels (0-255) or floats (0-1); got dtype {name}")
    return "uint8"


def normalize(batch: Any, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD, *, layout: str = "HWC") -> Any:
    """``(x - mean) / std`` of a batch of images, channels first, as torchvision's
    ``ToTensor()`` then ``Normalize(mean, std)`` compute it for each image: uint8 pixels are
    read as ``x / 255`` and give a new float32 batch (N, C, H, W), C-contiguous; floating-point
    pixels (already in 0-1) are normalised in place and returned as a channels-first view.

    ``batch`` is a numpy array or a torch tensor on any device (the result is the same kind,
    on the same device: move uint8 batches to the GPU and normalise there, at a quarter of
    the bytes). ``layout`` says where its channels are: ``"HWC"`` (N, H, W, C; what
    :func:`~fpipe.image.random_resized_crop` gives by default) or ``"CHW"`` (N, C, H, W).
    One image (three dimensions) gives one image. ``mean`` and ``std`` are per channel, in
    0-1 units (ImageNet's by default).

    >>> import numpy as np
    >>> batch = np.zeros((8, 3, 2, 2), np.uint8)   # CHW images
    >>> out = normalize(batch, layout="CHW")
    >>> out.shape, [round(float(v), 3) for v in out[0, :, 0, 0]]
    ((8, 3, 2, 2), [-2.118, -2.036, -1.804])
    >>> floats = np.ones((2, 2, 3), np.float32)     # one HWC image of floats: in place
    >>> normalize(floats, mean=(1, 1, 1), std=(1, 1, 1)).base is floats, float(floats.max())
    (True, 0.0)
    """
    check_choice("layout", layout, ("HWC", "CHW"))
    is_tensor = _is_tensor(batch)
    if not is_tensor and not isinstance(batch, np.ndarray):
        raise TypeError(f"batch must be a numpy array or a torch tensor; got {type(batch).__name__}")
    kind = _kind(batch.dtype, is_tensor)
    view, single = _channels_first(batch, layout)
    scale, shift = _coefficients(mean, std, view.shape[1], kind == "uint8")
    if is_tensor:
        out = _normalize_tensor(view, scale, shift, kind)
    else:
        out = _normalize_array(view, scale, shift, kind)
    return out[0] if single else out


def _normalize_array(view: np.ndarray, scale: np.ndarray, shift: np.ndarray,
                     kind: str) -> np.ndarray:
    out = view if kind == "float" else np.empty(view.shape, np.float32)
    scale, shift = (v.astype(out.dtype)[:, None, None] for v in (scale, shift))
    # one image at a time, so that its floats are still in the cache for the second pass
    for image, target in zip(view, out):
        if kind != "float":
            np.copyto(target, image)
        np.multiply(target, scale, out=target)
        np.subtract(target, shift, out=target)
    return out


def _normalize_tensor(view: Any, scale: np.ndarray, shift: np.ndarray, kind: str) -> Any:
    import torch

    if view.device.type == "cpu" and not view.requires_grad:
        # numpy's loop, on this thread: torch's CPU ops would wake its thread pool
        out = _normalize_array(view.numpy(), scale, shift, kind)
        return view if kind == "float" else torch.from_numpy(out)
    dtype = view.dtype if kind == "float" else torch.float32
    scale_, shift_ = (torch.as_tensor(v, dtype=dtype).to(view.device).view(1, -1, 1, 1)
                      for v in (scale, shift))
    if kind == "float":
        return view.mul_(scale_).sub_(shift_)
    out = torch.empty(tuple(view.shape), dtype=torch.float32, device=view.device)
    torch.mul(view, scale_, out=out)
    return out.sub_(shift_)
