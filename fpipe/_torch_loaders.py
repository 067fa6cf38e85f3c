"""What the torch adapters know of the loaders over them: the length a DataLoader with
workers must be told. Private: :mod:`fpipe.torch` uses it; this module imports torch only
inside its functions, as the house keeps torch out of every module but that one."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ._torch_shared import current_worker
from .sharding import loader_length

__all__ = ["asked_length"]


def asked_length(dataset: Any, length: Callable[[int, int], int]) -> int:
    """What ``dataset.__len__`` answers, given ``length(worker, num_workers)``, the samples
    that a worker yields in its next pass: the calling process's samples, except to a
    DataLoader that has workers and a batch size.

    That DataLoader computes its ``len`` as ``len(dataset)`` divided by its batch size, as if
    one worker batched every sample, while each worker batches its own shard and may end on a
    short batch. So it gets the length that makes its division the number of batches its
    workers make (:func:`fpipe.loader_length`): the samples wherever the division is exact
    already, as it always is when the shards are cut on whole batches.

    >>> from torch.utils.data import DataLoader
    >>> from fpipe.storage import ListReader
    >>> from fpipe.torch import IterableDataset
    >>> reader = ListReader([{"x": i} for i in range(2000)])
    >>> loose = IterableDataset(reader, shuffle=True)    # shards of 1000 and 1000: 32 batches each
    >>> len(loose), len(DataLoader(loose, batch_size=32, num_workers=2))
    (2000, 64)
    >>> cut = IterableDataset(reader, batch_size=32, shuffle=True)   # 1024 and 976: 32 and 31
    >>> len(cut), len(DataLoader(cut, batch_size=32, num_workers=2))
    (2000, 63)
    """
    import torch.utils.data

    caller = sys._getframe(2)  # this function <- dataset.__len__ <- the caller of len()
    loader = caller.f_locals.get("self") if caller.f_code.co_name == "__len__" else None
    if (not isinstance(loader, torch.utils.data.DataLoader) or loader.dataset is not dataset
            or loader.batch_size is None or loader.num_workers < 2):
        return length(*current_worker())
    workers = loader.num_workers
    return loader_length([length(w, workers) for w in range(workers)], loader.batch_size,
                         loader.drop_last)
