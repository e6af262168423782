"""Which of ckptqual's native kernels this process runs, for the record of a run: each result's CPU cost depends on
it."""

from __future__ import annotations

from ckptqual.io.native import payload_kernel, psync_kernel


def kernels_in_use() -> dict[str, str]:
    """For the payload kernel and the psync loop: "native", or "Python: " and why the native one does not run."""
    found = {"payload": payload_kernel.kernel(), "psync_loop": psync_kernel.load()}
    return {name: "native" if kernel is not None else f"Python: {problem}" for name, (kernel, problem) in found.items()}
