"""What the suite wrote to the target, counted from the run's events: the number the drive's own count of bytes
written is compared with (limits/health.py)."""

from __future__ import annotations

from typing import Any


class SuiteWrites:
    """Listens to a run's events and adds up the bytes its writers wrote: the raw baseline's rounds, every
    checkpoint, both files sets of each odd layout (the layout and its regular twin) and the sweep's files each
    time they are written."""

    def __init__(self) -> None:
        self.parts: dict[str, int] = {"baseline": 0, "checkpoints": 0, "layouts": 0, "sweep": 0}
        self._sweep_writes: set[float] = set()

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    def baseline(self, baseline: dict[str, Any]) -> None:
        self.parts["baseline"] = baseline["bytes_per_round"] * len(baseline["write_GBps"])

    def checkpoint(self, checkpoint: dict[str, Any], of: int) -> None:
        self.parts["checkpoints"] += checkpoint["bytes"]

    def layout(self, layout: dict[str, Any]) -> None:
        if "odd_seconds" in layout:  # written (a layout that failed is told with its error only)
            self.parts["layouts"] += 2 * layout["bytes"]

    def sweep(self, sweep: dict[str, Any]) -> None:
        files = sweep.get("files", {})
        written_in = files.get("write_s")
        if written_in is not None and written_in not in self._sweep_writes:  # each write times itself anew
            self._sweep_writes.add(written_in)
            self.parts["sweep"] += files["jobs"] * files["file_bytes"]

    def to_dict(self) -> dict[str, Any]:
        return {"total_bytes": self.total_bytes, **{f"{part}_bytes": count for part, count in self.parts.items()}}
