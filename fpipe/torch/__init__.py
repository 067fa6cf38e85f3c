"""PyTorch adapters: datadings's torch API over fpipe's readers and orderings.

The names and signatures are datadings's (``Compose``, ``CompressedToPIL``, ``Dataset``,
``DatasetBase``, ``IterableDataset``, ``dict2tuple``, ``no_rng``), so datadings code ports by
changing its imports. What changes is what breaks there: readers work in forked and spawned
workers after the parent has read, ``set_epoch`` works with and without persistent workers,
empty shards yield nothing, orderings give decoded samples, and ``Shards(even=...)`` gives
every rank the same number of batches. This is the only fpipe module that imports torch.

fpipe's options are values, keyword-only after datadings's parameters: ``layout=`` says which
samples each rank reads in which order (:class:`Shards`, datadings's layout, shuffled or not; or
:class:`Elastic`, one order that another grid carries on), ``samples=`` how each sample is made
(:class:`Samples`: the seed, threads, what a failing sample does). See ``fpipe.torch._options``
for why.

>>> from fpipe.dataset import ListReader
>>> def add(value, number):
...     return value + number
>>> reader = ListReader([{"key": f"k{i}", "x": i} for i in range(6)])
>>> dataset = Dataset(reader, transforms={"x": Compose(add)}, rng=lambda sample: {"number": 10})
>>> dataset[2]["x"], len(dataset)
(12, 6)
>>> stream = IterableDataset(reader, layout=Shards(rank=1, world_size=2))   # rank 1 of 2, no workers
>>> [sample["x"] for sample in stream], len(stream)
([3, 4, 5], 3)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
import weakref
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

from fpipe.dataset.shuffling import shuffled_shard
from fpipe.errors import (
    check_bool,
    check_callable,
    check_integer,
    check_not_path,
    check_state,
    check_two_argument_call,
    note_two_argument_call,
    state_header,
)
from fpipe.functional import Compose, dict2tuple, no_rng
from fpipe.image import CompressedToPIL, with_sample_named
from fpipe.random import item_rng, optional_entropy, seed_entropy, set_active, shard_seed
from fpipe.sharding import (
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
from fpipe.skipping import (
    TooManyErrors,
    handle,
    read_on,
    read_or_each,
)
from fpipe.stream.parallel._shm import register as share_type
from fpipe.stream.parallel.stages import threads as parallel_threads
from fpipe.torch._loaders import EvenBatches, asked_length, even_batches
from fpipe.torch._options import (
    Elastic,
    Samples,
    Shards,
    as_layout,
    as_samples,
    check_ranks,
    removed_keywords,
)
from fpipe.torch._shared import EpochClock, Resume, SkipBoard, current_worker

__all__ = [
    "Compose",
    "CompressedToPIL",
    "Dataset",
    "DatasetBase",
    "Elastic",
    "ElasticBatchSampler",
    "EvenBatches",
    "IterableDataset",
    "Samples",
    "Shards",
    "dict2tuple",
    "even_batches",
    "get_worker_info",
    "no_rng",
    "regrid_state",
    "worker_range",
]

_SKIP = object()  # what _apply_or_skip returns for a skipped sample
_PASS_STATE = "IterableDatasetPass"


class _WorkerPass(NamedTuple):
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
    is also stored in ``sample["__params__"]``. ``samples`` (a :class:`Samples`) holds the
    options of how each sample is made. With its ``seed``, the item generator of
    ``(seed, epoch, index)`` is active while ``rng`` and the transforms run, so whatever
    draws from :func:`fpipe.current_rng` (or uses fpipe's random combinators) is
    reproducible per sample, whichever worker or rank reads it. An exception in a transform
    names the sample (its index, key and field).

    ``Samples(on_error="skip")`` (or a callable ``on_error(error, sample, index)``, called in the
    worker; see :mod:`fpipe.skipping`) leaves out the samples whose transforms raise (a
    corrupt image, say) or that do not read (a damaged record, ``sample`` None; not in
    ``Shards(shuffle=True)``'s buffer): :attr:`skipped` counts the skips over every DataLoader worker and
    every epoch (a sample skipped in three epochs counts three times), and
    :attr:`skipped_indices` lists the index of each skipped sample once (the first 32 distinct
    of each worker). ``max_errors`` raises :class:`~fpipe.skipping.TooManyErrors` once more
    skips than that were counted.

    >>> from fpipe.dataset import ListReader
    >>> base = DatasetBase(ListReader([{"x": 1}, {"x": 2}]), samples=Samples(seed=7))
    >>> len(base), base.epoch, base.seed
    (2, 0, 7)
    >>> base.set_epoch(3)
    >>> base.epoch
    3
    """

    def __init__(self, reader: Any, transforms: Mapping[Any, Callable] | Callable | None = None,
                 rng: Callable[[Any], Mapping] | None = None, *, epoch: int = 0,
                 samples: Samples | None = None, **removed: Any) -> None:
        removed_keywords(type(self).__name__, removed, ("epoch", "samples"))
        samples = as_samples(samples)
        check_not_path(type(self).__name__, reader)
        if not hasattr(reader, "__len__"):
            raise TypeError(f"reader must be a reader or an ordering (with len); got reader={reader!r:.80}")
        if rng is not None:
            check_callable("rng", rng)
        self.reader = reader
        self.transforms = transforms
        self.rng = rng or no_rng
        self.samples = samples
        self.seed = optional_entropy(samples.seed)
        self._transform = self._checked_transform(transforms)
        self._clock = EpochClock(check_integer("epoch", epoch, 0))
        self.on_error, self.max_errors = samples.on_error, samples.max_errors
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
    :class:`~fpipe.orderings.order.Shuffler` or :class:`~fpipe.orderings.order.Range`; an
    ordering is read at the dataset's epoch. Readers are thread- and fork-safe, so the
    DataLoader may fork or spawn workers at any time, also after the parent has read. The
    DataLoader asks for a batch at once (``__getitems__``): a batch of consecutive indices is
    read with one ``get_slice``.

    ``samples=Samples(seed=...)`` makes ``rng`` and the transforms reproducible per index (see
    :class:`DatasetBase`); their draws depend on the epoch too, so call
    :meth:`~DatasetBase.set_epoch` at the start of every epoch for new augmentations.

    With ``Samples(on_error="skip")``, a batch that the DataLoader asks for (``__getitems__``) comes
    without the samples that failed, so it may be smaller; ``dataset[i]`` alone still raises,
    as it must return sample ``i``. ``Samples(n_threads=...)`` is refused: the DataLoader asks
    for one sample (or batch) per call, in its workers.

    >>> import random
    >>> from fpipe.dataset import ListReader
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
    >>> seeded = Dataset(ListReader([{"a": 0} for _ in range(3)]), {"a": Compose(add)}, seeded_rng,
    ...                  samples=Samples(seed=0))
    >>> [seeded[i]["a"] for i in range(3)] == [seeded[i]["a"] for i in range(3)]
    True
    """

    def __init__(self, reader: Any, transforms: Mapping[Any, Callable] | Callable | None = None,
                 rng: Callable[[Any], Mapping] | None = None, *, epoch: int = 0,
                 samples: Samples | None = None, **removed: Any) -> None:
        removed_keywords("Dataset", removed, ("epoch", "samples"))
        if samples is not None and as_samples(samples).n_threads is not None:
            raise ValueError("Dataset makes one sample per call, in the DataLoader's workers: "
                             "Samples(n_threads=...) is for IterableDataset; got "
                             f"n_threads={samples.n_threads!r}")
        super().__init__(reader, transforms, rng, epoch=epoch, samples=samples)
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
    :class:`~fpipe.orderings.order.Shuffler` in the :class:`Dataset` to shuffle it), dealt out in
    global batches of ``world_size * batch_size`` indices as :func:`fpipe.sharding.elastic_batches` says:
    step ``t`` takes the same samples on every grid, as :class:`Elastic` deals out an
    :class:`IterableDataset`. ``even=`` gives the ranks equal batch counts, as
    ``Elastic(even=...)`` does. :meth:`state_dict` says where the epoch stands after some
    batches, and :meth:`load_state_dict` carries on from there, on any grid of ranks and
    DataLoader workers and with any batch size. ``rank`` and ``world_size`` come from
    ``torch.distributed`` (process ``group``) when it is initialised, or are given.

    The sampler does not set the dataset's epoch: call ``set_epoch`` on both.

    >>> from torch.utils.data import DataLoader
    >>> from fpipe.dataset import ListReader
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
        self._yielded = 0  # the batches the latest pass has yielded

    def __iter__(self) -> Iterator[list[int]]:
        position, self._position, self._loaded = self._position, 0, False
        self._latest, token = position, object()
        self._running, self._yielded = (token, position), 0
        n = self.length
        try:
            for batch in elastic_batches(n, position, self.batch_size, self.rank,
                                         self.world_size, even=self.even):
                self._yielded += 1
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

    def state_dict(self, batches: int | None = None) -> dict[str, int]:
        """Where the epoch stands once the DataLoader has handed out ``batches`` batches of the
        latest pass (of the next one, if none has begun since the epoch or the state was set):
        as :meth:`IterableDataset.state_dict`. Without ``batches``, after the batches this
        sampler has yielded in that pass: the state torchdata's ``StatefulDataLoader`` takes
        from it when it hands out the batch of those indices, and loads into the sampler of a
        fresh loader."""
        start = self._position if self._latest is None else self._latest
        if batches is None:
            batches = 0 if self._latest is None else self._yielded
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
    check_ranks(rank, world_size)
    return int(rank), int(world_size)


class IterableDataset(DatasetBase, torch.utils.data.IterableDataset):
    """An iterable dataset that shards ``reader`` over distributed ranks and DataLoader workers.

    Each of the ``world_size * num_workers`` workers reads one contiguous shard, in chunks of
    ``chunk_size`` samples (``copy`` goes to the reader), as datadings does; ranks rotate
    through the shards from epoch to epoch (:func:`worker_range` gives the exact layout).
    ``reader`` may be a reader or an ordering (:class:`~fpipe.orderings.order.Shuffler`,
    :class:`~fpipe.orderings.permutation.IndexShuffler`, :class:`~fpipe.orderings.order.QuasiShuffler`,
    ...), which is read at the dataset's epoch.

    The eight positional parameters are datadings's, so datadings code runs unchanged; fpipe's
    options are two values, keyword-only: ``layout`` (:class:`Shards`, the default, or
    :class:`Elastic`) says which samples each rank and worker reads and in which order, and
    ``samples`` (:class:`Samples`) how each is made. One class per layout, as the modes exclude
    each other; each value checks its fields when it is made. Any other keyword is a
    ``TypeError`` that names it, raised before anything is created (for a keyword of fpipe's
    earlier API, such as ``elastic=True``, the message says what replaced it). A layout's
    ``rank`` and ``world_size`` come from ``torch.distributed`` (process ``group``) when they
    are None and it is initialised at construction.

    Epochs: a pass reads the epoch last given to :meth:`~DatasetBase.set_epoch` (or
    ``epoch=``) plus the number of passes begun since, counted per worker in shared memory.
    So calling ``set_epoch(e)`` before each epoch reads epoch ``e``, and not calling it
    advances one epoch per pass — with persistent DataLoader workers or without.

    ``batch_size`` (the DataLoader's) cuts the workers' shards on whole batches (:func:`worker_range`),
    where datadings raises a ``RuntimeError`` for shards that make uneven batch counts; with it or
    not, ``len(DataLoader)`` is the batches it yields (:func:`asked_length`). ``even="drop"`` or
    ``"pad"`` (of the layout) gives every rank the same samples in the same pieces, so all make
    the same number of batches; after a stage that packs or filters them, :func:`even_batches`
    evens the batches.

    ``Shards(shuffle=True)`` shuffles each shard anew every epoch, from ``(seed, epoch, shard)``, as
    well as the reader affords (:func:`~fpipe.dataset.shuffling.shuffled_shard`): a true
    permutation where random access is cheap (``get``: packed datasets, lists); for a reader
    that decodes blocks (``blocks``: Parquet, Arrow, a dataset at a URL), the blocks in a
    random order, each read once, in groups of at least 4 blocks and ``buffer_samples`` samples
    mixed whole; for an ordering without ``get``, a QuasiShuffler's buffer of ``buffer_samples``.
    The next sample lies within 16 positions of the one before (defaults, seeds 0-4; a true
    shuffle: 33 / n) for 1.6 % of 2,000 samples with random access, 1.6 % in Parquet row
    groups of 1,000, 21 % through the buffer; of 100,000: 0.03 %, 0.8 %, 0.75 % (see the
    shuffling guide). ``len()`` is what the calling process yields in its next pass: the
    rank's samples in the main process, the worker's in a worker. :meth:`resume` starts the
    next pass in the middle of an epoch, after the batches that a DataLoader has already made.

    ``Samples(n_threads=...)`` runs ``rng`` and the transforms of each process's pass in that
    many threads (:func:`fpipe.threads`, ordered), or ``"auto"``: as many as keep up with the DataLoader,
    chosen while the pass runs, with a buffer that grows as it needs (see the tuning page).
    It pays for transforms that release the GIL (decoding images with Pillow or simplejpeg,
    NumPy, IO): each DataLoader worker then keeps more than one core busy. Outputs keep their
    order and their per-sample randomness, so they do not depend on the number of threads,
    and each carries the place of the pass, so a state stays exact.

    ``layout=Elastic()`` (with ``batch_size``; it has no shuffle) lays the epoch out so that a
    run can carry on on another grid: one order for the epoch, the reader's positions, dealt out
    in global batches of ``world_size * batch_size`` (:func:`fpipe.sharding.elastic_batches`), rank
    ``r`` taking the ``r``-th ``batch_size`` of each, its workers taking its batches in turn.
    :meth:`state_dict` then says where the epoch stands, and :meth:`load_state_dict` carries on
    from there with any number of ranks and workers and any batch size. ``resume`` still works
    in this mode, for the same grid.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"x": i} for i in range(10)])
    >>> ranks = [IterableDataset(reader, layout=Shards(rank=r, world_size=2, even="drop"))
    ...          for r in range(2)]
    >>> [[s["x"] for s in rank] for rank in ranks]
    [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    >>> [[s["x"] for s in rank] for rank in ranks]           # the next epoch: ranks swap
    [[5, 6, 7, 8, 9], [0, 1, 2, 3, 4]]
    >>> shuffled = IterableDataset(reader, chunk_size=2, layout=Shards(shuffle=True, buffer_samples=4),
    ...                            samples=Samples(seed=0))
    >>> sorted(s["x"] for s in shuffled) == list(range(10))
    True
    """

    keeps_place = True  # its passes know where they stand: fpipe streams over it read no item ahead

    def __init__(self, reader: Any, transforms: Mapping[Any, Callable] | Callable | None = None,
                 rng: Callable[[Any], Mapping] | None = None, batch_size: int | None = None,
                 epoch: int = 0, copy: bool = True, chunk_size: int = 16, group: Any = None, *,
                 layout: Shards | Elastic | None = None, samples: Samples | None = None,
                 **removed: Any) -> None:
        removed_keywords("IterableDataset", removed, ("layout", "samples"))
        # the options first, so that a bad one is refused before the shared state is made
        layout = as_layout(layout)
        elastic = isinstance(layout, Elastic)
        batch_size = None if batch_size is None else check_integer("batch_size", batch_size, 1)
        if elastic and batch_size is None:
            raise ValueError("layout=Elastic() needs batch_size (the DataLoader's): the epoch is "
                             "dealt out in batches; got batch_size=None")
        chunk_size = check_integer("chunk_size", chunk_size, 1)
        super().__init__(reader, transforms, rng, epoch=epoch, samples=samples)
        if not callable(getattr(reader, "iter", None)):
            raise TypeError(f"reader must be a reader or an ordering (with iter); got reader={reader!r:.80}")
        self.layout, self.elastic, self.n_threads = layout, elastic, self.samples.n_threads
        self.batch_size, self.copy, self.chunk_size = batch_size, bool(copy), chunk_size
        self.even = layout.even
        self.shuffle = not elastic and layout.shuffle
        self.buffer_samples = 0.01 if elastic else layout.buffer_samples
        # the shuffle needs a seed even when the transforms draw fresh entropy
        self._shuffle_seed = seed_entropy(self.samples.seed) if self.seed is None else self.seed
        self.rank, self.world_size = _distributed(group, layout.rank, layout.world_size)
        self._pending: dict | None = None  # a pass state that the next pass here carries on from
        self._latest: Any = None  # a weak reference to the latest pass in this process
        if self.elastic and self._may_skip():
            raise ValueError(
                "layout=Elastic() needs Samples(on_error='raise'): a skipped sample moves the "
                "later samples of its worker into earlier batches, so after some steps each "
                "worker and rank stands at another place of the epoch, and no one position "
                "resumes them all; leave bad samples out of the reader, or use "
                "Dataset(..., samples=Samples(on_error=...)) with ElasticBatchSampler, whose "
                "batches are positions (a skipped sample makes its batch smaller); "
                f"got on_error={self.on_error!r}")

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

    def __iter__(self) -> _Pass:
        """A pass over this process's share of the epoch: an iterator that keeps its place
        (``state_dict()`` / ``load_state_dict()``, see :class:`_Pass`)."""
        return _Pass(self, *current_worker())

    def _may_skip(self) -> bool:
        return self.on_error != "raise" and self._transform is not None

    def _replayed(self, shard: _WorkerPass, epoch: int, resume: Resume) -> Iterator[tuple[int, Any]]:
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
                "worker runs out, or use Dataset(..., samples=Samples(on_error=...)) with "
                "ElasticBatchSampler")
        yield from outputs

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, in this process and in every DataLoader worker, persistent or
        not. A :meth:`resume` waiting for its pass stays.

        With ``layout=Elastic()``, after :meth:`load_state_dict` and before a pass has read the
        state, the state's epoch keeps it (a loop that calls ``set_epoch`` at the start of
        every epoch resumes too), the next epoch after a state at the end of its epoch begins
        whole, and any other epoch raises ``ValueError``: it would drop the samples the state
        has left. :class:`ElasticBatchSampler` keeps the same rule.

        >>> from fpipe.dataset import ListReader
        >>> data = IterableDataset(ListReader([{"x": i} for i in range(10)]), batch_size=2,
        ...                        layout=Elastic())
        >>> data.load_state_dict({"type": "ElasticEpoch", "version": 1, "length": 10,
        ...                       "epoch": 1, "position": 6})
        >>> data.set_epoch(1)
        >>> [s["x"] for s in data]
        [6, 7, 8, 9]
        >>> data.load_state_dict({"type": "ElasticEpoch", "version": 1, "length": 10,
        ...                       "epoch": 1, "position": 8})
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
        pass yields. Skipped samples are not read, except by ``Shards(shuffle=True)`` over a reader
        without ``get`` (that shard's shuffle needs them to fill its buffer), and with
        ``on_error`` other than ``"raise"``: which samples fail is known only by transforming
        them, so the batches before are made again and dropped. Should the failed samples have
        made a worker run out of batches before batch ``batches`` (so the DataLoader passed over
        it sooner than counted here), that worker raises a ``RuntimeError``, as the pass could
        not be exact.

        >>> from fpipe.dataset import ListReader
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

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """Without ``batches``: where the latest pass of this process stands (a DataLoader
        worker's, or the main process's without workers), as :meth:`_Pass.state_dict` says; the
        state that torchdata's ``StatefulDataLoader`` takes with each batch, from the dataset and
        from its iterator. Load it with :meth:`load_state_dict` into this dataset built anew,
        on the same grid of ranks and workers: the next pass of that process carries on from it.

        With ``batches``: where the epoch stands once the DataLoader has handed out ``batches``
        batches of the
        latest pass (or of the next one, if none has begun since :meth:`load_state_dict` or
        :meth:`~DatasetBase.set_epoch`): the epoch, the position in its order (the samples
        every rank together has consumed) and the dataset's length. Needs ``layout=Elastic()``.
        A count that cannot be right is refused with a ``ValueError``: more batches than the
        workers have made, another number of samples than a DataLoader without workers was
        handed, or a pass read by a dataset of yours around this one (which may regroup,
        filter or pack what it reads, so its batches are not this dataset's): save those
        states with torchdata's ``StatefulDataLoader``, whose state follows every item.

        Load it with :meth:`load_state_dict` into a dataset on any number of ranks and workers,
        with any batch size: the run carries on with the samples of the epoch not yet seen.

        >>> from fpipe.dataset import ListReader
        >>> reader = ListReader([{"x": i} for i in range(10)])
        >>> ranks = [IterableDataset(reader, batch_size=2, layout=Elastic(rank=r, world_size=2))
        ...          for r in range(2)]
        >>> [[s["x"] for s in rank] for rank in ranks]       # batches [0 1] [4 5] [8] | [2 3] [6 7] [9]
        [[0, 1, 4, 5, 8], [2, 3, 6, 7, 9]]
        >>> from torch.utils.data import DataLoader
        >>> ranks[0].set_epoch(0)
        >>> step = next(iter(DataLoader(ranks[0], batch_size=2)))   # one step of rank 0
        >>> state = ranks[0].state_dict(batches=1)            # after one step: 4 samples done
        >>> state
        {'type': 'ElasticEpoch', 'version': 1, 'length': 10, 'epoch': 0, 'position': 4}
        >>> alone = IterableDataset(reader, batch_size=3, layout=Elastic())
        >>> alone.load_state_dict(state)
        >>> [s["x"] for s in alone]
        [4, 5, 6, 7, 8, 9]
        """
        if batches is None:
            return self._latest_pass().state_dict()
        self._need_elastic("state_dict")
        epoch, position = self._clock.latest()
        n = len(self.reader)
        self._check_batches(check_integer("batches", batches, 0), position)
        return elastic_state_dict(epoch, elastic_position(
            n, min(position, n), batches, self.batch_size, self.world_size), n)

    def _check_batches(self, batches: int, position: int) -> None:
        """Refuse a count of batches that the latest elastic pass cannot have handed out."""
        handed, wrapped = self._clock.handed_out()
        if wrapped:
            raise ValueError(
                f"state_dict(batches={batches}) cannot be right: a dataset of yours reads this "
                "one in the DataLoader's workers, so the batches you count are its batches, not "
                "this dataset's (a packer or a filter takes other numbers of samples); take the "
                "state with each batch instead: torchdata's StatefulDataLoader(...).state_dict() "
                "(see the resume tutorial)")
        workers = len(handed)
        made = [len(list(itertools.islice(self._elastic_batches(position, w, workers),
                                          batches // workers + (w < batches % workers))))
                for w in range(workers)]
        wanted = [sum(map(len, itertools.islice(self._elastic_batches(position, w, workers),
                                                made[w]))) for w in range(workers)]
        short = [w for w in range(workers) if handed[w] < wanted[w] and any(handed)]
        surplus = workers == 1 and any(handed) and handed[0] > wanted[0] and sum(made) == batches
        if short or surplus:
            raise ValueError(
                f"state_dict(batches={batches}) cannot be right: {batches} batches of "
                f"{self.batch_size} take {sum(wanted)} samples of this rank, but its "
                f"{'workers' if workers > 1 else 'pass'} handed out {sum(handed)} "
                f"({', '.join(map(str, handed))} by worker); count the batches the DataLoader "
                "over this dataset gave, or take the state with each batch: torchdata's "
                "StatefulDataLoader(...).state_dict()")

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """A pass state (of :meth:`state_dict` without ``batches``, or of a pass): the next
        pass of this process carries on from it (see :class:`_Pass`).

        An elastic state: read epoch ``state["epoch"]`` next, from ``state["position"]`` of its
        order on, in this process and in every DataLoader worker; the passes after it are whole. ``state``
        comes from :meth:`state_dict`, of this grid of ranks and workers or any other, with
        any batch size, of a dataset of the same length (another length raises a
        ``ValueError``). ``set_epoch`` of the state's epoch keeps it (see :meth:`set_epoch`)."""
        if isinstance(state, Mapping) and state.get("type") == _PASS_STATE:
            _Pass(self, *current_worker(), begin=False).state_loader(state)  # checked now
            self._pending = dict(state)
            return
        self._need_elastic("load_state_dict")
        epoch, position = elastic_state(state, len(self.reader))
        self._clock.set(epoch)
        self._clock.resume(0, self.batch_size, False, position, loaded=True)

    def _latest_pass(self) -> _Pass:
        latest = self._latest() if self._latest is not None else None
        return latest if latest is not None else _Pass(self, *current_worker(), begin=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_latest": None}  # a weak reference does not pickle

    def _need_elastic(self, method: str) -> None:
        if not self.elastic:
            raise ValueError(f"{method} needs IterableDataset(..., layout=Elastic()): the default "
                             "layout's position depends on the number of ranks and workers")

    def _elastic_batches(self, position: int, worker: int, workers: int) -> Iterator[range]:
        n = len(self.reader)
        return elastic_batches(n, min(position, n), self.batch_size, self.rank, self.world_size,
                               worker, workers, self.even)

    def _elastic_pass(self, position: int, worker: int, workers: int, epoch: int,
                      skip: int) -> Iterator[tuple[int, Any]]:
        """``(done, output)`` of the elastic pass from ``position`` of the epoch's order, of
        worker ``worker``, after the first ``skip`` positions of its batches. The pass counts
        as under way from its first item, so that until then len() and set_epoch() see the
        state it will read as waiting for it."""
        self._clock.under_way(1)
        try:
            yield from self._elastic_stream(self._elastic_batches(position, worker, workers), epoch,
                                            skip)
        finally:
            self._clock.under_way(-1)

    def _elastic_stream(self, batches: Iterator[range], epoch: int,
                        skip: int) -> Iterator[tuple[int, Any]]:
        self._follow(epoch)
        return self._transformed(self._elastic_read(batches, skip), epoch)

    def _elastic_read(self, batches: Iterator[range], skip: int) -> Iterator[tuple[int, int, Any]]:
        """``(done, index, sample)`` of the worker's elastic ``batches`` after the first
        ``skip`` of their positions."""
        n, reader = len(self.reader), self.reader
        done = 0  # positions of this worker's batches passed
        for batch in batches:
            if done + len(batch) <= skip:
                done += len(batch)
                continue
            begin = batch.start + max(0, skip - done)
            done = begin - batch.start + done
            for run in wrapped_runs(range(begin, batch.stop), n):
                for index, sample in read_on(reader, run.start, run.stop, self._skip,
                                             copy=self.copy, chunk_size=self.chunk_size):
                    done += 1
                    yield done, index, sample

    def _shard(self, epoch: int, resume: Resume | None, worker: int, workers: int) -> _WorkerPass:
        """The positions that worker ``worker`` reads in a pass, and how many it skips.

        A DataLoader begins every pass with worker 0, so in a resumed pass the workers trade
        shards in turn: worker 0 takes the shard whose batch comes next, and the others
        follow in the original order."""
        if resume is None:
            return _WorkerPass(self._window(epoch, worker, workers), 0)
        batches, size, drop_last, _ = resume
        lengths = [len(self._window(epoch, w, workers)) for w in range(workers)]
        counts = [n // size if drop_last else -(-n // size) for n in lengths]
        made, first = resume_plan(counts, batches)
        shard = (first + worker) % workers
        window = self._window(epoch, shard, workers)
        # every batch of every shard made: an empty pass, whatever failed in it
        return _WorkerPass(window, min(lengths[shard], size * made[shard]),
                      0 if made == counts else made[shard])

    def _window(self, epoch: int, worker: int, workers: int) -> range:
        # with batch_size, the workers' shards are cut on whole batches (see worker_range)
        return worker_range(len(self.reader), self.rank, self.world_size, worker, workers, epoch,
                            self.even, self.batch_size)

    def _stream(self, window: range, epoch: int, skip: int) -> Iterator[tuple[int, Any]]:
        """``(done, output)`` of the shard ``window`` in ``epoch`` from its position ``skip``
        on, ``done`` counting the positions of the shard passed once ``output`` is made."""
        if skip >= len(window):
            return
        self._follow(epoch)
        if self.shuffle:
            triples = ((done, index, sample) for done, (index, sample)
                       in enumerate(self._shuffled(window, epoch, skip), skip + 1))
        else:  # with on_error, a sample that does not read is skipped and reading goes on
            before = window.start - 1
            triples = ((index - before, index, sample) for index, sample in read_on(
                self.reader, window.start + skip, window.stop, self._skip, copy=self.copy,
                chunk_size=self.chunk_size))
        yield from self._transformed(triples, epoch)

    def _transformed(self, triples: Iterator[tuple[int, int, Any]],
                     epoch: int) -> Iterator[tuple[int, Any]]:
        """``(done, output)`` of ``(done, index, sample)``: the samples transformed here, or in
        ``Samples(n_threads=...)`` threads (ordered, each sample with its ``done``, so the pass's place is
        that of the output handed out, whatever is in the threads)."""
        if self._transform is None:
            for done, _, sample in triples:
                yield done, sample
            return
        if self.n_threads is None:
            apply = self._apply_or_skip
            for done, index, sample in triples:
                output = apply(sample, index, epoch)
                if output is not _SKIP:
                    yield done, output
            return
        stage = parallel_threads(functools.partial(self._apply_triple, epoch=epoch),
                                 n_workers=self.n_threads,
                                 buffer_chunks="auto" if self.n_threads == "auto" else 2)
        with stage(triples) as outputs:
            for done, output in outputs:
                if output is not _SKIP:
                    yield done, output

    def _apply_triple(self, triple: tuple[int, int, Any], epoch: int) -> tuple[int, Any]:
        done, index, sample = triple
        return done, self._apply_or_skip(sample, index, epoch)

    def _shuffled(self, window: range, epoch: int, skip: int) -> Iterator[tuple[int, Any]]:
        # the order the reader affords (row groups walked, a true permutation, or a buffer),
        # keyed by (seed, epoch, shard)
        return shuffled_shard(self.reader, window.start, window.stop, epoch=epoch, skip=skip,
                              seed=shard_seed(self._shuffle_seed, window.start),
                              buf_size=self.buffer_samples, chunk_size=self.chunk_size, copy=self.copy)

    def __repr__(self) -> str:
        options = [f"batch_size={self.batch_size}"] if self.batch_size is not None else []
        layout = dataclasses.replace(self.layout, rank=self.rank, world_size=self.world_size)
        return f"IterableDataset({self.reader!r}, {', '.join(options + [f'layout={layout!r}'])})"


class _Pass:
    """One pass of an :class:`IterableDataset` in one process (a DataLoader worker, or the
    main process without workers): the iterator that ``iter(dataset)`` returns. At each item it
    hands out it knows where it stands, so that torchdata's ``StatefulDataLoader``, which asks
    the dataset's iterator for its state with each batch, resumes it exactly.

    :meth:`state_dict` names the dataset's length and layout (ranks, workers, shuffle, elastic,
    even, batch size), the worker, the shuffle seed, the epoch, the share of the epoch the pass
    reads (a shard, or where an elastic pass began) and ``done``, the positions of that share
    passed: read and handed out, or skipped by ``on_error``. :meth:`load_state_dict`, before the
    first item of a pass of a dataset built the same way on the same grid, carries on from
    there without reading what it skips (a shuffle over a reader without ``get`` reads it), in
    the state's epoch (the next pass of that worker reads the epoch after it), with the state's
    shuffle seed. Anything else is refused with a ``TypeError`` or ``ValueError`` that names it.

    >>> from fpipe.dataset import ListReader
    >>> data = IterableDataset(ListReader([{"x": i} for i in range(6)]))
    >>> first = iter(data)
    >>> [next(first)["x"] for _ in range(2)]
    [0, 1]
    >>> again = iter(IterableDataset(ListReader([{"x": i} for i in range(6)])))
    >>> again.load_state_dict(first.state_dict())
    >>> [s["x"] for s in again]
    [2, 3, 4, 5]
    """

    def __init__(self, data: IterableDataset, worker: int, workers: int, *, begin: bool = True) -> None:
        self._data, self._worker, self._workers = data, worker, workers
        clock = data._clock
        self._epoch, resume = clock.begin(worker, workers) if begin else clock.peek(worker)
        self._items: Iterator | None = None
        self._start, self._window, self._done, self._replay = 0, None, 0, None
        if data.elastic:
            self._start = 0 if resume is None else resume.position
        else:
            shard = data._shard(self._epoch, resume, worker, workers)
            self._window, self._done = shard.window, shard.skip
            if shard.made and data._may_skip():
                self._replay, self._done = (shard, resume), None
        self._handed = data.elastic and begin
        if begin:
            if data._pending is not None:
                pending, data._pending = data._pending, None
                self.load_state_dict(pending)
            data._latest = weakref.ref(self)
            info = get_worker_info()
            if info is not None and info.dataset is not data:
                clock.wrapped()

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> Any:
        items = self._items
        if items is None:
            items = self._items = self._outputs()
        try:
            self._done, output = next(items)
        except StopIteration:
            self._done, self._replay = self._length(), None
            raise
        if self._handed:
            self._data._clock.handed(self._worker)
        return output

    def _outputs(self) -> Iterator[tuple[int, Any]]:
        data = self._data
        if data.elastic:
            return data._elastic_pass(self._start, self._worker, self._workers, self._epoch,
                                      self._done)
        if self._replay is not None:
            return data._replayed(*self._replay[:1], self._epoch, self._replay[1])
        return data._stream(self._window, self._epoch, self._done)

    def _length(self) -> int:
        """The positions of this pass's share of the epoch."""
        if self._window is not None:
            return len(self._window)
        return sum(map(len, self._data._elastic_batches(self._start, self._worker, self._workers)))

    def _settings(self) -> dict[str, Any]:
        data = self._data
        return {"length": len(data.reader), "rank": data.rank, "world_size": data.world_size,
                "workers": self._workers, "shuffle": data.shuffle, "elastic": data.elastic,
                # "buf_size": the key of the states saved before it was named buffer_samples
                "even": data.even, "batch_size": data.batch_size, "buf_size": data.buffer_samples,
                "chunk_size": data.chunk_size}

    def state_dict(self) -> dict[str, Any]:
        """Where this pass stands after the items it has handed out (see the class)."""
        if self._done is None:
            raise ValueError("this pass carries on a resume() whose samples may fail "
                             "(on_error): its place is known once it has handed out an item")
        window = None if self._window is None else [self._window.start, self._window.stop]
        return {**state_header(_PASS_STATE), **self._settings(), "worker": self._worker,
                "seed": self._data._shuffle_seed if self._data.shuffle else None,
                "epoch": self._epoch, "start": self._start, "window": window, "done": self._done}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Carry on from ``state`` (see the class), before the first item."""
        self.state_loader(state)()

    def state_loader(self, state: Any, name: str = "state") -> Callable[[], None]:
        """Check ``state`` whole, changing nothing, and return what loads it."""
        if self._items is not None:
            raise ValueError("load_state_dict() must come before the first item of a pass; "
                             "take a new iterator (iter(dataset)) and load the state into it")
        try:
            check_state(state, _PASS_STATE, ("worker", "seed", "epoch", "start", "window", "done"),
                        self._settings(), name=name)
        except ValueError as error:
            raise ValueError(f"{error}: a pass resumes on the same dataset and grid of ranks "
                             "and DataLoader workers; an elastic run moves to another grid with "
                             "fpipe.torch.regrid_state") from None
        if state["worker"] != self._worker:
            raise ValueError(f"{name} is of DataLoader worker {state['worker']!r:.20}; this pass "
                             f"is worker {self._worker}'s")
        data = self._data
        epoch = check_integer(f"{name}['epoch']", state["epoch"], 0)
        start = check_integer(f"{name}['start']", state["start"], 0)
        done = check_integer(f"{name}['done']", state["done"], 0)
        seed = None if not data.shuffle else check_integer(f"{name}['seed']", state["seed"], 0)
        window = self._checked_window(state["window"], epoch, f"{name}['window']")
        n = len(data.reader)
        if data.elastic and start > n:
            raise ValueError(f"{name}['start'] must be at most the length {n}; got {start}")
        length = len(window) if window is not None else sum(
            map(len, data._elastic_batches(start, self._worker, self._workers)))
        if done > length:
            raise ValueError(f"{name}['done'] must be at most the {length} positions of the "
                             f"pass's share; got {done}")

        def load() -> None:
            if seed is not None:
                data._shuffle_seed = seed
            self._epoch, self._start, self._window, self._done = epoch, start, window, done
            self._replay = None
            data._clock.adopt(self._worker, epoch, start)
        return load

    def _checked_window(self, window: Any, epoch: int, name: str) -> range | None:
        data = self._data
        if data.elastic:
            if window is not None:
                raise ValueError(f"{name} must be None for an elastic pass; got {window!r:.40}")
            return None
        if not (isinstance(window, list) and len(window) == 2 and all(type(i) is int for i in window)):
            raise TypeError(f"{name} must be [start, stop]; got {window!r:.40}")
        shards = [data._window(epoch, w, self._workers) for w in range(self._workers)]
        if range(*window) not in shards:
            raise ValueError(f"{name} = {window} is no shard of epoch {epoch} on this grid: "
                             f"{[[w.start, w.stop] for w in shards]}")
        return range(*window)


def regrid_state(states: Any) -> dict[str, Any]:
    """The elastic state of an epoch from the states of every rank of a run: for
    :meth:`IterableDataset.load_state_dict` on another grid of ranks and DataLoader workers.

    ``states`` holds, for every rank, what its loader or dataset saved: the ``state_dict()``
    of a torchdata ``StatefulDataLoader`` over an ``IterableDataset(..., layout=Elastic())`` (or
    over a dataset of yours that reads one), or the pass states of its workers, gathered (for
    instance with ``torch.distributed.all_gather_object``) at the same step. The positions the
    passes have handed out must make one run of the epoch's order from where they began: that
    run's end is where the new grid carries on. Items that the pipelines hold (a packer's open
    rows, a partial batch, items read ahead) would be lost or repeated on another grid, so a
    state with any is refused with a ``ValueError`` that says where they are: resume those on
    the same grid with ``StatefulDataLoader.load_state_dict``.

    >>> from fpipe.dataset import ListReader
    >>> reader = ListReader([{"x": i} for i in range(10)])
    >>> ranks = [IterableDataset(reader, batch_size=2, layout=Elastic(rank=r, world_size=2))
    ...          for r in range(2)]
    >>> passes = [iter(rank) for rank in ranks]
    >>> [[next(p)["x"] for _ in range(2)] for p in passes]       # one step of each rank
    [[0, 1], [2, 3]]
    >>> regrid_state([p.state_dict() for p in passes])
    {'type': 'ElasticEpoch', 'version': 1, 'length': 10, 'epoch': 0, 'position': 4}
    """
    passes: list = []
    held: list[str] = []
    _collect_states(states, "states", passes, held)
    if not passes:
        raise ValueError("states hold no pass of an fpipe IterableDataset: give the "
                         "state_dict() of each rank's StatefulDataLoader (or of its passes)")
    if held:
        raise ValueError(f"the pipelines hold items that another grid cannot take over: "
                         f"{'; '.join(held[:3])}{' ...' if len(held) > 3 else ''}; resume on the "
                         "same grid (StatefulDataLoader.load_state_dict), or save at the end of "
                         "an epoch")
    first = passes[0]
    for key in ("length", "epoch", "start", "batch_size", "world_size", "workers", "even"):
        differ = {state[key] for state in passes}
        if len(differ) > 1:
            raise ValueError(f"the passes are of different {key}s: {sorted(differ, key=repr)}; "
                             "give the states of one run, taken at the same step")
    if not first["elastic"]:
        raise ValueError("the passes are not elastic: only IterableDataset(..., layout=Elastic()) "
                         "deals the epoch out in one order that another grid can carry on")
    n, start = first["length"], first["start"]
    runs = sorted((run for state in passes for run in _handed_runs(state)), key=lambda r: r.start)
    position = start
    for run in runs:
        if run.start > position:
            raise ValueError(f"the passes handed out positions up to {run.start} of the epoch's "
                             f"order but not those from {position}: they were saved at different "
                             "steps (save every rank's state at the same step)")
        position = max(position, run.stop)
    grid = {(state["rank"], state["worker"]) for state in passes}
    if len(grid) != first["world_size"] * first["workers"]:
        raise ValueError(f"states hold the passes of {len(grid)} workers, but the run had "
                         f"{first['world_size']} ranks of {first['workers']}: give them all")
    return elastic_state_dict(first["epoch"], min(position, n), n)


def _handed_runs(state: Mapping[str, Any]) -> list[range]:
    """The runs of the epoch's order that a pass state has handed out (or skipped)."""
    batches = elastic_batches(state["length"], state["start"], state["batch_size"], state["rank"],
                              state["world_size"], state["worker"], state["workers"], state["even"])
    runs, left = [], state["done"]
    for batch in batches:
        if left <= 0:
            break
        runs.append(range(batch.start, batch.start + min(left, len(batch))))
        left -= len(batch)
    return runs


def _collect_states(value: Any, where: str, passes: list, held: list) -> None:
    """Find the pass states in ``value`` (a loader's state, nested), and say where items are
    held by fpipe streams along the way."""
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind == _PASS_STATE:
            passes.append(value)
            return
        if kind in ("Mix", "Sample"):
            held.append(f"a {kind.lower()} at {where} draws from sources of its own")
            return
        if kind == "Stream":
            holds = _held_by(value)
            if holds:
                held.append(f"{value.get('stream')} holds {holds} at {where}")
        for key, inner in value.items():
            _collect_states(inner, f"{where}[{key!r}]", passes, held)
    elif isinstance(value, (list, tuple)):
        for k, inner in enumerate(value):
            _collect_states(inner, f"{where}[{k}]", passes, held)


def _held_by(state: Mapping[str, Any]) -> int:
    """How many items (or open groups) one stream's state holds."""
    own = state.get("own")
    count = len(state.get("held") or ())
    if isinstance(own, Mapping):
        for key in ("next", "rest", "open", "ready"):
            count += len(own.get(key) or ())
        if own.get("iterator", 0) is None and own.get("taken"):
            count += own["taken"]  # a source of yours, counted: another grid cannot share it out
    return count
