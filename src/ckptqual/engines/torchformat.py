"""The `torch.save` zip format, written record by record so a tensor never has to sit in memory whole.

The archive holds what torch 2.x writes: `data.pkl` (a protocol-2 pickle of a dict of tensors whose
storages are persistent ids), `byteorder`, `data/<key>` records aligned to 64 bytes, `version`,
`.format_version`, `.storage_alignment` and `.data/serialization_id`; `torch.load` reads it as its own.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import torch

from ckptqual.plan import TensorSpec

ARCHIVE = "archive"
ALIGNMENT = 64
_ZIP64_EXTRA_BYTES = 20  # zipfile adds this to a local header written with force_zip64
_PAD_EXTRA_ID = 0x4246  # "FB", the padding field torch's writer uses


class _StorageRef:
    """Stands for a tensor's storage in the pickle; becomes a persistent id."""

    def __init__(self, key: str, spec: TensorSpec) -> None:
        self.key = key
        self.spec = spec


class _TensorRef:
    """Pickles exactly as torch pickles a contiguous 1-D CPU tensor."""

    def __init__(self, storage: _StorageRef) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: int) -> tuple:
        spec = self.storage.spec
        args = (self.storage, 0, (spec.numel,), (1,), False, OrderedDict())
        if _typed_storage_name(spec.dtype) is None:
            return torch._utils._rebuild_tensor_v3, (*args, getattr(torch, spec.dtype))
        return torch._utils._rebuild_tensor_v2, args


def _typed_storage_name(dtype: str) -> str | None:
    return torch.storage._dtype_to_storage_type_map().get(getattr(torch, dtype))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> tuple | None:
        if not isinstance(obj, _StorageRef):
            return None
        name = _typed_storage_name(obj.spec.dtype)
        if name is None:
            return ("storage", torch.UntypedStorage, obj.key, "cpu", obj.spec.nbytes)
        return ("storage", getattr(torch, name), obj.key, "cpu", obj.spec.numel)


def state_pickle(tensors: tuple[TensorSpec, ...]) -> bytes:
    """The `data.pkl` record for a dict of tensors named as in `tensors`, storage keys "0", "1", ..."""
    state = {spec.name: _TensorRef(_StorageRef(str(i), spec)) for i, spec in enumerate(tensors)}
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(state)
    return buffer.getvalue()


class TorchZipWriter:
    """Writes one torch-loadable archive to an open binary file, one tensor record at a time."""

    def __init__(self, file: IO[bytes], tensors: tuple[TensorSpec, ...], serialization_id: str) -> None:
        self._zip = zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._tensors = tensors
        self._serialization_id = serialization_id
        self._write_small("data.pkl", state_pickle(tensors))
        self._write_small(".format_version", b"1")
        self._write_small(".storage_alignment", str(ALIGNMENT).encode())
        self._write_small("byteorder", b"little")

    def _write_small(self, name: str, data: bytes) -> None:
        self._zip.writestr(zipfile.ZipInfo(f"{ARCHIVE}/{name}"), data)

    @contextmanager
    def record(self, index: int) -> Iterator[IO[bytes]]:
        """A writable stream for tensor `index`'s bytes, whose data starts 64-byte aligned in the file."""
        info = zipfile.ZipInfo(f"{ARCHIVE}/data/{index}")
        info.file_size = self._tensors[index].nbytes
        header_end = self._zip.fp.tell() + 30 + len(info.filename.encode()) + 4 + _ZIP64_EXTRA_BYTES
        pad = -header_end % ALIGNMENT
        info.extra = struct.pack("<HH", _PAD_EXTRA_ID, pad) + b"Z" * pad
        with self._zip.open(info, "w", force_zip64=True) as stream:
            yield stream

    def close(self) -> None:
        """Writes the trailing records and the central directory."""
        self._write_small("version", b"3\n")
        self._write_small(".data/serialization_id", self._serialization_id.encode())
        self._zip.close()
