"""The suite's own ceiling: usable cores from affinity and cgroup files, the ceiling arithmetic, the calibration on
memory, the ceiling in a real run's results and summary, and a limit above it refused before any I/O."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptqual.config.drive_file import available_drives, load_drive_file
from ckptqual.config.run_settings import resolve_settings
from ckptqual.config.space import HostTooSlow, check_ceiling
from ckptqual.host.cpu import cgroup_quota_cores, usable_cores
from ckptqual.limits.ceiling import NOISE_MARGIN, PHASES, Ceiling, best_rate, ceilings, drive_share, limits_above
from ckptqual.limits.limits import Limit, at_scale
from ckptqual.report.schema import shape_problem
from ckptqual.report.summary import summary_lines
from ckptqual.runs.calibration import MEMORY, CalibrationError, calibrate
from replay_runs import replay_suite
from suite_runs import SMALL, junit_cases, lenient_drive, results

pytest_plugins = ("pytester",)

USAGE_ERROR = 4
IMPOSSIBLE = """
[[limit]]
name = "fill_throughput"
min = 1000
unit = "GB/s"
source = "test: far above what any host's suite measures"
"""


def cgroup_tree(root: Path, membership: str, files: dict[str, str]) -> Path:
    """A tree laid out like /proc/self/cgroup and cgroupfs under `root`: `files` maps paths below root to contents."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(membership)
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


# Usable cores


def test_a_cgroup_v2_quota_is_the_tightest_cpu_max_on_the_path(tmp_path):
    files = {"sys/fs/cgroup/job/step/cpu.max": "150000 100000\n", "sys/fs/cgroup/job/cpu.max": "max 100000\n"}
    assert cgroup_quota_cores(cgroup_tree(tmp_path / "a", "0::/job/step\n", files)) == 1.5
    files["sys/fs/cgroup/job/cpu.max"] = "50000 100000\n"  # an ancestor's quota holds its children too
    assert cgroup_quota_cores(cgroup_tree(tmp_path / "b", "0::/job/step\n", files)) == 0.5


def test_a_cgroup_v1_quota_is_read_where_the_container_sees_its_own_cgroup_at_the_mount(tmp_path):
    membership = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "250000\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }
    assert cgroup_quota_cores(cgroup_tree(tmp_path / "limited", membership, files)) == 2.5
    files["sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"] = "-1\n"
    assert cgroup_quota_cores(cgroup_tree(tmp_path / "free", membership, files)) is None


def test_no_quota_leaves_the_affinity_and_a_quota_below_it_caps_it(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert cgroup_quota_cores(tmp_path / "nothing") is None
    assert usable_cores(tmp_path / "nothing") == affinity
    half = cgroup_tree(tmp_path / "half", "0::/\n", {"sys/fs/cgroup/cpu.max": "50000 100000\n"})
    assert usable_cores(half) == min(affinity, 0.5)
    many = cgroup_tree(tmp_path / "many", "0::/\n", {"sys/fs/cgroup/cpu.max": f"{100000 * (affinity + 4)} 100000\n"})
    assert usable_cores(many) == affinity  # a quota above the CPUs one may run on does not add any


@pytest.mark.parametrize(("quota", "period"), [("lots", "100000"), ("100000", "0"), ("-5", "100000")])
def test_a_malformed_quota_names_the_file_and_the_values(tmp_path, quota, period):
    root = cgroup_tree(tmp_path, "0::/\n", {"sys/fs/cgroup/cpu.max": f"{quota} {period}\n"})
    with pytest.raises(ValueError, match=rf"cgroup/cpu.max: CPU quota '{quota}' per period '{period}' is not two"):
        cgroup_quota_cores(root)


def test_this_hosts_usable_cores_are_its_affinity_capped_by_its_own_quota():
    quota, affinity = cgroup_quota_cores(), len(os.sched_getaffinity(0))
    assert quota is None or quota > 0
    assert usable_cores() == (affinity if quota is None else min(affinity, quota))
    assert 0 < usable_cores() <= (os.cpu_count() or 1)


# Arithmetic


def test_the_ceiling_is_cores_times_the_best_rounds_rate_shared_among_the_drives():
    rate = best_rate([(1_000_000_000, 0.8), (1_550_000_000, 1.0), (1_000_000_000, 1.25)])
    assert rate == pytest.approx(1.55)  # the best round: noise only ever slows a round down
    ceiling = Ceiling("fill write", drive_share(4, 2), rate)
    assert ceiling.GBps == pytest.approx(3.1)
    assert ceiling.describe() == "fill write 3.10 GB/s (2 cores x 1.55 GB per CPU-s)"
    assert drive_share(2, 3) == pytest.approx(2 / 3) and drive_share(2, 0) == 2
    with pytest.raises(ValueError, match="calibrate with more bytes per round"):
        best_rate([(1000, 0.0)])


def limit(measurement: str, unit: str, **fields) -> Limit:
    return Limit(measurement, unit, "test", number=1, **fields)


def test_an_absolute_minimum_above_its_phases_ceiling_is_refused_with_the_numbers_and_the_fix():
    phases = ceilings(2, {"fill write": 1.55, "restore": 3.0})
    [line] = limits_above([limit("fill_throughput", "GB/s", min=1000.0)], phases)
    assert line.startswith("limit 1 (fill_throughput >= 1000 GB/s): min 1000 GB/s is above what this host can ")
    assert "ceiling 3.10 GB/s (2 cores x 1.55 GB per CPU-s) for the fill write" in line
    assert line.endswith("for the fill write, and more than 1.5 x that, which no noise explains")
    [restore] = limits_above([limit("restore_throughput", "GiB/s", min=16.0)], phases)  # 17.18 GB/s > 6 x 1.5
    assert "min 17.18 GB/s" in restore and "for the restore" in restore


def test_relative_limits_maximums_other_measurements_and_phases_not_measured_are_never_refused():
    phases = ceilings(2, {"fill write": 0.001})
    never = [
        limit("fill_throughput", "ratio", min=1000.0, relative_to="raw_write"),
        limit("fill_checkpoint_seconds_mean", "s", max=0.001),
        limit("sweep_read_bandwidth", "GiB/s", min=1000.0),
        limit("restore_throughput", "GB/s", min=1000.0),  # no restore ceiling was measured
    ]
    assert limits_above(never, phases) == []


def test_a_limit_within_the_noise_margin_of_the_ceiling_runs_and_one_beyond_it_is_refused():
    phases = ceilings(2, {"fill write": 1.5})  # 3 GB/s
    near = 3.0 * (1 + NOISE_MARGIN) * 0.99
    beyond = 3.0 * (1 + NOISE_MARGIN) * 1.01
    assert limits_above([limit("fill_mean_checkpoint_throughput", "GB/s", min=near)], phases) == []
    assert len(limits_above([limit("fill_mean_checkpoint_throughput", "GB/s", min=beyond)], phases)) == 1
    at_full = limit("fill_throughput", "GB/s", min=beyond * 1000, at_full_scale=True)
    assert limits_above(at_scale([at_full], 0.001), phases) and not limits_above(at_scale([at_full], 0.0009), phases)


CRAWLING = ceilings(1, dict.fromkeys(PHASES, 1e-6))  # a host far slower than any noise makes this one


@pytest.mark.parametrize("name", available_drives())
def test_a_packaged_drive_file_can_be_refused_only_for_its_absolute_fill_and_restore_minimums(name):
    limits = load_drive_file(name).limits
    absolute = [one for one in limits if one.min is not None and not one.relative_to and one.measurement in
                ("fill_throughput", "fill_mean_checkpoint_throughput", "restore_throughput")]  # fmt: skip
    assert len(limits_above(limits, CRAWLING)) == len(absolute)


def test_the_built_in_run_is_never_refused_however_noisy_the_calibration():
    assert limits_above(load_drive_file("local").limits, CRAWLING) == []


def test_the_check_refuses_a_run_on_this_host_but_not_one_whose_ranks_run_on_other_nodes(tmp_path):
    drive = lenient_drive(tmp_path / "strict.toml", "strict drive", extra_limits=IMPOSSIBLE)
    (tmp_path / "target").mkdir()
    (tmp_path / "job.secret").write_text("a secret every node reads\n")
    (tmp_path / "job.secret").chmod(0o600)
    options = {"drive": str(drive), "target": tmp_path / "target", "workload": "llama3-8b", "scale": "0.0003"}
    with pytest.raises(HostTooSlow, match=r"limit 2 \(fill_throughput >= 1000 GB/s\): min 1000 GB/s is above"):
        check_ceiling(resolve_settings(options), CRAWLING)
    nodes = {"nodes": 2, "controller": "127.0.0.1:29500", "secret_file": tmp_path / "job.secret"}
    check_ceiling(resolve_settings(options | nodes), CRAWLING)


# Calibration on memory


def test_the_calibration_runs_each_engine_on_memory_briefly_and_leaves_nothing(tmp_path):
    for engine in ("stream", "stream-direct", "torch-save"):
        calibration = calibrate(engine, 4 << 20, 2)
        assert calibration.directory == str(MEMORY) and calibration.engine == engine
        assert set(calibration.rounds) == set(PHASES)
        assert all(len(rounds) == 2 and all(n == 4 << 20 and s > 0 for n, s in rounds)
                   for rounds in calibration.rounds.values())  # fmt: skip
        assert all(rate > 0.01 for rate in calibration.GB_per_cpu_s().values())
    assert not list(MEMORY.glob("ckptqual-calibration-*"))


def test_a_calibration_that_cannot_write_on_memory_says_where_and_what_it_needs_and_leaves_nothing(tmpfs):
    small = tmpfs("size=1m")
    with pytest.raises(CalibrationError) as refusal:
        calibrate("stream", 4 << 20, 1, memory=small)
    message = str(refusal.value)
    assert message.startswith(f"the suite's own speed could not be measured in {small} (before any I/O on the target")
    assert "[Errno 28 ENOSPC] No space left on device; it needs 4 MB free there" in message
    assert list(small.iterdir()) == []


# A real run


def test_a_real_runs_results_hold_each_phases_ceiling_valid_and_its_summary_shows_it(pytester, tmp_path):
    """The calibration measured on this host, in process, the run's I/O replayed (stand_in/replay.py)."""
    drive = lenient_drive(tmp_path / "lenient.toml", "lenient drive")
    done = replay_suite(pytester, *SMALL, "--drive", str(drive), "--replay-measured-ceiling")
    record = done.out / "r.json"
    data = results(record)
    assert shape_problem(data) is None
    ceiling = data["ceiling"]
    assert set(ceiling["phases"]) == set(PHASES) and ceiling["engine"] == "stream"
    assert ceiling["cores"] == usable_cores() and ceiling["drives_at_once"] == 1
    for phase, figures in ceiling["phases"].items():
        assert figures["GBps"] == pytest.approx(figures["cores"] * figures["GB_per_cpu_s"])
        rounds = [(r["bytes"], r["cpu_s"]) for r in ceiling["rounds"][phase]]
        assert figures["GB_per_cpu_s"] == pytest.approx(best_rate(rounds))
    [line] = [line for line in summary_lines(data) if line.startswith("ceiling")]
    fill = ceiling["phases"]["fill write"]
    assert f"fill write {fill['GBps']:.2f} GB/s ({fill['cores']:g} cores x {fill['GB_per_cpu_s']:.2f} GB per" in line
    assert line in done.stdout.splitlines(), done.stdout[-3000:]
    damaged = {**data, "ceiling": {**ceiling, "phases": {"fill write": {**fill, "GBps": None}}}}
    assert shape_problem(damaged) == 'ceiling.phases["fill write"].GBps: must be a number, got null'


def test_a_1000_GBps_minimum_is_refused_before_any_file_is_written_and_the_terminal_says_so(pytester, tmp_path):
    """In process, on this host's own calibration (the run's I/O replayed, stand_in/replay.py)."""
    drive = lenient_drive(tmp_path / "strict.toml", "strict drive", extra_limits=IMPOSSIBLE)
    done = replay_suite(pytester, *SMALL, "--drive", str(drive), "--replay-measured-ceiling")
    target, record = done.out / "target", done.out / "r.json"
    assert done.ret == USAGE_ERROR, done.stdout[-3000:] + done.stderr[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("ERROR: ")]
    fill = results(record)["ceiling"]["phases"]["fill write"]
    assert f"drive file {drive}: limit 2 (fill_throughput >= 1000 GB/s): min 1000 GB/s is above what" in error
    assert (
        f"ceiling {fill['GBps']:.2f} GB/s ({fill['cores']:g} cores x {fill['GB_per_cpu_s']:.2f} GB per CPU-s)" in error
    )
    assert "Traceback" not in done.stdout + done.stderr
    assert list(target.iterdir()) == []


def test_with_several_drives_each_refused_drive_fails_its_tests_in_the_junit_with_the_numbers(pytester, tmp_path):
    """In process, the runs replayed (stand_in/replay.py), on the recorded ceiling of a 2-core host."""
    drive = lenient_drive(tmp_path / "strict.toml", "strict drive", extra_limits=IMPOSSIBLE)
    targets = [tmp_path / "alpha", tmp_path / "beta"]
    for target in targets:
        target.mkdir()
    arguments = [argument for target in targets for argument in ("--target", str(target))]
    done = replay_suite(pytester, *SMALL, "--drive", str(drive), *arguments, "--junitxml", "q.xml", reports=False)
    assert done.ret == 1, done.stdout[-3000:]
    cases = junit_cases(done.out / "q.xml")
    fills = {name: case for name, case in cases.items() if name.startswith("test_fill_pass")}
    assert {name.split("-")[0] for name in fills} == {"test_fill_pass[alpha", "test_fill_pass[beta"}
    for case in fills.values():
        assert case["outcome"] in ("failure", "error"), case
        assert "min 1000 GB/s is above what this host can measure: ceiling" in case["message"], case
    assert [list(target.iterdir()) for target in targets] == [[], []]
