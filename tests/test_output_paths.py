"""What the suite writes outside its target never replaces what the user did not mean: an output's path that holds a
link, a device, a FIFO, a socket, another user's file or an input of the run is refused before any I/O, in one line
naming the path and what it is; every file is written without following a link (output_file). The device node is
one each test makes with mknod in its own temporary directory."""

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import ckptqual
from ckptqual.cli import main
from ckptqual.config.outputs import check_apart, check_file, check_report_dir
from ckptqual.config.run_settings import SettingsError, resolve_settings
from ckptqual.output_file import UnsafeOutput, write_file
from ckptqual.report.record import RunRecord
from ckptqual.runs.secret import write_secret
from suite_runs import SMALL

pytest_plugins = ("pytester",)

ROOT = Path(ckptqual.__file__).parents[2]
RESULTS = ROOT / "tests" / "data" / "results" / "drive-a.json"
NOBODY = 65534
USAGE_ERROR = 4


def refusal(**options) -> str:
    """The one-line refusal of these settings."""
    with pytest.raises(SettingsError) as error:
        resolve_settings({"scale": 0.0001, **options})
    assert "\n" not in str(error.value)
    return str(error.value)


def suite_refused(done: pytest.RunResult, message: str) -> str:
    """A suite run (in process: suite_in_process) refused before it started: exit 4, one ERROR line on stderr
    holding `message`, no traceback."""
    output = "\n".join([*done.outlines, *done.errlines])
    assert done.ret == USAGE_ERROR, output[-3000:]
    errors = [line for line in done.errlines if line.startswith("ERROR: ")]
    assert len(errors) == 1 and message in errors[0], output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
    return errors[0]


def char_device(path: Path) -> Path:
    """A character device node (1:3, what /dev/null is) made at `path`; skips without the right to make one."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")
    return path


def unix_socket(path: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))
    return path


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious")
    return path


@pytest.fixture
def target(tmp_path) -> Path:
    path = tmp_path / "target"
    path.mkdir()
    return path


def made(kind: str, path: Path, victim: Path) -> Path:
    if kind == "device":
        return char_device(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        unix_socket(path)
    else:
        path.symlink_to(victim)
    return path


KINDS = {"device": "is a character device", "fifo": "is a FIFO", "socket": "is a socket", "link": "is a symbolic link"}


# Checked before any I/O


@pytest.mark.parametrize("kind", list(KINDS))
def test_results_at_a_device_fifo_socket_or_link_are_refused_and_left_as_they_are(tmp_path, victim, kind):
    path = made(kind, tmp_path / "r.json", victim)
    before = os.lstat(path)
    assert refusal(results=path).startswith(f"--results {path}: {KINDS[kind]}")
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert victim.read_text() == "precious"


def test_results_in_a_file_of_another_user_are_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("theirs")
    try:
        os.chown(path, NOBODY, NOBODY)
    except PermissionError:
        pytest.skip("chown to another user needs root")
    assert refusal(results=path) == (
        f"--results {path}: is owned by uid {NOBODY}, not by this user (uid {os.geteuid()}); give a new path or a "
        "regular file of yours"
    )


def test_a_secret_file_inside_the_target_is_refused(target):
    message = refusal(target=target, secret_file=target / "secret")
    assert message.startswith(f"--secret-file {target / 'secret'}: lies inside the target {target}")
    assert list(target.iterdir()) == []


def test_a_secret_file_at_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "secret")
    assert refusal(secret_file=tmp_path / "secret").startswith(f"--secret-file {tmp_path / 'secret'}: is a FIFO")


def test_the_results_file_naming_the_workload_file_is_refused(tmp_path):
    workload = tmp_path / "wl.toml"
    shutil.copy(ROOT / "fixtures" / "workloads" / "llama3-8b.toml", workload)
    run = resolve_settings({"scale": 0.0003, "workload": str(workload), "results": workload})
    with pytest.raises(SettingsError, match=rf"--results {workload}: is the same file as --workload {workload}"):
        check_apart(None, [run])
    with pytest.raises(SettingsError, match=rf"--junitxml {workload}: is the same file as --workload {workload}"):
        check_apart(workload, [resolve_settings({"scale": 0.0003, "workload": str(workload)})])
    assert workload.read_bytes() == (ROOT / "fixtures" / "workloads" / "llama3-8b.toml").read_bytes()


def test_a_report_dir_whose_page_is_the_drive_file_is_refused(tmp_path):
    report = tmp_path / "rd"
    report.mkdir()
    drive = report / "report.html"
    shutil.copy(ROOT / "thresholds" / "local.toml", drive)
    run = resolve_settings({"scale": 0.0001, "drive": str(drive), "report_dir": report})
    with pytest.raises(SettingsError, match=r"the report would replace .*report.html, which is the drive file"):
        check_apart(None, [run])


@pytest.mark.parametrize("name", ["report.html", "checkpoint_times.png"])
def test_a_report_dir_holding_a_planted_link_is_refused(tmp_path, victim, name):
    report = tmp_path / "rep"
    report.mkdir()
    (report / name).symlink_to(victim)
    with pytest.raises(SettingsError, match=rf"--report-dir {report}: {report / name} is a symbolic link to {victim}"):
        check_report_dir(report, None)


def test_a_report_dir_that_is_a_device_is_refused(tmp_path):
    node = char_device(tmp_path / "rep")
    assert refusal(report_dir=node).startswith(f"--report-dir {node}: is a character device")


def test_benchmark_storage_inside_the_target_is_refused(target):
    run = resolve_settings({"scale": 0.0001, "target": target})
    with pytest.raises(SettingsError, match=rf"--benchmark-storage {target / 'b'}: lies inside the target"):
        check_apart(None, [run], target / "b")


def test_an_output_inside_a_target_reached_through_a_bind_mount_is_refused(tmp_path, target):
    (target / "sub").mkdir()
    point = tmp_path / "elsewhere"
    point.mkdir()
    if subprocess.run(["mount", "--bind", str(target / "sub"), str(point)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root and mount)")
    try:
        with pytest.raises(SettingsError, match=rf"--junitxml {point / 'q.xml'}: lies inside the target {target}"):
            check_file("--junitxml", point / "q.xml", [target], "write it elsewhere")
    finally:
        subprocess.run(["umount", str(point)], check=True)


def test_results_where_an_unprivileged_user_cannot_look_are_refused_in_one_line(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as another user")
    hidden = tmp_path / "hidden"
    hidden.mkdir(mode=0o700)
    script = (
        "import sys; from pathlib import Path; from ckptqual.config.outputs import check_results, SettingsError\n"
        "try:\n    check_results(Path(sys.argv[1]), None)\n"
        "except SettingsError as error:\n    print(error)\n"
    )
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", script]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": "/nonexistent", "MPLCONFIGDIR": "/tmp"}
    done = subprocess.run([*nobody, str(hidden / "r.json")], capture_output=True, text=True, env=env, cwd="/")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.strip() == (
        f"--results {hidden / 'r.json'}: cannot be examined by this user (Permission denied); write the results "
        "elsewhere, e.g. --results r.json"
    )


# The JUnit XML: checked before the run, written by ckptqual, never by pytest at the user's path


@pytest.mark.parametrize("kind", ["link", "fifo", "device"])
def test_a_junitxml_at_a_link_fifo_or_device_is_refused_before_the_run(
    tmp_path, victim, target, kind, suite_in_process
):
    junit = made(kind, tmp_path / "q.xml", victim)
    done = suite_in_process(*SMALL, "--target", str(target), "--junitxml", str(junit))
    suite_refused(done, f"--junitxml {junit}: {KINDS[kind]}")
    assert victim.read_text() == "precious" and list(target.iterdir()) == []


@pytest.mark.parametrize("where", ["/proc/sys/vm/drop_caches", "/proc/q.xml"])
def test_a_junitxml_where_no_file_can_be_made_is_refused_before_the_run(target, where, suite_in_process):
    done = suite_in_process(*SMALL, "--target", str(target), "--junitxml", where)
    assert Path(where).parent.as_posix() in suite_refused(done, f"--junitxml {where}: ")
    assert list(target.iterdir()) == []


def test_pytests_junit_xml_reaches_its_path_through_ckptqual_and_says_where(pytester, monkeypatch):
    """In process (pytester): a plain test run with ckptqual's plugin, pytest's temporary files (tempfile, as
    TMPDIR sets it for a process) in a directory of the test's own."""
    test = pytester.makepyfile(test_one="def test_one():\n    pass\n")
    junit = pytester.path / "out" / "q.xml"  # its directory made, as pytest makes it
    private = pytester.mkdir("tmp")  # where pytest's own XML goes first, gone at the end
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    for name in [name for name in os.environ if name.startswith("PYTEST_XDIST")]:
        monkeypatch.delenv(name)
    done = pytester.runpytest_inprocess(str(test), "-p", "no:cacheprovider", "--junitxml", str(junit))
    assert done.ret == 0, "\n".join([*done.outlines, *done.errlines])[-3000:]
    assert 'name="test_one"' in junit.read_text()
    assert f"generated xml file: {junit}" in "\n".join(done.outlines)
    assert sorted(path.name for path in junit.parent.iterdir()) == ["q.xml"]
    assert list(private.iterdir()) == []


# Written without following a link


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_write_refuses_what_was_planted_after_the_check_and_leaves_it(tmp_path, victim, kind):
    path = made(kind, tmp_path / "out.json", victim)
    with pytest.raises(UnsafeOutput, match=KINDS[kind].removeprefix("is ").split(" to ")[0]):
        write_file(path, b"{}")
    assert stat.S_IFMT(os.lstat(path).st_mode) != stat.S_IFREG
    assert victim.read_text() == "precious" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "victim"]


def test_a_write_replaces_a_regular_file_of_this_user_whole(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    write_file(path, b"new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_the_results_record_is_not_saved_into_a_planted_fifo(tmp_path):
    path = tmp_path / "r.json"
    os.mkfifo(path)
    record = RunRecord(path)
    record.save()
    assert record.save_error is not None and "is a FIFO" in record.save_error
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_the_secret_is_not_written_over_a_planted_device(tmp_path):
    node = char_device(tmp_path / "secret")
    with pytest.raises(Exception, match=r"--secret-file .*secret: cannot write it: is a character device"):
        write_secret(node)
    assert stat.S_ISCHR(os.lstat(node).st_mode)


@pytest.mark.parametrize("name", ["report.html", "checkpoint_times.png"])
def test_ckptqual_report_refuses_a_planted_link_in_its_directory(tmp_path, victim, capsys, name):
    report = tmp_path / "rep3"
    report.mkdir()
    (report / name).symlink_to(victim)
    assert main(["report", str(RESULTS), "-o", str(report)]) == 2
    assert f"{report / name} is a symbolic link to {victim}" in capsys.readouterr().err
    assert victim.read_text() == "precious" and (report / name).is_symlink()


def test_ckptqual_report_writes_its_files_as_regular_files(tmp_path):
    report = tmp_path / "rep"
    assert main(["report", str(RESULTS), "-o", str(report)]) == 0
    written = {path.name: os.lstat(path) for path in report.iterdir()}
    assert "report.html" in written and "checkpoint_times.png" in written
    assert all(stat.S_ISREG(info.st_mode) for info in written.values())
    assert json.loads(RESULTS.read_text())  # the input untouched and still JSON


def test_benchmark_storage_must_take_files_only_where_the_run_saves_into_it():
    run = resolve_settings({"scale": 0.0001})
    check_apart(None, [run], Path("/proc/benchmarks"), saving=False)
    with pytest.raises(SettingsError, match=r"--benchmark-storage /proc/benchmarks: a file cannot be created in /proc"):
        check_apart(None, [run], Path("/proc/benchmarks"), saving=True)


def test_results_in_a_directory_reached_through_a_link_are_accepted(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    resolve_settings({"scale": 0.0001, "results": tmp_path / "link" / "r.json"})
    assert list((tmp_path / "real").iterdir()) == []
