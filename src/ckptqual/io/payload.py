"""Checkpoint payload: incompressible, unique per 4 KiB block, self-describing, cheap to make and verify.

Every 4 KiB block is AES-128-CTR keystream that depends on the block's identity (run seed, checkpoint, rank,
file, tensor, block index), so no compression, deduplication, XOR or delta between blocks finds structure.
Its first 32 bytes are a header naming that identity, encrypted under a fixed public key (part of the
format), so any block, even one from another run, can be read back and named while it still looks random.
The alignment padding before a tensor's data is keystream of its own stream (`fill_padding`), so that no byte a
writer chooses repeats.

Made and checked in native code (io/native/payload.c) where ckptqual's native library is built, else by the Python
here; both give the same bytes, and tests/test_payload.py holds each to the other.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import struct
import threading
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

from ckptqual.io import keystream, lanes
from ckptqual.io.native import payload_kernel

BLOCK_BYTES = 4096
HEADER_BYTES = 32
MAGIC = 0x32514B43  # b"CKQ2" little-endian
MAX_FIELD = 2**32 - 1  # seed, checkpoint, rank, file and tensor are 32-bit header fields
# The header key is public and fixed: it hides the header's structure from data-reducing storage, not its content.
HEADER_KEY = bytes.fromhex("6a1f0c9e3b5d47a2c8e1f40b92d7365e")
MIN_ZERO_RUN_BYTES = 16  # a shorter run of zeros is a corrupted value, not a zeroed sector or page

_AES_BYTES = 16
_COUNTERS_PER_BLOCK = BLOCK_BYTES // _AES_BYTES
# Up to this many bytes, the keystream is AES-ECB over the counter blocks under one reused context (the same bytes
# as CTR mode): a CTR context per call costs more than the AES of a small piece.
COUNTER_BLOCKS_MAX_BYTES = 64 << 10
_XOR_AS_INTEGER_MAX_BYTES = 512
# A verified read makes and compares the expected bytes this much at a time, so that they are compared while in
# cache; no larger than a lane's smallest piece, so that making one step never spreads over the lanes again.
VERIFY_STEP_BYTES = lanes.MIN_PIECE_BYTES
_header_contexts = threading.local()  # cipher contexts are not shared between threads
_memcmp = ctypes.CDLL(None).memcmp
_memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_memcmp.restype = ctypes.c_int


@dataclass(frozen=True)
class BlockId:
    """Where a block belongs: the identity its header carries."""

    seed: int
    checkpoint: int
    rank: int
    file: int
    tensor: int
    offset: int

    def describe(self) -> str:
        return (
            f"checkpoint {self.checkpoint}, rank {self.rank}, file {self.file}, tensor {self.tensor}, "
            f"offset {self.offset}"
        )


def _header_cipher() -> tuple[CipherContext, CipherContext]:
    """This thread's AES-ECB encryptor and decryptor under the public header key."""
    if not hasattr(_header_contexts, "pair"):
        cipher = Cipher(algorithms.AES(HEADER_KEY), modes.ECB())
        _header_contexts.pair = (cipher.encryptor(), cipher.decryptor())
    return _header_contexts.pair


def _xor(a: bytes, b: bytes) -> bytes:
    """Bytewise XOR of two equally long byte strings of whole AES blocks: one big-integer operation for a few
    headers, numpy for many (the integer's conversions grow quadratically)."""
    if len(a) <= _XOR_AS_INTEGER_MAX_BYTES:
        return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")
    return (np.frombuffer(a, np.uint64) ^ np.frombuffer(b, np.uint64)).tobytes()


def _seal_headers(first: bytes, second: bytes) -> tuple[bytes, bytes]:
    """Encrypts n plaintext headers, given as their first and second 16-byte halves (each n x 16 bytes): CBC
    forward then backward, so every byte depends on every field. Returns the sealed halves."""
    encrypt, _ = _header_cipher()
    c1 = encrypt.update(first)
    c2 = encrypt.update(_xor(second, c1))
    d2 = encrypt.update(c2)
    return encrypt.update(_xor(c1, d2)), d2


def _open_header(sealed: bytes) -> bytes:
    """Inverse of _seal_headers for one 32-byte header."""
    _, decrypt = _header_cipher()
    d1, d2 = sealed[:_AES_BYTES], sealed[_AES_BYTES:HEADER_BYTES]
    c2 = decrypt.update(d2)
    c1 = _xor(decrypt.update(d1), d2)
    return decrypt.update(c1) + _xor(decrypt.update(c2), c1)


def _plain_headers(block_id: BlockId, first_block: int, count: int) -> tuple[bytes, bytes]:
    """Plaintext headers of `count` blocks from `first_block`, as their two halves: the varying fields (offset,
    tensor, file) first, then rank, checkpoint, seed and the magic number."""
    first = np.empty((count, 2), dtype="<u8")
    first[:, 0] = np.arange(first_block, first_block + count, dtype=np.uint64) * np.uint64(BLOCK_BYTES)
    first[:, 1] = int(block_id.tensor) | int(block_id.file) << 32
    second = struct.pack("<2Q", block_id.rank | block_id.checkpoint << 32, block_id.seed | MAGIC << 32)
    return first.tobytes(), second * count


def _check_field(name: str, value: int) -> None:
    if not 0 <= value <= MAX_FIELD:
        raise ValueError(f"payload {name} {value}: must be an integer with 0 <= {name} < 2**32")


class PayloadGenerator:
    """Makes and checks the payload of one run (one seed): in native code (`payload_kernel`) where its library is
    built, else in Python; both make the same bytes. `native=False` keeps to Python."""

    def __init__(self, seed: int, native: bool = True) -> None:
        _check_field("seed", seed)
        self.seed = seed
        self._key = hashlib.blake2b(struct.pack("<I", seed), digest_size=16, person=b"ckptqual-key").digest()
        self._algorithm = algorithms.AES(self._key)
        self._contexts = threading.local()  # this thread's reused ECB context for the counter blocks
        self._kernel, problem = payload_kernel.kernel() if native else (None, "Python asked for")
        # per tensor, asked for at every chunk: made once (a BLAKE2b and a ctypes structure each)
        self._native_ids = functools.lru_cache(maxsize=1024)(self._native_id)
        self._padding_streams = functools.lru_cache(maxsize=1024)(self._padding_stream)
        self.implementation = "native (payload.c)" if self._kernel else f"Python ({problem})"

    def fill(self, out: np.ndarray, checkpoint: int, rank: int, file: int, tensor: int, offset: int) -> None:
        """Write the payload of tensor bytes [offset, offset + len(out)) into `out` (contiguous uint8).

        `offset` must be a multiple of BLOCK_BYTES; `out` may end mid-block (a tensor's last block).
        """
        if offset % BLOCK_BYTES or offset < 0:
            raise ValueError(f"payload offset {offset}: must be a multiple of {BLOCK_BYTES} and >= 0")
        for name, value in (("checkpoint", checkpoint), ("rank", rank), ("file", file), ("tensor", tensor)):
            _check_field(name, value)
        if not out.nbytes:
            return
        if self._kernel is not None:
            self._fill_native(out, self._native_ids(checkpoint, rank, file, tensor), offset // BLOCK_BYTES)
        else:
            self._fill_blocks(out, BlockId(self.seed, checkpoint, rank, file, tensor, offset))

    def _fill_native(self, out: np.ndarray, native_id: payload_kernel.BlockId, first_block: int) -> None:
        """The kernel's payload of the blocks from `first_block` into `out`, spread over the lanes where it is large."""
        kernel, shared = self._kernel, lanes.shared()
        if kernel is None:
            raise RuntimeError("the native payload kernel is not loaded; the payload is made in Python")
        pieces = shared.pieces(out.nbytes, BLOCK_BYTES)
        if len(pieces) == 1:  # most calls: one tensor's chunk on one lane, without a closure per call
            kernel.fill(native_id, first_block, out)
            return

        def piece(start: int, stop: int) -> None:
            kernel.fill(native_id, first_block + start // BLOCK_BYTES, out[start:stop])

        shared.map(piece, pieces)

    def _fill_blocks(self, out: np.ndarray, block_id: BlockId) -> None:
        """Keystream of the blocks from block_id.offset, each under its sealed header; the last may be cut short
        (its bytes are the first bytes of the whole block: the keystream runs on and the header comes first)."""
        first_block = block_id.offset // BLOCK_BYTES
        count = -(-out.nbytes // BLOCK_BYTES)
        self._keystream(out, self._stream_id(block_id), first_block * _COUNTERS_PER_BLOCK)
        sealed = _seal_headers(*_plain_headers(block_id, first_block, count))
        whole = out.nbytes // BLOCK_BYTES
        if whole:
            headers = out[: whole * BLOCK_BYTES].reshape(whole, BLOCK_BYTES)
            for column, half in enumerate(sealed):
                part = np.frombuffer(half, np.uint8, count=whole * _AES_BYTES).reshape(whole, _AES_BYTES)
                headers[:, column * _AES_BYTES : (column + 1) * _AES_BYTES] = part
        if whole < count:  # the last block is cut short: as many header bytes as it holds
            tail = out[whole * BLOCK_BYTES : whole * BLOCK_BYTES + HEADER_BYTES]
            last = b"".join(half[-_AES_BYTES:] for half in sealed)
            tail[:] = np.frombuffer(last, np.uint8, count=tail.nbytes)

    def _keystream(self, out: np.ndarray, stream: int, first_counter: int) -> None:
        """AES-CTR keystream from the 128-bit counter `stream` << 64 | `first_counter` into `out` (block i of a
        tensor always starts at counter i * 256, so any piece of it comes out the same)."""
        if out.nbytes <= COUNTER_BLOCKS_MAX_BYTES:
            count = -(-out.nbytes // _AES_BYTES)
            counters = np.empty((count, 2), dtype=">u8")
            counters[:, 0] = stream
            counters[:, 1] = np.arange(first_counter, first_counter + count, dtype=np.uint64)
            if not hasattr(self._contexts, "ecb"):
                self._contexts.ecb = Cipher(self._algorithm, modes.ECB()).encryptor()
            out[:] = np.frombuffer(self._contexts.ecb.update(counters.view(np.uint8)), dtype=np.uint8, count=out.nbytes)
            return
        counter = stream << 64 | first_counter

        def piece(start: int, stop: int) -> None:
            keystream.fill(self._key, counter + start // _AES_BYTES, out[start:stop])

        shared = lanes.shared()
        shared.map(piece, shared.pieces(out.nbytes, BLOCK_BYTES) if keystream.RELEASES_GIL else [(0, out.nbytes)])

    def fill_padding(self, out: np.ndarray, checkpoint: int, rank: int, file: int, tensor: int) -> None:
        """Write the keystream of the alignment padding before tensor `tensor`'s data into `out` (contiguous uint8).

        A stream of its own (no block headers: a pad is shorter than a block), so that padding repeats nothing,
        neither other padding nor any tensor's bytes.
        """
        for name, value in (("checkpoint", checkpoint), ("rank", rank), ("file", file), ("tensor", tensor)):
            _check_field(name, value)
        if out.nbytes:
            stream = self._padding_streams(checkpoint, rank, file, tensor)
            if self._kernel is not None:
                self._kernel.keystream(self._key, stream, 0, out)
            else:
                self._keystream(out, stream, 0)

    def _padding_stream(self, checkpoint: int, rank: int, file: int, tensor: int) -> int:
        """The CTR nonce of a tensor's padding (made once per tensor: `_padding_streams`)."""
        return self._stream_id(BlockId(self.seed, checkpoint, rank, file, tensor, 0), b"ckptqual-pad")

    def _native_id(self, checkpoint: int, rank: int, file: int, tensor: int) -> payload_kernel.BlockId:
        """The kernel's description of a tensor's blocks, its header's fields packed as the header packs them (made
        once per tensor: `_native_ids`)."""
        native = payload_kernel.BlockId()
        native.key[:] = self._key
        native.header_key[:] = HEADER_KEY
        native.stream = self._stream_id(BlockId(self.seed, checkpoint, rank, file, tensor, 0))
        native.tensor_file = tensor | file << 32
        native.rank_checkpoint = rank | checkpoint << 32
        native.seed_magic = self.seed | MAGIC << 32
        return native

    def matches(self, data: np.ndarray, expected: np.ndarray, ids: tuple[int, int, int, int], offset: int) -> bool:
        """Whether `data` holds the payload of (checkpoint, rank, file, tensor) `ids` from `offset`. Each lane takes a
        piece and compares it with its expected bytes made a step at a time, while they are still in the CPU's
        cache (the kernel: 64 KiB; in Python: a step into `expected`, then memcmp); a piece stops at its first
        difference."""
        if not data.flags.c_contiguous:
            self.fill(expected, *ids, offset)
            return bool(np.array_equal(data, expected))
        differs: list[int] = []
        first_block = offset // BLOCK_BYTES
        if self._kernel is not None:
            native_id, kernel = self._native_ids(*ids), self._kernel

            def check(start: int, stop: int) -> None:
                if kernel.differs_at(native_id, first_block + start // BLOCK_BYTES, data[start:stop]) is not None:
                    differs.append(start)

        else:
            found_at, wanted_at = data.ctypes.data, expected.ctypes.data

            def check(start: int, stop: int) -> None:
                for step in range(start, stop, VERIFY_STEP_BYTES):
                    end = min(step + VERIFY_STEP_BYTES, stop)
                    self.fill(expected[step:end], *ids, offset + step)  # one step: made on this lane alone
                    if _memcmp(found_at + step, wanted_at + step, end - step):
                        differs.append(step)
                        return

        shared = lanes.shared()
        shared.map(check, shared.pieces(data.nbytes, BLOCK_BYTES))
        return not differs

    @staticmethod
    def _stream_id(block_id: BlockId, person: bytes = b"ckptqual-stream") -> int:
        """64-bit CTR nonce of one tensor's keystream (or, under another `person`, of its padding's)."""
        fields = struct.pack("<5I", block_id.seed, block_id.checkpoint, block_id.rank, block_id.file, block_id.tensor)
        return int.from_bytes(hashlib.blake2b(fields, digest_size=8, person=person).digest(), "big")

    def expected(self, size: int, checkpoint: int, rank: int, file: int, tensor: int, offset: int) -> np.ndarray:
        """A fresh buffer holding the payload of tensor bytes [offset, offset + size)."""
        out = np.empty(size, dtype=np.uint8)
        self.fill(out, checkpoint, rank, file, tensor, offset)
        return out


@dataclass(frozen=True)
class Mismatch:
    """A block that did not hold what was written there."""

    offset: int
    found: str

    def describe(self) -> str:
        return f"at tensor offset {self.offset}: {self.found}"


def read_header(block: np.ndarray) -> BlockId | None:
    """The identity in a block's header (from any run), or None if it has no payload header."""
    if block.nbytes < HEADER_BYTES:
        return None
    words = np.frombuffer(_open_header(np.ascontiguousarray(block[:HEADER_BYTES], dtype=np.uint8).tobytes()), "<u8")
    if int(words[3]) >> 32 != MAGIC:
        return None
    low = 0xFFFFFFFF
    tensor, file = int(words[1]) & low, int(words[1]) >> 32
    rank, checkpoint = int(words[2]) & low, int(words[2]) >> 32
    return BlockId(int(words[3]) & low, checkpoint, rank, file, tensor, int(words[0]))


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) byte index of every run of True in a boolean array."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    return [(int(first), int(end) - 1) for first, end in zip(edges[::2], edges[1::2], strict=True)]


def _spans(runs: list[tuple[int, int]]) -> str:
    return " and ".join(f"{first}-{last}" for first, last in runs)


def _wrong_bytes(wrong: np.ndarray) -> str:
    """Where the wrong bytes of a block are, e.g. "3 wrong bytes within bytes 100-180 of the block"."""
    if wrong.size == 1:
        return f"byte {wrong[0]} of the block is wrong"
    return f"{wrong.size} wrong bytes within bytes {wrong[0]}-{wrong[-1]} of the block"


def _zeroed_runs(found: np.ndarray, differs: np.ndarray) -> list[tuple[int, int]] | None:
    """The runs of zeros that explain every differing byte, or None if zeroing does not explain them."""
    if found[differs].any():
        return None
    runs = [(first, last) for first, last in _runs(found == 0) if differs[first : last + 1].any()]
    if any(last - first + 1 < MIN_ZERO_RUN_BYTES for first, last in runs):
        return None
    return runs


def classify(found: np.ndarray, expected: BlockId) -> str:
    """Says what a wrong block holds instead: zeros (and where), stale data, another rank's block, garbage."""
    if not found.any():
        return "zeros"
    wanted = PayloadGenerator(expected.seed).expected(
        found.nbytes, expected.checkpoint, expected.rank, expected.file, expected.tensor, expected.offset
    )
    differs = found != wanted
    if not differs.any():
        return "the expected payload (nothing wrong)"
    zeroed = _zeroed_runs(found, differs)
    if zeroed:
        return f"zeros in bytes {_spans(zeroed)} of the block, the rest correct"
    header = read_header(found)
    if header is None:
        return "garbage (no payload header)"
    if header.seed != expected.seed:
        return f"a block from another run (seed {header.seed})"
    if header.checkpoint != expected.checkpoint:
        return f"stale data from checkpoint {header.checkpoint} ({header.describe()})"
    if header.rank != expected.rank:
        return f"a block from rank {header.rank} ({header.describe()})"
    if (header.file, header.tensor, header.offset) != (expected.file, expected.tensor, expected.offset):
        return f"a misplaced block ({header.describe()})"
    return f"corrupted bytes inside a block with a correct header ({_wrong_bytes(np.flatnonzero(differs))})"


def find_mismatches(
    generator: PayloadGenerator,
    data: np.ndarray,
    checkpoint: int,
    rank: int,
    file: int,
    tensor: int,
    offset: int,
    limit: int = 8,
    scratch: np.ndarray | None = None,
) -> list[Mismatch]:
    """Up to `limit` blocks of `data` (tensor bytes from `offset`) that differ from the payload.

    `scratch` (uint8, at least as large as `data`) is reused for the expected bytes instead of a fresh buffer.
    """
    expected = np.empty(data.nbytes, dtype=np.uint8) if scratch is None else scratch[: data.nbytes]
    if generator.matches(data, expected, (checkpoint, rank, file, tensor), offset):
        return []
    generator.fill(expected, checkpoint, rank, file, tensor, offset)  # all of it, for the account block by block
    bad: list[Mismatch] = []
    for start in range(0, data.nbytes, BLOCK_BYTES):
        found = data[start : start + BLOCK_BYTES]
        if np.array_equal(found, expected[start : start + BLOCK_BYTES]):
            continue
        block_offset = offset + start
        wanted = BlockId(generator.seed, checkpoint, rank, file, tensor, block_offset)
        bad.append(Mismatch(block_offset, classify(found, wanted)))
        if len(bad) >= limit:
            break
    return bad
