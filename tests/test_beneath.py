"""Entries under a run directory are reached without following a symlink: a planted one is refused, named with what it
points to, and left alone; nothing outside is written."""

import os
from pathlib import Path

import pytest

from ckptqual.host.beneath import PlantedEntry, RunTree


@pytest.fixture()
def tree(tmp_path: Path):
    root = tmp_path / "run"
    root.mkdir()
    with RunTree(root) as opened:
        yield opened


def test_files_and_directories_are_made_and_removed_under_the_run_directory(tree: RunTree) -> None:
    path = tree.root / "checkpoints" / "checkpoint-00000" / "model.pt"
    fd = tree.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    os.write(fd, b"data")
    os.close(fd)
    assert path.read_bytes() == b"data"
    tree.unlink(path)
    tree.rmdir(path.parent)
    assert not path.parent.exists()


def test_a_directory_planted_as_a_symlink_is_refused_and_nothing_is_written_outside(tree, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree.root / "checkpoints").mkdir()
    (tree.root / "checkpoints" / "checkpoint-00004").symlink_to(outside)
    path = tree.root / "checkpoints" / "checkpoint-00004" / "model.pt"
    with pytest.raises(PlantedEntry) as refused:
        tree.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert str(refused.value) == (
        f"{tree.root}/checkpoints/checkpoint-00004 is a symlink to {outside}: an entry planted in the run directory, "
        "left alone"
    )
    assert list(outside.iterdir()) == []
    assert (tree.root / "checkpoints" / "checkpoint-00004").is_symlink()


@pytest.mark.parametrize("flags", [os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0])
def test_a_file_planted_as_a_symlink_is_neither_written_nor_read_nor_removed(tree, tmp_path, flags) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("someone's data")
    (tree.root / "model.pt").symlink_to(victim)
    for action in (lambda: tree.open(tree.root / "model.pt", flags), lambda: tree.unlink(tree.root / "model.pt")):
        with pytest.raises(PlantedEntry, match=f"model.pt is a symlink to {victim}"):
            action()
    assert victim.read_text() == "someone's data"
    assert (tree.root / "model.pt").is_symlink()


def test_a_fifo_planted_as_a_file_is_refused_at_once(tree: RunTree) -> None:
    os.mkfifo(tree.root / "model.pt")
    with pytest.raises(PlantedEntry, match=r"model\.pt is a FIFO"):
        tree.open(tree.root / "model.pt", os.O_RDONLY)


def test_a_run_directory_that_was_swapped_or_is_a_symlink_is_refused(tree: RunTree, tmp_path: Path) -> None:
    identity = tree.identity
    link = tmp_path / "link"
    link.symlink_to(tree.root)
    with pytest.raises(PlantedEntry, match="is a symlink to"):
        RunTree(link)
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(PlantedEntry, match="is not the run directory this run made"):
        RunTree(other, identity)
    RunTree(tree.root, identity).close()


def test_paths_outside_or_climbing_out_of_the_run_directory_are_refused(tree: RunTree, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        tree.open(tmp_path / "elsewhere", os.O_RDONLY)
    with pytest.raises(ValueError, match=r"'\.\.'"):
        tree.open(tree.root / ".." / "elsewhere", os.O_RDONLY)
