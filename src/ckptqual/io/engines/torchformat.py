"""The `torch.save` zip format, written record by record so a tensor never has to sit in memory whole.

The archive holds what torch 2.x writes: `data.pkl` (a protocol-2 pickle of a dict of tensors whose
storages are persistent ids), `.format_version`, `.storage_alignment`, `byteorder`, one `data/<key>` record
per tensor, `version` and `.data/serialization_id`; `torch.load` reads it as its own. Tensor data starts at
a multiple of 4 KiB in the file (torch.save aligns to 64 bytes; the format allows any alignment and names it
in `.storage_alignment`), so a 4 KiB drive sector holds bytes of one payload block only.
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

from ckptqual.plan.model import TensorSpec

ARCHIVE = "archive"
ALIGNMENT = 4096
FORMAT_VERSION = b"1"
FILE_VERSION = b"3\n"
BYTEORDER = b"little"
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


def head_records(tensors: tuple[TensorSpec, ...]) -> dict[str, bytes]:
    """The small records written before the tensor data, in file order, by name under `archive/`."""
    return {
        "data.pkl": state_pickle(tensors),
        ".format_version": FORMAT_VERSION,
        ".storage_alignment": str(ALIGNMENT).encode(),
        "byteorder": BYTEORDER,
    }


def tail_records(serialization_id: str) -> dict[str, bytes]:
    """The small records written after the tensor data, in file order, by name under `archive/`."""
    return {"version": FILE_VERSION, ".data/serialization_id": serialization_id.encode()}


def data_record(index: int) -> str:
    """The name under `archive/` of tensor `index`'s record (its storage key is its index)."""
    return f"data/{index}"


class TorchZipWriter:
    """Writes one torch-loadable archive to an open binary file, one tensor record at a time."""

    def __init__(self, file: IO[bytes], tensors: tuple[TensorSpec, ...], serialization_id: str) -> None:
        self._zip = zipfile.ZipFile(file, "w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._tensors = tensors
        self._serialization_id = serialization_id
        try:
            for name, data in head_records(tensors).items():
                self._write_small(name, data)
        except BaseException:
            self.abandon()
            raise

    def _write_small(self, name: str, data: bytes) -> None:
        self._zip.writestr(zipfile.ZipInfo(f"{ARCHIVE}/{name}"), data)

    @contextmanager
    def record(self, index: int) -> Iterator[IO[bytes]]:
        """A writable stream for tensor `index`'s bytes, whose data starts at a multiple of ALIGNMENT in the file."""
        info = zipfile.ZipInfo(f"{ARCHIVE}/{data_record(index)}")
        info.file_size = self._tensors[index].nbytes
        header_end = self._zip.fp.tell() + 30 + len(info.filename.encode()) + 4 + _ZIP64_EXTRA_BYTES
        pad = -header_end % ALIGNMENT
        info.extra = struct.pack("<HH", _PAD_EXTRA_ID, pad) + b"Z" * pad
        with self._zip.open(info, "w", force_zip64=True) as stream:
            yield stream
        info.extra = b""  # the padding belongs in the local header only; the central directory stays small, as torch's

    def close(self) -> None:
        """Writes the trailing records and the central directory."""
        for name, data in tail_records(self._serialization_id).items():
            self._write_small(name, data)
        self._zip.close()

    def abandon(self) -> None:
        """Gives up a file whose writing failed: nothing more is written to it, not even later by the garbage
        collector (ZipFile would try to write its central directory, and fail again, noisily)."""
        self._zip.fp = None
