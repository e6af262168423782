"""The run record: everything the results JSON holds, written atomically as the run goes; every report renders
from it (or from the file it was written to)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptqual import __version__
from ckptqual.faults import os_error_line
from ckptqual.limits.judgement import Judgement


def environment() -> dict[str, Any]:
    """Versions and host facts a result depends on."""
    versions = {"ckptqual": __version__, "python": platform.python_version()}
    for module in ("torch", "numpy", "kvikio", "pytest", "pytest_benchmark", "hypothesis"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions[module] = getattr(loaded, "__version__", "unknown")
    return {"versions": versions, "host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count()}


@dataclass
class RunRecord:
    """Everything the results JSON holds, written atomically whenever it changes.

    Saving never raises: a failure (the results disk full, say) is kept in `save_error`, so that it cannot stop
    the run from cleaning up its target; the verdict then names it.
    """

    path: Path | None
    data: dict[str, Any] = field(default_factory=dict)
    save_error: str | None = None

    def __post_init__(self) -> None:
        self.data.update(
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            environment=environment(),
            passes=[],
            measurements=[],
            tests={},
            errors=[],
        )

    def add_judgements(self, judgements: list[Judgement]) -> None:
        self.data["measurements"].extend(j.to_dict() for j in judgements)
        self.save()

    def record_test(self, nodeid: str, subject: str, outcome: str, message: str, when: str) -> None:
        """A test's outcome word and one-line message, what the run's verdict is computed from."""
        self.data["tests"][nodeid] = {"subject": subject, "outcome": str(outcome), "message": message, "when": when}
        self.save()

    def save(self) -> None:
        """Writes the JSON next to its final name, then renames it into place (never half-written)."""
        if self.path is None:
            return
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
            os.replace(temporary, self.path)
            self.save_error = None
        except OSError as error:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            self.save_error = f"the results file could not be written: {os_error_line(error, 'write')}"
