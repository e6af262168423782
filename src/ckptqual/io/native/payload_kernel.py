"""The payload kernel (payload.c) bound to libcrypto: the payload's keystream and block headers made, and checked, in
native code, with the GIL released, byte for byte what ckptqual.io.payload makes in Python."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from ckptqual.io import keystream
from ckptqual.io.native import library


class _Crypto(ctypes.Structure):
    """struct ckq_crypto of payload.c: libcrypto's EVP calls and AES-128 ciphers, by address."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("ctx_new", "ctx_free", "init", "update", "ctr", "ecb")]


class BlockId(ctypes.Structure):
    """struct ckq_block_id of payload.c: whose blocks a fill or check is about, as their headers pack it."""

    _fields_ = [
        ("key", ctypes.c_uint8 * 16),
        ("header_key", ctypes.c_uint8 * 16),
        ("stream", ctypes.c_uint64),
        ("tensor_file", ctypes.c_uint64),
        ("rank_checkpoint", ctypes.c_uint64),
        ("seed_magic", ctypes.c_uint64),
    ]


class Kernel:
    """payload.c's calls, with libcrypto's EVP calls handed over once."""

    def __init__(self, lib: ctypes.CDLL, calls: keystream.EvpCalls) -> None:
        self._crypto = _Crypto(
            calls.ctx_new, calls.ctx_free, calls.encrypt_init, calls.encrypt_update, calls.ctr, calls.ecb
        )
        self._crypto_at = ctypes.addressof(self._crypto)  # passed by address: no conversion per call
        pointers = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t)
        self._fill, self._verify, self._keystream = lib.ckq_fill, lib.ckq_verify, lib.ckq_keystream
        self._fill.argtypes = self._verify.argtypes = pointers
        self._fill.restype = ctypes.c_int
        self._verify.restype = ctypes.c_int64
        self._keystream.argtypes = (
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_void_p,
            ctypes.c_size_t,
        )
        self._keystream.restype = ctypes.c_int

    def fill(self, block_id: BlockId, first_block: int, out: np.ndarray) -> None:
        """The payload of blocks from `first_block` into `out` (contiguous uint8; may end mid-block)."""
        if self._fill(self._crypto_at, ctypes.addressof(block_id), first_block, address(out), out.nbytes):
            raise RuntimeError("libcrypto failed to make the payload (ckq_fill)")

    def keystream(self, key: bytes, stream: int, first_counter: int, out: np.ndarray) -> None:
        """AES-128-CTR keystream under `key` from the counter stream << 64 | first_counter into `out`."""
        if self._keystream(self._crypto_at, key, stream, first_counter, address(out), out.nbytes):
            raise RuntimeError("libcrypto failed to make keystream (ckq_keystream)")

    def differs_at(self, block_id: BlockId, first_block: int, data: np.ndarray) -> int | None:
        """Where `data` (contiguous) first differs from the payload of blocks from `first_block`, to the start of a
        64 KiB piece; None where every byte is the payload."""
        found = self._verify(self._crypto_at, ctypes.addressof(block_id), first_block, address(data), data.nbytes)
        if found == -2:
            raise RuntimeError("libcrypto failed to make the payload (ckq_verify)")
        return None if found == -1 else found


def address(array: np.ndarray) -> int:
    """Where a contiguous, non-empty array's bytes start: through ctypes for a writable one (a fifth of the cost of
    numpy's `.ctypes`, which a call per small tensor feels), else through numpy."""
    if array.flags.writeable:
        # numpy's stubs give ndarray the buffer protocol only for Python 3.12+; `array.data` would cost a memoryview
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]
    return array.ctypes.data


@functools.cache
def kernel() -> tuple[Kernel | None, str | None]:
    """The kernel, once per process: (kernel, None), or (None, why ckptqual makes the payload in Python instead)."""
    lib, problem = library.load()
    if lib is None:
        return None, problem
    calls = keystream.evp_calls()
    if calls is None:
        return None, "libcrypto (OpenSSL 3) cannot be loaded for the native payload kernel"
    return Kernel(lib, calls), None
