"""The payload: incompressible, unique per block, self-describing, and its verification names what is wrong."""

import hashlib
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ckptqual.io.native import payload_kernel
from ckptqual.io.payload import (
    BLOCK_BYTES,
    COUNTER_BLOCKS_MAX_BYTES,
    HEADER_BYTES,
    BlockId,
    Mismatch,
    PayloadGenerator,
    classify,
    find_mismatches,
    read_header,
)


@pytest.fixture(scope="module", params=["native", "python"])
def generator(request):
    """Each test runs on the native payload kernel and on the Python code; both must make the same bytes."""
    if request.param == "native":
        kernel, problem = payload_kernel.kernel()
        if kernel is None:
            pytest.skip(f"the native payload kernel is not available: {problem}")
    return PayloadGenerator(seed=2025, native=request.param == "native")


def test_payload_is_incompressible(generator):
    data = generator.expected(16 << 20, checkpoint=1, rank=0, file=0, tensor=0, offset=0)
    compressed = zlib.compress(data.tobytes(), 9)
    assert len(compressed) / data.nbytes > 0.99  # zlib gains under 1 %


def test_blocks_are_unique_across_checkpoints_ranks_files_and_offsets(generator):
    digests = set()
    blocks = 0
    for checkpoint in range(3):
        for rank in range(4):
            for file in range(2):
                data = generator.expected(64 * BLOCK_BYTES, checkpoint, rank, file, tensor=0, offset=0)
                for start in range(0, data.nbytes, BLOCK_BYTES):
                    digests.add(hashlib.blake2b(data[start : start + BLOCK_BYTES].tobytes()).digest())
                    blocks += 1
    assert len(digests) == blocks


def test_no_16_bytes_of_a_header_repeat_when_one_field_changes(generator):
    """The header is sealed forward and backward: blocks alike but for one field share no 16-byte half."""
    base = dict(checkpoint=7, rank=1, file=2, tensor=3, offset=5 * BLOCK_BYTES)
    variants = [base] + [{**base, field: base[field] + 1} for field in ("checkpoint", "rank", "file", "tensor")]
    variants.append({**base, "offset": base["offset"] + BLOCK_BYTES})
    headers = [generator.expected(HEADER_BYTES, **fields) for fields in variants]
    halves = [header[i : i + 16].tobytes() for header in headers for i in (0, 16)]
    assert len(set(halves)) == len(halves)
    assert [read_header(h) for h in headers] == [BlockId(2025, **fields) for fields in variants]


def test_generation_is_deterministic_and_chunking_does_not_matter(generator):
    whole = generator.expected(10 * BLOCK_BYTES + 123, 4, 2, 1, 3, 0)
    again = PayloadGenerator(seed=2025).expected(10 * BLOCK_BYTES + 123, 4, 2, 1, 3, 0)
    assert np.array_equal(whole, again)
    parts = [
        generator.expected(4 * BLOCK_BYTES, 4, 2, 1, 3, 0),
        generator.expected(6 * BLOCK_BYTES + 123, 4, 2, 1, 3, 4 * BLOCK_BYTES),
    ]
    assert np.array_equal(whole, np.concatenate(parts))


def test_small_pieces_from_counter_blocks_equal_the_ctr_stream_of_large_ones(generator):
    """Pieces up to COUNTER_BLOCKS_MAX_BYTES take their keystream from ECB over counter blocks, larger ones from a
    CTR context: any split of a tensor gives the same bytes, the headers included."""
    size = 3 * COUNTER_BLOCKS_MAX_BYTES + 5 * BLOCK_BYTES + 77
    whole = generator.expected(size, 6, 1, 2, 4, 3 * BLOCK_BYTES)
    for piece in (BLOCK_BYTES, 5 * BLOCK_BYTES, COUNTER_BLOCKS_MAX_BYTES):
        parts = [
            generator.expected(min(piece, size - start), 6, 1, 2, 4, 3 * BLOCK_BYTES + start)
            for start in range(0, size, piece)
        ]
        assert np.array_equal(whole, np.concatenate(parts)), piece


def test_the_keystream_is_aes_ctr_from_the_blocks_counter(generator):
    """Past its 32-byte header a block is AES-128-CTR keystream counted from the block's index x 256 (the format
    that earlier runs wrote and any reader can recompute), for small and large pieces alike."""
    key = hashlib.blake2b((2025).to_bytes(4, "little"), digest_size=16, person=b"ckptqual-key").digest()
    fields = b"".join(value.to_bytes(4, "little") for value in (2025, 6, 1, 2, 4))
    stream = int.from_bytes(hashlib.blake2b(fields, digest_size=8, person=b"ckptqual-stream").digest(), "big")
    for blocks in (1, 2 * COUNTER_BLOCKS_MAX_BYTES // BLOCK_BYTES):
        counter = stream << 64 | 3 * BLOCK_BYTES // 16
        reference = Cipher(algorithms.AES(key), modes.CTR(counter.to_bytes(16, "big"))).encryptor()
        expected = np.frombuffer(reference.update(bytes(blocks * BLOCK_BYTES)), np.uint8).reshape(blocks, -1)
        found = generator.expected(blocks * BLOCK_BYTES, 6, 1, 2, 4, 3 * BLOCK_BYTES).reshape(blocks, -1)
        assert np.array_equal(found[:, HEADER_BYTES:], expected[:, HEADER_BYTES:])


def test_header_describes_the_block(generator):
    data = generator.expected(3 * BLOCK_BYTES, checkpoint=7, rank=5, file=2, tensor=9, offset=8 * BLOCK_BYTES)
    header = read_header(data[BLOCK_BYTES : 2 * BLOCK_BYTES])
    assert header == BlockId(2025, 7, 5, 2, 9, 9 * BLOCK_BYTES)


def test_unaligned_offsets_are_refused(generator):
    with pytest.raises(ValueError, match="multiple of 4096"):
        generator.expected(10, 0, 0, 0, 0, offset=100)


def test_verification_passes_intact_data_and_odd_sizes(generator):
    for size in (0, 1, 31, 33, BLOCK_BYTES - 1, BLOCK_BYTES + 1, 5 * BLOCK_BYTES + 7):
        data = generator.expected(size, 1, 1, 1, 1, 0)
        assert find_mismatches(generator, data, 1, 1, 1, 1, 0) == []


def test_verification_catches_a_flipped_byte(generator):
    data = generator.expected(8 * BLOCK_BYTES, 1, 0, 0, 0, 0)
    data[5 * BLOCK_BYTES + 1000] ^= 0x01
    (mismatch,) = find_mismatches(generator, data, 1, 0, 0, 0, 0)
    assert mismatch.offset == 5 * BLOCK_BYTES
    assert mismatch.found == "corrupted bytes inside a block with a correct header (byte 1000 of the block is wrong)"


def test_a_zeroed_sector_straddling_two_blocks_is_named_zeros_with_its_bytes(generator):
    """torch.save aligns tensor data to 64 bytes only, so a zeroed 4 KiB disk sector can cover parts of two blocks."""
    data = generator.expected(4 * BLOCK_BYTES, checkpoint=4, rank=3, file=1, tensor=2, offset=0)
    data[BLOCK_BYTES + 1984 : 2 * BLOCK_BYTES + 1984] = 0
    first, second = find_mismatches(generator, data, 4, 3, 1, 2, 0)
    assert first == Mismatch(BLOCK_BYTES, "zeros in bytes 1984-4095 of the block, the rest correct")
    assert second == Mismatch(2 * BLOCK_BYTES, "zeros in bytes 0-1983 of the block, the rest correct")


def test_zeroed_sectors_inside_a_block_are_each_named(generator):
    data = generator.expected(2 * BLOCK_BYTES + 100, checkpoint=4, rank=3, file=1, tensor=2, offset=0)
    data[BLOCK_BYTES + 512 : BLOCK_BYTES + 1024] = 0
    data[BLOCK_BYTES + 3584 : BLOCK_BYTES + 4096] = 0
    data[2 * BLOCK_BYTES + 40 :] = 0  # the tensor's last, partial block
    first, last = find_mismatches(generator, data, 4, 3, 1, 2, 0)
    assert first.found == "zeros in bytes 512-1023 and 3584-4095 of the block, the rest correct"
    assert last.found == "zeros in bytes 40-99 of the block, the rest correct"


def test_a_single_zeroed_byte_is_corruption_not_a_zeroed_range(generator):
    data = generator.expected(BLOCK_BYTES, 1, 0, 0, 0, 0)
    data[700] = 0 if data[700] else 1
    (mismatch,) = find_mismatches(generator, data, 1, 0, 0, 0, 0)
    assert mismatch.found.startswith("corrupted bytes inside a block with a correct header")


def test_zeros_mixed_with_other_damage_are_not_called_zeros(generator):
    data = generator.expected(BLOCK_BYTES, 1, 0, 0, 0, 0)
    data[1024:2048] = 0
    data[3000] ^= 0xFF
    (mismatch,) = find_mismatches(generator, data, 1, 0, 0, 0, 0)
    assert mismatch.found.startswith("corrupted bytes inside a block with a correct header (")
    assert "within bytes 1024-3000 of the block" in mismatch.found


@pytest.mark.parametrize(
    ("make_wrong_block", "expected"),
    [
        (lambda g: np.zeros(BLOCK_BYTES, np.uint8), "zeros"),
        (lambda g: g.expected(BLOCK_BYTES, 0, 3, 1, 2, 2 * BLOCK_BYTES), "stale data from checkpoint 0"),
        (lambda g: g.expected(BLOCK_BYTES, 4, 6, 1, 2, 2 * BLOCK_BYTES), "a block from rank 6"),
        (lambda g: g.expected(BLOCK_BYTES, 4, 3, 1, 2, 7 * BLOCK_BYTES), "a misplaced block"),
        (lambda g: np.frombuffer(bytes(range(256)) * 16, np.uint8), "garbage"),
        (lambda g: PayloadGenerator(99).expected(BLOCK_BYTES, 4, 3, 1, 2, 2 * BLOCK_BYTES), "another run"),
    ],
)
def test_verification_says_what_was_found_instead(generator, make_wrong_block, expected):
    data = generator.expected(4 * BLOCK_BYTES, checkpoint=4, rank=3, file=1, tensor=2, offset=0)
    data[2 * BLOCK_BYTES : 3 * BLOCK_BYTES] = make_wrong_block(generator)
    (mismatch,) = find_mismatches(generator, data, 4, 3, 1, 2, 0)
    assert mismatch.offset == 2 * BLOCK_BYTES
    assert expected in mismatch.found


def test_classify_zeros_without_header():
    wanted = BlockId(1, 0, 0, 0, 0, 0)
    assert classify(np.zeros(100, np.uint8), wanted) == "zeros"


def test_classify_says_so_when_a_block_is_right(generator):
    block = generator.expected(BLOCK_BYTES, 1, 2, 3, 4, 0)
    assert classify(block, BlockId(2025, 1, 2, 3, 4, 0)) == "the expected payload (nothing wrong)"


def test_even_tiny_tensors_differ_from_one_another(generator):
    tiny = [
        generator.expected(8, checkpoint=1, rank=0, file=f, tensor=t, offset=0).tobytes()
        for f in range(3)
        for t in range(3)
    ]
    assert len(set(tiny)) == len(tiny)


def padding(generator: PayloadGenerator, size: int, checkpoint: int, rank: int, file: int, tensor: int) -> bytes:
    out = np.empty(size, dtype=np.uint8)
    generator.fill_padding(out, checkpoint, rank, file, tensor)
    return out.tobytes()


def test_padding_is_a_stream_of_its_own_for_each_tensor(generator):
    """Alignment padding repeats nothing: not another tensor's padding, not the checkpoint before's, not any tensor's
    data, and no 64-byte window of it repeats within; a shorter pad is the start of a longer one (one stream)."""
    pads = [padding(generator, 4000, c, r, f, t) for c in (1, 2) for r in (0, 1) for f in (0, 3) for t in (0, 5)]
    windows = [pad[i : i + 64] for pad in pads for i in range(0, 4000 - 63, 64)]
    data = generator.expected(4000, 1, 0, 0, 0, 0).tobytes()
    assert len(set(windows)) == len(windows)
    assert not {data[i : i + 64] for i in range(0, 4000 - 63, 64)} & set(windows)
    assert padding(generator, 100, 1, 0, 0, 0) == pads[0][:100]
    assert len(zlib.compress(b"".join(pads), 9)) > len(b"".join(pads))


def test_padding_fields_beyond_32_bits_are_refused(generator):
    with pytest.raises(ValueError, match=r"payload tensor 4294967296: must be an integer with 0 <= tensor"):
        padding(generator, 10, 1, 0, 0, 2**32)


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_seeds_outside_32_bits_are_refused(seed):
    with pytest.raises(ValueError, match=rf"payload seed {seed}: must be an integer with 0 <= seed < 2\*\*32"):
        PayloadGenerator(seed)


@pytest.mark.parametrize("checkpoint", [2**30 + 3, 0xFFFFFFFF])
def test_the_largest_checkpoint_numbers_round_trip_through_the_header(generator, checkpoint):
    data = generator.expected(BLOCK_BYTES + 1, checkpoint, rank=7, file=8, tensor=9, offset=(1 << 40))
    assert read_header(data[:BLOCK_BYTES]) == BlockId(2025, checkpoint, 7, 8, 9, 1 << 40)
    assert find_mismatches(generator, data, checkpoint, 7, 8, 9, 1 << 40) == []


def test_fields_beyond_32_bits_are_refused(generator):
    with pytest.raises(ValueError, match=r"payload checkpoint 4294967296: must be an integer with 0 <= checkpoint"):
        generator.expected(10, checkpoint=2**32, rank=0, file=0, tensor=0, offset=0)


def test_read_header_finds_no_header_in_zeros_or_random_bytes():
    random_blocks = np.random.default_rng(3).integers(0, 256, (64, BLOCK_BYTES), dtype=np.uint8)
    assert read_header(np.zeros(BLOCK_BYTES, np.uint8)) is None
    assert all(read_header(block) is None for block in random_blocks)
    assert read_header(np.zeros(HEADER_BYTES - 1, np.uint8)) is None


def test_generation_from_many_threads_at_once_gives_the_same_bytes(generator):
    def make(tensor: int) -> bytes:
        return generator.expected(64 * BLOCK_BYTES + 5, 3, 2, 1, tensor % 4, 0).tobytes()

    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(make, range(64)))
    assert all(made[i] == made[i % 4] for i in range(64))
    assert len(set(made[:4])) == 4


def test_the_native_kernel_and_python_make_and_judge_the_same_bytes():
    """Random tensors, sizes (odd tails, one block, many pieces) and offsets: the same payload and padding from both,
    and the same wrong block found in each."""
    kernel, problem = payload_kernel.kernel()
    if kernel is None:
        pytest.skip(f"the native payload kernel is not available: {problem}")
    native, python = PayloadGenerator(99), PayloadGenerator(99, native=False)
    assert native.implementation == "native (payload.c)" and python.implementation.startswith("Python")
    rng = np.random.default_rng(3)
    for size in (1, 31, 33, BLOCK_BYTES + 1, 64 << 10, 70_000, (3 << 20) + 5):
        ids = [int(x) for x in rng.integers(0, 2**32, 4)]
        offset = int(rng.integers(0, 500)) * BLOCK_BYTES
        made = native.expected(size, *ids, offset)
        assert np.array_equal(made, python.expected(size, *ids, offset)), size
        pads = [np.empty(size % 4096 + 1, np.uint8) for _ in range(2)]
        native.fill_padding(pads[0], *ids)
        python.fill_padding(pads[1], *ids)
        assert np.array_equal(*pads)
        assert find_mismatches(native, made, *ids, offset) == find_mismatches(python, made, *ids, offset) == []
        made[size // 2] ^= 0xFF
        found = find_mismatches(native, made, *ids, offset)
        assert found == find_mismatches(python, made, *ids, offset)
        assert [m.offset for m in found] == [offset + size // 2 // BLOCK_BYTES * BLOCK_BYTES]
