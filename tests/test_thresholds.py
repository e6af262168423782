"""Drive files (thresholds/*.toml): the shipped ones, every validation error; limits, verdicts, selectors, units."""

import json
import math

import pytest

from ckptqual.config.drive_file import available_drives
from ckptqual.config.drive_file import load_drive_file as load_thresholds
from ckptqual.config.run_settings import resolve_settings
from ckptqual.config.values import SettingsError
from ckptqual.limits.limits import Limit, MissingBaselineError, Outcome, at_scale
from ckptqual.limits.measurements import LIMITED
from ckptqual.limits.units import format_size, parse_size, to_unit

DRIVE = '[drive]\nname = "test drive"\n'
LIMIT = '[[limit]]\nname = "fill_throughput"\nmin = 1.0\nunit = "GB/s"\nsource = "test"\n'


def write(tmp_path, text: str) -> str:
    path = tmp_path / "x.toml"
    path.write_text(text)
    return str(path)


def load_error(tmp_path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as info:
        load_thresholds(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    return message


# The shipped files


def test_available_drives_lists_the_shipped_files():
    assert {"d5-p5336", "d7-ps1010", "local"} <= set(available_drives())


@pytest.mark.parametrize("name", ["d5-p5336", "d7-ps1010", "local"])
def test_every_shipped_file_loads_with_sourced_limits(name):
    thresholds = load_thresholds(name)
    assert thresholds.path.stem == name
    assert thresholds.values["workload"] == "llama3.1-405b-review"
    assert thresholds.values["passes"] == 3
    assert thresholds.values["engine"] == "stream"
    assert thresholds.limits
    for limit in thresholds.limits:
        assert limit.source.strip()
        json.dumps(limit.to_dict())


@pytest.mark.parametrize(
    ("name", "per_pass", "pass1_GBps", "steady_GBps", "pass1_s", "steady_s", "peak_GiBps"),
    [("d5-p5336", 33, 2.63, 2.41, 623, 680, 4.2), ("d7-ps1010", 3, 3.53, 2.79, 464, 587, 6.2)],
)
def test_review_limits_carry_a_ten_percent_margin(
    name, per_pass, pass1_GBps, steady_GBps, pass1_s, steady_s, peak_GiBps
):
    thresholds = load_thresholds(name)
    values = thresholds.values
    assert values["checkpoints_per_pass"] == per_pass
    assert values["require_steady_state"] is True
    assert values["scale"] == 1.0
    assert values["sweep_jobs"] == values["sweep_batch"] == 16
    assert values["sweep_threads"] == (128, 64, 32, 16, 8, 4, 1)
    assert [format_size(b) for b in values["sweep_block_sizes_bytes"]] == ["1M", "128K", "64K", "16K", "8K"]
    expected = [
        (1, "fresh", pass1_GBps, pass1_s),
        (2, "steady", steady_GBps, steady_s),
        (3, "steady", steady_GBps, steady_s),
        (7, "steady", steady_GBps, steady_s),
    ]
    for pass_number, state, rate, seconds in expected:
        context = {"pass": pass_number, "state": state}
        (fill,) = thresholds.limits_for("fill_throughput", context)
        assert (fill.min, fill.unit) == (pytest.approx(0.9 * rate), "GB/s")
        (duration,) = thresholds.limits_for("fill_checkpoint_seconds_mean", context)
        assert duration.max == pytest.approx(1.1 * seconds)
        assert (duration.unit, duration.at_full_scale) == ("s", True)
    peak_cell = {"transfer": "gpu-direct", "block_size": "1M", "threads": 128}
    (peak,) = thresholds.limits_for("sweep_read_bandwidth", peak_cell)
    assert (peak.min, peak.unit) == (pytest.approx(0.9 * peak_GiBps), "GiB/s")
    assert thresholds.limits_for("sweep_read_bandwidth", {**peak_cell, "threads": 64}) == []
    assert thresholds.limits_for("restore_throughput", {"pass": 1}) == []


def test_local_limits_are_relative():
    thresholds = load_thresholds("local")
    assert thresholds.values["scale"] == 0.0005
    assert thresholds.values["layout_examples"] == 5
    assert thresholds.values["sweep_transfers"] == ("gpu-direct", "cpu-gpu", "cpu-only")
    for limit in thresholds.limits:
        assert limit.unit == "ratio"
    (fresh,) = thresholds.limits_for("fill_throughput", {"pass": 1, "state": "fresh"})
    assert (fresh.min, fresh.relative_to, fresh.marginal) == (0.05, "raw_write", 0.5)
    (steady,) = thresholds.limits_for("fill_throughput", {"pass": 2, "state": "steady"})
    assert (steady.min, steady.relative_to, steady.marginal) == (0.1, "raw_write", 0.5)
    (restore,) = thresholds.limits_for("restore_throughput", {"pass": 1})
    assert (restore.min, restore.relative_to) == (0.05, "raw_read")
    for threads in (16, 4, 1):
        (sweep,) = thresholds.limits_for(
            "sweep_read_bandwidth", {"transfer": "cpu-only", "block_size": "1M", "threads": threads}
        )
        assert (sweep.min, sweep.relative_to, sweep.marginal) == (0.1, "raw_read", 0.5)
    assert thresholds.limits_for("sweep_read_bandwidth", {"transfer": "gpu-direct", "block_size": "1M"}) == []
    (layout,) = thresholds.limits_for("layout_throughput_ratio", {"layout": "odd"})
    assert (layout.min, layout.marginal) == (0.1, 0.5)
    assert thresholds.values["layout_max_total_bytes"] == 64 << 20


def test_a_minimal_file_leaves_settings_unset(tmp_path):
    thresholds = load_thresholds(write(tmp_path, DRIVE))
    assert thresholds.drive.name == "test drive"
    assert thresholds.values == {}
    assert thresholds.limits == ()


@pytest.mark.parametrize(
    ("name", "requires"),
    [
        ("d5-p5336", ("fill", "restore", "sweep", "layouts")),
        ("d7-ps1010", ("fill", "restore", "sweep", "layouts")),
        ("local", ("fill", "restore", "sweep", "layouts")),
        ("mlperf-checkpointing", ("fill", "restore")),
    ],
)
def test_every_shipped_file_requires_the_verified_restore(name, requires):
    thresholds = load_thresholds(name)
    assert thresholds.requires == requires and thresholds.requires_stated
    assert thresholds.requires_origin == f"required by {name}.toml [verdict] requires"


def test_a_file_without_verdict_requires_every_part_it_runs(tmp_path):
    everything = load_thresholds(write(tmp_path, DRIVE))
    assert everything.requires == ("fill", "restore", "sweep", "layouts") and not everything.requires_stated
    assert everything.requires_origin == (
        "x.toml states no [verdict] requires, so every part of its [run] parts is required"
    )
    some = load_thresholds(write(tmp_path, DRIVE + '[run]\nparts = ["baseline", "fill", "sweep"]\n'))
    assert some.requires == ("fill", "sweep")
    stated = load_thresholds(write(tmp_path, DRIVE + '[verdict]\nrequires = ["restore", "fill"]\n'))
    assert stated.requires == ("restore", "fill") and stated.requires_stated


# Loading errors


def test_unknown_drive_lists_names_and_mentions_paths():
    with pytest.raises(SettingsError, match="unknown drive 'no-such-drive'") as info:
        load_thresholds("no-such-drive")
    assert "d5-p5336" in str(info.value) and "local" in str(info.value)
    assert ".toml" in str(info.value)


def test_missing_path(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        load_thresholds(str(tmp_path / "absent.toml"))


def test_toml_syntax_error(tmp_path):
    assert "not valid TOML" in load_error(tmp_path, DRIVE + "passes = \n")


@pytest.mark.parametrize(
    ("body", "key", "problem"),
    [
        ('[drive]\ndescription = "no name"\n', "drive.name", "missing"),
        ("[run]\npasses = 1\n", "drive:", 'missing; add [drive] with name = "..."'),
        (
            DRIVE + "[bogus]\nx = 1\n",
            "bogus:",
            "unknown key; allowed: drive, run, layouts, sweep, verdict, limit; remove it",
        ),
        ("stray = 1\n" + DRIVE, "stray:", "unknown key; allowed: drive, run,"),
        (
            DRIVE + "stray = 1\n",
            "drive.stray:",
            "unknown key; allowed: name, description, capacity_bytes, source; remove it from [drive]",
        ),
        (DRIVE + "[run]\npass = 3\n", "run.pass:", "remove it from [run]"),
        ('[drive]\nname = ""\n', "drive.name", "non-empty string"),
        (DRIVE + "capacity_bytes = 0\n", "drive.capacity_bytes", "must be an integer >= 1, got 0"),
        (DRIVE + "[run]\nscale = 0\n", "run.scale = 0", "must be a number with 0 < scale <= 1"),
        (DRIVE + "[run]\nscale = 1.5\n", "run.scale = 1.5", "0 < scale <= 1"),
        (DRIVE + '[run]\nscale = "1"\n', "run.scale = '1'", "0 < scale <= 1"),
        (DRIVE + "[run]\npasses = 2.0\n", "run.passes = 2.0", "whole number from 1 to 100"),
        (DRIVE + "[run]\npasses = true\n", "run.passes = True", "whole number from 1 to 100"),
        (DRIVE + "[run]\npasses = 101\n", "run.passes = 101", "whole number from 1 to 100"),
        (DRIVE + '[run]\nengine = "dlio"\n', "run.engine", "use one of stream, stream-direct, torch-save"),
        (DRIVE + "[run]\ncheckpoints_per_pass = 3\nfill_fraction = 0.5\n", "run.fill_fraction", "not both"),
        (DRIVE + "[run]\nfill_fraction = 0\n", "run.fill_fraction", "0 < fraction <= 1"),
        (DRIVE + '[sweep]\nblock_sizes = ["1M", "3X"]\n', "sweep.block_sizes", "item 2: must be a size"),
        (
            DRIVE + '[sweep]\nblock_sizes = ["6K"]\n',
            "sweep.block_sizes",
            "item 1: must be a size in bytes, a multiple of 4K",
        ),
        (DRIVE + '[sweep]\nblock_sizes = ["1m"]\n', "sweep.block_sizes", "must be a size"),
        (DRIVE + "[sweep]\nblock_sizes = []\n", "sweep.block_sizes", "non-empty list"),
        (DRIVE + '[sweep]\nblock_sizes = "1M"\n', "sweep.block_sizes", "non-empty list"),
        (DRIVE + "[sweep]\nthreads = [4, 0]\n", "sweep.threads", "item 2: must be a whole number from 1 to 4096"),
        (DRIVE + "[sweep]\nthreads = [4, 4]\n", "sweep.threads", "list each once"),
        (DRIVE + "[sweep]\njobs = 0\n", "sweep.jobs", "whole number >= 1"),
        (DRIVE + "[sweep]\nfile_bytes = -1\n", "sweep.file_bytes = -1", "must be a size"),
        (
            DRIVE + "[sweep]\nfile_bytes = 5000\n",
            "sweep.file_bytes = 5000",
            "must be a size in bytes, a multiple of 4K",
        ),
        (DRIVE + "[sweep]\nrequests = 5\n", "sweep.requests:", "remove it from [sweep]"),
        (DRIVE + '[sweep]\ntransfers = ["gds"]\n', "sweep.transfers = ['gds']", "item 1: unknown transfer; use one"),
        (DRIVE + "[layouts]\nexamples = -1\n", "layouts.examples", "whole number from 0 to 10000"),
        (DRIVE + "[layouts]\nseed = 0.5\n", "layouts.seed", "whole number from 0 to 4294967295"),
        (DRIVE + "[layouts]\nmax_total_bytes = 0\n", "layouts.max_total_bytes", "must be a size"),
        (DRIVE + "[layouts]\nplan = 'x.json'\n", "layouts.plan:", "remove it from [layouts]"),
        (DRIVE + "[run]\nrequire_steady_state = 1\n", "run.require_steady_state", "true or false"),
        (DRIVE + "[limit]\nname = 'fill_throughput'\n", "limit:", "[[limit]]"),
        (DRIVE + "[verdict]\n", "verdict.requires:", "missing; add it to [verdict]"),
        (
            DRIVE + '[verdict]\nrequires = ["restor"]\n',
            "verdict.requires[0]",
            "must be one of fill, restore, sweep, layouts, got 'restor'",
        ),
        (DRIVE + '[verdict]\nrequires = ["baseline"]\n', "verdict.requires[0]", "must be one of fill, restore, sweep"),
        (DRIVE + "[verdict]\nrequires = []\n", "verdict.requires", 'e.g. requires = ["fill", "restore"], got 0 items'),
        (
            DRIVE + '[verdict]\nrequires = "restore"\n',
            "verdict.requires",
            "must be a non-empty list of parts, each listed once",
        ),
        (
            DRIVE + '[verdict]\nrequires = ["fill", "fill"]\n',
            "verdict.requires",
            "each listed once, e.g. requires = [\"fill\", \"restore\"], got ['fill', 'fill']",
        ),
        (
            DRIVE + '[verdict]\nrequires = ["fill"]\nneeds = 1\n',
            "verdict.needs:",
            "unknown key; allowed: requires; remove it from [verdict]",
        ),
        (
            DRIVE + '[run]\nparts = ["fill"]\n[verdict]\nrequires = ["fill", "restore"]\n',
            "verdict.requires:",
            "restore is required, but [run] parts leaves it out, so it never runs; add restore to [run] parts",
        ),
    ],
)
def test_section_errors_name_file_and_key(tmp_path, body, key, problem):
    message = load_error(tmp_path, body)
    assert f": {key}" in message
    assert problem in message


def block(**raw: str | None) -> str:
    """A valid [[limit]] body, with keys replaced by raw TOML values or removed by None."""
    keys = {"name": '"fill_throughput"', "min": "1", "unit": '"GB/s"', "source": '"s"'} | raw
    return "".join(f"{key} = {value}\n" for key, value in keys.items() if value is not None)


def limit_error(tmp_path, second_limit: str) -> str:
    """The error for a file whose second [[limit]] block is `second_limit`."""
    return load_error(tmp_path, DRIVE + LIMIT + "[[limit]]\n" + second_limit)


SECONDS = {"name": '"fill_checkpoint_seconds_max"', "min": None, "max": "1", "unit": '"s"'}
SWEEP = {"name": '"sweep_read_bandwidth"'}


@pytest.mark.parametrize(
    ("body", "key", "problem"),
    [
        (
            block(name='"fill_speed"'),
            "limit[2].name",
            f"must be one of {', '.join(LIMITED)}, got 'fill_speed'",
        ),
        (block(name=None), "limit[2].name", "missing"),
        (block(min=None), "limit[2]:", "exactly one of min"),
        (block(max="2"), "limit[2]:", "exactly one of min"),
        (block(min="-1"), "limit[2].min", "> 0"),
        (block(min="0"), "limit[2].min", "(a minimum of 0 or less passes anything), got 0; give the least the drive"),
        (
            block(min="0.0", marginal="0.5"),
            "limit[2].min",
            "must be a finite number > 0 (a minimum of 0 or less passes anything), got 0.0",
        ),
        (
            block(min=None, max="0"),
            "limit[2].max",
            "(nothing measures at or under a maximum of 0), got 0; give the most",
        ),
        (block(min="nan"), "limit[2].min", "finite"),
        (block(min=None, max="inf"), "limit[2].max", "finite"),
        (block(min='"2"'), "limit[2].min", "got '2'"),
        (block(unit=None), "limit[2].unit", "missing"),
        (
            block(unit='"GBps"'),
            "limit[2].unit",
            "unknown unit 'GBps' for fill_throughput; use one of GB/s, GiB/s, MB/s, MiB/s",
        ),
        (block(unit='"s"'), "limit[2].unit", "does not suit fill_throughput"),
        (block(unit='"ratio"'), "limit[2].unit", "relative_to"),
        (block(**SECONDS | {"unit": '"GB/s"'}), "limit[2].unit", "use one of s, ms, min"),
        (block(name='"layout_throughput_ratio"'), "limit[2].unit", "does not suit layout_throughput_ratio"),
        (block(relative_to='"raw_write"'), "limit[2].unit", "set unit = 'ratio'"),
        (
            block(unit='"ratio"', relative_to='"raw_copy"'),
            "limit[2].relative_to",
            "must be one of raw_write, raw_read, got 'raw_copy'",
        ),
        (block(**SECONDS | {"unit": '"ratio"'}, relative_to='"raw_write"'), "limit[2].relative_to", "not a throughput"),
        (block(at_full_scale="true"), "limit[2].at_full_scale", "durations only"),
        (block(**SECONDS, at_full_scale="1"), "limit[2].at_full_scale", "true or false"),
        (block(marginal="1.0"), "limit[2].marginal", "0 <= marginal < 1"),
        (block(marginal="-0.1"), "limit[2].marginal", "0 <= marginal < 1, got -0.1"),
        (block(marginal="nan"), "limit[2].marginal", "0 <= marginal < 1, got NaN"),
        (block(source=None), "limit[2].source", "missing"),
        (block(source='"  "'), "limit[2].source", "non-empty"),
        (block(margin="0.1"), "limit[2].margin", "unknown key"),
        (block(where="{ pas = 2 }"), "limit[2].where", "unknown context key 'pas' for fill_throughput"),
        (block(where='{ pass = "2" }'), "limit[2].where", "pass: item 1: must be a whole number >= 1"),
        (block(where="{ pass = [] }"), "limit[2].where", "non-empty list"),
        (block(where="2"), "limit[2].where", "table of context keys"),
        (block(**SWEEP, where='{ block_size = "1024K" }'), "limit[2].where = {'block_size': '1024K'}", "write '1M'"),
        (block(**SWEEP, where='{ block_size = "big" }'), "limit[2].where", "must be a size"),
        (block(**SWEEP, where='{ transfer = "gds" }'), "limit[2].where", "transfer: item 1: unknown transfer"),
        (block(**SWEEP, where="{ threads = [8, 8] }"), "limit[2].where", "list each once"),
    ],
)
def test_limit_errors_name_file_and_key(tmp_path, body, key, problem):
    message = limit_error(tmp_path, body)
    assert f": {key}" in message
    assert problem in message


def test_every_limit_is_numbered_by_its_block(tmp_path):
    message = load_error(tmp_path, DRIVE + LIMIT + LIMIT + LIMIT.replace("GB/s", "GBps"))
    assert ": limit[3].unit: " in message


# Verdicts


def min_limit(**fields) -> Limit:
    return Limit("fill_throughput", fields.pop("unit", "GB/s"), "test source", min=2.0, **fields)


def max_limit(**fields) -> Limit:
    return Limit("fill_checkpoint_seconds_mean", "s", "test source", max=100.0, **fields)


@pytest.mark.parametrize(
    ("value", "outcome"),
    [(1.99, Outcome.FAIL), (2.0, Outcome.MARGINAL), (2.09, Outcome.MARGINAL), (2.1, Outcome.PASS), (3.0, Outcome.PASS)],
)
def test_min_limit_boundaries(value, outcome):
    verdict = min_limit(marginal=0.05).evaluate(value, "GB/s")
    assert verdict.outcome is outcome
    assert (verdict.measured, verdict.limit, verdict.unit, verdict.comparator) == (value, 2.0, "GB/s", ">=")


@pytest.mark.parametrize(
    ("value", "outcome"),
    [
        (100.01, Outcome.FAIL),
        (100.0, Outcome.MARGINAL),
        (90.01, Outcome.MARGINAL),
        (90.0, Outcome.PASS),
        (1, Outcome.PASS),
    ],
)
def test_max_limit_boundaries(value, outcome):
    verdict = max_limit(marginal=0.1).evaluate(value, "s")
    assert verdict.outcome is outcome
    assert verdict.comparator == "<="


def test_without_a_band_the_limit_itself_passes():
    assert min_limit().evaluate(2.0, "GB/s").outcome is Outcome.PASS
    assert max_limit().evaluate(100.0, "s").outcome is Outcome.PASS


def test_failure_message_is_one_line_with_value_limit_unit_and_source():
    message = min_limit().evaluate(1.84, "GB/s", context={"pass": 2}).message
    assert message == "fill_throughput 1.84 GB/s < min 2 GB/s (pass=2; source: test source)"


def test_message_shows_the_selector_without_a_context():
    limit = min_limit(where=(("pass", (2, 3)),))
    assert "(pass=[2, 3]; source: test source)" in limit.evaluate(1.0, "GB/s").message


def test_marginal_message_names_the_band():
    message = min_limit(marginal=0.05).evaluate(2.05, "GB/s").message
    assert "2.05 GB/s >= min 2 GB/s, within the 5 % marginal band" in message


def test_close_values_print_distinctly():
    message = min_limit().evaluate(1.99999, "GB/s").message
    assert "1.99999 GB/s < min 2 GB/s" in message


def test_value_is_converted_into_the_limit_unit():
    limit = Limit("sweep_read_bandwidth", "GiB/s", "s", min=4.0)
    verdict = limit.evaluate(4.2, "GB/s")  # 4.2e9 B/s = 3.91 GiB/s
    assert verdict.measured == pytest.approx(4.2e9 / 2**30)
    assert verdict.outcome is Outcome.FAIL
    assert limit.evaluate(4.3, "GB/s").outcome is Outcome.PASS  # 4.005 GiB/s
    assert max_limit().evaluate(1.5, "min").measured == pytest.approx(90)


def test_value_in_a_unit_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="cannot convert s to GB/s"):
        min_limit().evaluate(3.0, "s")


def test_relative_limit_divides_by_the_baseline_given_in_bytes_per_second():
    limit = Limit("fill_throughput", "ratio", "s", min=0.25, relative_to="raw_write", marginal=0.2)
    verdict = limit.evaluate(0.55, "GB/s", baselines={"raw_write": 2e9, "raw_read": 1e8})
    assert verdict.measured == pytest.approx(0.275)
    assert verdict.outcome is Outcome.MARGINAL  # 0.25 <= 0.275 < 0.25 * 1.2
    assert verdict.unit == "ratio"
    assert "0.55 GB/s / raw_write 2 GB/s" in verdict.message
    assert limit.evaluate(0.4, "GB/s", baselines={"raw_write": 2e9}).outcome is Outcome.FAIL
    gib = limit.evaluate(0.5, "GiB/s", baselines={"raw_write": 2e9})
    assert gib.measured == pytest.approx(0.5 * 2**30 / 2e9)  # units converted, not just divided
    assert "0.5 GiB/s / raw_write 1.863 GiB/s" in gib.message


def test_relative_limit_without_its_baseline_says_which():
    limit = Limit("restore_throughput", "ratio", "s", min=0.25, relative_to="raw_read")
    for baselines in (None, {"raw_write": 2e9}):
        with pytest.raises(MissingBaselineError, match=r"relative to raw_read.*baselines="):
            limit.evaluate(1.0, "GB/s", baselines=baselines)
    with pytest.raises(ValueError, match="must be > 0"):
        limit.evaluate(1.0, "GB/s", baselines={"raw_read": 0.0})
    with pytest.raises(ValueError, match="needs a throughput"):
        limit.evaluate(0.5, "ratio", baselines={"raw_read": 1.0})


def test_full_scale_duration_is_scaled_down():
    [limit, fixed] = at_scale([max_limit(at_full_scale=True, marginal=0.1), max_limit()], 0.0005)
    verdict = limit.evaluate(0.06, "s")  # limit 100 s x 0.0005 = 0.05 s
    assert verdict.limit == pytest.approx(0.05)
    assert verdict.outcome is Outcome.FAIL
    assert "scale 0.0005 x 100 s at full scale" in verdict.message
    assert limit.evaluate(0.04, "s").outcome is Outcome.PASS
    assert fixed.evaluate(0.06, "s").limit == 100.0


def test_the_resolved_settings_bind_their_scale_into_the_drive_files_limits():
    run = resolve_settings({"scale": 0.0005})
    assert run.thresholds.limits and {limit.scale for limit in run.thresholds.limits} == {0.0005}
    assert {limit.scale for limit in load_thresholds("local").limits} == {1.0}


def test_non_finite_measurement_is_refused():
    with pytest.raises(ValueError, match="not a finite number"):
        min_limit().evaluate(math.nan, "GB/s")


def test_describe_and_to_dict():
    assert min_limit().describe() == ">= 2 GB/s"
    assert max_limit(at_full_scale=True).describe() == "<= 100 s at full scale"
    relative = Limit("fill_throughput", "ratio", "s", min=0.25, relative_to="raw_write")
    assert relative.describe() == ">= 0.25 of raw_write"
    data = min_limit(where=(("pass", (2, 3)), ("x", ("a",)))).to_dict()
    assert data["where"] == {"pass": [2, 3], "x": "a"}
    assert (data["measurement"], data["min"], data["max"]) == ("fill_throughput", 2.0, None)
    assert (data["unit"], data["source"]) == ("GB/s", "test source")


def test_loaded_limit_evaluates_as_declared(tmp_path):
    text = DRIVE + LIMIT.replace("min = 1.0", "min = 4.0").replace('"GB/s"', '"GiB/s"') + "marginal = 0.05\n"
    (limit,) = load_thresholds(write(tmp_path, text)).limits
    assert limit.evaluate(4.1, "GiB/s").outcome is Outcome.MARGINAL
    assert limit.evaluate(4.3, "GiB/s").outcome is Outcome.PASS


# Selectors


def test_where_matching(tmp_path):
    text = DRIVE + LIMIT + LIMIT + "where = { pass = 1 }\n" + LIMIT + "where = { pass = [2, 3] }\n"
    thresholds = load_thresholds(write(tmp_path, text))
    everywhere, first, steady = thresholds.limits
    assert thresholds.limits_for("fill_throughput", {"pass": 1}) == [everywhere, first]
    assert thresholds.limits_for("fill_throughput", {"pass": 3}) == [everywhere, steady]
    assert thresholds.limits_for("fill_throughput", {"pass": 4}) == [everywhere]
    assert thresholds.limits_for("fill_throughput", {}) == [everywhere]  # a missing key does not match
    assert thresholds.limits_for("restore_throughput", {"pass": 1}) == []


def test_where_matches_every_key_and_block_sizes_as_strings():
    limit = Limit(
        "sweep_read_bandwidth",
        "GiB/s",
        "s",
        min=1.0,
        where=(("transfer", ("gpu-direct",)), ("block_size", ("1M", "128K"))),
    )
    assert limit.matches({"transfer": "gpu-direct", "block_size": "128K", "threads": 8})
    assert not limit.matches({"transfer": "cpu-only", "block_size": "128K", "threads": 8})
    assert not limit.matches({"transfer": "gpu-direct", "block_size": "64K"})
    assert not limit.matches({"transfer": "gpu-direct"})


def test_limits_for_an_unknown_measurement_is_an_error():
    with pytest.raises(ValueError, match="unknown measurement 'fill_speed'"):
        load_thresholds("local").limits_for("fill_speed", {})


# Units and sizes


def test_to_unit():
    assert to_unit(1.0, "GiB/s", "GB/s") == pytest.approx(1.073741824)
    assert to_unit(2500.0, "MB/s", "GB/s") == pytest.approx(2.5)
    assert to_unit(1024.0, "MiB/s", "GiB/s") == pytest.approx(1.0)
    assert to_unit(2.0, "min", "s") == pytest.approx(120.0)
    assert to_unit(250.0, "ms", "s") == pytest.approx(0.25)
    with pytest.raises(ValueError, match="unknown unit 'GBps'"):
        to_unit(1.0, "GBps", "GB/s")


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("128K", 131072), ("1M", 2**20), ("2G", 2**31), ("4096", 4096), ("1024K", 2**20), ("1000", 1000)],
)
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("nbytes", [1, 1000, 4096, 131072, 3 * 2**20, 2**30, 5 * 2**30 + 1024, 2**40])
def test_format_size_round_trip(nbytes):
    assert parse_size(format_size(nbytes)) == nbytes


def test_format_size_picks_the_largest_exact_suffix():
    sizes = [format_size(n) for n in (131072, 2**20, 2**31, 1536, 1000)]
    assert sizes == ["128K", "1M", "2G", "1536", "1000"]


@pytest.mark.parametrize("text", ["", "0", "0K", "-1M", "1.5M", "1m", "1MB", "1 M", "M", "1T", "01K"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize("nbytes", [0, -4096, 1.5, True])
def test_format_size_rejects(nbytes):
    with pytest.raises(ValueError, match="positive integer"):
        format_size(nbytes)
