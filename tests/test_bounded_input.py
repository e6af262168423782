"""Data files within bounds: a plan's JSON, a drive's or a workload's TOML nested too deep, holding a number too
long or too large, or a plan too large to build, is refused in one line naming the key (or the line) before any
arithmetic on it; a plan file name that cannot be printed or encoded is refused too."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ckptqual.bounded import MAX_DEPTH, load_json, load_toml
from ckptqual.cli import main
from ckptqual.config.run_settings import SettingsError, resolve_settings
from suite_runs import REPO, SMALL

pytest_plugins = ("pytester",)

WORKLOAD = (REPO / "fixtures" / "workloads" / "llama3-8b.toml").read_text()
FILES = [{"path": "a.pt", "tensors": [["t", 8192, "int8"]]}]
PLAN = {"format": "ckptqual-plan", "version": 1, "workload": "w", "description": "d", "scale": 1.0, "parallelism": {}}
PLAN["ranks"] = [{"rank": 0, "files": FILES}]


def refusal(**options) -> str:
    """The one-line refusal of these settings."""
    with pytest.raises(SettingsError) as error:
        resolve_settings({"scale": 0.0001, **options})
    assert "\n" not in str(error.value)
    return str(error.value)


def workload(tmp_path: Path, layers: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(WORKLOAD.replace("layers = 32", f"layers = {layers}"))
    return path


def drive(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "d.toml"
    path.write_text((REPO / "thresholds" / "local.toml").read_text() + extra)
    return path


def test_nesting_deeper_than_the_bound_is_refused_before_a_parser_recurses(tmp_path):
    deep = "[" * 5000 + "]" * 5000
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN).replace('"parallelism": {}', f'"parallelism": {deep}'))
    assert f"line 1 (parallelism): nests deeper than {MAX_DEPTH} levels" in refusal(layout_plan=plan)
    toml = f"\nnested = {deep}\n"
    assert f"line 6 (nested): nests deeper than {MAX_DEPTH} levels" in refusal(workload=str(workload(tmp_path, toml)))
    message = refusal(drive=str(drive(tmp_path, f"\n[[limit]]\nname = {deep}\n")))
    assert "(name): nests deeper than" in message
    dotted = ".".join(["k"] * 2000) + " = 1"
    assert f"nests deeper than {MAX_DEPTH} levels" in refusal(drive=str(drive(tmp_path, f"\n[x]\n{dotted}\n")))


def test_a_number_of_thousands_of_digits_is_refused_naming_its_key(tmp_path):
    message = refusal(workload=str(workload(tmp_path, "9" * 5000)))
    assert "w.toml: line 5 (layers): a number of 5000 digits; give one of at most 30" in message
    assert "set_int_max_str_digits" not in message
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN).replace("8192", "1" * 5000))
    assert "line 1 (tensors): a number of 5000 digits" in refusal(layout_plan=plan)


def test_a_number_beyond_any_real_value_is_refused_naming_its_key_path(tmp_path):
    limit = '\n[[limit]]\nname = "fill_throughput"\nmin = 1e308\nunit = "GB/s"\nsource = "x"\n'
    message = refusal(drive=str(drive(tmp_path, limit)))
    assert "limit[" in message and "].min: 1e+308 is beyond 1e+18; give a real value" in message
    assert "0" * 30 not in message
    assert "model.layers: 1.000e+20 is beyond 1e+18" in refusal(workload=str(workload(tmp_path, "9" * 20)))


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fails what runs inside (in this process) if it takes longer than `seconds`: SIGALRM raises in it."""

    def too_long(signum, frame):
        raise AssertionError(f"not done within {seconds} s")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_workload_too_large_to_plan_is_refused_at_once_by_the_cli_and_the_suite(tmp_path, capsys, suite_in_process):
    """`layers` that would make billions of files: refused before the plan is built (it used to spin a CPU). The
    CLI and the suite answer in this process."""
    path = workload(tmp_path, "1_000_000_000")
    with within(120):
        assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "model.layers and parallelism: 1,000,000,000 layers over 8 ranks make a plan of up to" in err
    target = tmp_path / "target"
    target.mkdir()
    huge = workload(tmp_path, "99999999999999999999")
    with within(300):
        run = suite_in_process(*SMALL, "--workload", str(huge), "--target", str(target))
    output = "\n".join([*run.outlines, *run.errlines])
    assert run.ret == 4, output[-4000:]
    assert "model.layers: 1.000e+20 is beyond 1e+18" in "\n".join(run.errlines) and "Traceback" not in output
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("name", ["\ud800.pt", "a\nb.pt", "\x1b[2K.pt"])
def test_a_plan_file_name_that_cannot_be_printed_or_encoded_is_refused(tmp_path, name):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**PLAN, "ranks": [{"rank": 0, "files": [{"path": name, "tensors": []}]}]}))
    message = refusal(layout_plan=plan)
    assert "ranks[0].files[0].path: must be printable UTF-8 text" in message


def test_the_bounded_parsers_read_what_the_shipped_files_hold():
    for path in [*(REPO / "fixtures" / "workloads").glob("*.toml"), *(REPO / "thresholds").glob("*.toml")]:
        load_toml(path.read_text())
    assert load_json('{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "n": 1e18}') == {
        "a": "[" * 44,
        "n": 1e18,
    }
