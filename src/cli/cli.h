/* redsem(1), the command-line tool: declarations shared by its source files.
 *
 * The CLI is the one place of the project that prints (STYLE 2.13): library calls return a
 * redsem_err, and the CLI turns it into one line on stderr (redsem_strerror() text plus
 * redsem_client_errmsg() detail, which carries Redis' own text) and an exit status. */
#ifndef REDSEM_CLI_H
#define REDSEM_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include <redsem/redsem.h>

/* ------------------------------------------------------------------ exit statuses
 * Documented in --help (main.c) and docs/redsem.1, EXIT STATUS; keep the three in step
 * (tests/cli/test_cli.c checks that every code below appears in both). The sysexits.h values
 * are spelled out so the numbers are visible here and the build does not depend on the
 * header's presence. */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_USAGE = 64,       /* EX_USAGE: bad command line */
    CLI_EXIT_UNAVAILABLE = 69, /* EX_UNAVAILABLE: cannot reach Redis, connection lost, timeout */
    CLI_EXIT_SOFTWARE = 70,    /* EX_SOFTWARE: internal error */
    CLI_EXIT_OSERR = 71,       /* EX_OSERR: pipe, signal set-up, spawn failed */
    CLI_EXIT_TEMPFAIL = 75,    /* EX_TEMPFAIL: no permit within --wait; CMD not run */
    CLI_EXIT_PROTOCOL = 76,    /* EX_PROTOCOL: Redis answered with an error / unexpected reply */
    CLI_EXIT_NOPERM = 77,      /* EX_NOPERM: AUTH or ACL refused */
    CLI_EXIT_CONFIG = 78,      /* EX_CONFIG: NAME exists with another strategy, limit or rate;
                                  the server may evict keys (no --allow-eviction) */
    CLI_EXIT_LOST = 79,        /* not in sysexits.h: the lease was lost / ID holds no permit */
    CLI_EXIT_NOEXEC = 126,     /* as shells: CMD found but not executable */
    CLI_EXIT_NOTFOUND = 127    /* as shells: CMD not found */
};

/* ------------------------------------------------------------------ defaults */
#define CLI_DEFAULT_STRATEGY REDSEM_STRATEGY_FAIR
#define CLI_DEFAULT_LIMIT 1u
#define CLI_DEFAULT_LEASE_MS 30000
#define CLI_DEFAULT_KILL_AFTER_MS 10000
/* status lists at most this many holders and waiters (the counts are always exact) */
#define CLI_STATUS_MAX_ENTRIES 1000
/* metrics, exporter: --max-names (how many names --match may find) */
#define CLI_DEFAULT_MAX_NAMES 1000u
#define CLI_MAX_NAMES_MAX 100000u
/* exporter: --scrape-timeout */
#define CLI_DEFAULT_SCRAPE_TIMEOUT_MS 10000
#define CLI_SCRAPE_TIMEOUT_MIN_MS 100
#define CLI_SCRAPE_TIMEOUT_MAX_MS 300000
/* status --watch: the interval */
#define CLI_DEFAULT_WATCH_MS 2000
#define CLI_WATCH_MIN_MS 100
#define CLI_WATCH_MAX_MS 3600000
/* Largest --kill-after: one day. */
#define CLI_KILL_AFTER_MAX_MS 86400000LL

/* ------------------------------------------------------------------ the command line */
typedef enum cli_command {
    CLI_CMD_RUN = 1,
    CLI_CMD_LOCK = 2,
    CLI_CMD_ACQUIRE = 4,
    CLI_CMD_REFRESH = 8,
    CLI_CMD_RELEASE = 16,
    CLI_CMD_STATUS = 32,
    CLI_CMD_METRICS = 64,
    CLI_CMD_EXPORTER = 128
} cli_command;

typedef struct cli_opts {
    cli_command cmd;
    const char *cmd_name;   /* "run", "lock", ... for messages */
    const char *url;        /* --url, else $REDSEM_URL, else REDSEM_DEFAULT_URL */
    const char *url_source; /* "--url", "REDSEM_URL" or "the default URL", for messages */
    /* rediss://: --tls-* options, else the REDSEM_TLS_* variables; NULL: not set */
    const char *tls_ca, *tls_ca_dir, *tls_cert, *tls_key, *tls_server_name;
    bool tls_insecure;
    bool allow_eviction;     /* --allow-eviction */
    int sync_replicas;       /* --sync-replicas, 0: none */
    int64_t sync_timeout_ms; /* --sync-timeout */
    int64_t retry_ms;        /* --retry, else $REDSEM_RETRY (retry_set); else the library's */
    bool retry_set;
    bool lock;              /* the mutex NAME (lock, --lock) instead of a semaphore */
    redsem_strategy strategy;
    bool strategy_set;
    uint32_t limit;
    bool limit_set;
    uint32_t rate_n;        /* run --rate N/DURATION: N grants per window (0: no rate) */
    int64_t rate_window_ms; /* ... and the window */
    uint32_t permits;       /* --permits: run, acquire take this many at once (default 1) */
    bool permits_set;
    int64_t lease_ms;
    int64_t wait_ms;        /* REDSEM_WAIT_FOREVER, 0 (try once) or a bound */
    int64_t kill_after_ms;
    bool foreground;
    bool json;
    const char *name;       /* the first NAME */
    char **names;           /* metrics, exporter, status --watch: every NAME (nnames) */
    size_t nnames;
    const char *match;      /* metrics, exporter: --match PATTERN (NULL: the NAMEs) */
    uint32_t max_names;     /* --max-names */
    const char *listen;     /* exporter: --listen ADDR:PORT */
    int64_t scrape_timeout_ms; /* exporter: --scrape-timeout */
    const char *metrics_file; /* run, lock: --metrics-file PATH (NULL: none) */
    bool watch;             /* status --watch */
    int64_t watch_ms;       /* ... its interval */
    const char *id;         /* refresh, release */
    char **argv;            /* run, lock: CMD and its arguments, NULL-terminated */
} cli_opts;

/* ------------------------------------------------------------------ duration.c */
/* Parse a DURATION: a whole number of milliseconds, seconds, minutes or hours written as
 * "250ms", "30s", "5m", "1h"; a bare number is seconds. No sign, no spaces, no fractions.
 * Returns 0 with *ret_ms set, or -1 (garbage, overflow, or more than max_ms); *ret_ms is
 * untouched on failure. */
int cli_parse_duration(const char *text, int64_t max_ms, int64_t *ret_ms);

/* ------------------------------------------------------------------ main.c: reporting */
/* Print "redsem: CMD NAME: TEXT: DETAIL" (DETAIL omitted when empty) and return the exit
 * status for rc. what (may be NULL) names the step that failed when it is not obvious. */
int cli_fail(const cli_opts *o, const char *what, int rc, const char *detail);
/* Print "redsem: CMD NAME: MESSAGE" (printf-style) on stderr. */
/* NAME as given, for a message: at most 64 bytes, anything but printable ASCII as '?'. */
const char *cli_shown_name(const char *name, char out[72]);
void cli_msg(const cli_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The exit status for a library status code. */
int cli_exit_code(int rc);

/* ------------------------------------------------------------------ session.c */
/* A connected client and the semaphore or lock NAME opened on it. */
typedef struct cli_session {
    redsem_client *client;
    redsem_sem *sem;   /* semaphore commands */
    redsem_lock *lock; /* lock, --lock */
    redsem_rate *rate; /* run --rate */
} cli_session;

/* Connect and open NAME. On failure prints the error and returns the exit status (> 0);
 * returns 0 on success. */
/* Connect only (no semaphore or lock opened). */
int cli_session_connect(const cli_opts *o, cli_session *s);
/* The client options the command line asks for (URL, TLS, retry, ...), for a client made
 * later (the exporter's). Prints and returns the exit status on failure, 0 on success. */
int cli_client_options(const cli_opts *o, redsem_options **ret_opts);
int cli_session_open(const cli_opts *o, cli_session *s);
void cli_session_close(cli_session *s);
/* Acquire a permit, waiting o->wait_ms; retries an acquire whose outcome was unknown with
 * the same holder identifier (idempotent). Prints and returns the exit status on failure. */
int cli_session_acquire(const cli_opts *o, cli_session *s, redsem_permit **ret_permit);
/* Open the rate NAME (o->rate_n per o->rate_window_ms) and take a grant, waiting up to
 * wait_ms (as o->wait_ms); retries an unknown outcome with the same id. Prints and returns
 * the exit status on failure. */
int cli_session_rate(const cli_opts *o, cli_session *s, int64_t wait_ms, redsem_rate_grant *g);
/* A permit object for the holder o->id (redsem_sem_adopt / redsem_lock_adopt). */
int cli_session_adopt(const cli_opts *o, cli_session *s, redsem_permit **ret_permit);

/* ------------------------------------------------------------------ commands */
int cli_cmd_run(const cli_opts *o);     /* run.c: run and lock */
int cli_cmd_acquire(const cli_opts *o); /* commands.c */
int cli_cmd_refresh(const cli_opts *o);
int cli_cmd_release(const cli_opts *o);
int cli_cmd_status(const cli_opts *o);
int cli_cmd_watch(const cli_opts *o);    /* watch.c: status --watch */
int cli_cmd_metrics(const cli_opts *o);  /* metrics.c */
int cli_cmd_exporter(const cli_opts *o); /* exporter.c */

/* ------------------------------------------------------------------ metrics.c */
/* The server-side figures of o->names, or of the names --match finds (at most
 * o->max_names; *capped tells whether more matched, and redsem_scan_capped says so in the
 * text), as Prometheus text (malloc'd, *ret_text; NULL on failure). Returns a library
 * status: REDSEM_OK also when Redis could not be reached (the text then says redsem_up 0,
 * and *up is false: redsem_client_errmsg() says why); a failed --match SCAN returns its
 * code (no text). */
int cli_metrics_gather(const cli_opts *o, redsem_client *c, char **ret_text, bool *capped,
                       bool *up);
/* The text of a failed scrape: redsem_up 0 alone. */
const char *cli_metrics_down_text(void);
/* run --metrics-file: the client's own figures written to o->metrics_file atomically (a
 * temporary file in the same directory, then rename). Prints and returns the exit status
 * on failure, 0 on success. */
int cli_metrics_file_write(const cli_opts *o, const redsem_client *c);
/* Whether --metrics-file's directory exists and is writable: prints and returns
 * CLI_EXIT_USAGE if not, 0 if so (checked before anything runs). */
int cli_metrics_file_check(const cli_opts *o);

#endif /* REDSEM_CLI_H */
