"""The pixels of the recipes against the reference pipeline (full-size decode, Pillow's
antialiased bilinear resize of the same box) on real photographs: a mean absolute difference
of at most 1.5 levels at full-scale decode, and a PSNR of at least 30 dB at reduced decodes.
``python -m benchmarks.image_quality`` prints the figures the docs report."""

from __future__ import annotations

import pytest

from benchmarks.image_quality import compare


@pytest.mark.timeout(600)
def test_full_scale_within_1_5_levels_and_reduced_decodes_at_least_30_db(photos):
    rows = compare(photos, draws=3)
    full = [row for row in rows if row["reduction"] == 1]
    reduced = [row for row in rows if row["reduction"] > 1]
    assert {row["recipe"] for row in full} == {"random_resized_crop", "resized_center_crop"}
    assert {row["reduction"] for row in reduced} >= {2, 4}  # the scaled decode is exercised
    assert {row["backend"] for row in rows} == {"torch", "pillow"}
    for row in full:
        assert row["mad_max"] <= 1.5, row
    for row in reduced:
        assert row["psnr_min"] >= 30, row
