"""The dcp format: FileSystemWriter's files, byte for byte as torch writes them, proven by torch's own dcp.save and
dcp.load; `.metadata` refused before any unpickling unless it is what was written."""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptqual.io.crc import crc32
from ckptqual.io.engines.base import IntegrityError, RankIO
from ckptqual.io.engines.dcp import metadata_bytes, save_id
from ckptqual.io.engines.torcharchive import TensorArchive
from ckptqual.io.payload import PayloadGenerator, find_mismatches
from ckptqual.plan.dcp import METADATA, dcp_plan
from ckptqual.plan.formats import checkpoint_engine, formatted_plan, shared_files
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.spread import split_by_size
from ckptqual.plan.workloads import Architecture, Parallelism, deepspeed_plan
from ckptqual.runs import restore, save
from ckptqual.runs.failure import RankFailure
from ckptqual.runs.fill import FillCampaign
from ckptqual.runs.pool import RankPool
from ckptqual.runs.task import Task

SEED, CHECKPOINT = 21, 4
ARCH = Architecture(layers=4, hidden=64, ffn_hidden=128, heads=8, kv_heads=2, vocab=256)
ONE_RANK = CheckpointPlan(
    "one",
    (
        RankPlan(
            0,
            (
                FilePlan(
                    "a.pt",
                    (
                        TensorSpec("w", 70_001, "float16"),
                        TensorSpec("tiny", 1, "int8"),
                        TensorSpec("none", 0, "float32"),
                    ),
                ),
                FilePlan("b.pt", (TensorSpec("opt", 30_000, "float32"), TensorSpec("f8", 33, "float8_e4m3fn"))),
            ),
        ),
    ),
)


def rank_io(rank: int) -> RankIO:
    return RankIO(PayloadGenerator(SEED), rank=rank, checkpoint=CHECKPOINT, chunk_bytes=64 << 10)


def write(plan: CheckpointPlan, directory: Path) -> None:
    """Every rank's write as the rank runs it (files, fsyncs, then the coordinator's commit), one rank after another."""
    for rank in plan.ranks:
        save.write_checkpoint_files(
            rank_io(rank.rank), Task("write", CHECKPOINT, str(directory), rank, {"engine": "dcp"})
        )


def read(rank: RankPlan, directory: Path) -> dict:
    """A rank's verified read, then its dcp.load sample."""
    task = Task("read", CHECKPOINT, str(directory), rank, {"engine": "dcp"})
    io_ = rank_io(rank.rank)
    assert restore.read_checkpoint_files(io_, task) == rank.nbytes
    return restore.load_sample(io_, task)


@pytest.mark.parametrize(
    ("dtype", "numel"), [("float16", 5), ("float32", 1000), ("bfloat16", 77_777), ("int8", 1), ("float32", 0)]
)
def test_archive_is_torch_saves_bytes(dtype, numel):
    tensor = torch.arange(numel).to(getattr(torch, dtype))
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    data = tensor.view(torch.uint8).numpy().tobytes()
    archive = TensorArchive(TensorSpec("x", numel, dtype))
    assert archive.head + data + archive.tail(crc32(data)) == buffer.getvalue()


def test_split_by_size_is_torchs():
    from torch.distributed.checkpoint.filesystem import _split_by_size_and_type
    from torch.distributed.checkpoint.planner_helpers import _create_write_item_for_tensor

    specs = [TensorSpec(f"t{i}", n, "float32") for i, n in enumerate([5, 900, 40, 900, 7, 300, 1])]
    items = [_create_write_item_for_tensor(s.name, torch.empty(s.numel)) for s in specs]
    for bins in (1, 2, 3):
        theirs = [[item.index.fqn for item in bucket] for bucket in _split_by_size_and_type(bins, items)]
        assert [[s.name for s in bucket] for bucket in split_by_size(bins, specs)] == theirs


@pytest.mark.parametrize("threads", [1, 2])
def test_files_are_what_dcp_save_writes(tmp_path, threads):
    """torch's dcp.save of the same tensors (the payload) writes the same data files, and the metadata holds the same
    entries (the same bytes with one thread, where torch's order is fixed)."""
    plan = dcp_plan(ONE_RANK, threads)
    ours = tmp_path / "ours"
    write(plan, ours)
    state = {}
    generator = PayloadGenerator(SEED)
    for index, file in enumerate(plan.ranks[0].files):
        for position, spec in enumerate(file.tensors):
            tensor = torch.empty(spec.numel, dtype=getattr(torch, spec.dtype))
            generator.fill(tensor.view(torch.uint8).numpy(), CHECKPOINT, 0, index, position, 0)
            state[spec.name] = tensor
    order = [spec.name for file in ONE_RANK.ranks[0].files for spec in file.tensors]
    theirs = tmp_path / "theirs"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(
            {name: state[name] for name in order}, storage_writer=dcp.FileSystemWriter(theirs, thread_count=threads)
        )
    names = sorted(os.listdir(theirs))
    assert names == sorted(os.listdir(ours)) == [METADATA] + [f"__0_{i}.distcp" for i in range(threads)]
    for name in names[1:]:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    torch_metadata = pickle.loads((theirs / METADATA).read_bytes())
    meta = torch_metadata.storage_meta
    expected = metadata_bytes(plan.ranks[0].layout, str(meta.checkpoint_id), meta.save_id)
    if threads == 1:
        assert expected == (theirs / METADATA).read_bytes()
    assert pickle.loads(expected).storage_data == torch_metadata.storage_data
    assert pickle.loads(expected).state_dict_metadata == torch_metadata.state_dict_metadata


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A TP4 x PP2 checkpoint in dcp files, two per rank."""
    plan = dcp_plan(deepspeed_plan(ARCH, Parallelism(4, 2, 1, 1)), 2)
    directory = tmp_path_factory.mktemp("dcp") / "checkpoint-00004"
    write(plan, directory)
    return plan, directory


def test_sharded_checkpoint_reads_back_and_dcp_load_proves_it(sharded):
    plan, directory = sharded
    assert sorted(os.listdir(directory)) == [METADATA] + [f"__{r}_{i}.distcp" for r in range(8) for i in range(2)]
    for rank in plan.ranks:
        assert read(rank, directory) == {"torch_load_sampled": 1, "torch_load_sampled_s": pytest.approx(0, abs=60)}


def test_global_tensors_load_whole_with_dcp_and_hold_each_ranks_shard(sharded):
    """torch's own FileSystemReader, given the checked metadata, assembles each TP-split global tensor from the
    ranks' chunks at their offsets."""
    plan, directory = sharded
    layout = plan.ranks[0].layout
    sizes = layout.global_numel()
    wqkv = [chunk for chunk in layout.chunks if chunk.spec.name == "layers.1.attention.wqkv"]
    assert [c.offset for c in wqkv] == [0, 1 * wqkv[0].spec.numel, 2 * wqkv[0].spec.numel, 3 * wqkv[0].spec.numel]
    name = wqkv[0].spec.name
    state = {name: torch.empty(sizes[name], dtype=torch.float16)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=dcp.FileSystemReader(directory))
    data = state[name].view(torch.uint8).numpy()
    for chunk in wqkv:
        piece = data[chunk.offset * 2 : (chunk.offset + chunk.spec.numel) * 2]
        assert find_mismatches(PayloadGenerator(SEED), piece, CHECKPOINT, chunk.rank, chunk.file, chunk.tensor, 0) == []


def test_metadata_is_committed_by_rename_and_holds_the_layout(sharded):
    plan, directory = sharded
    expected = metadata_bytes(plan.ranks[0].layout, str(directory), save_id(SEED, CHECKPOINT))
    assert (directory / METADATA).read_bytes() == expected
    assert not (directory / ".metadata.tmp").exists()


class _Trap:
    """Unpickling it creates `marker`: proof that something unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("swap", ["trap", "other-checkpoint"])
def test_swapped_metadata_is_refused_before_anything_unpickles_it(tmp_path, swap):
    plan = dcp_plan(ONE_RANK, 1)
    directory = tmp_path / "checkpoint-00004"
    write(plan, directory)
    marker = tmp_path / "unpickled"
    if swap == "trap":
        (directory / METADATA).write_bytes(pickle.dumps(_Trap(marker)))
    else:  # a real Metadata, of this layout, from another checkpoint
        (directory / METADATA).write_bytes(metadata_bytes(plan.ranks[0].layout, str(directory), save_id(SEED, 3)))
    rank = plan.ranks[0]
    task = Task("read", CHECKPOINT, str(directory), rank, {"engine": "dcp"})
    with pytest.raises(IntegrityError, match=r"\.metadata: not the metadata written .* refused before anything"):
        restore.read_checkpoint_files(rank_io(0), task)
    with pytest.raises(IntegrityError, match="refused before anything unpickled it"):
        restore.load_sample(rank_io(0), task)
    assert not marker.exists()


@pytest.mark.parametrize("where", ["payload", "archive-head", "archive-tail"])
def test_a_changed_byte_in_a_data_file_is_named(tmp_path, where):
    plan = dcp_plan(ONE_RANK, 1)
    directory = tmp_path / "checkpoint-00004"
    write(plan, directory)
    path = directory / "__0_0.distcp"
    first = TensorArchive(plan.ranks[0].files[0].tensors[0])
    offset = {"payload": first.data_offset + 5000, "archive-head": 30, "archive-tail": first.nbytes - 30}[where]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    task = Task("read", CHECKPOINT, str(directory), plan.ranks[0], {"engine": "dcp"})
    with pytest.raises(IntegrityError, match=r"__0_0\.distcp"):
        restore.read_checkpoint_files(rank_io(0), task)


@pytest.fixture(scope="module")
def pool():
    """Two rank processes, started once for the tests below (each proves what it needs on the pool as it finds it)."""
    with RankPool(2, seed=SEED, timeout_s=300) as ranks:
        yield ranks


def test_ranks_commit_metadata_after_every_ranks_files_through_the_pool(tmp_path, pool):
    """Two rank processes: both write, meet, and rank 0 commits `.metadata`; both read back and dcp.load."""
    plan = dcp_plan(deepspeed_plan(ARCH, Parallelism(2, 1, 1, 1)), 1)
    directory = tmp_path / "checkpoint-00000"
    written = pool.write_checkpoint(directory, 0, plan.ranks, "dcp")
    timing = pool.run("read", directory, plan.ranks, "restore", 0, {"engine": "dcp"})
    assert written.bytes == timing.bytes == plan.total_bytes
    expected = metadata_bytes(plan.ranks[0].layout, str(directory), save_id(SEED, 0))
    assert (directory / METADATA).read_bytes() == expected


def test_fill_passes_write_dcp_checkpoints_and_remove_them_whole(checkpoint_space, pool):
    """The fill loop, unchanged, writes dcp checkpoints through the engine registry; retention removes every file a
    checkpoint holds, `.metadata` included."""
    plan = formatted_plan(deepspeed_plan(ARCH, Parallelism(2, 1, 1, 1)), "dcp")
    space, root = checkpoint_space(plan)
    space.declare("checkpoints/checkpoint-*", [f.path for r in plan.ranks for f in r.files] + list(shared_files("dcp")))
    campaign = FillCampaign(root, plan, pool, checkpoint_engine("dcp", "stream"), 2, remove=space.remove)
    campaign.run_pass(1)
    campaign.run_pass(2)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-00002", "checkpoint-00003"]
    assert sorted(os.listdir(root / "checkpoint-00003")) == [METADATA, "__0_0.distcp", "__1_0.distcp"]


def test_a_rank_that_fails_its_files_releases_the_others(tmp_path, pool):
    """A rank whose write fails breaks the meeting, so the coordinator fails at once instead of at the timeout, and
    no `.metadata` is committed; the pool's next checkpoint meets again."""
    plan = dcp_plan(deepspeed_plan(ARCH, Parallelism(2, 1, 1, 1)), 1)
    directory = tmp_path / "checkpoint-00000"
    directory.mkdir()
    (directory / "__1_0.distcp").write_bytes(b"in the way")  # rank 1 cannot create its file (O_EXCL)
    with pytest.raises(RankFailure, match="rank 1"):
        pool.write_checkpoint(directory, 0, plan.ranks, "dcp")
    assert not (directory / METADATA).exists()
    next_one = tmp_path / "checkpoint-00001"
    assert pool.write_checkpoint(next_one, 1, plan.ranks, "dcp").bytes == plan.total_bytes  # the pool goes on
    assert (next_one / METADATA).exists()


def test_dcp_plan_keeps_the_payload_bytes():
    source = deepspeed_plan(ARCH, Parallelism(4, 2, 1, 1))
    plan = dcp_plan(source, 3)
    assert plan.total_bytes == source.total_bytes
    assert [len(rank.files) for rank in plan.ranks] == [3] * 8
    assert np.all([chunk.offset >= 0 for chunk in plan.ranks[0].layout.chunks])
