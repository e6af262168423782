"""Restoring a TP4 x PP2 checkpoint onto TP8 x PP1: each new rank reads exactly what the plan says (dcp: the whole
items of the chunks that overlap its shards; safetensors: the exact overlapping bytes; torch-save: whole files),
and every byte it reads is verified."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ckptqual.io.engines.base import IntegrityError, RankIO
from ckptqual.io.engines.safetensors import header
from ckptqual.io.engines.torcharchive import archive_of
from ckptqual.io.payload import PayloadGenerator
from ckptqual.plan.dcp import METADATA
from ckptqual.plan.formats import checkpoint_engine, formatted_plan
from ckptqual.plan.model import DTYPE_BYTES
from ckptqual.plan.reshard import ReshardError, new_layout_needs
from ckptqual.plan.workloads import Architecture, Parallelism, Workload
from ckptqual.runs import reshard, save
from ckptqual.runs.task import Task

SEED, CHECKPOINT, SCALE = 41, 6, 0.37  # a scale that leaves the old and the new shards unaligned
ARCH = Architecture(layers=4, hidden=64, ffn_hidden=128, heads=8, kv_heads=2, vocab=256)
WORKLOAD = Workload("tiny", "tiny", "deepspeed", ARCH, Parallelism(4, 2, 1, 1), "float16", "float32")
SOURCE = WORKLOAD.plan().scaled(SCALE)


def rank_io(rank: int) -> RankIO:
    return RankIO(PayloadGenerator(SEED), rank=rank, checkpoint=CHECKPOINT, chunk_bytes=64 << 10)


@pytest.fixture(scope="module", params=["dcp", "safetensors", "torch-save"])
def written(request, tmp_path_factory):
    """The checkpoint in one format, and each rank of 8x1's reads of it."""
    fmt = request.param
    plan = formatted_plan(SOURCE, fmt)
    engine = checkpoint_engine(fmt, "stream")
    directory = tmp_path_factory.mktemp(fmt) / "checkpoint-00006"
    for rank in plan.ranks:
        save.write_checkpoint_files(
            rank_io(rank.rank), Task("write", CHECKPOINT, str(directory), rank, {"engine": engine})
        )
    return fmt, plan, directory, reshard.layout_plans(WORKLOAD, SCALE, plan, "8x1", engine)


def read_all(plans, directory: Path) -> list[int]:
    return [
        reshard.read_for_layout(rank_io(p.rank), Task("reshard-read", CHECKPOINT, str(directory), p)) for p in plans
    ]


def test_needs_cover_each_global_tensor_once_per_replica():
    """Every TP-split tensor and the optimizer state are covered exactly by the new ranks' needs, without overlap."""
    needs = new_layout_needs(WORKLOAD, SOURCE, 8, 1)
    totals: dict[str, int] = {}
    for rank in SOURCE.ranks:
        for file in rank.files:
            for spec in file.tensors:
                totals[spec.name] = totals.get(spec.name, 0) + spec.numel
    covered: dict[str, list[tuple[int, int]]] = {}
    for own in needs:
        for need in own:
            covered.setdefault(need.name, []).append((need.start, need.start + need.numel))
    for name in ("embedding", "lm_head", "layers.2.attention.wqkv", "optimizer.state"):
        spans = sorted(covered[name])
        assert spans[0][0] == 0 and spans[-1][1] == totals[name], name
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), name
    assert len(covered["layers.1.attention_norm"]) == 8  # every new rank reads one copy of a replicated tensor


def test_reads_match_the_plan_exactly_and_every_byte_is_verified(written):
    fmt, plan, directory, plans = written
    moved = read_all(plans, directory)
    whole = ("file", "metadata")  # whole files (torch-save's, dcp's .metadata): their sizes
    expected = [
        sum((directory / r.path).stat().st_size if r.kind in whole else r.length for r in p.reads) for p in plans
    ]
    assert moved == expected
    if fmt == "dcp":  # the coordinator reads .metadata first, byte for byte, as DCP's load does
        assert [r.kind for r in plans[0].reads[:2]] == ["metadata", "archive"]
        assert all(r.kind == "archive" for p in plans[1:] for r in p.reads)
    result = reshard.figures(plans, moved, plan.total_bytes, "4x2 -> 8x1")
    assert result["read_amplification"] == sum(moved) / plan.total_bytes
    assert (result["reads"] == "byte ranges") == (fmt != "torch-save")


@pytest.mark.parametrize("written", ["dcp"], indirect=True)
def test_dcp_reads_the_whole_items_of_the_overlapping_chunks(written):
    """Independently of the read plan: for each new rank, the items of exactly the chunks that overlap its needs."""
    _, plan, directory, plans = written
    needs = new_layout_needs(WORKLOAD, SOURCE, 8, 1)
    chunks = plan.ranks[0].layout.chunks
    for own, rank_plan in zip(needs, plans, strict=True):
        wanted = sum(
            archive_of(c.spec).nbytes
            for need in own
            for c in chunks
            if c.spec.name == need.name and c.offset < need.start + need.numel and need.start < c.offset + c.spec.numel
        )
        assert sum(r.length for r in rank_plan.reads) == wanted
    assert 1.0 < sum(read_all(plans, directory)) / plan.total_bytes < 2.1


@pytest.mark.parametrize("written", ["safetensors"], indirect=True)
def test_safetensors_reads_exactly_the_needed_bytes(written):
    """Each new rank reads exactly its needs' bytes, plus the header of each shard it opens."""
    _, plan, _, plans = written
    needs = new_layout_needs(WORKLOAD, SOURCE, 8, 1)
    dtypes = {spec.name: spec.dtype for rank in SOURCE.ranks for file in rank.files for spec in file.tensors}
    shards = {f.path: f for r in plan.ranks for f in r.files}
    for own, rank_plan in zip(needs, plans, strict=True):
        headers = sum(len(header(shards[path].tensors)) for path in {r.path for r in rank_plan.reads})
        data = sum(n.numel * DTYPE_BYTES[dtypes[n.name]] for n in own)
        assert sum(r.length for r in rank_plan.reads) == data + headers


def test_a_changed_byte_in_a_range_a_new_rank_reads_is_named(tmp_path):
    plan = formatted_plan(SOURCE, "safetensors")
    directory = tmp_path / "checkpoint-00006"
    for rank in plan.ranks:
        save.write_checkpoint_files(
            rank_io(rank.rank), Task("write", CHECKPOINT, str(directory), rank, {"engine": "safetensors"})
        )
    plans = reshard.layout_plans(WORKLOAD, SCALE, plan, "8x1", "safetensors")
    target = next(r for r in plans[3].reads if r.kind == "payload" and r.length > 10)
    path = directory / target.path
    data = bytearray(path.read_bytes())
    data[target.offset + 7] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=target.path):
        reshard.read_for_layout(rank_io(3), Task("reshard-read", CHECKPOINT, str(directory), plans[3]))


def test_a_swapped_metadata_stops_the_coordinators_reads(tmp_path):
    plan = formatted_plan(SOURCE, "dcp")
    directory = tmp_path / "checkpoint-00006"
    for rank in plan.ranks:
        save.write_checkpoint_files(
            rank_io(rank.rank), Task("write", CHECKPOINT, str(directory), rank, {"engine": "dcp"})
        )
    (directory / METADATA).write_bytes(b"\x80\x04K\x01.")  # a pickle of 1
    plans = reshard.layout_plans(WORKLOAD, SCALE, plan, "8x1", "dcp")
    with pytest.raises(IntegrityError, match="refused before anything unpickled it"):
        reshard.read_for_layout(rank_io(0), Task("reshard-read", CHECKPOINT, str(directory), plans[0]))


@pytest.mark.parametrize(("tp", "pp", "why"), [(8, 2, "16 ranks per replica"), (3, 3, "9 ranks")])
def test_a_layout_of_other_rank_counts_is_refused(tp, pp, why):
    with pytest.raises(ReshardError, match=why):
        new_layout_needs(WORKLOAD, SOURCE, tp, pp)
