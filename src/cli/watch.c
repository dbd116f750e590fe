/* redsem(1): status --watch - a live table of several names, redrawn every interval.
 *
 * Each round reads every NAME (read-only, as status does: one status script call per name,
 * and one rate read for a name that is no semaphore) and draws one row per name: on a
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
typedef struct row {
    int rc;           /* REDSEM_OK, or why the name could not be read */
    const char *kind; /* "semaphore", "lock", "rate", or NULL: not on the server */
    uint64_t in_use;  /* permits in use (rate: grants in the current window) */
    uint32_t limit;
    size_t holders, waiters;
} row;

static void read_row(const cli_opts *o, redsem_client *c, redsem_lock *lock, const char *name,
                     row *r)
{
    memset(r, 0, sizeof *r);
    redsem_status *st = NULL;
    r->rc = o->lock ? redsem_lock_status(lock, 0, &st) : redsem_sem_inspect(c, name, 0, &st);
    if (r->rc != REDSEM_OK)
        return;
    if (o->lock || redsem_status_exists(st)) {
        r->kind = o->lock ? "lock" : "semaphore";
        r->in_use = redsem_status_permits_in_use(st);
        r->limit = redsem_status_limit(st);
        r->holders = redsem_status_holder_count(st);
        r->waiters = redsem_status_waiter_count(st);
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
        else
            printf("kind=%s in_use=%" PRIu64 " limit=%" PRIu32 " holders=%zu waiters=%zu\n",
                   r->kind, r->in_use, r->limit, r->holders, r->waiters);
    }
}

/* One line of the terminal table: cleared to its end ("\033[K"). */
static void draw_table(const cli_opts *o, const row *rows, bool first)
{
    char when[32];
    now_text(when, sizeof when, false);
    /* first: clear the screen; later: cursor home and overwrite */
    fputs(first ? "\033[H\033[2J" : "\033[H", stdout);
    printf("redsem status --watch: every %" PRId64 "ms, %s (Ctrl-C ends)\033[K\n",
           o->watch_ms, when);
    printf("\033[K\n%-32s %-9s %15s %8s %8s\033[K\n", "NAME", "KIND", "IN USE/LIMIT",
           "HOLDERS", "WAITERS");
    for (size_t i = 0; i < o->nnames; i++) {
        const row *r = &rows[i];
        char use[48];
        printf("%-32s ", o->names[i]);
        if (r->rc != REDSEM_OK)
            printf("error: %s\033[K\n", redsem_strerror(r->rc));
        else if (r->kind == NULL)
            printf("%-9s %15s %8s %8s\033[K\n", "-", "not on server", "-", "-");
        else {
            snprintf(use, sizeof use, "%" PRIu64 "/%" PRIu32, r->in_use, r->limit);
            printf("%-9s %15s %8zu %8zu\033[K\n", r->kind, use, r->holders, r->waiters);
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
    free(locks);
    free(rows);
    cli_session_close(&s);
    return code;
}
