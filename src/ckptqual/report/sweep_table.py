"""The read sweep's matrix per transfer type, from the record: block sizes down, threads across, GiB/s."""

from __future__ import annotations

from typing import Any

from ckptqual.report.summary import table
from ckptqual.runs.sweep.cells import matrix


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
