"""The options of the torch adapters, as values: where each rank's samples come from and in
which order (:class:`Shards` or :class:`Elastic`, the ``layout=`` of :class:`IterableDataset`),
and how each sample is made (:class:`Samples`, the ``samples=`` of both datasets).

Why values and not keywords: ``IterableDataset`` had 18 parameters, the eight of datadings and
ten of fpipe's in modes that exclude each other (``elastic=True`` with ``shuffle=True``, say,
was a ``ValueError`` at run time). The eight stay as datadings has them, positional, so ported
code runs unchanged; that leaves room for two more under the bound of ten, so fpipe's ten are
two frozen dataclasses, as Grain's ``ShardOptions`` and ``ReadOptions`` are, grouped by what
they decide:

* the **layout**, which positions each rank and DataLoader worker reads and in which order, one
  class per mode: :class:`Shards` (datadings's, a contiguous shard per worker, shuffled or not)
  or :class:`Elastic` (one order for the epoch, dealt out in global batches, so a run can carry
  on on another grid). A mode that cannot shuffle has no field for it, so the exclusion is a
  ``TypeError`` when the value is made, not a check at run time. ``rank`` and ``world_size``
  are in both, as the grid is part of the layout (datadings's ``group`` stays where it was);
* the **samples**, how each sample is made once it is read: the seed of its random draws, the
  threads that make it, and what a sample that fails does. Both datasets take it, so the seed
  of ``Dataset`` and ``IterableDataset`` is given the same way. The seed also keys the
  shuffle, as it did: one seed reproduces a run.

The vocabulary is the library's: a buffer names its unit (``buffer_samples``, where datadings's
``QuasiShuffler`` keeps its own ``buf_size``); counts of workers are ``n_...``, and since the
torch adapters' workers are the DataLoader's processes (``num_workers``, torch's name), the
threads in each are ``n_threads``. Each value checks its fields when it is made, with messages
that name the field, so a bad option is refused before a dataset exists; one value can serve
many datasets (the ranks of a test, the train and validation sets). A keyword of the old API
(``IterableDataset(reader, elastic=True)``) is a ``TypeError`` that says what replaced it.
Private: :mod:`fpipe.torch` exports the three classes.

>>> Shards(rank=1, world_size=2, shuffle=True)
Shards(rank=1, world_size=2, shuffle=True)
>>> Samples(seed=0, on_error="skip", max_errors=10).max_errors
10
>>> Elastic(shuffle=True)
Traceback (most recent call last):
...
TypeError: Elastic got an unexpected keyword argument 'shuffle': an elastic epoch has one order; \
shuffle it with an ordering (IterableDataset(IndexShuffler(reader, seed=...), layout=Elastic()))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

import numpy as np

from fpipe.errors import check_auto, check_bool, check_fraction_or_count, check_integer
from fpipe.random import Seed, seed_entropy
from fpipe.sharding import check_even
from fpipe.skipping import OnError, check_max_errors, check_on_error

__all__ = ["Elastic", "Samples", "Shards", "as_layout", "as_samples", "check_ranks",
           "removed_keywords"]


def check_ranks(rank: Any, world_size: Any) -> None:
    """``rank`` of ``world_size``, given together, or both None (then the dataset asks
    ``torch.distributed``); otherwise a ``ValueError`` or ``TypeError`` that names them."""
    if rank is None and world_size is None:
        return  # from torch.distributed (the dataset's group) when it is initialised, else 0 of 1
    if rank is None or world_size is None:
        raise ValueError(f"pass rank and world_size together; got rank={rank!r}, world_size={world_size!r}")
    world_size = check_integer("world_size", world_size, 1)
    if not 0 <= check_integer("rank", rank) < world_size:
        raise ValueError(f"rank must be in [0, world_size); got rank={rank}, world_size={world_size}")


def _short_repr(self: Any) -> str:
    """The class and the fields that differ from their defaults, as a call that makes it."""
    given = [f"{field.name}={getattr(self, field.name)!r}" for field in dataclasses.fields(self)
             if getattr(self, field.name) != field.default]
    return f"{type(self).__name__}({', '.join(given)})"


@dataclasses.dataclass(frozen=True, repr=False)
class Shards:
    """The layout of datadings: each of the ``world_size * num_workers`` workers reads one
    contiguous shard of the reader, and the ranks rotate through the shards from epoch to epoch
    (:func:`~fpipe.sharding.worker_range` gives the exact layout).

    ``rank`` and ``world_size`` (given together) are this process's place among the ranks; None
    takes them from ``torch.distributed`` (the dataset's ``group``) when it is initialised, and
    is rank 0 of 1 when it is not. ``even="drop"`` or ``"pad"`` gives every rank the same number
    of samples, in the same pieces, so that all make the same number of batches.

    ``shuffle=True`` shuffles each shard anew every epoch, keyed by the dataset's seed, the
    epoch and the shard (see :class:`~fpipe.torch.IterableDataset`); ``buffer_samples`` is how
    many samples a shuffle that cannot reach every sample at once mixes (blocks of Parquet or
    Arrow, an ordering without ``get``): a whole number, or a fraction in (0, 1) of the shard's
    samples (datadings's ``QuasiShuffler`` calls it ``buf_size``).

    >>> Shards(rank=0, world_size=2, even="drop")
    Shards(rank=0, world_size=2, even='drop')
    >>> Shards(buffer_samples=1.5)
    Traceback (most recent call last):
    ...
    ValueError: buffer_samples must be a fraction in (0, 1) or a whole number >= 1; got buffer_samples=1.5
    """

    rank: int | None = None
    world_size: int | None = None
    even: str | None = None
    shuffle: bool = False
    buffer_samples: float = 0.01

    def __post_init__(self) -> None:
        check_ranks(self.rank, self.world_size)
        check_even(self.even)
        check_bool("shuffle", self.shuffle)
        check_fraction_or_count("buffer_samples", self.buffer_samples)

    __repr__ = _short_repr


@dataclasses.dataclass(frozen=True, init=False, repr=False)
class Elastic:
    """The elastic layout: one order for the epoch (the reader's positions), dealt out in
    global batches of ``world_size * batch_size`` (:func:`fpipe.sharding.elastic_batches`),
    rank ``r`` taking the ``r``-th ``batch_size`` of each and its DataLoader workers taking its
    batches in turn. Step ``t`` takes the same samples on every grid, so a run saved with
    :meth:`~fpipe.torch.IterableDataset.state_dict` carries on with any number of ranks and
    workers and any batch size. The dataset needs ``batch_size`` (the DataLoader's), and its
    samples must not be skipped (``Samples(on_error="raise")``, the default).

    ``rank``, ``world_size`` and ``even`` are those of :class:`Shards`. There is no shuffle: a
    shuffle of each worker's shard has no one order; shuffle with an ordering
    (:class:`~fpipe.orderings.permutation.IndexShuffler`) instead.

    >>> Elastic(rank=1, world_size=4)
    Elastic(rank=1, world_size=4)
    """

    rank: int | None = None
    world_size: int | None = None
    even: str | None = None

    def __init__(self, rank: int | None = None, world_size: int | None = None,
                 even: str | None = None, **unknown: Any) -> None:
        if unknown:
            name = next(iter(unknown))
            hint = (": an elastic epoch has one order; shuffle it with an ordering "
                    "(IterableDataset(IndexShuffler(reader, seed=...), layout=Elastic()))"
                    if name in ("shuffle", "buffer_samples") else "")
            raise TypeError(f"Elastic got an unexpected keyword argument {name!r}{hint}")
        object.__setattr__(self, "rank", rank)
        object.__setattr__(self, "world_size", world_size)
        object.__setattr__(self, "even", even)
        check_ranks(rank, world_size)
        check_even(even)

    __repr__ = _short_repr


Layout = Union[Shards, Elastic]
_DRAWN_FROM = (type(None), np.random.Generator, np.random.RandomState, np.random.SeedSequence)


@dataclasses.dataclass(frozen=True, repr=False)
class Samples:
    """How the torch adapters make each sample from what the reader gives.

    ``seed`` makes ``rng`` and the transforms reproducible per sample: the item generator of
    ``(seed, epoch, index)`` is active while they run, so whatever draws from
    :func:`fpipe.current_rng` gives the same sample whichever worker or rank reads it. It also
    keys ``Shards(shuffle=True)``; None draws fresh entropy when the dataset is made.

    ``n_threads`` (:class:`~fpipe.torch.IterableDataset` only) runs ``rng`` and the transforms
    of each process's pass in that many threads (:func:`fpipe.threads`, ordered), or
    ``"auto"``: as many as keep up with the DataLoader. The torch adapters' *workers* are the
    DataLoader's processes (``num_workers``); these are threads in each of them.

    ``on_error="skip"`` (or a callable ``on_error(error, sample, index)``, see
    :mod:`fpipe.skipping`) leaves out the samples whose transforms raise or that do not read,
    and ``max_errors`` raises :class:`~fpipe.skipping.TooManyErrors` once more than that were
    skipped (see :class:`~fpipe.torch.DatasetBase`).

    >>> Samples(seed=0, n_threads="auto")
    Samples(seed=0, n_threads='auto')
    >>> Samples(n_threads=0)
    Traceback (most recent call last):
    ...
    ValueError: n_threads must be >= 1; got n_threads=0
    """

    seed: Seed = None
    n_threads: int | str | None = None
    on_error: OnError = "raise"
    max_errors: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seed, _DRAWN_FROM):  # a generator is drawn from by the dataset
            seed_entropy(self.seed)  # a seed fpipe cannot use raises here, naming it
        if self.n_threads is not None:
            check_auto("n_threads", self.n_threads, lambda value: check_integer("n_threads", value, 1))
        check_on_error(self.on_error)
        check_max_errors(self.max_errors)

    __repr__ = _short_repr


# fpipe's keywords of the torch adapters before the options were values: what replaces each
_REPLACED = {
    "seed": "samples=Samples(seed=...)",
    "on_error": "samples=Samples(on_error=...)",
    "max_errors": "samples=Samples(max_errors=...)",
    "threads": "samples=Samples(n_threads=...)",
    "shuffle": "layout=Shards(shuffle=True)",
    "buf_size": "layout=Shards(shuffle=True, buffer_samples=...)",
    "even": "layout=Shards(even=...) (or Elastic(even=...))",
    "rank": "layout=Shards(rank=..., world_size=...) (or Elastic(...))",
    "world_size": "layout=Shards(rank=..., world_size=...) (or Elastic(...))",
    "elastic": "layout=Elastic(...)",
}


def removed_keywords(owner: str, keywords: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """Refuse ``keywords``, the ones ``owner`` did not name: a ``TypeError`` that says what
    replaces a keyword of the old API, or names a misspelled one. ``allowed``: the options of
    ``owner`` (a hint to spell them).

    >>> removed_keywords("IterableDataset", {"elastic": True}, ("layout", "samples"))
    Traceback (most recent call last):
    ...
    TypeError: IterableDataset got an unexpected keyword argument 'elastic': it became layout=Elastic(...)
    """
    if not keywords:
        return
    name = next(iter(keywords))
    if name in _REPLACED:
        raise TypeError(f"{owner} got an unexpected keyword argument {name!r}: it became "
                        f"{_REPLACED[name]}")
    raise TypeError(f"{owner} got an unexpected keyword argument {name!r}; its options are "
                    f"{', '.join(allowed)}")


def as_layout(layout: Any) -> Layout:
    """``layout`` checked: a :class:`Shards` or an :class:`Elastic` (None: ``Shards()``)."""
    if layout is None:
        return Shards()
    if not isinstance(layout, (Shards, Elastic)):
        raise TypeError(f"layout must be Shards(...) or Elastic(...); got layout={layout!r:.80}")
    return layout


def as_samples(samples: Any) -> Samples:
    """``samples`` checked: a :class:`Samples` (None: ``Samples()``)."""
    if samples is None:
        return Samples()
    if not isinstance(samples, Samples):
        raise TypeError(f"samples must be Samples(...); got samples={samples!r:.80}")
    return samples
