"""bench/gpu_check.sh on a host without a GPU: it runs to the end within its budget, says what GDS reported, and
skips each GPU part with the reason the probe gives."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ckptqual.host import gpu

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_skips_every_gpu_part_with_its_reason_here(tmp_path):
    host = gpu.probe()
    reason = host.problem("cpu-gpu")
    if reason is None:
        pytest.skip("this host has a GPU: run bench/gpu_check.sh itself (it takes minutes)")
    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("bash and timeout (coreutils) are needed to run the script")
    out = tmp_path / "out"
    env = os.environ | {"OUT": str(out), "GPU_CHECK_DIR": str(tmp_path), "GPU_CHECK_SECONDS": "300"}
    script = ROOT / "bench" / "gpu_check.sh"
    child = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    lines = child.stdout.splitlines()
    assert f"SKIP gpu read sweep: {reason}" in lines
    assert any(line.startswith("SKIP gpu restore: ") for line in lines)
    assert any(line.startswith("SKIP kvikio reference: ") for line in lines)
    assert any(line.startswith("SKIP kvikio single_node_io: ") for line in lines)
    nvidia_fs = "loaded" if gpu.nvidia_fs_loaded() else "not loaded (no /proc/driver/nvidia-fs/stats)"
    assert f"nvidia-fs: {nvidia_fs}" in lines
    assert f"GDS: {host.gds_problem or 'available'}; cuFile allow_compat_mode: {host.cufile_allow_compat_mode}" in lines
    summary = (out / "summary.md").read_text()
    assert f"SKIP gpu read sweep: {reason}" in summary and "gpu check done in" in summary
    assert sorted(path.name for path in out.iterdir()) == [
        "kvikio-benchmark.txt",
        "reference.txt",
        "restore.txt",
        "status.txt",
        "summary.md",
    ]
    assert not list(tmp_path.glob("ckptqual-gpu-check.*")), "the script left its work directory behind"
