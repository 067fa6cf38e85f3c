"""Shared Hypothesis strategies for the laws in property_tests/ (strategies only, no tests).

Each area keeps its strategies in its own section below.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

# --- functional core -------------------------------------------------------------------
# Module-level functions, so that they pickle and can cross processes.


def inc(x: int) -> int:
    return x + 1


def double(x: int) -> int:
    return 2 * x


def negate(x: int) -> int:
    return -x


def halve(x: int) -> int:
    return x // 2


def shift(x: int, by: int) -> int:
    return x + by


def scale(x: int, factor: int = 3) -> int:
    return x * factor


def offset(x: int, *, delta: int) -> int:
    return x - delta


def pair_sum(x: int, y: int) -> int:
    return x + y


plain_funcs = st.sampled_from([inc, double, negate, halve, abs])
parametrized_funcs = st.sampled_from([shift, scale, offset])
composable_funcs = plain_funcs | parametrized_funcs
prefixes = st.sampled_from(["", "a_", "b_", "mask_"])
ints = st.integers(-10**6, 10**6)
seeds = st.integers(0, 2**63 - 1)
probabilities = st.floats(0, 1)
_routed_keys = [f"{outer}{inner}{name}" for outer in ["", "a_", "b_", "mask_"]
                for inner in ["", "a_", "b_", "mask_"] for name in ["by", "factor", "delta"]]
params = st.dictionaries(st.sampled_from(_routed_keys), st.integers(-100, 100))
int_tuples = st.lists(ints, min_size=1, max_size=6).map(tuple)


@st.composite
def tuples_with_index(draw: st.DrawFn) -> tuple[tuple, int]:
    """A non-empty tuple and a valid (possibly negative) index into it."""
    values = draw(int_tuples)
    return values, draw(st.integers(-len(values), len(values) - 1))


# --- orderings and sharding --------------------------------------------------------------
# Inputs are lists of distinct ints, so "every element exactly once" is checkable by sorting.

sized_inputs = st.integers(0, 60).map(lambda n: list(range(n)))
shard_counts = st.integers(1, 9)
evens = st.sampled_from(["drop", "pad"])
roundings = st.sampled_from(["balanced", "datadings"])
worker_epochs = st.integers(0, 7)
batch_counts = st.lists(st.integers(0, 12), min_size=1, max_size=6)  # per DataLoader worker


def round_robin(queues: list[list]) -> list:
    """What a DataLoader hands out: one item from each worker in turn, passing over the
    workers that have run out."""
    queues, order = [list(queue) for queue in queues], []
    while any(queues):
        order += [queue.pop(0) for queue in queues if queue]
    return order


class Tracked:
    """A sample that counts itself alive in its reader's ``live`` counter (for memory laws)."""

    __slots__ = ("counter", "index")

    def __init__(self, index: int, counter: list) -> None:
        self.index, self.counter = index, counter
        counter[0] += 1
        counter[1] = max(counter[1], counter[0])

    def __del__(self) -> None:
        self.counter[0] -= 1


class IndexReader:
    """A minimal in-memory reader whose sample ``i`` is ``i`` (or a :class:`Tracked` ``i``);
    it records every contiguous read (``iter`` or ``get_slice``) as ``(start, stop)`` and
    counts ``get`` calls."""

    def __init__(self, n: int, tracked: bool = False) -> None:
        self.n, self.tracked = n, tracked
        self.reads: list[tuple[int, int]] = []
        self.gets = 0
        self.live = [0, 0]  # alive now, most alive at once

    def __len__(self) -> int:
        return self.n

    def _sample(self, index: int, yield_key: bool):
        sample = Tracked(index, self.live) if self.tracked else index
        return (f"{index:08d}", sample) if yield_key else sample

    def get(self, index: int, yield_key: bool = False, raw: bool = False, copy: bool = True):
        if not 0 <= index < self.n:
            raise IndexError(index)
        self.gets += 1
        return self._sample(index, yield_key)

    def iter(self, start=None, stop=None, yield_key=False, raw=False, copy=True, chunk_size=16):
        window = range(self.n)[start:stop]
        self.reads.append((window.start, window.stop))
        return (self._sample(i, yield_key) for i in window)

    def get_slice(self, start, stop, yield_key=False, raw=False, copy=True):
        return list(self.iter(start, stop, yield_key, raw, copy))


class BlockIndexReader(IndexReader):
    """An :class:`IndexReader` that decodes blocks: its ``blocks`` are ``bounds``."""

    def __init__(self, n: int, bounds: list[int]) -> None:
        super().__init__(n)
        self.blocks = np.array(bounds, dtype=np.int64)


class SequentialIndexReader(IndexReader):
    """An :class:`IndexReader` without random access (no ``get``)."""

    get = None


@st.composite
def shuffle_readers(draw: st.DrawFn) -> IndexReader:
    """A reader of 0 to 80 samples of each kind that ``shuffled_shard`` tells apart: blocks
    (cut anywhere), random access, neither."""
    n, kind = draw(st.integers(0, 80)), draw(st.sampled_from(["blocks", "get", "sequential"]))
    if kind == "blocks":
        cuts = draw(st.lists(st.integers(1, max(1, n - 1)), max_size=12)) if n > 1 else []
        return BlockIndexReader(n, sorted({0, n, *cuts}))
    return IndexReader(n) if kind == "get" else SequentialIndexReader(n)


# An ordering spec is a list of layers, applied from the reader outwards; ``build`` makes it.
_layers = st.one_of(
    st.tuples(st.just("range"), st.integers(-5, 30), st.one_of(st.none(), st.integers(-5, 60))),
    st.tuples(st.just("shuffle")),
    st.tuples(st.just("index")),
    st.tuples(st.just("quasi"), st.one_of(st.integers(1, 40), st.floats(0.01, 0.99)),
              st.integers(1, 12)),
    st.tuples(st.just("repeat"), st.integers(0, 3)),
    st.tuples(st.just("cycle")),
)


def _allowed(spec: list) -> bool:
    # a Shuffler or IndexShuffler needs random access, which a QuasiShuffler inside it does
    # not offer
    kinds = [layer[0] for layer in spec]
    return "quasi" not in kinds or not {"shuffle", "index"} & set(kinds[kinds.index("quasi"):])


ordering_specs = st.lists(_layers, min_size=1, max_size=3).filter(_allowed)
ordering_lengths = st.integers(0, 70)


def build(spec: list, reader, seed=None):
    """The ordering that ``spec`` describes over ``reader``; seeded layers get ``seed``."""
    from fpipe.orderings.order import Cycler, QuasiShuffler, Range, Repeater, Shuffler
    from fpipe.orderings.permutation import IndexShuffler
    ordering = reader
    for kind, *args in spec:
        if kind == "range":
            ordering = Range(ordering, *args)
        elif kind == "shuffle":
            ordering = Shuffler(ordering, seed=seed)
        elif kind == "index":
            ordering = IndexShuffler(ordering, seed=seed)
        elif kind == "quasi":
            ordering = QuasiShuffler(ordering, buf_size=args[0], chunk_size=args[1], seed=seed)
        elif kind == "repeat":
            ordering = Repeater(ordering, args[0])
        else:
            ordering = Cycler(ordering)
    return ordering


# --- packed datasets (storage) -----------------------------------------------------------
# Everything a packed dataset stores: msgpack values plus numpy arrays and scalars. Tuples
# come back as lists; floats avoid NaN so that plain equality works outside arrays (arrays are
# compared by bytes).

from hypothesis.extra import numpy as hnp  # noqa: E402

array_dtypes = st.one_of(
    hnp.boolean_dtypes(), hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(),
    hnp.floating_dtypes(), hnp.complex_number_dtypes(), hnp.byte_string_dtypes(min_len=1),
    hnp.unicode_string_dtypes(min_len=1), hnp.datetime64_dtypes(), hnp.timedelta64_dtypes(),
)
# The dtypes msgpack-numpy can pack itself (no datetimes: they have no buffer protocol).
msgpack_numpy_dtypes = st.one_of(
    hnp.boolean_dtypes(), hnp.integer_dtypes(), hnp.unsigned_integer_dtypes(),
    hnp.floating_dtypes(), hnp.complex_number_dtypes(), hnp.byte_string_dtypes(min_len=1),
)


def numpy_arrays(dtypes: st.SearchStrategy = array_dtypes) -> st.SearchStrategy:
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
    return hnp.arrays(dtypes, shapes)


msgpack_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
    st.text(max_size=8), st.binary(max_size=16),
)


def msgpack_values(arrays: st.SearchStrategy | None = None) -> st.SearchStrategy:
    """Nested lists, tuples and maps (str and int keys) of scalars and numpy arrays."""
    leaves = msgpack_scalars | (numpy_arrays() if arrays is None else arrays)
    return st.recursive(leaves, lambda children: st.one_of(
        st.lists(children, max_size=3), st.tuples(children, children),
        st.dictionaries(st.text(max_size=4) | st.integers(-3, 3), children, max_size=3),
    ), max_leaves=8)


@st.composite
def dataset_samples(draw: st.DrawFn, max_size: int = 12) -> list[dict]:
    """Dict samples with unique str keys, ready for a FileWriter."""
    keys = draw(st.lists(st.text(max_size=6), unique=True, max_size=max_size))
    fields = st.dictionaries(st.text(max_size=5).filter(lambda name: name != "key"),
                             msgpack_values(), max_size=3)
    return [{"key": key, **draw(fields)} for key in keys]


# Any str, lone surrogates included (st.text leaves them out): keys to look up, which may be
# ones that no dataset can hold, since UTF-8 cannot encode a lone surrogate. (Drawn as a list
# of characters: st.text over the same two alphabets hardly ever drew a surrogate.)
any_text = st.lists(st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                    max_size=6).map("".join)


def as_decoded(value):
    """What reading back gives for ``value``: tuples become lists."""
    if isinstance(value, (list, tuple)):
        return [as_decoded(item) for item in value]
    if isinstance(value, dict):
        return {key: as_decoded(item) for key, item in value.items()}
    return value


# --- streaming stages --------------------------------------------------------------------
# Items are small ints; the transforms are module-level, so that they pickle to processes.

from fpipe import sample_args  # noqa: E402
from fpipe.random import uniform  # noqa: E402

stream_items = st.lists(st.integers(-1000, 1000), max_size=60)
batch_sizes = st.integers(1, 12)
chunk_sizes = st.integers(1, 9)
pull_sizes = st.lists(st.integers(1, 20), min_size=1, max_size=30)


def add_three(x: int) -> int:
    return x + 3


def is_even(x: int) -> bool:
    return x % 2 == 0


def with_noise(x: int, noise: float) -> tuple[int, float]:
    return x, noise


# draws from the item's own generator inside a seeded stage
noisy = sample_args(with_noise, noise=uniform(0.0, 1.0))


def fails_on_multiples_of_seven(x: int) -> int:
    """``add_three``, except that it raises on multiples of 7 (the bad samples of on_error laws)."""
    if x % 7 == 0:
        raise ValueError(f"bad item {x}")
    return x + 3

# one in-thread stage of a random chain: ("map", f) or ("filter", p)
item_stages = st.sampled_from([("map", add_three), ("map", abs), ("filter", is_even)])


@st.composite
def background_stages(draw: st.DrawFn) -> tuple:
    """("prefetch", n) or ("threads", n_workers, buffer_size, chunk_size), all ordered."""
    if draw(st.booleans()):
        return "prefetch", draw(st.integers(1, 8))
    return "threads", draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(chunk_sizes)


class Interrupted(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit (laws raise all three)."""


# what a source or a stage's function may raise: whatever it is, the items before it come first
error_kinds = st.sampled_from([ValueError, KeyboardInterrupt, SystemExit, Interrupted])
# the regrouping stages that one-to-one stages may sit between: none, or batch(k) then unbatch
regroupings = st.one_of(st.none(), st.integers(1, 9))


@st.composite
def same_rank_shapes(draw: st.DrawFn) -> list[tuple[int, ...]]:
    """1 to 5 array shapes with the same number of dimensions (0 to 3), sides 0 to 5."""
    ndim = draw(st.integers(0, 3))
    side = st.integers(0, 5)
    return draw(st.lists(st.tuples(*[side] * ndim), min_size=1, max_size=5))


positive_weights = st.lists(st.floats(0.05, 10), min_size=1, max_size=6)


# --- Infinite (dpipe's batch iterator) ---------------------------------------------------
# A transformer is described by a spec tuple and built fresh for each Infinite (a stage object
# keeps its own epoch count). Items are ints all the way through.

from fpipe import ExpirationPool, Iterator, Threads, processes, threads  # noqa: E402
from fpipe.random import integers  # noqa: E402
from fpipe.stream import filter as fp_filter  # noqa: E402
from fpipe.stream import map as fp_map  # noqa: E402


def plus(x: int, r: int) -> int:
    return 3 * x + r


# a seeded transform: r comes from the item's own generator inside a seeded stage
jiggle = sample_args(plus, r=integers(0, 1000))


def pair_sums(items):
    items = iter(items)
    return (a + b for a, b in zip(items, items))


def kept(x: int) -> bool:
    """Keeps about 3 in 4 items, pseudo-randomly: no chain of the transforms here turns a
    stream into one that this rejects whole (a parity test would starve after add_three)."""
    return hash((x, 7)) % 4 != 0


class BreakBefore:
    """A batch-size predicate: a batch ends before about one item in ``m`` (pseudo-randomly),
    and at 5 items."""

    def __init__(self, m: int) -> None:
        self.m = m

    def __call__(self, chunk: list, item: int) -> bool:
        return hash((item, 3)) % self.m != 0 and len(chunk) < 5


# deterministic without a seed: usable with any source
plain_transformers = st.one_of(
    st.just(("function",)),
    st.tuples(st.just("Threads"), st.integers(1, 3)),
    st.just(("filter",)),
    st.tuples(st.just("Iterator"), st.integers(1, 2)),
)

# seeded, in-process: a restored pipeline must continue exactly
seeded_transformers = st.one_of(
    plain_transformers,
    st.tuples(st.just("jiggle"), st.integers(0, 9)),
    st.tuples(st.just("threads"), st.integers(0, 9), st.integers(1, 3)),
    st.tuples(st.just("pool"), st.integers(1, 5), st.integers(1, 3), st.integers(0, 9)),
)

infinite_batch_sizes = st.one_of(st.integers(1, 6), st.integers(2, 4).map(BreakBefore))


def make_transformer(spec: tuple):
    """A fresh stage (or function) for a spec drawn from the strategies above."""
    kind, *args = spec
    if kind == "function":
        return add_three
    if kind == "Threads":
        return Threads(add_three, n_workers=args[0])
    if kind == "filter":
        return fp_filter(kept)
    if kind == "Iterator":
        return Iterator(pair_sums, n_workers=args[0])
    if kind == "jiggle":
        return fp_map(jiggle, seed=args[0])
    if kind == "threads":
        return threads(jiggle, seed=args[0], n_workers=args[1])
    if kind == "processes":
        return processes(jiggle, seed=args[0], n_workers=args[1])
    size, repetitions, seed = args
    return ExpirationPool(size, repetitions, seed=seed)


@st.composite
def epoch_plans(draw: st.DrawFn, batches_per_epoch: int, max_epochs: int = 5) -> list:
    """How many batches to take from each epoch: all of them (None) or a break after k."""
    take = st.one_of(st.none(), st.integers(0, batches_per_epoch))
    return draw(st.lists(take, max_size=max_epochs))


def key_of(sample: dict) -> int:
    return sample["key"]


# where the examples come from: ("sample", seed) is infinite; ("list", n), ("shuffler", n,
# seed) and ("index", n, seed) are finite, so epochs end early and sources start over
batch_iter_sources = st.one_of(
    st.tuples(st.just("sample"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("list"), st.integers(1, 12)),
    st.tuples(st.sampled_from(["shuffler", "index"]), st.integers(1, 12), st.integers(0, 9)),
)


def make_source(spec: tuple) -> tuple:
    """A fresh source for a spec of ``batch_iter_sources``, and the transformers it needs first
    (a Shuffler or IndexShuffler yields samples: dicts with a key)."""
    from fpipe import sample
    from fpipe.dataset import ListReader
    from fpipe.orderings import IndexShuffler, Shuffler

    kind, *args = spec
    if kind == "sample":
        return sample(range(1000), random_state=args[0]), []
    if kind == "list":
        return list(range(args[0])), []
    shuffler = IndexShuffler if kind == "index" else Shuffler
    return shuffler(ListReader([{"key": i} for i in range(args[0])]), seed=args[1]), [key_of]


# --- resume over any source, through stages that drop items ---------------------------------
# The dropping stages leave out one residue class each (mod 11 or 13), so no three of them can
# leave out all of four consecutive items: a source that cycles over 8 or more distinct items
# never starves (a filter of one in four could reject every item of a short cycle for ever).


def fails_on_thirteens(x: int) -> int:
    """``add_three``, except that it raises on the items that are 1 modulo 13."""
    if x % 13 == 1:
        raise ValueError(f"bad item {x}")
    return x + 3


def not_eleven(x: int) -> bool:
    return x % 11 != 0


# stages that keep, drop or skip items, seeded where they draw; built with on_error="skip"
dropping_transformers = st.one_of(
    st.just(("function",)),
    st.tuples(st.just("Threads"), st.integers(1, 3)),
    st.just(("drop",)),
    st.just(("skip",)),
    st.tuples(st.just("threads-skip"), st.integers(1, 3)),
    st.tuples(st.just("jiggle"), st.integers(0, 9)),
    st.tuples(st.just("threads"), st.integers(0, 9), st.integers(1, 3)),
    st.tuples(st.just("pool"), st.integers(1, 5), st.integers(1, 3), st.integers(0, 9)),
)


def make_dropping_transformer(spec: tuple):
    """A fresh stage (or function) for a spec of ``dropping_transformers``."""
    kind, *args = spec
    if kind == "drop":
        return fp_filter(not_eleven)
    if kind == "skip":
        return fails_on_thirteens  # a plain function: the Infinite's on_error="skip" applies
    if kind == "threads-skip":
        return threads(fails_on_thirteens, n_workers=args[0], on_error="skip")
    return make_transformer(spec)


def _cycles_enough(spec: tuple) -> bool:
    ordering = build(spec[1], IndexReader(spec[2]), seed=spec[3])
    return len(set(itertools.islice(ordering.iter(0), 200))) >= 8


ordering_sources = st.tuples(
    st.just("ordering"),
    st.one_of(ordering_specs, ordering_specs.map(lambda spec: [*spec, ("cycle",)]),
              ordering_specs.map(lambda spec: [*spec, ("repeat", 2)])),
    st.integers(8, 40), st.integers(0, 9),
).filter(_cycles_enough)

# every kind of source an Infinite resumes: samples, lists, and orderings of any nesting
# (ordering_sources), Cyclers (endless) and Repeaters included
resume_sources = st.one_of(batch_iter_sources, ordering_sources)


def make_resume_source(spec: tuple):
    """A fresh source for a spec of ``resume_sources`` (with the transformers it needs first)."""
    if spec[0] != "ordering":
        return make_source(spec)
    return build(spec[1], IndexReader(spec[2]), seed=spec[3]), []


# --- variable-length data: packing and token batches ----------------------------------------

sequence_lengths = st.lists(st.integers(0, 40), max_size=40)
row_lengths = st.integers(1, 24)
pack_options = st.fixed_dictionaries({
    "strategy": st.sampled_from(["best_fit", "first_fit", "concat"]),
    "buffer_size": st.integers(1, 6),
    "overflow": st.sampled_from(["split", "truncate"]),
})


def traced_sequences(lengths: list) -> list:
    """Dict samples whose fields say where each token comes from: ``origin`` is the sample's
    index and ``offset`` the token's place in it."""
    import numpy as np

    return [{"origin": np.full(n, i), "offset": np.arange(n)} for i, n in enumerate(lengths)]


TOKEN_DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64"]


@st.composite
def typed_sequence(draw):
    """A 1-D array of 0 to 12 values of any of ``TOKEN_DTYPES``, extremes, NaN and inf included."""
    import numpy as np
    from hypothesis.extra.numpy import arrays

    return draw(arrays(np.dtype(draw(st.sampled_from(TOKEN_DTYPES))), st.integers(0, 12)))


typed_sequences = st.lists(typed_sequence(), max_size=12)


def traced_values(values: list) -> list:
    """Dict samples of ``values`` (arrays) whose ``origin`` and ``offset`` fields say where
    each value comes from, as in :func:`traced_sequences`."""
    import numpy as np

    return [{"origin": np.full(len(v), i), "offset": np.arange(len(v)), "value": v}
            for i, v in enumerate(values)]


def regroup_stage(spec: tuple):
    """A fresh variable-length stage for a spec of ``regroup_specs``."""
    from fpipe import batch_by_tokens, bucket_by_length, pack

    kind, *args = spec
    if kind == "pack":
        return pack(args[0], fields=["offset"], **args[1])
    if kind == "tokens":
        return batch_by_tokens(args[0], length=sequence_length, buffer_size=args[1], seed=args[2])
    return bucket_by_length([5, 15], args[0], length=sequence_length, drop_last=args[1])


def sequence_length(sample: dict) -> int:
    return len(sample["offset"])


regroup_specs = st.one_of(
    st.tuples(st.just("pack"), row_lengths, pack_options),
    st.tuples(st.just("tokens"), st.integers(1, 80), st.integers(1, 8), st.integers(0, 2**32)),
    st.tuples(st.just("buckets"), st.lists(st.integers(1, 4), min_size=3, max_size=3),
              st.booleans()),
)


def same(a, b) -> bool:
    """Deep equality; numpy arrays compare by dtype, shape and bytes (NaN included)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and a.tobytes() == b.tobytes())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))
