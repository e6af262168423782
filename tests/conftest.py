"""Shared fixtures of the project's tests."""

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[[str], Path]]:
    """Mounts a tmpfs with the given options (e.g. "size=64m", "ro,size=1m") inside the test's temporary
    directory: a real small or read-only filesystem. Skips where mounting needs a root this machine lacks."""
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        point = tmp_path / f"tmpfs-{len(mounted)}"
        point.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)]).returncode:
            pytest.skip(f"cannot mount a tmpfs ({options}) here (needs root)")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)
