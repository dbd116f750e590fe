/* redsem - clocks, randomness and argument validation. */
#include <sodium.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

int64_t redsem__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t redsem_monotonic_ms(void)
{
    return redsem__now_ns() / REDSEM__NS_PER_MS;
}

int64_t redsem__deadline_after_ms(int64_t ms)
{
    if (ms < 0)
        return REDSEM__FOREVER;
    int64_t now = redsem__now_ns();
    if (ms > (REDSEM__FOREVER - now) / REDSEM__NS_PER_MS)
        return REDSEM__FOREVER;
    return now + ms * REDSEM__NS_PER_MS;
}

int64_t redsem__rand_between(int64_t lo, int64_t hi)
{
    if (hi <= lo)
        return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    if (span > UINT32_MAX)
        span = UINT32_MAX;
    return lo + (int64_t)randombytes_uniform((uint32_t)span);
}

int64_t redsem__validity_deadline(int64_t sent_ns, int64_t lease_ms)
{
    /* Redis "Distributed Locks": validity = TTL - elapsed - drift, drift = 1% of TTL + 2 ms. */
    int64_t drift_ms = lease_ms / 100 + 2;
    return sent_ns + (lease_ms - drift_ms) * REDSEM__NS_PER_MS;
}

int64_t redsem__lost_early_ms(int64_t lease_ms)
{
    int64_t early = lease_ms / 50;
    if (early > 25)
        early = 25;
    return early < 1 ? 1 : early;
}

int64_t redsem__refresh_margin_ms(int64_t lease_ms)
{
    /* The renewer tells the holder "lost" drift + early before the lease can end. A refresh
     * still in a socket buffer at that moment (a stalled server) may run later; refusing it
     * unless this much is left means it can revive the lease only if the grant it extends
     * took longer than `slack` to travel one way. */
    int64_t early = redsem__lost_early_ms(lease_ms);
    int64_t slack = early + 5 < lease_ms / 10 ? early + 5 : lease_ms / 10;
    return lease_ms / 100 + 2 + early + slack;
}

static bool graph_char(unsigned char ch)
{
    return ch >= 0x21 && ch <= 0x7e && ch != '{' && ch != '}';
}

bool redsem__valid_name(const char *name)
{
    if (name == NULL || name[0] == '\0')
        return false;
    size_t i = 0;
    for (; name[i] != '\0'; i++) {
        if (i >= REDSEM_NAME_MAX || !graph_char((unsigned char)name[i]))
            return false;
    }
    return true;
}

bool redsem__valid_prefix(const char *prefix)
{
    if (prefix == NULL)
        return false;
    for (size_t i = 0; prefix[i] != '\0'; i++) {
        if (i >= 256 || !graph_char((unsigned char)prefix[i]))
            return false;
    }
    return true;
}

bool redsem__valid_id(const char *id)
{
    if (id == NULL)
        return false;
    for (size_t i = 0; i < REDSEM_ID_LEN; i++) {
        char ch = id[i];
        if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
            return false;
    }
    return id[REDSEM_ID_LEN] == '\0';
}

bool redsem__valid_lease(int64_t ms)
{
    return ms >= REDSEM_LEASE_MIN_MS && ms <= REDSEM_LEASE_MAX_MS;
}

bool redsem__valid_wait(int64_t ms)
{
    return ms == REDSEM_WAIT_FOREVER || (ms >= 0 && ms <= REDSEM_WAIT_MAX_MS);
}

int redsem__new_id(char out[REDSEM_ID_BUFSIZE])
{
    unsigned char raw[REDSEM_ID_LEN / 2];
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(out, REDSEM_ID_BUFSIZE, raw, sizeof raw);
    sodium_memzero(raw, sizeof raw);
    return REDSEM_OK;
}

int redsem_id_generate(char out[REDSEM_ID_BUFSIZE])
{
    if (out == NULL)
        return REDSEM_EINVAL;
    if (sodium_init() < 0)
        return REDSEM_ENOMEM;
    return redsem__new_id(out);
}
