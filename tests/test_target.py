"""The target guard: refuse anything not ours, write only inside our run directory, remove only what we made."""

import hashlib
import os
from pathlib import Path

import pytest

from ckptqual.target import RUN_MARKER, TARGET_MARKER, TargetError, check_target, identify, open_target


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_empty_directory_is_marked_used_and_left_empty(tmp_path):
    target = open_target(tmp_path, keep=False)
    assert (tmp_path / TARGET_MARKER).is_file()
    assert (target.run_dir / RUN_MARKER).is_file() and target.run_dir.parent == tmp_path
    (target.run_dir / "checkpoint").mkdir()
    target.cleanup()
    assert list(tmp_path.iterdir()) == []


def test_a_temporary_target_is_created_and_removed_whole():
    target = open_target(None)
    assert target.path.is_dir()
    target.cleanup()
    assert not target.path.exists()


def test_keep_leaves_the_run_and_a_marked_target_is_accepted_again(tmp_path):
    first = open_target(tmp_path, keep=True)
    first.cleanup()
    assert first.run_dir.is_dir()
    assert check_target(tmp_path) == []
    second = open_target(tmp_path)
    second.cleanup()
    assert first.run_dir.is_dir() and (tmp_path / TARGET_MARKER).is_file()  # the marker predates this run


def test_lost_and_found_of_a_fresh_filesystem_is_tolerated_and_untouched(tmp_path):
    (tmp_path / "lost+found").mkdir()
    target = open_target(tmp_path)
    target.cleanup()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lost+found"]


def test_a_directory_with_foreign_files_is_refused_and_untouched(tmp_path):
    foreign = tmp_path / "precious.bin"
    foreign.write_bytes(os.urandom(4096))
    before = digest(foreign)
    with pytest.raises(TargetError, match=r"holds 1 entry ckptqual did not create \(precious.bin\)"):
        open_target(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.bin"]
    assert digest(foreign) == before


def test_a_foreign_directory_named_like_a_run_is_foreign(tmp_path):
    (tmp_path / "ckptqual-run-20260101-000000-1").mkdir()
    assert "did not create" in check_target(tmp_path)[0]


def test_files_that_appear_during_a_run_survive_its_cleanup(tmp_path):
    target = open_target(tmp_path)
    visitor = tmp_path / "visitor.txt"
    visitor.write_text("not ckptqual's")
    target.cleanup()
    assert visitor.read_text() == "not ckptqual's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["visitor.txt"]


@pytest.mark.parametrize("path", ["/", "/etc", "/tmp", "/usr", "/var/tmp"])
def test_system_directories_are_refused(path):
    assert "is a system directory" in check_target(Path(path))[0]


def test_missing_paths_and_files_are_refused(tmp_path):
    assert "does not exist" in check_target(tmp_path / "nope")[0]
    file = tmp_path / "file"
    file.write_text("x")
    assert "is not a directory" in check_target(file)[0]


def test_a_read_only_filesystem_is_refused(tmpfs):
    assert "is not writable" in check_target(tmpfs("ro,size=1m"))[0]


def test_identity_names_the_filesystem_and_mount_options(tmp_path):
    identity = identify(tmp_path)
    assert identity.filesystem != "unknown"
    assert identity.mount_point != "unknown" and str(tmp_path).startswith(identity.mount_point)
