"""The read sweep's matrix per transfer type, from the record: block sizes down, threads across, GiB/s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ckptqual.report.summary import table


def sweep_lines(data: dict[str, Any]) -> list[str]:
    """The sweep's matrix per transfer type: block sizes down, threads across, GiB/s."""
    config = data["config"]
    lines = [
        f"{config['jobs']} jobs (one file of {config['file_bytes'] / 2**20:,.0f} MiB each), batch {config['batch']}, "
        f"up to {config['requests_per_job']} reads per job per cell; GiB/s (2^30 bytes/s); "
        "F = below its limit, M = marginal"
    ]
    cells: list[dict[str, Any]] = data["cells"]
    for transfer in config["transfers"]:
        own = [cell for cell in cells if cell["transfer"] == transfer]
        engine = data["engines"].get(transfer, "")
        if not own or all(cell.get("outcome") == "SKIPPED" for cell in own):
            lines.append(f"{transfer}: {engine if own else 'not run'}")
            continue
        measured = [cell for cell in own if "settings" in cell]
        direct = {cell["settings"].get("direct_io") for cell in measured}
        io_mode = "O_DIRECT" if direct == {True} else "buffered" if direct == {False} else "O_DIRECT/buffered"
        lines.append(f"{transfer}: {engine}, {io_mode}")
        headers, rows = matrix(cells, transfer)
        lines += ["  " + line for line in table(headers, rows)]
    return lines


_MARKS = {"FAIL": " F", "MARGINAL": " M", "INVALID": " INVALID", "PASS": "", "MEASURED": ""}


def matrix(cells: Sequence[Mapping[str, Any]], transfer: str) -> tuple[list[str], list[list[str]]]:
    """A transfer type's cells as a table: block sizes down, threads across, GiB/s in the cells.

    A cell reads "skip" when it did not run and "error" when it broke; F, M or INVALID follow the figure of a
    cell that failed its limit, met it only marginally, or does not count.
    """
    own = [cell for cell in cells if cell["transfer"] == transfer]
    blocks = list(dict.fromkeys(cell["block_size"] for cell in own))
    threads = list(dict.fromkeys(cell["threads"] for cell in own))
    by_key = {(cell["block_size"], cell["threads"]): cell for cell in own}
    rows = []
    for block in blocks:
        row = [block]
        for count in threads:
            cell = by_key.get((block, count))
            if cell is None:
                row.append("")
            elif "GiBps" not in cell:
                row.append("skip" if cell.get("outcome") == "SKIPPED" else str(cell.get("outcome", "-")).lower())
            else:
                row.append(f"{cell['GiBps']:.2f}{_MARKS.get(cell.get('outcome', ''), '')}")
        rows.append(row)
    return ["block \\ threads", *(str(count) for count in threads)], rows
