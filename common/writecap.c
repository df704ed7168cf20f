/*
 * writecap.c - write capability tags (writecap.h).  Pure; no locks.
 */
#include "writecap.h"

#include <sodium.h>
#include <string.h>
#include <sys/random.h>

#include "moonlet/error.h"
#include "moonlet/types.h"

_Static_assert(crypto_shorthash_KEYBYTES == MOONLET_WRITECAP_KEY_BYTES, "SipHash key size");

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

uint64_t moonlet_writecap_tag(const uint8_t key[MOONLET_WRITECAP_KEY_BYTES],
                              const char *segment_id, uint64_t offset, uint64_t len,
                              uint64_t expiry_ms)
{
    uint8_t msg[MOONLET_MAX_ID_BYTES + 1 + 24];
    size_t n = strnlen(segment_id, MOONLET_MAX_ID_BYTES);
    memcpy(msg, segment_id, n);
    msg[n++] = 0;
    put_be64(msg + n, offset);
    put_be64(msg + n + 8, len);
    put_be64(msg + n + 16, expiry_ms);
    uint8_t out[crypto_shorthash_BYTES];
    crypto_shorthash(out, msg, n + 24, key);
    uint64_t tag;
    memcpy(&tag, out, sizeof(tag));
    return tag;
}

#define LEN_MASK ((UINT64_C(1) << MOONLET_WRITECAP_LEN_BITS) - 1)
#define EXPIRY_MASK ((UINT64_C(1) << MOONLET_WRITECAP_EXPIRY_BITS) - 1)
#define EPOCH_LO_BITS (64u - MOONLET_WRITECAP_EXPIRY_BITS) /* 22, in expiry */

void moonlet_writecap_set_epoch(moonlet_writecap *cap, uint64_t epoch)
{
    epoch &= MOONLET_WRITECAP_EPOCH_MAX;
    cap->len = (cap->len & LEN_MASK) | (epoch >> EPOCH_LO_BITS) << MOONLET_WRITECAP_LEN_BITS;
    cap->expiry_ms = (cap->expiry_ms & EXPIRY_MASK) |
                     (epoch & ((UINT64_C(1) << EPOCH_LO_BITS) - 1)) << MOONLET_WRITECAP_EXPIRY_BITS;
}

uint64_t moonlet_writecap_epoch(const moonlet_writecap *cap)
{
    return (cap->len >> MOONLET_WRITECAP_LEN_BITS) << EPOCH_LO_BITS |
           cap->expiry_ms >> MOONLET_WRITECAP_EXPIRY_BITS;
}

uint64_t moonlet_writecap_len(const moonlet_writecap *cap)
{
    return cap->len & LEN_MASK;
}

uint64_t moonlet_writecap_expiry(const moonlet_writecap *cap)
{
    return cap->expiry_ms & EXPIRY_MASK;
}

bool moonlet_writecap_valid(const uint8_t key[MOONLET_WRITECAP_KEY_BYTES], const char *segment_id,
                            const moonlet_writecap *cap, uint64_t offset, uint64_t len,
                            uint64_t now_ms)
{
    uint64_t want = moonlet_writecap_tag(key, segment_id, cap->offset, cap->len, cap->expiry_ms);
    bool genuine = sodium_memcmp(&want, &cap->tag, sizeof(want)) == 0;
    uint64_t clen = moonlet_writecap_len(cap);
    bool covers = offset >= cap->offset && len <= clen && offset - cap->offset <= clen - len;
    return genuine && covers && now_ms < moonlet_writecap_expiry(cap);
}

int moonlet_writecap_new_key(uint8_t key[MOONLET_WRITECAP_KEY_BYTES])
{
    size_t got = 0;
    while (got < MOONLET_WRITECAP_KEY_BYTES) {
        ssize_t r = getrandom(key + got, MOONLET_WRITECAP_KEY_BYTES - got, 0);
        if (r <= 0)
            return MOONLET_ERR_INTERNAL_ERROR;
        got += (size_t)r;
    }
    return MOONLET_OK;
}
