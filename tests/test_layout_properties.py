"""Properties of the engine over generated odd layouts: shards add up, paths never collide, bytes are exact.

Every plan Hypothesis draws (strategies.layouts: free and DeepSpeed) is written with both engines, read back
with torch.load and checked to the byte against the payload; DeepSpeed plans are checked against the model.
"""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import torch
from hypothesis import given

from ckptqual.io.engines.base import DEFAULT_CHUNK_BYTES, RankIO
from ckptqual.io.engines.stream import StreamEngine
from ckptqual.io.engines.torch_save import TorchSaveEngine
from ckptqual.io.payload import BLOCK_BYTES, PayloadGenerator, find_mismatches
from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.planfile import dump_plan, load_plan, validate_plan
from ckptqual.plan.strategies import DeepSpeedLayout, deepspeed_setups, layouts, note_plan
from ckptqual.plan.workloads import Architecture
from hypothesis_profiles import PROFILE

SEED = 20250605
GENERATOR = PayloadGenerator(SEED)  # one 8 MiB pool for the module, not one per example
# Small enough that one example (two engines, read back, verify) takes well under a second on 2 cores.
SMALL = {"max_total_bytes": 2 << 20, "max_files": 32}


def model_tensor_sizes(arch: Architecture) -> tuple[dict[str, int], set[str]]:
    """Every logical model tensor's full size (docs/facts.md, written out apart from workloads), and the norms."""
    h, ffn, vocab = arch.hidden, arch.ffn_hidden, arch.vocab
    d_kv = h // arch.heads * arch.kv_heads
    sizes = {"embedding": h * vocab, "lm_head": h * vocab, "final_norm": h}
    for layer in range(1, arch.layers + 1):
        p = f"layers.{layer}."
        sizes |= {
            p + "attention_norm": h,
            p + "attention.wqkv": h * (h + 2 * d_kv),
            p + "attention.wo": h * h,
            p + "ffn_norm": h,
            p + "feed_forward.w13": 2 * h * ffn,
            p + "feed_forward.w2": h * ffn,
        }
    return sizes, {name for name in sizes if name.endswith("norm")}


def n_formula(arch: Architecture) -> int:
    """N = 2 V h + L (h + h (h + 2 d_kv) + h^2 + h + 3 h ffn) + h."""
    h, d_kv = arch.hidden, arch.hidden // arch.heads * arch.kv_heads
    return 2 * arch.vocab * h + arch.layers * (h + h * (h + 2 * d_kv) + h * h + h + 3 * h * arch.ffn_hidden) + h


@PROFILE
@given(deepspeed_setups(max_total_bytes=1 << 40, max_files=4096, max_world_size=64, max_layers=16))
def test_deepspeed_shards_add_up_to_the_model(setup: DeepSpeedLayout):
    arch, par, plan = setup.architecture, setup.parallelism, setup.plan
    note_plan(plan)
    sizes, norms = model_tensor_sizes(arch)
    n, h = n_formula(arch), arch.hidden
    per_tp: dict[tuple[str, int], int] = defaultdict(int)  # (tensor, tp rank) -> elements held
    optimizer_by_rank: dict[int, int] = {}
    model_ranks = set()
    for rank in plan.ranks:
        tp = par.coordinates(rank.rank)[2]
        for spec in rank.files:
            if spec.path.endswith("_optim_states.pt"):
                assert [(t.name, t.dtype) for t in spec.tensors] == [("optimizer.state", setup.optimizer_dtype)]
                optimizer_by_rank[rank.rank] = spec.tensors[0].numel
                continue
            model_ranks.add(rank.rank)
            for tensor in spec.tensors:
                assert tensor.dtype == setup.model_dtype
                per_tp[tensor.name, tp] += tensor.numel

    for name, full in sizes.items():
        held = [per_tp.get((name, tp), 0) for tp in range(par.tp)]
        if name in norms:  # replicated over TP: every TP rank holds all of it (split over DP under ZeRO-3)
            assert held == [full] * par.tp, name
        else:
            assert sum(held) == full, name
    assert {name for name, _ in per_tp} == set(sizes)
    assert sum(per_tp.values()) == n + (par.tp - 1) * (2 * arch.layers + 1) * h

    first_replica = {r.rank for r in plan.ranks if par.coordinates(r.rank)[0] == 0}
    writers = first_replica if par.zero_stage == 0 else {r.rank for r in plan.ranks}
    assert set(optimizer_by_rank) == writers
    assert set(optimizer_by_rank.values()) == {3 * (n // len(writers)) + 15 * h}  # equal partitions, as DLIO's
    assert model_ranks <= (first_replica if par.zero_stage < 3 else writers)
    silent = {r.rank for r in plan.ranks if not r.files}
    assert silent == ({r.rank for r in plan.ranks} - first_replica if par.zero_stage == 0 else set())


@PROFILE
@given(layouts(max_total_bytes=1 << 30, max_files=512))
def test_no_two_ranks_write_the_same_file(plan: CheckpointPlan):
    note_plan(plan)
    paths = Counter(spec.path for rank in plan.ranks for spec in rank.files)
    assert [path for path, count in paths.items() if count > 1] == []
    assert [r.rank for r in plan.ranks] == list(range(len(plan.ranks)))
    validate_plan(plan)  # also: no file path is another file's directory, tensor names unique per file


def _write_all(engine, root: Path, plan: CheckpointPlan, checkpoint: int, chunk_bytes: int) -> None:
    for rank in plan.ranks:
        io = RankIO(GENERATOR, rank.rank, checkpoint, chunk_bytes)
        for index, spec in enumerate(rank.files):
            path = root / spec.path
            path.parent.mkdir(parents=True, exist_ok=True)
            engine.write(path, spec, index, io)
        assert io.generated_bytes == rank.nbytes, f"rank {rank.rank}: payload generated differs from the plan"


def _read_back(root: Path, plan: CheckpointPlan, checkpoint: int) -> int:
    """Loads every file with torch.load, checks names, dtypes, sizes and payload; returns the bytes read."""
    total = 0
    for rank in plan.ranks:
        for index, spec in enumerate(rank.files):
            state = torch.load(root / spec.path, weights_only=True)
            assert list(state) == [t.name for t in spec.tensors], spec.path
            for number, expected in enumerate(spec.tensors):
                tensor = state[expected.name]
                assert tensor.dtype == getattr(torch, expected.dtype), (spec.path, expected.name)
                assert tuple(tensor.shape) == (expected.numel,), (spec.path, expected.name)
                data = tensor.view(torch.uint8).numpy() if expected.numel else np.empty(0, np.uint8)
                assert data.nbytes == expected.nbytes
                bad = find_mismatches(GENERATOR, data, checkpoint, rank.rank, index, number, 0)
                assert bad == [], f"{spec.path} {expected.name}: {bad[0].describe()}"
                total += data.nbytes
    return total


@PROFILE
@given(
    plan=layouts(**SMALL),
    chunk_bytes=st.sampled_from((DEFAULT_CHUNK_BYTES, BLOCK_BYTES, 3 * BLOCK_BYTES)),
    checkpoint=st.integers(0, 3),
)
def test_engines_write_and_torch_load_reads_exactly_the_plan(plan: CheckpointPlan, chunk_bytes: int, checkpoint: int):
    note_plan(plan)
    planned = sorted(spec.path for rank in plan.ranks for spec in rank.files)
    # A fresh directory per example: pytest's tmp_path is shared by all examples of one test.
    with tempfile.TemporaryDirectory(prefix="ckptqual-layout-") as tmp:
        for engine in (StreamEngine(), TorchSaveEngine()):
            root = Path(tmp) / engine.name
            root.mkdir()
            _write_all(engine, root, plan, checkpoint, chunk_bytes)
            written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
            assert written == planned, engine.name
            assert _read_back(root, plan, checkpoint) == plan.total_bytes, engine.name


@PROFILE
@given(plan=layouts(max_total_bytes=256 << 20, max_files=256), scale=st.floats(1e-9, 1.0))
def test_scaling_keeps_the_layout(plan: CheckpointPlan, scale: float):
    note_plan(plan)
    scaled = plan.scaled(scale)
    assert scaled.scale == plan.scale * scale
    assert (scaled.workload, scaled.description, scaled.parallelism) == (
        plan.workload,
        plan.description,
        plan.parallelism,
    )
    assert [r.rank for r in scaled.ranks] == [r.rank for r in plan.ranks]
    for rank, small in zip(plan.ranks, scaled.ranks, strict=True):
        assert [f.path for f in small.files] == [f.path for f in rank.files]
        for spec, small_spec in zip(rank.files, small.files, strict=True):
            assert [(t.name, t.dtype) for t in small_spec.tensors] == [(t.name, t.dtype) for t in spec.tensors]
            for tensor, small_tensor in zip(spec.tensors, small_spec.tensors, strict=True):
                assert small_tensor.numel <= tensor.numel
                assert (small_tensor.numel == 0) == (tensor.numel == 0), "an empty tensor stays empty, no other"
                if tensor.numel:
                    assert small_tensor.numel <= max(1, tensor.numel * scale)
                    assert small_tensor.numel > tensor.numel * scale - 1
    assert scaled.total_bytes <= plan.total_bytes
    assert scaled.file_count == plan.file_count
    validate_plan(scaled)


@PROFILE
@given(layouts(max_total_bytes=1 << 40, max_files=512))
def test_plan_file_round_trip_is_exact(plan: CheckpointPlan):
    note_plan(plan)
    text = dump_plan(plan)
    again = load_plan(text)
    assert again == plan
    assert dump_plan(again) == text
