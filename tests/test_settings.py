"""The settings table and the resolved run: every bad value stops the run before any I/O, naming the value and the
fix; each value's origin is recorded; one row drives every place an option appears; one space check, with a fix."""

import argparse
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from types import UnionType
from typing import Union, get_args, get_origin, get_type_hints

import pytest

import ckptqual
from ckptqual.config.drive_file import load_drive_file
from ckptqual.config.run_settings import Options, RunSettings, SettingsError, resolve_settings
from ckptqual.config.space import check_space, space_needed
from ckptqual.config.table import SETTINGS, SettingValues, add_options, overlay, setting, table_of
from ckptqual.config.table import row as setting_row
from ckptqual.config.values import whole
from ckptqual.host import gpu
from suite_runs import load_once

pytest_plugins = ("pytester",)

ROOT = Path(ckptqual.__file__).parents[2]
LOCAL = str(ROOT / "thresholds" / "local.toml")


def resolve(**options) -> object:
    return resolve_settings(Options(**options))


def test_the_built_in_default_is_the_scaled_review_workload():
    settings = resolve()
    assert settings.thresholds.drive.name.startswith("local")
    assert settings.plan.workload == "llama3.1-405b-review"
    assert 0.75e9 < settings.plan.total_bytes < 0.85e9  # about 800 MB per checkpoint
    assert (settings.checkpoints_per_pass, settings.passes, settings.engine) == (3, 3, "stream")


def test_command_line_overrides_the_drive_file():
    settings = resolve(scale=0.0001, checkpoints_per_pass=2, passes=1, engine="torch-save", seed=5)
    assert (settings.scale, settings.checkpoints_per_pass, settings.passes, settings.engine, settings.seed) == (
        0.0001,
        2,
        1,
        "torch-save",
        5,
    )


def test_command_line_text_is_read_as_its_flag_reads_it():
    settings = resolve(scale="0.0001", passes="2", memory_budget_bytes="1G", keep=True, sweep_threads="8,2")
    assert (settings.scale, settings.passes, settings.memory_budget_bytes, settings.keep) == (0.0001, 2, 1 << 30, True)
    assert settings.sweep.threads == (8, 2)


def test_to_dict_records_where_every_value_came_from():
    data = resolve(scale="0.0001", seed=7).to_dict()
    assert {row.name for row in SETTINGS} <= set(data) and set(data["sources"]) == {row.name for row in SETTINGS}
    assert (data["scale"], data["sources"]["scale"]) == (0.0001, "command line")
    assert (data["passes"], data["sources"]["passes"]) == (3, LOCAL)
    assert (data["rank_timeout_s"], data["sources"]["rank_timeout_s"]) == (600.0, "default")
    assert (data["sweep_jobs"], data["sources"]["sweep_jobs"]) == (4, LOCAL)
    assert (data["drive"], data["thresholds_file"]) == ("local disk (no drive-specific thresholds)", LOCAL)
    assert data["sources"]["seed"] == "command line" and data["sources"]["memory_budget_bytes"] == "default"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": 0.0}, "--scale 0.0: must be a number with 0 < scale <= 1"),
        ({"scale": 1.5}, "--scale 1.5: must be a number with 0 < scale <= 1"),
        ({"scale": float("nan")}, "--scale nan"),
        ({"scale": "abc"}, "--scale 'abc': must be a number with 0 < scale <= 1"),
        ({"engine": "fio"}, "--engine 'fio': unknown engine; use one of stream, stream-direct, torch-save"),
        ({"drive": "d9-unknown"}, "unknown drive 'd9-unknown'; available: d5-p5336, d7-ps1010, dcp-async, local"),
        ({"workload": "gpt-17"}, "--workload: "),
        ({"checkpoints_per_pass": 0}, "--checkpoints-per-pass 0: must be a whole number >= 1"),
        ({"passes": -1}, "--passes -1: must be a whole number from 1 to 100"),
        ({"fill_fraction": 1.5}, "--fill-fraction 1.5: must be a number with 0 < fraction <= 1"),
        ({"rank_timeout_s": 0}, "--rank-timeout 0: must be a number >= 1 second(s)"),
        ({"rank_timeout_s": float("inf")}, "--rank-timeout inf: must be a number >= 1 second(s)"),
        ({"target": Path("/etc")}, "--target: target /etc is a system directory"),
        ({"passes": 1_000_000_000}, "--passes 1000000000: must be a whole number from 1 to 100"),
        ({"seed": -1}, "--seed -1: must be a whole number from 0 to 4294967295"),
        ({"seed": 2**32}, "--seed 4294967296: must be a whole number from 0 to 4294967295"),
        ({"layout_seed": -3}, "--layout-seed -3: must be a whole number from 0 to 4294967295"),
        ({"layout_examples": 10**9}, "--layout-examples 1000000000: must be a whole number from 0 to 10000"),
        ({"layout_max_total_bytes": "64MB"}, "--layout-max-bytes '64MB': must be a size in bytes"),
        ({"memory_budget_bytes": "0"}, "--memory-budget '0': must be a size in bytes"),
        ({"restore_checkpoints": 4}, "--restore-checkpoints 4: only 3 checkpoints are kept"),
        ({"workload": "llama3-1t", "scale": 1e-6}, "--workload llama3-1t: 1024 ranks, but this host can run at most"),
        ({"frobs": 3}, "unknown setting 'frobs'; known: drive, target"),
    ],
)
def test_bad_options_are_refused_with_value_and_fix(options, message):
    with pytest.raises(SettingsError) as error:
        resolve(**options)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_torch_save_refuses_files_over_the_memory_budget_up_front():
    with pytest.raises(SettingsError, match=r"--engine torch-save holds each file in memory: .* use --engine stream"):
        resolve(engine="torch-save", scale=0.001, memory_budget_bytes=100 << 20)


def test_a_fill_fraction_closer_to_the_user_than_a_count_decides(tmp_path):
    per_capacity = resolve(fill_fraction=0.5, scale=0.0001, target=tmp_path)
    assert per_capacity.sources["checkpoints_per_pass"] == "command line"
    assert per_capacity.checkpoints_per_pass > 3  # half of this disk holds more than three 0.17 GB checkpoints
    counted = resolve(fill_fraction=0.5, checkpoints_per_pass=2, scale=0.0001, target=tmp_path)
    assert counted.checkpoints_per_pass == 2


def test_the_odd_layouts_shrink_with_the_scale_but_not_below_the_judged_size():
    assert resolve().layout_max_total_bytes == 64 << 20  # local.toml's own scale: its 64 MiB
    assert resolve(scale=0.001).layout_max_total_bytes == 128 << 20  # twice local.toml's scale
    assert resolve(scale=0.0002).layout_max_total_bytes == int((64 << 20) * 0.4)
    assert resolve(scale=0.00001).layout_max_total_bytes == 16 << 20  # floored: smaller layouts are not judged
    given = resolve(scale=0.00001, layout_max_total_bytes="8M")
    assert (given.layout_max_total_bytes, given.sources["layout_max_total_bytes"]) == (8 << 20, "command line")


def test_a_results_path_that_is_a_directory_is_refused(tmp_path):
    with pytest.raises(SettingsError, match=r"--results .*: is a directory; give a file path"):
        resolve(results=tmp_path)


def test_a_results_path_in_a_missing_directory_is_refused(tmp_path):
    with pytest.raises(SettingsError, match=r"the directory .*nowhere does not exist; create it first"):
        resolve(results=tmp_path / "nowhere" / "r.json")


def test_a_results_path_on_a_read_only_filesystem_is_refused(tmpfs):
    read_only = tmpfs("ro,size=1m")
    with pytest.raises(SettingsError, match=r"is on a read-only filesystem; write the results elsewhere"):
        resolve(results=read_only / "r.json")


def test_a_results_path_where_no_file_can_be_created_is_refused_though_access_allows_it():
    # root may "write" /proc by access(); creating a file there fails, and the check tries it for real
    with pytest.raises(SettingsError, match=r"--results /proc/r.json: a file cannot be created in /proc \(create "):
        resolve(results=Path("/proc/r.json"))


def test_a_results_path_that_works_leaves_no_probe_behind(tmp_path):
    resolve(results=tmp_path / "r.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["results.json", ".ckptqual-target", "sub/r.json"])
def test_a_results_path_inside_the_target_is_refused(tmp_path, name):
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(SettingsError, match=r"lies inside the target .* write the results elsewhere"):
        resolve(target=target, results=target / name, scale=0.0001)
    assert list(target.iterdir()) == []


def test_a_layout_plan_with_a_file_name_too_long_for_the_filesystem_is_refused(tmp_path):
    from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
    from ckptqual.plan.planfile import dump_plan

    plan = CheckpointPlan("long", (RankPlan(0, (FilePlan("x" * 300 + ".pt", (TensorSpec("t", 8, "int8"),)),)),))
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    target = tmp_path / "target"
    target.mkdir()
    expected = r"has a name of 303 bytes, longer than the 255 that .* allows \(NAME_MAX\)"
    with pytest.raises(SettingsError, match=expected):
        resolve(layout_plan=path, scale=0.0001, target=target)


# One row drives every place an option appears


@dataclass(frozen=True, kw_only=True)
class WithFrobs(SettingValues):
    frobs: int = setting_row("--frobs", "run", whole(1), "2", "frobs per pass")


WITH_FROBS = table_of(WithFrobs)


def test_one_row_adds_the_flag_its_help_the_drive_file_key_and_the_overlay(tmp_path):
    assert WITH_FROBS[:-1] == SETTINGS and WITH_FROBS[-1].name == "frobs"
    parser = argparse.ArgumentParser()
    add_options(parser.add_argument, WITH_FROBS)
    assert parser.parse_args(["--frobs", "5"]).frobs == "5" and parser.parse_args([]).frobs is None
    assert "frobs per pass (default: the drive file's [run] frobs, else 2)" in " ".join(parser.format_help().split())
    drive = tmp_path / "frobbing.toml"
    drive.write_text('[drive]\nname = "frobbing"\n[run]\nfrobs = 7\n')
    assert load_drive_file(str(drive), WITH_FROBS).values == {"frobs": 7}
    with pytest.raises(SettingsError, match=r"run.frobs: unknown key; allowed: .*; remove it from \[run\]$"):
        load_drive_file(str(drive))  # the shipped table has no such row
    picked = [
        overlay(options, load_drive_file(name, WITH_FROBS).values, "the drive file", WITH_FROBS)
        for options, name in (({"frobs": "5"}, str(drive)), ({}, str(drive)), ({}, "local"))
    ]
    assert [(values["frobs"], sources["frobs"]) for values, sources in picked] == [
        (5, "command line"),
        (7, "the drive file"),
        (2, "default"),
    ]
    drive.write_text('[drive]\nname = "frobbing"\n[run]\nfrobs = 0\n')
    with pytest.raises(SettingsError, match=r"frobbing.toml: run.frobs = 0: must be a whole number >= 1"):
        load_drive_file(str(drive), WITH_FROBS)
    with pytest.raises(SettingsError, match=r"^--frobs 'many': must be a whole number >= 1$"):
        overlay({"frobs": "many"}, {}, "the drive file", WITH_FROBS)


def conforms(value: object, hint: object) -> bool:
    """Whether `value` is of the type `hint` (a class, X | None, or tuple[X, ...]), checked to the items."""
    if get_origin(hint) in (Union, UnionType):
        return any(conforms(value, option) for option in get_args(hint))
    if get_origin(hint) is tuple:
        return isinstance(value, tuple) and all(conforms(item, get_args(hint)[0]) for item in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, float)
    assert isinstance(hint, type), hint
    return isinstance(value, hint) and not (hint is int and isinstance(value, bool))


TYPES = get_type_hints(SettingValues)


def test_each_setting_is_a_typed_attribute_whose_type_its_row_gives(tmp_path):
    """The table and the typed attributes agree: a field per row, in order; each row's default and each resolved
    value (all defaults, and most settings given on the command line) of the field's declared type."""
    assert [row.field_name for row in SETTINGS] == [spec.name for spec in fields(SettingValues)] == list(TYPES)
    assert not hasattr(RunSettings, "__getattr__")
    for row in SETTINGS:
        if row.default is not None:
            assert conforms(row.default_value(), TYPES[row.field_name]), row.name
        elif row.unset == "none":  # left unset, the value is None: the field must allow it
            assert conforms(None, TYPES[row.field_name]), row.name
    target, results = tmp_path / "target", tmp_path / "out"
    target.mkdir()
    results.mkdir()
    given = {
        "target": target, "workload": "llama3.1-405b-dcp", "scale": "0.0001", "restore_layout": "8x1",
        "fill_fraction": "0.001", "passes": "2", "results": results / "r.json", "report_dir": results / "report",
        "keep": True, "rank_timeout_s": "60", "memory_budget_bytes": "1G", "seed": "3", "sample_interval_s": "0.5",
        "checkpoint_interval_s": "0", "async_save": True, "early_stop": True, "layout_examples": "2",
        "sweep_threads": "4,1", "sweep_file_bytes": "4M", "sweep_transfers": "cpu-only", "secret_file": results / "s",
    }  # fmt: skip
    for run in (resolve(scale=0.0001), resolve(**given)):
        wrong = {row.name: getattr(run, row.field_name) for row in SETTINGS}
        wrong = {name: value for name, value in wrong.items() if not conforms(value, TYPES[setting(name).field_name])}
        assert wrong == {}
        assert run.values == {row.name: getattr(run, row.field_name) for row in SETTINGS}
        assert set(run.sources) == set(run.values)
    assert run.sources["fill_fraction"] == "command line" and run.seed == 3 and run.restore_layout == "8x1"
    assert run.workload_name == "llama3.1-405b-dcp" and run.workload.name == "llama3.1-405b-dcp"


@pytest.fixture
def pytest_run(request) -> tuple[pytest.Pytester, Callable[..., pytest.RunResult]]:
    """This test's pytester, and pytest run in this process in its directory with only ckptqual's options plugin
    (the rest of the plugin is not needed), not as an xdist worker."""
    load_once()  # before pytester is made: it restores sys.modules as it found them
    pytester: pytest.Pytester = request.getfixturevalue("pytester")

    def run(*args: str) -> pytest.RunResult:
        with pytest.MonkeyPatch.context() as patch:
            for name in [name for name in os.environ if name.startswith("PYTEST_XDIST")]:
                patch.delenv(name)
            options = ["-p", "no:cacheprovider", "-p", "no:ckptqual", "-p", "ckptqual.pytest_plugin.options"]
            # its rootdir, as a user's run in it has (-k matches the names of the directories above a test)
            return pytester.runpytest_inprocess(*options, f"--rootdir={pytester.path}", *args)

    return pytester, run


def test_pytest_help_shows_every_option_with_its_default_and_origin(pytest_run):
    child = pytest_run[1]("--help")
    assert child.ret == 0, child.errlines
    help_text = " ".join(" ".join(child.outlines).split())
    for row in (row for row in SETTINGS if row.flag):
        assert f"{row.help_text()}" in help_text, row.name
    scale = (
        "--scale=SCALE shrink every tensor (and the odd layouts) by this factor, 0 < S <= 1, and not so far that "
        "the checkpoint holds less than one 4K block per file"
    )
    assert f"{scale} (default: the drive file's [run] scale, else 1.0)" in help_text
    assert (
        "--target=TARGET directory on the drive under test, empty or ckptqual's own; give it several times, or once "
        "with a file listing a drive file and a mount point per line, to qualify several drives (default: a fresh"
    ) in help_text


# The space check

NEW_USER = {"drive": "d5-p5336", "scale": "0.001"}  # a review drive file scaled down, as a new user would try first
ALL_PARTS = {"fill", "sweep", "layouts"}


def fix_of(message: str) -> dict[str, str]:
    """The options a refusal suggests, by setting name."""
    flags = {row.flag: row.name for row in SETTINGS if row.flag}
    found = re.search(r"; use ((?:--[\w-]+ \S+ ?)+) \(then", message)
    assert found is not None, message
    advice = found.group(1)
    return {flags[flag]: value for flag, value in re.findall(r"(--[\w-]+) (\S+)", advice)}


def test_a_new_user_on_a_12_GB_target_gets_one_refusal_whose_fix_fits_the_whole_run(tmp_path):
    run = resolve_settings({**NEW_USER, "target": tmp_path})
    with pytest.raises(SettingsError) as refusal:
        check_space(run, ALL_PARTS, free_bytes=12 * 10**9)
    message = str(refusal.value)
    assert "\n" not in message
    assert "the target has 12.000 GB free" in message
    for part in ("raw baseline 1.636 GB", "fill 54.", "33 checkpoints of 1.6", "read sweep 17.180 GB: 16 files of 1G"):
        assert part in message
    assert "odd layouts 0.034 GB" in message  # 4 GiB at the file's scale 1.0, x 0.001, floored at 16 MiB, twice
    fixed = resolve_settings({**NEW_USER, "target": tmp_path, **fix_of(message)})
    check_space(fixed, ALL_PARTS, free_bytes=12 * 10**9)  # does not raise
    assert space_needed(fixed, ALL_PARTS).total <= 12 * 10**9


@pytest.mark.parametrize(
    ("parts", "free_bytes", "fix"),
    [
        ({"fill"}, 20 * 10**9, "--checkpoints-per-pass 12"),  # fewer checkpoints first
        ({"fill"}, 4 * 10**9, "--checkpoints-per-pass 3 --scale 0.00079"),  # then a smaller scale
        ({"fill", "sweep"}, 12 * 10**9, "--checkpoints-per-pass 3 --sweep-file-bytes 256M"),
        ({"sweep"}, 2 * 10**9, "--sweep-file-bytes 64M"),  # the sweep's files do not shrink with the scale
    ],
)
def test_the_fix_changes_the_first_thing_that_makes_the_run_fit(tmp_path, parts, free_bytes, fix):
    run = resolve_settings({**NEW_USER, "target": tmp_path})
    with pytest.raises(SettingsError, match=f"; use {fix} \\(then the run needs") as refusal:
        check_space(run, parts, free_bytes=free_bytes)
    check_space(resolve_settings({**NEW_USER, "target": tmp_path, **fix_of(str(refusal.value))}), parts, free_bytes)


def test_a_run_that_fits_nowhere_is_told_to_use_a_larger_target(tmp_path):
    with pytest.raises(SettingsError, match=r"GB free \(.*\); use a larger target$"):
        check_space(resolve_settings({"target": tmp_path}), ALL_PARTS, free_bytes=1 << 20)


def test_only_the_parts_that_run_count(tmp_path):
    run = resolve_settings({**NEW_USER, "target": tmp_path})
    need = space_needed(run, {"fill"})
    assert (need.sweep, need.layouts) == (0, 0) and need.fill > 0
    assert space_needed(run, set()).total == run.baseline_bytes + (8 << 20)  # the baseline always runs
    assert space_needed(run, ALL_PARTS).total == need.fill + run.sweep.files_bytes + (8 << 20)


def test_a_real_small_target_is_refused_before_any_write_and_the_fix_fits_it(tmpfs):
    small = tmpfs("size=1g")
    with pytest.raises(SettingsError, match=r"GB free \(.*\); use --sweep-file-bytes 64M --scale") as refusal:
        check_space(resolve(target=small), ALL_PARTS)
    assert list(small.iterdir()) == []
    check_space(resolve(target=small, **fix_of(str(refusal.value))), ALL_PARTS)


# Which parts run: the selected tests and the transfer types this host can run (a real pytest child, -k and all)

SPACE_CONFTEST = """
import pytest
from ckptqual.pytest_plugin.options import settings
from ckptqual.runs.sweep.cells import plan_cells

def pytest_configure(config):
    config.addinivalue_line("markers", "qualification: a check of the qualification suite")

def pytest_generate_tests(metafunc):
    if "sweep_cell" in metafunc.fixturenames:
        cells = plan_cells(settings(metafunc.config).sweep)
        metafunc.parametrize("sweep_cell", cells, ids=[cell.id for cell in cells])

@pytest.fixture
def fill_pass():
    return 1

@pytest.fixture
def layout_strategy():
    return None
"""
SPACE_TESTS = """
import pytest

pytestmark = pytest.mark.qualification

def test_fill(fill_pass): pass
def test_restore(): pass
def test_read_sweep(sweep_cell): pass
def test_shard_layouts(layout_strategy): pass
"""


@pytest.fixture
def suite(pytest_run, tmpfs) -> tuple[Callable[..., pytest.RunResult], list[str]]:
    """A qualification-shaped suite whose target holds the fill (3 x 0.17 GB) but not the fill and the sweep's
    files (4 x 256 MiB) at once; the layouts (2 x 16 MiB) fit beside the fill. Run in this process (pytester)."""
    pytester, run = pytest_run
    pytester.makeconftest(SPACE_CONFTEST)
    pytester.makepyfile(test_suite=SPACE_TESTS)
    target = tmpfs("size=1g")
    return run, ["--target", str(target), "--scale", "0.0001", "--collect-only", "-q"]


def output(child: pytest.RunResult) -> str:
    return "\n".join([*child.outlines, *child.errlines])


def test_the_sweeps_files_are_refused_when_they_do_not_fit(suite):
    run, options = suite
    child = run(*options)
    assert child.ret == pytest.ExitCode.USAGE_ERROR, output(child)
    errors = "\n".join(child.errlines)
    assert "read sweep 1.074 GB: 4 files of 256M" in errors and "; use --" in errors


def test_fill_or_restore_is_not_refused_for_the_sweeps_or_the_layouts_space(suite):
    run, options = suite
    child = run(*options, "-k", "fill or restore", "--layout-max-bytes", "1G")
    assert child.ret == pytest.ExitCode.OK, output(child)
    assert "2/30 tests collected (28 deselected)" in "\n".join(child.outlines)


def test_gpu_direct_cells_are_not_counted_on_a_host_without_a_gpu(suite):
    run, options = suite
    runnable = gpu.probe().problem("gpu-direct") is None
    child = run(*options, "--transfer", "gpu-direct")
    # Refused either way: with a GPU its cells' files do not fit; without one the required sweep has nothing to run.
    assert child.ret == pytest.ExitCode.USAGE_ERROR, output(child)
    assert ("read sweep" if runnable else "none can run on this host") in "\n".join(child.errlines)
    counted = run(*options, "--transfer", "gpu-direct,cpu-only")
    assert counted.ret == pytest.ExitCode.USAGE_ERROR, output(counted)
