/* fault-worker: one contender of the fault suite, linking only redsem's public API.
 *
 * Loop: acquire (with an identifier of its own, logged before the call, so that an unknown
 * outcome can be traced on the server), enter the critical section (witness counter, fenced
 * write, mutex register read), hold for a random time while watching its validity (renewed
 * in the background with --renew), leave (register write if still valid, fenced write,
 * witness decrement), then, if the lease was lost, refresh (which must say lost), and
 * release. Every step goes to the worker's event log with a CLOCK_MONOTONIC timestamp.
 *
 *   fault-worker --url URL --kind basic|fair|locked|lock --name NAME --limit N --lease MS
 *                --shm FILE --slot I --log FILE [--hold-min-us U] [--hold-max-us U]
 *                [--count N] [--duration-ms MS] [--timeout-ms MS] [--renew]
 *                [--cmd-timeout-ms MS] [--retry-ms MS] [--register] [--think-us U]
 *                [--guard-lease-ms MS] [--wait-lease-ms MS]
 * Exit status 0; 2 on a usage error; 3 if it could not set up. */
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"

static struct {
    const char *url, *name, *shm, *log;
    fw_kind kind;
    uint32_t limit;
    int64_t lease_ms, hold_min_us, hold_max_us, count, duration_ms, timeout_ms;
    int64_t cmd_timeout_ms, retry_ms, think_us, guard_lease_ms, wait_lease_ms;
    int slot;
    bool renew, reg;
} o = {.limit = 1, .lease_ms = 1000, .hold_max_us = 3000, .timeout_ms = 2000,
       .cmd_timeout_ms = -1, .retry_ms = -1, .guard_lease_ms = -1, .wait_lease_ms = -1,
       .slot = -1};

static volatile sig_atomic_t term;
static _Atomic int lost_reason;
static _Atomic int64_t lost_at;
static uint64_t rng;

static void on_term(int sig)
{
    (void)sig;
    term = 1;
}

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int64_t rnd_between(int64_t lo, int64_t hi)
{
    return hi <= lo ? lo : lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}

static void on_lost(redsem_permit *p, redsem_lost_reason why, void *ud)
{
    (void)p;
    (void)ud;
    atomic_store(&lost_at, fw_now_ns());
    atomic_store(&lost_reason, (int)why);
}

static void usage(void)
{
    fprintf(stderr, "usage: fault-worker --url URL --kind KIND --name NAME --shm FILE --slot I "
                    "--log FILE [options]\n");
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
        {"guard-lease-ms", 1, 0, 'q'}, {"wait-lease-ms", 1, 0, 'w'}, {0, 0, 0, 0}};
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
        case 'r': o.renew = true; break;
        case 'T': o.cmd_timeout_ms = strtoll(optarg, NULL, 10); break;
        case 'R': o.retry_ms = strtoll(optarg, NULL, 10); break;
        case 'G': o.reg = true; break;
        case 'h': o.think_us = strtoll(optarg, NULL, 10); break;
        case 'q': o.guard_lease_ms = strtoll(optarg, NULL, 10); break;
        case 'w': o.wait_lease_ms = strtoll(optarg, NULL, 10); break;
        default: usage();
        }
    }
    if (!o.url || !o.name || !o.shm || !o.log || !o.kind || o.slot < 0 ||
        o.slot >= FW_MAX_SLOTS)
        usage();
}

static redsem_client *connect_client(fw_log *lg, fw_shared *sh)
{
    redsem_options *opt = NULL;
    if (redsem_options_new(&opt) != REDSEM_OK || redsem_options_set_url(opt, o.url) != REDSEM_OK)
        exit(3);
    if (o.cmd_timeout_ms > 0)
        (void)redsem_options_set_command_timeout_ms(opt, o.cmd_timeout_ms);
    if (o.retry_ms >= 0)
        (void)redsem_options_set_retry_ms(opt, o.retry_ms);
    redsem_client *c = NULL;
    for (;;) {
        char err[256] = "";
        int rc = redsem_client_new_verbose(opt, &c, err, sizeof err);
        if (rc == REDSEM_OK)
            break;
        fw_emit(lg, EV_ERR, "connect", 0, rc, fw_now_ns(), 0);
        if (term || atomic_load(&sh->stop))
            exit(0);
        fw_sleep_ns(20 * 1000000LL);
    }
    redsem_options_free(opt);
    return c;
}

int main(int argc, char **argv)
{
    parse(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    rng = (uint64_t)getpid() * 0x9E3779B97F4A7C15ULL ^ (uint64_t)fw_now_ns();
    if (rng == 0)
        rng = 1;
    fw_shared *sh = fw_shared_open(o.shm);
    fw_log lg;
    if (sh == NULL || fw_log_open(&lg, o.log, o.slot) != 0) {
        perror("fault-worker: shm/log");
        return 3;
    }
    fw_slot *me = &sh->slot[o.slot];
    atomic_store(&me->pid, (int)getpid());
    fw_emit(&lg, EV_START, o.name, 0, 0, getpid(), 0);

    redsem_client *c = connect_client(&lg, sh);
    redsem_sem *sem = NULL;
    redsem_lock *lock = NULL;
    for (;;) {
        int rc;
        if (o.kind == FW_LOCK)
            rc = redsem_lock_open(c, o.name, o.lease_ms, &lock);
        else
            rc = redsem_sem_open(c, o.name, (redsem_strategy)o.kind, o.limit, o.lease_ms, &sem);
        if (rc == REDSEM_OK)
            break;
        fw_emit(&lg, EV_ERR, "open", 0, rc, fw_now_ns(), 0);
        fprintf(stderr, "fault-worker %d: open: %s: %s\n", o.slot, redsem_err_name(rc),
                redsem_client_errmsg(c));
        if (term || atomic_load(&sh->stop) || rc == REDSEM_EINVAL)
            return 3;
        fw_sleep_ns(20 * 1000000LL);
    }
    if (sem && o.guard_lease_ms > 0)
        (void)redsem_sem_set_guard_lease_ms(sem, o.guard_lease_ms);
    if (sem && o.wait_lease_ms > 0)
        (void)redsem_sem_set_wait_lease_ms(sem, o.wait_lease_ms);

    redsem_client_stats base = {0};
    bool have_base = false;
    int64_t end = o.duration_ms > 0 ? fw_now_ns() + o.duration_ms * 1000000LL : 0;
    int64_t done = 0;
    while (!term && !atomic_load(&sh->stop) && (o.count == 0 || done < o.count) &&
           (end == 0 || fw_now_ns() < end)) {
        char id[REDSEM_ID_BUFSIZE];
        redsem_id_generate(id);
        memcpy(me->id, id, sizeof id);
        atomic_store(&me->in_acquire, 1);
        fw_emit(&lg, EV_REQ, id, 0, 0, o.timeout_ms, 0);
        int64_t t0 = fw_now_ns();
        redsem_permit *p = NULL;
        int rc = lock ? redsem_lock_acquire_as(lock, id, o.timeout_ms, &p)
                      : redsem_sem_acquire_as(sem, id, o.timeout_ms, &p);
        atomic_store(&me->in_acquire, 0);
        if (rc == REDSEM_EUNKNOWN) {
            fw_emit(&lg, EV_UNK, id, 0, rc, t0, 0);
            continue;
        }
        if (rc == REDSEM_EBUSY) {
            fw_emit(&lg, EV_BUSY, id, 0, rc, t0, 0);
            continue;
        }
        if (rc != REDSEM_OK) {
            fw_emit(&lg, EV_ERR, id, 0, rc, t0, 0);
            fprintf(stderr, "fault-worker %d: acquire: %s: %s\n", o.slot, redsem_err_name(rc),
                    redsem_client_errmsg(c));
            fw_sleep_ns(10 * 1000000LL);
            continue;
        }
        uint64_t tok = redsem_permit_token(p);
        int64_t dl = redsem_permit_deadline_ms(p) * 1000000LL;
        fw_emit(&lg, EV_ACQ, id, tok, 0, dl, 0);
        atomic_store(&lost_reason, 0);
        if (o.renew) {
            rc = redsem_permit_auto_renew(p, 0, on_lost, NULL);
            if (rc != REDSEM_OK)
                fw_emit(&lg, EV_ERR, "auto_renew", tok, rc, fw_now_ns(), 0);
        }
        fw_witness_enter(sh, o.slot, tok, dl);
        bool held0 = redsem_permit_held(p);
        int acc = fw_fence_write(sh, tok, held0);
        fw_emit(&lg, EV_FWR, id, tok, 0, acc, held0);
        atomic_store(&me->wrote, 1);
        uint64_t reg = o.reg ? sh->reg : 0;

        int64_t hold_end = fw_now_ns() + rnd_between(o.hold_min_us, o.hold_max_us) * 1000;
        bool lost = false;
        int64_t dl_logged = dl;
        for (;;) {
            dl = redsem_permit_deadline_ms(p) * 1000000LL;
            atomic_store(&me->deadline_ns, dl);
            if (dl - dl_logged >= o.lease_ms * 100000LL) { /* moved by a tenth of the lease */
                fw_emit(&lg, EV_DL, id, tok, 0, dl, 0);
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
        fw_emit(&lg, EV_CHK, id, tok, 0, held, dl);
        if (!held) {
            int why = atomic_load(&lost_reason);
            fw_emit(&lg, EV_LOST, id, tok, 0, why ? why : 3, dl);
        }
        if (o.reg && held) {
            sh->reg = reg + 1;
            atomic_fetch_add(&sh->reg_sections, 1);
        }
        /* The effect at the end of the section, written whether or not the lease lasted: a
         * paused holder resumes here and must be refused by the fenced register. */
        acc = fw_fence_write(sh, tok, held && redsem_permit_held(p));
        fw_emit(&lg, EV_FWR, id, tok, 0, acc, held);
        fw_witness_leave(sh, o.slot);
        fw_emit(&lg, EV_END, id, tok, 0, dl, 0);
        if (!held) {
            rc = redsem_permit_refresh(p);
            fw_emit(&lg, EV_RFR, id, tok, rc, 0, 0);
        }
        rc = redsem_permit_release(p);
        fw_emit(&lg, EV_REL, id, tok, rc, 0, 0);
        if (rc != REDSEM_OK && rc != REDSEM_ELOST)
            fprintf(stderr, "fault-worker %d: release: %s: %s\n", o.slot, redsem_err_name(rc),
                    redsem_client_errmsg(c));
        redsem_permit_free(p);
        done++;
        if (!have_base) { /* after the first section every script this loop uses is loaded */
            redsem_client_get_stats(c, &base);
            have_base = true;
        }
        if (o.think_us > 0)
            fw_sleep_ns(rnd_between(0, o.think_us) * 1000);
    }
    redsem_client_stats st;
    redsem_client_get_stats(c, &st);
    if (have_base)
        fw_emit(&lg, EV_STATS, "stats", st.noscript - base.noscript,
                (int)(st.retries - base.retries), (int64_t)(st.script_loads - base.script_loads),
                (int64_t)(st.requests - base.requests));
    fw_emit(&lg, EV_EXIT, o.name, 0, 0, done, 0);
    redsem_sem_free(sem);
    redsem_lock_free(lock);
    redsem_client_free(c);
    fw_log_close(&lg);
    fw_shared_unmap(sh);
    return 0;
}
