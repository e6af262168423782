"""Progress as a person follows it: one live line redrawn on a terminal, plain lines (one per checkpoint) where the
output is not a terminal (a pipe, a CI log); tested on the view itself and on the real suite in a pipe and in tmux."""

import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ckptqual.config.run_settings import resolve_settings
from ckptqual.report.progress import Progress, duration
from suite_runs import REPO, lenient_drive, results, run_suite, suite_command


def suite_args(tmp_path: Path, scale: str) -> list[str]:
    """Two ranks (LLaMA 3 8B at DP2), so that the suite starts fast; 2 passes of 3 checkpoints of `scale`."""
    drive = lenient_drive(tmp_path / "drive.toml", "progress test drive")
    (tmp_path / "target").mkdir()
    return [
        f"--drive={drive}", "--workload=llama3-8b-dp2", f"--scale={scale}", "--checkpoints-per-pass=3", "--passes=2",
        "--sample-interval=0.2", f"--target={tmp_path / 'target'}", f"--results={tmp_path / 'results.json'}",
    ]  # fmt: skip


class Screen:
    """What a terminal would be told: lines said, and the live line's redraws ("" clears it), in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def say(self, line: str) -> None:
        self.calls.append(("say", line))

    def redraw(self, text: str) -> None:
        self.calls.append(("redraw", text))


@pytest.fixture
def settings():
    return resolve_settings({"scale": "0.001", "checkpoints_per_pass": "3", "passes": "2"})


def checkpoint(settings, pass_number: int, index: int) -> dict:
    nbytes = settings.plan.total_bytes
    return {"pass_number": pass_number, "index": index, "checkpoint": index - 1, "seconds": 2.0, "bytes": nbytes,
            "GBps": nbytes / 2e9, "first_done_s": 1.0}  # fmt: skip


def sample(written: int, write_MBps: float = 1500.0, devices: bool = True) -> dict:
    disks = {"nvme0n1": {"write_MBps": write_MBps / 2}, "nvme1n1": {"write_MBps": write_MBps / 2}} if devices else {}
    return {"t_s": 0, "devices": disks, "suite_written_bytes": written, "suite_write_MBps": 700.0}


def one_pass(progress: Progress, settings, clock: list[float]) -> None:
    nbytes = settings.plan.total_bytes
    progress.sample(sample(1000))
    progress.fill_started(1)
    for index in (1, 2, 3):
        clock[0] += 1
        progress.sample(sample(1000 + (index - 1) * nbytes + nbytes // 2))
        clock[0] += 1
        progress.checkpoint(checkpoint(settings, 1, index), 3)
    progress.fill_ended(1)
    progress.fill_pass({"pass": 1, "bytes": 3 * nbytes}, clock[0])


def test_without_a_terminal_only_plain_lines(settings):
    screen, clock = Screen(), [0.0]
    one_pass(Progress(settings, screen.say, None, clock=lambda: clock[0]), settings, clock)
    assert [kind for kind, _ in screen.calls] == ["say"] * 3
    assert [line.split(":")[1] for _, line in screen.calls] == [" pass 1 checkpoint 1/3", *(
        f" pass 1 checkpoint {i}/3" for i in (2, 3))]  # fmt: skip
    assert not any("\r" in line for _, line in screen.calls)


def test_on_a_terminal_the_live_line_says_bytes_rate_checkpoint_and_time_left(settings):
    screen, clock = Screen(), [0.0]
    progress = Progress(settings, screen.say, screen.redraw, clock=lambda: clock[0])
    nbytes = settings.plan.total_bytes
    progress.sample(sample(1000))
    progress.fill_started(1)
    clock[0] = 10.0
    progress.sample(sample(1000 + nbytes // 2))  # half a checkpoint in 10 s: 3 checkpoints take 60 s
    kind, text = screen.calls[-1]
    assert kind == "redraw"
    total_GB = 2 * 3 * nbytes / 1e9
    assert text == (
        f"ckptqual: pass 1/2 ckpt 1/3 | {nbytes // 2 / 1e9:,.2f} of {total_GB:,.2f} GB | "
        "left: pass 0:00:50, run 0:01:50 | drive 1.50 GB/s"
    )


def test_a_checkpoint_line_is_printed_above_the_live_line_and_the_pass_end_clears_it(settings):
    screen, clock = Screen(), [0.0]
    one_pass(Progress(settings, screen.say, screen.redraw, clock=lambda: clock[0]), settings, clock)
    said = [index for index, (kind, _) in enumerate(screen.calls) if kind == "say"]
    assert len(said) == 3
    for index in said:  # cleared before, drawn again after, with the checkpoint counted
        assert screen.calls[index - 1] == ("redraw", "") and screen.calls[index + 1][0] == "redraw"
    assert "ckpt 2/3" in screen.calls[said[0] + 1][1]
    assert screen.calls[-1] == ("redraw", "")


def test_a_pass_that_fails_clears_the_live_line_too(settings):
    screen, clock = Screen(), [0.0]
    progress = Progress(settings, screen.say, screen.redraw, clock=lambda: clock[0])
    progress.fill_started(1)
    progress.sample(sample(5))
    progress.fill_ended(1)  # no fill_pass: the pass raised
    progress.sample(sample(10))
    assert screen.calls[-1] == ("redraw", "")


def test_the_rate_falls_back_to_the_ranks_then_the_last_checkpoint(settings):
    screen, clock = Screen(), [0.0]
    progress = Progress(settings, screen.say, screen.redraw, clock=lambda: clock[0])
    progress.fill_started(2)
    assert "last checkpoint ? GB/s" in screen.calls[-1][1] and "left: pass ?, run ?" in screen.calls[-1][1]
    progress.sample(sample(5, devices=False))
    assert "written 0.70 GB/s" in screen.calls[-1][1]


def test_durations():
    assert [duration(s) for s in (None, 0, 59.6, 3600 * 25 + 61)] == ["?", "0:00:00", "0:01:00", "25:01:01"]


def test_in_a_pipe_the_suite_prints_one_line_per_checkpoint_and_records_the_time_series(tmp_path):
    run = run_suite(*suite_args(tmp_path, "0.0002"), "-q")  # 22 MB checkpoints: lines and samples, not a live line
    assert run.returncode in (0, 1), run.stdout + run.stderr  # the verdict may be INCOMPLETE (-k fill)
    lines = run.stdout.splitlines()
    for number in (1, 2):
        for index in (1, 2, 3):
            assert sum(f"ckptqual: pass {number} checkpoint {index}/3:" in line for line in lines) == 1
    assert "\r" not in run.stdout and "\x1b[K" not in run.stdout and "left: pass" not in run.stdout
    series = results(tmp_path / "results.json")["timeseries"]
    marks = [(m["pass"], m["checkpoint"]) for m in series["marks"] if m["event"] == "checkpoint"]
    assert marks == [(p, c) for p in (1, 2) for c in (1, 2, 3)]
    assert series["samples"] and series["samples"][-1]["suite_written_bytes"] > 0
    json.dumps(series)


def tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_on_a_terminal_one_live_line_is_redrawn_in_place(tmp_path):
    """In tmux (a real terminal), as a person sees the screen: while a pass runs, exactly one live line; at the end,
    every checkpoint's line once and nothing left of the live line."""
    socket = f"ckptqual-test-{tmp_path.name}"
    command = ["env", "-u", "COLUMNS", "-u", "LINES"]  # as a person's shell: the width is the terminal's
    command += ["-u", "PYTEST_XDIST_WORKER", "-u", "PYTEST_XDIST_TESTRUNUID", "-u", "PYTEST_XDIST_WORKER_COUNT"]
    command += [*suite_command(*suite_args(tmp_path, "0.002"), "-q")]  # 225 MB checkpoints: passes long enough to see
    shell = f"cd {shlex.quote(str(REPO))} && {shlex.join(command)}; echo CKPTQUAL-EXIT=$?; sleep 600"
    tmux(socket, "new-session", "-d", "-x", "220", "-y", "60", "-s", "progress", shell)
    screens = []
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            screen = tmux(socket, "capture-pane", "-p", "-S", "-", "-t", "progress")  # the history too
            screens.append(screen)
            if "CKPTQUAL-EXIT=" in screen:
                break
            time.sleep(0.1)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    final = screens[-1]
    assert "CKPTQUAL-EXIT=" in final, final
    live = [[line for line in screen.splitlines() if "left: pass" in line] for screen in screens]
    assert any(live), f"the live line was never on the screen:\n{final}"
    assert all(len(lines) <= 1 for lines in live), next(lines for lines in live if len(lines) > 1)
    assert any("pass 2/2" in lines[0] for lines in live if lines)
    assert not live[-1], final
    for number in (1, 2):
        for index in (1, 2, 3):
            assert final.count(f"ckptqual: pass {number} checkpoint {index}/3:") == 1, final
