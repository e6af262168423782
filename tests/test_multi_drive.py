"""Several drives in one run: with pytest-xdist one worker per drive, without it one drive after another; each drive
with its own verdict, results and test IDs; a drive that cannot run fails alone. Real runs on real directories, the
slow stand-in drive (stand_in/slow_drive.py, where the host is never the limit, for the runs whose verdict is checked)
and a real (too small) tmpfs, as a user runs them."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import pytest

from ckptqual.config.drives import DriveTarget, drive_labels, drive_targets, parse_target_list, per_drive_path
from ckptqual.config.run_settings import resolve_drive
from ckptqual.config.values import SettingsError
from ckptqual.host.identity import identify
from ckptqual.host.topology import pci_chain, shared_parents
from ckptqual.limits.verdict import FAILING
from ckptqual.report.drives import crashed_row
from ckptqual.runs.fill import CheckpointRecord, PassResult
from expected_basis import RELATIVE, STEADY, head, host_phrase, line, qualified, uncounted
from stand_in.slow_drive import SlowDriveUnavailable, slow_drive
from suite_runs import (
    PAIR,
    LiveSuite,
    SharedRun,
    junit_cases,
    lenient_drive,
    plugin_path,
    rank_processes,
    results,
    run_suite,
    shared_run,
)

TESTS = ("test_fill.py", "test_restore.py")


def empty_target(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    target.mkdir()
    return target


def run_three_drives(out: Path) -> SharedRun:
    """Three drives under -n auto: two directories on one slow stand-in drive and a tmpfs far too small for the run;
    what is left on the targets is named `target/entry`."""
    tiny = empty_target(out, "tiny")
    if shutil.which("mount") is None:
        pytest.skip("cannot mount a tmpfs here: mount is not on PATH (apt-get install mount)")
    if run_mount(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(tiny)]):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        with slow_drive(out / "slow") as point:
            targets = [empty_target(point, "alpha"), empty_target(point, "beta-1"), tiny]
            drive = lenient_drive(out / "lenient.toml", "lenient drive")
            arguments = [arg for target in targets for arg in ("--target", str(target))]
            result = run_suite(
                *PAIR, "-n", "auto", "-v", "--drive", str(drive), *arguments, "--junitxml", str(out / "qual.xml"),
                "--results", str(out / "qual.json"), "--benchmark-autosave", "--benchmark-storage", str(out / "saved"),
                tests=TESTS,
            )  # fmt: skip
            left = tuple(f"{target.name}/{entry.name}" for target in targets for entry in sorted(target.iterdir()))
    except SlowDriveUnavailable as error:
        pytest.skip(str(error))
    finally:
        run_mount(["umount", "-l", str(tiny)])
    return SharedRun(result.returncode, result.stdout, result.stderr, out, left)


@pytest.fixture(scope="module")
def parallel_run(tmp_path_factory) -> SharedRun:
    """`run_three_drives`, run once in a test session (also across pytest-xdist's workers) for the tests reading it."""
    return shared_run(tmp_path_factory, "three-drives", run_three_drives)


def run_mount(command: list[str]) -> int:
    return subprocess.run(command, capture_output=True).returncode


def test_each_drive_has_its_own_results_and_verdict_and_the_small_one_fails_alone(parallel_run):
    result, out = parallel_run, parallel_run.out
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    assert re.search(r"created: 3/3 workers|3 workers \[", output), output[:2000]  # -n auto: one per drive
    assert "[alpha] ckptqual: pass 2 checkpoint 2/2:" in result.stderr  # a worker's progress, on stderr
    failing = results(out / "qual.tiny.json")
    assert failing["verdict"]["overall"] == "INCOMPLETE"
    messages = [test["message"] for test in failing["tests"].values()]
    assert len(messages) == 3 and all(re.search(r"NOT_RUN \(in setup\): --target .*tiny: the run needs", m)
                                      for m in messages)  # fmt: skip
    assert all("; use --" in m for m in messages)  # with the fix, as a run of one drive gives it
    assert result.left_on_target == ()  # nothing left on any of the three targets
    good = {label: results(out / f"qual.{label}.json") for label in ("alpha", "beta_1")}
    for label, data in good.items():
        assert data["settings"]["drive_label"] == label and data["settings"]["drives_at_once"] == 2  # tiny does not run
        assert [p["pass"] for p in data["passes"]] == [1, 2] and data["cleanup"]["removed"] is True
    expected = [qualified(data, RELATIVE, STEADY, last=uncounted(data)) for data in good.values()]
    assert [data["verdict"] for data in good.values()] == expected  # on the slow drive, whatever the host's load


def test_junit_ids_carry_the_drive_and_every_drive_has_a_verdict_case(parallel_run):
    out = parallel_run.out
    cases = junit_cases(out / "qual.xml")
    for label in ("alpha", "beta_1", "tiny"):
        assert {f"test_fill_pass[{label}-1]", f"test_fill_pass[{label}-2]", f"test_restore[{label}]"} <= set(cases)
        assert f"verdict[{label}]" in cases
    assert cases["verdict[tiny]"]["outcome"] == "failure"
    assert cases["verdict[tiny]"]["message"].startswith("ckptqual verdict: INCOMPLETE: pass 1 NOT_RUN")
    assert cases["test_restore[tiny]"]["outcome"] == "error" and "\n" not in cases["test_restore[tiny]"]["message"]
    assert cases["verdict"]["outcome"] == "failure" and "tiny INCOMPLETE" in cases["verdict"]["message"]
    assert cases["test_fill_pass[alpha-2]"]["properties"]["drive_label"] == "alpha"


def test_one_worker_ran_all_tests_of_a_drive_in_their_order(parallel_run):
    output = parallel_run.stdout
    ran = re.findall(r"\[(gw\d+)\] \[ *\d+%\] \w+ tests_qual/(test_\w+\.py)::(test_\w+)\[(\w+?)(?:-\d)?\]", output)
    assert len(ran) == 9, output[-3000:]
    for label in ("alpha", "beta_1", "tiny"):
        mine = [(worker, test) for worker, _, test, drive in ran if drive == label]
        assert len({worker for worker, _ in mine}) == 1, mine
        assert [test for _, test in mine] == ["test_fill_pass", "test_fill_pass", "test_restore"]
    assert len({worker for worker, *_ in ran}) == 3


def test_the_summary_lists_the_drives_side_by_side_with_the_shared_host(parallel_run):
    output, out = parallel_run.stdout, parallel_run.out
    assert "drive target pass 1 pass 2 restore sweep layouts verdict" in " ".join(output.split())
    rows = {line.split()[0]: line.split() for line in output.splitlines() if line.split()[:1] in (["alpha"], ["tiny"])}
    assert rows["tiny"][2:] == ["NOT_RUN", "NOT_RUN", "NOT_RUN", "-", "-", "INCOMPLETE"]
    assert "shared host: the payload generator needs" in output
    index = results(out / "qual.json")
    assert index["verdict"]["basis"][:1] == [STEADY]  # 2 passes of 2 checkpoints; tiny judged no relative limit
    assert output.rstrip().splitlines()[-1].startswith(head(index["verdict"]) + "tiny INCOMPLETE") or (
        "INVALID" in output.rstrip().splitlines()[-1]
    )
    assert list(index["drives"]) == ["alpha", "beta_1", "tiny"]
    assert index["settings"]["results"]["alpha"] == str(out / "qual.alpha.json")
    shared = index["shared_host"]
    assert shared["drives_at_once"] == 2 and shared["payload_cores_needed"]["tiny"] is None
    assert shared["payload_cores_needed"]["alpha"] > 0 and shared["payload_cores_needed_at_once"] > 0
    chain = pci_chain(results(out / "qual.alpha.json")["drive"]["physical"][0]["name"])  # the slow drive's loop device
    both = [{"pci": chain[-1], "drives": ["alpha", "beta_1"], "is": "their one device"}] if chain else []
    assert shared["pcie_shared"] == both  # a loop device in memory and a tmpfs have no PCI device (test_shared_disk)


def test_pytest_benchmark_is_off_under_xdist_and_ckptqual_compare_takes_the_drives_results(parallel_run):
    result, out = parallel_run, parallel_run.out
    assert "Benchmarks are automatically disabled because xdist plugin is active" in result.stdout + result.stderr
    assert not list(out.glob("saved/**/*.json"))
    compare = [
        sys.executable,
        "-m",
        "ckptqual.cli",
        "compare",
        str(out / "qual.alpha.json"),
        str(out / "qual.beta_1.json"),
    ]
    done = subprocess.run(compare, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1, 3), done.stderr  # 1: a regression between the drives, 3: inconclusive
    assert re.search(r"pass1 .*pass2 .*restore", " ".join(done.stdout.split())), done.stdout


def two_drives_live(
    tmp_path: Path, own_group: bool = False, env: dict[str, str] | None = None, plugins: tuple[str, ...] = ()
) -> tuple[LiveSuite, Path, list[Path]]:
    """Two directory targets qualified under -n 2 in the background, 4 checkpoints per pass (time to act in pass
    1): the run, its output folder and the targets."""
    out = empty_target(tmp_path, "out")
    drive = lenient_drive(out / "lenient.toml", "lenient drive")
    targets = [empty_target(tmp_path, "first"), empty_target(tmp_path, "second")]
    arguments = [arg for target in targets for arg in ("--target", str(target))]
    small = [*PAIR[:-3], "4", *PAIR[-2:]]
    suite = LiveSuite(
        out / "log", *small, "-n", "2", "--drive", str(drive), *arguments, "--junitxml", str(out / "q.xml"),
        "--results", str(out / "q.json"), *plugins, tests=TESTS, own_group=own_group, env=env,
    )  # fmt: skip
    return suite, out, targets


def test_a_drive_whose_worker_crashes_is_not_qualified_and_its_results_file_says_why(tmp_path):
    """A worker killed mid-pass (as the OOM killer does): xdist runs the drive's other tests on a new worker, which
    fails them as not run (qualifying the drive again would overwrite what the dead worker measured); the gate, the
    drive's JUnit case and its results file still say that the drive was not qualified in one run, and why. The
    other drive is judged as usual."""
    suite, out, targets = two_drives_live(tmp_path)
    suite.wait_for("[first] ckptqual: pass 1 checkpoint 1/4")
    (run_dir,) = targets[0].glob("ckptqual-run-*")  # ckptqual-run-DATE-TIME-PID-ID: the PID of the worker
    worker = int(run_dir.name.split("-")[4])
    ranks = rank_processes(worker)
    assert len(ranks) == 2, ranks  # the pair's
    os.kill(worker, signal.SIGKILL)
    code = suite.finish()
    output = suite.output()
    assert code == 1, output[-4000:]
    assert "replacing crashed worker" in output, output[-4000:]
    crash = r"worker gw\d crashed while running tests_qual/test_fill.py::test_fill_pass\[first-1\] \(its process died"
    first = results(out / "q.first.json")["verdict"]
    assert first["overall"] != "QUALIFIED" and re.match(crash, first["reasons"][0]), first
    assert f"`ckptqual clean {targets[0]}`" in first["reasons"][0]
    index = results(out / "q.json")
    assert index["drives"]["first"]["verdict"] == first and index["verdict"]["overall"] != "QUALIFIED"
    assert not any("crashed" in reason for reason in results(out / "q.second.json")["verdict"]["reasons"])
    cases = junit_cases(out / "q.xml")
    assert (
        cases["verdict[first]"]["outcome"] == "failure"
        and "crashed while running" in cases["verdict[first]"]["message"]
    )
    # xdist reports the crashed test as an error, then runs it again on the new worker: the XML holds both.
    first_pass = [case for case in ElementTree.parse(out / "q.xml").iter("testcase")
                  if case.get("name") == "test_fill_pass[first-1]"]  # fmt: skip
    assert any("crashed while running" in "".join(case.itertext()) for case in first_pass)
    assert re.search(crash, cases["verdict"]["message"]), cases["verdict"]
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()]  # the killed worker's ranks ended too
    left = sorted(path.name for path in targets[0].iterdir())
    assert left == [".ckptqual-lock", ".ckptqual-target", run_dir.name]  # the killed run's, for `ckptqual clean`
    assert list(targets[1].iterdir()) == []


DIE_IN_TEARDOWN = """
import os, signal, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    if item.name == "test_restore[first]" and not os.path.exists(os.environ["DIED"]):
        open(os.environ["DIED"], "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies in the teardown of its drive's last test, once
"""


def test_a_worker_killed_in_teardown_leaves_its_measurements_in_the_drives_results_and_the_row_agrees(tmp_path):
    """The replacement worker does not qualify the drive again (that would overwrite the dead worker's results
    file): the file keeps every checkpoint the dead worker recorded, and its row, the index and the JUnit agree."""
    (tmp_path / "die_in_teardown.py").write_text(DIE_IN_TEARDOWN)
    env = {"PYTHONPATH": plugin_path(tmp_path), "DIED": str(tmp_path / "died")}
    suite, out, _ = two_drives_live(tmp_path, env=env, plugins=("-p", "die_in_teardown"))
    assert suite.finish() == 1, suite.output()[-4000:]
    assert "replacing crashed worker" in suite.output()
    first = results(out / "q.first.json")
    assert len(first["checkpoints"]) == 8, first["checkpoints"]  # 2 passes of 4, as the dead worker wrote them
    # pass 2 was judged by the dead worker (on a loaded host it may come out INVALID, host-bound): whatever its
    # outcome, the file, the index and the JUnit say the same, and none of them says it was not run.
    pass_2 = {test["subject"]: test["outcome"] for test in first["tests"].values()}["pass 2"]
    assert pass_2 in ("PASS", "MARGINAL", "FAIL", "NOT_STEADY", "INVALID"), pass_2
    assert first["verdict"]["overall"] == "INCOMPLETE" and "crashed while running" in first["verdict"]["reasons"][0]
    index = results(out / "q.json")
    assert index["drives"]["first"]["verdict"] == first["verdict"]
    assert index["drives"]["first"]["outcomes"]["pass 2"] == pass_2
    cases = junit_cases(out / "q.xml")
    junit_pass_2 = "failure" if pass_2 in FAILING else "passed"
    assert cases["test_fill_pass[first-2]"]["outcome"] == junit_pass_2, (pass_2, cases["test_fill_pass[first-2]"])
    assert cases["verdict[first]"]["outcome"] == "failure"
    assert first["verdict"]["reasons"][0] in cases["verdict[first]"]["message"]
    assert results(out / "q.second.json")["verdict"]["overall"] != "INCOMPLETE"


def test_ctrl_c_of_a_parallel_run_leaves_every_drive_incomplete_in_its_own_results_and_the_targets_clean(tmp_path):
    """Ctrl-C in a terminal reaches the controller and every worker (one process group): the workers stop before
    they write a verdict, so the controller writes its own into each drive's results file."""
    suite, out, targets = two_drives_live(tmp_path, own_group=True)
    suite.wait_for("ckptqual: pass 1 checkpoint 2/4")
    os.killpg(suite.process.pid, signal.SIGINT)
    assert suite.finish(timeout_s=120) == 2, suite.output()[-3000:]
    output = suite.output()
    index = results(out / "q.json")
    assert output.rstrip().splitlines()[-1].startswith(head(index["verdict"]) + "first INCOMPLETE"), output[-3000:]
    assert index["verdict"]["overall"] == "INCOMPLETE" and list(index["drives"]) == ["first", "second"]
    cases = junit_cases(out / "q.xml")
    for label, target in zip(("first", "second"), targets, strict=True):
        data = results(out / f"q.{label}.json")
        assert data["verdict"]["overall"] == "INCOMPLETE", data["verdict"]
        assert "interrupted by SIGINT (Ctrl-C)" in data["verdict"]["reasons"][0], data["verdict"]
        assert data["verdict"] == index["drives"][label]["verdict"]
        assert cases[f"verdict[{label}]"]["outcome"] == "failure"
        assert data["cleanup"]["removed"] is True and list(target.iterdir()) == []


def test_a_crash_in_an_interrupted_run_is_told_after_the_interruption_and_once():
    """A worker that dies while Ctrl-C stops the run died of it, or with it: the interruption is the first reason, the
    crash follows, and a reason the drive's file already gave is not told twice."""
    crash = "worker gw0 crashed while running tests_qual/test_fill.py::test_fill_pass[first-1]"
    unjudged = "the run was interrupted by SIGINT (Ctrl-C) before the drive's worker recorded a verdict"
    judged = {"label": "first", "verdict": {"overall": "QUALIFIED", "reasons": []}}
    assert crashed_row(judged, crash)["verdict"] == {"overall": "INCOMPLETE", "reasons": [crash]}
    unfinished = {"label": "first", "verdict": {"overall": "INCOMPLETE", "reasons": [unjudged, "pass 2 not run"]}}
    reasons = crashed_row(unfinished, crash, unjudged)["verdict"]["reasons"]
    assert reasons == [f"{unjudged}; {crash}", "pass 2 not run"]
    failed = {"label": "first", "verdict": {"overall": "NOT QUALIFIED", "reasons": ["pass 1 FAIL"]}}
    assert crashed_row(failed, crash, unjudged)["verdict"]["overall"] == "NOT QUALIFIED"


def test_without_n_the_drives_of_a_list_file_are_qualified_one_after_another(tmp_path, slow_target):
    """Two directories on the slow stand-in drive, where the host is never the limit: both qualify, however busy."""
    out = empty_target(tmp_path, "out")
    drive = lenient_drive(out / "lenient.toml", "lenient drive")
    targets = [empty_target(slow_target, "first"), empty_target(slow_target, "second")]
    listing = out / "drives.txt"
    listing.write_text(f"# two drives\n{drive} {targets[0]}\n\n{drive} {targets[1]}  # the second\n")
    result = run_suite(
        *PAIR, "--target", str(listing), "--junitxml", str(out / "q.xml"), "--results", str(out / "q.json"),
        "--benchmark-autosave", "--benchmark-storage", str(out / "saved"),
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    progress = [line[:8] for line in result.stdout.splitlines() if "ckptqual: pass" in line and "checkpoint" in line]
    assert progress == ["[first] "] * 4 + ["[second]"] * 4  # all of the first drive before the second
    cases = junit_cases(out / "q.xml")
    assert {"test_fill_pass[first-1]", "test_fill_pass[second-2]", "verdict[first]", "verdict"} <= set(cases)
    drives = {label: results(out / f"q.{label}.json") for label in ("first", "second")}
    assert [data["settings"]["drives_at_once"] for data in drives.values()] == [1, 1]
    assert all(data["cleanup"]["removed"] for data in drives.values())
    saved = [json.loads(path.read_text()) for path in out.glob("saved/**/*.json")]
    assert len(saved) == 1 and set(saved[0]["machine_info"]["ckptqual"]["drives"]) == {"first", "second"}
    names = sorted(benchmark["name"] for benchmark in saved[0]["benchmarks"])
    assert names == ["test_fill_pass[first-1]", "test_fill_pass[first-2]", "test_fill_pass[second-1]",
                     "test_fill_pass[second-2]"]  # fmt: skip
    host = sorted({phrase for data in drives.values() for phrase in host_phrase(data)})
    device = list(dict.fromkeys(uncounted(data) for data in drives.values()))  # the one slow drive's, said once
    expected = {"overall": "QUALIFIED", "reasons": [], "basis": [RELATIVE, STEADY, *host, *device]}  # every drive's
    assert result.returncode == 0 and result.stdout.rstrip().endswith(line(expected))
    assert results(out / "q.json")["verdict"] == expected


def test_a_list_file_with_a_bad_line_stops_the_run_up_front(tmp_path):
    listing = tmp_path / "drives.txt"
    listing.write_text(f"local {tmp_path}/a\nlocal\n")
    result = run_suite("--target", str(listing))
    assert result.returncode == 4
    assert f"ERROR: --target {listing} line 2: 'local' has 1 field(s); write a drive file and a mount point" in (
        result.stderr
    )


def test_n_with_one_target_is_still_refused(tmp_path):
    result = run_suite("-n", "2", "--target", str(tmp_path))
    assert result.returncode == 4
    assert "run tests_qual without -n" in result.stderr and "give --target several times" in result.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("d5-p5336 /mnt/a extra\n", r"line 1: 'd5-p5336 /mnt/a extra' has 3 field\(s\)"),
        ("# only a comment\n\nd5-p5336 mnt/a\n", r"line 3: mount point 'mnt/a' is not an absolute path"),
        ("# nothing\n", r"lists no drive; write one line per drive, e.g. 'd5-p5336 /mnt/nvme1'"),
    ],
)
def test_bad_list_files_are_refused_with_the_line_and_the_fix(tmp_path, text, message):
    listing = tmp_path / "drives.txt"
    listing.write_text(text)
    with pytest.raises(SettingsError, match=message):
        parse_target_list(listing)


def test_a_list_file_and_drive_or_a_target_given_twice_are_refused(tmp_path):
    listing = tmp_path / "drives.txt"
    listing.write_text(f"local {tmp_path}/a\nd5-p5336 {tmp_path}/b\n")
    listed = drive_targets([str(listing)], None)
    assert [(drive.drive, drive.target.name) for drive in listed] == [("local", "a"), ("d5-p5336", "b")]
    with pytest.raises(SettingsError, match="lists a drive file for each drive; drop --drive local"):
        drive_targets([str(listing)], "local")
    with pytest.raises(SettingsError, match="is given twice"):
        drive_targets([str(tmp_path / "a"), str(tmp_path / "x" / ".." / "a")], None)


def test_labels_are_the_device_when_unique_else_the_directory_name(tmp_path, tmpfs, loop_ext4):
    first = empty_target(tmp_path, "nvme-a")
    second = empty_target(empty_target(tmp_path, "x"), "nvme-a")
    assert drive_labels([first, second]) == ["nvme_a", "nvme_a_2"]  # one disk: the names, "-" made "_", unique
    ext4, memory = loop_ext4("64M"), tmpfs("size=1m")
    labels = drive_labels([ext4, memory, first])
    assert re.fullmatch(r"loop\d+", labels[0]), labels  # the only target on its block device
    assert labels[1] == "tmpfs_0"  # a tmpfs has no block device: its directory's name
    disk = identify(first).device  # now alone on its disk, unless that is no block device (an overlay)
    assert labels[2] == (disk if disk != "unknown" else "nvme_a")
    assert drive_targets([str(first)], None)[0].label is None  # one drive: no label, today's test IDs


def test_per_drive_paths_put_the_label_before_the_suffix():
    assert per_drive_path(Path("/r/qual.json"), "nvme1") == Path("/r/qual.nvme1.json")
    assert per_drive_path(Path("/r/qual"), "nvme1") == Path("/r/qual.nvme1")


def test_a_pci_device_above_two_drives_is_named_from_sysfs(tmp_path):
    """A captured shape of sysfs (this machine has no PCIe switch): two NVMe drives behind one switch, a SATA drive
    on its own HBA, and two namespaces of one controller."""
    block, devices = tmp_path / "class" / "block", tmp_path / "devices" / "pci0000:00"
    block.mkdir(parents=True)
    paths = {
        "nvme0n1": "0000:00:1c.0/0000:01:00.0/0000:02:00.0/nvme/nvme0/nvme0n1",
        "nvme1n1": "0000:00:1c.0/0000:01:00.0/0000:02:01.0/nvme/nvme1/nvme1n1",
        "nvme2n1": "0000:00:1d.0/0000:05:00.0/nvme/nvme2/nvme2n1",
        "nvme2n2": "0000:00:1d.0/0000:05:00.0/nvme/nvme2/nvme2n2",
        "sda": "0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda",
    }
    for name, path in paths.items():
        (devices / path).mkdir(parents=True)
        (block / name).symlink_to(devices / path)
    drives = {"a": ["nvme0n1"], "b": ["nvme1n1"], "c": ["sda"], "d": ["nvme2n1"], "e": ["nvme2n2"]}
    assert pci_chain("sda", tmp_path) == ("0000:00:1f.2",)
    assert shared_parents(drives, tmp_path) == [
        {"pci": "0000:01:00.0", "drives": ["a", "b"], "is": "a PCIe switch port or HBA above them"},
        {"pci": "0000:05:00.0", "drives": ["d", "e"], "is": "their one device"},
    ]


def test_the_payload_rule_gives_each_drive_its_share_of_the_generator():
    checkpoint = CheckpointRecord(1, 1, 0, 2.0, 1.0, 2_000_000_000, 3.0, None, 0.0)  # 1 GB/s, generator 3 GB/s
    assert PassResult(1, [checkpoint]).invalid_reason() is None  # alone: 3 >= 2 x 1
    shared = PassResult(1, [checkpoint], drives_at_once=2).invalid_reason()  # two at once: 1.5 < 2 x 1
    assert shared == (
        "payload generation was the bottleneck: generator 1.50 GB/s on 1/2 of the cores (2 drives at once) is under "
        "2x the checkpoint rate 1.00 GB/s; use a host with more or faster cores, or qualify fewer drives at once"
    )


def test_a_refused_target_is_a_problem_of_its_drive_and_a_bad_option_stops_every_drive(tmp_path):
    foreign = empty_target(tmp_path, "foreign")
    (foreign / "precious.ckpt").write_bytes(b"\x01")
    drive = DriveTarget(foreign, None, "foreign")
    run, problem = resolve_drive({"results": str(tmp_path / "q.json")}, drive, 2)
    assert "holds 1 entry ckptqual did not create (precious.ckpt)" in problem and run.target == foreign
    assert (run.label, run.drives_at_once, run.results) == ("foreign", 2, tmp_path / "q.foreign.json")
    assert sorted(path.name for path in foreign.iterdir()) == ["precious.ckpt"]
    with pytest.raises(SettingsError, match="--scale '0'"):
        resolve_drive({"scale": "0"}, drive, 2)
