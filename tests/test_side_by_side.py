"""Drives side by side and results over time, drawn from the recorded runs of tests/data/results: short labels, the
headline figures with their ratio to the first run, one bar per run per pass with its spread, one legend entry per
distinct limit, and a trend that marks the runs that did not qualify."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ckptqual.report.extract import Run, load_run
from ckptqual.report.headlines import headlines
from ckptqual.report.labels import short_label, short_labelled
from ckptqual.report.side_by_side import headline_table, pass_seconds_bars
from ckptqual.report.trend import over_time

RESULTS = Path(__file__).parent / "data" / "results"
LOOPS = ("loop-ext4-1.json", "loop-ext4-3.json", "loop-ext4-devices.json")


@pytest.fixture(scope="module")
def two() -> list[Run]:
    return short_labelled([load_run(RESULTS / "drive-a.json"), load_run(RESULTS / "drive-b.json")])


def test_short_labels_name_model_and_firmware_and_tell_runs_apart_by_what_differs(tmp_path):
    data = copy.deepcopy(load_run(RESULTS / "drive-a.json").data)
    data["drive"] |= {"model": "Solidigm D5-P5336", "firmware": "5CV10302"}
    assert short_label(data) == "Solidigm D5-P5336 fw 5CV10302"
    runs = short_labelled([load_run(RESULTS / name) for name in LOOPS])
    first, third, other = (run.label for run in runs)  # one drive file; two runs on /mnt/e-a, one on /mnt/lead-a
    assert len({first, third, other}) == 3 and all(label.startswith("local ") for label in (first, third, other))
    assert other == "local /mnt/lead-a" and first == "local /mnt/e-a 2026-12-03 05:34"
    assert "local disk (no drive-specific thresholds)" not in " ".join((first, third, other))
    given = short_labelled(runs, {runs[0].path: "fw 1"})
    assert given[0].label == "fw 1"


def test_the_headline_table_gives_each_run_its_figures_and_the_ratio_to_the_first(two):
    headers, rows = headline_table(two)
    assert headers == ["figure", "unit", two[0].label, two[1].label, "ratio to the first"]
    by_name = {row[0]: row for row in rows}
    first, second = (next(h for h in headlines(run.data) if h.name == "pass 2 GB/s") for run in two)
    assert by_name["pass 2 GB/s"][2:] == [first.mean, second.mean, f"x{second.mean / first.mean:.2f}"]
    assert {"pass 1 s per checkpoint", "restore GB/s", "raw read GB/s", "slowest layout ratio"} <= set(by_name)


def test_one_bar_per_run_per_pass_with_its_spread_and_one_legend_entry_per_limit(two):
    axes = pass_seconds_bars(two).figure.axes[0]
    bars = [patch for patch in axes.patches if patch.get_height() > 0]
    assert len(bars) == 2 * 3  # two runs, three passes: the per-pass mean, not every checkpoint
    first_pass = [c["seconds"] for c in two[0].data["checkpoints"] if c["pass_number"] == 1]
    assert bars[0].get_height() == pytest.approx(sum(first_pass) / len(first_pass))
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["limit of the run under it", two[0].label, two[1].label]  # relative limits: one per run
    assert len(legend) == len(set(legend))
    whiskers = [c for c in axes.containers if getattr(c, "has_yerr", False)]
    assert len(whiskers) == 2


def test_results_over_time_mark_the_runs_that_did_not_qualify():
    runs = short_labelled([load_run(RESULTS / name) for name in LOOPS])
    calm = over_time(runs)
    assert calm.figure is not None and "3 runs of local" in calm.title
    texts = [t.get_text() for legend in calm.figure.legends for t in legend.get_texts()]
    assert "verdict not QUALIFIED" not in texts and "limit" in texts
    failed = copy.deepcopy(runs[1].data)
    failed["verdict"] = {"overall": "NOT_QUALIFIED", "reasons": ["pass 2 FAIL"]}
    marked = over_time([runs[0], Run(runs[1].path, failed, runs[1].label), runs[2]])
    texts = [t.get_text() for legend in marked.figure.legends for t in legend.get_texts()]
    assert "verdict not QUALIFIED" in texts
    notes = [t.get_text() for axes in marked.figure.axes for t in axes.texts]
    assert notes.count("NOT_QUALIFIED") == len(marked.figure.axes)  # the run marked in every figure's panel
    assert over_time(runs[:2]).figure is None  # two runs are a comparison, not a trend
