"""Removal, manifests and the account of what is left never follow an entry planted in the run directory: a symlink
to a directory or a file, a FIFO, a swapped run directory or manifest is left alone and named with what it points to,
nothing outside is touched, and `ckptqual clean` (the advice a run gives) still finds the run and finishes the job."""

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptqual.cli import main
from ckptqual.host.beneath import PlantedEntry
from ckptqual.host.fsops import make_listed_directory
from ckptqual.host.guard import RUN_MARKER, TARGET_MARKER, TargetError
from ckptqual.host.manifest import FILE_LIST
from ckptqual.host.space import RunSpace
from ckptqual.host.target import Target, open_target
from suite_runs import PAIR, REPO, results, user_environment

FILES = ["rank-0/model.pt", "optim.pt"]


def write(path: Path, data: bytes = b"x" * 4096) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` (symlinks not followed) with its file's digest or its link's target."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path.relative_to(root))] = "dir"
    return found


def new_target(root: Path) -> Path:
    (root / "target").mkdir()
    return root / "target"


def outside_with_victims(root: Path) -> Path:
    """A directory outside the target holding files named like a checkpoint's, and a victim file."""
    outside = root / "outside"
    for name in [*FILES, "victim.txt"]:
        write(outside / name, f"someone else's {name}\n".encode())
    return outside


def checkpointing_run(tmp_path: Path) -> tuple[Target, Path]:
    """A run on `tmp_path/target` that wrote checkpoint 3 and, beside it, two planted symlinks: a whole checkpoint
    directory pointing outside, and one checkpoint file pointing at a victim file outside."""
    outside = outside_with_victims(tmp_path)
    target = open_target(new_target(tmp_path))
    target.declare("checkpoints/checkpoint-*", FILES)
    checkpoint = target.run_dir / "checkpoints" / "checkpoint-00003"
    for name in FILES:
        write(checkpoint / name)
    (checkpoint / "optim.pt").unlink()
    (checkpoint / "optim.pt").symlink_to(outside / "victim.txt")
    (target.run_dir / "checkpoints" / "checkpoint-00004").symlink_to(outside)
    return target, outside


def test_planted_symlinks_to_a_directory_and_a_file_are_left_named_and_never_followed(tmp_path):
    target, outside = checkpointing_run(tmp_path)
    before = snapshot(outside)
    removal = target.cleanup()
    assert snapshot(outside) == before
    run = target.run_dir.name
    assert {entry.path: entry.why for entry in removal.left} == {
        f"{run}/checkpoints/checkpoint-00003/optim.pt": f"is a symlink to {outside}/victim.txt: planted, left alone",
        f"{run}/checkpoints/checkpoint-00004": f"is a symlink to {outside}: planted, left alone",
    }
    assert f"{target.run_dir}/checkpoints/checkpoint-00004 is a symlink to {outside}" in " ".join(removal.errors)
    assert not removal.complete and not target.removed and removal.removed_files == 1  # rank-0/model.pt
    assert os.readlink(target.run_dir / "checkpoints" / "checkpoint-00004") == str(outside)
    assert (target.run_dir / RUN_MARKER).is_file() and (target.path / TARGET_MARKER).is_file()  # still the run's


def test_clean_after_a_run_that_met_planted_symlinks_does_what_the_run_advised(tmp_path, capsys):
    """The run's advice (`ckptqual clean TARGET`) finds the run, names the planted entries and leaves them; once
    their owner removed them, the same command removes the rest and the target is empty."""
    target, outside = checkpointing_run(tmp_path)
    before = snapshot(outside)
    space = RunSpace(target, timeout_s=60)
    cleanup = space.close()  # as the run does it: in the helper process, with its deadline
    assert cleanup["removed"] is False and cleanup["fix"] == f"ckptqual clean {target.path}"
    assert "is a symlink to" in cleanup["why"] and len(space.left) == 2
    assert main(cleanup["fix"].split()[1:]) == 1
    out = capsys.readouterr().out
    assert f"checkpoints/checkpoint-00004: is a symlink to {outside}: planted, left alone" in out
    assert "remove the entries left above yourself" in out and f"ckptqual clean {target.path}" in out
    assert snapshot(outside) == before
    (target.run_dir / "checkpoints" / "checkpoint-00004").unlink()
    (target.run_dir / "checkpoints" / "checkpoint-00003" / "optim.pt").unlink()
    assert main(["clean", str(target.path)]) == 0, capsys.readouterr().out
    assert list(target.path.iterdir()) == [] and snapshot(outside) == before


def test_a_fifo_planted_in_place_of_a_declared_file_is_left_unopened(tmp_path):
    target = open_target(tmp_path)
    target.declare("raw", ["raw-000.bin"])
    (target.run_dir / "raw").mkdir()
    os.mkfifo(target.run_dir / "raw" / "raw-000.bin")
    removal = target.cleanup()  # a FIFO opened for reading would hang here
    assert [(entry.path, entry.why) for entry in removal.left] == [
        (f"{target.run_dir.name}/raw/raw-000.bin", "is a FIFO: planted, left alone")
    ]
    assert (target.run_dir / "raw" / "raw-000.bin").is_fifo()


def test_a_run_directory_swapped_for_another_is_refused_by_its_identity(tmp_path):
    """Someone moves the run directory away and puts in its place one of their own whose manifest declares their
    files: the removal proves the directory by the identity the run recorded, and removes nothing of theirs."""
    target = open_target(new_target(tmp_path))
    target.declare("raw", ["raw-000.bin"])
    write(target.run_dir / "raw" / "raw-000.bin")
    moved = tmp_path / "moved"
    target.run_dir.rename(moved)
    shutil.copytree(moved, target.run_dir)
    theirs = snapshot(target.run_dir)
    removal = target.cleanup()
    assert snapshot(target.run_dir) == theirs and not removal.complete and removal.removed_files == 0
    assert "is not the run directory this run made (it was replaced)" in removal.errors[0]


def test_a_run_directory_replaced_by_a_symlink_is_left_and_named(tmp_path):
    target = open_target(new_target(tmp_path))
    target.declare("raw", ["raw-000.bin"])
    write(target.run_dir / "raw" / "raw-000.bin")
    moved = tmp_path / "moved"
    target.run_dir.rename(moved)
    target.run_dir.symlink_to(moved)
    before = snapshot(moved)
    removal = target.cleanup()
    assert snapshot(moved) == before and target.run_dir.is_symlink()
    assert [entry.path for entry in removal.left] == [target.run_dir.name] and removal.removed_files == 0
    assert f"{target.run_dir} is a symlink to {moved}: an entry planted in the run directory" in removal.left[0].why


def test_a_listed_directory_is_never_made_through_a_planted_symlink(tmp_path):
    target = open_target(new_target(tmp_path))
    outside = outside_with_victims(tmp_path)
    (target.run_dir / "layouts").symlink_to(outside)
    with pytest.raises(PlantedEntry, match=f"layouts is a symlink to {outside}"):
        make_listed_directory(target.run_dir, target.identity, target.run_dir / "layouts" / "layout-000", FILES)
    assert not (outside / "layout-000").exists() and not (outside / FILE_LIST).exists()
    target.cleanup()


def test_a_manifest_replaced_by_a_symlink_is_refused_not_renamed_over(tmp_path):
    target = open_target(new_target(tmp_path))
    victim = write(tmp_path / "victim.txt", b"someone else's\n")
    (target.run_dir / RUN_MARKER).unlink()
    (target.run_dir / RUN_MARKER).symlink_to(victim)
    with pytest.raises(TargetError, match=f"{RUN_MARKER} is a symlink to {victim}"):
        target.declare("raw", ["raw-000.bin"])
    assert victim.read_bytes() == b"someone else's\n" and (target.run_dir / RUN_MARKER).is_symlink()
    assert sorted(p.name for p in target.run_dir.iterdir()) == [RUN_MARKER]  # no temporary copy left either


PLANT = """
import os, pathlib, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if item.name == "test_restore":
        run_dir = next(pathlib.Path(os.environ["TARGET"]).glob("ckptqual-run-*"))
        (run_dir / "visitor.txt").write_text("someone's notes")
        (run_dir / "elsewhere").symlink_to(os.environ["OUTSIDE"])
"""


def test_a_run_that_met_planted_entries_reports_them_and_its_summary_prints_them(tmp_path, slow_target, capsys):
    """A regular file and a symlink planted in the run directory during the run: the record names both (the
    symlink with what it points to), the verdict is INVALID naming the symlink, `ckptqual summary` prints them, and the
    run's advice cleans up after. On the slow stand-in drive, where no figure is INVALID for another reason first; one
    pass (the entries are planted before the restore)."""
    target, outside = slow_target, outside_with_victims(tmp_path)
    (tmp_path / "plant_entries.py").write_text(textwrap.dedent(PLANT))
    tests = [str(REPO / "tests_qual" / name) for name in ("test_fill.py", "test_restore.py")]
    command = [sys.executable, "-m", "pytest", *tests, "-p", "no:cacheprovider", "-p", "plant_entries"]
    command += [*PAIR, "--passes", "1"]
    command += ["--target", str(target), "--results", str(tmp_path / "r.json"), "--junitxml", str(tmp_path / "q.xml")]
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = user_environment({"PYTHONPATH": path, "TARGET": str(target), "OUTSIDE": str(outside)})
    before = snapshot(outside)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout[-3000:]
    data = results(tmp_path / "r.json")
    left = {Path(entry["path"]).name: entry["why"] for entry in data["left_on_target"]}
    assert left == {
        "elsewhere": f"is a symlink to {outside}: planted, left alone",
        "visitor.txt": "not created by ckptqual",
    }
    assert data["cleanup"]["removed"] is False and "elsewhere is a symlink to" in data["cleanup"]["why"]
    assert data["verdict"]["overall"] == "INVALID" and done.returncode == 1, data["verdict"]
    assert f"the run directory was tampered with: {target}/" in data["verdict"]["reasons"][0]
    assert f"elsewhere is a symlink to {outside}" in data["verdict"]["reasons"][0]
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "r.json")]) in (0, 1)  # the CLI in process: what it prints is the same
    summary = capsys.readouterr()
    assert "visitor.txt: not created by ckptqual" in summary.out, summary
    assert f"elsewhere: is a symlink to {outside}: planted, left alone" in summary.out
    assert f"remove ckptqual's leftovers with: ckptqual clean {target}" in summary.out
    run_dir = next(target.glob("ckptqual-run-*"))
    (run_dir / "visitor.txt").unlink()
    (run_dir / "elsewhere").unlink()
    assert main(["clean", str(target)]) == 0, capsys.readouterr()
    assert list(target.iterdir()) == [] and snapshot(outside) == before
