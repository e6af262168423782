"""Which hardware several drives share: the PCIe switch port or HBA above them, from sysfs paths alone (e.g.
/sys/devices/pci0000:00/0000:00:1c.0/0000:02:00.0/nvme/nvme1/nvme1n1: nvme1n1 sits below 0000:00:1c.0), and the
disk under them, loop devices followed to the disk under their backing files."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ckptqual.host.device_bytes import DEV, Unresolved, devices_under
from ckptqual.host.identity import PROC, SYS

_PCI_FUNCTION = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def pci_chain(device: str, sys_root: Path = SYS) -> tuple[str, ...]:
    """The PCI functions above block device `device`, from the root port down (none for a virtual or unknown device)."""
    link = sys_root / "class" / "block" / device
    if not link.exists():
        return ()
    return tuple(part for part in link.resolve().parts if _PCI_FUNCTION.fullmatch(part))


def shared_parents(devices: Mapping[str, Sequence[str]], sys_root: Path = SYS) -> list[dict[str, object]]:
    """Each PCI function above the devices of two or more drives (`devices`: drive label -> its physical device
    names) with the drives below it and what it is to them: a port or HBA above their devices, or their one device
    itself (two partitions or namespaces); of a chain of such functions above the same drives, only the deepest."""
    below: dict[str, set[str]] = {}
    deeper: dict[str, set[str]] = {}  # function -> the functions below it on some drive's chain
    for label, names in devices.items():
        for name in names:
            chain = pci_chain(name, sys_root)
            for depth, function in enumerate(chain):
                below.setdefault(function, set()).add(label)
                deeper.setdefault(function, set()).update(chain[depth + 1 :])
    shared = {function: labels for function, labels in below.items() if len(labels) > 1}
    what = {True: "a PCIe switch port or HBA above them", False: "their one device"}
    return [
        {"pci": function, "drives": sorted(labels), "is": what[bool(deeper[function])]}
        for function, labels in sorted(shared.items())
        if not any(shared.get(lower) == labels for lower in deeper[function])
    ]


def disks_under(path: Path, *, sys_root: Path = SYS, proc_root: Path = PROC, dev_root: Path = DEV) -> list[str]:
    """The whole disks holding the files under `path`, through partitions, md/dm members and loop devices' backing
    files (host.device_bytes' walk); none where that cannot be told (a tmpfs, a path that is gone)."""
    try:
        names = devices_under(path, sys_root=sys_root, proc_root=proc_root, dev_root=dev_root).names
    except (OSError, Unresolved):
        return []
    return list(dict.fromkeys(_whole_disk(name, sys_root) for name in names))


def _whole_disk(name: str, sys_root: Path) -> str:
    """The disk a partition belongs to, else the device itself."""
    block = sys_root / "class" / "block" / name
    return block.resolve().parent.name if (block / "partition").exists() else name


def shared_disks(disks: Mapping[str, Sequence[str]]) -> list[dict[str, object]]:
    """Each disk under two or more drives (`disks`: drive label -> the disks under it, see disks_under)."""
    above: dict[str, set[str]] = {}
    for label, names in disks.items():
        for name in names:
            above.setdefault(name, set()).add(label)
    return [{"disk": disk, "drives": sorted(labels)} for disk, labels in sorted(above.items()) if len(labels) > 1]
