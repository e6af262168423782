"""A run over several drives, side by side: one row per drive (each pass's outcome, restore, sweep, layouts and the
drive's verdict), what the drives share on the host (the payload generator's cores, a PCIe switch or HBA), and the
index that `--results` holds for such a run (each drive's own results file is beside it)."""

from __future__ import annotations

from typing import Any

from ckptqual.report.headlines import headline_key, headlines
from ckptqual.report.summary import table

# The most telling outcome of several (the sweep's cells) comes first.
_SEVERITY = ("ERROR", "INTERRUPTED", "NOT_RUN", "INVALID", "FAIL", "NOT_STEADY", "MARGINAL", "PASS", "MEASURED",
             "SKIPPED")  # fmt: skip


def drive_row(label: str | None, data: dict[str, Any], unjudged: str | None = None) -> dict[str, Any]:
    """What the side-by-side table and the index keep of one drive's record; `unjudged`: why it has no verdict."""
    settings = data.get("settings", {})
    verdict = data.get("verdict") or {"overall": "INCOMPLETE", "reasons": [unjudged or "no verdict was recorded"]}
    return {
        "label": label,
        "target": data.get("target", {}).get("path", settings.get("target")),
        "drive": settings.get("drive"),
        "results": settings.get("results"),
        "outcomes": {test["subject"]: test["outcome"] for test in data.get("tests", {}).values()},
        "verdict": verdict,
        "devices": [device["name"] for device in data.get("drive", {}).get("physical", [])],
        "payload_cores": payload_cores(data),
        "health": data.get("health", {}).get("message"),
        "drives_at_once": settings.get("drives_at_once", 1),
        "mount": data.get("drive", {}).get("mount_point"),
        "figures": {headline_key(h): [h.mean, h.unit] for h in headlines(data)},
    }


def missing_row(label: str | None, target: object, results: object, why: str) -> dict[str, Any]:
    """The row of a drive whose record never came back (its worker died)."""
    verdict = {"overall": "INCOMPLETE", "reasons": [why]}
    return {"label": label, "target": str(target), "drive": None, "results": results, "outcomes": {},
            "verdict": verdict, "devices": [], "payload_cores": None, "health": None,
            "drives_at_once": 1}  # fmt: skip


def crashed_row(row: dict[str, Any], why: str, interruption: str | None = None) -> dict[str, Any]:
    """The row of a drive whose worker crashed during one of its tests: at best INCOMPLETE, `why` its first reason;
    after the `interruption` that stopped the run, if any (a worker may die of it)."""
    verdict = row["verdict"]
    overall = "INCOMPLETE" if verdict["overall"] == "QUALIFIED" else verdict["overall"]
    first = f"{interruption}; {why}" if interruption else why
    reasons = [first, *(reason for reason in verdict["reasons"] if reason != interruption)]
    return {**row, "verdict": {**verdict, "overall": overall, "reasons": reasons}}


def payload_cores(data: dict[str, Any]) -> float | None:
    """Cores the payload generator needs for this drive: its ranks' payload CPU seconds per second of its busiest
    pass, times the headroom the payload rule asks (runs.fill); None before a checkpoint was written."""
    from ckptqual.runs.fill import MIN_GENERATOR_HEADROOM  # loads torch: only where a run's figures are

    by_pass: dict[int, list[float]] = {}
    for checkpoint in data.get("checkpoints", []):
        cpu = sum(rank.get("payload_cpu_s", 0.0) for rank in checkpoint.get("ranks", []))
        totals = by_pass.setdefault(checkpoint["pass_number"], [0.0, 0.0])
        totals[0], totals[1] = totals[0] + cpu, totals[1] + checkpoint["seconds"]
    rates = [cpu / seconds for cpu, seconds in by_pass.values() if seconds > 0]
    return MIN_GENERATOR_HEADROOM * max(rates) if rates else None


def shared_host(rows: list[dict[str, Any]], usable_cores: int, pcie: list[dict], disks: list[dict]) -> dict[str, Any]:
    """What the drives share: the generator's cores needed by the most demanding drives that ran at once, together,
    against the usable cores, the PCI functions (switch ports, HBAs) and the disks under two or more drives."""
    at_once = max((row["drives_at_once"] for row in rows), default=1)
    needed = {row["label"]: row["payload_cores"] for row in rows}
    busiest = sorted((cores for cores in needed.values() if cores is not None), reverse=True)[:at_once]
    return {
        "usable_cores": usable_cores,
        "drives_at_once": at_once,
        "payload_cores_needed": needed,
        "payload_cores_needed_at_once": sum(busiest),
        "pcie_shared": pcie,
        "disks_shared": disks,
    }


def drives_index(rows: list[dict[str, Any]], shared: dict[str, Any], verdict: dict[str, Any]) -> dict[str, Any]:
    """The record `--results` holds for a run over several drives; `ckptqual summary` prints it as the table."""
    settings = {"drives": [row["label"] for row in rows], "results": {row["label"]: row["results"] for row in rows}}
    return {"settings": settings, "drives": {row["label"]: row for row in rows}, "shared_host": shared,
            "verdict": verdict}  # fmt: skip


def drives_lines(index: dict[str, Any]) -> list[str]:
    """The drives side by side, each drive's reasons, what they share on the host, the overall verdict."""
    rows = list(index["drives"].values())
    passes = sorted({s for row in rows for s in row["outcomes"] if s.startswith("pass ")}, key=lambda s: int(s[5:]))
    headers = ["drive", "target", *passes, "restore", "sweep", "layouts", "verdict"]
    lines = table(headers, [_row_cells(row, passes) for row in rows])
    lines += figures_lines(rows)
    for row in rows:
        reasons = row["verdict"]["reasons"]
        if row["verdict"]["overall"] != "QUALIFIED" and reasons:
            lines.append(f"{row['label']}: {row['verdict']['overall']}: {reasons[0]}")
    lines += [f"{row['label']}: results {row['results']}" for row in rows if row["results"]]
    lines += _shared_lines(index["shared_host"])
    return [*lines, f"verdict over {len(rows)} drives: {index['verdict']['overall']}"]


def figures_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The drives' headline figures side by side: one row per figure, one column per drive, named by its label and
    mount point; none where no drive measured anything."""
    figures = [row.get("figures") or {} for row in rows]
    names = list(dict.fromkeys(name for found in figures for name in found))
    if not names:
        return []
    headers = ["figure", *(f"{row['label']} ({row['mount']})" if row.get("mount") else row["label"] for row in rows)]
    cells = [
        [name, *(f"{found[name][0]:.3g} {found[name][1]}" if name in found else "-" for found in figures)]
        for name in names
    ]
    return ["", *table(headers, cells)]


def _row_cells(row: dict[str, Any], passes: list[str]) -> list[str]:
    outcomes = row["outcomes"]
    sweep = [outcome for subject, outcome in outcomes.items() if subject.startswith("sweep ")]
    worst_sweep = min(sweep, key=lambda o: _SEVERITY.index(o) if o in _SEVERITY else len(_SEVERITY), default="-")
    return [
        row["label"],
        str(row["target"]),
        *(outcomes.get(subject, "-") for subject in passes),
        outcomes.get("restore", "-"),
        worst_sweep,
        outcomes.get("shard layouts", "-"),
        row["verdict"]["overall"],
    ]


def _shared_lines(shared: dict[str, Any]) -> list[str]:
    from ckptqual.runs.fill import MIN_GENERATOR_HEADROOM  # loads torch: only where a run's figures are

    needed = {label: cores for label, cores in shared["payload_cores_needed"].items() if cores is not None}
    each = ", ".join(f"{label} {cores:.2f}" for label, cores in needed.items()) or "none measured"
    at_once, total, usable = shared["drives_at_once"], shared["payload_cores_needed_at_once"], shared["usable_cores"]
    lines = [
        f"shared host: the payload generator needs {total:.2f} of {usable} usable cores for {at_once} drive(s) at once "
        f"({MIN_GENERATOR_HEADROOM:g}x the payload CPU rate of each drive's busiest pass: {each})"
        + ("" if total <= usable else "; not enough: the passes where a drive's share fell short are INVALID")
    ]
    for disk in shared.get("disks_shared", []):
        lines.append(f"shared disk {disk['disk']}: {', '.join(disk['drives'])}")
    for parent in shared["pcie_shared"]:
        lines.append(f"shared PCI device {parent['pci']}, {parent['is']}: {', '.join(parent['drives'])}")
    if not shared["pcie_shared"]:
        lines.append("shared PCI device: none under two or more drives (a tmpfs or virtual device has none)")
    return lines
