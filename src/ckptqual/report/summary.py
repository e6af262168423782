"""The terminal summary of a run, drawn from its record alone: per pass, checkpoints, mean and worst seconds,
GB/s and the test's outcome word; restore and layouts with theirs; MLPerf's metrics; what was left; the verdict."""

from __future__ import annotations

from typing import Any

from ckptqual.limits.ceiling import Ceiling
from ckptqual.limits.host_bound import MAX_WAIT_SHARE, PER_SECOND
from ckptqual.limits.measurements import Measurement, Taken, field, taken_at
from ckptqual.report.mlperf import mlperf_lines, mlperf_metrics
from ckptqual.report.verdict import recorded_verdict


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Right-aligned text columns."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    return [" ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)) for row in [headers, *rows]]


def _outcomes(data: dict[str, Any]) -> dict[str, str]:
    """Each test's outcome word by subject ("pass 2", "restore", ...)."""
    return {test["subject"]: test["outcome"] for test in data.get("tests", {}).values()}


def summary_lines(data: dict[str, Any]) -> list[str]:
    """What the run measured and decided, in a few lines."""
    settings, drive = data.get("settings", {}), data.get("drive", {})
    outcomes = _outcomes(data)
    lines = [
        f"drive {settings.get('drive')} ({settings.get('thresholds_file', '?').rsplit('/', 1)[-1]}); target "
        f"{data.get('target', {}).get('path', settings.get('target'))} [{drive.get('model', 'unknown')}, "
        f"fw {drive.get('firmware', 'unknown')}, {drive.get('filesystem', 'unknown')}]",
        f"workload {settings.get('workload')} at scale {settings.get('scale', 0):g} "
        f"({data.get('plan', {}).get('total_bytes', 0) / 1e9:,.2f} GB per checkpoint), "
        f"engine {settings.get('engine')}, fsync on, seed {settings.get('seed')}",
    ]
    lines += _ceiling_line(data)
    if "baseline" in data:
        base = data["baseline"]
        lines.append(
            f"raw sequential write {base['raw_write_GBps']:.2f} GB/s, read {base['raw_read_GBps']:.2f} GB/s "
            f"(median of {len(base['write_GBps'])})"
        )
    lines += _pass_rows(data, outcomes)
    if data.get("steady_state"):
        last = max(data["steady_state"], key=int)
        lines.append(
            f"steady state (SNIA, per-checkpoint GB/s of passes 2-{last}): {data['steady_state'][last]['reason']}"
        )
    for restored in data.get("restore", []):
        lines.append(
            f"restore of checkpoint {restored['checkpoint']}: {restored['seconds']:.2f} s, "
            f"{restored['GBps']:.2f} GB/s, every byte verified ({restored['cached_fraction_before']:.1%} "
            f"cached before) {outcomes.get('restore', '')}".rstrip()
        )
        lines += _reshard_lines(restored.get("reshard"))
    if "restore" not in data and "restore" in outcomes:
        lines.append(f"restore: {outcomes['restore']}")
    lines += mlperf_lines(mlperf_metrics(data)) if data.get("checkpoints") else []
    lines += _layout_line(data, outcomes)
    lines += _cpu_lines(data)
    lines += _device_lines(data)
    lines += _health_lines(data.get("health", {}))
    lines += [f"error: {error}" for error in data.get("errors", [])]
    lines += _left_lines(data)
    if (verdict := recorded_verdict(data)) is not None:
        basis = f" ({'; '.join(verdict.basis)})" if verdict.basis else ""
        lines.append(f"verdict: {verdict.overall}{basis}")
        lines += [f"  {reason}" for reason in verdict.reasons]
    if settings.get("results"):
        lines.append(f"results: {settings['results']}")
    return lines


def _ceiling_line(data: dict[str, Any]) -> list[str]:
    """The most GB/s this host could measure in each phase: `fill write 2.58 GB/s (2 cores x 1.29 GB per CPU-s)`."""
    ceiling = data.get("ceiling", {})
    shown = [
        Ceiling(name, phase["cores"], phase["GB_per_cpu_s"]).describe()
        for name, phase in ceiling.get("phases", {}).items()
    ]
    return [f"ceiling (the suite's own on this host, {ceiling['engine']} engine): {', '.join(shown)}"] if shown else []


def _pass_rows(data: dict[str, Any], outcomes: dict[str, str]) -> list[str]:
    """One row per pass that has an outcome or a result, a column per measurement the table takes per pass: a pass
    that failed or did not run shows its word."""
    results = {result["pass"]: result for result in data.get("passes", [])}
    columns = [row for row in taken_at(Taken.PASS) if row.column]
    numbers = sorted({*results, *(int(s.split()[1]) for s in outcomes if s.startswith("pass "))})
    rows = []
    for number in numbers:
        result = results.get(number)
        figures = [_checkpoints_text(result), *(_figure(result, row) for row in columns)] if result else None
        rows.append([str(number), *(figures or ["-"] * (1 + len(columns))), outcomes.get(f"pass {number}", "")])
    if not rows:
        return []
    return table(["pass", "ckpts", *(row.column for row in columns), "outcome"], rows)


def _figure(result: dict[str, Any], row: Measurement) -> str:
    """A pass's value of a measurement of the table, from the field its record path names; "-" where it has none."""
    value = result.get(field(row))
    return "-" if value is None else f"{value:.2f}"


def _checkpoints_text(result: dict[str, Any]) -> str:
    """Checkpoints a pass wrote; "5/33" where it ended early (--early-stop)."""
    written = str(len(result["checkpoints"]))
    return f"{written}/{result['checkpoints_planned']}" if result.get("ended_early") else written


def _cpu_lines(data: dict[str, Any]) -> list[str]:
    """The working processes' CPU seconds per GB of each phase, and every figure that was host-bound."""
    phases = [
        (f"raw {kind}", _median_round(rounds)) for kind, rounds in data.get("baseline", {}).get("host", {}).items()
    ]
    phases += [(f"pass {result['pass']}", result) for result in data.get("passes", [])]
    phases += [(f"restore {result['checkpoint']}", result) for result in data.get("restore", [])]
    phases += [
        (f"sweep {cell['id']}", cell) for cell in data.get("sweep", {}).get("cells", []) if "cpu_s_per_GB" in cell
    ]
    shown = [f"{name} {entry['cpu_s_per_GB']:.2f}" for name, entry in phases if entry.get("cpu_s_per_GB") is not None]
    if not shown:
        return []
    lines = [f"CPU seconds per GB (user+system of the working processes): {', '.join(shown)}"]
    lines += _wait_lines(phases)
    return lines + [f"  {name}: {entry['host_bound']}" for name, entry in phases if entry.get("host_bound")]


def _wait_lines(phases: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """How long each figure's own threads waited for a CPU per second of the figure, as judged for host-bound."""
    waits = [(name, (entry.get("host") or {}).get("wait_share")) for name, entry in phases]
    shown = [f"{name} {share:.2f} s" for name, share in waits if share is not None]
    if not shown:
        return []
    rule = f"host-bound above {MAX_WAIT_SHARE:.2f} s"
    return [f"CPU waits (seconds the figures' own threads waited for a CPU, {PER_SECOND}; {rule}): {', '.join(shown)}"]


def _device_lines(data: dict[str, Any]) -> list[str]:
    """What the devices under the target moved against what the suite moved, per kind of timed region
    (host.device_bytes), and what was done to the layer below them before the cold reads."""
    baseline = data.get("baseline", {}).get("device", {})
    phases = [(f"raw {kind}", count) for kind, rounds in baseline.items() for count in rounds]
    phases += [("checkpoints", c["device"]) for c in data.get("checkpoints", []) if c.get("device")]
    phases += [("restore", r["device"]) for r in data.get("restore", []) if r.get("device")]
    phases += [("sweep", c["device"]) for c in data.get("sweep", {}).get("cells", []) if c.get("device")]
    totals: dict[str, list[int]] = {}
    for name, count in phases:
        if count["device_bytes"] is not None:
            total = totals.setdefault(name, [0, 0])
            total[0] += count["device_bytes"]
            total[1] += count["suite_bytes"]
    unknown = sorted({count["not_countable"] for _, count in phases if count["not_countable"]})
    lines = []
    if totals:
        devices = ", ".join(next(count["devices"] for _, count in phases if count["device_bytes"] is not None))
        shown = ", ".join(
            f"{name} {device / 1e9:,.3f} of {suite / 1e9:,.3f}" for name, (device, suite) in totals.items()
        )
        lines.append(f"device bytes ({devices}; GB the devices moved of GB the suite moved): {shown}")
    lines += [f"device bytes not countable: {why}; those reads stand on the page-cache checks alone" for why in unknown]
    below = sorted({line for _, count in phases for line in count.get("layer_below", [])})
    return lines + [f"  layer below the files, before each cold read: {line}" for line in below]


def _median_round(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw baseline's round of median CPU seconds per GB (the baseline is a median too)."""
    return sorted(rounds, key=lambda round_: round_["cpu_s_per_GB"])[len(rounds) // 2] if rounds else {}


def _layout_line(data: dict[str, Any], outcomes: dict[str, str]) -> list[str]:
    judged = [layout for layout in data.get("layouts", []) if layout.get("judged")]
    if not judged and "shard layouts" not in outcomes:
        return []
    written = [layout for layout in data.get("layouts", []) if "error" not in layout]
    text = f"odd shard layouts: {len(written)} written and verified"
    if judged:
        worst = min(judged, key=lambda layout: layout["ratio"])
        text += f", slowest ratio {worst['ratio']:.2f} (layout {worst['example']})"
    return [f"{text} {outcomes.get('shard layouts', '')}".rstrip()]


def _health_lines(health: dict[str, Any]) -> list[str]:
    """The drive's health check and the bytes written counted two ways (three where the block layer counts)."""
    if "written" not in health:
        return []
    temperatures = []
    for reading in health["after"].get("devices", []):
        counters = reading["counters"]
        if "temperature_C" in counters:
            warning = counters.get("warning_temperature_threshold_C")
            temperatures.append(
                f"{reading['device']} {counters['temperature_C']} C" + (f" (warning {warning} C)" if warning else "")
            )
    written = health["written"]
    counts = [f"bytes written: suite {written['suite_written_bytes'] / 1e9:,.3f} GB"]
    if written.get("drive_written_bytes") is not None:
        ratio = f" (x{written['ratio']:.3f})" if written.get("ratio") is not None else ""
        counts.append(f"drives counted {written['drive_written_bytes'] / 1e9:,.3f} GB{ratio}")
    else:
        counts.append("drives counted: unavailable")
    if written.get("block_layer_written_bytes") is not None:
        ratio = f" (x{written['block_layer_ratio']:.3f})" if written.get("block_layer_ratio") is not None else ""
        counts.append(f"block layer {written['block_layer_written_bytes'] / 1e9:,.3f} GB{ratio}, all writers")
    after = f"; after the run: {', '.join(temperatures)}" if temperatures else ""
    return [f"{health['message']}{after}", "; ".join(counts)]


def _left_lines(data: dict[str, Any]) -> list[str]:
    cleanup = data.get("cleanup")
    if cleanup is None:
        return []
    left = data.get("left_on_target", [])
    if cleanup.get("removed"):
        return ["target: everything the run wrote was removed"]
    lines = [f"target: not everything was removed: {cleanup['why']}"]
    lines += [f"  left {entry['path']}: {entry['why']}" for entry in left[:10]]
    if cleanup.get("fix"):
        lines.append(f"  remove ckptqual's leftovers with: {cleanup['fix']}")
    return lines


def _reshard_lines(reshard: dict[str, Any] | None) -> list[str]:
    """A restore onto another layout: what the new ranks read, and from how many files each."""
    if not reshard:
        return []
    ranks = ", ".join(f"{r['rank']}: {r['bytes_read'] / 1e6:,.1f} MB of {r['files']} files" for r in reshard["ranks"])
    return [
        f"  onto layout {reshard['layouts']}: {reshard['bytes_read']:,} bytes read ({reshard['reads']}), "
        f"x{reshard['read_amplification']:.3f} the checkpoint's {reshard['checkpoint_bytes']:,} payload bytes",
        f"  per new rank: {ranks}",
    ]
