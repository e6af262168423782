"""The run's terminal report, drawn from the results record alone: the summary, the sweep table, the verdict; for
a run over several drives, the drives side by side."""

from __future__ import annotations

from typing import Any

from ckptqual.printable import printable_lines
from ckptqual.report.drives import drives_lines
from ckptqual.report.summary import summary_lines
from ckptqual.report.sweep_table import sweep_lines
from ckptqual.report.verdict import recorded_verdict


def report_sections(data: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Each section's title and lines, as pytest's terminal summary and `ckptqual summary` print them: every line
    printable, whatever the record's text holds."""
    if "drives" in data:  # the index of a run over several drives (report.drives)
        return [("ckptqual drives", printable_lines(drives_lines(data)))]
    sections = [("ckptqual summary", printable_lines(summary_lines(data)))]
    if "sweep" in data:
        sections.append(("ckptqual read sweep", printable_lines(sweep_lines(data["sweep"]))))
    return sections


def verdict_line(data: dict[str, Any]) -> str:
    """The final line: the recorded verdict, or why there is none."""
    verdict = recorded_verdict(data)
    return verdict.line() if verdict else "ckptqual verdict: none recorded (the run did not finish)"
