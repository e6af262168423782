"""The layout strategies: valid plans within their bounds, every odd case reachable, small readable shrinks."""

from __future__ import annotations

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.plan.planfile import load_plan, validate_plan
from ckptqual.plan.strategies import (
    DTYPES,
    DeepSpeedLayout,
    deepspeed_layouts,
    deepspeed_setups,
    describe_plan,
    dtypes,
    free_layouts,
    layouts,
    note_plan,
)
from ckptqual.plan.workloads import deepspeed_plan, load_workload
from hypothesis_profiles import PROFILE

BOUNDS = {
    "tiny": {"max_total_bytes": 4096, "max_file_bytes": 700, "max_files": 12},
    "unit": {},
    "qualification": {"max_total_bytes": 300 << 20, "max_file_bytes": 64 << 20, "max_files": 200},
}
# Searching for a feature: generation only (no shrinking needed), repeatable.
SEARCH = settings(max_examples=3000, database=None, derandomize=True, phases=[Phase.generate])
SHRINK = settings(database=None, derandomize=True, max_examples=2000)


def _tensors(plan: CheckpointPlan) -> list[TensorSpec]:
    return [t for r in plan.ranks for f in r.files for t in f.tensors]


@pytest.mark.parametrize("bounds", BOUNDS.values(), ids=BOUNDS.keys())
@PROFILE
@given(data=st.data())
def test_plans_are_valid_and_within_their_bounds(bounds, data):
    plan = data.draw(layouts(**bounds))
    note_plan(plan)
    validate_plan(plan)
    assert plan.total_bytes <= bounds.get("max_total_bytes", 4 << 20)
    assert plan.largest_file_bytes <= bounds.get("max_file_bytes", 4 << 20)
    assert plan.file_count <= bounds.get("max_files", 64)
    assert 1 <= len(plan.ranks) <= 16
    assert {t.dtype for t in _tensors(plan)} <= set(DTYPES)


@PROFILE
@given(deepspeed_setups(max_world_size=24, max_layers=7))
def test_deepspeed_setup_is_the_workloads_plan(setup: DeepSpeedLayout):
    expected = deepspeed_plan(
        setup.architecture,
        setup.parallelism,
        model_dtype=setup.model_dtype,
        optimizer_dtype=setup.optimizer_dtype,
        description=setup.plan.description,
    )
    assert setup.plan == expected
    assert setup.parallelism.world_size <= 24
    assert setup.architecture.layers <= 7
    assert setup.parallelism.subset_processes is None


DEEPSPEED_FEATURES = {
    "prime TP of 5 or more": lambda s: s.parallelism.tp in (5, 7, 11, 13),
    "prime PP of 5 or more": lambda s: s.parallelism.pp in (5, 7, 11, 13),
    "odd DP beside TP > 1": lambda s: s.parallelism.dp in (3, 5, 7) and s.parallelism.tp > 1,
    "layers not divisible by PP": lambda s: s.parallelism.pp > 1 and s.architecture.layers % s.parallelism.pp,
    "more stages than layers": lambda s: s.parallelism.pp > s.architecture.layers,
    "ZeRO 0 ranks writing nothing": lambda s: s.parallelism.zero_stage == 0 and any(not r.files for r in s.plan.ranks),
    "ZeRO 1": lambda s: s.parallelism.zero_stage == 1,
    "ZeRO 2 with PP > 1": lambda s: s.parallelism.zero_stage == 2 and s.parallelism.pp > 1,
    "ZeRO 3 with DP > 1": lambda s: s.parallelism.zero_stage == 3 and s.parallelism.dp > 1,
    "ZeRO 3 shards that are empty": lambda s: (
        s.parallelism.zero_stage == 3 and any(t.numel == 0 for t in _tensors(s.plan))
    ),
    "grouped-query attention": lambda s: 1 < s.architecture.kv_heads < s.architecture.heads,
    "hidden above 64, not a multiple of 64": lambda s: s.architecture.hidden > 64 and s.architecture.hidden % 64,
    "bf16 model, fp32 optimizer": lambda s: (s.model_dtype, s.optimizer_dtype) == ("bfloat16", "float32"),
    "fp16 model": lambda s: s.model_dtype == "float16",
    "fp8 model": lambda s: s.model_dtype.startswith("float8"),
    "tensors over 4 KiB not a multiple of 64 bytes": lambda s: any(
        t.nbytes > 4096 and t.nbytes % 64 for t in _tensors(s.plan)
    ),
}


@pytest.mark.parametrize("feature", DEEPSPEED_FEATURES, ids=DEEPSPEED_FEATURES.keys())
def test_deepspeed_layouts_reach(feature):
    if feature == "fp8 model" and not any(d.startswith("float8") for d in DTYPES):
        pytest.skip("this torch has no float8 dtypes")
    found = find(deepspeed_setups(), DEEPSPEED_FEATURES[feature], settings=SEARCH)
    assert DEEPSPEED_FEATURES[feature](found)


def _skewed(plan: CheckpointPlan) -> bool:
    """Many tiny files on one rank beside one file of at least a quarter of the 4 MiB default on another."""
    many_tiny = any(sum(f.nbytes <= 64 for f in r.files) >= 10 for r in plan.ranks)
    return many_tiny and plan.largest_file_bytes >= 1 << 20


FREE_FEATURES = {
    "an empty tensor": lambda p: any(t.numel == 0 for t in _tensors(p)),
    "a single-element tensor": lambda p: any(t.numel == 1 for t in _tensors(p)),
    "a file of no tensors": lambda p: any(not f.tensors for r in p.ranks for f in r.files),
    "a file of an odd byte count": lambda p: any(f.nbytes % 2 for r in p.ranks for f in r.files),
    "a file over 64 KiB, not a multiple of 4096": lambda p: any(
        f.nbytes > 65536 and f.nbytes % 4096 for r in p.ranks for f in r.files
    ),
    "a subdirectory two deep": lambda p: any(f.path.count("/") >= 2 for r in p.ranks for f in r.files),
    "a rank writing nothing between writers": lambda p: (
        any(not r.files and 0 < r.rank < len(p.ranks) - 1 for r in p.ranks) and p.file_count > 0
    ),
    "16 ranks": lambda p: len(p.ranks) == 16,
    "many tiny files beside a huge one": _skewed,
    "every dtype in one plan": lambda p: {t.dtype for t in _tensors(p)} == set(DTYPES),
}


@pytest.mark.parametrize("feature", FREE_FEATURES, ids=FREE_FEATURES.keys())
def test_free_layouts_reach(feature):
    found = find(free_layouts(), FREE_FEATURES[feature], settings=SEARCH)
    assert FREE_FEATURES[feature](found)


def test_layouts_draw_both_kinds():
    assert find(layouts(), lambda p: p.workload == "free", settings=SEARCH).workload == "free"
    assert find(layouts(), lambda p: p.workload == "deepspeed", settings=SEARCH).workload == "deepspeed"


def test_a_failure_needing_bytes_shrinks_to_one_int8_element():
    plan = find(free_layouts(), lambda p: p.total_bytes > 0, settings=SHRINK)
    assert describe_plan(plan) == (
        "free: 1 rank, 1 file, 1 tensor, 1 B\n  rank 0: 1 file, 1 B\n    rank0_file0.pt (1 B): [t0 int8[1]]"
    )


def test_a_failure_needing_three_ranks_shrinks_to_the_smallest_model():
    plan = find(deepspeed_layouts(), lambda p: len(p.ranks) >= 3, settings=SHRINK)
    first = describe_plan(plan).splitlines()[0]  # the exact minimum depends on the Hypothesis version
    assert first.startswith("deepspeed (L=1 h=1 ffn=1 heads=1 kv=1 V=1;")
    assert len(plan.ranks) in (3, 4) and plan.total_bytes < 200 and plan.file_count <= 6


def test_a_failure_needing_odd_pipeline_splits_shrinks_small():
    plan = find(deepspeed_setups(), lambda s: s.parallelism.pp == 3 and s.architecture.layers % 3 == 2, settings=SHRINK)
    a, p = plan.architecture, plan.parallelism
    assert a.layers in (2, 5) and max(a.hidden, a.ffn_hidden, a.vocab, a.heads) <= 4
    assert p.pp == 3 and p.tp * p.dp <= 2
    assert plan.plan.total_bytes < 1000


def test_describe_plan_stays_short_for_a_large_job():
    plan = load_workload("llama3.1-405b-review").plan()
    text = describe_plan(plan)
    assert len(text.splitlines()) <= 1 + 16 * (1 + 6 + 1) + 1
    assert "more files" in text
    assert max(len(line) for line in text.splitlines()) < 300
    assert text.splitlines()[0].startswith("llama3.1-405b-review (")


def test_describe_plan_groups_silent_ranks_and_shows_scale():
    ranks = (
        RankPlan(0, (FilePlan("a.pt", (TensorSpec("x", 3, "float16"),)),)),
        RankPlan(1, ()),
        RankPlan(2, ()),
        RankPlan(3, ()),
        RankPlan(4, (FilePlan("d/b.pt", ()),)),
    )
    plan = CheckpointPlan("w", ranks, scale=0.5)
    assert describe_plan(plan) == (
        "w scale=0.5: 5 ranks, 2 files, 1 tensor, 6 B\n"
        "  rank 0: 1 file, 6 B\n"
        "    a.pt (6 B): [x float16[3]]\n"
        "  ranks 1-3: nothing\n"
        "  rank 4: 1 file, 0 B\n"
        "    d/b.pt (0 B): []"
    )
    assert describe_plan(CheckpointPlan("empty", ())) == "empty: 0 ranks, 0 files, 0 tensors, 0 B"


def test_note_plan_puts_a_reproducing_plan_file_in_the_failure_report():
    @settings(database=None, derandomize=True, max_examples=50, phases=[Phase.generate])
    @given(free_layouts(max_total_bytes=1000, max_files=6))
    def fails_on_three_files(plan):
        note_plan(plan)
        assert plan.file_count < 3

    with pytest.raises(AssertionError) as caught:
        fails_on_three_files()
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "layout:\nfree" in notes
    marker = "plan file (save it and pass it to planfile.load_plan to reproduce):\n"
    text = notes[notes.index(marker) + len(marker) :]
    plan = load_plan(text[: text.index("\n}\n") + 3])
    assert plan.file_count >= 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: free_layouts(max_total_bytes=-1), "max_total_bytes"),
        (lambda: free_layouts(max_files=1.5), "max_files"),
        (lambda: free_layouts(max_ranks=0), "max_ranks"),
        (lambda: free_layouts(max_file_bytes=-3), "max_file_bytes"),
        (lambda: free_layouts(allowed_dtypes=["float12"]), "dtypes"),
        (lambda: deepspeed_setups(max_total_bytes=50), "too small"),
        (lambda: deepspeed_setups(max_files=1), "too small"),
        (lambda: deepspeed_setups(zero_stages=[4]), "zero_stages"),
        (lambda: deepspeed_setups(max_world_size=0), "max_world_size"),
        (lambda: dtypes([]), "dtypes"),
    ],
)
def test_bad_bounds_are_refused_when_the_strategy_is_made(make, message):
    with pytest.raises(InvalidArgument, match=message):
        make()


@PROFILE
@given(deepspeed_setups(model_dtypes=["float64", "int8"], optimizer_dtypes=["float64"], zero_stages=[3]))
def test_deepspeed_dtypes_and_stages_can_be_chosen(setup: DeepSpeedLayout):
    assert setup.model_dtype in ("float64", "int8")
    assert setup.optimizer_dtype == "float64"
    assert setup.parallelism.zero_stage == 3


def test_dtypes_list_int8_first_and_only_what_torch_has():
    import torch

    assert DTYPES[0] == "int8"
    assert {"float32", "bfloat16", "float16", "int8"} <= set(DTYPES)
    assert all(hasattr(torch, name) for name in DTYPES)
    assert find(dtypes(), lambda d: True, settings=SHRINK) == "int8"
