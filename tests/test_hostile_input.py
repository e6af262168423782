"""Mistaken or hostile input is refused before any I/O, in one line with the fix, never with a traceback: outputs
that collide, a report directory where nothing can be made, values that cannot measure anything, data files that
are not regular files or not UTF-8, plan file names that are ckptqual's own, a target short of inodes."""

import os
from pathlib import Path

import pytest

from ckptqual.config.outputs import check_apart
from ckptqual.config.run_settings import RESERVED_NAMES, SettingsError, resolve_settings
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.planfile import dump_plan
from suite_runs import SMALL

pytest_plugins = ("pytester",)

USAGE_ERROR = 4


def refused(done: pytest.RunResult, message: str) -> str:
    """The one ERROR line of a suite run (in process: suite_in_process) refused as a usage error, checked: exit 4,
    the line on stderr, no traceback."""
    output = "\n".join([*done.outlines, *done.errlines])
    assert done.ret == USAGE_ERROR, output[-3000:]
    errors = [line for line in done.errlines if line.startswith("ERROR: ")]
    assert len(errors) == 1 and message in errors[0], output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
    return errors[0]


def refusal(**options) -> str:
    """The one-line refusal of these settings."""
    with pytest.raises(SettingsError) as error:
        resolve_settings({"scale": 0.0001, **options})
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "target"
    path.mkdir()
    return path


# Outputs


@pytest.mark.parametrize("link", ["same path", "hard link"])
def test_results_and_junitxml_naming_one_file_are_refused(tmp_path, target, link, suite_in_process):
    results, junit = tmp_path / "out.json", tmp_path / ("out.json" if link == "same path" else "out.xml")
    results.write_text("kept")
    if link == "hard link":
        os.link(results, junit)
    done = suite_in_process(*SMALL, "--target", str(target), "--results", str(results), "--junitxml", str(junit))
    refused(done, f"--results {results}: is the same file as --junitxml {junit}; give each its own file")
    assert list(target.iterdir()) == [] and results.read_text() == "kept"


def test_a_junitxml_inside_the_target_is_refused_and_not_written_there(target, suite_in_process):
    junit = target / "qual.xml"
    refused(suite_in_process(*SMALL, "--target", str(target), "--junitxml", str(junit)), "lies inside the target")
    assert list(target.iterdir()) == []  # the next run would refuse the target as foreign


def test_a_report_dir_where_no_file_can_be_made_is_refused():
    message = refusal(report_dir=Path("/proc/rep"))
    assert message.startswith("--report-dir /proc/rep: a file cannot be created in /proc (create ")
    assert message.endswith("; write the report elsewhere")


def test_a_report_dir_inside_the_target_is_refused_with_the_settings(target):
    message = refusal(target=target, report_dir=target / "report")
    assert message.startswith(f"--report-dir {target / 'report'}: lies inside the target {target}")
    assert list(target.iterdir()) == []


def test_results_inside_the_report_dir_or_on_an_input_are_refused(tmp_path):
    report = tmp_path / "report"
    report.mkdir()
    run = resolve_settings({"scale": 0.0001, "results": report / "r.json", "report_dir": report})
    with pytest.raises(SettingsError, match=r"--results .*r.json: lies inside --report-dir .*report, whose files"):
        check_apart(None, [run])
    with pytest.raises(SettingsError, match=r"--junitxml .*: is the same file as the drive file .*local.toml"):
        check_apart(run.thresholds.path, [resolve_settings({"scale": 0.0001})])


# Values that cannot measure anything


def test_a_rank_timeout_shorter_than_any_checkpoint_is_refused():
    assert refusal(rank_timeout_s="1e-9") == "--rank-timeout '1e-9': must be a number >= 1 second(s), e.g. 600"


def test_more_sweep_threads_than_a_sweep_can_use_are_refused():
    assert refusal(sweep_threads="16,100000").endswith("item 2: must be a whole number from 1 to 4096")


def test_a_scale_at_which_the_files_hold_less_than_a_block_is_refused():
    message = refusal(workload="llama3-8b", scale="1e-300")
    assert message == (
        "--scale 1e-300 (command line): the workload llama3-8b's 16 files would hold less than one 4K block each, "
        "too little to time a write or a read; use --scale 7e-07 or more"
    )
    resolve_settings({"workload": "llama3-8b", "scale": "7e-07"})  # the bound it names is accepted


# Data files: only regular files of bounded size, of UTF-8, under UTF-8 names


@pytest.fixture
def data_files(tmp_path) -> dict[str, Path]:
    """A FIFO, a directory, a symlink to a FIFO, a file too large, one not UTF-8 and a character device."""
    os.mkfifo(tmp_path / "fifo.toml")
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "link.toml").symlink_to(tmp_path / "fifo.toml")
    with (tmp_path / "huge.toml").open("wb") as huge:
        huge.truncate(64 << 20)  # sparse: larger than any data file, costs no space
    (tmp_path / "latin1.toml").write_bytes(b'description = "caf\xe9"\n')
    return {
        "fifo": tmp_path / "fifo.toml",
        "directory": tmp_path / "dir.toml",
        "symlink": tmp_path / "link.toml",
        "huge": tmp_path / "huge.toml",
        "latin1": tmp_path / "latin1.toml",
        "device": Path("/dev/zero"),
    }


PROBLEMS = {
    "fifo": "is a FIFO, not a regular file; give a regular file",
    "directory": "is a directory, not a regular file; give a regular file",
    "symlink": "is a FIFO, not a regular file; give a regular file",
    "huge": "is larger than",
    "latin1": "is not UTF-8 text (byte 18 is 0xe9); fix its encoding",
    "device": "is a character device, not a regular file; give a regular file",
}


@pytest.mark.parametrize("option", ["layout_plan", "workload", "drive"])
@pytest.mark.parametrize("kind", PROBLEMS)
def test_a_data_file_that_is_not_a_small_regular_utf8_file_is_refused(data_files, option, kind):
    message = refusal(**{option: str(data_files[kind])})
    assert PROBLEMS[kind] in message, message


def test_a_symlink_to_a_drive_file_is_read_as_that_file(tmp_path):
    """A user's own link to a data file is theirs to make: what counts is the file the descriptor opened."""
    link = tmp_path / "mine.toml"
    link.symlink_to(Path("thresholds/local.toml").resolve())
    linked, named = (resolve_settings({"drive": drive}).thresholds.drive for drive in (str(link), "local"))
    assert linked == named


def test_a_fifo_layout_plan_is_refused_by_the_suite_at_once(data_files, target, suite_in_process):
    done = suite_in_process(*SMALL, "--target", str(target), "--layout-plan", str(data_files["fifo"]))
    refused(done, "is a FIFO, not a regular file")
    assert list(target.iterdir()) == []


def test_a_name_that_is_not_utf8_is_refused_in_one_line(tmp_path, target, suite_in_process):
    name = os.fsdecode(bytes(tmp_path) + b"/plan-\xff.json")  # as Python holds such a name: a lone surrogate
    done = suite_in_process(*SMALL, "--target", str(target), "--layout-plan", name)
    refused(done, "must be a path of valid UTF-8 (rename a file or directory whose name is not)")
    assert list(target.iterdir()) == []


# Plan file names that are ckptqual's own


@pytest.mark.parametrize("name", [*RESERVED_NAMES, ".ckptqual-run.tmp-42"])
def test_a_plan_file_named_like_ckptquals_own_entries_is_refused(tmp_path, name):
    own = name.split(".tmp-")[0]
    plan = CheckpointPlan("x", (RankPlan(0, (FilePlan(f"sub/{name}", (TensorSpec("t", 8192, "int8"),)),)),))
    path = tmp_path / "plan.json"
    path.write_text(dump_plan(plan))
    message = refusal(layout_plan=path)
    assert f"file 'sub/{name}' uses the name {own}, which ckptqual keeps for its own" in message
    assert message.endswith("; rename it")


# Inodes


def test_a_target_without_the_inodes_the_run_needs_is_refused_before_any_io(loop_ext4, suite_in_process):
    disk = loop_ext4("200M", mkfs=("-N", "64"))  # ext4 rounds up: about 190 free inodes
    target = disk / "target"
    target.mkdir()
    free = os.statvfs(target).f_favail
    # the review workload: 536 files a checkpoint; a few MB of bytes, far more inodes than the disk has
    done = suite_in_process("--scale", "0.00001", "--passes", "1", "--target", str(target), "--benchmark-disable")
    line = refused(done, f"the run needs 1,620 inodes (files and directories; 3 checkpoints of 537) but the target "
                         f"has {free:,} free (df -i)")  # fmt: skip
    assert "a filesystem with more inodes" in line
    assert list(target.iterdir()) == []
