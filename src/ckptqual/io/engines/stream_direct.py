"""`stream-direct` engine: the `stream` engine's files, written with O_DIRECT from its aligned, reused window
(every write aligned in offset, length and memory), past the page cache, as a direct-I/O or GDS checkpoint
writer writes; read back like `stream` files."""

from __future__ import annotations

from ckptqual.io.engines.stream import StreamEngine


class StreamDirectEngine(StreamEngine):
    """Needs a filesystem that takes O_DIRECT (ext4, xfs; not tmpfs before Linux 6.6)."""

    name = "stream-direct"
    direct = True
