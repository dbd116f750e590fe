/* fault-worker: contenders of the fault suite, linking only redsem's public API.
 *
 * Loop: acquire (with an identifier of its own, logged before the call, so that an unknown
 * outcome can be traced on the server), enter the critical section (witness counter, fenced
 * write, mutex register read), hold for a random time while watching its validity (renewed
 * in the background with --renew), leave (register write if still valid, fenced write,
 * witness decrement), then, if the lease was lost, refresh (which must say lost), and
 * release. Every step goes to the worker's event log with a CLOCK_MONOTONIC timestamp.
 *
 * With --threads N (default 1) N threads run that loop at once, sharing ONE client and one
 * semaphore or lock handle (issue 10): thread i is the contender of witness slot SLOT+i and
 * logs to DIR/wNNN.log (NNN = its slot, the runner's naming; --log-dir DIR, required with
 * N > 1), so the checker sees each thread as a holder of its own. --renew-threads M: only
 * threads 0..M-1 renew (--renew: all), holding for --renew-hold-min-us..--renew-hold-max-us
 * when given (the others: --hold-min-us..--hold-max-us). --same-id-after-unknown: an acquire that returned
 * REDSEM_EUNKNOWN is retried with the same identifier (idempotent: it returns the grant if
 * the first one was applied). --fork-probe-ms MS: the main thread forks a child MS after the
 * start, while the threads contend; the child checks that every call on the inherited
 * handles returns REDSEM_EFORKED and that freeing them returns (logged as a NOTE "fork":
 * rc 0 good, else the child's status; a = REDSEM_EFORKED replies seen).
 *
 *   fault-worker --url URL --kind basic|fair|locked|lock --name NAME --limit N --lease MS
 *                --shm FILE --slot I (--log FILE | --log-dir DIR) [--threads N]
 *                [--hold-min-us U] [--hold-max-us U]
 *                [--count N] [--duration-ms MS] [--timeout-ms MS] [--renew]
 *                [--renew-threads M] [--renew-hold-min-us U] [--renew-hold-max-us U]
 *                [--same-id-after-unknown] [--fork-probe-ms MS]
 *                [--cmd-timeout-ms MS] [--retry-ms MS] [--register] [--think-us U]
 *                [--guard-lease-ms MS] [--wait-lease-ms MS] [--sync-replicas N]
 * --count and --duration-ms are per thread. Exit status 0; 2 on a usage error; 3 if it could
 * not set up. */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"

#define FW_MAX_THREADS 64

static struct {
    const char *url, *name, *shm, *log, *log_dir;
    fw_kind kind;
    uint32_t limit;
    int64_t lease_ms, hold_min_us, hold_max_us, count, duration_ms, timeout_ms;
    int64_t cmd_timeout_ms, retry_ms, think_us, guard_lease_ms, wait_lease_ms, fork_probe_ms;
    int64_t renew_hold_min_us, renew_hold_max_us;
    int slot, threads, renew_threads, sync_replicas;
    bool reg, same_id;
} o = {.limit = 1, .lease_ms = 1000, .hold_max_us = 3000, .timeout_ms = 2000,
       .cmd_timeout_ms = -1, .retry_ms = -1, .guard_lease_ms = -1, .wait_lease_ms = -1,
       .slot = -1, .threads = 1};

/* One contender: a thread of its own (or the main thread when there is one). */
typedef struct contender {
    int slot;
    bool renew;
    fw_log lg;
    uint64_t rng;
    _Atomic int lost_reason;
    _Atomic int64_t lost_at;
    int64_t done;
    pthread_t th;
} contender;

/* What the contenders share: the one client and handle, the witnesses, the stop signal. */
static volatile sig_atomic_t term;
static fw_shared *sh;
static redsem_client *c;
static redsem_sem *sem;
static redsem_lock *lock;
static redsem_client_stats base;
static _Atomic int have_base;

static void on_term(int sig)
{
    (void)sig;
    term = 1;
}

static uint64_t rnd(contender *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

static int64_t rnd_between(contender *w, int64_t lo, int64_t hi)
{
    return hi <= lo ? lo : lo + (int64_t)(rnd(w) % (uint64_t)(hi - lo + 1));
}

static void on_lost(redsem_permit *p, redsem_lost_reason why, void *ud)
{
    (void)p;
    contender *w = ud;
    atomic_store(&w->lost_at, fw_now_ns());
    atomic_store(&w->lost_reason, (int)why);
}

static void usage(void)
{
    fprintf(stderr, "usage: fault-worker --url URL --kind KIND --name NAME --shm FILE --slot I "
                    "(--log FILE | --log-dir DIR) [options]\n");
    exit(2);
}

static void parse(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", 1, 0, 'u'},         {"kind", 1, 0, 'k'},          {"name", 1, 0, 'n'},
        {"limit", 1, 0, 'L'},       {"lease", 1, 0, 'l'},         {"shm", 1, 0, 's'},
        {"slot", 1, 0, 'i'},        {"log", 1, 0, 'g'},           {"hold-min-us", 1, 0, 'a'},
        {"hold-max-us", 1, 0, 'b'}, {"count", 1, 0, 'c'},         {"duration-ms", 1, 0, 'd'},
        {"timeout-ms", 1, 0, 't'},  {"renew", 0, 0, 'r'},         {"cmd-timeout-ms", 1, 0, 'T'},
        {"retry-ms", 1, 0, 'R'},    {"register", 0, 0, 'G'},      {"think-us", 1, 0, 'h'},
        {"guard-lease-ms", 1, 0, 'q'}, {"wait-lease-ms", 1, 0, 'w'}, {"threads", 1, 0, 'N'},
        {"log-dir", 1, 0, 'D'},     {"renew-threads", 1, 0, 'M'},
        {"same-id-after-unknown", 0, 0, 'U'}, {"fork-probe-ms", 1, 0, 'F'},
        {"renew-hold-min-us", 1, 0, 'x'}, {"renew-hold-max-us", 1, 0, 'y'},
        {"sync-replicas", 1, 0, 'S'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'u': o.url = optarg; break;
        case 'k': if (fw_kind_parse(optarg, &o.kind) != 0) usage(); break;
        case 'n': o.name = optarg; break;
        case 'L': o.limit = (uint32_t)strtoul(optarg, NULL, 10); break;
        case 'l': o.lease_ms = strtoll(optarg, NULL, 10); break;
        case 's': o.shm = optarg; break;
        case 'i': o.slot = atoi(optarg); break;
        case 'g': o.log = optarg; break;
        case 'a': o.hold_min_us = strtoll(optarg, NULL, 10); break;
        case 'b': o.hold_max_us = strtoll(optarg, NULL, 10); break;
        case 'c': o.count = strtoll(optarg, NULL, 10); break;
        case 'd': o.duration_ms = strtoll(optarg, NULL, 10); break;
        case 't': o.timeout_ms = strtoll(optarg, NULL, 10); break;
        case 'r': o.renew_threads = FW_MAX_THREADS; break;
        case 'T': o.cmd_timeout_ms = strtoll(optarg, NULL, 10); break;
        case 'R': o.retry_ms = strtoll(optarg, NULL, 10); break;
        case 'G': o.reg = true; break;
        case 'h': o.think_us = strtoll(optarg, NULL, 10); break;
        case 'q': o.guard_lease_ms = strtoll(optarg, NULL, 10); break;
        case 'w': o.wait_lease_ms = strtoll(optarg, NULL, 10); break;
        case 'N': o.threads = atoi(optarg); break;
        case 'D': o.log_dir = optarg; break;
        case 'M': o.renew_threads = atoi(optarg); break;
        case 'U': o.same_id = true; break;
        case 'F': o.fork_probe_ms = strtoll(optarg, NULL, 10); break;
        case 'x': o.renew_hold_min_us = strtoll(optarg, NULL, 10); break;
        case 'y': o.renew_hold_max_us = strtoll(optarg, NULL, 10); break;
        case 'S': o.sync_replicas = atoi(optarg); break;
        default: usage();
        }
    }
    if (!o.url || !o.name || !o.shm || !o.kind || o.slot < 0 || o.threads < 1 ||
        o.threads > FW_MAX_THREADS || o.slot + o.threads > FW_MAX_SLOTS ||
        (o.threads == 1 ? !o.log && !o.log_dir : !o.log_dir))
        usage();
}

static int open_log(contender *w)
{
    char path[1024];
    if (o.threads == 1 && o.log)
        snprintf(path, sizeof path, "%s", o.log);
    else
        snprintf(path, sizeof path, "%s/w%03d.log", o.log_dir, w->slot);
    return fw_log_open(&w->lg, path, w->slot);
}

static redsem_client *connect_client(fw_log *lg)
{
    redsem_options *opt = NULL;
    if (redsem_options_new(&opt) != REDSEM_OK || redsem_options_set_url(opt, o.url) != REDSEM_OK)
        exit(3);
    if (o.cmd_timeout_ms > 0)
        (void)redsem_options_set_command_timeout_ms(opt, o.cmd_timeout_ms);
    if (o.retry_ms >= 0)
        (void)redsem_options_set_retry_ms(opt, o.retry_ms);
    if (o.sync_replicas > 0) /* WAIT after grants and refreshes, 300 ms */
        (void)redsem_options_set_sync_replicas(opt, o.sync_replicas, 300);
    redsem_client *cl = NULL;
    for (;;) {
        char err[256] = "";
        int rc = redsem_client_new_verbose(opt, &cl, err, sizeof err);
        if (rc == REDSEM_OK)
            break;
        fw_emit(lg, EV_ERR, "connect", 0, rc, fw_now_ns(), 0);
        if (term || atomic_load(&sh->stop))
            exit(0);
        fw_sleep_ns(20 * 1000000LL);
    }
    redsem_options_free(opt);
    return cl;
}

static bool keep_going(const contender *w, int64_t end)
{
    return !term && !atomic_load(&sh->stop) && (o.count == 0 || w->done < o.count) &&
           (end == 0 || fw_now_ns() < end);
}

/* The loop of one contender (see the top of the file). */
static void *contend(void *arg)
{
    contender *w = arg;
    fw_slot *me = &sh->slot[w->slot];
    int64_t end = o.duration_ms > 0 ? fw_now_ns() + o.duration_ms * 1000000LL : 0;
    char id[REDSEM_ID_BUFSIZE];
    bool reuse_id = false;
    while (keep_going(w, end)) {
        if (!reuse_id)
            redsem_id_generate(id);
        reuse_id = false;
        memcpy(me->id, id, sizeof id);
        atomic_store(&me->in_acquire, 1);
        fw_emit(&w->lg, EV_REQ, id, 0, 0, o.timeout_ms, 0);
        int64_t t0 = fw_now_ns();
        redsem_permit *p = NULL;
        int rc = lock ? redsem_lock_acquire_as(lock, id, o.timeout_ms, &p)
                      : redsem_sem_acquire_as(sem, id, o.timeout_ms, &p);
        atomic_store(&me->in_acquire, 0);
        if (rc == REDSEM_EUNKNOWN) {
            fw_emit(&w->lg, EV_UNK, id, 0, rc, t0, 0);
            reuse_id = o.same_id;
            continue;
        }
        if (rc == REDSEM_EBUSY) {
            fw_emit(&w->lg, EV_BUSY, id, 0, rc, t0, 0);
            continue;
        }
        if (rc != REDSEM_OK) {
            fw_emit(&w->lg, EV_ERR, id, 0, rc, t0, 0);
            fprintf(stderr, "fault-worker %d: acquire: %s: %s\n", w->slot, redsem_err_name(rc),
                    redsem_client_errmsg(c));
            fw_sleep_ns(10 * 1000000LL);
            continue;
        }
        uint64_t tok = redsem_permit_token(p);
        int64_t dl = redsem_permit_deadline_ms(p) * 1000000LL;
        fw_emit(&w->lg, EV_ACQ, id, tok, 0, dl, 0);
        atomic_store(&w->lost_reason, 0);
        if (w->renew) {
            rc = redsem_permit_auto_renew(p, 0, on_lost, w);
            if (rc != REDSEM_OK)
                fw_emit(&w->lg, EV_ERR, "auto_renew", tok, rc, fw_now_ns(), 0);
        }
        fw_witness_enter(sh, w->slot, tok, dl);
        bool held0 = redsem_permit_held(p);
        int acc = fw_fence_write(sh, tok, held0);
        fw_emit(&w->lg, EV_FWR, id, tok, 0, acc, held0);
        atomic_store(&me->wrote, 1);
        uint64_t reg = o.reg ? sh->reg : 0;

        int64_t hold_us = w->renew && o.renew_hold_max_us > 0
                              ? rnd_between(w, o.renew_hold_min_us, o.renew_hold_max_us)
                              : rnd_between(w, o.hold_min_us, o.hold_max_us);
        int64_t hold_end = fw_now_ns() + hold_us * 1000;
        bool lost = false;
        int64_t dl_logged = dl;
        for (;;) {
            dl = redsem_permit_deadline_ms(p) * 1000000LL;
            atomic_store(&me->deadline_ns, dl);
            if (dl - dl_logged >= o.lease_ms * 100000LL) { /* moved by a tenth of the lease */
                fw_emit(&w->lg, EV_DL, id, tok, 0, dl, 0);
                dl_logged = dl;
            }
            if (!redsem_permit_held(p)) {
                lost = true;
                break;
            }
            int64_t now = fw_now_ns();
            if (now >= hold_end)
                break;
            int64_t slice = hold_end - now < 2000000 ? hold_end - now : 2000000;
            fw_sleep_ns(slice);
        }
        bool held = !lost && redsem_permit_held(p);
        dl = redsem_permit_deadline_ms(p) * 1000000LL;
        fw_emit(&w->lg, EV_CHK, id, tok, 0, held, dl);
        if (!held) {
            int why = atomic_load(&w->lost_reason);
            fw_emit(&w->lg, EV_LOST, id, tok, 0, why ? why : 3, dl);
        }
        if (o.reg && held) {
            sh->reg = reg + 1;
            atomic_fetch_add(&sh->reg_sections, 1);
        }
        /* The effect at the end of the section, written whether or not the lease lasted: a
         * paused holder resumes here and must be refused by the fenced register. */
        acc = fw_fence_write(sh, tok, held && redsem_permit_held(p));
        fw_emit(&w->lg, EV_FWR, id, tok, 0, acc, held);
        fw_witness_leave(sh, w->slot);
        fw_emit(&w->lg, EV_END, id, tok, 0, dl, 0);
        if (!held) {
            rc = redsem_permit_refresh(p);
            fw_emit(&w->lg, EV_RFR, id, tok, rc, 0, 0);
        }
        rc = redsem_permit_release(p);
        fw_emit(&w->lg, EV_REL, id, tok, rc, 0, 0);
        if (rc != REDSEM_OK && rc != REDSEM_ELOST)
            fprintf(stderr, "fault-worker %d: release: %s: %s\n", w->slot, redsem_err_name(rc),
                    redsem_client_errmsg(c));
        redsem_permit_free(p);
        w->done++;
        /* after the first section every script this loop uses is loaded */
        int no = 0;
        if (atomic_compare_exchange_strong(&have_base, &no, 2)) {
            redsem_client_get_stats(c, &base);
            atomic_store(&have_base, 1);
        }
        if (o.think_us > 0)
            fw_sleep_ns(rnd_between(w, 0, o.think_us) * 1000);
    }
    return NULL;
}

/* In a child forked while the threads contend: every call on the inherited handles must say
 * REDSEM_EFORKED, and freeing them must return (another thread may have held a lock of the
 * client at the fork). Exit status 0 good, 1 a call did something else; SIGALRM: it hung. */
static void fork_child(void)
{
    alarm(5);
    int forked = 0, calls = 0;
    redsem_permit *p = NULL;
    int rc = lock ? redsem_lock_try_acquire(lock, &p) : redsem_sem_try_acquire(sem, &p);
    calls++;
    forked += rc == REDSEM_EFORKED;
    redsem_status *st = NULL;
    rc = lock ? redsem_lock_status(lock, 8, &st) : redsem_sem_status(sem, 8, &st);
    calls++;
    forked += rc == REDSEM_EFORKED;
    redsem_status_free(st);
    rc = redsem_client_ping(c);
    calls++;
    forked += rc == REDSEM_EFORKED;
    redsem_permit_free(p);
    redsem_sem_free(sem);
    redsem_lock_free(lock);
    redsem_client_free(c);
    _exit(forked == calls ? 0 : 1);
}

static void fork_probe(fw_log *lg)
{
    fw_sleep_ns(o.fork_probe_ms * 1000000LL);
    pid_t pid = fork();
    if (pid == 0)
        fork_child();
    int st = -1;
    if (pid > 0)
        waitpid(pid, &st, 0);
    int good = pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    fw_emit(lg, EV_NOTE, "fork", 0, good ? 0 : (st ? st : -1), 0, 0);
    if (!good)
        fprintf(stderr, "fault-worker %d: forked child: status %#x\n", o.slot, st);
}

int main(int argc, char **argv)
{
    parse(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sh = fw_shared_open(o.shm);
    static contender ws[FW_MAX_THREADS];
    for (int i = 0; i < o.threads; i++) {
        contender *w = &ws[i];
        w->slot = o.slot + i;
        w->renew = i < o.renew_threads;
        w->rng = ((uint64_t)getpid() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)fw_now_ns()) +
                 (uint64_t)i * 0xBF58476D1CE4E5B9ULL;
        if (w->rng == 0)
            w->rng = 1;
        if (sh == NULL || open_log(w) != 0) {
            perror("fault-worker: shm/log");
            return 3;
        }
        atomic_store(&sh->slot[w->slot].pid, (int)getpid());
        fw_emit(&w->lg, EV_START, o.name, 0, 0, getpid(), 0);
    }
    fw_log *lg = &ws[0].lg;

    c = connect_client(lg);
    for (;;) {
        int rc;
        if (o.kind == FW_LOCK)
            rc = redsem_lock_open(c, o.name, o.lease_ms, &lock);
        else
            rc = redsem_sem_open(c, o.name, (redsem_strategy)o.kind, o.limit, o.lease_ms, &sem);
        if (rc == REDSEM_OK)
            break;
        fw_emit(lg, EV_ERR, "open", 0, rc, fw_now_ns(), 0);
        fprintf(stderr, "fault-worker %d: open: %s: %s\n", o.slot, redsem_err_name(rc),
                redsem_client_errmsg(c));
        if (term || atomic_load(&sh->stop) || rc == REDSEM_EINVAL)
            return 3;
        fw_sleep_ns(20 * 1000000LL);
    }
    /* the handle setters, before the handle is shared (docs/threading.md) */
    if (sem && o.guard_lease_ms > 0)
        (void)redsem_sem_set_guard_lease_ms(sem, o.guard_lease_ms);
    if (sem && o.wait_lease_ms > 0)
        (void)redsem_sem_set_wait_lease_ms(sem, o.wait_lease_ms);

    if (o.threads == 1 && o.fork_probe_ms <= 0) {
        contend(&ws[0]); /* exactly the single-contender worker of before */
    } else {
        for (int i = 0; i < o.threads; i++) {
            if (pthread_create(&ws[i].th, NULL, contend, &ws[i]) != 0) {
                perror("fault-worker: pthread_create");
                atomic_store(&sh->stop, 1); /* wrong setup: the run's checks will say so */
                return 3;
            }
        }
        if (o.fork_probe_ms > 0)
            fork_probe(lg);
        for (int i = 0; i < o.threads; i++)
            pthread_join(ws[i].th, NULL);
    }
    redsem_client_stats st;
    redsem_client_get_stats(c, &st);
    if (atomic_load(&have_base) == 1)
        fw_emit(lg, EV_STATS, "stats", st.noscript - base.noscript,
                (int)(st.retries - base.retries), (int64_t)(st.script_loads - base.script_loads),
                (int64_t)(st.requests - base.requests));
    /* the pool's counters: token = waits for a request connection, a = connects, b = calls
     * written while other threads' calls were in flight on the shared connection */
    fw_emit(lg, EV_NOTE, "pool", st.pool_waits, 0, (int64_t)st.connects, (int64_t)st.pipelined);
    for (int i = 0; i < o.threads; i++)
        fw_emit(&ws[i].lg, EV_EXIT, o.name, 0, 0, ws[i].done, 0);
    redsem_sem_free(sem);
    redsem_lock_free(lock);
    redsem_client_free(c);
    for (int i = 0; i < o.threads; i++)
        fw_log_close(&ws[i].lg);
    fw_shared_unmap(sh);
    return 0;
}
