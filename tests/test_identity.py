"""Drive identity: the target's block stack followed through partitions, md RAID, LVM and native NVMe multipath
down to every physical device, on sysfs trees captured from real systems (tests/data/identity/PROVENANCE.md)."""

import json
from pathlib import Path

import pytest

from ckptqual.host.identity import block_dir, identify, mount_of, physical_devices

TREES = Path(__file__).parent / "data" / "identity"
PCIE_GEN4_X4 = {
    "current_link_speed": "16.0 GT/s PCIe",
    "current_link_width": "4",
    "max_link_speed": "16.0 GT/s PCIe",
    "max_link_width": "4",
}


def devices_of(tree: str, dev: str):
    root = TREES / tree / "sys"
    block = block_dir(dev, root)
    assert block is not None, f"{tree} has no block device {dev}"
    return block.name, physical_devices(block, root)


def test_a_plain_nvme_namespace_has_its_controller_identity_and_pcie_link():
    name, (device,) = devices_of("nvme", "259:3")
    assert name == "nvme0n1"
    assert (device.name, device.kind, device.via) == ("nvme0n1", "nvme", ())
    assert (device.model, device.serial, device.firmware) == ("3.2TB NVMe Gen4 U.2 SSD V", "S7DFNG0W700063", "DNA8DNA8")
    assert device.capacity_bytes == 978143920 * 512  # sysfs `size` counts 512-byte sectors
    assert (device.logical_block_bytes, device.physical_block_bytes) == (4096, 4096)
    assert (device.rotational, device.scheduler) == (False, "none")
    assert (device.nvme_controller, device.nvme_namespace) == ("nvme0", 1)
    assert device.pcie_link == PCIE_GEN4_X4


def test_a_partition_is_followed_to_its_disk():
    name, (device,) = devices_of("nvme-partition", "259:4")
    assert name == "nvme0n1p1"
    assert (device.name, device.serial) == ("nvme0n1", "S7DFNG0W700063")
    assert device.via == ("nvme0n1p1 (partition 1)",)


def test_an_md_raid0_lists_both_members_including_a_multipath_namespace():
    name, devices = devices_of("md-raid0", "9:0")
    assert name == "md0"
    assert [d.name for d in devices] == ["nvme0n1", "nvme1n1"]
    assert all(d.via == ("md0 (md raid0)",) for d in devices)
    head = devices[1]  # the multipath head's device is the subsystem; its first controller is read
    assert (head.nvme_controller, head.model, head.firmware) == ("nvme1", "3.2TB NVMe Gen4 U.2 SSD III", "REV.SN66")
    assert (head.logical_block_bytes, head.capacity_bytes) == (512, 11233968 * 512)
    assert head.scheduler == "unknown"  # the capture has no queue/scheduler for the head: not guessed


def test_an_lvm_volume_on_md_names_every_layer():
    name, devices = devices_of("md-raid0", "253:0")
    assert name == "dm-0"
    assert [d.via for d in devices] == [("dm-0 (lvm vg0-ckpt)", "md0 (md raid0)")] * 2


def test_a_virtio_disk_has_a_serial_and_no_model_firmware_or_pcie_link():
    name, (device,) = devices_of("virtio", "254:0")
    assert (name, device.kind, device.serial) == ("vda", "virtio", "20166457225444391")
    assert (device.model, device.firmware, device.pcie_link, device.nvme_controller) == ("unknown",) * 2 + (None,) * 2
    assert (device.logical_block_bytes, device.physical_block_bytes, device.rotational) == (512, 4096, True)
    assert device.scheduler == "mq-deadline"


def test_an_unknown_device_number_has_no_directory():
    assert block_dir("8:0", TREES / "nvme" / "sys") is None


def test_a_filesystem_without_a_block_device_says_so():
    identity = identify(Path("/proc"))
    assert identity.filesystem == "proc" and identity.physical == ()
    assert identity.physical_reason == "proc at /proc has no block device"


def test_a_device_number_outside_sysfs_falls_back_to_the_mount_source(tmp_path):
    """btrfs and overlay report an anonymous device number: the mount's source names the device instead."""
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text("22 1 259:4 / / rw,relatime shared:1 - xfs /dev/nvme0n1p1 rw,attr2\n")
    identity = identify(Path("/proc"), sys_root=TREES / "nvme-partition" / "sys", proc_root=tmp_path)
    assert (identity.device, identity.filesystem, identity.mount_point) == ("nvme0n1p1", "xfs", "/")
    assert [d.name for d in identity.physical] == ["nvme0n1"]
    assert identity.discard is True  # from the disk's queue: a partition has none


def test_the_summary_fields_name_each_distinct_model_and_the_record_is_json(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text("22 1 9:0 / / rw shared:1 - ext4 /dev/md0 rw\n")
    identity = identify(Path("/proc"), sys_root=TREES / "md-raid0" / "sys", proc_root=tmp_path)
    assert identity.model == "3.2TB NVMe Gen4 U.2 SSD V, 3.2TB NVMe Gen4 U.2 SSD III"
    data = json.loads(json.dumps(identity.to_dict()))
    assert [d["name"] for d in data["physical"]] == ["nvme0n1", "nvme1n1"]
    assert data["physical"][0]["pcie_link"] == PCIE_GEN4_X4 and data["physical"][0]["via"] == ["md0 (md raid0)"]


def test_this_machine_names_the_physical_devices_under_a_real_directory(tmp_path):
    identity = identify(tmp_path)
    if not identity.physical:
        pytest.skip(f"the temp dir has no block device here: {identity.physical_reason}")
    assert identity.device != "unknown" and identity.filesystem != "unknown"
    assert all(d.capacity_bytes and d.logical_block_bytes for d in identity.physical)


def test_mount_of_gives_the_innermost_mount_and_its_source(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text(
        "1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n25 1 259:1 / /mnt/nvme\\040drive rw - xfs /dev/nvme0n1 rw\n"
    )
    mount = mount_of(Path("/mnt/nvme drive/x"), proc_root=tmp_path)
    assert mount == {
        "mount_point": "/mnt/nvme drive",
        "filesystem": "xfs",
        "mount_options": "rw,rw",
        "source": "/dev/nvme0n1",
    }
