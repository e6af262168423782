"""Progress as the run goes: one line for what it writes where, each checkpoint, each restore and layout, what it
left; and on a terminal, during a fill pass, one live line redrawn with each sample of the host."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptqual.config.run_settings import RunSettings


def duration(seconds: float | None) -> str:
    """Seconds as h:mm:ss ("?" where unknown)."""
    if seconds is None:
        return "?"
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


@dataclass
class PassProgress:
    """Where a fill pass stands: checkpoints done, their bytes, and the ranks' written-bytes count (from the samples)
    at the end of the last one, from which the checkpoint in flight is counted."""

    number: int
    started: float
    done_checkpoints: int = 0
    done_bytes: int = 0
    written_mark: int | None = None


class LiveLine:
    """The figures of the live line, from the run's settings, the passes so far and the latest sample."""

    def __init__(self, settings: RunSettings) -> None:
        self.passes, self.per_pass = settings.passes, settings.checkpoints_per_pass
        self.checkpoint_bytes = settings.plan.total_bytes
        self.fill_bytes, self.fill_wall_s = 0, 0.0  # the fill passes done
        self.last_GBps: float | None = None
        # A synchronous cadence's compute intervals are time of their own, counted apart from the writes; an
        # asynchronous save writes during them, so its wall-clock rate already holds them.
        self.interval_s = 0.0 if settings.async_save else settings.checkpoint_interval_s

    def text(self, current: PassProgress, sample: dict[str, Any] | None, now: float) -> str:
        pass_bytes = self.per_pass * self.checkpoint_bytes
        done = current.done_bytes + self._in_flight(current, sample)
        writing = now - current.started - min(now - current.started, current.done_checkpoints * self.interval_s)
        rate = done / writing if done > 0 and writing > 0 else None
        earlier_write_s = self.fill_wall_s - self.interval_s * self.fill_bytes / self.checkpoint_bytes
        if rate is None and earlier_write_s > 0:
            rate = self.fill_bytes / earlier_write_s  # a pass just begun: the passes before it
        intervals_left = self.interval_s * (self.per_pass - current.done_checkpoints)
        pass_left = (pass_bytes - done) / rate + intervals_left if rate else None
        later = (self.passes - current.number) * (pass_bytes / rate + self.interval_s * self.per_pass) if rate else None
        run_left = pass_left + later if pass_left is not None and later is not None else None
        total = self.passes * pass_bytes
        return (  # what matters most first: a narrow terminal cuts the end
            f"ckptqual: pass {current.number}/{self.passes} ckpt {min(current.done_checkpoints + 1, self.per_pass)}/"
            f"{self.per_pass} | {(self.fill_bytes + done) / 1e9:,.2f} of {total / 1e9:,.2f} GB | "
            f"left: pass {duration(pass_left)}, run {duration(run_left)} | {self._now(sample)}"
        )

    def _in_flight(self, current: PassProgress, sample: dict[str, Any] | None) -> int:
        """Bytes of the checkpoint being written: the ranks' written bytes since the last one ended (at most one
        checkpoint's; 0 where there are no samples)."""
        if sample is None or current.written_mark is None:
            return 0
        return min(max(0, sample["suite_written_bytes"] - current.written_mark), self.checkpoint_bytes)

    def _now(self, sample: dict[str, Any] | None) -> str:
        """The current rate: what the drive writes (its counters), else what the ranks write, else the last
        checkpoint's."""
        if sample is not None and sample["devices"]:
            return f"drive {sum(d['write_MBps'] for d in sample['devices'].values()) / 1e3:.2f} GB/s"
        if sample is not None:
            return f"written {sample['suite_write_MBps'] / 1e3:.2f} GB/s"
        return "last checkpoint " + (f"{self.last_GBps:.2f} GB/s" if self.last_GBps is not None else "? GB/s")


class Progress:
    """The run's events (runs.events.RunEvents) that a person follows, as one line each, handed to `say`. With
    `redraw` (a terminal), a fill pass also shows one live line, redrawn in place at every sample ("" clears it);
    without, the lines alone. Samples arrive on another thread: every write is under one lock."""

    def __init__(
        self,
        settings: RunSettings,
        say: Callable[[str], None],
        redraw: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self._say, self.redraw, self.clock = settings, say, redraw, clock
        self.live = LiveLine(settings)
        self.current: PassProgress | None = None
        self.latest: dict[str, Any] | None = None
        self._shown = False
        self._lock = threading.RLock()

    def say(self, line: str) -> None:
        """Prints a line above the live line (cleared first, drawn again after)."""
        with self._lock:
            if self._shown and self.redraw is not None:
                self.redraw("")
            self._say(line)
            self._draw()

    def _draw(self) -> None:
        redraw, current = self.redraw, self.current
        self._shown = redraw is not None and current is not None
        if redraw is not None and current is not None:
            redraw(self.live.text(current, self.latest, self.clock()))

    def sample(self, sample: dict[str, Any]) -> None:
        with self._lock:
            self.latest = sample
            if self.current is not None and self.current.written_mark is None:
                self.current.written_mark = sample["suite_written_bytes"]  # the first sample of the run came late
            self._draw()

    def fill_started(self, number: int) -> None:
        with self._lock:
            mark = self.latest["suite_written_bytes"] if self.latest is not None else None
            self.current = PassProgress(number, self.clock(), written_mark=mark)
            self._draw()

    def fill_ended(self, number: int) -> None:
        """Clears the live line, however the pass ended (written, failed, interrupted)."""
        with self._lock:
            self.current = None
            if self._shown and self.redraw is not None:
                self.redraw("")
            self._shown = False

    def fill_pass(self, result: dict[str, Any], wall_s: float) -> None:
        with self._lock:
            self.live.fill_bytes += result["bytes"]
            self.live.fill_wall_s += wall_s

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
        with self._lock:
            current, self.live.last_GBps = self.current, checkpoint["GBps"]
            if current is not None:
                current.done_checkpoints += 1
                current.done_bytes += checkpoint["bytes"]
                if current.written_mark is not None:
                    current.written_mark += checkpoint["bytes"]  # what its ranks wrote, without a sample's lag
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
