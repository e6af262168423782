"""The table of measurements (limits/measurements.py) against everything that uses it, on real recorded runs
(tests/data/results/, written by the built-in qualification): limits, the fill pass, compare, figures and summary
take each measurement's unit and direction from it, and the reference page lists exactly its rows."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from ckptqual.cli import main
from ckptqual.config.drive_file import available_drives, load_drive_file
from ckptqual.limits.health import MEASURED
from ckptqual.limits.measurements import (
    LIMITED,
    MEASUREMENTS,
    Direction,
    Taken,
    axis_label,
    drawn_on,
    field,
    in_recorded_unit,
    recorded,
    taken_at,
)
from ckptqual.limits.units import unit_kind
from ckptqual.report.compare import compare_runs, run_metrics
from ckptqual.report.extract import Run, drive_label, given_labels, labelled, load_run
from ckptqual.report.figures import draw_all
from ckptqual.report.summary import summary_lines

RESULTS = Path(__file__).parent / "data" / "results"
A, FIRST, THIRD = RESULTS / "drive-a.json", RESULTS / "loop-ext4-1.json", RESULTS / "loop-ext4-3.json"
CADENCE = RESULTS / "cadence-async.json"  # a run with --checkpoint-interval and --async-save (docs/training-stacks.md)
# Taken per pass only since the training cadence came: drive-a.json predates them, the cadence run records them.
CADENCE_ROWS = ("stall_fraction", "seconds_to_durable_max", "min_sustained_interval")
PAGE = Path(__file__).parents[1] / "docs" / "reference" / "measurements.md"


def _legend_texts(figure) -> list[str]:
    return [text.get_text() for axes in figure.axes if axes.get_legend() for text in axes.get_legend().get_texts()]


def _figure(runs: list[Run], name: str):
    return next(drawn for drawn in draw_all(runs) if drawn.name == name).figure


def test_every_row_has_a_known_unit_and_a_record_path_a_real_run_fills():
    for row in MEASUREMENTS.values():
        run = CADENCE if row.name in CADENCE_ROWS else A
        assert unit_kind(row.unit) == row.kind and row.doc and row.direction in Direction
        if row.taken is not Taken.DRIVE_HEALTH:  # a run on a virtual disk reads no health counters
            assert recorded(load_run(run).data, row), f"{row.name}: nothing at {row.record} in {run.name}"


@pytest.mark.parametrize("path", [A, CADENCE], ids=lambda path: path.stem)
def test_the_fill_pass_and_the_record_agree_with_the_table(path):
    """Each measurement taken per pass is judged once per pass, in the table's unit, with the value at its path."""
    data = load_run(path).data
    for row in taken_at(Taken.PASS):
        if path == A and row.name in CADENCE_ROWS:
            continue
        entries = [m for m in data["measurements"] if m["measurement"] == row.name]
        assert [m["value"] for m in entries] == recorded(data, row) and {m["unit"] for m in entries} == {row.unit}


def test_every_limit_a_drive_file_declares_names_a_limited_row():
    assert set(MEASURED) <= set(LIMITED) and set(LIMITED) <= set(MEASUREMENTS)
    for drive in available_drives():
        for limit in load_drive_file(drive).limits:
            assert limit.measurement in LIMITED, (drive, limit.measurement)


def test_every_figure_the_table_names_is_drawn_and_has_one_axis_label():
    names = {drawn.name for drawn in draw_all([load_run(A)])}
    figures = {row.drawn.figure for row in MEASUREMENTS.values() if row.drawn}
    assert figures <= names
    assert all(axis_label(figure) for figure in figures)
    assert {row.name for row in drawn_on("checkpoint_times")} >= {row.name for row in taken_at(Taken.PASS)}


def test_every_compare_metric_is_a_row_and_a_time_is_lower_is_better():
    metrics = run_metrics(load_run(FIRST).data)
    assert metrics and {metric.measurement for metric in metrics.values()} <= set(MEASUREMENTS)
    assert metrics["pass2.seconds"].row.direction is Direction.LOWER and metrics["pass2"].unit == "GB/s"


def _even(data: dict) -> dict:
    """The record with each checkpoint of pass 2 taking its pass's mean time: no spread, so the noise band is its
    floor and a change of a few percent is judged."""
    data = copy.deepcopy(data)
    second = [c for c in data["checkpoints"] if c["pass_number"] == 2]
    for checkpoint in second:
        checkpoint["seconds"] = sum(c["seconds"] for c in second) / len(second)
    return data


def _timed(data: dict, factor: float) -> dict:
    """The record with every checkpoint of pass 2 taking `factor` times as long (its rate left as it was)."""
    data = copy.deepcopy(data)
    for checkpoint in data["checkpoints"]:
        if checkpoint["pass_number"] == 2:
            checkpoint["seconds"] *= factor
    return data


def test_a_lower_is_better_metric_that_rises_regresses_and_one_that_falls_is_better(tmp_path):
    base = Run(FIRST, _even(load_run(FIRST).data))
    slower = {c.name: c for c in compare_runs(base, Run(tmp_path / "n.json", _timed(base.data, 1.3)))[0]}
    assert slower["pass2.seconds"].change == pytest.approx(0.3) and slower["pass2.seconds"].band < 0.3
    assert slower["pass2.seconds"].regressed and slower["pass2.seconds"].word == "REGRESSION"
    assert not slower["pass2"].regressed and not slower["pass1.seconds"].regressed  # rates and pass 1 as they were
    faster = {c.name: c for c in compare_runs(base, Run(tmp_path / "n.json", _timed(base.data, 0.7)))[0]}
    assert faster["pass2.seconds"].word.startswith("better") and not faster["pass2.seconds"].regressed


def _with_limit(data: dict, measurement: str, unit: str, bound: float, context: dict) -> dict:
    """The record with one more judged entry of `measurement`: value 1 in `unit`, judged against `bound`."""
    data = copy.deepcopy(data)
    entry = {"measurement": measurement, "value": 1.0, "unit": unit, "context": context, "outcome": "PASS",
             "limit": f"<= {bound} {unit}", "limit_number": 9, "host_bound": None, "judged_value": 1.0,
             "limit_value": bound, "limit_unit": unit, "message": "added by the test"}  # fmt: skip
    data["measurements"].append(entry)
    return data


def test_a_made_up_fill_measurement_in_seconds_does_not_crash_the_figures():
    run = load_run(A)
    odd = Run(run.path, _with_limit(run.data, "fill_restart_seconds", "s", 20.0, {"pass": 1, "state": "fresh"}))
    assert all(drawn.figure is not None for drawn in draw_all([odd]) if drawn.name == "checkpoint_times")
    assert not any("fill_restart_seconds" in text for text in _legend_texts(_figure([odd], "checkpoint_times")))


def test_a_time_limit_is_drawn_as_a_time_on_the_checkpoint_figure():
    run = load_run(A)
    timed = Run(run.path, _with_limit(run.data, "fill_checkpoint_seconds_max", "s", 20.0, {"pass": 1}))
    axes = _figure([timed], "checkpoint_times").axes[0]
    assert "limit: <= 20.0 s (fill_checkpoint_seconds_max)" in _legend_texts(axes.figure)
    levels = {float(y) for collection in axes.collections for segment in collection.get_segments() for _, y in segment}
    assert 20.0 in levels


def test_the_sweep_limit_markers_have_a_legend_entry_of_their_block_size():
    run = load_run(A)
    cell = next(c for c in run.data["sweep"]["cells"] if "GiBps" in c and c["block_size"] == "1M")
    context = {key: cell[key] for key in ("transfer", "block_size", "threads")}
    limited = Run(run.path, _with_limit(run.data, "sweep_read_bandwidth", "GiB/s", 0.5, context))
    texts = _legend_texts(_figure([limited], "sweep_bandwidth"))
    assert "limit of 1M" in texts and not any(text.startswith("limit of") and "1M" not in text for text in texts)


def test_the_summary_pass_table_has_a_column_per_pass_measurement():
    header = next(line for line in summary_lines(load_run(A).data) if line.split()[:2] == ["pass", "ckpts"])
    assert all(row.column in header for row in taken_at(Taken.PASS))


def test_runs_are_labelled_by_drive_and_serial_and_two_runs_of_one_drive_apart(tmp_path):
    data = load_run(A).data
    assert drive_label(data) == f"{data['settings']['drive']} sn {data['drive']['serial']}"
    same = [
        Run(tmp_path / "a" / "qual.json", load_run(FIRST).data),
        Run(tmp_path / "b" / "qual.json", load_run(THIRD).data),
    ]
    first, third = labelled(same)
    assert first.label != third.label and "qual.json" not in first.label
    assert load_run(FIRST).data["started"] in first.label
    given = given_labels([f"old fw={same[0].path}"], [run.path for run in same])
    assert next(run.label for run in labelled(same, given)) == "old fw"
    with pytest.raises(ValueError, match=r"label 'nofile': write LABEL=FILE"):
        given_labels(["nofile"], [run.path for run in same])


def test_two_files_of_one_name_draw_two_legend_entries(tmp_path, capsys):
    paths = []
    for source, folder in ((FIRST, "a"), (THIRD, "b")):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "qual.json")
        paths[-1].write_text(source.read_text())
    runs = labelled([load_run(path) for path in paths])
    legend = _legend_texts(_figure(runs, "restore"))
    assert runs[0].label in legend and runs[1].label in legend and runs[0].label != runs[1].label
    assert main(["compare", str(paths[0]), str(paths[1]), "--label", f"before={paths[0]}"]) == 3
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"base before ({paths[0]})")
    assert out[1].startswith(f"new  {drive_label(runs[1].data)} ({paths[1]})")  # alone with its label now


def _page_rows() -> dict[str, list[str]]:
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_reference_page_lists_the_table():
    """docs/reference/measurements.md: one row per measurement, each column as the table has it."""
    expected = {
        row.name: [f"`{row.unit}`", row.direction.value, row.taken.value, "yes" if row.limited else "no",
                   ", ".join(f"`{key}`" for key in row.context) or "-", f"`{row.record}`",
                   row.drawn.figure if row.drawn else "-", row.doc]
        for row in MEASUREMENTS.values()
    }  # fmt: skip
    assert _page_rows() == expected
    for target in re.findall(r"\]\(([^)#]+)", PAGE.read_text()):  # relative links, to files that exist
        assert "://" not in target and (PAGE.parent / target).exists(), target


def test_a_value_is_recorded_in_the_tables_unit():
    assert in_recorded_unit("sweep_read_bandwidth", 1.0, "GB/s") == pytest.approx(1e9 / 2**30)
    assert in_recorded_unit("fill_checkpoint_seconds_max", 1500.0, "ms") == pytest.approx(1.5)
    with pytest.raises(ValueError, match="cannot convert GB/s to s"):
        in_recorded_unit("fill_checkpoint_seconds_max", 1.0, "GB/s")
    with pytest.raises(ValueError, match="unknown measurement 'fill_speed'; add a row"):
        in_recorded_unit("fill_speed", 1.0, "GB/s")


def test_each_field_names_the_key_of_its_record_path():
    assert field(MEASUREMENTS["checkpoint_throughput"]) == "GBps"
    assert field(MEASUREMENTS["raw_write"]) == "write_GBps"
