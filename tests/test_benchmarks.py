"""The benchmark harness and its report (not the workloads: those run on purpose)."""

import json
from pathlib import Path

import pytest

from benchmarks import harness
from benchmarks.plot import main, markdown_table, plot, speed, with_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture
def workloads(monkeypatch):
    monkeypatch.setattr(harness, "WORKLOADS", {})
    waits = []
    monkeypatch.setattr(harness, "wait_until_quiet", lambda: waits.append(1))

    @harness.workload("X1", description="sum", reference="builtin", target=">= 0.01")
    def _pair():
        return harness.Pair(fpipe=lambda: sum(range(1000)), reference=lambda: sum(range(1000)))

    @harness.workload("X2", description="memory", reference="-", target="<= 1", kind="value")
    def _value():
        return harness.Value(2.0, "MiB")

    return waits


def test_run_times_alternately_and_writes_json(workloads, tmp_path, capsys):
    output = tmp_path / "out.json"
    results = harness.run(["X1", "X2"], repetitions=5, output=str(output))
    assert workloads == [1, 1]  # each workload waited for a quiet machine first
    first, second = results
    assert len(first.fpipe_seconds) == len(first.reference_seconds) == 5
    assert first.met and first.ratio > 0
    assert second.value == 2.0 and second.met is False
    printed = capsys.readouterr().out
    assert "X1" in printed and "MISSED" in printed
    saved = json.loads(output.read_text())["results"]
    assert [r["name"] for r in saved] == ["X1", "X2"]
    table = markdown_table(saved)
    assert "| X2 | memory | - |" in table and "**missed**" in table
    plot(saved, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 1000


def test_a_workload_waits_until_the_machine_is_quiet_or_the_deadline(monkeypatch):
    # cumulative (busy, total) ticks: two busy windows (20 of 40 ticks), then a quiet one
    readings = iter([(0, 0), (20, 40), (20, 40), (40, 80), (40, 80), (42, 120)])
    monkeypatch.setattr(harness, "_busy_and_total", lambda: next(readings))
    monkeypatch.setattr(harness, "_QUIET_WINDOW", 0.0)
    harness.wait_until_quiet()
    assert next(readings, "all read") == "all read"
    counter = iter(range(0, 10**9, 10))  # every tick busy
    monkeypatch.setattr(harness, "_busy_and_total", lambda: (next(counter), next(counter)))
    monkeypatch.setattr(harness, "_QUIET_DEADLINE", 0.05)
    assert 0.05 <= harness.wait_until_quiet() < 5  # gives up at the deadline


def test_unknown_workload_and_bad_kind_are_refused(workloads):
    with pytest.raises(SystemExit, match="unknown workload"):
        harness.run(["nope"])
    with pytest.raises(ValueError, match="kind must be"):
        harness.workload("X3", description="", reference="", target=">= 1", kind="speed")


def test_speed_turns_time_ratios_into_higher_is_better():
    timed = {"kind": "time", "ratio": 0.25, "target": "<= 0.5"}
    throughput = {"kind": "throughput", "ratio": 3.0, "target": ">= 2"}
    assert speed(timed) == (4.0, 2.0)
    assert speed(throughput) == (3.0, 2.0)


def test_the_table_goes_between_the_markers_and_replaces_the_old_one(tmp_path):
    page = "# B\n\n<!-- results: made by a script -->\nold table\n<!-- /results -->\n\nafter\n"
    assert with_table(page, "| new |") == (
        "# B\n\n<!-- results: made by a script -->\n| new |\n<!-- /results -->\n\nafter\n")
    with pytest.raises(ValueError, match="markers"):
        with_table("# no markers", "| new |")


def test_the_benchmarks_page_shows_the_committed_results_and_chart(tmp_path):
    results = DOCS / "data" / "benchmarks.json"
    page = (DOCS / "benchmarks.md").read_text()
    assert markdown_table(json.loads(results.read_text())["results"]) in page
    assert (DOCS / "img" / "benchmarks.png").stat().st_size > 10_000
    copy = tmp_path / "page.md"
    copy.write_text(page)
    main([str(results), "--page", str(copy)])
    assert copy.read_text() == page  # regenerating from the same results changes nothing


def test_the_peers_table_on_the_page_is_made_from_the_committed_runs(tmp_path):
    from benchmarks import peers

    runs = json.loads((DOCS / "data" / "peers.json").read_text())["runs"]
    page = (DOCS / "benchmarks.md").read_text()
    assert peers.markdown_table(runs) in page
    assert (DOCS / "img" / "peers.png").stat().st_size > 10_000
    copy = tmp_path / "page.md"
    copy.write_text(page)
    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    peers.main(["--report", *map(str, paths), "--page", str(copy)])
    assert copy.read_text() == page  # regenerating from the same runs changes nothing


def test_the_peers_table_has_a_row_per_system_and_a_column_per_run():
    from benchmarks import peers

    result = {"kind": "T5u", "limit": 200.0,
              "images_per_second": {"serial": 100.0, "DataLoader": 160.0, "fpipe batch": 180.0}}
    table = peers.markdown_table([{"results": [result]}, {"results": [result]}])
    assert "| T5u | fpipe batch | 180 img/s, 1.12×, 90% | 180 img/s, 1.12×, 90% |" in table
    assert table.count("\n") == 4


def test_a_figure_kept_as_information_has_no_verdict_and_no_tick(workloads, tmp_path, capsys):
    @harness.workload("X3", description="kept", reference="builtin", target="-")
    def _information():
        return harness.Pair(fpipe=lambda: sum(range(100)), reference=lambda: sum(range(100)))

    output = tmp_path / "out.json"
    (result,) = harness.run(["X3"], repetitions=5, output=str(output))
    assert result.met is None and result.ratio > 0
    assert "target -        info" in capsys.readouterr().out
    saved = json.loads(output.read_text())["results"]
    assert markdown_table(saved).endswith("| - | information |")
    assert speed(saved[0])[1] is None
    plot(saved, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 1000


def test_the_scale_chart_merges_runs_and_draws_the_growth(tmp_path):
    from benchmarks.scale_chart import chart, merged

    first = {"sizes": [10, 100], "first-index": {"10": {"seconds": 0.001, "grew_mb": 0.5},
                                                 "100": {"seconds": 0.001, "grew_mb": 0.5}},
             "first-shuffler": {"10": {"seconds": 0.1, "grew_mb": 1.0},
                                "100": {"seconds": 1.0, "grew_mb": 10.0}}}
    later = {"first-shuffler": {"100": {"seconds": 2.0, "grew_mb": 12.0}},
             "loader": {"100": {"seconds": 0.1, "worker_rss_mb": [{"VmRSS": 3.0}, {"VmRSS": 4.0}]}}}
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, content in zip(paths, (first, later)):
        path.write_text(json.dumps(content))
    figures = merged(paths)
    assert figures["first-shuffler"][100]["seconds"] == 2.0 and figures["first-index"][10]
    assert figures["loader"][100]["worker_mb"] == 4.0
    chart(figures, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").read_bytes()[:4] == b"\x89PNG"


def _drawn(item: int) -> tuple:
    import fpipe

    return item, fpipe.current_rng().random()


def _batch_of(item, pairs: list) -> tuple:
    import fpipe

    return fpipe.combine_to_arrays([item(pair) for pair in pairs])


def test_o1s_hand_fused_reference_draws_as_the_fused_form():
    # O1's reference must do the fused form's work: the same draws, so the same batches
    import functools

    from toolz import pipe

    import fpipe as fp
    from benchmarks.bench_plan import DrawnItem, _same_batches

    def natural(ids):
        stage = fp.processes(_drawn, n_workers=2, seed=0, backend="threading")
        return pipe(ids, stage, fp.batch(32), fp.stream.map(fp.combine_to_arrays))

    def hand(function, seed):
        return lambda items: pipe(items, fp.batch(32), fp.processes(
            function, n_workers=2, seed=seed, backend="threading"))

    order = list(range(100, 170))
    _same_batches(natural, hand(functools.partial(_batch_of, DrawnItem(_drawn)), None), order)
    # one generator per batch, as "fpipe batch" draws: other numbers, which the check sees
    per_batch = functools.partial(_batch_of, lambda pair: _drawn(pair[1]))
    with pytest.raises(AssertionError, match="natural form's batches"):
        _same_batches(natural, hand(per_batch, 0), order)


# --- benchmarks.revisions: two revisions side by side (the decision, not the timings) --------

def test_spread_is_the_range_over_the_median():
    from benchmarks.revisions import spread

    assert spread([1.0, 1.1, 0.9]) == pytest.approx(0.2)
    assert spread([2.0]) == 0.0
    with pytest.raises(ValueError):
        spread([])


def test_a_revision_is_slower_only_past_the_noise_of_its_runs():
    from benchmarks.revisions import NOISE_FLOOR, compare

    steady = compare([1.00, 1.01, 0.99], [1.20, 1.21, 1.19])  # 2 % spread, 20 % slower
    assert steady.verdict == "slower" and steady.ratio == pytest.approx(1.2)
    assert steady.noise == pytest.approx(NOISE_FLOOR)  # the floor, above the 2 % spread
    noisy = compare([1.0, 1.3, 0.8], [1.2, 1.25, 1.1])  # 50 % spread: 20 % is within it
    assert noisy.verdict == "same" and noisy.noise == pytest.approx(0.5)
    assert compare([1.0, 1.0, 1.0], [1.02, 1.02, 1.02]).verdict == "same"  # under the floor
    faster = compare([1.0, 1.01, 0.99], [0.5, 0.51, 0.49])
    assert faster.verdict == "faster" and faster.ratio == pytest.approx(0.5)
    # the after side's spread counts as much as the before side's
    assert compare([1.0, 1.0, 1.0], [1.3, 1.0, 1.6]).verdict == "same"


def test_pairs_count_the_repeats_in_which_after_took_longer():
    from benchmarks.revisions import slower_pairs

    assert slower_pairs([1.0, 2.0, 3.0], [1.5, 1.9, 3.1]) == (2, 3)
    assert slower_pairs([], []) == (0, 0)


def test_the_runs_alternate_and_swap_the_order_of_each_pair():
    from benchmarks.revisions import schedule

    assert list(schedule(["A", "B"], 3)) == [
        ("A", 0, "before"), ("A", 0, "after"), ("A", 1, "after"), ("A", 1, "before"),
        ("A", 2, "before"), ("A", 2, "after"),
        ("B", 0, "before"), ("B", 0, "after"), ("B", 1, "after"), ("B", 1, "before"),
        ("B", 2, "before"), ("B", 2, "after")]


def test_trees_compare_file_by_file(tmp_path):
    from benchmarks.revisions import compare_trees, tree

    for side, content in (("a", b"1"), ("b", b"2")):
        (tmp_path / side / "sub").mkdir(parents=True)
        (tmp_path / side / "same.bin").write_bytes(b"x")
        (tmp_path / side / "sub" / "changed.bin").write_bytes(content)
        (tmp_path / side / f"only-{side}").write_bytes(b"")
    result = compare_trees(tree(tmp_path / "a"), tree(tmp_path / "b"))
    assert result == {"same": ["same.bin"], "differ": ["sub/changed.bin"], "only_first": ["only-a"],
                      "only_second": ["only-b"]}


def test_datadings_files_compare_with_fpipe_md5_less_its_own_lines(tmp_path):
    from benchmarks.revisions import compare_with_datadings

    theirs, ours = tmp_path / "theirs", tmp_path / "ours"
    theirs.mkdir()
    ours.mkdir()
    for folder in (theirs, ours):
        (folder / "d.msgpack").write_bytes(b"data")
    (theirs / "d.msgpack.md5").write_text("aa  d.msgpack\n")
    (ours / "d.msgpack.md5").write_text("aa  d.msgpack\nbb  d.msgpack.key_index\n")
    (ours / "d.msgpack.key_index").write_bytes(b"fpipe's own")
    assert compare_with_datadings(theirs, ours) == (["d.msgpack", "d.msgpack.md5"], [])
    (ours / "d.msgpack").write_bytes(b"other")
    assert compare_with_datadings(theirs, ours) == (["d.msgpack.md5"], ["d.msgpack"])


def test_the_byte_samples_are_the_same_in_every_process_and_keep_their_byte_order():
    from benchmarks.revisions import SAMPLES_CODE, byte_samples

    namespace: dict = {}
    exec(SAMPLES_CODE, namespace)
    first, second = byte_samples(20), namespace["byte_samples"](20)
    assert [s["key"] for s in first] == [s["key"] for s in second]
    assert first[1]["image"].dtype.str == ">i2" and first[1]["key"] == "k00001-\u00fc"
    assert all(a["image"].tobytes() == b["image"].tobytes() for a, b in zip(first, second))


def test_every_revision_workload_names_its_area_and_a_dataset_known_to_prepare():
    from benchmarks.revisions import DATASETS, WORKLOADS

    areas = {w.area for w in WORKLOADS.values()}
    assert {"core", "stream", "Infinite", "packing", "dataset", "orderings", "formats", "torch",
            "images"} <= areas
    for load in WORKLOADS.values():
        assert set(load.data) <= set(DATASETS), load.name
        assert load.kind in ("throughput", "time") and load.samples >= 1 and load.loops >= 1
        compile(load.setup, load.name, "exec")  # the code a revision runs at least parses


def test_the_driver_times_a_workload_in_a_checkout(tmp_path):
    import os
    import subprocess
    import sys

    from benchmarks.revisions import HERE, MARKER

    spec = {"mode": "time", "root": str(HERE.parent), "samples": 2, "loops": 3,
            "setup": "import fpipe\nwork = lambda: fpipe.compose(abs)(-1)\nitems = 7\n"}
    out = subprocess.run([sys.executable, "-c", (HERE / "revision_driver.py").read_text(),
                          json.dumps(spec)], capture_output=True, text=True, check=True,
                         cwd=HERE.parent, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    result = json.loads(out.stdout.splitlines()[-1][len(MARKER):])
    assert result["items"] == 7 and len(result["seconds"]) == 2
    spec["setup"] = "raise RuntimeError('no such workload')"
    out = subprocess.run([sys.executable, "-c", (HERE / "revision_driver.py").read_text(),
                          json.dumps(spec)], capture_output=True, text=True, check=True,
                         cwd=HERE.parent, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert "no such workload" in json.loads(out.stdout.splitlines()[-1][len(MARKER):])["error"]


def test_the_report_renders_again_from_its_saved_figures(tmp_path, capsys):
    from pathlib import Path

    from benchmarks import revisions

    checkouts = {side: revisions.Checkout(side, rev, commit * 40, f"subject {side}", Path("/x"))
                 for side, rev, commit in (("before", "v1", "a"), ("after", "HEAD", "b"))}
    steady, noisy, broken = (revisions.Workload(name, "core", f"work {name}", "") for name in "ABC")
    outcomes = [revisions.Outcome(steady, {"before": [1.0, 1.01, 0.99], "after": [1.5, 1.49, 1.51]}, 10),
                revisions.Outcome(noisy, {"before": [1.0, 2.0, 1.5], "after": [1.6, 1.7, 1.8]}, 10),
                revisions.Outcome(broken, {"before": [1.0], "after": []}, 1,
                                  {"after": "x\nLookupError: gone"})]
    run = revisions.record(checkouts, outcomes, ["## Byte for byte", "- all identical"], "cmd", 3,
                           (1.0, 1.0, 1.0), 2.0, [])
    text = revisions.report(run)
    assert "| A | core | work A | 1000.0 | 1500.0 | 10/s | 7/s | 1.500 | ±3.0% | 3/3 | **slower** |" in text
    assert "| B | core | work B |" in text and "| 2/3 | same (within noise) |" in text
    assert "**error**" in text and "- C, after: `LookupError: gone`" in text
    assert "**Slower than the noise: A.**" in text and text.rstrip().endswith("- all identical")
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(run))
    assert revisions.main(["--render", str(saved)]) == 0
    assert capsys.readouterr().out.strip() == text.strip()
