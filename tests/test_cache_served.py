"""Reads a cache served are INVALID: the block layer's counters of the devices under the target against the suite's
bytes, on real loop devices over files on this machine's disk (host.device_bytes, limits.cache_served)."""

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from ckptqual.host.beneath import RunTree
from ckptqual.host.device_bytes import DeviceBytes, devices_of, devices_under, parse_stat
from ckptqual.host.gpu import HostGpu
from ckptqual.limits.cache_served import MIN_DEVICE_SHARE, OTHER_IO, cache_served_reason
from ckptqual.plan.model import CheckpointPlan, FilePlan, RankPlan, TensorSpec
from ckptqual.runs.baseline import measure_baseline
from ckptqual.runs.fill import FillCampaign
from ckptqual.runs.pool import RankPool
from ckptqual.runs.sweep.cells import Cell, SweepConfig
from ckptqual.runs.sweep.driver import SweepRun
from suite_runs import SMALL_PAIR, lenient_drive, run_suite

# Captured on this machine (kernel 6.x, 17 fields): /sys/block/vda/stat and /sys/block/loop0/stat.
VDA_STAT = (
    "  152339    19048 38939570   117708   103580    54863 124626488   226175        0    46092   354924    21103"
    "       41 57646912     7395    26884     3644\n"
)
LOOP_STAT = (
    "  459914       52 80553468   158976    41667    16271 70114760   369438        0    52780   548490        0"
    "        0        0        0     9386    20076\n"
)
MB = 1_000_000
TREES = Path(__file__).parent / "data" / "identity"
RESTORE_RELATIVE_TO_RAW_READ = """
[[limit]]
name = "restore_throughput"
min = 0.0001
unit = "ratio"
relative_to = "raw_read"
source = "test: a limit relative to the raw read, which a cache served"
"""

needs_losetup = pytest.mark.skipif(shutil.which("losetup") is None, reason="losetup is missing: no loop devices here")


def test_stat_lines_give_sectors_read_and_written_in_bytes():
    assert parse_stat(VDA_STAT) == (38939570 * 512, 124626488 * 512)
    assert parse_stat(LOOP_STAT) == (80553468 * 512, 70114760 * 512)
    with pytest.raises(ValueError, match="not a block device stat line"):
        parse_stat("0 0 x")


def test_a_device_that_read_far_less_than_the_suite_is_named_with_both_counts():
    served = DeviceBytes("read", 400 * MB, 3 * MB, ("vda",))
    assert cache_served_reason("restore of checkpoint 3", served) == (
        "restore of checkpoint 3: the devices under the target (vda) read 3,000,000 bytes of the 400,000,000 bytes "
        "the suite read (at least 90% expected), so a cache the suite cannot evict served the figure; qualify the "
        "device itself, not a file or cache above it"
    )
    assert cache_served_reason("x", replace(served, device_bytes=int(MIN_DEVICE_SHARE * 400 * MB))) is None
    assert cache_served_reason("x", replace(served, device_bytes=None, not_countable="tmpfs")) is None
    written = cache_served_reason("checkpoint 1", DeviceBytes("written", 10 * MB, 0, ("vda",)))
    assert "received 0 bytes of the 10,000,000 bytes the suite wrote and fsynced" in written


@needs_losetup
def test_a_loop_device_resolves_to_the_disk_under_its_backing_file(loop_ext4, tmp_path):
    mount = loop_ext4("64M")
    devices = devices_under(mount)
    image = tmp_path / "ext4-0.img"
    assert devices.names == devices_under(tmp_path).names  # the disk that holds the image, not the loop device
    assert devices.not_countable is None and not devices.names[0].startswith("loop")
    (backing,) = devices.backing_files
    assert (backing.path, backing.device, backing.inode) == (str(image), image.stat().st_dev, image.stat().st_ino)
    evicted = f"{backing.loop}'s backing file {image} evicted (mincore finds under 5% of it in memory)"
    assert devices.evict_below() == (evicted,)


@needs_losetup
def test_a_loop_inside_a_loop_resolves_to_the_disk_at_the_bottom(loop_ext4, tmp_path):
    outer = loop_ext4("128M")
    image, inner = outer / "inner.img", tmp_path / "inner"
    inner.mkdir()
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(inner)], check=True)
    try:
        devices = devices_under(inner)
        assert devices.names == devices_under(tmp_path).names
        assert [backing.path for backing in devices.backing_files] == [str(image), str(tmp_path / "ext4-0.img")]
    finally:
        subprocess.run(["umount", str(inner)], check=True)


def test_an_lvm_volume_on_md_is_counted_at_its_members(tmp_path):
    """The captured md-raid0 tree: dm-0 (LVM) on md0, a RAID0 of nvme0n1 and the native-multipath head nvme1n1."""
    sys_root = TREES / "md-raid0" / "sys"
    assert devices_of(sys_root / "devices/virtual/block/dm-0", sys_root=sys_root).names == ["nvme0n1", "nvme1n1"]


def test_a_multipath_nvme_head_is_counted_at_its_paths(tmp_path):
    """The same tree with the head's two path devices (nvme1c1n1, nvme1c2n1 under controllers nvme1 and nvme2, as
    drivers/nvme/host/multipath.c names them), which count what older kernels never count on the head."""
    sys_root = tmp_path / "sys"
    shutil.copytree(TREES / "md-raid0" / "sys", sys_root, symlinks=True)
    for controller in ("nvme1", "nvme2"):
        path = f"nvme1c{controller[-1]}n1"
        device = (sys_root / "devices/virtual/nvme-subsystem/nvme-subsys1" / controller).resolve() / path
        device.mkdir()
        (device / "stat").write_text(VDA_STAT)
        (sys_root / "class" / "block" / path).symlink_to(device)
    devices = devices_of(sys_root / "devices/virtual/block/dm-0", sys_root=sys_root)
    assert devices.names == ["nvme0n1", "nvme1c1n1", "nvme1c2n1"]


def test_a_filesystem_without_a_block_device_is_not_countable(tmpfs):
    devices = devices_under(tmpfs("size=8m"))
    assert devices.names == [] and devices.not_countable.startswith("tmpfs at ")
    assert devices.not_countable.endswith("has no block device whose reads can be counted")


def _raw_read(mount: Path, evict_below: bool):
    """One real round of the raw baseline (2 ranks, 64 MB) on `mount`, the layer below evicted or left cached."""
    devices = devices_under(mount)
    devices = devices if evict_below else replace(devices, backing_files=())
    (mount / "run").mkdir()

    def remove(directory: Path, what: str) -> None:
        for path in directory.glob("raw-*.bin"):
            path.unlink()

    with RankPool(2, seed=1, timeout_s=300) as pool, RunTree(mount / "run") as tree:
        return measure_baseline(pool, tree, mount / "run" / "raw", 64 * MB, remove, repeats=1, devices=devices)


@needs_losetup
def test_a_raw_read_from_the_cached_backing_file_of_a_loop_device_is_invalid(loop_ext4):
    baseline = _raw_read(loop_ext4("256M"), evict_below=False)  # the writes left the backing file's pages cached
    (read,) = baseline.device["read"]
    assert read.suite_bytes == 64 * MB and read.device_bytes < MIN_DEVICE_SHARE * read.suite_bytes
    invalid = baseline.invalid()
    assert set(invalid) <= {"raw_read", "raw_write"}  # the fsynced writes did reach the disk: other writers on this
    assert "raw_write" not in invalid or OTHER_IO in invalid["raw_write"], invalid  # shared disk can only add to them
    assert f"read {read.device_bytes:,} bytes of the 64,000,000 bytes the suite read" in invalid["raw_read"]


@needs_losetup
def test_a_raw_read_with_the_layer_below_evicted_is_read_by_the_disk(loop_ext4, tmp_path):
    baseline = _raw_read(loop_ext4("256M"), evict_below=True)
    (read,) = baseline.device["read"]
    assert read.device_bytes >= read.suite_bytes == 64 * MB
    assert all(OTHER_IO in why for why in baseline.invalid().values())  # other work on this shared disk adds
    assert read.layer_below[0].endswith("evicted (mincore finds under 5% of it in memory)")
    assert baseline.to_dict()["device"]["read"][0]["devices"] == devices_under(tmp_path).names


@needs_losetup
@pytest.mark.parametrize("barrier", [0, 1])
def test_a_checkpoint_whose_fsynced_bytes_never_reached_the_disk_is_invalid(loop_ext4, barrier):
    """ext4 with barrier=0 sends no flush, so the loop device never fsyncs its backing file: the checkpoints' fsyncs
    return with their bytes in the page cache below, not on the disk. With barriers they reach the disk. (Two
    checkpoints: on this busy shared disk other writers and writeback add to the count of one of them.)"""
    mount = loop_ext4("600M", f"barrier={barrier}")
    ranks = tuple(RankPlan(r, (FilePlan(f"model-{r}.pt", (TensorSpec("w", 25_000_000, "float32"),)),)) for r in (0, 1))
    plan = CheckpointPlan("two 100 MB files", ranks)
    (mount / "run" / "checkpoints").mkdir(parents=True)
    with RankPool(2, seed=3, timeout_s=300) as pool:
        campaign = FillCampaign(mount / "run" / "checkpoints", plan, pool, "stream", 2, remove=lambda d, what: None)
        result = campaign.run_pass(1)
    counts = [checkpoint.device for checkpoint in result.checkpoints]
    assert {(c.direction, c.suite_bytes) for c in counts} == {("written", 200 * MB)}
    reasons = [cache_served_reason(f"checkpoint {c.checkpoint}", c.device) for c in result.checkpoints]
    if barrier:  # other writers on this shared disk can only add: such a checkpoint is other I/O, never a cache's
        assert all(c.device_bytes >= c.suite_bytes for c in counts)
        assert all(reason is None or OTHER_IO in reason for reason in reasons), reasons
    else:
        short = [c for c in result.checkpoints if c.device.device_bytes < MIN_DEVICE_SHARE * c.device.suite_bytes]
        assert short, [c.device_bytes for c in counts]
        assert result.invalid_reason() in reasons and result.invalid_reason() is not None
        shown = cache_served_reason(f"checkpoint {short[0].checkpoint}", short[0].device)
        assert "bytes of the 200,000,000 bytes the suite wrote and fsynced" in shown


@needs_losetup
@pytest.mark.parametrize("evict_below", [False, True])
def test_a_sweep_cell_from_the_cached_backing_file_is_invalid_and_from_the_disk_is_not(loop_ext4, evict_below):
    """One O_DIRECT cell (4 jobs x 16 MiB of 1 MiB reads) on a loop ext4: O_DIRECT skips the files' page cache, not the
    backing file's."""
    mount = loop_ext4("256M")
    (mount / "run").mkdir()
    devices = devices_under(mount)
    devices = devices if evict_below else replace(devices, backing_files=())
    config = SweepConfig(block_sizes_bytes=(2**20,), threads=(4,), jobs=4, batch=4, file_bytes=16 * 2**20)
    host = HostGpu(driver_problem="no CUDA driver library (test)")
    run = SweepRun(config, mount / "run" / "sweep", seed=1, host=host, devices=devices)
    try:
        record = run.measure(Cell("cpu-only", 2**20, 4, 4, 4, requests_per_job=16)).record
    finally:
        run.close()
    device = record["device"]
    assert device["suite_bytes"] == 64 * 2**20 and record["settings"]["direct_io"] is True
    if evict_below:
        assert device["device_bytes"] >= device["suite_bytes"]
        assert record["invalid_reason"] is None or OTHER_IO in record["invalid_reason"]  # other work on this disk
    else:
        assert device["device_bytes"] < MIN_DEVICE_SHARE * device["suite_bytes"]
        assert record["invalid_reason"].startswith("sweep cell cpu-only-1M-4: the devices under the target")


@needs_losetup
def test_a_restore_through_a_loop_device_whose_backing_file_is_gone_is_invalid_never_qualified(loop_ext4, tmp_path):
    """The image is deleted while mounted: the suite cannot evict the layer below, whose cache then serves the reads."""
    target = loop_ext4("600M")
    (tmp_path / "ext4-0.img").unlink()
    drive = lenient_drive(tmp_path / "lenient.toml", "lenient drive", RESTORE_RELATIVE_TO_RAW_READ)
    out = tmp_path / "results.json"
    args = (*SMALL_PAIR, "--drive", str(drive), "--target", str(target), "--results", str(out))
    args += ("--restore-checkpoints", "1")
    result = run_suite(*args, tests=("test_fill.py", "test_restore.py"))
    data = json.loads(out.read_text())
    assert result.returncode == 1, result.stdout[-3000:]
    assert data["verdict"]["overall"] == "INVALID"
    (restore,) = data["restore"]
    device = restore["device"]
    assert device["device_bytes"] < MIN_DEVICE_SHARE * device["suite_bytes"]
    assert "could not be evicted: No such file or directory" in device["layer_below"][0]
    assert f"read {device['device_bytes']:,} bytes of the {device['suite_bytes']:,} bytes" in restore["invalid"]
    assert all(c["device"]["device_bytes"] >= c["device"]["suite_bytes"] for c in data["checkpoints"])
    assert data["baseline"]["invalid"]["raw_read"].startswith("raw read 1: the devices under the target")
    relative = next(m for m in data["measurements"] if m["measurement"] == "restore_throughput")
    assert relative["outcome"] == "INVALID" and "not judged: raw read 1: the devices under" in relative["message"]
    assert any(reason.startswith("restore INVALID: restore of checkpoint") for reason in data["verdict"]["reasons"])
    summary = result.stdout[result.stdout.index("ckptqual summary") :]
    disks = ", ".join(devices_under(tmp_path).names)
    assert f"device bytes ({disks}; GB the devices moved of GB the suite moved): raw write " in summary
    assert "layer below the files, before each cold read: loop" in summary and "could not be evicted" in summary
