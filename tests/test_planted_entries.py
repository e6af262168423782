"""Entries planted in the run directory (a symlink to somewhere outside, a FIFO, a file already in a new file's place)
are refused by every writer, reader and eviction: the test fails in one line naming the path and what it is, nothing
outside is written or read, the entry is left alone, and the run is never QUALIFIED."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptqual.host import cache
from ckptqual.host.beneath import PlantedEntry, RunTree
from ckptqual.io.engines import ENGINES, make_engine
from ckptqual.io.engines.base import RankIO
from ckptqual.io.payload import PayloadGenerator
from ckptqual.io.readers.base import ReadShape
from ckptqual.io.readers.posix import PosixReader
from ckptqual.plan.model import FilePlan, RankPlan, TensorSpec
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.pool import RankPool
from ckptqual.runs.sweep.files import SweepFiles
from suite_runs import REPO, LiveSuite, junit_cases, results

SPEC = FilePlan("model_states.pt", (TensorSpec("w", 70_000, "bfloat16"), TensorSpec("b", 300, "float32")))
VICTIM_TEXT = b"someone else's data\n"
# One short pass and a restore on two ranks, 11 MB checkpoints (tests/suite_runs.PAIR, one pass).
ONE_PASS = ["--workload", "llama3-8b-dp2", "--scale", "0.0001", "--checkpoints-per-pass", "2", "--passes", "1"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "ckptqual-run-test"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM_TEXT)
    return path


def rank_io(tree: RunTree) -> RankIO:
    return RankIO(PayloadGenerator(7), rank=0, checkpoint=1, chunk_bytes=1 << 20, tree=tree)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_no_engine_writes_through_a_file_planted_as_a_symlink(run_dir, victim, engine) -> None:
    (run_dir / SPEC.path).symlink_to(victim)
    with RunTree(run_dir) as tree, pytest.raises(PlantedEntry) as refused:
        make_engine(engine).write(run_dir / SPEC.path, SPEC, 0, rank_io(tree))
    assert str(refused.value) == (
        f"{run_dir}/{SPEC.path} is a symlink to {victim}: an entry planted in the run directory, left alone"
    )
    assert victim.read_bytes() == VICTIM_TEXT and (run_dir / SPEC.path).is_symlink()


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_no_engine_overwrites_a_file_already_in_a_new_files_place(run_dir, victim, engine) -> None:
    os.link(victim, run_dir / SPEC.path)  # a hard link: the same inode as the file outside
    with RunTree(run_dir) as tree, pytest.raises(PlantedEntry, match=r"model_states\.pt is a regular file"):
        make_engine(engine).write(run_dir / SPEC.path, SPEC, 0, rank_io(tree))
    assert victim.read_bytes() == VICTIM_TEXT


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_no_engine_reads_back_through_a_symlink(run_dir, tmp_path, engine) -> None:
    outside = tmp_path / "outside.pt"
    with RunTree(tmp_path) as tree:
        make_engine(engine).write(outside, SPEC, 0, rank_io(tree))  # a good file: only the way to it is wrong
    (run_dir / SPEC.path).symlink_to(outside)
    with RunTree(run_dir) as tree, pytest.raises(PlantedEntry, match=f"is a symlink to {outside}"):
        make_engine(engine).read(run_dir / SPEC.path, SPEC, 0, rank_io(tree), SPEC.path)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_fifo_in_place_of_a_file_to_read_is_refused_without_waiting(run_dir, engine) -> None:
    os.mkfifo(run_dir / SPEC.path)
    with RunTree(run_dir) as tree, pytest.raises(PlantedEntry, match=r"model_states\.pt is a FIFO"):
        make_engine(engine).read(run_dir / SPEC.path, SPEC, 0, rank_io(tree), SPEC.path)


def test_eviction_and_the_cache_check_never_open_a_planted_link(run_dir, victim) -> None:
    (run_dir / "raw-000.bin").symlink_to(victim)
    with RunTree(run_dir) as tree:
        for check in (cache.evict, cache.cached_bytes):
            with pytest.raises(PlantedEntry, match=f"raw-000.bin is a symlink to {victim}"):
                check(tree, run_dir / "raw-000.bin")


def test_the_sweep_neither_writes_nor_reads_through_a_planted_link(run_dir, victim) -> None:
    files = SweepFiles(run_dir / "sweep", jobs=2, file_bytes=1 << 20, seed=3)
    (run_dir / "sweep").mkdir()
    files.paths[1].symlink_to(victim)
    with pytest.raises(PlantedEntry, match=f"sweep-job001.bin is a symlink to {victim}"):
        files.write()
    assert victim.read_bytes() == VICTIM_TEXT
    for path in files.paths:
        path.unlink()
    files.write()
    files.paths[0].unlink()
    files.paths[0].symlink_to(victim)
    reader = PosixReader()
    try:
        with files.open_tree() as tree, pytest.raises(PlantedEntry, match=f"sweep-job000.bin is a symlink to {victim}"):
            reader.open(tree, files.paths, ReadShape(jobs=2, slots=1, threads=1, block_bytes=64 << 10))
    finally:
        reader.close()
    with pytest.raises(PlantedEntry):
        files.evict()
    with pytest.raises(PlantedEntry):
        files.remove()
    assert files.paths[0].is_symlink() and victim.read_bytes() == VICTIM_TEXT  # the planted link is left alone


def test_ranks_reach_the_checkpoint_from_the_run_directory_not_through_a_swapped_one(run_dir, tmp_path) -> None:
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    (run_dir / "checkpoints").symlink_to(outside, target_is_directory=True)
    plans = (RankPlan(0, (SPEC,)),)
    with (
        RunTree(run_dir) as tree,
        RankPool(1, seed=5, timeout_s=120, root=tree.reference) as pool,
        pytest.raises(RankFailure) as failed,
    ):
        pool.write_checkpoint(run_dir / "checkpoints" / "checkpoint-00000", 0, plans, "stream")
    assert failed.value.fault == "planted"
    assert f"{run_dir}/checkpoints is a symlink to {outside}" in str(failed.value)
    assert list(outside.iterdir()) == []


# ---- a real run, with entries planted while it goes (tests/fault_plugins/plant.py)


def planted_run(
    tmp_path: Path, what: str, before: str, outside: Path, target: Path | None = None, *more: str
) -> tuple[int, str, dict, dict, Path]:
    """The exit code, output, JUnit cases and results of a run with `what` planted before the test `before` (on
    `target`, else a new directory; `more`: more options); and the target."""
    if target is None:
        target = tmp_path / "target"
        target.mkdir()
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO / "tests" / "fault_plugins"), os.environ.get("PYTHONPATH")])
        ),
        "CKPTQUAL_PLANT": what,
        "CKPTQUAL_PLANT_BEFORE": before,
        "CKPTQUAL_PLANT_OUTSIDE": str(outside),
    }
    xml, json_path = tmp_path / "q.xml", tmp_path / "r.json"
    args = ["-p", "plant", *ONE_PASS, *more, "--target", str(target), "--junitxml", str(xml)]
    args += ["--results", str(json_path)]
    suite = LiveSuite(tmp_path / "log", *args, tests=("test_fill.py", "test_restore.py"), env=env)
    code = suite.finish(timeout_s=600)
    return code, suite.output(), junit_cases(xml), results(json_path), target


def assert_not_qualified(code: int, output: str, cases: dict, record: dict) -> None:
    assert code != 0, output[-3000:]
    assert cases["verdict"]["outcome"] != "passed", cases["verdict"]
    assert record["verdict"]["overall"] != "QUALIFIED", record["verdict"]


def test_a_checkpoint_directory_planted_as_a_symlink_fails_the_pass_and_nothing_is_written_outside(tmp_path) -> None:
    outside = tmp_path / "outside-dir"
    outside.mkdir()
    code, output, cases, record, target = planted_run(tmp_path, "directory", "test_fill_pass[1]", outside)
    assert_not_qualified(code, output, cases, record)
    message = cases["test_fill_pass[1]"]["message"]
    assert f"/checkpoints/checkpoint-00000 is a symlink to {outside}: an entry planted in the run directory" in message
    assert list(outside.iterdir()) == []
    (link,) = target.glob("ckptqual-run-*/checkpoints/checkpoint-00000")
    assert link.is_symlink() and os.readlink(link) == str(outside)


def test_a_checkpoint_file_planted_as_a_symlink_is_not_overwritten(tmp_path, victim) -> None:
    code, output, cases, record, target = planted_run(tmp_path, "file", "test_fill_pass[1]", victim)
    assert_not_qualified(code, output, cases, record)
    assert f"is a symlink to {victim}: an entry planted in the run directory" in cases["test_fill_pass[1]"]["message"]
    assert victim.read_bytes() == VICTIM_TEXT
    links = [path for path in target.glob("ckptqual-run-*/checkpoints/checkpoint-00000/**/*") if path.is_symlink()]
    assert [os.readlink(link) for link in links] == [str(victim)]


def test_a_fifo_in_place_of_a_checkpoint_file_fails_the_restore_without_hanging(tmp_path, slow_target) -> None:
    """On the slow stand-in drive, where pass 1 passes however busy the host."""
    code, output, cases, record, _ = planted_run(tmp_path, "fifo", "test_restore", tmp_path, slow_target)
    assert_not_qualified(code, output, cases, record)
    assert cases["test_fill_pass[1]"]["outcome"] == "passed"
    message = cases["test_restore"]["message"]
    assert "is a FIFO: an entry planted in the run directory, left alone" in message, message
    assert "every byte verified" not in output
