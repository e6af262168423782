"""AES-128-CTR keystream into a buffer, through OpenSSL's libcrypto called with ctypes, which releases the GIL for
the call, so that a rank's lanes make keystream on several cores at once; `cryptography` (the same OpenSSL, but
holding the GIL) where libcrypto cannot be loaded. Both give the same bytes."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_ZEROS = np.zeros(1 << 20, dtype=np.uint8)  # CTR keystream is AES-CTR over zeros, fed from here in 1 MiB pieces
_ZEROS.flags.writeable = False
_COUNTERS = 1 << 128


def _load_libcrypto() -> tuple[ctypes.CDLL, int] | tuple[None, None]:
    """libcrypto with the prototypes used here, and its AES-128-CTR cipher fetched once (OpenSSL 3; without the
    fetch every EVP_EncryptInit_ex would look the cipher up again); (None, None) where either is missing."""
    try:
        try:
            lib = ctypes.CDLL("libcrypto.so.3")
        except OSError:  # another soname: ask the linker cache
            lib = ctypes.CDLL(ctypes.util.find_library("crypto") or "libcrypto.so")
        lib.EVP_CIPHER_fetch.restype = ctypes.c_void_p
        lib.EVP_CIPHER_fetch.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
        lib.EVP_CIPHER_CTX_new.restype = ctypes.c_void_p
        lib.EVP_EncryptInit_ex.argtypes = (ctypes.c_void_p,) * 5
        lib.EVP_EncryptUpdate.argtypes = (
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_void_p,
            ctypes.c_int,
        )
        lib.EVP_CIPHER_CTX_free.argtypes = (ctypes.c_void_p,)
        lib.EVP_CIPHER_CTX_free.restype = None
        cipher = lib.EVP_CIPHER_fetch(None, b"AES-128-CTR", None)
    except (OSError, AttributeError):
        return None, None
    return (lib, cipher) if cipher else (None, None)


_libcrypto, _CIPHER = _load_libcrypto()


@dataclass(frozen=True)
class EvpCalls:
    """Addresses of libcrypto's EVP calls and AES-128 ciphers, for native code that makes keystream itself."""

    ctx_new: int
    ctx_free: int
    encrypt_init: int
    encrypt_update: int
    ctr: int
    ecb: int


@functools.cache
def evp_calls() -> EvpCalls | None:
    """libcrypto's EVP calls and ciphers as addresses; None where libcrypto (or its AES-128-ECB) is not there."""
    if _libcrypto is None or _CIPHER is None:
        return None
    ecb = _libcrypto.EVP_CIPHER_fetch(None, b"AES-128-ECB", None)
    if not ecb:
        return None
    lib = _libcrypto
    calls = lib.EVP_CIPHER_CTX_new, lib.EVP_CIPHER_CTX_free, lib.EVP_EncryptInit_ex, lib.EVP_EncryptUpdate
    ctx_new, ctx_free, encrypt_init, encrypt_update = (_address(call) for call in calls)
    return EvpCalls(ctx_new, ctx_free, encrypt_init, encrypt_update, ctr=_CIPHER, ecb=ecb)


def _address(function: Any) -> int:
    """A libcrypto function's address."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    if address is None:
        raise RuntimeError(f"libcrypto: {function.__name__} has a NULL address")
    return address


IMPLEMENTATION = "libcrypto (ctypes)" if _libcrypto is not None else "cryptography"
RELEASES_GIL = _libcrypto is not None
_contexts = threading.local()  # each thread's EVP context, reinitialised per call


def fill(key: bytes, counter: int, out: np.ndarray) -> None:
    """AES-128-CTR keystream under `key` from the 128-bit big-endian `counter` into `out` (contiguous uint8)."""
    iv = (counter % _COUNTERS).to_bytes(16, "big")
    if _libcrypto is None:
        encryptor = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
        for start in range(0, out.nbytes, _ZEROS.nbytes):
            piece = out[start : start + _ZEROS.nbytes]
            encryptor.update_into(_ZEROS[: piece.nbytes].data, piece.data)
        return
    context = getattr(_contexts, "ctx", None)
    if context is None:
        context = _contexts.ctx = _Context()
    if _libcrypto.EVP_EncryptInit_ex(context.handle, _CIPHER, None, key, iv) != 1:
        raise RuntimeError("libcrypto: EVP_EncryptInit_ex failed for AES-128-CTR")
    written = ctypes.c_int()
    base, zeros = out.ctypes.data, _ZEROS.ctypes.data
    for start in range(0, out.nbytes, _ZEROS.nbytes):
        length = min(_ZEROS.nbytes, out.nbytes - start)
        if _libcrypto.EVP_EncryptUpdate(context.handle, base + start, ctypes.byref(written), zeros, length) != 1:
            raise RuntimeError("libcrypto: EVP_EncryptUpdate failed")


class _Context:
    """One thread's EVP_CIPHER_CTX, freed with the thread."""

    def __init__(self) -> None:
        if _libcrypto is None:
            raise RuntimeError("libcrypto is not loaded: the keystream is made with cryptography, without contexts")
        self.handle = _libcrypto.EVP_CIPHER_CTX_new()
        if not self.handle:
            raise MemoryError("libcrypto: EVP_CIPHER_CTX_new returned NULL")

    def __del__(self) -> None:
        if _libcrypto is not None and self.handle:
            _libcrypto.EVP_CIPHER_CTX_free(self.handle)
