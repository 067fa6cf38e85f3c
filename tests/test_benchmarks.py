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
