/* The checkpoint payload (ckptqual.io.payload) made and checked in native code: AES-128-CTR keystream with each
 * 4 KiB block's sealed header, byte for byte what the Python code makes, without Python's cost per call.
 *
 * The AES itself is OpenSSL's: the caller hands over libcrypto's EVP functions and ciphers (ctypes loaded them), so
 * this library links to nothing but libc and pthreads. Every function here runs without the GIL (ctypes drops it
 * for the call), so a rank's helper threads can run them side by side. */

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK_BYTES 4096
#define HEADER_HALF 16
#define COUNTERS_PER_BLOCK (BLOCK_BYTES / 16)
#define PIECE_BYTES (64 * 1024) /* checked a piece at a time: its expected bytes stay in the core's cache */
#define PIECE_BLOCKS (PIECE_BYTES / BLOCK_BYTES)

typedef void *(*ctx_new_fn)(void);
typedef void (*ctx_free_fn)(void *ctx);
typedef int (*init_fn)(void *ctx, const void *cipher, void *engine, const unsigned char *key, const unsigned char *iv);
typedef int (*update_fn)(void *ctx, unsigned char *out, int *out_len, const unsigned char *in, int in_len);

/* libcrypto's calls and ciphers, as the caller found them. */
struct ckq_crypto {
    ctx_new_fn ctx_new;
    ctx_free_fn ctx_free;
    init_fn init;
    update_fn update;
    const void *ctr; /* EVP_CIPHER of AES-128-CTR */
    const void *ecb; /* EVP_CIPHER of AES-128-ECB */
};

/* Whose block a payload block is: the header fields other than its offset, as the header packs them. */
struct ckq_block_id {
    uint8_t key[16];        /* the run's AES key (from its seed) */
    uint8_t header_key[16]; /* the public key that seals headers */
    uint64_t stream;        /* the tensor's 64-bit CTR nonce */
    uint64_t tensor_file;   /* tensor | file << 32 */
    uint64_t rank_checkpoint;
    uint64_t seed_magic;
};

static const uint8_t zeros[PIECE_BYTES]; /* CTR keystream is the cipher run over zeros */

/* One EVP context per thread and cipher, freed with the thread. */
struct contexts {
    const struct ckq_crypto *crypto;
    void *ctr, *ecb;
    uint8_t ecb_key[16];
    int ecb_ready;
};
static pthread_key_t contexts_key;
static pthread_once_t contexts_once = PTHREAD_ONCE_INIT;

static void free_contexts(void *pointer) {
    struct contexts *own = pointer;
    if (own->ctr) own->crypto->ctx_free(own->ctr);
    if (own->ecb) own->crypto->ctx_free(own->ecb);
    memset(own, 0, sizeof *own);
    free(own);
}

static void make_key(void) { pthread_key_create(&contexts_key, free_contexts); }

static struct contexts *contexts(const struct ckq_crypto *crypto) {
    pthread_once(&contexts_once, make_key);
    struct contexts *own = pthread_getspecific(contexts_key);
    if (!own) {
        own = calloc(1, sizeof *own);
        if (!own) return NULL;
        own->crypto = crypto;
        own->ctr = crypto->ctx_new();
        own->ecb = crypto->ctx_new();
        if (!own->ctr || !own->ecb || pthread_setspecific(contexts_key, own)) {
            free_contexts(own);
            return NULL;
        }
    }
    return own;
}

static void put_le64(uint8_t *out, uint64_t value) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(value >> (8 * i));
}

static void put_be64(uint8_t *out, uint64_t value) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(value >> (8 * (7 - i)));
}

/* AES-128-CTR keystream under `key` from the counter stream << 64 | first_counter into out[0, n). */
static int keystream(struct contexts *own, const uint8_t key[16], uint64_t stream, uint64_t first_counter,
                     uint8_t *out, size_t n) {
    uint8_t iv[16];
    put_be64(iv, stream);
    put_be64(iv + 8, first_counter);
    if (own->crypto->init(own->ctr, own->crypto->ctr, NULL, key, iv) != 1) return -1;
    for (size_t done = 0; done < n; done += PIECE_BYTES) {
        int length = (int)(n - done < PIECE_BYTES ? n - done : PIECE_BYTES), written = 0;
        if (own->crypto->update(own->ctr, out + done, &written, zeros, length) != 1) return -1;
    }
    return 0;
}

/* AES-ECB under the header key over `count` 16-byte blocks, in place. */
static int seal(struct contexts *own, const uint8_t header_key[16], uint8_t *blocks, int count) {
    if (!own->ecb_ready || memcmp(own->ecb_key, header_key, 16)) {
        if (own->crypto->init(own->ecb, own->crypto->ecb, NULL, header_key, NULL) != 1) return -1;
        memcpy(own->ecb_key, header_key, 16);
        own->ecb_ready = 1;
    }
    int written = 0;
    return own->crypto->update(own->ecb, blocks, &written, blocks, count * HEADER_HALF) == 1 ? 0 : -1;
}

/* Writes the sealed headers of `count` blocks from `first_block` over the start of each block of out[0, n): the
 * plaintext halves p1 = (offset, tensor | file << 32), p2 = (rank | checkpoint << 32, seed | magic << 32) become
 * c1 = E(p1), c2 = E(p2 ^ c1), d2 = E(c2), d1 = E(c1 ^ d2), stored as d1 d2 (payload.py `_seal_headers`). The
 * last block may be cut short: it holds as many header bytes as it has. */
static int headers(struct contexts *own, const struct ckq_block_id *id, uint64_t first_block, uint8_t *out, size_t n) {
    uint8_t c1[PIECE_BLOCKS][HEADER_HALF], work[PIECE_BLOCKS][HEADER_HALF], second[HEADER_HALF];
    put_le64(second, id->rank_checkpoint);
    put_le64(second + 8, id->seed_magic);
    size_t count = (n + BLOCK_BYTES - 1) / BLOCK_BYTES;
    for (size_t batch = 0; batch < count; batch += PIECE_BLOCKS) {
        int blocks = (int)(count - batch < PIECE_BLOCKS ? count - batch : PIECE_BLOCKS);
        for (int i = 0; i < blocks; i++) {
            put_le64(c1[i], (first_block + batch + i) * BLOCK_BYTES);
            put_le64(c1[i] + 8, id->tensor_file);
        }
        if (seal(own, id->header_key, c1[0], blocks)) return -1; /* c1 */
        for (int i = 0; i < blocks; i++)
            for (int b = 0; b < HEADER_HALF; b++) work[i][b] = second[b] ^ c1[i][b];
        if (seal(own, id->header_key, work[0], blocks)) return -1; /* c2 */
        if (seal(own, id->header_key, work[0], blocks)) return -1; /* d2 */
        for (int i = 0; i < blocks; i++)
            for (int b = 0; b < HEADER_HALF; b++) c1[i][b] ^= work[i][b];
        if (seal(own, id->header_key, c1[0], blocks)) return -1; /* d1 */
        for (int i = 0; i < blocks; i++) {
            size_t at = (batch + i) * BLOCK_BYTES, room = n - at;
            uint8_t sealed[2 * HEADER_HALF];
            memcpy(sealed, c1[i], HEADER_HALF);
            memcpy(sealed + HEADER_HALF, work[i], HEADER_HALF);
            memcpy(out + at, sealed, room < sizeof sealed ? room : sizeof sealed);
        }
    }
    return 0;
}

/* The payload of tensor bytes [first_block * 4096, + n) into out: keystream, then each block's header. 0 or -1. */
int ckq_fill(const struct ckq_crypto *crypto, const struct ckq_block_id *id, uint64_t first_block, uint8_t *out,
             size_t n) {
    struct contexts *own = contexts(crypto);
    if (!own) return -1;
    if (keystream(own, id->key, id->stream, first_block * COUNTERS_PER_BLOCK, out, n)) return -1;
    return headers(own, id, first_block, out, n);
}

/* Keystream alone (the padding's own stream, with no headers) from counter stream << 64 | first_counter. */
int ckq_keystream(const struct ckq_crypto *crypto, const uint8_t key[16], uint64_t stream, uint64_t first_counter,
                  uint8_t *out, size_t n) {
    struct contexts *own = contexts(crypto);
    return own ? keystream(own, key, stream, first_counter, out, n) : -1;
}

/* Compares data[0, n), tensor bytes from block `first_block`, with the payload made a piece at a time. Returns -1
 * where every byte is the payload, the offset of the first piece that differs, or -2 where libcrypto failed. */
int64_t ckq_verify(const struct ckq_crypto *crypto, const struct ckq_block_id *id, uint64_t first_block,
                   const uint8_t *data, size_t n) {
    uint8_t expected[PIECE_BYTES] __attribute__((aligned(64)));
    for (size_t done = 0; done < n; done += PIECE_BYTES) {
        size_t length = n - done < PIECE_BYTES ? n - done : PIECE_BYTES;
        if (ckq_fill(crypto, id, first_block + done / BLOCK_BYTES, expected, length)) return -2;
        if (memcmp(expected, data + done, length)) return (int64_t)done;
    }
    return -1;
}
