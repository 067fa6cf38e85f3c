"""V1: packing variable-length token sequences into rows, against Grain's packing.

One synthetic stream for all of them: 5,000 sequences of int32 tokens with lognormal lengths
(median 200, sigma 1, cut to 1..2,048; mean about 330), packed into rows of 2,048 with 64 open
rows (fpipe's ``buffer_size``, Grain's ``num_packing_bins``), in one process, each at its
defaults otherwise. V1 and V1f time the packing; V1p compares the padding of the rows;
V1t compares the padding of ``batch_by_tokens`` batches with plain ``batch`` + ``combine_pad``.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
from toolz import pipe

import fpipe as fp

from .harness import Pair, Value, workload

ROW, BINS, COUNT = 2048, 64, 5000
BATCH, BUDGET = 16, 16 * 2048  # V1t: plain batches of 16, token batches of the same budget


@functools.cache
def sequences() -> tuple:
    """The stream: dicts ``{"tokens": int32 array}``, the same in every run."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(np.log(200), 1.0, COUNT)), 1, ROW).astype(int)
    return tuple({"tokens": rng.integers(0, 50_000, n, dtype=np.int32)} for n in lengths)


def _grain(strategy: str):
    logging.getLogger("absl").setLevel(logging.ERROR)  # grain warns that jax is missing
    import grain  # a reference library: imported only when used
    from grain.experimental import BestFitPackIterDataset, FirstFitPackIterDataset

    kind = BestFitPackIterDataset if strategy == "best_fit" else FirstFitPackIterDataset
    return kind(grain.MapDataset.source(list(sequences())).to_iter_dataset(),
                length_struct={"tokens": ROW}, num_packing_bins=BINS)


def _fpipe(strategy: str):
    return fp.pack(ROW, strategy=strategy, buffer_size=BINS)(sequences())


def _rows(make, strategy: str) -> list:
    return list(make(strategy))


def _padding(rows: list, key: str) -> float:
    used = sum(int(np.count_nonzero(row[key])) for row in rows)
    return 1 - used / (len(rows) * ROW)


@workload("V1", description="pack 5,000 lognormal token sequences (median 200, max 2,048) into "
          "rows of 2,048, best fit over 64 open rows, one process",
          reference="Grain BestFitPackIterDataset (num_packing_bins=64)", target=">= 2")
def v1_best_fit() -> Pair:
    return Pair(fpipe=lambda: _rows(_fpipe, "best_fit"), reference=lambda: _rows(_grain, "best_fit"),
                items=COUNT)


@workload("V1f", description="V1, first fit", reference="Grain FirstFitPackIterDataset "
          "(num_packing_bins=64)", target=">= 2")
def v1_first_fit() -> Pair:
    return Pair(fpipe=lambda: _rows(_fpipe, "first_fit"),
                reference=lambda: _rows(_grain, "first_fit"), items=COUNT)


@workload("V1p", description="V1's rows: fpipe's padding fraction (best fit) over Grain's",
          reference="Grain BestFitPackIterDataset (num_packing_bins=64)", target="<= 1",
          kind="value")
def v1_padding() -> Value:
    ours = _padding(_rows(_fpipe, "best_fit"), "segment_ids")
    theirs = _padding(_rows(_grain, "best_fit"), "tokens_segment_ids")
    first = _padding(_rows(_fpipe, "first_fit"), "segment_ids")
    their_first = _padding(_rows(_grain, "first_fit"), "tokens_segment_ids")
    return Value(ours / theirs, f"x (padding: fpipe best fit {ours:.2%}, Grain best fit "
                                f"{theirs:.2%}; first fit {first:.2%} and {their_first:.2%})")


def _batch_padding(batches: list) -> float:
    padded = [fp.combine_pad(batch)["tokens"] for batch in batches]
    real = sum(len(sample["tokens"]) for batch in batches for sample in batch)
    return 1 - real / sum(array.size for array in padded)


@workload("V1t", description="V1's sequences in batches for combine_pad: batch_by_tokens("
          "16 x 2,048, buffer_size=1024)'s padding fraction over plain batch(16)'s",
          reference="fpipe.batch(16) + combine_pad", target="<= 1", kind="value")
def v1_token_batches() -> Value:
    def length(sample: dict) -> int:
        return len(sample["tokens"])
    ours = _batch_padding(list(pipe(sequences(), fp.batch_by_tokens(BUDGET, length=length,
                                                                     seed=0))))
    theirs = _batch_padding(list(pipe(sequences(), fp.batch(BATCH))))
    return Value(ours / theirs, f"x (padding: batch_by_tokens {ours:.2%}, batch(16) "
                                f"{theirs:.2%})")
