"""PyTorch adapters: datadings's torch API over fpipe's readers and orderings.

The names and signatures are datadings's (``Compose``, ``CompressedToPIL``, ``Dataset``,
``DatasetBase``, ``IterableDataset``, ``dict2tuple``, ``no_rng``), so datadings code ports by
changing its imports. What changes is what breaks there: readers work in forked and spawned
workers after the parent has read, ``set_epoch`` works with and without persistent workers,
empty shards yield nothing, orderings give decoded samples, and ``even=`` gives every rank
the same number of batches. This is the only fpipe module that imports torch.

>>> from fpipe.storage import ListReader
>>> def add(value, number):
...     return value + number
>>> reader = ListReader([{"key": f"k{i}", "x": i} for i in range(6)])
>>> dataset = Dataset(reader, transforms={"x": Compose(add)}, rng=lambda sample: {"number": 10})
>>> dataset[2]["x"], len(dataset)
(12, 6)
>>> stream = IterableDataset(reader, rank=1, world_size=2)   # rank 1 of 2, no workers
>>> [sample["x"] for sample in stream], len(stream)
([3, 4, 5], 3)
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

try:
    import torch
    import torch.distributed
    import torch.utils.data
    from torch.utils.data import get_worker_info
except ImportError as error:  # pragma: no cover - torch is in the test extra
    raise ImportError("fpipe.torch needs PyTorch; install it with: pip install 'fpipe[torch]'") from error

import numpy as np

from ._torch_loaders import EvenBatches, asked_length, even_batches
from ._torch_shared import EpochClock, Resume, SkipBoard, current_worker
from .errors import (
    check_bool,
    check_callable,
    check_fraction_or_count,
    check_integer,
    check_not_path,
    check_two_argument_call,
    note_two_argument_call,
)
from .functional import Compose, dict2tuple, no_rng
from .image import CompressedToPIL, with_sample_named
from .random import Seed, item_rng, optional_entropy, seed_entropy, set_active, shard_seed
from .sharding import (
    check_elastic,
    check_even,
    elastic_batches,
    elastic_position,
    elastic_state,
    elastic_state_dict,
    loaded_state_stands,
    resume_plan,
    worker_range,
    wrapped_runs,
)
from .skipping import OnError, TooManyErrors, check_max_errors, check_on_error, handle, read_on, read_or_each
from .storage.order import Indexed, QuasiShuffler, Range
from .streaming._shm import register as share_type

__all__ = [
    "Compose",
    "CompressedToPIL",
    "Dataset",
    "DatasetBase",
    "ElasticBatchSampler",
    "EvenBatches",
    "IterableDataset",
    "dict2tuple",
    "even_batches",
    "get_worker_info",
    "no_rng",
    "worker_range",
]

_SKIP = object()  # what _apply_or_skip returns for a skipped sample


class _Shard(NamedTuple):
    """What a worker reads in a pass: the positions, how many of them a resumed pass skips,
    and how many batches of them the DataLoader had (0 if the pass is whole or empty)."""

    window: range
    skip: int
    made: int = 0


class _TensorCodec:
    """How tensors cross a process stage in shared memory: a CPU tensor that needs no
    gradient travels as the numpy array it shares its memory with, and arrives as a tensor
    made from the consumer's view (other tensors are pickled as usual)."""

    @staticmethod
    def to_array(tensor: torch.Tensor) -> np.ndarray | None:
        if (tensor.device.type != "cpu" or tensor.requires_grad or tensor.layout != torch.strided
                or tensor.is_conj() or tensor.is_neg()):
            return None
        try:
            return tensor.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16, ...)
            return None

    @staticmethod
    def from_array(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array)


_TENSORS = _TensorCodec()
share_type("torch.Tensor", "fpipe.torch:_TENSORS")


class DatasetBase:
    """What :class:`Dataset` and :class:`IterableDataset` share: the reader, the transforms,
    the parameters drawn per sample, and the epoch.

    ``transforms`` is either one callable ``f(sample) -> sample``, or a dict from sample
    field to ``t(value, params)`` (a :class:`Compose`, say), where ``params = rng(sample)``
    is also stored in ``sample["__params__"]``. With ``seed``, the item generator of
    ``(seed, epoch, index)`` is active while ``rng`` and the transforms run, so whatever
    draws from :func:`fpipe.current_rng` (or uses fpipe's random combinators) is
    reproducible per sample, whichever worker or rank reads it. An exception in a transform
    names the sample (its index, key and field).

    ``on_error="skip"`` (or a callable ``on_error(error, sample, index)``, called in the
    worker; see :mod:`fpipe.skipping`) leaves out the samples whose transforms raise (a
    corrupt image, say) or that do not read (a damaged record, ``sample`` None; not in
    ``shuffle=True``'s buffer): :attr:`skipped` counts the skips over every DataLoader worker and
    every epoch (a sample skipped in three epochs counts three times), and
    :attr:`skipped_indices` lists the index of each skipped sample once (the first 32 distinct
    of each worker). ``max_errors`` raises :class:`~fpipe.skipping.TooManyErrors` once more
    skips than that were counted.

    >>> from fpipe.storage import ListReader
    >>> base = DatasetBase(ListReader([{"x": 1}, {"x": 2}]), seed=7)
    >>> len(base), base.epoch, base.seed
    (2, 0, 7)
    >>> base.set_epoch(3)
    >>> base.epoch
    3
    """

    def __init__(self, reader: Any, transforms: Mapping[Any, Callable] | Callable | None = None,
                 rng: Callable[[Any], Mapping] | None = None, *, seed: Seed = None,
                 epoch: int = 0, on_error: OnError = "raise",
                 max_errors: int | None = None) -> None:
        check_not_path(type(self).__name__, reader)
        if not hasattr(reader, "__len__"):
            raise TypeError(f"reader must be a reader or an ordering (with len); got reader={reader!r:.80}")
        if rng is not None:
            check_callable("rng", rng)
        self.reader = reader
        self.transforms = transforms
        self.rng = rng or no_rng
        self.seed = optional_entropy(seed)
        self._transform = self._checked_transform(transforms)
        self._clock = EpochClock(check_integer("epoch", epoch, 0))
        self.on_error, self.max_errors = check_on_error(on_error), check_max_errors(max_errors)
        self._skips = SkipBoard()

    @property
    def skipped(self) -> int:
        """How many times ``on_error`` skipped a sample so far, in this process and every
        worker, over every epoch."""
        return self._skips.count

    @property
    def skipped_indices(self) -> list[int]:
        """The index of each sample skipped so far, once however many epochs skipped it
        (the first 32 distinct of each worker), sorted."""
        return self._skips.indices

    def _apply_or_skip(self, sample: Any, index: int, epoch: int) -> Any:
        """:meth:`_apply`, or ``_SKIP`` once ``on_error`` has taken an error."""
        if self.on_error == "raise":
            return self._apply(sample, index, epoch)
        try:
            return self._apply(sample, index, epoch)
        except Exception as error:
            return self._skip(error, index, sample)

    def _skip(self, error: Exception, index: int, sample: Any = None) -> Any:
        handle(self.on_error, error, sample, index)
        count = self._skips.add(index)
        if self.max_errors is not None and count > self.max_errors:
            raise TooManyErrors(f"{count} samples failed, more than max_errors="
                                f"{self.max_errors}; the last: sample {index}: "
                                f"{type(error).__name__}: {error}") from error
        return _SKIP

    def _checked_transform(self, transforms: Any) -> Callable | None:
        if transforms is None:
            return None
        if isinstance(transforms, Mapping):
            self._unchecked = frozenset(
                field for field, transform in transforms.items()
                if not check_two_argument_call(f"transforms[{field!r}]", transform, "(value, params)"))
            self._fields = tuple(transforms.items())
            return self._transform_fields
        if not callable(transforms):
            raise TypeError("transforms must be a dict of callables, a callable or None; "
                            f"got transforms={transforms!r}")
        return self._transform_sample

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def epoch(self) -> int:
        """The epoch that the next pass reads (see :meth:`set_epoch`)."""
        return self._clock.base

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, in this process and in every DataLoader worker, persistent or not."""
        self._clock.set(check_integer("epoch", epoch, 0))

    def _apply(self, sample: Any, index: int, epoch: int) -> Any:
        if self._transform is None:
            return sample
        if self.seed is None:
            return self._transform(sample, index)
        previous = set_active(item_rng(self.seed, epoch, index))
        try:
            return self._transform(sample, index)
        finally:
            set_active(previous)

    def _transform_fields(self, sample: Any, index: int) -> Any:
        field = None
        try:
            params = self.rng(sample)
            sample["__params__"] = params
            for field, transform in self._fields:
                sample[field] = transform(sample[field], params)
            return sample
        except Exception as error:
            if field in self._unchecked:
                note_two_argument_call(error, f"transforms[{field!r}]", "(value, params)")
            located = with_sample_named(error, index, sample, field)
            if located is error:
                raise
            raise located from error.__cause__

    def _transform_sample(self, sample: Any, index: int) -> Any:
        key = sample.get("key") if isinstance(sample, Mapping) else None
        try:
            return self.transforms(sample)
        except Exception as error:
            located = with_sample_named(error, index, None if key is None else {"key": key}, None)
            if located is error:
                raise
            raise located from error.__cause__

    def _follow(self, epoch: int) -> None:
        # an ordering (Shuffler, QuasiShuffler, ...) reads the dataset's epoch
        reader = self.reader
        if getattr(reader, "epoch", epoch) != epoch and callable(getattr(reader, "set_epoch", None)):
            reader.set_epoch(epoch)


class Dataset(DatasetBase, torch.utils.data.Dataset):
    """A map-style dataset: ``dataset[i]`` is sample ``i`` of ``reader``, transformed.

    ``reader`` is a reader or an ordering with random access (``get``), such as
    :class:`~fpipe.storage.order.Shuffler` or :class:`~fpipe.storage.order.Range`; an
    ordering is read at the dataset's epoch. Readers are thread- and fork-safe, so the
    DataLoader may fork or spawn workers at any time, also after the parent has read. The
    DataLoader asks for a batch at once (``__getitems__``): a batch of consecutive indices is
    read with one ``get_slice``.

    ``seed`` makes ``rng`` and the transforms reproducible per index (see
    :class:`DatasetBase`); their draws depend on the epoch too, so call
    :meth:`~DatasetBase.set_epoch` at the start of every epoch for new augmentations.

    With ``on_error="skip"``, a batch that the DataLoader asks for (``__getitems__``) comes
    without the samples that failed, so it may be smaller; ``dataset[i]`` alone still raises,
    as it must return sample ``i``.

    >>> import random
    >>> from fpipe.storage import ListReader
    >>> def add(v, number):
    ...     return v + number
    >>> def rng(_):
    ...     return {"number": random.randrange(1, 10)}
    >>> dataset = Dataset(ListReader([{"a": 0} for _ in range(3)]), {"a": Compose(add)}, rng)
    >>> sample = dataset[1]
    >>> sample["a"] == sample["__params__"]["number"], sample["key"], len(dataset)
    (True, 1, 3)
    >>> import fpipe
    >>> def seeded_rng(_):
    ...     return {"number": int(fpipe.current_rng().integers(1, 10))}
    >>> seeded = Dataset(ListReader([{"a": 0} for _ in range(3)]), {"a": Compose(add)}, seeded_rng, seed=0)
    >>> [seeded[i]["a"] for i in range(3)] == [seeded[i]["a"] for i in range(3)]
    True
    """

    def __init__(self, reader: Any, transforms: Mapping[Any, Callable] | Callable | None = None,
                 rng: Callable[[Any], Mapping] | None = None, *, seed: Seed = None,
                 epoch: int = 0, on_error: OnError = "raise",
                 max_errors: int | None = None) -> None:
        super().__init__(reader, transforms, rng, seed=seed, epoch=epoch, on_error=on_error,
                         max_errors=max_errors)
        if not callable(getattr(reader, "get", None)):
            raise TypeError(f"Dataset needs random access (a reader with get); got reader={reader!r:.80}; "
                            "iterate orderings without it (QuasiShuffler, Cycler) with IterableDataset")

    def __getitem__(self, index: int) -> Any:
        epoch = self._clock.base
        self._follow(epoch)
        sample = self.reader.get(index)
        return self._apply(sample, self._position(index), epoch)

    def __getitems__(self, indices: list[int]) -> list:
        """Samples ``indices``, read at once (``get_many`` where the reader has it)."""
        epoch = self._clock.base
        self._follow(epoch)
        samples = self._read_batch(indices) if self.on_error == "raise" else read_or_each(
            self._read_batch, self.reader.get, indices, lambda e, i: self._skip(e, self._position(i)))
        if self._transform is None and self.on_error == "raise":
            return samples
        outputs = [s if s is _SKIP else self._apply_or_skip(s, self._position(i), epoch)
                   for s, i in zip(samples, indices)]
        return [x for x in outputs if x is not _SKIP] if self.on_error != "raise" else outputs

    def _read_batch(self, indices: list[int]) -> list:
        # A sequential sampler's batch is one run: one contiguous read. Shuffled batches are
        # read sample by sample, which beats sorting them into runs that are nearly all 1 long.
        reader = self.reader
        prefetch = getattr(reader, "prefetch", None)
        if prefetch is not None:  # a reader at a URL fetches the batch's blocks side by side
            prefetch(indices)
        if len(indices) > 1 and callable(getattr(reader, "get_slice", None)):
            first = indices[0]
            stop = first + len(indices)
            if first >= 0 and indices[-1] == stop - 1 and indices == list(range(first, stop)):
                return reader.get_slice(first, stop)
        get = reader.get
        return [get(i) for i in indices]

    def _position(self, index: int) -> int:
        index = operator.index(index)
        return index + len(self.reader) if index < 0 else index


class ElasticBatchSampler(torch.utils.data.Sampler):
    """The batches of indices that rank ``rank`` of ``world_size`` takes of an epoch of ``data``
    (a dataset, or its length), from any position on, for ``DataLoader(data, batch_sampler=...)``.

    The epoch's order is the dataset's own, ``0 .. len(data)-1`` (put a
    :class:`~fpipe.storage.order.Shuffler` in the :class:`Dataset` to shuffle it), dealt out in
    global batches of ``world_size * batch_size`` indices as :func:`fpipe.elastic_batches` says:
    step ``t`` takes the same samples on every grid. ``even=`` gives the ranks equal batch counts,
    as for :class:`IterableDataset`. :meth:`state_dict` says where the epoch stands after some
    batches, and :meth:`load_state_dict` carries on from there, on any grid of ranks and
    DataLoader workers and with any batch size. ``rank`` and ``world_size`` come from
    ``torch.distributed`` (process ``group``) when it is initialised, or are given.

    The sampler does not set the dataset's epoch: call ``set_epoch`` on both.

    >>> from torch.utils.data import DataLoader
    >>> from fpipe.storage import ListReader
    >>> data = Dataset(ListReader([{"x": i} for i in range(10)]))
    >>> sampler = ElasticBatchSampler(data, batch_size=2, rank=1, world_size=2)
    >>> [batch["x"].tolist() for batch in DataLoader(data, batch_sampler=sampler)]
    [[2, 3], [6, 7], [9]]
    >>> state = sampler.state_dict(batches=1)
    >>> state
    {'type': 'ElasticEpoch', 'version': 1, 'length': 10, 'epoch': 0, 'position': 4}
    >>> alone = ElasticBatchSampler(data, batch_size=4, rank=0, world_size=1)
    >>> alone.load_state_dict(state)
    >>> list(alone), list(alone)         # the rest of epoch 0, then a whole pass
    ([[4, 5, 6, 7], [8, 9]], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])
    """

    def __init__(self, data: Any, batch_size: int, *, rank: int | None = None,
                 world_size: int | None = None, group: Any = None, even: str | None = None,
                 epoch: int = 0) -> None:
        length = data if isinstance(data, (int, np.integer)) and not isinstance(data, bool) else None
        if length is None and not hasattr(data, "__len__"):
            raise TypeError(f"data must be a dataset with len() or a length; got data={data!r:.80}")
        self.length = check_integer("data", length, 0) if length is not None else len(data)
        self.batch_size = check_integer("batch_size", batch_size, 1)
        self.even = check_even(even)
        self.rank, self.world_size = _distributed(group, rank, world_size)
        self.epoch, self._position = check_integer("epoch", epoch, 0), 0
        self._latest: int | None = None  # where the latest pass of this epoch began
        self._loaded = False  # whether _position is a loaded state's, that no pass has read
        self._running: tuple[object, int] | None = None  # the pass under way: (token, start)

    def __iter__(self) -> Iterator[list[int]]:
        position, self._position, self._loaded = self._position, 0, False
        self._latest, token = position, object()
        self._running = (token, position)
        n = self.length
        try:
            for batch in elastic_batches(n, position, self.batch_size, self.rank,
                                         self.world_size, even=self.even):
                yield [index % n for index in batch]
        finally:
            if self._running is not None and self._running[0] is token:
                self._running = None

    def __len__(self) -> int:
        """The batches of the pass under way, from its first batch until it ends (or the
        epoch or a state is set); else of the next pass."""
        start = self._position if self._running is None else self._running[1]
        return sum(1 for _ in elastic_batches(self.length, start, self.batch_size,
                                              self.rank, self.world_size, even=self.even))

    def set_epoch(self, epoch: int) -> None:
        """Deal out epoch ``epoch`` next, from its start, unless a loaded state of that epoch
        waits for its pass: then from the state's position. After :meth:`load_state_dict`,
        and before a pass has read the state, another epoch raises ``ValueError`` (except the
        next one after a state at the end of its epoch): the rule of
        :meth:`IterableDataset.set_epoch`."""
        epoch = check_integer("epoch", epoch, 0)
        loaded = (self.epoch, self._position) if self._loaded else None
        stands = loaded_state_stands(loaded, epoch, self.length)
        self.epoch, self._latest, self._running = epoch, None, None
        if not stands:
            self._position, self._loaded = 0, False

    def state_dict(self, batches: int) -> dict[str, int]:
        """Where the epoch stands once the DataLoader has handed out ``batches`` batches of the
        latest pass (of the next one, if none has begun since the epoch or the state was set):
        as :meth:`IterableDataset.state_dict`."""
        start = self._position if self._latest is None else self._latest
        return elastic_state_dict(self.epoch, elastic_position(
            self.length, start, batches, self.batch_size, self.world_size), self.length)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Deal out epoch ``state["epoch"]`` next, from ``state["position"]`` on (a state of
        :meth:`state_dict` on any grid, of a dataset of this length); the passes after it are
        whole. ``set_epoch`` of the state's epoch keeps it (see :meth:`set_epoch`)."""
        self.epoch, self._position = elastic_state(state, self.length)
        self._latest, self._running, self._loaded = None, None, True

    def __repr__(self) -> str:
        even = f", even={self.even!r}" if self.even else ""
        return (f"ElasticBatchSampler({self.length}, batch_size={self.batch_size}, rank={self.rank}, "
                f"world_size={self.world_size}{even})")


def _distributed(group: Any, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None:
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized():
            return distributed.get_rank(group), distributed.get_world_size(group)
        return 0, 1
    if rank is None or world_size is None:
        raise ValueError(f"pass rank and world_size together; got rank={rank!r}, world_size={world_size!r}")
    world_size = check_integer("world_size", world_size, 1)
    if not 0 <= check_integer("rank", rank) < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size}")
    return int(rank), world_size


class IterableDataset(DatasetBase, torch.utils.data.IterableDataset):
    """An iterable dataset that shards ``reader`` over distributed ranks and DataLoader workers.

    Each of the ``world_size * num_workers`` workers reads one contiguous shard, in chunks of
    ``chunk_size`` samples (``copy`` goes to the reader), as datadings does; ranks rotate
    through the shards from epoch to epoch (:func:`worker_range` gives the exact layout).
    ``reader`` may be a reader or an ordering (:class:`~fpipe.storage.order.Shuffler`,
    :class:`~fpipe.storage.permutation.IndexShuffler`, :class:`~fpipe.storage.order.QuasiShuffler`,
    ...), which is read at the dataset's epoch.
    ``rank`` and ``world_size`` come from ``torch.distributed`` (process ``group``) when it
    is initialised at construction, or are given.

    Epochs: a pass reads the epoch last given to :meth:`~DatasetBase.set_epoch` (or
    ``epoch=``) plus the number of passes begun since, counted per worker in shared memory.
    So calling ``set_epoch(e)`` before each epoch reads epoch ``e``, and not calling it
    advances one epoch per pass — with persistent DataLoader workers or without.

    ``batch_size`` (the DataLoader's) cuts the workers' shards on whole batches (:func:`worker_range`),
    where datadings raises a ``RuntimeError`` for shards that make uneven batch counts; with it or
    not, ``len(DataLoader)`` is the batches it yields (:func:`asked_length`). ``even="drop"`` or
    ``"pad"`` gives every rank the same samples in the same pieces, so all make the same number
    of batches; after a stage that packs or filters them, :func:`even_batches` evens the batches.

    ``shuffle=True`` shuffles each shard QuasiShuffler-style (chunks of ``chunk_size`` in a
    random order through a buffer of ``buf_size``, a fraction of the shard or a number of
    samples), differently every epoch, from ``seed``. ``len()`` is what the calling process
    yields in its next pass: the rank's samples in the main process, the worker's in a worker.
    :meth:`resume` starts the next pass in the middle of an epoch, after the batches that a
    DataLoader has already made.

    ``elastic=True`` (with ``batch_size``, and without ``shuffle``) lays the epoch out so that a
    run can carry on on another grid: one order for the epoch, the reader's positions, dealt out
    in global batches of ``world_size * batch_size`` (:func:`fpipe.elastic_batches`), rank
    ``r`` taking the ``r``-th ``batch_size`` of each, its workers taking its batches in turn.
    :meth:`state_dict` then says where the epoch stands, and :meth:`load_state_dict` carries on
    from there with any number of ranks and workers and any batch size. ``resume`` still works
    in this mode, for the same grid.

    >>> from fpipe.storage import ListReader
    >>> reader = ListReader([{"x": i} for i in range(10)])
    >>> ranks = [IterableDataset(reader, rank=r, world_size=2, even="drop") for r in range(2)]
    >>> [[s["x"] for s in rank] for rank in ranks]
    [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    >>> [[s["x"] for s in rank] for rank in ranks]           # the next epoch: ranks swap
    [[5, 6, 7, 8, 9], [0, 1, 2, 3, 4]]
    >>> shuffled = IterableDataset(reader, shuffle=True, seed=0, buf_size=4, chunk_size=2)
    >>> sorted(s["x"] for s in shuffled) == list(range(10))
    True
    """

    def __init__(self, reader: Any, transforms: Mapping[Any, Callable] | Callable | None = None,
                 rng: Callable[[Any], Mapping] | None = None, batch_size: int | None = None,
                 epoch: int = 0, copy: bool = True, chunk_size: int = 16, group: Any = None, *,
                 even: str | None = None, shuffle: bool = False, buf_size: float = 0.01,
                 seed: Seed = None, rank: int | None = None, world_size: int | None = None,
                 elastic: bool = False, on_error: OnError = "raise",
                 max_errors: int | None = None) -> None:
        super().__init__(reader, transforms, rng, seed=seed, epoch=epoch, on_error=on_error,
                         max_errors=max_errors)
        if not callable(getattr(reader, "iter", None)):
            raise TypeError(f"reader must be a reader or an ordering (with iter); got reader={reader!r:.80}")
        self.batch_size = None if batch_size is None else check_integer("batch_size", batch_size, 1)
        self.copy = bool(copy)
        self.chunk_size = check_integer("chunk_size", chunk_size, 1)
        self.even, self.shuffle = check_even(even), bool(shuffle)
        self.buf_size = check_fraction_or_count("buf_size", buf_size)
        # the shuffle needs a seed even when the transforms draw fresh entropy
        self._shuffle_seed = seed_entropy(seed) if self.seed is None else self.seed
        self.rank, self.world_size = _distributed(group, rank, world_size)
        self.elastic = check_elastic(elastic, self.batch_size, self.shuffle)
        if self.elastic and self._may_skip():
            raise ValueError(
                "elastic=True needs on_error='raise': a skipped sample moves the later samples "
                "of its worker into earlier batches, so after some steps each worker and rank "
                "stands at another place of the epoch, and no one position resumes them all; "
                "leave bad samples out of the reader, or use Dataset(..., on_error=...) with "
                "ElasticBatchSampler, whose batches are positions (a skipped sample makes its "
                f"batch smaller); got on_error={self.on_error!r}")

    def __len__(self) -> int:
        """The samples that the calling process yields in its next pass (the rank's in the main
        process, the worker's in a worker; elastic, in the pass under way); to a DataLoader with
        workers, the length that makes its ``len`` the batches they make (:func:`asked_length`)."""
        return asked_length(self, self._length)

    def _length(self, worker: int, workers: int) -> int:
        epoch, resume = self._clock.peek(worker)
        if self.elastic:
            running = self._clock.running()
            position = running if running is not None else 0 if resume is None else resume.position
            return sum(map(len, self._elastic_batches(position, worker, workers)))
        shard = self._shard(epoch, resume, worker, workers)
        return len(shard.window) - shard.skip

    def __iter__(self) -> Iterator[Any]:
        worker, workers = current_worker()
        if self.elastic:
            return self._elastic_pass(worker, workers)
        epoch, resume = self._clock.begin(worker, workers)
        shard = self._shard(epoch, resume, worker, workers)
        if shard.made and self._may_skip():
            return self._replayed(shard, epoch, resume)
        return self._stream(shard.window, epoch, shard.skip)

    def _may_skip(self) -> bool:
        return self.on_error != "raise" and self._transform is not None

    def _replayed(self, shard: _Shard, epoch: int, resume: Resume) -> Iterator[Any]:
        """The rest of a resumed shard whose samples may fail: which ones fail is known only by
        transforming them, so the batches the DataLoader had are made again and dropped."""
        outputs = self._stream(shard.window, epoch, 0)
        size = resume.batch_size
        dropped = sum(1 for _ in itertools.islice(outputs, size * shard.made))
        # the resume counted the batches of every shard as if none of its samples failed
        if dropped < (size * shard.made if resume.drop_last else size * (shard.made - 1) + 1):
            raise RuntimeError(
                f"resume({resume.batches}, batch_size={size}) cannot be exact: the samples that "
                f"failed in positions {shard.window.start}..{shard.window.stop - 1} leave them "
                f"fewer than the {shard.made} batches the resume counts the DataLoader had of "
                "them, and the DataLoader passed over their worker sooner; resume before a "
                "worker runs out, or use Dataset(..., on_error=...) with ElasticBatchSampler")
        yield from outputs

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, in this process and in every DataLoader worker, persistent or
        not. A :meth:`resume` waiting for its pass stays.

        With ``elastic=True``, after :meth:`load_state_dict` and before a pass has read the
        state, the state's epoch keeps it (a loop that calls ``set_epoch`` at the start of
        every epoch resumes too), the next epoch after a state at the end of its epoch begins
        whole, and any other epoch raises ``ValueError``: it would drop the samples the state
        has left. :class:`ElasticBatchSampler` keeps the same rule.

        >>> from fpipe.storage import ListReader
        >>> data = IterableDataset(ListReader([{"x": i} for i in range(10)]), batch_size=2,
        ...                        elastic=True)
        >>> data.load_state_dict({"type": "ElasticEpoch", "version": 1, "length": 10,
        ...                       "epoch": 1, "position": 6})
        >>> data.set_epoch(1)
        >>> [s["x"] for s in data]
        [6, 7, 8, 9]
        >>> data.load_state_dict(data.state_dict(batches=1))   # epoch 1 at position 8
        >>> data.set_epoch(2)
        Traceback (most recent call last):
        ...
        ValueError: set_epoch(2) after load_state_dict() of a state of epoch 1 at position 8 of 10, \
before a pass has read it: epoch 1 has 2 samples left; call set_epoch(1) (or nothing) to finish \
it, or load a state of epoch 2
        """
        epoch = check_integer("epoch", epoch, 0)
        loaded = self._clock.loaded() if self.elastic else None
        stands = loaded_state_stands(loaded, epoch, len(self.reader))
        self._clock.set(epoch)
        if loaded is not None and not stands:
            self._clock.drop_resume()

    def resume(self, batches: int, batch_size: int, drop_last: bool = False) -> None:
        """Begin the next pass after the first ``batches`` batches that
        ``DataLoader(dataset, batch_size=batch_size, drop_last=drop_last)`` made in the epoch
        that pass reads, without reading them; the passes after it are whole again.

        A DataLoader takes one batch from each of its workers in turn (passing over workers
        that have run out), and each worker batches its own shard. So every worker works out
        how many batches of each shard were handed out, and the workers trade shards in turn so
        that worker 0, whose batch the DataLoader takes first, carries on with the shard whose
        batch came next. The resumed pass then gives the batches of the uninterrupted pass
        from batch ``batches`` on, augmentation included, persistent workers or not, as long as
        ``num_workers``, the ranks and the seeds are those of the original run. ``batches`` at
        or past the end of the epoch makes an empty pass.

        The resume reaches the workers through shared memory, as the epoch does; ``set_epoch``
        keeps it and ``resume(0, batch_size)`` cancels it. ``len()`` counts what the resumed
        pass yields. Skipped samples are not read, except by ``shuffle=True`` over a reader
        without ``get`` (that shard's shuffle needs them to fill its buffer), and with
        ``on_error`` other than ``"raise"``: which samples fail is known only by transforming
        them, so the batches before are made again and dropped. Should the failed samples have
        made a worker run out of batches before batch ``batches`` (so the DataLoader passed over
        it sooner than counted here), that worker raises a ``RuntimeError``, as the pass could
        not be exact.

        >>> from fpipe.storage import ListReader
        >>> from torch.utils.data import DataLoader
        >>> dataset = IterableDataset(ListReader([{"x": i} for i in range(10)]))
        >>> loader = DataLoader(dataset, batch_size=3)
        >>> dataset.resume(2, batch_size=3)
        >>> len(dataset), [batch["x"].tolist() for batch in loader]
        (4, [[6, 7, 8], [9]])
        >>> [batch["x"].tolist() for batch in loader]            # the next pass is whole
        [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        """
        batches = check_integer("batches", batches, 0)
        batch_size = check_integer("batch_size", batch_size, 1)
        drop_last = check_bool("drop_last", drop_last)
        position = elastic_position(len(self.reader), 0, batches, batch_size, self.world_size) \
            if self.elastic else 0
        self._clock.resume(batches, batch_size, drop_last, position)

    # --- elastic: one order for the epoch, dealt out in global batches onto any grid -------

    def state_dict(self, batches: int) -> dict[str, int]:
        """Where the epoch stands once the DataLoader has handed out ``batches`` batches of the
        latest pass (or of the next one, if none has begun since :meth:`load_state_dict` or
        :meth:`~DatasetBase.set_epoch`): the epoch, the position in its order (the samples
        every rank together has consumed) and the dataset's length. Needs ``elastic=True``.

        Load it with :meth:`load_state_dict` into a dataset on any number of ranks and workers,
        with any batch size: the run carries on with the samples of the epoch not yet seen.

        >>> from fpipe.storage import ListReader
        >>> reader = ListReader([{"x": i} for i in range(10)])
        >>> ranks = [IterableDataset(reader, batch_size=2, rank=r, world_size=2, elastic=True)
        ...          for r in range(2)]
        >>> [[s["x"] for s in rank] for rank in ranks]       # batches [0 1] [4 5] [8] | [2 3] [6 7] [9]
        [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]
        >>> state = ranks[0].state_dict(batches=1)            # after one step: 4 samples done
        >>> state
        {'type': 'ElasticEpoch', 'version': 1, 'length': 10, 'epoch': 0, 'position': 4}
        >>> alone = IterableDataset(reader, batch_size=3, elastic=True)
        >>> alone.load_state_dict(state)
        >>> [s["x"] for s in alone]
        [4, 5, 6, 7, 8, 9]
        """
        self._need_elastic("state_dict")
        epoch, position = self._clock.latest()
        n = len(self.reader)
        return elastic_state_dict(epoch, elastic_position(
            n, min(position, n), batches, self.batch_size, self.world_size), n)

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Read epoch ``state["epoch"]`` next, from ``state["position"]`` of its order on, in
        this process and in every DataLoader worker; the passes after it are whole. ``state``
        comes from :meth:`state_dict`, of this grid of ranks and workers or any other, with
        any batch size, of a dataset of the same length (another length raises a
        ``ValueError``). ``set_epoch`` of the state's epoch keeps it (see :meth:`set_epoch`)."""
        self._need_elastic("load_state_dict")
        epoch, position = elastic_state(state, len(self.reader))
        self._clock.set(epoch)
        self._clock.resume(0, self.batch_size, False, position, loaded=True)

    def _need_elastic(self, method: str) -> None:
        if not self.elastic:
            raise ValueError(f"{method} needs IterableDataset(..., elastic=True): the default "
                             "layout's position depends on the number of ranks and workers")

    def _elastic_batches(self, position: int, worker: int, workers: int) -> Iterator[range]:
        n = len(self.reader)
        return elastic_batches(n, min(position, n), self.batch_size, self.rank, self.world_size,
                               worker, workers, self.even)

    def _elastic_pass(self, worker: int, workers: int) -> Iterator[Any]:
        # the pass begins at its first item, so that until then len() and set_epoch() see
        # the state it will read as waiting for it
        epoch, resume = self._clock.begin(worker, workers)
        position = 0 if resume is None else resume.position
        self._clock.under_way(1)
        try:
            yield from self._elastic_stream(self._elastic_batches(position, worker, workers), epoch)
        finally:
            self._clock.under_way(-1)

    def _elastic_stream(self, batches: Iterator[range], epoch: int) -> Iterator[Any]:
        self._follow(epoch)
        n, reader, apply = len(self.reader), self.reader, self._apply_or_skip
        for batch in batches:
            for run in wrapped_runs(batch, n):
                for index, sample in read_on(reader, run.start, run.stop, self._skip,
                                             copy=self.copy, chunk_size=self.chunk_size):
                    output = apply(sample, index, epoch)
                    if output is not _SKIP:
                        yield output

    def _shard(self, epoch: int, resume: Resume | None, worker: int, workers: int) -> _Shard:
        """The positions that worker ``worker`` reads in a pass, and how many it skips.

        A DataLoader begins every pass with worker 0, so in a resumed pass the workers trade
        shards in turn: worker 0 takes the shard whose batch comes next, and the others
        follow in the original order."""
        if resume is None:
            return _Shard(self._window(epoch, worker, workers), 0)
        batches, size, drop_last, _ = resume
        lengths = [len(self._window(epoch, w, workers)) for w in range(workers)]
        counts = [n // size if drop_last else -(-n // size) for n in lengths]
        made, first = resume_plan(counts, batches)
        shard = (first + worker) % workers
        window = self._window(epoch, shard, workers)
        # every batch of every shard made: an empty pass, whatever failed in it
        return _Shard(window, min(lengths[shard], size * made[shard]),
                      0 if made == counts else made[shard])

    def _window(self, epoch: int, worker: int, workers: int) -> range:
        # with batch_size, the workers' shards are cut on whole batches (see worker_range)
        return worker_range(len(self.reader), self.rank, self.world_size, worker, workers, epoch,
                            self.even, self.batch_size)

    def _stream(self, window: range, epoch: int, skip: int) -> Iterator[Any]:
        if skip >= len(window):
            return
        self._follow(epoch)
        if self.shuffle:
            pairs = self._shuffled(window, epoch, skip)
        else:  # with on_error, a sample that does not read is skipped and reading goes on
            pairs = read_on(self.reader, window.start + skip, window.stop, self._skip,
                            copy=self.copy, chunk_size=self.chunk_size)
        if self._transform is None:
            for _, sample in pairs:
                yield sample
            return
        apply = self._apply_or_skip
        for index, sample in pairs:
            output = apply(sample, index, epoch)
            if output is not _SKIP:
                yield output

    def _shuffled(self, window: range, epoch: int, skip: int) -> Iterator[tuple[int, Any]]:
        shard = Range(Indexed(self.reader), window.start, window.stop)
        shuffler = QuasiShuffler(shard, buf_size=self.buf_size, chunk_size=self.chunk_size,
                                 seed=shard_seed(self._shuffle_seed, window.start))
        shuffler.set_epoch(epoch)
        if skip and not callable(getattr(self.reader, "get", None)):
            # refilling the buffer at `skip` takes random reads: without them, read up to it
            return itertools.islice(shuffler.iter(copy=self.copy), skip, None)
        return shuffler.iter(skip, copy=self.copy)

    def __repr__(self) -> str:
        options = [f"batch_size={self.batch_size}"] if self.batch_size is not None else []
        options += [f"even={self.even!r}"] if self.even else []
        options += ["shuffle=True"] if self.shuffle else []
        options += [f"rank={self.rank}", f"world_size={self.world_size}"]
        return f"IterableDataset({self.reader!r}, {', '.join(options)})"
