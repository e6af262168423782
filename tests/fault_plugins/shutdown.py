"""Test-only pytest plugin: shuts the target's ext4 filesystem down (EXT4_IOC_SHUTDOWN) just before a chosen test's
setup, so that every later I/O on it fails with EIO, as a drive that died does.

Set CKPTQUAL_SHUTDOWN (a directory on that filesystem) and CKPTQUAL_SHUTDOWN_BEFORE (a test name); load with
`-p shutdown`.
"""

import fcntl
import os
import struct

import pytest

_EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
_NOLOGFLUSH = 2  # EXT4_GOING_FLAGS_NOLOGFLUSH: stop at once, without flushing the journal


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.name != os.environ["CKPTQUAL_SHUTDOWN_BEFORE"]:
        return
    fd = os.open(os.environ["CKPTQUAL_SHUTDOWN"], os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, _EXT4_IOC_SHUTDOWN, struct.pack("I", _NOLOGFLUSH))
    finally:
        os.close(fd)
