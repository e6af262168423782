"""The safetensors format: shards byte for byte as the safetensors library writes them, read by its safe_open; the
index as transformers writes it; every byte verified on restore."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save

from ckptqual.io.engines.base import IntegrityError, RankIO
from ckptqual.io.engines.safetensors import header
from ckptqual.io.payload import PayloadGenerator, find_mismatches
from ckptqual.plan.formats import formatted_plan
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.safetensors import INDEX
from ckptqual.plan.workloads import Architecture, Parallelism, deepspeed_plan
from ckptqual.runs import restore
from ckptqual.runs import save as save_checkpoint
from ckptqual.runs.pool import RankPool
from ckptqual.runs.task import Task

SEED, CHECKPOINT = 31, 2
ARCH = Architecture(layers=4, hidden=64, ffn_hidden=128, heads=8, kv_heads=2, vocab=256)


def rank_io(rank: int) -> RankIO:
    return RankIO(PayloadGenerator(SEED), rank=rank, checkpoint=CHECKPOINT, chunk_bytes=64 << 10)


def write(plan: CheckpointPlan, directory: Path) -> None:
    for rank in plan.ranks:
        task = Task("write", CHECKPOINT, str(directory), rank, {"engine": "safetensors"})
        save_checkpoint.write_checkpoint_files(rank_io(rank.rank), task)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """A TP4 x PP2 checkpoint as a safetensors export."""
    plan = formatted_plan(deepspeed_plan(ARCH, Parallelism(4, 2, 1, 1)), "safetensors")
    directory = tmp_path_factory.mktemp("st") / "checkpoint-00002"
    write(plan, directory)
    return plan, directory


def test_header_is_the_librarys():
    specs = (
        TensorSpec("b.x", 3, "float16"),
        TensorSpec("a", 5, "float32"),
        TensorSpec("c", 7, "int8"),
        TensorSpec("empty", 0, "float32"),
        TensorSpec("d", 2, "float64"),
        TensorSpec("e", 4, "float8_e5m2"),
    )
    state = {spec.name: torch.zeros(spec.numel, dtype=getattr(torch, spec.dtype)) for spec in specs}
    ordered = formatted_plan(CheckpointPlan("x", (RankPlan(0, (FilePlan("f.pt", specs),)),)), "safetensors")
    shard = ordered.ranks[0].files[0]
    assert [t.name for t in shard.tensors] == ["d", "a", "empty", "b.x", "e", "c"]  # the library's: dtype, then name
    data = save(state, metadata={"format": "pt"})
    assert data.startswith(header(shard.tensors))
    assert len(data) == len(header(shard.tensors)) + sum(s.nbytes for s in specs)


def test_shards_are_what_the_library_writes_and_hold_the_payload(sharded):
    """Each shard equals safetensors' own `save` of the tensors safe_open reads from it, and each global tensor is
    every rank's piece of it, in rank order."""
    plan, directory = sharded
    assert sorted(os.listdir(directory)) == [f"model-{k:05d}-of-00008.safetensors" for k in range(1, 9)] + [INDEX]
    generator = PayloadGenerator(SEED)
    for rank in plan.ranks:
        shard = rank.files[0]
        with safe_open(directory / shard.path, framework="pt") as opened:
            state = {name: opened.get_tensor(name) for name in opened.keys()}  # noqa: SIM118 (not a dict)
        assert (directory / shard.path).read_bytes() == save(state, metadata={"format": "pt"})
        for tensor, pieces in zip(shard.tensors, shard.pieces, strict=True):
            data, at = state[tensor.name].view(torch.uint8).numpy(), 0
            for piece in pieces:
                size = piece.numel * state[tensor.name].element_size()
                part = data[at : at + size]
                assert find_mismatches(generator, part, CHECKPOINT, piece.rank, piece.file, piece.tensor, 0) == []
                at += size
            assert at == data.nbytes


def test_index_maps_every_tensor_to_its_shard(sharded):
    plan, directory = sharded
    index = json.loads((directory / INDEX).read_text())
    assert index["metadata"]["total_size"] == plan.total_bytes
    names = {spec.name: rank.files[0].path for rank in plan.ranks for spec in rank.files[0].tensors}
    assert index["weight_map"] == names


def test_checkpoint_reads_back_and_safe_open_proves_it(sharded):
    plan, directory = sharded
    for rank in plan.ranks:
        task = Task("read", CHECKPOINT, str(directory), rank, {"engine": "safetensors"})
        assert restore.read_checkpoint_files(rank_io(rank.rank), task) == rank.nbytes
        assert restore.load_sample(rank_io(rank.rank), task)["torch_load_sampled"] == 1


@pytest.mark.parametrize("where", ["header", "payload", "index"])
def test_a_changed_byte_is_refused(tmp_path, where):
    plan = formatted_plan(deepspeed_plan(ARCH, Parallelism(2, 1, 1, 1)), "safetensors")
    directory = tmp_path / "checkpoint-00002"
    write(plan, directory)
    rank = plan.ranks[0]
    path = directory / (INDEX if where == "index" else rank.files[0].path)
    data = bytearray(path.read_bytes())
    data[{"header": 20, "payload": len(data) - 100, "index": 10}[where]] ^= 0x01
    path.write_bytes(bytes(data))
    task = Task("read", CHECKPOINT, str(directory), rank, {"engine": "safetensors"})
    with pytest.raises(IntegrityError, match=INDEX if where == "index" else rank.files[0].path):
        restore.read_checkpoint_files(rank_io(0), task)


def test_ranks_write_shards_then_the_index_through_the_pool(tmp_path):
    plan = formatted_plan(deepspeed_plan(ARCH, Parallelism(2, 1, 1, 1)), "safetensors")
    directory = tmp_path / "checkpoint-00000"
    with RankPool(2, seed=SEED, timeout_s=300) as pool:
        written = pool.write_checkpoint(directory, 0, plan.ranks, "safetensors")
        read = pool.run("read", directory, plan.ranks, "restore", 0, {"engine": "safetensors"})
    assert written.bytes == read.bytes == plan.total_bytes
    assert sorted(os.listdir(directory))[-1] == INDEX
