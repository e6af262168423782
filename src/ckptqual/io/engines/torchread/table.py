"""data.pkl read without torch: a restricted unpickling (no tensor is built, only the globals a tensor state dict
uses) into the tensors it describes, and their check against the plan."""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import torch

from ckptqual.io.engines.torchformat import ARCHIVE
from ckptqual.io.engines.torchread.findings import FormatError, first_difference
from ckptqual.plan.model import TensorSpec

_STORAGE_DTYPES = {
    name: str(dtype).removeprefix("torch.") for dtype, name in torch.storage._dtype_to_storage_type_map().items()
}


@dataclass(frozen=True)
class _Global:
    name: str


@dataclass(frozen=True)
class PickledTensor:
    """A tensor as data.pkl describes it: its storage's persistent id, then how the tensor views the storage."""

    storage: tuple
    offset: int
    size: tuple
    stride: tuple
    dtype: str | None
    name: str = ""

    @property
    def key(self) -> str:
        return self.storage[2]

    @property
    def untyped(self) -> bool:
        return self.storage[1].name == "UntypedStorage"

    @property
    def storage_dtype(self) -> str | None:
        """The dtype named by `_rebuild_tensor_v3`, else by the typed storage."""
        return self.dtype or _STORAGE_DTYPES.get(self.storage[1].name)


def _rebuild(storage: tuple, offset: int, size: tuple, stride: tuple, *rest: Any) -> PickledTensor:
    dtype = rest[-1].name if rest and isinstance(rest[-1], _Global) else None
    return PickledTensor(storage, offset, tuple(size), tuple(stride), dtype)


class _TableUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild
        if module in ("torch", "torch.storage"):
            return _Global(name)
        raise pickle.UnpicklingError(f"unexpected global {module}.{name}")

    def persistent_load(self, pid: Any) -> tuple:
        return tuple(pid)


def unpickle_table(data: bytes) -> list[PickledTensor]:
    """The tensors data.pkl describes, in its order, each named."""
    what = f"record {ARCHIVE}/data.pkl"
    try:
        state = _TableUnpickler(io.BytesIO(data)).load()
    except Exception as error:  # a damaged pickle fails in many ways; each is this one finding
        raise FormatError(f"{what} does not unpickle: {type(error).__name__}: {error}") from error
    if not isinstance(state, dict):
        raise FormatError(f"{what} holds a {type(state).__name__}, not a dict of tensors")
    table = []
    for name, tensor in state.items():
        if (
            not isinstance(tensor, PickledTensor)
            or len(tensor.storage) != 5
            or not isinstance(tensor.storage[1], _Global)
        ):
            raise FormatError(f"{what}: entry {name!r} is not a tensor with a stored storage")
        if tensor.storage[0] != "storage":
            raise FormatError(
                f"{what}: entry {name!r} has a persistent id of kind {tensor.storage[0]!r}, not 'storage'"
            )
        table.append(replace(tensor, name=str(name)))
    return table


def check_table(table: list[PickledTensor], tensors: tuple[TensorSpec, ...]) -> None:
    """data.pkl must describe exactly the plan's tensors, each alone in its storage, contiguous, from offset 0."""
    what = f"record {ARCHIVE}/data.pkl"
    found, wanted = [t.name for t in table], [t.name for t in tensors]
    if found != wanted:
        first = first_difference(found, wanted)
        shown = repr(found[first]) if first < len(found) else "nothing"
        planned = repr(wanted[first]) if first < len(wanted) else "nothing"
        raise FormatError(f"{what} names {len(found)} tensors, tensor {first} is {shown}; the plan has {planned} there")
    for index, (pickled, spec) in enumerate(zip(table, tensors, strict=True)):
        _, _, key, location, storage_count = pickled.storage
        for field, value, needed in (
            ("dtype", pickled.storage_dtype, spec.dtype),
            ("storage key", key, str(index)),
            ("location", location, "cpu"),
            ("storage size", storage_count, spec.nbytes if pickled.untyped else spec.numel),
            ("storage offset", pickled.offset, 0),
            ("size", pickled.size, (spec.numel,)),
            ("stride", pickled.stride, (1,)),
        ):
            if value != needed:
                raise FormatError(f"{what}: tensor {spec.name!r} has {field} {value!r}, the plan needs {needed!r}")
