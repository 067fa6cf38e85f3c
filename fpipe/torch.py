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
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

try:
    import torch
    import torch.distributed
    import torch.utils.data
except ImportError as error:  # pragma: no cover - torch is in the test extra
    raise ImportError("fpipe.torch needs PyTorch; install it with: pip install 'fpipe[torch]'") from error

import numpy as np

from .errors import check_bool, check_callable, check_integer
from .functional import Compose
from .image import CompressedToPIL, ImageDecodeError
from .random import Seed, item_rng, optional_entropy, seed_entropy, set_active
from .sharding import check_even, resume_plan, worker_range
from .storage.order import QuasiShuffler, Range
from .streaming._shm import register as share_type

__all__ = [
    "Compose",
    "CompressedToPIL",
    "Dataset",
    "DatasetBase",
    "IterableDataset",
    "dict2tuple",
    "no_rng",
    "worker_range",
]

# Pass counters kept in shared memory: one per DataLoader worker id below this bound.
_SLOTS = 1024
# where the clock's tensor keeps the pending-resume flags (one per worker id) and the resume
_PENDING, _RESUME = _SLOTS + 1, 2 * _SLOTS + 1


class _Resume(NamedTuple):
    batches: int
    batch_size: int
    drop_last: int


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


def no_rng(_: Any) -> dict:
    """The default ``rng``: no parameters, whatever the sample.

    >>> no_rng({"image": b"..."})
    {}
    """
    return {}


def dict2tuple(it: Iterable[Mapping], keys: tuple = ("image", "label")) -> Iterator[tuple]:
    """Yield ``tuple(sample[k] for k in keys)`` for each sample (or collated batch) of ``it``.

    >>> list(dict2tuple([{"image": 1, "label": 0, "key": "a"}]))
    [(1, 0)]
    """
    for sample in it:
        yield tuple(sample[k] for k in keys)


def _worker() -> tuple[int, int]:
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class _EpochClock:
    """The epoch of a dataset, shared with every copy of it in DataLoader workers.

    One shared-memory tensor holds the epoch last set, per worker id the number of passes
    begun since and whether a resumed pass is pending, and the resume (batches, batch size,
    drop_last). Forked workers inherit it and spawned ones receive it (torch shares tensors
    when it pickles a worker's arguments), so ``set_epoch`` and ``resume`` in the main process
    reach persistent workers too; a plain ``pickle`` copies it instead.
    """

    __slots__ = ("_counts", "_tensor")

    def __init__(self, epoch: int, tensor: torch.Tensor | None = None) -> None:
        if tensor is None:
            tensor = torch.zeros(_RESUME + 3, dtype=torch.int64)
            tensor[0] = epoch
            tensor.share_memory_()
        self._tensor, self._counts = tensor, tensor.numpy()

    def __reduce__(self):
        return _EpochClock, (0, self._tensor)

    def set(self, epoch: int) -> None:
        self._counts[1:_PENDING] = 0
        self._counts[0] = epoch

    @property
    def base(self) -> int:
        return int(self._counts[0])

    def resume(self, batches: int, batch_size: int, drop_last: bool) -> None:
        """Make the next pass of every worker id a resumed one."""
        self._counts[_RESUME:] = batches, batch_size, drop_last
        self._counts[_PENDING:_RESUME] = 1

    def peek(self, slot: int) -> tuple[int, _Resume | None]:
        """The epoch of the next pass of worker ``slot``, and its resume if it has one."""
        if slot >= _SLOTS:
            raise RuntimeError(f"fpipe datasets support at most {_SLOTS} DataLoader workers; "
                               f"got worker id {slot}")
        counts = self._counts
        resume = _Resume(*counts[_RESUME:].tolist()) if counts[_PENDING + slot] else None
        return int(counts[0] + counts[slot + 1]), resume

    def begin(self, slot: int, workers: int) -> tuple[int, _Resume | None]:
        """Begin a pass of worker ``slot`` of ``workers``: its epoch and resume. Worker ids
        from ``workers`` on take no part in it, so their pending resumes go."""
        epoch, resume = self.peek(slot)
        self._counts[slot + 1] += 1
        self._counts[_PENDING + slot] = 0
        self._counts[_PENDING + workers:_RESUME] = 0
        return epoch, resume


def _describe(index: int, sample: Any, field: Any) -> str:
    where = f"sample {index}"
    if isinstance(sample, Mapping) and "key" in sample:
        where += f" (key {sample['key']!r})"
    return where if field is None else f"{where}, field {field!r}"


def _naming_sample(error: Exception, index: int, sample: Any, field: Any) -> Exception:
    """``error`` with the sample named: in the message of an image error, as a note otherwise."""
    where = _describe(index, sample, field)
    if isinstance(error, ImageDecodeError) and error.sample is None:
        return ImageDecodeError(error.reason, sample=where).with_traceback(error.__traceback__)
    if hasattr(error, "add_note"):
        error.add_note(f"raised while transforming {where}")
    return error


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
                 epoch: int = 0) -> None:
        if not hasattr(reader, "__len__"):
            raise TypeError(f"reader must be a reader or an ordering (with len); got reader={reader!r:.80}")
        if rng is not None:
            check_callable("rng", rng)
        self.reader = reader
        self.transforms = transforms
        self.rng = rng or no_rng
        self.seed = optional_entropy(seed)
        self._transform = self._checked_transform(transforms)
        self._clock = _EpochClock(check_integer("epoch", epoch, 0))

    def _checked_transform(self, transforms: Any) -> Callable | None:
        if transforms is None:
            return None
        if isinstance(transforms, Mapping):
            for field, transform in transforms.items():
                check_callable(f"transforms[{field!r}]", transform)
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
            located = _naming_sample(error, index, sample, field)
            if located is error:
                raise
            raise located from error.__cause__

    def _transform_sample(self, sample: Any, index: int) -> Any:
        key = sample.get("key") if isinstance(sample, Mapping) else None
        try:
            return self.transforms(sample)
        except Exception as error:
            located = _naming_sample(error, index, None if key is None else {"key": key}, None)
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
                 epoch: int = 0) -> None:
        if not callable(getattr(reader, "get", None)):
            raise TypeError(f"Dataset needs random access (a reader with get); got reader={reader!r:.80}; "
                            "iterate orderings without it (QuasiShuffler, Cycler) with IterableDataset")
        super().__init__(reader, transforms, rng, seed=seed, epoch=epoch)

    def __getitem__(self, index: int) -> Any:
        epoch = self._clock.base
        self._follow(epoch)
        sample = self.reader.get(index)
        return self._apply(sample, self._position(index), epoch)

    def __getitems__(self, indices: list[int]) -> list:
        """Samples ``indices``, read at once (``get_many`` where the reader has it)."""
        epoch = self._clock.base
        self._follow(epoch)
        samples = self._read_batch(indices)
        if self._transform is None:
            return samples
        return [self._apply(s, self._position(i), epoch) for s, i in zip(samples, indices)]

    def _read_batch(self, indices: list[int]) -> list:
        # A sequential sampler's batch is one run: one contiguous read. Shuffled batches are
        # read sample by sample, which beats sorting them into runs that are nearly all 1 long.
        reader = self.reader
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


class _Indexed:
    """A reader whose samples are ``(position, sample)``, so a shuffled shard still knows
    where each sample came from (for its random generator and its error messages)."""

    __slots__ = ("reader",)

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def iter(self, start: int | None = None, stop: int | None = None, yield_key: bool = False,
             raw: bool = False, copy: bool = True, chunk_size: int = 16) -> Iterator[tuple[int, Any]]:
        window = range(len(self.reader))[start:stop]
        samples = self.reader.iter(window.start, window.stop, copy=copy, chunk_size=chunk_size)
        return zip(window, samples)

    def get(self, index: int, yield_key: bool = False, raw: bool = False,
            copy: bool = True) -> tuple[int, Any]:
        return index, self.reader.get(index)


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


def _check_buffer(buf_size: Any) -> float:
    number = (int, float, np.integer, np.floating)
    if isinstance(buf_size, (bool, np.bool_)) or not isinstance(buf_size, number):
        raise TypeError(f"buf_size must be a number; got buf_size={buf_size!r}")
    if not (0 < buf_size < 1 or (buf_size >= 1 and float(buf_size).is_integer())):
        raise ValueError("buf_size must be a fraction in (0, 1) or a whole number of samples >= 1; "
                         f"got buf_size={buf_size!r}")
    return buf_size


def _shard_seed(seed: int, start: int) -> int:
    # a 3-number spawn key, so no shard's seed is ever an item generator's (2 numbers)
    return seed_entropy(np.random.SeedSequence(seed, spawn_key=(start, 0, 1)))


class IterableDataset(DatasetBase, torch.utils.data.IterableDataset):
    """An iterable dataset that shards ``reader`` over distributed ranks and DataLoader workers.

    Each of the ``world_size * num_workers`` workers reads one contiguous shard, in chunks of
    ``chunk_size`` samples (``copy`` goes to the reader), as datadings does; ranks rotate
    through the shards from epoch to epoch (:func:`worker_range` gives the exact layout).
    ``reader`` may be a reader or an ordering (:class:`~fpipe.storage.order.Shuffler`,
    :class:`~fpipe.storage.order.QuasiShuffler`, ...), which is read at the dataset's epoch.
    ``rank`` and ``world_size`` come from ``torch.distributed`` (process ``group``) when it
    is initialised at construction, or are given.

    Epochs: a pass reads the epoch last given to :meth:`~DatasetBase.set_epoch` (or
    ``epoch=``) plus the number of passes begun since, counted per worker in shared memory.
    So calling ``set_epoch(e)`` before each epoch reads epoch ``e``, and not calling it
    advances one epoch per pass — with persistent DataLoader workers or without.

    ``batch_size`` (the DataLoader's) turns on datadings's guard: a ``RuntimeError`` when
    ``0 < len(shard) % batch_size < 1``, that is when workers may make different numbers
    of batches. ``even="drop"`` or ``"pad"`` removes the problem instead: every rank reads
    the same number of samples in the same pieces, so all make the same number of batches
    and ``DistributedDataParallel`` never waits for a rank that has run out.

    ``shuffle=True`` shuffles each shard QuasiShuffler-style (chunks of ``chunk_size`` in a
    random order through a buffer of ``buf_size``, a fraction of the shard or a number of
    samples), differently every epoch, from ``seed``. ``len()`` is what the calling process
    yields in its next pass: the rank's samples in the main process, the worker's in a worker.
    :meth:`resume` starts the next pass in the middle of an epoch, after the batches that a
    DataLoader has already made.

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
                 seed: Seed = None, rank: int | None = None, world_size: int | None = None) -> None:
        if not callable(getattr(reader, "iter", None)):
            raise TypeError(f"reader must be a reader or an ordering (with iter); got reader={reader!r:.80}")
        super().__init__(reader, transforms, rng, seed=seed, epoch=epoch)
        self.batch_size = None if batch_size is None else check_integer("batch_size", batch_size, 1)
        self.copy = bool(copy)
        self.chunk_size = check_integer("chunk_size", chunk_size, 1)
        self.even, self.shuffle, self.buf_size = check_even(even), bool(shuffle), _check_buffer(buf_size)
        # the shuffle needs a seed even when the transforms draw fresh entropy
        self._shuffle_seed = seed_entropy(seed) if self.seed is None else self.seed
        self.rank, self.world_size = _distributed(group, rank, world_size)

    def __len__(self) -> int:
        worker, workers = _worker()
        epoch, resume = self._clock.peek(worker)
        window, skip = self._shard(epoch, resume, worker, workers, guard=False)
        return len(window) - skip

    def __iter__(self) -> Iterator[Any]:
        worker, workers = _worker()
        epoch, resume = self._clock.begin(worker, workers)
        window, skip = self._shard(epoch, resume, worker, workers, guard=True)
        return self._stream(window, epoch, skip)

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
        without ``get``: that shard's shuffle needs them to fill its buffer.

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
        self._clock.resume(batches, batch_size, check_bool("drop_last", drop_last))

    def _shard(self, epoch: int, resume: _Resume | None, worker: int, workers: int,
               guard: bool) -> tuple[range, int]:
        """The positions that worker ``worker`` reads in a pass, and how many it skips.

        A DataLoader begins every pass with worker 0, so in a resumed pass the workers trade
        shards in turn: worker 0 takes the shard whose batch comes next, and the others
        follow in the original order."""
        if resume is None:
            return self._window(epoch, worker, workers, guard), 0
        batches, size, drop_last = resume
        lengths = [len(self._window(epoch, w, workers, guard)) for w in range(workers)]
        counts = [n // size if drop_last else -(-n // size) for n in lengths]
        made, first = resume_plan(counts, batches)
        shard = (first + worker) % workers
        return self._window(epoch, shard, workers, False), min(lengths[shard], size * made[shard])

    def _window(self, epoch: int, worker: int, workers: int, guard: bool) -> range:
        n = len(self.reader)
        if guard and self.batch_size is not None and self.even is None:
            overhang = n / (self.world_size * workers) % self.batch_size
            if 0 < overhang < 1:
                raise RuntimeError(
                    f"len(shard) % batch_size = {overhang}: with {n} samples in "
                    f"{self.world_size * workers} shards and batch_size={self.batch_size}, workers "
                    "make different numbers of batches; change num_workers, batch_size or "
                    "world_size, or pass even='drop' or even='pad'")
        return worker_range(n, self.rank, self.world_size, worker, workers, epoch, self.even)

    def _stream(self, window: range, epoch: int, skip: int) -> Iterator[Any]:
        if skip >= len(window):
            return
        self._follow(epoch)
        if self.shuffle:
            pairs = self._shuffled(window, epoch, skip)
        else:
            window = window[skip:]
            samples = self.reader.iter(window.start, window.stop, copy=self.copy,
                                       chunk_size=self.chunk_size)
            if self._transform is None:
                yield from samples
                return
            pairs = zip(window, samples)
        if self._transform is None:
            for _, sample in pairs:
                yield sample
            return
        apply = self._apply
        for index, sample in pairs:
            yield apply(sample, index, epoch)

    def _shuffled(self, window: range, epoch: int, skip: int) -> Iterator[tuple[int, Any]]:
        shard = Range(_Indexed(self.reader), window.start, window.stop)
        shuffler = QuasiShuffler(shard, buf_size=self.buf_size, chunk_size=self.chunk_size,
                                 seed=_shard_seed(self._shuffle_seed, window.start))
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
