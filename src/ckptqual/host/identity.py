"""What the system says of the drive and the filesystem behind a path: mountinfo for the mount, sysfs for the block
devices, followed through partitions, device-mapper (LVM, dm-crypt), md RAID and loop down to every physical device.

Every reader takes its sysfs and proc roots as parameters, so that tests can point them at captured trees.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SYS = Path("/sys")
PROC = Path("/proc")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class PhysicalDevice:
    """One device at the bottom of the target's block stack, as sysfs describes it ("unknown" or None where it
    does not say). `via` is the stack above it, from the target's own device down, e.g. ["md0 (raid0)"]."""

    name: str
    kind: str  # nvme, virtio, ata, scsi, virtual or other
    model: str = UNKNOWN
    serial: str = UNKNOWN
    firmware: str = UNKNOWN
    capacity_bytes: int | None = None
    logical_block_bytes: int | None = None
    physical_block_bytes: int | None = None
    rotational: bool | None = None
    scheduler: str = UNKNOWN
    nvme_controller: str | None = None
    nvme_namespace: int | None = None
    pcie_link: dict[str, Any] | None = None
    via: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "via": list(self.via)}


@dataclass(frozen=True)
class DriveIdentity:
    """The device and filesystem behind a path ("unknown" where the system does not say); model, serial and
    firmware sum up the physical devices, which `physical` lists one by one."""

    device: str = UNKNOWN
    model: str = UNKNOWN
    serial: str = UNKNOWN
    firmware: str = UNKNOWN
    filesystem: str = UNKNOWN
    mount_point: str = UNKNOWN
    mount_options: str = UNKNOWN
    discard: bool | None = None
    physical: tuple[PhysicalDevice, ...] = ()
    physical_reason: str | None = None  # why `physical` is empty

    def to_dict(self) -> dict[str, Any]:
        data = {key: value for key, value in self.__dict__.items() if key != "physical"}
        return {**data, "physical": [device.to_dict() for device in self.physical]}


def identify(path: Path, *, sys_root: Path = SYS, proc_root: Path = PROC) -> DriveIdentity:
    """The mount holding `path` and every physical device under it."""
    mount: dict[str, Any] = mount_of(path, proc_root=proc_root)  # DriveIdentity's text fields by name
    block = block_of(path, mount.get("source"), sys_root)
    mount.pop("source", None)
    if block is None:
        why = f"{mount.get('filesystem', 'this filesystem')} at {mount.get('mount_point', path)} has no block device"
        return DriveIdentity(**mount, physical_reason=why)
    physical = physical_devices(block, sys_root)
    queue = block / "queue" if (block / "queue").is_dir() else block.parent / "queue"  # a partition has none
    discard = _read(queue / "discard_max_bytes") not in ("0", UNKNOWN)
    return DriveIdentity(
        block.name,
        _summary(device.model for device in physical),
        _summary(device.serial for device in physical),
        _summary(device.firmware for device in physical),
        **mount,
        discard=discard,
        physical=tuple(physical),
        physical_reason=None if physical else f"sysfs lists no device under {block.name}",
    )


def block_dir(dev: str, sys_root: Path = SYS) -> Path | None:
    """The sysfs directory of block device `dev` ("major:minor"), or None."""
    link = sys_root / "dev" / "block" / dev
    return link.resolve() if link.exists() else None


def physical_devices(block: Path, sys_root: Path = SYS, via: tuple[str, ...] = ()) -> list[PhysicalDevice]:
    """The physical devices under the block device whose sysfs directory is `block`, each with the stack above."""
    if (block / "partition").exists():
        return physical_devices(
            block.parent, sys_root, (*via, f"{block.name} (partition {_read(block / 'partition')})")
        )
    slaves = sorted((block / "slaves").iterdir()) if (block / "slaves").is_dir() else []
    if slaves:
        layer = (*via, f"{block.name} ({_layer_kind(block)})")
        return [device for slave in slaves for device in physical_devices(slave.resolve(), sys_root, layer)]
    return [_physical(block, via)]


def _layer_kind(block: Path) -> str:
    """What a block device with members is: "raid0" (md), "lvm vg/lv", "dm-crypt name", "device-mapper name"."""
    if (block / "md").is_dir():
        return f"md {_read(block / 'md' / 'level')}"
    name, uuid = _read(block / "dm" / "name"), _read(block / "dm" / "uuid")
    prefix = {"LVM": "lvm", "CRYPT": "dm-crypt", "mpath": "multipath"}.get(uuid.split("-", 1)[0], "device-mapper")
    return f"{prefix} {name}"


def _physical(block: Path, via: tuple[str, ...]) -> PhysicalDevice:
    queue = block / "queue"
    size = _number(block / "size")
    common: dict[str, Any] = {
        "name": block.name,
        "capacity_bytes": size * 512 if size is not None else None,  # sysfs counts 512-byte sectors, always
        "logical_block_bytes": _number(queue / "logical_block_size"),
        "physical_block_bytes": _number(queue / "physical_block_size"),
        "rotational": {"0": False, "1": True}.get(_read(queue / "rotational")),
        "scheduler": _scheduler(_read(queue / "scheduler")),
        "via": via,
    }
    device = (block / "device").resolve() if (block / "device").exists() else None
    if block.name.startswith("nvme") and device is not None:
        return _nvme(block, device, common)
    if device is not None and device.name.startswith("virtio"):
        return PhysicalDevice(kind="virtio", serial=_read(block / "serial"), **common)
    if device is not None and (device / "scsi_level").exists():
        vendor = _read(device / "vendor")
        model = _read(device / "model")
        return PhysicalDevice(
            kind="ata" if vendor == "ATA" else "scsi",
            model=model if vendor in ("ATA", UNKNOWN) else f"{vendor} {model}",
            serial=_vpd_serial(device / "vpd_pg80"),
            firmware=_read(device / "rev"),
            **common,
        )
    return PhysicalDevice(kind="virtual" if "virtual" in block.parts else "other", **common)  # loop, zram


def _nvme(block: Path, device: Path, common: dict[str, Any]) -> PhysicalDevice:
    """An NVMe namespace: its controller's model, serial and firmware, and the controller's PCIe link. Under native
    multipath the namespace's device is the subsystem; its first controller is then the one read."""
    controllers = sorted(p for p in device.iterdir() if re.fullmatch(r"nvme\d+", p.name)) if device.is_dir() else []
    controller = device if (device / "transport").exists() or not controllers else controllers[0].resolve()
    pci = (controller / "device").resolve() if (controller / "device").exists() else None
    return PhysicalDevice(
        kind="nvme",
        model=_read(controller / "model"),
        serial=_read(controller / "serial"),
        firmware=_read(controller / "firmware_rev"),
        nvme_controller=controller.name,
        nvme_namespace=_number(block / "nsid"),
        pcie_link=_pcie_link(pci, _read(controller / "transport")),
        **common,
    )


def _pcie_link(pci: Path | None, transport: str) -> dict[str, Any]:
    """Current and maximum link speed and width of the PCI function, or why there are none."""
    if transport not in ("pcie", UNKNOWN):
        return {"unavailable": f"the controller's transport is {transport}, not PCIe"}
    names = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
    link = {name: _read(pci / name) for name in names} if pci is not None else {}
    if not link or all(value == UNKNOWN for value in link.values()):
        return {"unavailable": "sysfs shows no PCIe link attributes for the controller's PCI function"}
    return link


def _scheduler(text: str) -> str:
    """The active scheduler of a queue/scheduler line such as "none [mq-deadline] kyber"."""
    match = re.search(r"\[([^\]]+)\]", text)
    return match.group(1) if match else text


def _vpd_serial(path: Path) -> str:
    """The unit serial number of a SCSI VPD page 0x80 (4 header bytes, then ASCII)."""
    try:
        return path.read_bytes()[4:].decode("ascii", "replace").strip() or UNKNOWN
    except OSError:
        return UNKNOWN


def _summary(values: Any) -> str:
    """One value for several devices: the value when they agree, else each distinct one."""
    distinct = list(dict.fromkeys(values))
    return ", ".join(distinct) if distinct else UNKNOWN


def _read(path: Path) -> str:
    try:
        return path.read_text().strip() or UNKNOWN
    except OSError:
        return UNKNOWN


def _number(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text.isdigit() else None


def block_of(path: Path, source: str | None, sys_root: Path) -> Path | None:
    """The sysfs directory of the block device holding `path`: by its device number, else by the mount's source
    (btrfs and overlay report an anonymous device number)."""
    dev = os.stat(path).st_dev
    found = block_dir(f"{os.major(dev)}:{os.minor(dev)}", sys_root)
    if found is None and source and source.startswith("/dev/"):
        link = sys_root / "class" / "block" / Path(os.path.realpath(source)).name
        found = link.resolve() if link.exists() else None
    return found


def mount_of(path: Path, proc_root: Path = PROC) -> dict[str, str]:
    """The innermost mount holding `path`: mount_point, filesystem, mount_options, source ({} when unreadable)."""
    best: dict[str, str] = {}
    real = str(path.resolve())
    try:
        lines = (proc_root / "self" / "mountinfo").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount_point", "")):
            options = ",".join(part for part in (fields[5], tail[2] if len(tail) > 2 else "") if part)
            source = tail[1] if len(tail) > 1 else ""
            best = {"mount_point": point, "filesystem": tail[0], "mount_options": options, "source": source}
    return best
