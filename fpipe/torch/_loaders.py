"""What the torch adapters know of the loaders over them: the length a DataLoader with
workers must be told, and :class:`EvenBatches`, which stops every rank of a process group after the
same number of batches. Private: :mod:`fpipe.torch` offers both; this module imports torch
only inside its functions, as the house keeps torch out of every module but that one.

>>> batches = even_batches([[1, 2], [3]])   # no process group: the batches as they come
>>> list(batches), len(batches)
([[1, 2], [3]], 2)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fpipe.errors import check_choice
from fpipe.sharding import loader_length
from fpipe.torch._shared import current_worker

__all__ = ["EvenBatches", "asked_length", "even_batches"]

_EVEN = ("drop", "pad")
# what each rank contributes to a step's all_reduce (MIN): whether it has a batch, whether it
# has none, whether its loader ran without error, whether it has had a batch in this pass
_HAS, _MISSING, _FINE, _HAD = range(4)
_PASSED = frozenset({"state_dict", "load_state_dict"})  # the loader's methods the wrapper has


def asked_length(dataset: Any, length: Callable[[int, int], int]) -> int:
    """What ``dataset.__len__`` answers, given ``length(worker, num_workers)``, the samples
    that a worker yields in its next pass: the calling process's samples, except to a
    DataLoader that has workers and a batch size.

    That DataLoader computes its ``len`` as ``len(dataset)`` divided by its batch size, as if
    one worker batched every sample, while each worker batches its own shard and may end on a
    short batch. So it gets the length that makes its division the number of batches its
    workers make (:func:`fpipe.sharding.loader_length`): the samples wherever the division is exact
    already, as it always is when the shards are cut on whole batches.

    >>> from torch.utils.data import DataLoader
    >>> from fpipe.dataset import ListReader
    >>> from fpipe.torch import IterableDataset, Shards
    >>> reader = ListReader([{"x": i} for i in range(2000)])
    >>> shuffled = Shards(shuffle=True)
    >>> loose = IterableDataset(reader, layout=shuffled)  # shards of 1000 and 1000: 32 batches each
    >>> len(loose), len(DataLoader(loose, batch_size=32, num_workers=2))
    (2000, 64)
    >>> cut = IterableDataset(reader, batch_size=32, layout=shuffled)   # 1024 and 976: 32 and 31
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


class EvenBatches:
    """The batches of ``loader`` while every rank of process ``group`` has one: see
    :func:`even_batches`."""

    def __init__(self, loader: Iterable[Any], group: Any = None, *, even: str = "drop",
                 device: Any = None) -> None:
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be an iterable of batches; got loader={loader!r:.80}")
        self.loader, self.group, self.device = loader, group, device
        self.even = check_choice("even", even, _EVEN)
        self.repeated = 0  # the batches that even="pad" repeated in the latest pass

    def __iter__(self) -> Iterator[Any]:
        world = _world(self.group)
        if world is None:
            return iter(self.loader)
        return self._agreed(world)

    def __len__(self) -> int:
        """``len(loader)`` without a process group (of more than one rank); with one, the
        number of batches is agreed step by step, and ``len`` raises ``TypeError``."""
        if _world(self.group) is None:
            return len(self.loader)
        raise TypeError(
            "len() of even_batches(...) over a process group of more than one rank: the ranks "
            "agree on each batch as they go, so the count is known at the end of the pass; "
            "count an epoch's batches in a first pass, or give every rank the same number of "
            "batches before the wrapper (IterableDataset(..., batch_size=B, "
            "layout=Shards(even='drop')) "
            "without a stage that packs or filters) and take len() of the loader")

    def __getattr__(self, name: str) -> Any:
        # state_dict and load_state_dict are the loader's where it has them (a
        # StatefulDataLoader's), and absent where it has not, for code that asks with hasattr
        if name in _PASSED and "loader" in self.__dict__:
            return getattr(self.loader, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _agreed(self, world: tuple[Any, Any]) -> Iterator[Any]:
        import torch.distributed

        group, device = world
        iterator, last, had = iter(self.loader), None, False
        self.repeated = 0
        try:
            while True:
                batch, error = _next(iterator)
                has = error is None and batch is not _END
                had = had or has
                flags = torch.tensor([has, not has, error is None, had], dtype=torch.int32,
                                     device=self.device or device)
                torch.distributed.all_reduce(flags, torch.distributed.ReduceOp.MIN, group=group)
                everyone = flags.tolist()
                if not everyone[_FINE]:
                    _raise(error)
                if not everyone[_HAS]:
                    if self.even == "drop" or everyone[_MISSING]:
                        return
                    if not everyone[_HAD]:
                        raise RuntimeError(
                            "even_batches(..., even='pad'): some ranks have a batch and another "
                            "has had none in this pass, so it has none to repeat; use "
                            "even='drop', or give every rank at least one batch")
                if has:
                    last = batch
                else:
                    self.repeated += 1
                yield last
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"even_batches({self.loader!r:.80}, even={self.even!r})"


_END = object()


def _next(iterator: Iterator[Any]) -> tuple[Any, BaseException | None]:
    try:
        return next(iterator, _END), None
    except Exception as error:  # raised on this rank once every rank knows to stop
        return _END, error


def _raise(error: BaseException | None) -> None:
    if error is not None:
        raise error
    raise RuntimeError("even_batches(...): the loader of another rank raised (its error is in "
                       "that rank's output); every rank stops at the same step")


def _world(group: Any) -> tuple[Any, Any] | None:
    """``(group, device)`` for the step's collective, or None without a process group of
    more than one rank. The device is CPU, or the current CUDA device where the group's only
    backend is NCCL (whose collectives take CUDA tensors)."""
    import torch
    import torch.distributed

    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return None
    if distributed.get_world_size(group) < 2:
        return None
    backend = str(distributed.get_backend(group)).lower()
    cuda = backend == "nccl" and torch.cuda.is_available()
    return group, torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def even_batches(loader: Iterable[Any], group: Any = None, *, even: str = "drop",
                 device: Any = None) -> EvenBatches:
    """The batches of ``loader`` (a DataLoader, a ``StatefulDataLoader``, an fpipe epoch, any
    iterable of batches) cut so that every rank of process ``group`` (the default group if
    None) makes the same number of steps, so that ``DistributedDataParallel`` never waits at
    the end of an epoch for a rank that has run out.

    ``IterableDataset(layout=Shards(even=...))`` evens the samples each rank reads; a pipeline that packs or
    filters them gives the ranks different numbers of batches again. ``even=`` evens the
    batches themselves (every rank must pass the same):

    * ``"drop"`` (the default) stops every rank at the first step that some rank has no batch
      for: nothing is repeated, and each rank leaves out the rest of its batches (the tail
      of the longest rank is at most a few batches with packing). The dropped batches come
      back only if you arrange it: a new pass of a DataLoader begins a new epoch.
    * ``"pad"`` goes on while any rank has a batch, and a rank that has run out repeats its
      last batch (:attr:`EvenBatches.repeated` counts them): no batch is left out, a few are
      trained on twice, as ``DistributedSampler`` pads with samples read twice. Not exact
      either; for an exact evaluation, gather every rank's results instead.

    Each step costs one ``all_reduce`` of four integers (on CPU, or on the current CUDA device
    for NCCL — reading it then waits for the device, so prefer a gloo group of the same ranks,
    ``dist.new_group(backend="gloo")`` — or on ``device``), made before the batch is handed out:
    a rank asks for a batch, learns whether all have one, and only then yields it. An error in one rank's
    loader stops every rank at that step: the rank raises its error, the others a
    ``RuntimeError`` — never a hang. Without ``torch.distributed`` initialised, or with one
    rank, the batches come as they are, and ``len()`` is ``len(loader)``; with more ranks the
    count is agreed as the pass goes, and ``len()`` raises ``TypeError`` (which ``tqdm`` and
    Lightning read as a length they do not know). ``state_dict()`` and ``load_state_dict()``
    are the loader's: taken after a batch, the loader's state is exact; after a cut pass, the
    loader has made one more batch than was handed out on the ranks that had one.

    >>> from torch.utils.data import DataLoader
    >>> loader = even_batches(DataLoader(list(range(10)), batch_size=4))
    >>> [batch.tolist() for batch in loader], len(loader)    # one process: as they come
    ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], 3)
    """
    return EvenBatches(loader, group, even=even, device=device)
