"""Save: every rank writes its files of one checkpoint and makes them durable, directories included; the write
operation beside restore's read."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ckptqual.faults import on_path
from ckptqual.io.engines import make_engine
from ckptqual.io.engines.base import RankIO, fsync_directory, fsync_path, release_commit, writeback_path
from ckptqual.runs.task import Task

_NONE = contextlib.nullcontext(None)  # no writeback thread: the kernel starts writeback when it will


def directories_to_sync(directory: Path, file_paths: list[str]) -> list[Path]:
    """Every directory a checkpoint's files create or change: each file's parent up to the checkpoint directory,
    and the directory that holds the checkpoint directory (it gains its entry); deepest first."""
    chain = {directory, directory.parent}
    for relative in file_paths:
        chain.update((directory / relative).parents)
    return sorted((d for d in chain if d == directory.parent or directory in (d, *d.parents)), key=_depth, reverse=True)


def _depth(path: Path) -> int:
    return len(path.parts)


def _sync_behind(io: RankIO, path: Path) -> None:
    """Starts the writeback of what of a whole file is not under way yet, then makes it durable."""
    writeback_path(io, path)
    fsync_path(io, path)


def write_checkpoint_files(io: RankIO, task: Task) -> int:
    """Rank side: writes the rank's files of one checkpoint with the task's engine, then fsyncs files and directories.

    The rank creates the directories it needs, so that the main process never waits on the drive. With early
    writeback (the task's `early_writeback` option, on by default) the engine starts the writeback of each chunk
    as it writes it, and a thread of the rank's own fsyncs each file once it is whole, while the rank makes the
    next; without, the kernel writes back when it will and the files are fsynced once all are written. The rank is
    done only when everything it wrote is durable, every directory whose entries changed included (the
    checkpoint's own and the one that holds it).
    """
    engine = make_engine(task.options["engine"])
    directory, plan = Path(task.directory), task.plan
    if plan is None:
        raise ValueError(f"the write of checkpoint {task.checkpoint} into {directory} came without the rank's plan")
    paths = [directory / spec.path for spec in plan.files]
    io.begin("mkdir")
    for parent in sorted({directory} | {path.parent for path in paths}):
        with io.directory(parent, create=True):
            pass
    finish = getattr(engine, "finish", None)  # a format's commit after every rank's files are durable (dcp)
    early = io.early_writeback = task.options.get("early_writeback", True)
    try:
        io.begin("write")
        with ThreadPoolExecutor(1, "ckptqual-writeback") if early else _NONE as behind:
            started: list[Future] = []
            for index, (path, spec) in enumerate(zip(paths, plan.files, strict=True)):
                try:
                    engine.write(path, spec, index, io)
                except OSError as error:
                    raise on_path(error, path) from None
                if behind is not None:
                    started.append(behind.submit(_sync_behind, io, path))
            io.begin("fsync")
            for future in started:
                future.result()
        if not early:
            for path in paths:
                fsync_path(io, path)
        io.begin("commit")
        for parent in directories_to_sync(directory, [spec.path for spec in plan.files]):
            fsync_directory(io, parent)
    except Exception:
        if finish is not None:
            release_commit(io)  # the others wait for this rank in `finish`: they fail now, not at the timeout
        raise
    if finish is not None:
        finish(io, task)  # timed as the commit phase
    return plan.nbytes
