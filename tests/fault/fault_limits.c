/* The documented limits, reproduced (docs/guarantees.md, "Limits"):
 * - failover with asynchronous replication: a replica promoted before it received a grant
 *   forgets it, and the limit is exceeded; the same failover after the grant reached the
 *   replica keeps it;
 * - server clock jumps: the server judges leases by its wall clock; a forward jump ends every
 *   lease at once (two holders of a lock), a backward jump makes leases last longer (no
 *   overlap; permits free later); fencing tokens keep increasing either way;
 * (restart without persistence: fault_restart.c, at_once_*; eviction: fault_errors.c,
 * maxmemory_allkeys_lru_*.) */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define LEASE_MS 5000

static int link_up(const ts_server *replica)
{
    char out[64];
    for (int i = 0; i < 500; i++) {
        struct timeval tv = {2, 0};
        redisContext *rc = redisConnectUnixWithTimeout(replica->sock, tv);
        if (rc && !rc->err) {
            redisReply *r = redisCommand(rc, "INFO replication");
            bool up = r && r->str && strstr(r->str, "master_link_status:up");
            freeReplyObject(r);
            redisFree(rc);
            if (up)
                return 0;
        } else if (rc) {
            redisFree(rc);
        }
        fw_sleep_ns(10 * 1000000LL);
    }
    (void)out;
    return -1;
}

static void failover(bool replica_lags)
{
    fh_run r;
    fh_setup(&r, replica_lags ? "failover-lagging-replica" : "failover-synced-replica",
             FW_LOCK, 1, LEASE_MS, NULL, true);
    static char port[16];
    snprintf(port, sizeof port, "%d", r.srv.port);
    const char *args[] = {"--replicaof", "127.0.0.1", port, NULL};
    ts_server replica;
    cr_assert_eq(ts_server_start(&replica, args, false), 0);
    cr_assert_eq(link_up(&replica), 0, "the replica never synced");
    redsem_client *a = fh_client(r.srv.url, 0, -1);
    redsem_lock *la = NULL;
    cr_assert_eq(redsem_lock_open(a, r.name, LEASE_MS, &la), REDSEM_OK);
    /* Lagging: the replica loses its replication link just before the grant and the primary
     * dies just after: the grant never reaches the replica. The link is cut by pointing the
     * replica at a port where nothing listens (it keeps its data and cannot resync behind our
     * back, as it could after a CLIENT KILL from its once-a-second cron). Pausing the replica
     * would not do: its kernel keeps receiving the stream, which it reads on resume. */
    if (replica_lags)
        cr_assert_eq(ts_command(&replica, NULL, 0, "REPLICAOF", "127.0.0.1", "1", NULL), 0);
    redsem_permit *pa = NULL;
    cr_assert_eq(redsem_lock_try_acquire(la, &pa), REDSEM_OK);
    if (!replica_lags)
        cr_assert_eq(ts_command(&r.srv, NULL, 0, "WAIT", "1", "1000", NULL), 0);
    ts_server_kill(&r.srv); /* the primary dies */
    cr_assert_eq(ts_command(&replica, NULL, 0, "REPLICAOF", "NO", "ONE", NULL), 0);
    redsem_client *b = fh_client(replica.url, 0, -1);
    redsem_lock *lb = NULL;
    cr_assert_eq(redsem_lock_open(b, r.name, LEASE_MS, &lb), REDSEM_OK);
    redsem_permit *pb = NULL;
    int rc = redsem_lock_try_acquire(lb, &pb);
    bool both = rc == REDSEM_OK && redsem_permit_held(pa);
    fprintf(stderr, "LIMIT failover, %s: after the promotion a second client's try-acquire "
                    "gave %s; %s (tokens %llu then %llu)\n",
            replica_lags ? "the grant had not reached the replica"
                         : "the grant had reached the replica (WAIT 1)",
            redsem_err_name(rc),
            both ? "TWO HOLDERS of a lock: the limit is exceeded" : "the limit holds",
            (unsigned long long)redsem_permit_token(pa),
            (unsigned long long)redsem_permit_token(pb));
    if (replica_lags) {
        cr_expect(both, "expected the documented limit to show: %s", redsem_err_name(rc));
        cr_expect_gt(redsem_permit_token(pb), redsem_permit_token(pa),
                     "fencing tokens still increase (the server's clock)");
    } else {
        cr_expect_eq(rc, REDSEM_EBUSY);
    }
    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_lock_free(la);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(b);
    ts_server_stop(&replica);
    fh_teardown(&r);
}

Test(limits, failover_with_a_lagging_replica_forgets_a_grant, .timeout = 60) { failover(true); }
Test(limits, failover_with_a_synced_replica_keeps_it, .timeout = 60) { failover(false); }

/* ------------------------------------------------------------------ clock jumps */

static void clock_jump(fw_kind kind, int64_t jump_s)
{
    const char *shim = getenv("REDSEM_CLOCKSHIFT_LIB");
    if (shim == NULL || access(shim, R_OK) != 0)
        cr_skip_test("SKIP: REDSEM_CLOCKSHIFT_LIB is not set (run through meson test)");
    char label[64];
    snprintf(label, sizeof label, "clock-%s-%+llds", fw_kind_name(kind), (long long)jump_s);
    /* the shim reads the offset from this file; redis-server inherits the environment */
    char path[] = "/tmp/redsem-clockshift-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, sizeof(int64_t)), 0);
    volatile int64_t *shift = mmap(NULL, sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED,
                                   fd, 0);
    close(fd);
    cr_assert(shift != MAP_FAILED);
    setenv("REDSEM_CLOCKSHIFT_FILE", path, 1);
    setenv("LD_PRELOAD", shim, 1);
    fh_run r;
    fh_setup(&r, label, kind, 1, LEASE_MS, NULL, false);
    unsetenv("LD_PRELOAD");
    redsem_client *a = fh_client(r.srv.url, -1, -1), *b = fh_client(r.srv.url, -1, -1);
    redsem_sem *sa = NULL, *sb = NULL;
    redsem_lock *la = NULL, *lb = NULL;
    fh_open(&r, a, &sa, &la);
    fh_open(&r, b, &sb, &lb);
    redsem_permit *pa = NULL, *pb = NULL;
    cr_assert_eq(fh_acquire(sa, la, 0, &pa), REDSEM_OK);
    *shift = jump_s * 1000000; /* the server's clock jumps */
    int rc = fh_acquire(sb, lb, 0, &pb);
    bool overlap = rc == REDSEM_OK && redsem_permit_held(pa);
    int64_t a_valid = redsem_permit_validity_ms(pa);
    int rc_ref = redsem_permit_refresh(pa);
    fprintf(stderr, "LIMIT %s: holder A valid for %lld ms more by its own clock; after the "
                    "server's clock jumped %+llds, B's try-acquire gave %s (%s); A's refresh "
                    "then gave %s; tokens %llu then %llu\n",
            label, (long long)a_valid, (long long)jump_s,
            redsem_err_name(rc), overlap ? "TWO HOLDERS: the limit is exceeded" : "no overlap",
            redsem_err_name(rc_ref), (unsigned long long)redsem_permit_token(pa),
            (unsigned long long)redsem_permit_token(pb));
    if (jump_s > LEASE_MS / 1000) {
        cr_expect(overlap, "a forward jump beyond the lease should end A's lease at once");
        cr_expect_eq(rc_ref, REDSEM_ELOST, "A's refresh must then say lost");
        cr_expect_gt(redsem_permit_token(pb), redsem_permit_token(pa));
    } else {
        cr_expect_eq(rc, REDSEM_EBUSY, "a backward jump must not end A's lease");
        cr_expect_eq(rc_ref, REDSEM_OK);
        /* tokens still increase after a backward jump: max(last + 1, clock) */
        cr_assert_eq(redsem_permit_release(pa), REDSEM_OK);
        cr_assert_eq(fh_acquire(sb, lb, 0, &pb), REDSEM_OK);
        cr_expect_gt(redsem_permit_token(pb), redsem_permit_token(pa),
                     "a token after a backward jump must still be higher");
        fprintf(stderr, "LIMIT %s: after A's release B got token %llu > %llu\n", label,
                (unsigned long long)redsem_permit_token(pb),
                (unsigned long long)redsem_permit_token(pa));
    }
    redsem_permit_free(pa);
    redsem_permit_free(pb);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_lock_free(la);
    redsem_lock_free(lb);
    redsem_client_free(a);
    redsem_client_free(b);
    fh_teardown(&r);
    munmap((void *)shift, sizeof(int64_t));
    unlink(path);
}

Test(limits, clock_jump_forward_lock, .timeout = 60) { clock_jump(FW_LOCK, 60); }
Test(limits, clock_jump_forward_fair, .timeout = 60) { clock_jump(FW_FAIR, 60); }
Test(limits, clock_jump_forward_basic, .timeout = 60) { clock_jump(FW_BASIC, 60); }
Test(limits, clock_jump_back_lock, .timeout = 60) { clock_jump(FW_LOCK, -3600); }
Test(limits, clock_jump_back_fair, .timeout = 60) { clock_jump(FW_FAIR, -3600); }
