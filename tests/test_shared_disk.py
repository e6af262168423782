"""Two drives on loop devices whose backing files sit on one disk share that disk, and the many-drives report names
it: real ext4 filesystems in files, loop-mounted, followed through the loop device to the disk under the file. A run
over two such drives prints their figures side by side, names them by their mounts and writes the drives' page."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ckptqual.host.identity import identify
from ckptqual.host.topology import disks_under, pci_chain, shared_disks
from ckptqual.pytest_plugin.drive_index import shared_hardware
from ckptqual.report.drives import drive_row, drives_index, drives_lines, shared_host
from ckptqual.report.schema import shape_problem
from suite_runs import HOST_LIMITED, PAIR, lenient_drive, run_suite


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture
def two_loops(tmp_path: Path, request: pytest.FixtureRequest):
    """Two ext4 filesystems in files under tmp_path, loop-mounted; unmounted (and their loops detached) after."""
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        pytest.skip("mkfs.ext4 and mount are needed (apt-get install e2fsprogs mount)")
    mounted: list[Path] = []
    try:
        for name in ("a", "b"):
            image, point = tmp_path / f"{name}.img", tmp_path / name
            point.mkdir()
            with image.open("wb") as file:
                file.truncate(getattr(request, "param", 16) << 20)
            if _run(["mkfs.ext4", "-q", "-F", str(image)]).returncode:
                pytest.skip("mkfs.ext4 failed here")
            if _run(["mount", "-o", "loop", str(image), str(point)]).returncode:
                pytest.skip("cannot loop-mount here (needs root and loop devices)")
            mounted.append(point)
        yield mounted
    finally:
        for point in mounted:
            _run(["umount", str(point)])  # -o loop set autoclear: the loop device detaches with the unmount


def test_two_loop_devices_on_one_disk_are_reported_as_sharing_it(two_loops, tmp_path):
    under_tmp = disks_under(tmp_path)
    if not under_tmp:
        pytest.skip(f"{tmp_path} lies on no block device (a tmpfs?): no disk to share")
    loops = {point.name: identify(point).device for point in two_loops}
    assert all(device.startswith("loop") for device in loops.values()) and len(set(loops.values())) == 2, loops
    disks = {point.name: disks_under(point) for point in two_loops}
    assert disks == {"a": under_tmp, "b": under_tmp}  # through the loop to the disk under the backing file
    assert shared_disks(disks) == [{"disk": disk, "drives": ["a", "b"]} for disk in under_tmp]

    rows = [drive_row(point.name, {"settings": {"target": str(point)}}) for point in two_loops]
    for row in rows:
        row["devices"] = [loops[row["label"]]]  # as the record's identity names it: the loop device
    pcie, shared = shared_hardware(rows)
    assert shared == shared_disks(disks)
    chain = pci_chain(under_tmp[0])  # the disk's PCI function, where it has one: the drives' one device
    assert pcie == ([{"pci": chain[-1], "drives": ["a", "b"], "is": "their one device"}] if chain else [])
    index = drives_index(rows, shared_host(rows, 2, pcie, shared), {"overall": "INCOMPLETE", "reasons": []})
    assert shape_problem(index) is None
    lines = drives_lines(index)
    assert f"shared disk {under_tmp[0]}: a, b" in lines


def test_drives_on_different_disks_share_none():
    assert shared_disks({"a": ["nvme0n1"], "b": ["nvme1n1"], "c": []}) == []
    assert shared_disks({"a": ["sda"], "b": ["sdb", "sda"]}) == [{"disk": "sda", "drives": ["a", "b"]}]


@pytest.mark.parametrize("two_loops", [200], indirect=True)  # MiB each: room for the small run's checkpoints
def test_a_run_over_two_drives_shows_them_side_by_side_and_writes_their_page(two_loops, tmp_path):
    if not disks_under(tmp_path):
        pytest.skip(f"{tmp_path} lies on no block device (a tmpfs?): no disk to share")
    report = tmp_path / "report"
    targets = [arg for point in two_loops for arg in ("--target", str(point))]
    drive = lenient_drive(tmp_path / "lenient.toml", "lenient drive")
    result = run_suite(*PAIR, "--drive", str(drive), *targets, "--results", str(tmp_path / "q.json"),
                       "--report-dir", str(report))  # fmt: skip
    output = result.stdout + result.stderr
    # The view is the point, not the verdict: the loops' disk is this host's, which other work may use meanwhile (and a
    # busy host may hold the ranks up), so INVALID for either reason is a verdict this run may give, with every view.
    verdict = result.stdout.rstrip().splitlines()[-1]
    host_limited = verdict.startswith("ckptqual verdict: INVALID") and any(r in verdict for r in HOST_LIMITED)
    assert result.returncode == 0 or (result.returncode == 1 and host_limited), output[-4000:]
    loops = [identify(point).device for point in two_loops]
    header = next(line for line in output.splitlines() if line.split()[:1] == ["figure"])
    assert all(f"{loop} ({point})" in header for loop, point in zip(loops, two_loops, strict=True)), header
    row = next(line for line in output.splitlines() if line.split()[:3] == ["pass", "2", "GB/s"])
    assert len([cell for cell in row.split() if cell == "GB/s"]) == 3  # the name's unit, then one per drive
    assert f"shared disk {disks_under(tmp_path)[0]}: {', '.join(sorted(loops))}" in output
    chain = pci_chain(disks_under(tmp_path)[0])
    shared_pci = f"shared PCI device {chain[-1]}, their one device: " if chain else "shared PCI device: none under"
    assert shared_pci in output
    page = (report / "report.html").read_text()
    assert "Drives side by side" in page and all(f"lenient {loop}" in page for loop in loops)
    assert f"the drives side by side written to {report / 'report.html'}" in output
