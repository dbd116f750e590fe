/* Scenario 14: identifiers and cluster slots.
 * - 1,000,000 holder identifiers generated in 8 processes forked after the parent had
 *   already generated some (so that any generator state copied by fork would show as
 *   duplicates): no duplicate.
 * - Every key that any command touches while each strategy and the lock go through every
 *   operation (seen with MONITOR, so keys formed inside the scripts count too) hashes to the
 *   cluster slot of the name's hash tag: CRC16 (XMODEM) of {NAME}, modulo 16384. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define PROCS 8
#define PER_PROC 125000

static int cmp20(const void *a, const void *b)
{
    return memcmp(a, b, 20);
}

static int hexv(char c)
{
    return c <= '9' ? c - '0' : c - 'a' + 10;
}

Test(ids, a_million_across_forked_processes_are_distinct, .timeout = 120)
{
    char warm[REDSEM_ID_BUFSIZE];
    for (int i = 0; i < 10; i++)
        cr_assert_eq(redsem_id_generate(warm), REDSEM_OK);
    int fds[PROCS];
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        int pp[2];
        cr_assert_eq(pipe(pp), 0);
        pids[p] = fork();
        cr_assert_geq(pids[p], 0);
        if (pids[p] == 0) {
            close(pp[0]);
            unsigned char buf[20 * 1000];
            for (int k = 0; k < PER_PROC / 1000; k++) {
                for (int j = 0; j < 1000; j++) {
                    char id[REDSEM_ID_BUFSIZE];
                    if (redsem_id_generate(id) != REDSEM_OK || strlen(id) != REDSEM_ID_LEN)
                        _exit(2);
                    for (int b = 0; b < 20; b++)
                        buf[j * 20 + b] = (unsigned char)(hexv(id[2 * b]) * 16 + hexv(id[2 * b + 1]));
                }
                size_t off = 0;
                while (off < sizeof buf) {
                    ssize_t w = write(pp[1], buf + off, sizeof buf - off);
                    if (w <= 0)
                        _exit(3);
                    off += (size_t)w;
                }
            }
            _exit(0);
        }
        close(pp[1]);
        fds[p] = pp[0];
    }
    size_t total = (size_t)PROCS * PER_PROC;
    unsigned char *all = malloc(total * 20);
    cr_assert_not_null(all);
    size_t got = 0;
    for (int p = 0; p < PROCS; p++) {
        size_t want = (size_t)PER_PROC * 20, have = 0;
        while (have < want) {
            ssize_t n = read(fds[p], all + got * 20 + have, want - have);
            cr_assert_gt(n, 0, "child %d stopped early", p);
            have += (size_t)n;
        }
        got += PER_PROC;
        close(fds[p]);
        int st;
        waitpid(pids[p], &st, 0);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    qsort(all, total, 20, cmp20);
    size_t dups = 0;
    for (size_t i = 1; i < total; i++)
        dups += memcmp(all + (i - 1) * 20, all + i * 20, 20) == 0;
    fprintf(stderr, "SCENARIO 14 ids: %zu identifiers from %d forked processes: %zu "
                    "duplicates\n",
            total, PROCS, dups);
    cr_expect_eq(dups, 0);
    free(all);
}

/* ------------------------------------------------------------------ slots */

static uint16_t crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((unsigned char)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

/* Redis Cluster: the slot of a key is CRC16 of its hash tag (the part between the first '{'
 * and the next '}', if not empty), else of the whole key, modulo 16384. */
static unsigned slot_of(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        const char *close = memchr(open + 1, '}', len - (size_t)(open + 1 - key));
        if (close && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) & 16383;
    }
    return crc16(key, len) & 16383;
}

typedef struct monitor {
    redisContext *rc;
    _Atomic int stop;
    char (*keys)[256];
    size_t nkeys;
} monitor;

static void add_key(monitor *m, const char *k, size_t len)
{
    if (len >= 256)
        return;
    for (size_t i = 0; i < m->nkeys; i++)
        if (strlen(m->keys[i]) == len && memcmp(m->keys[i], k, len) == 0)
            return;
    if (m->nkeys < 4096) {
        memcpy(m->keys[m->nkeys], k, len);
        m->keys[m->nkeys][len] = '\0';
        m->nkeys++;
    }
}

static void *watch(void *arg)
{
    monitor *m = arg;
    while (!atomic_load(&m->stop)) {
        redisReply *r = NULL;
        if (redisGetReply(m->rc, (void **)&r) != REDIS_OK) {
            if (m->rc->err == REDIS_ERR_IO) { /* receive timeout: look at stop again */
                m->rc->err = 0;
                continue;
            }
            break;
        }
        if (r->type == REDIS_REPLY_STATUS && r->str) {
            /* 1700000000.123456 [0 lua] "ZADD" "redsem:{n}:holders" ... : every quoted
             * argument starting with the prefix is a key (no value ever starts with it) */
            for (const char *p = strstr(r->str, "\"redsem:"); p; p = strstr(p, "\"redsem:")) {
                const char *e = strchr(p + 1, '"');
                if (e == NULL)
                    break;
                add_key(m, p + 1, (size_t)(e - p - 1));
                p = e + 1;
            }
        }
        freeReplyObject(r);
    }
    return NULL;
}

Test(ids, every_key_of_a_name_is_in_one_cluster_slot, .timeout = 60)
{
    fh_run r;
    fh_setup(&r, "slots", FW_FAIR, 1, 2000, NULL, false);
    monitor m = {.keys = calloc(4096, 256)};
    struct timeval tv = {0, 200000};
    m.rc = redisConnectUnixWithTimeout(r.srv.sock, tv);
    cr_assert(m.rc && !m.rc->err);
    redisSetTimeout(m.rc, tv);
    redisReply *ok = redisCommand(m.rc, "MONITOR");
    cr_assert(ok && ok->type == REDIS_REPLY_STATUS);
    freeReplyObject(ok);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, watch, &m), 0);

    /* every strategy and the lock through every operation, with waiters, so that wake-up
     * lists (fair: one per waiter, named inside the script) and the guard appear */
    const char *names[] = {"slot-basic", "slot-fair", "slot-locked", "slot-lock"};
    const fw_kind kinds[] = {FW_BASIC, FW_FAIR, FW_LOCKED, FW_LOCK};
    redsem_client *c = fh_client(r.srv.url, -1, -1);
    redsem_client *w = fh_client(r.srv.url, -1, -1);
    for (int k = 0; k < 4; k++) {
        redsem_sem *s = NULL, *ws = NULL;
        redsem_lock *l = NULL, *wl = NULL;
        if (kinds[k] == FW_LOCK) {
            cr_assert_eq(redsem_lock_open(c, names[k], 2000, &l), REDSEM_OK);
            cr_assert_eq(redsem_lock_open(w, names[k], 2000, &wl), REDSEM_OK);
        } else {
            cr_assert_eq(redsem_sem_open(c, names[k], (redsem_strategy)kinds[k], 1, 2000, &s),
                         REDSEM_OK);
            cr_assert_eq(redsem_sem_open(w, names[k], (redsem_strategy)kinds[k], 1, 2000, &ws),
                         REDSEM_OK);
        }
        redsem_permit *p = NULL, *q = NULL;
        cr_assert_eq(fh_acquire(s, l, 0, &p), REDSEM_OK);
        cr_assert_eq(redsem_permit_refresh(p), REDSEM_OK);
        redsem_status *st = NULL;
        cr_assert_eq(fh_status(s, l, &st), REDSEM_OK);
        redsem_status_free(st);
        /* a waiter on another client, woken by the release */
        pid_t pid = fork();
        if (pid == 0) {
            redsem_client *cc = NULL;
            redsem_sem *ss = NULL;
            redsem_lock *ll = NULL;
            redsem_permit *pp = NULL;
            if (redsem_client_connect(r.srv.url, &cc) != REDSEM_OK)
                _exit(2);
            int rc = kinds[k] == FW_LOCK
                         ? redsem_lock_open(cc, names[k], 2000, &ll)
                         : redsem_sem_open(cc, names[k], (redsem_strategy)kinds[k], 1, 2000, &ss);
            if (rc == REDSEM_OK)
                rc = fh_acquire(ss, ll, 3000, &pp);
            if (rc == REDSEM_OK)
                rc = redsem_permit_release(pp);
            _exit(rc == REDSEM_OK ? 0 : 1);
        }
        fw_sleep_ns(200 * 1000000LL);
        cr_assert_eq(fh_acquire(ws, wl, 0, &q), REDSEM_EBUSY);
        cr_assert_eq(redsem_permit_release(p), REDSEM_OK);
        int status;
        waitpid(pid, &status, 0);
        cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the waiter did not get it");
        if (s)
            cr_assert_eq(redsem_sem_set_limit(s, 2), REDSEM_OK);
        redsem_permit_free(p);
        redsem_sem_free(s);
        redsem_sem_free(ws);
        redsem_lock_free(l);
        redsem_lock_free(wl);
    }
    redsem_client_free(c);
    redsem_client_free(w);
    fw_sleep_ns(300 * 1000000LL);
    atomic_store(&m.stop, 1);
    pthread_join(t, NULL);
    redisFree(m.rc);

    int wrong = 0, total = 0;
    for (int k = 0; k < 4; k++) {
        unsigned want = crc16(names[k], strlen(names[k])) & 16383;
        int seen = 0;
        char list[2048] = "";
        for (size_t i = 0; i < m.nkeys; i++) {
            char tag[64];
            snprintf(tag, sizeof tag, "redsem:{%s}", names[k]);
            if (strncmp(m.keys[i], tag, strlen(tag)) != 0)
                continue;
            seen++;
            unsigned got = slot_of(m.keys[i], strlen(m.keys[i]));
            if (got != want) {
                wrong++;
                fprintf(stderr, "  %s: slot %u, expected %u\n", m.keys[i], got, want);
            }
            const char *suffix = m.keys[i] + strlen(tag);
            if (strlen(list) + strlen(suffix) + 2 < sizeof list) {
                strcat(list, " ");
                strcat(list, strncmp(suffix, ":signal:", 8) == 0 ? ":signal:<id>" : suffix);
            }
        }
        total += seen;
        fprintf(stderr, "  %-11s slot %5u: %d keys:%s\n", names[k], want, seen, list);
        cr_expect_geq(seen, 3, "too few keys of %s were seen", names[k]);
    }
    fprintf(stderr, "SCENARIO 14 slots: %d keys touched by every operation of the three "
                    "strategies and the lock: %d outside their name's slot\n",
            total, wrong);
    cr_expect_eq(wrong, 0);
    free(m.keys);
    fh_teardown(&r);
}
