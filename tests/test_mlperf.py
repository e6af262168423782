"""MLPerf Storage's checkpointing rules: the plan's bytes are DLIO's to the byte, MLPerf's metrics from per-rank
records, and the mlperf-checkpointing profile run for real (10 writes, 10 cold reads, nothing MLPerf lacks)."""

from __future__ import annotations

import json
import shutil

import pytest

from ckptqual.cli import main
from ckptqual.config.drive_file import load_drive_file
from ckptqual.config.run_settings import resolve_settings
from ckptqual.config.space import space_needed
from ckptqual.config.values import SettingsError
from ckptqual.limits.limits import Limit
from ckptqual.limits.verdict import overall_verdict, unjudged_limits
from ckptqual.plan.workloads import load_workload
from ckptqual.report.extract import ResultsError, Run
from ckptqual.report.mlperf import (
    checkpoint_metrics,
    mean_over_runs,
    mlperf_lines,
    mlperf_metrics,
    phase_metrics,
    runs_lines,
)
from suite_runs import junit_cases, results, run_suite

# DLIO's formulas, written out here from its source as it stands at argonne-lcf/dlio_benchmark commit
# e1919d7b6ccffbe15143cd616517da9e5d7b26a7 (2026-06-17), dlio_benchmark/checkpointing/base_checkpointing.py:
# get_num_parameters, get_layer_parameters, get_layer_index, get_optimization_groups and save_checkpoint (which ranks
# save what); model tensors fp16 (2 bytes), optimizer fp32 (4 bytes), as the llama configs say.
# Architectures: dlio_benchmark/configs/workload/llama_8b_zero3.yaml, llama_70b_zero3.yaml, llama_405b.yaml,
# llama_1t.yaml; parallelism (TP, PP, DP, ZeRO): MLPerf Storage v2.0's table (docs/facts.md).
MODELS = {
    # name: (layers, hidden, ffn, heads, kv heads, vocab), (tp, pp, dp, zero stage)
    "llama3-8b": ((32, 4096, 14336, 32, 8, 128256), (1, 1, 8, 3)),
    "llama3-70b": ((80, 8192, 28672, 128, 8, 128256), (8, 1, 8, 3)),
    "llama3-405b": ((126, 16384, 53248, 128, 8, 128256), (8, 32, 2, 1)),
    "llama3-1t": ((128, 25872, 98304, 192, 32, 128256), (8, 64, 2, 1)),
}


def dlio_num_parameters(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab: int) -> int:
    """BaseCheckpointing.get_num_parameters."""
    head_size = hidden // heads
    dim_kv = head_size * kv_heads
    embedding = vocab * hidden
    qkv = hidden * (hidden + 2 * dim_kv)
    per_layer = hidden + qkv + hidden * hidden + hidden + ffn * 2 * hidden + ffn * hidden
    return embedding + per_layer * layers + hidden + embedding


def dlio_layer_parameters(layer: int, arch: tuple, tp: int, sharding: int) -> list[int]:
    """BaseCheckpointing.get_layer_parameters (sharding: DP under ZeRO-3, else 1)."""
    layers, hidden, ffn, heads, kv_heads, vocab = arch
    dim_kv = hidden // heads * kv_heads
    if layer in (0, layers + 1):
        return [hidden * vocab // tp // sharding]
    if layer == layers + 2:
        return [hidden // sharding]
    return [
        hidden // sharding,
        hidden * (hidden + 2 * dim_kv) // tp // sharding,
        hidden * hidden // tp // sharding,
        hidden // sharding,
        hidden * 2 * ffn // tp // sharding,
        hidden * ffn // tp // sharding,
    ]


def dlio_layer_index(pipeline_rank: int, layers: int, pp: int) -> tuple[int, int]:
    """BaseCheckpointing.get_layer_index: the first and last layer of a pipeline stage."""
    per_group, remainder = layers // pp, layers % pp
    if pipeline_rank < remainder:
        start = pipeline_rank * (per_group + 1) + 1
        end = start + per_group
    else:
        start = remainder * (per_group + 1) + (pipeline_rank - remainder) * per_group + 1
        end = start + per_group - 1
    if pipeline_rank == pp - 1:
        end = layers + 2
    if pipeline_rank == 0:
        start = 0
    return start, end


def dlio_rank_bytes(rank: int, arch: tuple, parallelism: tuple) -> int:
    """What DLIO's save_checkpoint writes on `rank` (ZeRO 1 to 3): layer states where it saves the model, and
    the optimizer groups [N // (DP x MP), 5h] x 3."""
    tp, pp, dp, zero = parallelism
    model_parallelism = tp * pp
    pipeline_rank, data_rank = rank // tp % pp, rank // model_parallelism
    model = 0
    if zero == 3 or data_rank == 0:
        start, end = dlio_layer_index(pipeline_rank, arch[0], pp)
        sharding = dp if zero == 3 else 1
        model = sum(sum(dlio_layer_parameters(layer, arch, tp, sharding)) for layer in range(start, end + 1))
    share = dlio_num_parameters(*arch) // (dp * model_parallelism)
    return 2 * model + 4 * 3 * (share + arch[1] * 5)


@pytest.mark.parametrize("name", MODELS)
def test_the_plan_writes_what_dlio_writes_on_every_rank(name):
    arch, parallelism = MODELS[name]
    plan = load_workload(name).plan()
    expected = [dlio_rank_bytes(rank, arch, parallelism) for rank in range(len(plan.ranks))]
    assert len(plan.ranks) == parallelism[0] * parallelism[1] * parallelism[2]
    assert [rank.nbytes for rank in plan.ranks] == expected
    assert plan.total_bytes == sum(expected)
    assert load_workload(name).parameter_count() == dlio_num_parameters(*arch)
    subset = load_workload(f"{name}-subset").plan()
    assert [rank.nbytes for rank in subset.ranks] == expected[:8]


def test_dlio_floors_the_head_size_of_llama3_1t():
    arch, _ = MODELS["llama3-1t"]
    assert 25872 % 192 and load_workload("llama3-1t").model.kv_dim == 25872 // 192 * 32 == 4288
    assert load_workload("llama3-1t").plan().total_bytes == 16_564_174_094_592  # 15,426.59 GiB
    assert dlio_num_parameters(*arch) == 1_183_035_102_480


def test_the_reference_worked_example_still_holds():
    plan = load_workload("llama3-8b").plan()
    assert load_workload("llama3-8b").parameter_count() == 8_030_261_248
    assert round(plan.total_bytes / 2**30, 2) == 104.70


def test_the_profile_is_mlperfs_procedure_and_nothing_else():
    run = resolve_settings({"drive": "mlperf-checkpointing", "workload": "llama3-8b-subset", "scale": "0.0003"})
    assert (run.checkpoints_per_pass, run.passes, run.restore_checkpoints) == (10, 1, 10)
    assert run.parts == ("fill", "restore") and run.sources["parts"].endswith("mlperf-checkpointing.toml")
    assert run.thresholds.limits == ()
    assert space_needed(run, {"fill"}).baseline == 0  # the raw baseline does not run, so it needs no room


def test_a_drive_file_that_leaves_the_baseline_out_cannot_judge_against_it(tmp_path):
    profile = load_drive_file("mlperf-checkpointing").path.read_text()
    relative = '[[limit]]\nname = "fill_throughput"\nmin = 0.1\nunit = "ratio"\nrelative_to = "raw_write"\n'
    drive = tmp_path / "relative.toml"
    drive.write_text(f'{profile}{relative}source = "test"\n')
    with pytest.raises(SettingsError, match=r"limit\[1\]\.relative_to: raw_write is measured by the raw baseline"):
        load_drive_file(str(drive))
    with_baseline = profile.replace('parts = ["fill", "restore"]', 'parts = ["baseline", "fill", "restore"]')
    drive.write_text(f'{with_baseline}{relative}source = "test"\n')
    assert load_drive_file(str(drive)).limits[0].relative_to == "raw_write"


def test_a_left_out_part_makes_a_run_incomplete_only_where_a_limit_needed_it():
    left_out = "sweep cpu-only-1M-16 SKIPPED: sweep is not among the parts this run runs (x.toml: [run] parts = fill)"
    tests = {"fill": {"outcome": "PASS", "message": "pass 1 PASS"}, "cell": {"outcome": "SKIPPED", "message": left_out}}
    assert overall_verdict(tests, unjudged_limits([], [])).overall == "QUALIFIED"
    sweep = Limit("sweep_read_bandwidth", "GiB/s", "test", min=1.0, number=1)
    verdict = overall_verdict(tests, unjudged_limits([sweep], []))
    assert verdict.overall == "INCOMPLETE" and left_out in verdict.reasons[0]


def rank(rank: int, nbytes: int, done_s: float) -> dict:
    return {"rank": rank, "bytes": nbytes, "done_s": done_s, "files": 1, "payload_cpu_s": 0.0, "cpu_s": 0.0}


# The slowest rank (2) is not the one with the lowest rate (1), and rank 3 moved nothing (a ZeRO-0 replica).
RANKS = [rank(0, 100, 1.0), rank(1, 10, 0.5), rank(2, 300, 2.0), rank(3, 0, 0.1)]


def test_duration_is_the_slowest_rank_and_throughput_the_lowest_per_rank_rate():
    figures = checkpoint_metrics(RANKS)
    assert figures["duration_s"] == 2.0
    assert figures["throughput_GBps"] == pytest.approx(20 / 1e9)  # rank 1: 10 B / 0.5 s; not 410 B / 2 s
    assert figures["throughput_GiBps"] == pytest.approx(20 / 2**30)
    assert checkpoint_metrics([rank(0, 0, 1.0)])["throughput_GBps"] is None


def test_each_phase_gives_its_checkpoints_and_their_means():
    data = {
        "checkpoints": [{"checkpoint": 0, "ranks": RANKS}, {"checkpoint": 1, "ranks": [rank(0, 80, 4.0)]}],
        "restore": [{"checkpoint": 1, "ranks": [rank(0, 80, 1.0)]}],
    }
    metrics = mlperf_metrics(data)
    write = metrics["write"]
    assert write["count"] == 2 and [c["checkpoint"] for c in write["checkpoints"]] == [0, 1]
    assert write["duration_mean_s"] == pytest.approx(3.0)
    assert write["throughput_mean_GBps"] == pytest.approx((20 + 20) / 2 / 1e9)
    assert metrics["read"]["throughput_mean_GBps"] == pytest.approx(80 / 1e9)
    assert phase_metrics([])["duration_mean_s"] is None
    repeated = mean_over_runs([metrics, mlperf_metrics({**data, "restore": []})])
    assert repeated["write"]["runs"] == 2 and repeated["read"]["runs"] == 1
    assert repeated["write"]["duration_mean_s"] == pytest.approx(3.0)
    assert repeated["read"]["duration_mean_s"] == pytest.approx(1.0)


def test_the_summarys_throughput_says_it_is_one_ranks():
    """Beside a fill of several ranks, a per-rank rate read as the checkpoint's would look like a collapse."""
    lines = mlperf_lines(mlperf_metrics({"checkpoints": [{"checkpoint": 0, "ranks": RANKS}], "restore": []}))
    write = next(line for line in lines if line.strip().startswith("write:"))
    assert write.endswith("throughput mean 2e-08 GB/s (1.863e-08 GiB/s) per rank (each checkpoint's slowest rank, "
                          "MLPerf's minimum across ranks)")  # fmt: skip


def test_runs_of_different_setups_are_not_averaged(tmp_path):
    one = {"settings": {"workload": "llama3-8b", "scale": 1.0}, "checkpoints": [], "restore": []}
    other = {**one, "settings": {"workload": "llama3-70b", "scale": 1.0}}
    with pytest.raises(ResultsError, match="not of one setup"):
        runs_lines([Run(tmp_path / "a.json", one), Run(tmp_path / "b.json", other)])


@pytest.fixture(scope="module")
def profile_run(tmp_path_factory):
    """The profile run as a user runs it, at a tiny scale on two ranks (the profile's procedure is the point, not the
    ranks), every test file of the suite named."""
    out, target = tmp_path_factory.mktemp("mlperf"), tmp_path_factory.mktemp("target")
    result = run_suite(
        "--drive",
        "mlperf-checkpointing",
        "--workload",
        "llama3-8b-dp2",
        "--scale",
        "0.0001",
        "--target",
        str(target),
        "--junitxml",
        str(out / "qual.xml"),
        "--results",
        str(out / "results.json"),
        tests=("test_fill.py", "test_restore.py", "test_read_sweep.py", "test_shard_layouts.py"),
    )
    return result, out


def test_the_profile_writes_ten_checkpoints_then_reads_the_ten_back_cold(profile_run):
    result, out = profile_run
    data = results(out / "results.json")
    verdict = data["verdict"]
    limited = ("was the bottleneck", "the drive served other I/O")  # the host, or other work on its disk
    host_limited = verdict["overall"] == "INVALID" and all(any(w in r for w in limited) for r in verdict["reasons"])
    assert verdict["overall"] == "QUALIFIED" or host_limited, result.stdout[-3000:]
    assert [c["checkpoint"] for c in data["checkpoints"]] == list(range(10))
    assert [r["checkpoint"] for r in data["restore"]] == list(range(10))  # oldest first, as DLIO reads them
    assert all(r["cached_fraction_before"] <= 0.05 for r in data["restore"])
    assert all(len(c["ranks"]) == 2 for c in data["checkpoints"] + data["restore"])


def test_the_profile_reports_mlperfs_metrics_in_the_results(profile_run):
    result, out = profile_run
    data = results(out / "results.json")
    assert data["mlperf"] == json.loads(json.dumps(mlperf_metrics(data)))
    for phase, entries in (("write", data["checkpoints"]), ("read", data["restore"])):
        metrics = data["mlperf"][phase]
        assert metrics["count"] == 10
        durations = [max(r["done_s"] for r in entry["ranks"]) for entry in entries]
        rates = [min(r["bytes"] / r["done_s"] for r in entry["ranks"]) / 1e9 for entry in entries]
        assert [c["duration_s"] for c in metrics["checkpoints"]] == durations
        assert [c["throughput_GBps"] for c in metrics["checkpoints"]] == pytest.approx(rates)
        assert metrics["throughput_mean_GBps"] == pytest.approx(sum(rates) / 10)
    assert "MLPerf Storage metrics" in result.stdout and "write: 10 checkpoints, duration mean" in result.stdout


def test_the_profile_runs_nothing_mlperf_lacks(profile_run):
    _, out = profile_run
    data = results(out / "results.json")
    assert "baseline" not in data and "sweep" not in data and not data.get("layouts")
    cases = junit_cases(out / "qual.xml")
    left_out = {name: case for name, case in cases.items() if name.startswith(("test_read_sweep", "test_shard"))}
    assert "test_shard_layouts" in left_out and len(left_out) > 1
    for case in left_out.values():
        assert case["outcome"] == "skipped" and "[run] parts = fill, restore" in case["message"]
    skipped = [t for t in data["tests"].values() if t["outcome"] == "SKIPPED"]
    assert len(skipped) == len(left_out)


def test_ckptqual_mlperf_gives_the_mean_over_runs(profile_run, tmp_path, capsys):
    _, out = profile_run
    copy = shutil.copy(out / "results.json", tmp_path / "again.json")
    assert main(["mlperf", str(out / "results.json"), str(copy)]) == 0
    printed = capsys.readouterr().out.splitlines()
    write = results(out / "results.json")["mlperf"]["write"]
    mean = [line for line in printed if line.startswith("mean over 2 runs (MLPerf Storage reports the mean of 5")]
    assert len(mean) == 1 and f"duration mean {write['duration_mean_s']:.3f} s" in mean[0]
    assert f"throughput mean {write['throughput_mean_GBps']:.4g} GB/s" in mean[0]
