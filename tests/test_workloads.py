"""Workload files and the checkpoint plans they imply, checked to the byte against docs/facts.md."""

from __future__ import annotations

from collections import Counter

import pytest

from ckptqual.plan.model import CheckpointPlan
from ckptqual.plan.workloads import (
    Architecture,
    Parallelism,
    WorkloadError,
    available_workloads,
    deepspeed_plan,
    dlio_v2_layer_files,
    load_workload,
    stage_layers,
)

LLAMA_405B = {
    "layers": 126,
    "hidden": 16384,
    "ffn_hidden": 53248,
    "heads": 128,
    "kv_heads": 8,
    "vocab": 128256,
}
SUBSETS = ["llama3-8b", "llama3-70b", "llama3-405b", "llama3-1t"]


def n_formula(layers: int, hidden: int, ffn_hidden: int, heads: int, kv_heads: int, vocab: int) -> int:
    """N of docs/facts.md, written out independently of the planner (the head size floored, as DLIO does)."""
    h, d_kv = hidden, hidden // heads * kv_heads
    return 2 * vocab * h + layers * (h + h * (h + 2 * d_kv) + h * h + h + 3 * h * ffn_hidden) + h


def deepspeed_bytes(arch: dict, tp: int, pp: int, dp: int) -> int:
    """Full-job bytes for ZeRO >= 1 at fp16/fp32: norms replicated over TP, optimizer 3 (N // ranks + 5h) per rank."""
    n, h, world = n_formula(**arch), arch["hidden"], tp * pp * dp
    replicated_norms = (tp - 1) * (2 * arch["layers"] + 1) * h
    return 2 * (n + replicated_norms) + 4 * world * (3 * (n // world) + 15 * h)


@pytest.fixture(scope="module")
def plans() -> dict[str, CheckpointPlan]:
    return {name: load_workload(name).plan() for name in available_workloads()}


def test_shipped_workloads_are_all_there():
    required = {"llama3.1-405b-review", "llama3.1-405b-tp4pp2", *SUBSETS, *(f"{n}-subset" for n in SUBSETS)}
    assert required <= set(available_workloads())


def test_review_checkpoint_is_exactly_the_reviews_size(plans):
    plan = plans["llama3.1-405b-review"]
    assert plan.total_bytes == 1_635_776_902_656
    assert plan.file_count == 536
    assert len(plan.ranks) == 8
    layer_files = [f for r in plan.ranks for f in r.files if f.path.startswith("layer-")]
    assert len(layer_files) == 4 * 132
    assert {f.nbytes for f in layer_files} == {796_925_952}
    assert all(len(f.tensors) == 6 and {t.dtype for t in f.tensors} == {"int8"} for f in layer_files)
    for rank in plan.ranks:
        optimizer = [f for f in rank.files if f.path == f"optimizer-1-1-{rank.rank}.pt"]
        assert [t.numel for t in optimizer[0].tensors] == [50_625_000_000] * 3
        assert len(rank.files) == (133 if rank.rank % 2 == 0 else 1)
    assert load_workload("llama3.1-405b-review").parameter_count() == 405_000_000_000


def test_llama3_8b_worked_example():
    workload = load_workload("llama3-8b")
    assert workload.parameter_count() == 8_030_261_248
    assert round(workload.plan().total_bytes / 2**30, 2) == 104.70


@pytest.mark.parametrize(
    ("name", "tp", "pp", "dp"),
    [("llama3-8b", 1, 1, 8), ("llama3-70b", 8, 1, 8), ("llama3-405b", 8, 32, 2), ("llama3-1t", 8, 64, 2)],
)
def test_mlperf_plans_match_the_closed_formula(plans, name, tp, pp, dp):
    workload = load_workload(name)
    arch = {key: getattr(workload.model, key) for key in LLAMA_405B}
    assert workload.parameter_count() == n_formula(**arch)
    assert plans[name].total_bytes == deepspeed_bytes(arch, tp, pp, dp)
    assert len(plans[name].ranks) == tp * pp * dp


def test_mlperf_table_sizes(plans):
    # The table prints DLIO's sizes, which are GiB (2^30) labelled "GB", and "TB" meaning 1000 of those.
    gib = {name: plans[name].total_bytes / 2**30 for name in SUBSETS}
    assert round(gib["llama3-8b"]) == 105
    assert abs(gib["llama3-70b"] - 912) < 1  # 911.21 by the formula of docs/facts.md: 0.09 % under the table
    assert round(gib["llama3-405b"] / 1000, 2) == 5.29
    assert round(gib["llama3-1t"]) == 15_427  # the table's "15,427 GiB by DLIO"


def test_review_layout_on_deepspeed_is_the_real_405b_state(plans):
    plan = plans["llama3.1-405b-tp4pp2"]
    assert plan.total_bytes == deepspeed_bytes(LLAMA_405B, 4, 2, 1)
    assert plan.file_count == (64 + 65) * 4 + 8
    assert all(t.dtype == "float32" for r in plan.ranks for f in r.files if "optim" in f.path for t in f.tensors)


@pytest.mark.parametrize("name", SUBSETS)
def test_subset_is_the_first_eight_ranks_of_the_full_job(plans, name):
    subset, full = plans[f"{name}-subset"], plans[name]
    assert len(subset.ranks) == 8
    assert subset.ranks == full.ranks[:8]
    assert subset.parallelism["processes"] == 8
    assert "first 8 ranks" in load_workload(f"{name}-subset").description


def test_every_shipped_plan_is_consistent(plans):
    for name, plan in plans.items():
        paths = [f.path for r in plan.ranks for f in r.files]
        assert len(paths) == len(set(paths)), f"{name}: two files share a path"
        assert [r.rank for r in plan.ranks] == list(range(len(plan.ranks)))
        assert all(t.numel > 0 for r in plan.ranks for f in r.files for t in f.tensors), name


@pytest.mark.parametrize("scale", [0.5, 0.01, 1e-6])
def test_scaled_plan_keeps_the_layout_and_shrinks_bytes(plans, scale):
    for name in ("llama3.1-405b-review", "llama3-70b", "llama3-405b-subset"):
        full, small = plans[name], plans[name].scaled(scale)
        assert [len(r.files) for r in small.ranks] == [len(r.files) for r in full.ranks]
        assert [[len(f.tensors) for f in r.files] for r in small.ranks] == [
            [len(f.tensors) for f in r.files] for r in full.ranks
        ]
        tensors = sum(len(f.tensors) for r in full.ranks for f in r.files)
        assert abs(small.total_bytes - full.total_bytes * scale) <= tensors * 4, name
        assert small.scale == scale


AWKWARD = Architecture(layers=11, hidden=60, ffn_hidden=100, heads=6, kv_heads=2, vocab=97)


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
@pytest.mark.parametrize(("tp", "pp", "dp", "layers"), [(3, 5, 7, 11), (5, 7, 3, 4), (7, 1, 5, 13), (1, 3, 1, 2)])
def test_awkward_parallelism_splits_exactly(zero_stage, tp, pp, dp, layers):
    arch = Architecture(layers, AWKWARD.hidden, AWKWARD.ffn_hidden, AWKWARD.heads, AWKWARD.kv_heads, AWKWARD.vocab)
    plan = deepspeed_plan(arch, Parallelism(tp, pp, dp, zero_stage))
    model = Counter()
    for rank in plan.ranks:
        for file in rank.files:
            if "model_states" in file.path:
                model.update({t.name: t.numel for t in file.tensors})
    expected = {
        t.name: t.numel * (1 if t.tp_split else tp) for layer in range(layers + 3) for t in arch.layer_tensors(layer)
    }
    assert dict(model) == expected
    n = arch.parameter_count()
    assert n == n_formula(layers, 60, 100, 6, 2, 97)
    assert sum(expected.values()) == n + (tp - 1) * (2 * layers + 1) * arch.hidden
    optimizer = [f.tensors[0].numel for r in plan.ranks for f in r.files if "optim" in f.path]
    writers = tp * pp if zero_stage == 0 else tp * pp * dp
    assert len(optimizer) == writers
    assert set(optimizer) == {3 * (n // writers) + 15 * arch.hidden}  # equal partitions of N // writers
    paths = [f.path for r in plan.ranks for f in r.files]
    assert len(paths) == len(set(paths))


def test_zero0_ranks_beyond_the_first_replica_write_nothing():
    plan = deepspeed_plan(AWKWARD, Parallelism(tp=3, pp=5, dp=7, zero_stage=0))
    assert len(plan.ranks) == 105
    assert all(not r.files for r in plan.ranks[15:])
    assert all(r.files for r in plan.ranks[:15])


def test_file_names_follow_deepspeed():
    names = lambda par: {f.path.split("/")[1] for r in deepspeed_plan(AWKWARD, par).ranks for f in r.files}  # noqa: E731
    pp2 = names(Parallelism(tp=2, pp=2, dp=2, zero_stage=1))
    assert {"layer_00-model_00_model_states.pt", "layer_13-model_01_model_states.pt"} <= pp2
    assert "zero_pp_rank_1_mp_rank_03_optim_states.pt" in pp2
    pp1 = names(Parallelism(tp=2, pp=1, dp=2, zero_stage=2))
    assert {"model_00_model_states.pt", "model_01_model_states.pt"} <= pp1
    z3 = names(Parallelism(tp=1, pp=1, dp=2, zero_stage=3))
    assert z3 == {f"zero_pp_rank_{d}_mp_rank_00_{kind}_states.pt" for d in (0, 1) for kind in ("model", "optim")}


@pytest.mark.parametrize(("layers", "pp"), [(11, 5), (126, 32), (3, 5), (4, 1)])
def test_pipeline_stages_cover_every_layer_once(layers, pp):
    stages = [stage_layers(layers, pp, s) for s in range(pp)]
    assert sorted(i for stage in stages for i in stage) == list(range(layers + 3))
    transformer = [len([i for i in stage if 1 <= i <= layers]) for stage in stages]
    assert transformer == [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]


@pytest.mark.parametrize(
    ("layers", "tp", "pp", "files"), [(126, 4, 2, 132), (126, 1, 2, 126), (5, 3, 2, 9), (7, 1, 1, 7)]
)
def test_dlio_v2_rounds_layers_and_adds_tp_files(layers, tp, pp, files):
    assert dlio_v2_layer_files(layers, Parallelism(tp, pp, 1)) == files


def test_dtypes_change_bytes_not_layout():
    par = Parallelism(tp=2, pp=3, dp=2, zero_stage=1)
    half = deepspeed_plan(AWKWARD, par)
    wide = deepspeed_plan(AWKWARD, par, model_dtype="float32", optimizer_dtype="float64")
    model = sum(f.nbytes for r in half.ranks for f in r.files if "model_states" in f.path)
    assert wide.total_bytes == 2 * half.total_bytes
    assert wide.file_count == half.file_count and model > 0
    with pytest.raises(WorkloadError, match=r"dtypes\.model"):
        deepspeed_plan(AWKWARD, par, model_dtype="fp17")


VALID = """\
description = "test"
layout = "deepspeed"
[model]
layers = 4
hidden = 64
ffn_hidden = 128
heads = 8
kv_heads = 2
vocab = 100
[parallelism]
tp = 2
pp = 2
dp = 2
zero_stage = 1
"""


def write(tmp_path, text: str):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return path


def test_a_head_size_that_is_not_whole_is_floored_as_dlio_does(tmp_path):
    workload = load_workload(str(write(tmp_path, VALID.replace("hidden = 64", "hidden = 70"))))
    assert workload.model.kv_dim == 70 // 8 * 2 == 16  # hidden * kv_heads // heads would give 17
    assert workload.parameter_count() == n_formula(4, 70, 128, 8, 2, 100)


def test_valid_file_by_path(tmp_path):
    workload = load_workload(str(write(tmp_path, VALID)))
    assert workload.name == "bad" and workload.plan().file_count > 0


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('description = "test"', 'description = "test"\ncolour = 1', "colour"),
        ("vocab = 100", "vocab = 100\nexperts = 8", "model.experts"),
        ("hidden = 64\n", "", "model.hidden"),
        ("[parallelism]\ntp = 2\npp = 2\ndp = 2\nzero_stage = 1\n", "", "parallelism"),
        ("tp = 2", 'tp = "2"', "parallelism.tp"),
        ("tp = 2", "tp = true", "parallelism.tp"),
        ("tp = 2", "tp = 0", "parallelism.tp"),
        ("dp = 2", "dp = -1", "parallelism.dp"),
        ("zero_stage = 1", "zero_stage = 4", "parallelism.zero_stage"),
        ("zero_stage = 1\n", "", "parallelism.zero_stage"),
        ("zero_stage = 1", "zero_stage = 1\nsubset_processes = 9", "parallelism.subset_processes"),
        ('layout = "deepspeed"', 'layout = "megatron"', "layout"),
        ("vocab = 100", "vocab = 100\nparameters = 1e9", "model.parameters"),
        ("heads = 8", "heads = 7", "model.kv_heads"),
        ("heads = 8", "heads = 6\nkv_heads_unused = 0", "model.kv_heads_unused"),
        ("layers = 4", "layers = 4.5", "model.layers"),
        ("zero_stage = 1", 'zero_stage = 1\n[dtypes]\nmodel = "fp17"', "dtypes.model"),
        ("zero_stage = 1", "zero_stage = 1\n[dtypes]\nmaster = 1", "dtypes.master"),
        ('layout = "deepspeed"', 'layout = "deepspeed"\ndtypes = 2', "dtypes"),
        ('description = "test"', 'description = ""', "description"),
    ],
)
def test_every_bad_value_names_file_and_key(tmp_path, old, new, key):
    assert old in VALID
    path = write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(WorkloadError) as caught:
        load_workload(str(path))
    message = str(caught.value)
    assert "bad.toml" in message and f"{key}:" in message
    assert "\n" not in message


def test_dlio_layout_rules(tmp_path):
    dlio = VALID.replace('"deepspeed"', '"dlio-v2"').replace("vocab = 100", "vocab = 100\nparameters = 8e3")
    with pytest.raises(WorkloadError, match=r"bad\.toml: parallelism\.zero_stage: unknown key"):
        load_workload(str(write(tmp_path, dlio)))
    workload = load_workload(str(write(tmp_path, dlio.replace("zero_stage = 1\n", ""))))
    assert workload.parameter_count() == 8000
    assert workload.plan().total_bytes > 3 * 8000
    with pytest.raises(WorkloadError, match=r"model\.parameters: must be an integer >= 1, got 0.5"):
        load_workload(str(write(tmp_path, dlio.replace("8e3", "0.5").replace("zero_stage = 1\n", ""))))


def test_broken_toml_and_unknown_names(tmp_path):
    with pytest.raises(WorkloadError, match=r"bad\.toml: not valid TOML"):
        load_workload(str(write(tmp_path, "layout = ")))
    with pytest.raises(WorkloadError, match=r"unknown workload 'llama9'; available: .*llama3-8b"):
        load_workload("llama9")
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(str(tmp_path / "missing.toml"))


def test_plain_value_api_validates_too():
    with pytest.raises(WorkloadError, match=r"parallelism\.tp: must be an integer >= 1, got 0"):
        Parallelism(tp=0, pp=1, dp=1)
    with pytest.raises(WorkloadError, match=r"parallelism\.zero_stage: must be an integer from 0 to 3, got 4"):
        Parallelism(tp=1, pp=1, dp=1, zero_stage=4)
    with pytest.raises(WorkloadError, match=r"model\.vocab"):
        Architecture(layers=1, hidden=8, ffn_hidden=8, heads=2, kv_heads=1, vocab=0)
