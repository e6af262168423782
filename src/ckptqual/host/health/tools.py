"""The command-line tools health is read with (nvme-cli, smartctl): where they are, and one bounded call each.

A call never waits on a drive that does not answer: past its deadline the tool is killed and left (a process stuck
in the kernel ends when the drive answers), and the reading says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 15.0
INSTALL = {"nvme": "apt-get install nvme-cli", "smartctl": "apt-get install smartmontools"}


@dataclass(frozen=True)
class Output:
    """What one tool call printed (its exit status too), or why it gave nothing."""

    command: str
    text: str | None = None
    status: int | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Tools:
    """Paths of nvme-cli and smartctl, None where not installed."""

    nvme: str | None = None
    smartctl: str | None = None
    timeout_s: float = TIMEOUT_S

    @classmethod
    def find(cls) -> Tools:
        return cls(shutil.which("nvme"), shutil.which("smartctl"))

    def missing(self, tool: str) -> str:
        """Why `tool` gives nothing here."""
        name = "nvme-cli" if tool == "nvme" else tool
        return f"{name} is not installed ({INSTALL[tool]})"

    def run(self, tool: str, *args: str | Path) -> Output:
        """Runs `tool args`; the output, or why there is none (not installed, no answer in time, cannot start)."""
        path = getattr(self, tool)
        command = " ".join([tool, *map(str, args)])
        if path is None:
            return Output(command, reason=self.missing(tool))
        try:
            process = subprocess.Popen(
                [path, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
            )
        except OSError as error:
            return Output(command, reason=f"{command} could not start: {error.strerror}")
        try:
            stdout, stderr = process.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()  # not waited for: a process stuck on the drive ends when the drive answers
            return Output(command, reason=f"{command} did not answer within {self.timeout_s:g} s (left running)")
        return Output(command, stdout if stdout.strip() else stderr, process.returncode)

    def to_dict(self) -> dict[str, str]:
        return {tool: getattr(self, tool) or self.missing(tool) for tool in ("nvme", "smartctl")}


def failure(output: Output) -> str | None:
    """Why a call of nvme-cli gave no usable output (None when it did), with the fix for a permission problem."""
    if output.reason:
        return output.reason
    if output.status == 0 and output.text and output.text.lstrip().startswith(("{", "[")):
        return None
    lines = [line for line in (output.text or "").splitlines() if line.strip()]
    text = " ".join(lines[0].split())[:200] if lines else "no output"  # the error; a usage text may follow
    denied = "ermission denied" in text or "not permitted" in text
    hint = "; run as root (the tools need CAP_SYS_ADMIN)" if denied and os.geteuid() != 0 else ""
    return f"{output.command} failed (exit {output.status}): {text}{hint}"
