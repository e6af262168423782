"""`ckptqual report` and `--report-dir`: figures and one self-contained HTML page drawn from results files alone
(real ones, tests/data/results/, written by the built-in qualification), one drive and two side by side."""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path

import pytest

from ckptqual.cli import main
from ckptqual.report.extract import Run, load_run
from ckptqual.report.figures import draw_all
from ckptqual.report.html import PAGE, write_report
from ckptqual.report.side_by_side import draw_side_by_side
from replay_runs import checkout, replay_suite
from suite_runs import SMALL

pytest_plugins = ("pytester",)

RESULTS = Path(__file__).parent / "data" / "results"
# drive-a: pytest tests_qual (built-in default, stream engine), with the drive's health and the time series;
# drive-b: pytest tests_qual --scale 0.0003 --engine torch-save, from before the run recorded either.
A, B = RESULTS / "drive-a.json", RESULTS / "drive-b.json"


@pytest.fixture(scope="module")
def runs() -> list[Run]:
    return [load_run(A), load_run(B)]


def _legend_texts(figure) -> set[str]:
    return {text.get_text() for axes in figure.axes if axes.get_legend() for text in axes.get_legend().get_texts()}


def test_every_figure_renders_from_one_results_file(runs):
    drawn = {figure.name: figure for figure in draw_all(runs[:1])}
    assert list(drawn) == [
        "checkpoint_times",
        "steady_state",
        "restore",
        "sweep_bandwidth",
        "sweep_heatmap",
        "layouts",
        "timeseries",
        "checkpoint_phases",
        "rank_spread",
        "cadence",
    ]
    newer = {"checkpoint_phases", "rank_spread", "cadence"}  # drive-a.json predates the phases and the cadence
    assert {name: d.missing for name, d in drawn.items() if d.figure is None and name not in newer} == {}
    checkpoints = len(runs[0].data["checkpoints"])
    bars = [p for p in drawn["checkpoint_times"].figure.axes[0].patches if p.get_height() > 0]
    assert len(bars) == checkpoints


def test_two_drives_share_each_figures_axes(runs):
    for drawn in draw_all(runs):
        if drawn.figure is None:
            continue
        texts = " ".join(_legend_texts(drawn.figure)) + " ".join(a.get_title() for a in drawn.figure.axes)
        if drawn.name != "timeseries":  # only drive-a recorded a time series
            assert runs[0].label in texts and runs[1].label in texts, drawn.name
    times = next(d for d in draw_all(runs) if d.name == "checkpoint_times").figure
    assert len(times.axes) == 1  # both drives' bars on the same axes
    bars = [p for p in times.axes[0].patches if p.get_height() > 0]
    assert len(bars) == sum(len(run.data["checkpoints"]) for run in runs)


def test_a_figure_the_record_lacks_says_so(runs):
    series = next(d for d in draw_all(runs[1:]) if d.name == "timeseries")
    assert series.figure is None and series.missing.startswith("not recorded")


def test_the_limits_are_drawn_where_there_are_some(runs):
    times = next(d for d in draw_all(runs[:1]) if d.name == "checkpoint_times").figure
    assert any(text.startswith("limit: >= 0.05 of raw_write") for text in _legend_texts(times))
    layouts = next(d for d in draw_all(runs[:1]) if d.name == "layouts").figure
    assert any(text.startswith("limit: >= 0.1") for text in _legend_texts(layouts))


def test_the_page_is_self_contained(runs, tmp_path):
    page = write_report(runs, tmp_path / "out")
    html = page.read_text()
    drawn = [d for d in draw_all(runs) if d.figure is not None]
    assert sorted(p.name for p in page.parent.iterdir()) == sorted([PAGE, *(f"{d.name}.png" for d in drawn)])
    side = [d for d in draw_side_by_side(runs) if d.figure is not None]
    assert html.count('<svg role="img"') == len(drawn) + len(side)  # every figure inline, its text as text
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html)
    assert "<script" not in html and "<link" not in html


def test_the_page_holds_verdicts_limits_identity_and_health(runs, tmp_path):
    html = write_report(runs, tmp_path).read_text()
    for run in runs:
        assert run.data["verdict"]["overall"] in html
        for limit in run.data["limits"]:
            assert escape(limit["source"]) in html
    assert runs[0].data["drive"]["serial"] in html
    assert "data_units_written" in html or "block_layer_written_bytes" in html  # drive-a's health
    assert "unavailable: the results hold no drive health" in html  # drive-b read none


def test_cli_report_and_its_bad_input(tmp_path, capsys):
    assert main(["report", str(A), str(B), "-o", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / PAGE).is_file()
    assert main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err.strip()
    missing = tmp_path / "missing.json"
    assert (
        error
        == f"ckptqual report: {missing}: No such file or directory; give the results file a run wrote (setting results)"
    )
    (tmp_path / "plain.json").write_text(json.dumps({"x": 1}))
    assert main(["report", str(tmp_path / "plain.json"), "-o", str(tmp_path / "x")]) == 2
    assert "not a results record as ckptqual writes it: settings: missing;" in capsys.readouterr().err


def test_the_qualification_writes_the_report_at_its_end(pytester, tmp_path, capsys):
    """In process, on a replayed run of every part but the sweep (stand_in/replay.py); `ckptqual report` draws the
    same page again from the results file alone."""
    results, report = pytester.path / "r.json", tmp_path / "report"
    tests = ("test_fill.py", "test_restore.py", "test_shard_layouts.py")
    done = replay_suite(pytester, *SMALL, "--report-dir", str(report), "--benchmark-disable", tests=tests)
    assert done.ret in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert f"ckptqual: report written to {report / PAGE}" in done.stdout
    html = (report / PAGE).read_text()
    assert json.loads(results.read_text())["verdict"]["overall"] in html
    assert (report / "checkpoint_times.png").stat().st_size > 0
    assert main(["report", str(results), "-o", str(tmp_path / "later")]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "later").iterdir()) == sorted(p.name for p in report.iterdir())


def test_a_run_that_stopped_early_still_draws_its_page(runs, tmp_path):
    keep = ("started", "environment", "settings", "plan", "limits", "tests", "measurements", "errors")
    early = Run(tmp_path / "early.json", {key: runs[1].data[key] for key in keep} | {"passes": [], "tests": {}})
    drawn = draw_all([early])
    assert all(d.figure is None and d.missing for d in drawn)
    html = write_report([early], tmp_path / "out").read_text()
    assert "no verdict recorded: the run did not finish" in html
    assert "no checkpoint was recorded" in html and "unavailable: the results hold no drive identity" in html


def test_a_report_dir_that_cannot_take_the_report_is_refused_before_the_run(pytester, tmp_path):
    (tmp_path / "file").write_text("")
    target = checkout(pytester)
    for directory, problem in (
        (tmp_path / "file", "is not a directory; give a directory"),
        (target / "report", f"lies inside the target {target}"),
    ):
        done = replay_suite(pytester, "--report-dir", str(directory), "--benchmark-disable", reports=False)
        assert done.ret == 4, done.stdout[-2000:] + done.stderr[-2000:]
        assert f"ERROR: --report-dir {directory}: {problem}" in done.stderr
    assert list(target.iterdir()) == []
