"""Progress lines as the run goes: what it writes where, each checkpoint, each restore and layout, what it left."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ckptqual.config.run_settings import RunSettings


class Progress:
    """The run's events (runs.events.RunEvents) that a person follows, as one line each, handed to `say`."""

    def __init__(self, settings: RunSettings, say: Callable[[str], None]) -> None:
        self.settings, self.say = settings, say

    def started(self, target: dict[str, Any], drive: dict[str, Any]) -> None:
        run, plan = self.settings, self.settings.plan
        kept = " (kept: --keep)" if run.keep else ""
        self.say(
            f"ckptqual: drive {run.thresholds.drive.name!r} ({run.thresholds.path.name}), target {target['path']} "
            f"[{drive['filesystem']} {drive['mount_options']}]; writing only inside "
            f"{target['run_dir'].rsplit('/', 1)[-1]}, removed at the end{kept}"
        )
        self.say(
            f"ckptqual: {plan.workload} at scale {plan.scale:g}: {len(plan.ranks)} ranks, {plan.file_count} files, "
            f"{plan.total_bytes / 1e9:,.2f} GB per checkpoint, {run.checkpoints_per_pass} checkpoints per pass, "
            f"{run.passes} passes, engine {run.engine}, seed {run.seed}"
        )

    def measuring_baseline(self, bytes_per_round: int) -> None:
        self.say(
            f"ckptqual: measuring raw sequential write and read ({bytes_per_round / 1e9:,.2f} GB x 3) on the target"
        )

    def baseline(self, baseline: dict[str, Any]) -> None:
        writes = ", ".join(f"{v:.2f}" for v in baseline["write_GBps"])
        reads = ", ".join(f"{v:.2f}" for v in baseline["read_GBps"])
        self.say(
            f"ckptqual: raw sequential write {baseline['raw_write_GBps']:.2f} GB/s, read "
            f"{baseline['raw_read_GBps']:.2f} GB/s (medians of {writes} / {reads})"
        )

    def checkpoint(self, checkpoint: dict[str, Any], of: int) -> None:
        self.say(
            f"ckptqual: pass {checkpoint['pass_number']} checkpoint {checkpoint['index']}/{of}: "
            f"{checkpoint['seconds']:.2f} s, {checkpoint['GBps']:.2f} GB/s (first rank done "
            f"{checkpoint['first_done_s']:.2f} s)"
        )

    def restore(self, result: dict[str, Any]) -> None:
        self.say(
            f"ckptqual: restore of checkpoint {result['checkpoint']}: {result['seconds']:.2f} s, "
            f"{result['GBps']:.2f} GB/s, every byte verified ({result['cached_fraction_before']:.1%} cached before)"
        )

    def layout(self, layout: dict[str, Any]) -> None:
        if "error" in layout:
            return
        judged = "" if layout["judged"] else ", too small to judge"
        self.say(
            f"ckptqual: layout {layout['example']}: {layout['files']} files, {layout['bytes'] / 1e6:,.1f} MB, "
            f"{layout['odd_GBps']:.2f} GB/s vs regular {layout['regular_GBps']:.2f} GB/s (ratio "
            f"{layout['ratio']:.2f}{judged}), read back and verified"
        )

    def finished(self, cleanup: dict[str, Any]) -> None:
        if not cleanup["removed"] and not self.settings.keep:
            why = cleanup.get("why") or next(iter(cleanup.get("errors", [])), "see left_on_target")
            self.say(
                f"ckptqual: the run directory was not removed completely ({why}); once the drive responds, run: "
                f"{cleanup['fix']}"
            )
