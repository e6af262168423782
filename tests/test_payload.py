"""The payload: incompressible, unique per block, self-describing, and its verification names what is wrong."""

import hashlib
import zlib

import numpy as np
import pytest

from ckptqual.payload import BLOCK_BYTES, BlockId, PayloadGenerator, classify, find_mismatches, read_header


@pytest.fixture(scope="module")
def generator():
    return PayloadGenerator(seed=2025)


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


def test_block_bodies_differ_even_where_they_share_a_pool_block(generator):
    pool_blocks = (8 << 20) // BLOCK_BYTES
    first = generator.expected(BLOCK_BYTES, 0, 0, 0, 0, 0)
    wrapped = generator.expected(BLOCK_BYTES, 0, 0, 0, 0, pool_blocks * BLOCK_BYTES)
    assert not np.array_equal(first[32:], wrapped[32:])


def test_generation_is_deterministic_and_chunking_does_not_matter(generator):
    whole = generator.expected(10 * BLOCK_BYTES + 123, 4, 2, 1, 3, 0)
    again = PayloadGenerator(seed=2025).expected(10 * BLOCK_BYTES + 123, 4, 2, 1, 3, 0)
    assert np.array_equal(whole, again)
    parts = [
        generator.expected(4 * BLOCK_BYTES, 4, 2, 1, 3, 0),
        generator.expected(6 * BLOCK_BYTES + 123, 4, 2, 1, 3, 4 * BLOCK_BYTES),
    ]
    assert np.array_equal(whole, np.concatenate(parts))


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
    assert mismatch.found == "corrupted bytes inside a block with a correct header"


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


def test_even_tiny_tensors_differ_from_one_another(generator):
    tiny = [
        generator.expected(8, checkpoint=1, rank=0, file=f, tensor=t, offset=0).tobytes()
        for f in range(3)
        for t in range(3)
    ]
    assert len(set(tiny)) == len(tiny)
