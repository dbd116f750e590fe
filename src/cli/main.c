/* redsem(1): command line parsing, help, error reporting, dispatch.
 *
 * Usage: redsem COMMAND [OPTIONS] NAME [ID | -- CMD [ARGS...]]. Options come before NAME
 * (getopt_long in POSIX mode, "+"), so nothing after NAME is ever taken as redsem's own. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* Keep in step with docs/redsem.1 (tests/cli/test_cli.c compares the options and the exit
 * statuses of the two). */
static const char help_commands[] =
    "Usage: redsem COMMAND [OPTIONS] NAME [ID | -- CMD [ARGS...]]\n"
    "       redsem metrics|exporter [OPTIONS] NAME... | --match PATTERN\n"
    "\n"
    "Cap how many processes, on any number of machines, run at once: a counting semaphore\n"
    "(or a lock) kept in Redis, with leases and fencing tokens.\n"
    "\n"
    "Commands:\n"
    "  run [OPTIONS] NAME -- CMD [ARGS...]\n"
    "        take a permit of the semaphore NAME, run CMD while renewing the lease, release\n"
    "        the permit when CMD exits, and exit with CMD's status; with --rate, a grant\n"
    "        of NAME's rate limit first (and a permit only with --limit or --strategy)\n"
    "  lock [OPTIONS] NAME -- CMD [ARGS...]\n"
    "        the same with the lock (mutex) NAME\n"
    "  acquire [OPTIONS] NAME\n"
    "        take a permit and print its ID and fencing token; the permit stays held, but\n"
    "        nothing renews it: call refresh before the lease ends\n"
    "  refresh [OPTIONS] NAME ID\n"
    "        extend the lease of the permit ID by --lease, counted from now\n"
    "  release [OPTIONS] NAME ID\n"
    "        give the permit ID back\n"
    "  status [OPTIONS] NAME\n"
    "        show the strategy, the limit, the node that serves NAME, the permits in use,\n"
    "        the holders (permits, lease left, fencing token) and the waiters, and NAME's\n"
    "        rate window if it has a rate limit\n"
    "  status --watch [INTERVAL] [OPTIONS] NAME...\n"
    "        a live table of each NAME: permits in use / limit, holders, waiters, oldest\n"
    "        wait, grants and timeouts per interval, redrawn every INTERVAL (a DURATION,\n"
    "        default 2s) on a terminal, plain lines otherwise; ends on SIGINT or SIGTERM\n"
    "  metrics [OPTIONS] NAME... | --match PATTERN\n"
    "        print what the server holds for each NAME (or each name matching PATTERN) in\n"
    "        Prometheus' text format: limit, permits in use, holders, waiters, oldest\n"
    "        wait, expired leases, rate window grants, redsem_up (docs/metrics.md)\n"
    "  exporter --listen ADDR:PORT [OPTIONS] [NAME... | --match PATTERN]\n"
    "        serve the same figures at http://ADDR:PORT/metrics for Prometheus, read at\n"
    "        each scrape; Redis down: redsem_up 0; ends on SIGINT or SIGTERM\n"
    "  help  show this help\n"
    "\n";
/* four literals: each stays under the 4095 bytes C11 compilers must support */
static const char help_text[] =
    "Options (before NAME):\n"
    "  --url URL            Redis to use: redis://[USER[:PASSWORD]@]HOST[:PORT][/DB],\n"
    "                       rediss://... (TLS), unix:///PATH[?db=DB], or a Sentinel-managed\n"
    "                       primary: redis+sentinel://HOST[:PORT][,HOST[:PORT]...]/MASTER\n"
    "                       (rediss+sentinel:// over TLS), or a Redis Cluster (its seed\n"
    "                       nodes): redis+cluster://HOST[:PORT][,HOST[:PORT]...]\n"
    "                       (rediss+cluster:// over TLS); default $REDSEM_URL, else\n"
    "                       " REDSEM_DEFAULT_URL "\n"
    "  --tls-ca FILE        rediss://: CA certificates (PEM) that verify the server\n"
    "                       (default $REDSEM_TLS_CA, else the system's)\n"
    "  --tls-ca-dir DIR     rediss://: a directory of hashed CA certificates\n"
    "                       (default $REDSEM_TLS_CA_DIR)\n"
    "  --tls-cert FILE      rediss://: client certificate for mutual TLS\n"
    "                       (default $REDSEM_TLS_CERT)\n"
    "  --tls-key FILE       rediss://: its private key, if not in --tls-cert\n"
    "                       (default $REDSEM_TLS_KEY)\n"
    "  --tls-server-name NAME\n"
    "                       rediss://: the name to verify, if not the URL's host\n"
    "                       (default $REDSEM_TLS_SERVER_NAME)\n"
    "  --retry DURATION     how long a call keeps reconnecting and resending after the\n"
    "                       connection was lost or refused (a restart, a failover); make\n"
    "                       it longer than your failovers take; 0 fails at once\n"
    "                       (default $REDSEM_RETRY, else 1s; at most 24h)\n"
    "  --sync-replicas N    grants and refreshes must reach N replicas (WAIT N, in the\n"
    "                       same round trip); fewer in time: the permit is given back,\n"
    "                       exit 69 (default 0: no WAIT)\n"
    "  --sync-timeout DURATION\n"
    "                       how long WAIT may take (default 100ms; less than 2s)\n"
    "  --tls-insecure-skip-verify\n"
    "                       rediss://: accept ANY certificate (tests only: anyone on the\n"
    "                       path could impersonate the server)\n"
    "  --allow-eviction     use a server that may evict keys (maxmemory with a\n"
    "                       maxmemory-policy other than noeviction), which can forget\n"
    "                       holders and break the limit; refused by default (exit 78)\n"
    ;
static const char help_text2[] =
    "  --strategy STRATEGY  semaphores: basic, fair or locked (default fair)\n"
    "  --limit N            semaphores: how many permits, 1..1000000 (default 1)\n"
    "  --rate N/DURATION    run: at most N grants per rolling window (100/1m), on the\n"
    "                       server's clock; waiters in FIFO order; taken before the\n"
    "                       permit, so no permit is held while waiting for the rate\n"
    "  --permits N          run, acquire: take N permits of the semaphore at once, as one\n"
    "                       permit (all or nothing; fair and locked: in arrival order,\n"
    "                       never overtaken by smaller requests); 1..--limit (default 1)\n"
    "  --lease DURATION     lease of a permit (default 30s); run and lock renew it every\n"
    "                       third of it\n"
    "  --wait DURATION      run, lock, acquire: how long to wait for a permit; 0 tries once;\n"
    "                       default forever\n"
    "  --kill-after DURATION\n"
    "                       run, lock: if the lease is lost, SIGKILL CMD this long after\n"
    "                       SIGTERM (default 10s)\n"
    "  --foreground         run, lock: keep CMD in redsem's process group, so that it can\n"
    "                       read the terminal; only CMD itself is then signalled\n"
    "  --lock               acquire, refresh, release, status: the lock NAME, not a semaphore\n"
    "  --json               acquire, refresh, status: print one JSON object\n"
    "  --metrics-file PATH  run, lock: when it ends, write the run's wait, hold and\n"
    "                       outcome figures there in Prometheus' text format, atomically\n"
    "                       (for node_exporter's textfile collector); the directory must\n"
    "                       exist, and PATH must not be a directory\n"
    "  --match PATTERN      metrics, exporter: every name matching the glob PATTERN (SCAN)\n"
    "  --max-names N        metrics, exporter: at most N names from --match (default 1000,\n"
    "                       at most 100000); more: redsem_scan_capped 1, and metrics\n"
    "                       exits with 64 after printing the first N\n"
    "  --listen ADDR:PORT   exporter: the address to serve: 127.0.0.1:9720, [::1]:9720,\n"
    "                       :9720 (every IPv4 address); port 0: a free port (printed)\n"
    "  --scrape-timeout DURATION\n"
    "                       exporter: answer a scrape within this (default 10s); Redis\n"
    "                       slower than that: redsem_up 0\n"
    "  --watch[=INTERVAL]   status: the live table of status --watch (INTERVAL may also\n"
    "                       be the next argument when a NAME follows it)\n"
    "  -h, --help           show this help and exit\n"
    "  -V, --version        show the version and exit\n"
    "\n"
    "DURATION is a whole number with a unit: 250ms, 30s, 5m, 1h; a bare number is seconds.\n"
    "--wait also accepts 'forever'.\n"
    "\n"
    "Every command on one NAME must use the same --strategy and --limit: the server records\n"
    "them when NAME is first used and refuses others (exit status 78); so must every\n"
    "run --rate on NAME. status needs neither: it shows what the server records and\n"
    "records nothing.\n"
    "\n"
    "run and lock put CMD in a process group of its own and signal the whole group: SIGHUP,\n"
    "SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to redsem are forwarded; SIGTSTP\n"
    "stops CMD and redsem. If the lease is lost, CMD gets SIGTERM, then SIGKILL after\n"
    "--kill-after, and redsem exits with 79.\n"
    "\n";
static const char help_env[] =
    "Environment:\n"
    "  REDSEM_URL    the default for --url\n"
    "  REDSEM_RETRY  the default for --retry\n"
    "  REDSEM_TLS_CA, REDSEM_TLS_CA_DIR, REDSEM_TLS_CERT, REDSEM_TLS_KEY,\n"
    "  REDSEM_TLS_SERVER_NAME\n"
    "                the defaults for --tls-ca, --tls-ca-dir, --tls-cert, --tls-key and\n"
    "                --tls-server-name\n"
    "  CMD is run with REDSEM_NAME (NAME), REDSEM_ID (the permit's ID), REDSEM_FENCE\n"
    "  (its fencing token, a decimal number that increases with every grant of NAME)\n"
    "  and REDSEM_PERMITS (how many permits it holds, --permits; 1 by default);\n"
    "  with --rate, REDSEM_RATE_TOKEN (the rate grant's fencing token) and\n"
    "  REDSEM_RATE_GRANTED_US (its server time, microseconds since the epoch), and\n"
    "  REDSEM_ID, REDSEM_FENCE and REDSEM_PERMITS only if a permit is held too.\n"
    "  REDSEM_URL reaches CMD without its passwords (the user's and sentinel_password).\n"
    "\n"
    "Exit status:\n"
    "  0      success\n"
    "  CODE   run, lock: CMD's own exit status; 128+N if CMD was killed by signal N\n"
    "  64     usage error; metrics: --match matched more than --max-names names\n"
    "  69     cannot connect to Redis, or the connection was lost or timed out, or\n"
    "         fewer replicas than --sync-replicas acknowledged in time\n"
    "  70     internal error\n"
    "  71     operating system error (pipe, signals, process creation, --listen's\n"
    "         port in use)\n"
    "  75     no permit (or rate grant) within --wait (run, lock: CMD was not run)\n"
    "  76     Redis answered with an error (its text is printed)\n"
    "  77     Redis refused the password or the ACL user's permissions, or TLS refused\n"
    "         the server's certificate\n"
    "  78     NAME exists on the server with another strategy, limit or rate; or the\n"
    "         server may evict keys and --allow-eviction was not given\n"
    "  79     the lease was lost: run, lock: while CMD ran (it was terminated);\n"
    "         refresh, release: ID holds no permit of NAME\n"
    "  126    CMD was found but could not be executed\n"
    "  127    CMD was not found\n"
    "Whenever the status is redsem's own, one line starting with 'redsem:' is printed on\n"
    "stderr; CMD's status is passed on silently. A CMD that itself exits with one of the\n"
    "codes above can be told apart from redsem only by that line.\n"
    "\n"
    "Example: redsem run --limit 4 nightly-export -- ./export.sh\n"
    "See redsem(1).\n";

static void print_help(void)
{
    fputs(help_commands, stdout);
    fputs(help_text, stdout);
    fputs(help_text2, stdout);
    fputs(help_env, stdout);
}

static int usage_error(const cli_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int usage_error(const cli_opts *o, const char *fmt, ...)
{
    fputs("redsem: ", stderr);
    if (o != NULL && o->cmd_name != NULL)
        fprintf(stderr, "%s: ", o->cmd_name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see redsem --help)\n", stderr);
    return CLI_EXIT_USAGE;
}

/* ------------------------------------------------------------------ parsing */

enum {
    OPT_URL = 1000,
    OPT_STRATEGY,
    OPT_LIMIT,
    OPT_LEASE,
    OPT_WAIT,
    OPT_KILL_AFTER,
    OPT_FOREGROUND,
    OPT_LOCK,
    OPT_JSON,
    OPT_PERMITS,
    OPT_TLS_CA,
    OPT_TLS_CA_DIR,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_SERVER_NAME,
    OPT_TLS_INSECURE,
    OPT_ALLOW_EVICTION,
    OPT_SYNC_REPLICAS,
    OPT_SYNC_TIMEOUT,
    OPT_RATE,
    OPT_RETRY,
    OPT_METRICS_FILE,
    OPT_MATCH,
    OPT_MAX_NAMES,
    OPT_LISTEN,
    OPT_SCRAPE_TIMEOUT,
    OPT_WATCH
};

#define CMDS_ALL                                                                               \
    (CLI_CMD_RUN | CLI_CMD_LOCK | CLI_CMD_ACQUIRE | CLI_CMD_REFRESH | CLI_CMD_RELEASE |        \
     CLI_CMD_STATUS | CLI_CMD_METRICS | CLI_CMD_EXPORTER)
#define CMDS_SEM (CMDS_ALL & ~(CLI_CMD_LOCK | CLI_CMD_METRICS | CLI_CMD_EXPORTER))

static const struct option long_options[] = {
    {"url", required_argument, NULL, OPT_URL},
    {"strategy", required_argument, NULL, OPT_STRATEGY},
    {"limit", required_argument, NULL, OPT_LIMIT},
    {"lease", required_argument, NULL, OPT_LEASE},
    {"wait", required_argument, NULL, OPT_WAIT},
    {"kill-after", required_argument, NULL, OPT_KILL_AFTER},
    {"foreground", no_argument, NULL, OPT_FOREGROUND},
    {"lock", no_argument, NULL, OPT_LOCK},
    {"json", no_argument, NULL, OPT_JSON},
    {"permits", required_argument, NULL, OPT_PERMITS},
    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
    {"tls-ca-dir", required_argument, NULL, OPT_TLS_CA_DIR},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"tls-server-name", required_argument, NULL, OPT_TLS_SERVER_NAME},
    {"tls-insecure-skip-verify", no_argument, NULL, OPT_TLS_INSECURE},
    {"allow-eviction", no_argument, NULL, OPT_ALLOW_EVICTION},
    {"sync-replicas", required_argument, NULL, OPT_SYNC_REPLICAS},
    {"sync-timeout", required_argument, NULL, OPT_SYNC_TIMEOUT},
    {"rate", required_argument, NULL, OPT_RATE},
    {"retry", required_argument, NULL, OPT_RETRY},
    {"metrics-file", required_argument, NULL, OPT_METRICS_FILE},
    {"match", required_argument, NULL, OPT_MATCH},
    {"max-names", required_argument, NULL, OPT_MAX_NAMES},
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"scrape-timeout", required_argument, NULL, OPT_SCRAPE_TIMEOUT},
    {"watch", optional_argument, NULL, OPT_WATCH},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {NULL, 0, NULL, 0},
};

/* Which commands take which option. --url, --lease, --strategy and --limit are accepted by
 * every command they can apply to (even where they change nothing, as --lease for status),
 * so that one set of options describing NAME can be passed to all of them. */
static unsigned option_commands(int opt)
{
    switch (opt) {
    case OPT_STRATEGY:
    case OPT_LIMIT:
        return CMDS_SEM;
    case OPT_WAIT:
        return CLI_CMD_RUN | CLI_CMD_LOCK | CLI_CMD_ACQUIRE;
    case OPT_PERMITS:
        return CLI_CMD_RUN | CLI_CMD_ACQUIRE;
    case OPT_KILL_AFTER:
    case OPT_FOREGROUND:
        return CLI_CMD_RUN | CLI_CMD_LOCK;
    case OPT_RATE:
        return CLI_CMD_RUN;
    case OPT_LOCK:
        return CLI_CMD_ACQUIRE | CLI_CMD_REFRESH | CLI_CMD_RELEASE | CLI_CMD_STATUS;
    case OPT_JSON:
        return CLI_CMD_ACQUIRE | CLI_CMD_REFRESH | CLI_CMD_STATUS;
    case OPT_METRICS_FILE:
        return CLI_CMD_RUN | CLI_CMD_LOCK;
    case OPT_MATCH:
    case OPT_MAX_NAMES:
        return CLI_CMD_METRICS | CLI_CMD_EXPORTER;
    case OPT_LISTEN:
    case OPT_SCRAPE_TIMEOUT:
        return CLI_CMD_EXPORTER;
    case OPT_WATCH:
        return CLI_CMD_STATUS;
    case OPT_LEASE:
        return CMDS_ALL & ~(CLI_CMD_METRICS | CLI_CMD_EXPORTER);
    default:
        return CMDS_ALL;
    }
}

static const char *option_name(int opt)
{
    for (const struct option *lo = long_options; lo->name != NULL; lo++)
        if (lo->val == opt)
            return lo->name;
    return "?";
}

static const struct {
    const char *name;
    cli_command cmd;
} commands[] = {
    {"run", CLI_CMD_RUN},         {"lock", CLI_CMD_LOCK},       {"acquire", CLI_CMD_ACQUIRE},
    {"refresh", CLI_CMD_REFRESH}, {"release", CLI_CMD_RELEASE}, {"status", CLI_CMD_STATUS},
    {"metrics", CLI_CMD_METRICS}, {"exporter", CLI_CMD_EXPORTER},
};

static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > REDSEM_NAME_MAX)
        return false;
    for (const char *p = s; *p; p++)
        if (*p < 0x21 || *p > 0x7e || *p == '{' || *p == '}')
            return false;
    return true;
}

static bool valid_id(const char *s)
{
    size_t n = strlen(s);
    if (n != REDSEM_ID_LEN)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

/* A whole number 1..max, the whole of s[0..len). */
static int parse_count(const char *s, size_t len, uint32_t max, uint32_t *ret)
{
    uint64_t n = 0;
    if (len == 0)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        n = n * 10 + (uint64_t)(s[i] - '0');
        if (n > max)
            return -1;
    }
    if (n < 1)
        return -1;
    *ret = (uint32_t)n;
    return 0;
}

static int parse_limit(const char *s, uint32_t *ret)
{
    return parse_count(s, strlen(s), REDSEM_LIMIT_MAX, ret);
}

/* --rate N/DURATION: N 1..REDSEM_RATE_MAX grants per window, the window a DURATION. */
static int parse_rate(const char *s, uint32_t *ret_n, int64_t *ret_window_ms)
{
    const char *slash = strchr(s, '/');
    if (slash == NULL || parse_count(s, (size_t)(slash - s), REDSEM_RATE_MAX, ret_n) != 0 ||
        cli_parse_duration(slash + 1, REDSEM_WINDOW_MAX_MS, ret_window_ms) != 0 ||
        *ret_window_ms < REDSEM_WINDOW_MIN_MS)
        return -1;
    return 0;
}

static int bad_name(const cli_opts *o, const char *name)
{
    char shown[72];
    return usage_error(o, "NAME '%s': use 1 to %d printable ASCII characters other than space, "
                          "'{' and '}'",
                       cli_shown_name(name, shown), REDSEM_NAME_MAX);
}

/* What follows the options: NAME and an ID or CMD; or metrics', exporter's and
 * status --watch's NAMEs (or none with --match). Returns 0 or the exit status. */
static int parse_args(cli_opts *o, char **args, int rest)
{
    if (o->watch && o->json)
        return usage_error(o, "--watch draws a table: it has no --json");
    if (o->cmd == CLI_CMD_METRICS || o->cmd == CLI_CMD_EXPORTER || o->watch) {
        if (o->cmd == CLI_CMD_EXPORTER && o->listen == NULL)
            return usage_error(o, "--listen ADDR:PORT is missing");
        if (o->match != NULL && rest > 0)
            return usage_error(o, "give NAMEs or --match PATTERN, not both");
        if (o->match == NULL && o->cmd != CLI_CMD_EXPORTER && rest < 1)
            return usage_error(o, o->watch ? "NAME is missing"
                                           : "NAME or --match PATTERN is missing");
        for (int i = 0; i < rest; i++)
            if (!valid_name(args[i]))
                return bad_name(o, args[i]);
        o->names = args;
        o->nnames = (size_t)rest;
        o->name = rest == 1 ? args[0] : NULL;
        return 0;
    }
    if (rest < 1)
        return usage_error(o, "NAME is missing");
    o->name = args[0];
    if (!valid_name(o->name))
        return bad_name(o, o->name);
    args++;
    rest--;
    switch (o->cmd) {
    case CLI_CMD_RUN:
    case CLI_CMD_LOCK:
        if (rest > 0 && strcmp(args[0], "--") == 0) {
            args++;
            rest--;
        }
        if (rest < 1)
            return usage_error(o, "CMD is missing: redsem %s [OPTIONS] NAME -- CMD [ARGS...]",
                               o->cmd_name);
        o->argv = args;
        break;
    case CLI_CMD_REFRESH:
    case CLI_CMD_RELEASE:
        if (rest < 1)
            return usage_error(o, "ID is missing: redsem %s [OPTIONS] NAME ID", o->cmd_name);
        if (rest > 1)
            return usage_error(o, "unexpected argument '%s' after ID", args[1]);
        o->id = args[0];
        if (!valid_id(o->id))
            return usage_error(o, "ID '%s': a permit ID is %d lower-case hex characters, as "
                                  "printed by acquire",
                               o->id, REDSEM_ID_LEN);
        break;
    default:
        if (rest > 0)
            return usage_error(o, "unexpected argument '%s' after NAME", args[0]);
        break;
    }
    return 0;
}

/* Returns 0 to go on, -1 when the help or the version was printed, or an exit status. */
static int parse(int argc, char **argv, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->strategy = CLI_DEFAULT_STRATEGY;
    o->limit = CLI_DEFAULT_LIMIT;
    o->permits = 1;
    o->lease_ms = CLI_DEFAULT_LEASE_MS;
    o->wait_ms = REDSEM_WAIT_FOREVER;
    o->kill_after_ms = CLI_DEFAULT_KILL_AFTER_MS;
    o->sync_timeout_ms = 100;
    o->max_names = CLI_DEFAULT_MAX_NAMES;
    o->scrape_timeout_ms = CLI_DEFAULT_SCRAPE_TIMEOUT_MS;
    o->watch_ms = CLI_DEFAULT_WATCH_MS;

    if (argc < 2)
        return usage_error(NULL, "no command given");
    const char *c = argv[1];
    if (strcmp(c, "-h") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "help") == 0) {
        print_help();
        return -1;
    }
    if (strcmp(c, "-V") == 0 || strcmp(c, "--version") == 0) {
        printf("redsem %s (library %s)\n", REDSEM_VERSION_STRING, redsem_version_string());
        return -1;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(c, commands[i].name) == 0) {
            o->cmd = commands[i].cmd;
            o->cmd_name = commands[i].name;
        }
    }
    if (o->cmd == 0)
        return usage_error(NULL, "unknown command '%s'", c);
    o->lock = o->cmd == CLI_CMD_LOCK;

    /* argv + 1: getopt sees the command as its argv[0]. "+": stop at the first non-option
     * (NAME); ":": report a missing argument as ':'. */
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    opterr = 0;
    optind = 1;
    for (;;) {
        int opt = getopt_long(sub_argc, sub_argv, "+:hV", long_options, NULL);
        if (opt == -1)
            break;
        if (opt == '?') {
            if (optopt != 0)
                return usage_error(o, "unknown option '-%c'", optopt);
            return usage_error(o, "unknown option '%s'", sub_argv[optind - 1]);
        }
        if (opt == ':')
            return usage_error(o, "option '%s' needs an argument", sub_argv[optind - 1]);
        if (opt == 'h') {
            print_help();
            return -1;
        }
        if (opt == 'V') {
            printf("redsem %s (library %s)\n", REDSEM_VERSION_STRING, redsem_version_string());
            return -1;
        }
        if ((option_commands(opt) & (unsigned)o->cmd) == 0)
            return usage_error(o, "--%s is not an option of %s", option_name(opt), o->cmd_name);
        switch (opt) {
        case OPT_URL:
            o->url = optarg;
            o->url_source = "--url";
            break;
        case OPT_TLS_CA:
            o->tls_ca = optarg;
            break;
        case OPT_TLS_CA_DIR:
            o->tls_ca_dir = optarg;
            break;
        case OPT_TLS_CERT:
            o->tls_cert = optarg;
            break;
        case OPT_TLS_KEY:
            o->tls_key = optarg;
            break;
        case OPT_TLS_SERVER_NAME:
            o->tls_server_name = optarg;
            break;
        case OPT_TLS_INSECURE:
            o->tls_insecure = true;
            break;
        case OPT_ALLOW_EVICTION:
            o->allow_eviction = true;
            break;
        case OPT_SYNC_REPLICAS: {
            uint32_t n = 0;
            if (strcmp(optarg, "0") == 0)
                n = 0;
            else if (parse_limit(optarg, &n) != 0 || n > 64)
                return usage_error(o, "--sync-replicas '%s': use a whole number from 0 to 64",
                                   optarg);
            o->sync_replicas = (int)n;
            break;
        }
        case OPT_RETRY:
            if (cli_parse_duration(optarg, REDSEM_TIMEOUT_MAX_MS, &o->retry_ms) != 0)
                return usage_error(o, "--retry '%s': use 0 or a DURATION up to 24h, such as 30s",
                                   optarg);
            o->retry_set = true;
            break;
        case OPT_SYNC_TIMEOUT:
            if (cli_parse_duration(optarg, 1999, &o->sync_timeout_ms) != 0 ||
                o->sync_timeout_ms < 1)
                return usage_error(o, "--sync-timeout '%s': use a DURATION from 1ms to 1999ms",
                                   optarg);
            break;
        case OPT_STRATEGY:
            if (redsem_strategy_parse(optarg, &o->strategy) != REDSEM_OK)
                return usage_error(o, "--strategy '%s': use basic, fair or locked", optarg);
            o->strategy_set = true;
            break;
        case OPT_LIMIT:
            if (parse_limit(optarg, &o->limit) != 0)
                return usage_error(o, "--limit '%s': use a whole number from 1 to %u", optarg,
                                   REDSEM_LIMIT_MAX);
            o->limit_set = true;
            break;
        case OPT_RATE:
            if (parse_rate(optarg, &o->rate_n, &o->rate_window_ms) != 0)
                return usage_error(o, "--rate '%s': use N/DURATION, N from 1 to %u grants per "
                                      "window and a window from %dms to 30 days, such as 100/1m",
                                   optarg, REDSEM_RATE_MAX, REDSEM_WINDOW_MIN_MS);
            break;
        case OPT_LEASE:
            if (cli_parse_duration(optarg, REDSEM_LEASE_MAX_MS, &o->lease_ms) != 0 ||
                o->lease_ms < REDSEM_LEASE_MIN_MS)
                return usage_error(o, "--lease '%s': use a DURATION from %dms to 30 days, "
                                      "such as 30s",
                                   optarg, REDSEM_LEASE_MIN_MS);
            break;
        case OPT_WAIT:
            if (strcmp(optarg, "forever") == 0)
                o->wait_ms = REDSEM_WAIT_FOREVER;
            else if (cli_parse_duration(optarg, REDSEM_WAIT_MAX_MS, &o->wait_ms) != 0)
                return usage_error(o, "--wait '%s': use 0, a DURATION up to 30 days such as "
                                      "10s, or forever",
                                   optarg);
            break;
        case OPT_KILL_AFTER:
            if (cli_parse_duration(optarg, CLI_KILL_AFTER_MAX_MS, &o->kill_after_ms) != 0)
                return usage_error(o, "--kill-after '%s': use a DURATION up to 1 day, such "
                                      "as 10s",
                                   optarg);
            break;
        case OPT_FOREGROUND:
            o->foreground = true;
            break;
        case OPT_LOCK:
            o->lock = true;
            break;
        case OPT_JSON:
            o->json = true;
            break;
        case OPT_METRICS_FILE:
            if (*optarg == '\0')
                return usage_error(o, "--metrics-file: the PATH is empty");
            o->metrics_file = optarg;
            break;
        case OPT_MATCH:
            if (*optarg == '\0' || strlen(optarg) > 1024)
                return usage_error(o, "--match: use a glob PATTERN of 1 to 1024 bytes, such as "
                                      "'jobs-*'");
            o->match = optarg;
            break;
        case OPT_MAX_NAMES:
            if (parse_count(optarg, strlen(optarg), CLI_MAX_NAMES_MAX, &o->max_names) != 0)
                return usage_error(o, "--max-names '%s': use a whole number from 1 to %u",
                                   optarg, CLI_MAX_NAMES_MAX);
            break;
        case OPT_LISTEN:
            o->listen = optarg; /* checked by the exporter, which binds it */
            break;
        case OPT_SCRAPE_TIMEOUT:
            if (cli_parse_duration(optarg, CLI_SCRAPE_TIMEOUT_MAX_MS, &o->scrape_timeout_ms) !=
                    0 ||
                o->scrape_timeout_ms < CLI_SCRAPE_TIMEOUT_MIN_MS)
                return usage_error(o, "--scrape-timeout '%s': use a DURATION from %dms to 5m, "
                                      "such as 10s",
                                   optarg, CLI_SCRAPE_TIMEOUT_MIN_MS);
            break;
        case OPT_WATCH: {
            /* --watch=INTERVAL, or --watch INTERVAL when a DURATION (in range or not: "2h"
             * is a bad INTERVAL, not a NAME) and a NAME follow */
            const char *iv = optarg;
            int64_t any_ms = 0;
            if (iv == NULL && optind < sub_argc - 1 &&
                cli_parse_duration(sub_argv[optind], INT64_MAX, &any_ms) == 0)
                iv = sub_argv[optind++];
            if (iv != NULL &&
                (cli_parse_duration(iv, CLI_WATCH_MAX_MS, &o->watch_ms) != 0 ||
                 o->watch_ms < CLI_WATCH_MIN_MS))
                return usage_error(o, "--watch '%s': use a DURATION from %dms to 1h, such as 2s",
                                   iv, CLI_WATCH_MIN_MS);
            o->watch = true;
            break;
        }
        case OPT_PERMITS:
            if (parse_limit(optarg, &o->permits) != 0)
                return usage_error(o, "--permits '%s': use a whole number from 1 to the limit",
                                   optarg);
            o->permits_set = true;
            break;
        default:
            return usage_error(o, "internal: unhandled option %d", opt);
        }
    }
    if (o->lock && (o->strategy_set || o->limit_set || o->permits_set))
        return usage_error(o, "--strategy, --limit and --permits apply to semaphores, not to a "
                              "lock");
    if (o->permits > o->limit)
        return usage_error(o, "--permits %u is more than --limit %u", o->permits, o->limit);

    int code = parse_args(o, sub_argv + optind, sub_argc - optind);
    if (code != 0)
        return code;
    if (o->metrics_file != NULL && strlen(o->metrics_file) > 4000)
        return usage_error(o, "--metrics-file: the PATH is longer than 4000 bytes");

    if (o->url == NULL) {
        const char *env = getenv("REDSEM_URL");
        o->url = env != NULL && *env ? env : REDSEM_DEFAULT_URL;
        o->url_source = env != NULL && *env ? "REDSEM_URL" : "the default URL";
    }
    if (!o->retry_set) {
        const char *env = getenv("REDSEM_RETRY");
        if (env != NULL && *env) {
            if (cli_parse_duration(env, REDSEM_TIMEOUT_MAX_MS, &o->retry_ms) != 0)
                return usage_error(o, "REDSEM_RETRY '%s': use 0 or a DURATION up to 24h, such "
                                      "as 30s",
                                   env);
            o->retry_set = true;
        }
    }
    const struct {
        const char **field, *var;
    } tls_env[] = {
        {&o->tls_ca, "REDSEM_TLS_CA"},     {&o->tls_ca_dir, "REDSEM_TLS_CA_DIR"},
        {&o->tls_cert, "REDSEM_TLS_CERT"}, {&o->tls_key, "REDSEM_TLS_KEY"},
        {&o->tls_server_name, "REDSEM_TLS_SERVER_NAME"},
    };
    for (size_t i = 0; i < sizeof tls_env / sizeof *tls_env; i++) {
        const char *env = getenv(tls_env[i].var);
        if (*tls_env[i].field == NULL && env != NULL && *env)
            *tls_env[i].field = env;
    }
    if (o->tls_key != NULL && o->tls_cert == NULL)
        return usage_error(o, "--tls-key needs --tls-cert");
    return 0;
}

/* A closed stdin, stdout or stderr would be reused by the next open(): the Redis socket could
 * become fd 1 and receive our output. Fill the gaps with /dev/null opened read-only, so that
 * writes to a closed stdout still fail visibly. */
static void guard_std_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
            int nfd = open("/dev/null", O_RDONLY);
            if (nfd >= 0 && nfd != fd) {
                (void)dup2(nfd, fd);
                close(nfd);
            }
        }
    }
}

int main(int argc, char **argv)
{
    guard_std_fds();
    cli_opts o;
    int rc = parse(argc, argv, &o);
    if (rc == -1)
        return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_OSERR;
    if (rc != 0)
        return rc;
    switch (o.cmd) {
    case CLI_CMD_RUN:
    case CLI_CMD_LOCK:
        return cli_cmd_run(&o);
    case CLI_CMD_ACQUIRE:
        return cli_cmd_acquire(&o);
    case CLI_CMD_REFRESH:
        return cli_cmd_refresh(&o);
    case CLI_CMD_RELEASE:
        return cli_cmd_release(&o);
    case CLI_CMD_STATUS:
        return o.watch ? cli_cmd_watch(&o) : cli_cmd_status(&o);
    case CLI_CMD_METRICS:
        return cli_cmd_metrics(&o);
    case CLI_CMD_EXPORTER:
        return cli_cmd_exporter(&o);
    }
    return CLI_EXIT_SOFTWARE;
}
