/* Fault suite: the runner side. See harness.h. */

#include "harness.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

bool fh_pinning(void)
{
    return sysconf(_SC_NPROCESSORS_ONLN) >= 2 && getenv("REDSEM_FAULT_NO_PIN") == NULL;
}

static void pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
}

void fh_setup(fh_run *r, const char *label, fw_kind kind, uint32_t limit, int64_t lease_ms,
              const char *const *server_args, bool tcp)
{
    memset(r, 0, sizeof *r);
    snprintf(r->label, sizeof r->label, "%s", label);
    snprintf(r->name, sizeof r->name, "%s-%ld", label, (long)getpid());
    for (char *p = r->name; *p; p++)
        if (*p == ' ' || *p == '{' || *p == '}')
            *p = '_';
    r->kind = kind;
    r->limit = limit;
    r->lease_ms = lease_ms;
    const char *tmp = getenv("TMPDIR");
    snprintf(r->dir, sizeof r->dir, "%s/redsem-fault-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(r->dir), "mkdtemp: %s", strerror(errno));
    char path[512];
    snprintf(path, sizeof path, "%s/witness.shm", r->dir);
    r->sh = fw_shared_create(path, limit);
    cr_assert_not_null(r->sh, "shared witnesses: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/runner.log", r->dir);
    cr_assert_eq(fw_log_open(&r->log, path, FH_RUNNER_SLOT), 0);
    if (fh_pinning())
        pin_self(1);
    if (server_args != (const char *const *)-1) {
        int rc = ts_server_start_pinned(&r->srv, server_args, tcp, fh_pinning() ? 0 : -1);
        if (rc == 77)
            cr_skip_test("redis-server is not installed");
        cr_assert_eq(rc, 0, "cannot start redis-server");
        r->have_server = true;
        snprintf(r->url, sizeof r->url, "%s", r->srv.url);
    }
    fprintf(stderr, "RUN %s: kind=%s limit=%u lease=%lld ms dir=%s\n", label,
            fw_kind_name(kind), limit, (long long)lease_ms, r->dir);
}

void fh_teardown(fh_run *r)
{
    fh_monitor_stop(r);
    for (int i = 0; i < r->nslots; i++) {
        if (r->pid[i] > 0) {
            kill(r->pid[i], SIGCONT);
            kill(r->pid[i], SIGKILL);
            waitpid(r->pid[i], NULL, 0);
            r->pid[i] = 0;
        }
    }
    fw_log_close(&r->log);
    if (r->have_server)
        ts_server_stop(&r->srv);
    r->have_server = false;
    fw_shared_unmap(r->sh);
    r->sh = NULL;
    free(r->samples);
    r->samples = NULL;
    const char *keep = getenv("REDSEM_FAULT_KEEP");
    if (keep && strcmp(keep, "1") == 0) {
        fprintf(stderr, "logs kept in %s\n", r->dir);
        return;
    }
    DIR *d = opendir(r->dir);
    if (d) {
        struct dirent *de;
        char path[600];
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", r->dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(r->dir);
}

int fh_spawn_threads(fh_run *r, const char *url, int threads, const char *const *extra)
{
    cr_assert(threads >= 1 && r->nslots + threads <= FH_RUNNER_SLOT, "too many workers");
    const char *bin = getenv("REDSEM_FAULT_WORKER");
    cr_assert_not_null(bin, "REDSEM_FAULT_WORKER is not set (run through meson test)");
    int slot = r->nslots;
    r->nslots += threads;
    char slotbuf[16], limbuf[16], leasebuf[32], thrbuf[16], shm[512], logp[512];
    snprintf(slotbuf, sizeof slotbuf, "%d", slot);
    snprintf(limbuf, sizeof limbuf, "%u", r->limit);
    snprintf(leasebuf, sizeof leasebuf, "%lld", (long long)r->lease_ms);
    snprintf(thrbuf, sizeof thrbuf, "%d", threads);
    snprintf(shm, sizeof shm, "%s/witness.shm", r->dir);
    snprintf(logp, sizeof logp, "%s/w%03d.log", r->dir, slot);
    const char *argv[96];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--url";
    argv[n++] = url ? url : r->url;
    argv[n++] = "--kind";
    argv[n++] = fw_kind_name(r->kind);
    argv[n++] = "--name";
    argv[n++] = r->name;
    argv[n++] = "--limit";
    argv[n++] = limbuf;
    argv[n++] = "--lease";
    argv[n++] = leasebuf;
    argv[n++] = "--shm";
    argv[n++] = shm;
    argv[n++] = "--slot";
    argv[n++] = slotbuf;
    if (threads == 1) {
        argv[n++] = "--log";
        argv[n++] = logp;
    } else { /* each thread logs to DIR/wNNN.log, NNN its slot */
        argv[n++] = "--threads";
        argv[n++] = thrbuf;
        argv[n++] = "--log-dir";
        argv[n++] = r->dir;
    }
    for (int i = 0; extra && extra[i] && n < 94; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        pid_t parent = getppid();
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    r->pid[slot] = pid;
    r->nthreads[slot] = threads;
    for (int i = 0; i < threads; i++)
        r->first[slot + i] = slot;
    return slot;
}

int fh_spawn(fh_run *r, const char *url, const char *const *extra)
{
    return fh_spawn_threads(r, url, 1, extra);
}

int fh_kill(fh_run *r, int slot)
{
    slot = r->first[slot];
    if (r->pid[slot] <= 0)
        return 0;
    kill(r->pid[slot], SIGKILL);
    int threads = r->nthreads[slot] > 0 ? r->nthreads[slot] : 1;
    for (int i = slot; i < slot + threads; i++)
        fw_emit(&r->log, EV_KILL, "-", atomic_load(&r->sh->slot[i].token), 0, i, 0);
    waitpid(r->pid[slot], NULL, 0);
    r->pid[slot] = 0;
    int inside = 0;
    for (int i = slot; i < slot + threads; i++)
        inside |= fw_witness_reap(r->sh, i);
    return inside;
}

void fh_stop(fh_run *r, int slot)
{
    pid_t pid = r->pid[r->first[slot]];
    kill(pid, SIGSTOP);
    int st;
    waitpid(pid, &st, WUNTRACED);
    fw_emit(&r->log, EV_STOP, "-", atomic_load(&r->sh->slot[slot].token), 0, slot, 0);
}

void fh_cont(fh_run *r, int slot)
{
    fw_emit(&r->log, EV_CONT, "-", atomic_load(&r->sh->slot[slot].token), 0, slot, 0);
    kill(r->pid[r->first[slot]], SIGCONT);
}

int fh_wait(fh_run *r, int64_t ms)
{
    int64_t until = fw_now_ns() + ms * 1000000LL;
    for (;;) {
        int running = 0;
        for (int i = 0; i < r->nslots; i++) {
            if (r->pid[i] <= 0)
                continue;
            int st;
            if (waitpid(r->pid[i], &st, WNOHANG) == r->pid[i]) {
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                    fprintf(stderr, "worker %d ended with status %#x\n", i, st);
                r->pid[i] = 0;
            } else {
                running++;
            }
        }
        if (running == 0 || fw_now_ns() >= until)
            return running;
        fw_sleep_ns(5000000);
    }
}

int fh_finish(fh_run *r, int64_t ms)
{
    atomic_store(&r->sh->stop, 1);
    int64_t until = fw_now_ns() + ms * 1000000LL;
    int killed = 0;
    for (int i = 0; i < r->nslots; i++) {
        if (r->pid[i] <= 0)
            continue;
        kill(r->pid[i], SIGCONT);
        for (;;) {
            int st;
            pid_t w = waitpid(r->pid[i], &st, WNOHANG);
            if (w == r->pid[i]) {
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                    fprintf(stderr, "worker %d ended with status %#x\n", i, st);
                break;
            }
            if (fw_now_ns() >= until) {
                fprintf(stderr, "worker %d did not finish in time: SIGKILL\n", i);
                fh_kill(r, i);
                killed++;
                break;
            }
            fw_sleep_ns(2000000);
        }
        r->pid[i] = 0;
    }
    return killed;
}

int fh_pick_holder(fh_run *r, int except, int64_t ms)
{
    int64_t until = fw_now_ns() + ms * 1000000LL;
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid();
    do {
        int cand[FW_MAX_SLOTS], n = 0;
        for (int i = 0; i < r->nslots; i++)
            if (i != except && r->pid[r->first[i]] > 0 && atomic_load(&r->sh->slot[i].active) &&
                atomic_load(&r->sh->slot[i].wrote))
                cand[n++] = i;
        if (n > 0)
            return cand[rand_r(&seed) % n];
        fw_sleep_ns(200000);
    } while (fw_now_ns() < until);
    return -1;
}

int64_t fh_wait_full(fh_run *r, int except, int64_t t0, int64_t timeout_ms)
{
    int64_t until = t0 + timeout_ms * 1000000LL;
    for (;;) {
        int64_t now = fw_now_ns();
        int live = 0;
        for (int i = 0; i < r->nslots; i++)
            if (i != except && atomic_load(&r->sh->slot[i].active) &&
                atomic_load(&r->sh->slot[i].wrote) &&
                atomic_load(&r->sh->slot[i].deadline_ns) > now)
                live++;
        if ((uint32_t)live >= r->limit)
            return now - t0;
        if (now >= until)
            return -1;
        fw_sleep_ns(500000);
    }
}

bool fh_wait_event(fh_run *r, int slot, int ev, uint64_t token, int64_t t_ns, int64_t ms,
                   fw_event *out)
{
    char path[512];
    snprintf(path, sizeof path, "%s/w%03d.log", r->dir, slot);
    int64_t until = fw_now_ns() + ms * 1000000LL;
    for (;;) {
        fw_event *v = NULL;
        ssize_t n = fw_log_read_file(path, &v);
        for (ssize_t i = 0; i < n; i++) {
            if (v[i].ev == ev && v[i].t_ns >= t_ns && (token == 0 || v[i].token == token)) {
                *out = v[i];
                free(v);
                return true;
            }
        }
        free(v);
        if (fw_now_ns() >= until)
            return false;
        fw_sleep_ns(2000000);
    }
}

void fh_note(fh_run *r, const char *fmt, ...)
{
    char buf[60];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fw_emit(&r->log, EV_NOTE, buf, 0, 0, 0, 0);
}

void fh_fault(fh_run *r, const char *label, bool begins)
{
    fw_emit(&r->log, EV_FAULT, label, 0, 0, begins, 0);
}

/* ------------------------------------------------------------------ clients */

redsem_client *fh_client(const char *url, int64_t retry_ms, int64_t cmd_timeout_ms)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK, "url %s", url);
    if (retry_ms >= 0)
        cr_assert_eq(redsem_options_set_retry_ms(o, retry_ms), REDSEM_OK);
    if (cmd_timeout_ms > 0)
        cr_assert_eq(redsem_options_set_command_timeout_ms(o, cmd_timeout_ms), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    int rc = redsem_client_new_verbose(o, &c, err, sizeof err);
    redsem_options_free(o);
    cr_assert_eq(rc, REDSEM_OK, "connect %s: %s %s", url, redsem_err_name(rc), err);
    return c;
}

void fh_open(fh_run *r, redsem_client *c, redsem_sem **s, redsem_lock **l)
{
    *s = NULL;
    *l = NULL;
    int rc;
    if (r->kind == FW_LOCK)
        rc = redsem_lock_open(c, r->name, r->lease_ms, l);
    else
        rc = redsem_sem_open(c, r->name, (redsem_strategy)r->kind, r->limit, r->lease_ms, s);
    cr_assert_eq(rc, REDSEM_OK, "open %s: %s %s", r->name, redsem_err_name(rc),
                 redsem_client_errmsg(c));
}

int fh_acquire(redsem_sem *s, redsem_lock *l, int64_t timeout_ms, redsem_permit **p)
{
    return s ? redsem_sem_acquire(s, timeout_ms, p) : redsem_lock_acquire(l, timeout_ms, p);
}

int fh_status(redsem_sem *s, redsem_lock *l, redsem_status **st)
{
    return s ? redsem_sem_status(s, 64, st) : redsem_lock_status(l, 64, st);
}

redisContext *fh_redis(fh_run *r)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectUnixWithTimeout(r->srv.sock, tv);
    cr_assert(c != NULL && !c->err, "hiredis connect %s", r->srv.sock);
    return c;
}

int fh_count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

/* ------------------------------------------------------------------ monitor */

static void *monitor(void *arg)
{
    fh_run *r = arg;
    redsem_options *o = NULL;
    redsem_client *c = NULL;
    if (redsem_options_new(&o) != REDSEM_OK || redsem_options_set_url(o, r->srv.url) != REDSEM_OK ||
        redsem_options_set_command_timeout_ms(o, 500) != REDSEM_OK ||
        redsem_client_new(o, &c) != REDSEM_OK) {
        redsem_options_free(o);
        return NULL;
    }
    redsem_options_free(o);
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    while (!atomic_load(&r->mon_stop)) {
        if (s == NULL && l == NULL) {
            int rc = r->kind == FW_LOCK
                         ? redsem_lock_open(c, r->name, r->lease_ms, &l)
                         : redsem_sem_open(c, r->name, (redsem_strategy)r->kind, r->limit,
                                           r->lease_ms, &s);
            if (rc != REDSEM_OK) {
                fw_sleep_ns(r->mon_interval_ns);
                continue;
            }
        }
        redsem_status *st = NULL;
        int64_t t = fw_now_ns();
        if (fh_status(s, l, &st) == REDSEM_OK) {
            int n = (int)redsem_status_holder_count(st);
            int m = atomic_load(&r->mon_max_holders);
            if (n > m)
                atomic_store(&r->mon_max_holders, n);
            atomic_fetch_add(&r->mon_polls, 1);
            if (r->mon_record) {
                for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
                    size_t k = atomic_load(&r->nsamples);
                    if (k >= FH_MAX_SAMPLES)
                        break;
                    const char *id = NULL;
                    int64_t left = 0;
                    redsem_status_holder(st, i, &id, NULL, &left);
                    r->samples[k].t_ns = t;
                    snprintf(r->samples[k].id, sizeof r->samples[k].id, "%s", id);
                    r->samples[k].remaining_ms = left;
                    atomic_store(&r->nsamples, k + 1);
                }
            }
            redsem_status_free(st);
        }
        fw_sleep_ns(r->mon_interval_ns);
    }
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_client_free(c);
    return NULL;
}

void fh_monitor_start(fh_run *r, int64_t interval_ms, bool record)
{
    r->mon_interval_ns = interval_ms * 1000000LL;
    r->mon_record = record;
    if (record)
        r->samples = calloc(FH_MAX_SAMPLES, sizeof *r->samples);
    atomic_store(&r->mon_stop, 0);
    cr_assert_eq(pthread_create(&r->mon, NULL, monitor, r), 0);
    r->mon_running = true;
}

void fh_monitor_stop(fh_run *r)
{
    if (!r->mon_running)
        return;
    atomic_store(&r->mon_stop, 1);
    pthread_join(r->mon, NULL);
    r->mon_running = false;
}

/* ------------------------------------------------------------------ checks */

void fh_check(fh_run *r, fw_check_result *res)
{
    fw_event *ev = NULL;
    ssize_t n = fw_logs_read(r->dir, &ev);
    cr_assert_geq(n, 0, "cannot read the logs in %s", r->dir);
    fw_check_params p = {.limit = r->limit, .lease_ms = r->lease_ms,
                         .drift_ms = r->lease_ms / 100 + 2};
    fw_check(ev, (size_t)n, &p, res);
    fw_check_print(r->label, res);
    free(ev);
    fw_shared *sh = r->sh;
    fprintf(stderr,
            "WITNESS %s: acquisitions=%llu max_occupancy=%d violations=%d stale_counted=%d "
            "register=%llu/%llu fenced accepted=%llu rejected=%llu stale_accepted=%llu "
            "stale_rejected=%llu monitor: max_holders=%d polls=%lld\n",
            r->label, (unsigned long long)atomic_load(&sh->acquisitions),
            atomic_load(&sh->max_occupancy), atomic_load(&sh->nviol), atomic_load(&sh->nstale),
            (unsigned long long)sh->reg, (unsigned long long)atomic_load(&sh->reg_sections),
            (unsigned long long)atomic_load(&sh->fence_accepted),
            (unsigned long long)atomic_load(&sh->fence_rejected),
            (unsigned long long)atomic_load(&sh->fence_stale_accepted),
            (unsigned long long)atomic_load(&sh->fence_stale_rejected),
            atomic_load(&r->mon_max_holders), (long long)atomic_load(&r->mon_polls));
    for (int i = 0; i < atomic_load(&sh->nviol) && i < FW_MAX_VIOL && i < 5; i++) {
        fw_violation *v = &sh->viol[i];
        fprintf(stderr, "  witness violation: slot %d token %llu with %d live:", v->slot,
                (unsigned long long)v->token, v->live);
        for (int k = 0; k < v->nothers; k++)
            fprintf(stderr, " slot %d token %llu", v->others[k],
                    (unsigned long long)v->other_tokens[k]);
        fprintf(stderr, "\n");
    }
}

static bool has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

void fh_quiescence(fh_run *r)
{
    fw_sleep_ns((r->lease_ms + 1000) * 1000000LL);
    redisContext *rc = fh_redis(r);
    char pattern[300];
    snprintf(pattern, sizeof pattern, "redsem:{%s}*", r->name);
    redisReply *keys = redisCommand(rc, "KEYS %s", pattern);
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY);
    size_t nokttl = 0;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "redsem:{%s}", r->name);
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *t = redisCommand(rc, "PTTL %b", keys->element[i]->str,
                                     (size_t)keys->element[i]->len);
        if (t->integer == -1) { /* -2: it expired since KEYS, which is fine */
            fprintf(stderr, "  key without TTL: %s (PTTL %lld)\n", keys->element[i]->str,
                    t->integer);
            nokttl++;
        }
        freeReplyObject(t);
    }
    /* consistency of the sets with the meta hash's tokens */
    size_t inconsistent = 0, live = 0;
    int64_t now_ms = 0;
    redisReply *tm = redisCommand(rc, "TIME");
    now_ms = atoll(tm->element[0]->str) * 1000 + atoll(tm->element[1]->str) / 1000;
    freeReplyObject(tm);
    if (r->kind != FW_LOCK) {
        const char *dz = r->kind == FW_BASIC ? ":holders" : ":timeouts";
        redisReply *m = redisCommand(rc, "HGETALL %s:meta", prefix);
        for (size_t i = 0; i + 1 < m->elements; i += 2) {
            const char *f = m->element[i]->str;
            if (!has_prefix(f, "t:"))
                continue;
            redisReply *d = redisCommand(rc, "ZSCORE %s%s %s", prefix, dz, f + 2);
            if (d->type != REDIS_REPLY_STRING) {
                fprintf(stderr, "  token without an entry: %s\n", f);
                inconsistent++;
            } else if (atoll(d->str) > now_ms) {
                live++;
            }
            freeReplyObject(d);
        }
        freeReplyObject(m);
        if (r->kind != FW_BASIC) {
            redisReply *a = redisCommand(rc, "ZCARD %s:owners", prefix);
            redisReply *b = redisCommand(rc, "ZCARD %s:timeouts", prefix);
            if (a->integer != b->integer) {
                fprintf(stderr, "  owners has %lld members, timeouts %lld\n", a->integer,
                        b->integer);
                inconsistent++;
            }
            freeReplyObject(a);
            freeReplyObject(b);
        }
    } else {
        redisReply *e = redisCommand(rc, "EXISTS %s:mutex", prefix);
        live = (size_t)e->integer;
        freeReplyObject(e);
    }
    freeReplyObject(keys);
    redisFree(rc);

    /* a fresh client gets exactly `limit` permits */
    redsem_client *c = fh_client(r->srv.url, -1, -1);
    redsem_sem *s = NULL;
    redsem_lock *l = NULL;
    fh_open(r, c, &s, &l);
    redsem_permit *p[64] = {0};
    uint32_t got = 0;
    int rc2 = REDSEM_OK;
    while (got < r->limit + 1 && got < 64) {
        rc2 = s ? redsem_sem_try_acquire(s, &p[got]) : redsem_lock_try_acquire(l, &p[got]);
        if (rc2 != REDSEM_OK)
            break;
        got++;
    }
    int rel_bad = 0;
    for (uint32_t i = 0; i < got; i++) {
        rel_bad += redsem_permit_release(p[i]) != REDSEM_OK;
        redsem_permit_free(p[i]);
    }
    fprintf(stderr,
            "QUIESCENCE %s: keys_without_ttl=%zu inconsistent=%zu live_after_lease=%zu "
            "fresh_client_got=%u/%u (then %s)\n",
            r->label, nokttl, inconsistent, live, got, r->limit, redsem_err_name(rc2));
    redsem_sem_free(s);
    redsem_lock_free(l);
    redsem_client_free(c);
    cr_expect_eq(nokttl, 0, "%zu keys without a TTL", nokttl);
    cr_expect_eq(inconsistent, 0, "%zu inconsistencies", inconsistent);
    cr_expect_eq(live, 0, "%zu entries still live lease + 1 s after the end", live);
    cr_expect_eq(got, r->limit, "a fresh client got %u permits, limit %u", got, r->limit);
    cr_expect_eq(rc2, REDSEM_EBUSY, "the permit after the limit: %s", redsem_err_name(rc2));
    cr_expect_eq(rel_bad, 0);
}
