"""Options over the threshold file: every bad value stops the run before any I/O, naming the value and the fix."""

from pathlib import Path

import pytest

from ckptqual.config.run_settings import Options, SettingsError, resolve_settings


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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": 0.0}, "--scale 0.0: must be a number with 0 < scale <= 1"),
        ({"scale": 1.5}, "--scale 1.5: must be a number with 0 < scale <= 1"),
        ({"scale": float("nan")}, "--scale nan"),
        ({"engine": "fio"}, "--engine 'fio': unknown engine; use one of stream, torch-save"),
        ({"drive": "d9-unknown"}, "unknown drive 'd9-unknown'; available: d5-p5336, d7-ps1010, local"),
        ({"workload": "gpt-17"}, "--workload: "),
        ({"checkpoints_per_pass": 0}, "--checkpoints-per-pass 0: must be a whole number >= 1"),
        ({"passes": -1}, "--passes -1: must be a whole number >= 1"),
        ({"fill_fraction": 1.5}, "--fill-fraction 1.5: must be a number with 0 < fraction <= 1"),
        ({"rank_timeout_s": 0}, "--rank-timeout 0: must be a number > 0 seconds"),
        ({"rank_timeout_s": float("inf")}, "--rank-timeout inf: must be a number > 0 seconds"),
        ({"target": Path("/etc")}, "--target: target /etc is a system directory"),
        ({"passes": 1_000_000_000}, "--passes 1000000000: at most 100"),
        ({"seed": -1}, "--seed -1: must be a whole number from 0 to 4294967295"),
        ({"seed": 2**32}, "--seed 4294967296: must be a whole number from 0 to 4294967295"),
        ({"layout_seed": -3}, "--layout-seed -3: must be a whole number from 0 to 4294967295"),
        ({"layout_examples": 10**9}, "--layout-examples 1000000000: must be a whole number from 0 to 10000"),
        ({"workload": "llama3-1t", "scale": 1e-6}, "--workload llama3-1t: 1024 ranks, but this host can run at most"),
    ],
)
def test_bad_options_are_refused_with_value_and_fix(options, message):
    with pytest.raises(SettingsError, match=None) as error:
        resolve(**options)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_torch_save_refuses_files_over_the_memory_budget_up_front():
    with pytest.raises(SettingsError, match=r"--engine torch-save holds each file in memory: .* use --engine stream"):
        resolve(engine="torch-save", scale=0.001, memory_budget_bytes=100 << 20)


def test_full_scale_review_on_stream_needs_no_memory_but_space(tmp_path):
    expected = r"the fill needs 4,907.\d+ GB \(3 checkpoints of 1,635.\d+ GB \+ 0.008 GB reserve\) .* use --scale"
    with pytest.raises(SettingsError, match=expected):
        resolve(scale=1.0, target=tmp_path)


def test_a_target_too_small_for_the_plan_is_refused_before_any_write(tmpfs):
    small = tmpfs("size=64m")
    with pytest.raises(SettingsError, match=r"GB free; use --checkpoints-per-pass|GB free; use --scale"):
        resolve(target=small)
    assert list(small.iterdir()) == []


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
