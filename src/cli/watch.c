/* redsem(1): status --watch - a live table of several names, redrawn every interval.
 *
 * Each round reads every NAME (read-only, as status does: one status script call per name,
 * and one rate read for a name that is no semaphore) and draws one row per name. The
 * holders and waiters listed (up to CLI_STATUS_MAX_ENTRIES of each) are compared with the
 * last round's by ID: a holder not seen before is a grant; a waiter gone that does not hold
 * now is counted as a timeout (it timed out, was cancelled, or its process died; or it was
 * granted and released between two rounds, which the server keeps no trace of); a waiter's
 * wait is counted from the round that first saw it, so the oldest wait
 * is at least that old. Grants and waits shorter than a round can be missed: these are what
 * the watch saw, not the server's counts (docs/metrics.md has the exact figures). On a
 * terminal the table is redrawn in place (cursor home, each line cleared to its end, the
 * rest of the screen cleared); otherwise every round prints one plain line per name
 * ("TIME name=N kind=K in_use=U limit=L holders=H waiters=W ..."), for a log or a pipe.
 * SIGINT and SIGTERM are blocked and waited for between rounds (sigtimedwait), so either
 * ends the watch cleanly, at once, with status 0; one that comes during a round ends it
 * after the round. An error reading a name (Redis unreachable) is shown in its row and the
 * watch goes on. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* What one round shows of a name. */
/* An ID listed in a round, and (waiters) since when the watch has seen it wait. */
typedef struct seen {
    char id[REDSEM_ID_BUFSIZE];
    int64_t since_ms;
} seen;

typedef struct seen_list {
    seen *e;
    size_t n;
} seen_list;

/* What one round shows of a name, and what the next round compares with. */
typedef struct row {
    int rc;           /* REDSEM_OK, or why the name could not be read */
    const char *kind; /* "semaphore", "lock", "rate", or NULL: not on the server */
    uint64_t in_use;  /* permits in use (rate: grants in the current window) */
    uint32_t limit;
    size_t holders, waiters;
    bool delta;       /* grants, timeouts and oldest_ms are known (IDs listed twice) */
    size_t grants, timeouts;
    int64_t oldest_ms;
    seen_list h, w;   /* this round's holders and waiters, sorted by ID */
} row;

static int seen_cmp(const void *a, const void *b)
{
    return strcmp(((const seen *)a)->id, ((const seen *)b)->id);
}

static const seen *find(const seen_list *l, const char *id)
{
    seen key;
    snprintf(key.id, sizeof key.id, "%s", id);
    return l->n > 0 ? bsearch(&key, l->e, l->n, sizeof *l->e, seen_cmp) : NULL;
}

/* The IDs st lists (holders or waiters), sorted; since_ms = now. false: out of memory. */
static bool list_ids(const redsem_status *st, bool holders, int64_t now, seen_list *out)
{
    size_t n = holders ? redsem_status_holders_listed(st) : redsem_status_waiters_listed(st);
    out->n = 0;
    out->e = n > 0 ? calloc(n, sizeof *out->e) : NULL;
    if (n > 0 && out->e == NULL)
        return false;
    for (size_t i = 0; i < n; i++) {
        const char *id = NULL;
        uint64_t num = 0;
        int64_t left = 0;
        if ((holders ? redsem_status_holder(st, i, &id, &num, &left)
                     : redsem_status_waiter(st, i, &id, &num, &left)) != REDSEM_OK)
            break;
        snprintf(out->e[out->n].id, sizeof out->e[0].id, "%s", id);
        out->e[out->n++].since_ms = now;
    }
    if (out->n > 1)
        qsort(out->e, out->n, sizeof *out->e, seen_cmp);
    return true;
}

/* Compare this round's IDs with the last round's (prev, which is freed). */
static void compare(row *r, row *prev, int64_t now)
{
    r->delta = prev->rc == REDSEM_OK && prev->kind != NULL && r->kind != NULL &&
               strcmp(r->kind, prev->kind) == 0;
    r->oldest_ms = 0;
    for (size_t i = 0; i < r->w.n; i++) {
        const seen *was = find(&prev->w, r->w.e[i].id);
        if (was != NULL)
            r->w.e[i].since_ms = was->since_ms;
        if (now - r->w.e[i].since_ms > r->oldest_ms)
            r->oldest_ms = now - r->w.e[i].since_ms;
    }
    for (size_t i = 0; r->delta && i < r->h.n; i++)
        r->grants += find(&prev->h, r->h.e[i].id) == NULL;
    for (size_t i = 0; r->delta && i < prev->w.n; i++)
        r->timeouts += find(&r->w, prev->w.e[i].id) == NULL &&
                       find(&r->h, prev->w.e[i].id) == NULL;
    free(prev->h.e);
    free(prev->w.e);
}

static void read_row(const cli_opts *o, redsem_client *c, redsem_lock *lock, const char *name,
                     row *r)
{
    row prev = *r;
    memset(r, 0, sizeof *r);
    int64_t now = redsem_monotonic_ms();
    redsem_status *st = NULL;
    r->rc = o->lock ? redsem_lock_status(lock, CLI_STATUS_MAX_ENTRIES, &st)
                    : redsem_sem_inspect(c, name, CLI_STATUS_MAX_ENTRIES, &st);
    if (r->rc != REDSEM_OK) {
        compare(r, &prev, now);
        return;
    }
    if (o->lock || redsem_status_exists(st)) {
        r->kind = o->lock ? "lock" : "semaphore";
        r->in_use = redsem_status_permits_in_use(st);
        r->limit = redsem_status_limit(st);
        r->holders = redsem_status_holder_count(st);
        r->waiters = redsem_status_waiter_count(st);
        if (!list_ids(st, true, now, &r->h) || !list_ids(st, false, now, &r->w))
            r->rc = REDSEM_ENOMEM;
    } else {
        redsem_rate_info ri = {.exists = false};
        r->rc = redsem_rate_inspect(c, name, &ri);
        if (r->rc == REDSEM_OK && ri.exists) {
            r->kind = "rate";
            r->in_use = ri.in_window;
            r->limit = ri.limit;
            r->waiters = ri.waiters;
        }
    }
    redsem_status_free(st);
    compare(r, &prev, now);
}

/* "12", or "-" when not known, into buf. */
static const char *count_text(bool known, size_t n, char *buf, size_t len)
{
    if (known)
        snprintf(buf, len, "%zu", n);
    else
        snprintf(buf, len, "-");
    return buf;
}

static void now_text(char *buf, size_t len, bool date)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, date ? "%Y-%m-%dT%H:%M:%SZ" : "%H:%M:%S UTC", &tm);
}

static void draw_plain(const cli_opts *o, const row *rows)
{
    char when[32];
    now_text(when, sizeof when, true);
    for (size_t i = 0; i < o->nnames; i++) {
        const row *r = &rows[i];
        printf("%s name=%s ", when, o->names[i]);
        if (r->rc != REDSEM_OK)
            printf("error=\"%s\"\n", redsem_strerror(r->rc));
        else if (r->kind == NULL)
            printf("kind=none\n");
        else {
            char g[24], t[24];
            printf("kind=%s in_use=%" PRIu64 " limit=%" PRIu32 " holders=%zu waiters=%zu "
                   "oldest_wait=%.3fs grants=%s timeouts=%s\n",
                   r->kind, r->in_use, r->limit, r->holders, r->waiters,
                   (double)r->oldest_ms / 1000.0, count_text(r->delta, r->grants, g, sizeof g),
                   count_text(r->delta, r->timeouts, t, sizeof t));
        }
    }
}

/* One line of the terminal table: cleared to its end ("\033[K"). */
static void draw_table(const cli_opts *o, const row *rows, bool first)
{
    char when[32];
    now_text(when, sizeof when, false);
    /* first: clear the screen; later: cursor home and overwrite */
    fputs(first ? "\033[H\033[2J" : "\033[H", stdout);
    printf("redsem status --watch: every %" PRId64 "ms, %s (Ctrl-C ends); grants and "
           "timeouts: in the last interval\033[K\n",
           o->watch_ms, when);
    printf("\033[K\n%-32s %-9s %15s %8s %8s %12s %7s %8s\033[K\n", "NAME", "KIND",
           "IN USE/LIMIT", "HOLDERS", "WAITERS", "OLDEST WAIT", "GRANTS", "TIMEOUTS");
    for (size_t i = 0; i < o->nnames; i++) {
        const row *r = &rows[i];
        char use[48];
        printf("%-32s ", o->names[i]);
        if (r->rc != REDSEM_OK)
            printf("error: %s\033[K\n", redsem_strerror(r->rc));
        else if (r->kind == NULL)
            printf("%-9s %15s\033[K\n", "-", "not on server");
        else {
            char g[24], t[24], oldest[32];
            snprintf(use, sizeof use, "%" PRIu64 "/%" PRIu32, r->in_use, r->limit);
            snprintf(oldest, sizeof oldest, "%.1fs", (double)r->oldest_ms / 1000.0);
            printf("%-9s %15s %8zu %8zu %12s %7s %8s\033[K\n", r->kind, use, r->holders,
                   r->waiters, oldest, count_text(r->delta, r->grants, g, sizeof g),
                   count_text(r->delta, r->timeouts, t, sizeof t));
        }
    }
    fputs("\033[J", stdout);
}

int cli_cmd_watch(const cli_opts *o)
{
    cli_session s;
    int code = cli_session_connect(o, &s);
    if (code != 0)
        return code;
    redsem_lock **locks = calloc(o->nnames, sizeof *locks);
    row *rows = calloc(o->nnames, sizeof *rows);
    if (locks == NULL || rows == NULL) {
        cli_msg(o, "out of memory");
        code = CLI_EXIT_SOFTWARE;
        goto out;
    }
    for (size_t i = 0; o->lock && i < o->nnames; i++) {
        int rc = redsem_lock_open(s.client, o->names[i], o->lease_ms, &locks[i]);
        if (rc != REDSEM_OK) {
            code = cli_fail(o, o->names[i], rc, redsem_client_errmsg(s.client));
            goto out;
        }
    }
    sigset_t stop_sigs, orig;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_sigs, &orig);
    bool tty = isatty(STDOUT_FILENO) == 1;
    for (bool first = true;; first = false) {
        for (size_t i = 0; i < o->nnames; i++)
            read_row(o, s.client, locks[i], o->names[i], &rows[i]);
        if (tty)
            draw_table(o, rows, first);
        else
            draw_plain(o, rows);
        if (fflush(stdout) != 0) {
            cli_msg(o, "cannot write the output");
            code = CLI_EXIT_OSERR;
            break;
        }
        struct timespec ts = {.tv_sec = (time_t)(o->watch_ms / 1000),
                              .tv_nsec = (long)(o->watch_ms % 1000) * 1000000L};
        int sig = sigtimedwait(&stop_sigs, NULL, &ts);
        if (sig == SIGINT || sig == SIGTERM)
            break;
    }
    pthread_sigmask(SIG_SETMASK, &orig, NULL);
out:
    for (size_t i = 0; locks != NULL && i < o->nnames; i++)
        redsem_lock_free(locks[i]);
    for (size_t i = 0; rows != NULL && i < o->nnames; i++) {
        free(rows[i].h.e);
        free(rows[i].w.e);
    }
    free(locks);
    free(rows);
    cli_session_close(&s);
    return code;
}
