/* redsem-bench - benchmark harness of redsem: every strategy against a raw hiredis floor.
 *
 * With no --url it starts its own throwaway redis-server (as the tests do); see usage() and
 * docs/benchmarks.md. Output: one table per workload on stdout, progress on stderr, and with
 * --json FILE every figure and the run's parameters. Exit status: 0; 1 on a setup error; 2 if
 * the contended workload saw more concurrent holders than the limit. */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench.h"
#include "bench_commit.h"
#include "server.h"

static const char *const workload_names[BENCH_NWORKLOADS] = {
    "uncontended", "threads", "contended", "scale",    "floor", "renewal",
    "takeover",    "tls",     "sync",      "rate",     "weighted", "spread",
    "async",       "loops",   "targets"};

/* The default suite: every workload but floor (run inside the others anyway), tls, sync and
 * spread (each starts servers of its own, tls needs the openssl command, and each takes half
 * a minute or more) and targets (three repetitions of what issue 25's targets need, 140-150 s
 * on 2 busy cores). async is in it: about 3 s with the default --duration; loops (when built
 * with libuv) about 2 s per strategy. */
static bool in_default_suite(int w)
{
    return w != BENCH_W_FLOOR && w != BENCH_W_TLS && w != BENCH_W_SYNC && w != BENCH_W_SPREAD &&
           w != BENCH_W_TARGETS;
}

static void usage(FILE *out)
{
    fputs(
        "usage: redsem-bench [options]\n"
        "\n"
        "Measures redsem's strategies (basic, fair, locked) and its lock against a raw hiredis\n"
        "floor that makes the same round trips with a trivial script. With no --url it starts a\n"
        "private redis-server. The default suite takes two to three minutes (120 s measured\n"
        "on an idle machine before the book's semaphores joined it; 158-180 s with them on a\n"
        "busy one).\n"
        "\n"
        "  --url URL            measure this server (redis://host:port, unix:///path ...,\n"
        "                       redis+cluster://h1:p1,h2:p2: the semaphores are named to\n"
        "                       live on the first node, a primary, which the floor uses)\n"
        "  --unix               private server: connect by its unix socket (default: TCP\n"
        "                       loopback 127.0.0.1)\n"
        "  --pin                bench and private server on the same CPU (the first one\n"
        "                       allowed); client-side cost then shows (= --affinity same)\n"
        "  --affinity MODE      split (default: bench on the first CPU, server on the second),\n"
        "                       same, or none\n"
        "  -w, --workload LIST  any of uncontended,threads,contended,scale,renewal,takeover,\n"
        "                       rate,weighted,async,loops,tls,sync,spread,targets,floor;\n"
        "                       default (the default suite: the first ten) or all (the\n"
        "                       default suite, tls, sync, spread and targets); floor alone\n"
        "                       runs only the floor loops. tls, sync and spread start\n"
        "                       private servers of their own (TCP + TLS port; a primary and\n"
        "                       two replicas; clusters of 1 and 3 primaries), even with\n"
        "                       --url; tls needs the openssl command. targets: issue 25's\n"
        "                       targets, each printed as \"target: WHAT = VALUE (GOAL)\n"
        "                       met|MISSED\", the median of --target-reps repetitions of\n"
        "                       the workloads they need, with the issue's parameters (it\n"
        "                       ignores -s, --threads, --clients, --limit, --hold, --loops,\n"
        "                       --loop-sems, --loop-hold, --shared, --renew); two to three\n"
        "                       minutes\n",
        out);
    fputs( /* in parts: C99 compilers need take only 4095 characters in one string */
        "  -s, --strategies L   any of basic,fair,locked,lock,book-fair,book-locked\n"
        "                       (default all; book-*: see below)\n"
        "  --pairs N            uncontended: pairs per strategy (default 20000)\n"
        "  --rounds N           uncontended: interleaved rounds (default 5)\n"
        "  --threads LIST       threads: thread counts (default 8,32)\n"
        "  --thread-secs S      threads: seconds per batch (default 0.4)\n"
        "  --thread-rounds N    threads: (floor, library) batch pairs (default 1)\n"
        "  --threads-shared     threads: all on one semaphore of limit T (default: one each)\n"
        "  --shared             threads, and contended without --procs: all threads use one\n"
        "                       redsem client (default: one client per thread); the floor\n"
        "                       keeps one connection per thread\n"
        "  --renew              threads: put every library permit under automatic renewal\n"
        "                       before its release (the renewer runs; conns counts it);\n"
        "                       loops: the same, from each grant's callback, every 5 ms\n"
        "  --max-connections N  redsem_options_set_max_connections() of every client the\n"
        "                       bench makes, 1..64 (an upper bound: a client opens one\n"
        "                       request connection per server)\n"
        "  --clients LIST       contended: client counts (default 8,32)\n"
        "  --limit N            contended, loops: the semaphores' limit (default 4)\n"
        "  --hold MS|MIN-MAX    contended: hold time, fixed or uniform random (default 1-5)\n"
        "  --duration S         contended, weighted: seconds per run (default 2); async:\n"
        "                       S/10 per batch (6 library and 6 floor batches, about S + 1 s);\n"
        "                       loops: S per strategy (basic, fair, locked)\n"
        "  --procs              contended: clients are processes (fork), not threads\n"
        "  --order-margin-us N  contended: arrival-order margin (default 1000)\n"
        "  --holders LIST       scale: holder counts (default 10,1000,10000,100000)\n"
        "  --scale-pairs N      scale: pairs measured per level (default 1000)\n"
        "  --fillers N          scale: filler threads (default 8)\n"
        "  --tls-pairs N        tls: pairs per strategy and transport, in alternating\n"
        "                       batches of 250 (default 5000)\n"
        "  --spread-sems N      spread: semaphores over the shards (default 300)\n"
        "  --spread-threads N   spread: threads, each its own client (default 8)\n"
        "  --spread-secs S      spread: seconds per run (default 2)\n",
        out);
    fputs( /* two strings: C99 compilers need take only 4095 characters in one */
        "  --loops N            loops: acquire-hold-release loops driven by one libuv loop\n"
        "                       through the event-loop API (default 1000; the workload\n"
        "                       needs a build with libuv)\n"
        "  --loop-sems N        loops: semaphores the loops share (default 100)\n"
        "  --loop-hold MS|MIN-MAX  loops: hold time, fixed or uniform random (default 0:\n"
        "                       released from the grant callback)\n"
        "  --loop-threads N     loops: the releases are started by N other threads, 0..16\n"
        "                       (default 0: on the loop's thread)\n"
        "  --target-reps N      targets: repetitions, 1..15 (default 3)\n"
        "  --sync-pairs N       sync: pairs per strategy and WAIT setting, in rotating\n"
        "                       batches of 250 (default 5000); its shared lines (8 and 32\n"
        "                       threads on one client, basic, 6 x 0.4 s per setting) ignore\n"
        "                       it and -s\n"
        "  --no-slowlog         scale, contended: do not log every command in the server's\n"
        "                       SLOWLOG (CONFIG SET, restored after), so no server time per\n"
        "                       acquire and no longest command (contended: logging costs\n"
        "                       the server about 1 us per command during the run)\n"
        "  --json FILE          write every figure and the run's parameters to FILE\n"
        "  -q, --quiet          no progress lines on stderr\n"
        "  -h, --help           this text\n"
        "  --version            versions of redsem-bench and the library\n"
        "\n"
        "book-fair and book-locked are not strategies of the library: they are Redis in\n"
        "Action's fair semaphore (6.3.2, ZINTERSTORE of the owners on every acquire) and its\n"
        "lock-guarded variant (6.3.4), as reference scripts on raw connections; only the\n"
        "scale and contended workloads measure them, in the default suite, next to fair and\n"
        "locked. Leave them out with -s basic,fair,locked,lock.\n",
        out);
}

/* ---------------------------------------------------------------- option parsing */

static long parse_long(const char *s, const char *what, long lo, long hi)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        bench_die("%s: '%s' is not a number in %ld..%ld", what, s, lo, hi);
    return v;
}

static double parse_double(const char *s, const char *what, double lo, double hi)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        bench_die("%s: '%s' is not a number in %g..%g", what, s, lo, hi);
    return v;
}

static int parse_long_list(const char *s, const char *what, long lo, long hi, long *out)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == BENCH_MAX_LIST)
            bench_die("%s: at most %d values", what, BENCH_MAX_LIST);
        out[n++] = parse_long(t, what, lo, hi);
    }
    if (n == 0)
        bench_die("%s: empty list", what);
    return n;
}

static int parse_int_list(const char *s, const char *what, long lo, long hi, int *out)
{
    long tmp[BENCH_MAX_LIST];
    int n = parse_long_list(s, what, lo, hi, tmp);
    for (int i = 0; i < n; i++)
        out[i] = (int)tmp[i];
    return n;
}

/* A list of names, "all" (every one) and, when dflt is not NULL, "default" (those dflt
 * marks). */
static void parse_names(const char *s, const char *what, const char *const *names, int count,
                        const bool *dflt, bool *out)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    memset(out, 0, (size_t)count * sizeof *out);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "all") == 0) {
            for (int i = 0; i < count; i++)
                out[i] = true;
            continue;
        }
        if (dflt != NULL && strcmp(t, "default") == 0) {
            for (int i = 0; i < count; i++)
                out[i] = out[i] || dflt[i];
            continue;
        }
        int i = 0;
        while (i < count && strcmp(t, names[i]) != 0)
            i++;
        if (i == count)
            bench_die("%s: unknown name '%s'", what, t);
        out[i] = true;
    }
}

enum {
    OPT_URL = 256,
    OPT_UNIX,
    OPT_PIN,
    OPT_AFFINITY,
    OPT_PAIRS,
    OPT_ROUNDS,
    OPT_THREADS,
    OPT_THREAD_SECS,
    OPT_THREAD_ROUNDS,
    OPT_THREADS_SHARED,
    OPT_SHARED,
    OPT_RENEW,
    OPT_MAX_CONNECTIONS,
    OPT_CLIENTS,
    OPT_LIMIT,
    OPT_HOLD,
    OPT_DURATION,
    OPT_PROCS,
    OPT_MARGIN,
    OPT_HOLDERS,
    OPT_SCALE_PAIRS,
    OPT_FILLERS,
    OPT_TLS_PAIRS,
    OPT_SYNC_PAIRS,
    OPT_SPREAD_SEMS,
    OPT_SPREAD_THREADS,
    OPT_SPREAD_SECS,
    OPT_LOOPS,
    OPT_LOOP_SEMS,
    OPT_LOOP_HOLD,
    OPT_LOOP_THREADS,
    OPT_TARGET_REPS,
    OPT_JSON,
    OPT_NO_SLOWLOG,
    OPT_VERSION
};

/* MS or MIN-MAX (ms, 0..600000, MIN <= MAX) */
static void parse_range(const char *arg, const char *what, double *min, double *max)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", arg);
    char *dash = strchr(buf, '-');
    if (dash) {
        *dash = '\0';
        *min = parse_double(buf, what, 0, 600000);
        *max = parse_double(dash + 1, what, 0, 600000);
        if (*max < *min)
            bench_die("%s: MIN-MAX with MIN <= MAX", what);
    } else {
        *min = *max = parse_double(buf, what, 0, 600000);
    }
}

static void parse_args(int argc, char **argv, bench_opts *o)
{
    static const struct option longopts[] = {
        {"url", required_argument, NULL, OPT_URL},
        {"unix", no_argument, NULL, OPT_UNIX},
        {"pin", no_argument, NULL, OPT_PIN},
        {"affinity", required_argument, NULL, OPT_AFFINITY},
        {"workload", required_argument, NULL, 'w'},
        {"strategies", required_argument, NULL, 's'},
        {"pairs", required_argument, NULL, OPT_PAIRS},
        {"rounds", required_argument, NULL, OPT_ROUNDS},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"thread-secs", required_argument, NULL, OPT_THREAD_SECS},
        {"thread-rounds", required_argument, NULL, OPT_THREAD_ROUNDS},
        {"threads-shared", no_argument, NULL, OPT_THREADS_SHARED},
        {"shared", no_argument, NULL, OPT_SHARED},
        {"renew", no_argument, NULL, OPT_RENEW},
        {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
        {"clients", required_argument, NULL, OPT_CLIENTS},
        {"limit", required_argument, NULL, OPT_LIMIT},
        {"hold", required_argument, NULL, OPT_HOLD},
        {"duration", required_argument, NULL, OPT_DURATION},
        {"procs", no_argument, NULL, OPT_PROCS},
        {"order-margin-us", required_argument, NULL, OPT_MARGIN},
        {"holders", required_argument, NULL, OPT_HOLDERS},
        {"scale-pairs", required_argument, NULL, OPT_SCALE_PAIRS},
        {"fillers", required_argument, NULL, OPT_FILLERS},
        {"tls-pairs", required_argument, NULL, OPT_TLS_PAIRS},
        {"sync-pairs", required_argument, NULL, OPT_SYNC_PAIRS},
        {"spread-sems", required_argument, NULL, OPT_SPREAD_SEMS},
        {"spread-threads", required_argument, NULL, OPT_SPREAD_THREADS},
        {"spread-secs", required_argument, NULL, OPT_SPREAD_SECS},
        {"loops", required_argument, NULL, OPT_LOOPS},
        {"loop-sems", required_argument, NULL, OPT_LOOP_SEMS},
        {"loop-hold", required_argument, NULL, OPT_LOOP_HOLD},
        {"loop-threads", required_argument, NULL, OPT_LOOP_THREADS},
        {"target-reps", required_argument, NULL, OPT_TARGET_REPS},
        {"json", required_argument, NULL, OPT_JSON},
        {"no-slowlog", no_argument, NULL, OPT_NO_SLOWLOG},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    *o = (bench_opts){
        .affinity = AFF_SPLIT,
        .pairs = 20000,
        .rounds = 5,
        .threads = {8, 32},
        .nthreads = 2,
        .thread_secs = 0.4,
        .rounds_threads = 1,
        .clients = {8, 32},
        .nclients = 2,
        .limit = 4,
        .hold_min_ms = 1,
        .hold_max_ms = 5,
        .duration = 2,
        .holders = {10, 1000, 10000, 100000},
        .nholders = 4,
        .scale_pairs = 1000,
        .scale_fillers = 8,
        .order_margin_us = 1000,
        .tls_pairs = 5000,
        .sync_pairs = 5000,
        .spread_sems = 300,
        .spread_threads = 8,
        .spread_secs = 2,
        .loops = 1000,
        .loop_sems = 100,
        .target_reps = 3,
    };
    bool dflt[BENCH_NWORKLOADS];
    for (int i = 0; i < BENCH_NWORKLOADS; i++)
        o->workloads[i] = dflt[i] = in_default_suite(i);
    for (int i = 0; i < BENCH_NALL; i++)
        o->kinds[i] = true;
    static const char *const kinds[BENCH_NALL] = {"basic", "fair", "locked", "lock",
                                                  "book-fair", "book-locked"};
    int c;
    while ((c = getopt_long(argc, argv, "w:s:qh", longopts, NULL)) != -1) {
        switch (c) {
        case OPT_URL:
            o->url = optarg;
            break;
        case OPT_UNIX:
            o->unix_socket = true;
            break;
        case OPT_PIN:
            o->affinity = AFF_SAME;
            break;
        case OPT_AFFINITY:
            if (strcmp(optarg, "split") == 0)
                o->affinity = AFF_SPLIT;
            else if (strcmp(optarg, "same") == 0)
                o->affinity = AFF_SAME;
            else if (strcmp(optarg, "none") == 0)
                o->affinity = AFF_NONE;
            else
                bench_die("--affinity: split, same or none");
            break;
        case 'w': {
            bool w[BENCH_NWORKLOADS];
            parse_names(optarg, "--workload", workload_names, BENCH_NWORKLOADS, dflt, w);
            /* "floor" alone: just the floor loops; with others it changes nothing (the
             * floors run inside every workload that has one anyway) */
            bool only_floor = w[BENCH_W_FLOOR];
            for (int i = 0; i < BENCH_NWORKLOADS; i++)
                if (i != BENCH_W_FLOOR && w[i])
                    only_floor = false;
            if (!only_floor)
                w[BENCH_W_FLOOR] = false;
            memcpy(o->workloads, w, sizeof w);
            break;
        }
        case 's':
            parse_names(optarg, "--strategies", kinds, BENCH_NALL, NULL, o->kinds);
            break;
        case OPT_PAIRS:
            o->pairs = parse_long(optarg, "--pairs", 1, 100000000);
            break;
        case OPT_ROUNDS:
            o->rounds = (int)parse_long(optarg, "--rounds", 1, 64);
            break;
        case OPT_THREADS:
            o->nthreads = parse_int_list(optarg, "--threads", 1, 1024, o->threads);
            break;
        case OPT_THREAD_SECS:
            o->thread_secs = parse_double(optarg, "--thread-secs", 0.01, 3600);
            break;
        case OPT_THREAD_ROUNDS:
            o->rounds_threads = (int)parse_long(optarg, "--thread-rounds", 1, 64);
            break;
        case OPT_THREADS_SHARED:
            o->threads_shared = true;
            break;
        case OPT_SHARED:
            o->shared_client = true;
            break;
        case OPT_RENEW:
            o->renew = true;
            break;
        case OPT_MAX_CONNECTIONS:
            o->max_connections = (int)parse_long(optarg, "--max-connections", 1,
                                                 REDSEM_MAX_CONNECTIONS_MAX);
            break;
        case OPT_CLIENTS:
            o->nclients = parse_int_list(optarg, "--clients", 1, 1024, o->clients);
            break;
        case OPT_LIMIT:
            o->limit = (uint32_t)parse_long(optarg, "--limit", 1, 100000);
            break;
        case OPT_HOLD:
            parse_range(optarg, "--hold", &o->hold_min_ms, &o->hold_max_ms);
            break;
        case OPT_LOOP_HOLD:
            parse_range(optarg, "--loop-hold", &o->loop_hold_min_ms, &o->loop_hold_max_ms);
            break;
        case OPT_LOOPS:
            o->loops = (int)parse_long(optarg, "--loops", 1, 100000);
            break;
        case OPT_LOOP_THREADS:
            o->loop_threads =
                (int)parse_long(optarg, "--loop-threads", 0, BENCH_LOOP_THREADS_MAX);
            break;
        case OPT_TARGET_REPS:
            o->target_reps = (int)parse_long(optarg, "--target-reps", 1, 15);
            break;
        case OPT_LOOP_SEMS:
            o->loop_sems = (int)parse_long(optarg, "--loop-sems", 1, 100000);
            break;
        case OPT_DURATION:
            o->duration = parse_double(optarg, "--duration", 0.1, 86400);
            break;
        case OPT_PROCS:
            o->procs = true;
            break;
        case OPT_MARGIN:
            o->order_margin_us = parse_long(optarg, "--order-margin-us", 0, 10000000);
            break;
        case OPT_HOLDERS:
            o->nholders = parse_long_list(optarg, "--holders", 1, 990000, o->holders);
            for (int i = 1; i < o->nholders; i++)
                if (o->holders[i] < o->holders[i - 1])
                    bench_die("--holders: give the levels in increasing order");
            break;
        case OPT_SCALE_PAIRS:
            o->scale_pairs = parse_long(optarg, "--scale-pairs", 5, 10000000);
            break;
        case OPT_FILLERS:
            o->scale_fillers = (int)parse_long(optarg, "--fillers", 1, 256);
            break;
        case OPT_TLS_PAIRS:
            o->tls_pairs = parse_long(optarg, "--tls-pairs", 1, 100000000);
            break;
        case OPT_SYNC_PAIRS:
            o->sync_pairs = parse_long(optarg, "--sync-pairs", 1, 100000000);
            break;
        case OPT_SPREAD_SEMS:
            o->spread_sems = parse_long(optarg, "--spread-sems", 1, 100000);
            break;
        case OPT_SPREAD_THREADS:
            o->spread_threads = (int)parse_long(optarg, "--spread-threads", 1, 256);
            break;
        case OPT_SPREAD_SECS:
            o->spread_secs = parse_double(optarg, "--spread-secs", 0.1, 600);
            break;
        case OPT_JSON:
            o->json_path = optarg;
            break;
        case OPT_NO_SLOWLOG:
            o->no_slowlog = true;
            break;
        case 'q':
            o->quiet = true;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case OPT_VERSION:
            printf("redsem-bench %s (commit %s), library %s\n", REDSEM_VERSION_STRING,
                   REDSEM_BENCH_COMMIT, redsem_version_string());
            exit(0);
        default:
            usage(stderr);
            exit(1);
        }
    }
    if (optind < argc)
        bench_die("unexpected argument '%s' (see --help)", argv[optind]);
    if (o->url != NULL && strncmp(o->url, "rediss", 6) == 0)
        bench_die("--url rediss://...: not supported. The floor, INFO and the removal of the bench's "
                  "keys use raw hiredis 0.14 connections, which have no TLS. -w tls measures "
                  "the library over TLS against TCP on a private server");
}

/* ---------------------------------------------------------------- server, CPUs */

static ts_server server; /* the private server, unless --url */

/* The first two CPUs this process may run on (-1 if absent). */
static void allowed_cpus(int *first, int *second, int *count)
{
    cpu_set_t set;
    *first = *second = -1;
    *count = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return;
    for (int i = 0; i < CPU_SETSIZE; i++) {
        if (!CPU_ISSET(i, &set))
            continue;
        if (*first < 0)
            *first = i;
        else if (*second < 0)
            *second = i;
        (*count)++;
    }
}

static void pin_self(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "redsem-bench: sched_setaffinity(%d): %s\n", cpu, strerror(errno));
}

static void cpu_model(char *out, size_t len)
{
    snprintf(out, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                colon += 2;
                colon[strcspn(colon, "\n")] = '\0';
                snprintf(out, len, "%s", colon);
            }
            break;
        }
    }
    fclose(f);
}

/* URL with the credentials blanked, for the report (user:*** or ***, then @host). */
static void redact(const char *url, char *out, size_t len)
{
    snprintf(out, len, "%s", url);
    const char *scheme = strstr(url, "://");
    const char *at = scheme ? strrchr(url, '@') : NULL;
    if (at == NULL)
        return;
    const char *auth = scheme + 3;
    const char *colon = memchr(auth, ':', (size_t)(at - auth));
    int keep = (int)((colon ? colon + 1 : auth) - url);
    snprintf(out, len, "%.*s***%s", keep, url, at);
}

/* ---------------------------------------------------------------- the targets of issue 3 */

static json_t *find_row(json_t *arr, const char *strategy, const char *key, json_int_t val)
{
    size_t i;
    json_t *row;
    json_array_foreach(arr, i, row)
    {
        if (strcmp(json_string_value(json_object_get(row, "strategy")), strategy) == 0 &&
            (key == NULL || json_integer_value(json_object_get(row, key)) == val))
            return row;
    }
    return NULL;
}

static double num(json_t *row, const char *key)
{
    return json_number_value(json_object_get(row, key));
}

static void target_status(const char *what, double measured, const char *fmt_target,
                          const char *status, const char *note)
{
    char m[32];
    snprintf(m, sizeof m, "%.3f", measured);
    printf("  %-52s %10s  %-10s %s%s\n", what, m, fmt_target, status, note ? note : "");
}

static void target(const char *what, double measured, const char *fmt_target, bool met,
                   const char *note)
{
    target_status(what, measured, fmt_target, met ? "met" : "MISSED", note);
}

/* For a row r of rows: if it is the book's strategy bn, redsem's row of strategy n at the same
 * value of key (returned in *value), else NULL. The section's heading is printed before the
 * first pair found (*any). */
static json_t *book_peer(json_t *rows, json_t *r, const char *bn, const char *n,
                         const char *key, json_int_t *value, bool *any)
{
    if (strcmp(json_string_value(json_object_get(r, "strategy")), bn) != 0)
        return NULL;
    *value = json_integer_value(json_object_get(r, key));
    json_t *mine = find_row(rows, n, key, *value);
    if (mine != NULL && !*any) {
        printf("\n== redsem against Redis in Action's semaphores (issue 28, no targets), "
               "from this run\n");
        *any = true;
    }
    return mine;
}

/* Redis in Action's fair and locked semaphores against redsem's (issue 28: no targets). */
static void print_book(const bench_ctx *ctx)
{
    json_t *root = ctx->json;
    json_t *s = json_object_get(root, "scale");
    json_t *c = json_object_get(json_object_get(root, "contended"), "runs");
    bool any = false;
    char what[96];
    for (int k = BENCH_FAIR; k <= BENCH_LOCKED; k++) {
        const char *n = bench_kind_name(k);
        const char *bn = bench_kind_name(k + BENCH_BOOK_FAIR - BENCH_FAIR);
        size_t i;
        json_t *r;
        json_array_foreach(s, i, r)
        {
            json_int_t H = 0;
            json_t *mine = book_peer(s, r, bn, n, "holders", &H, &any);
            if (mine == NULL)
                continue;
            snprintf(what, sizeof what, "scale H=%lld: %s us/pair / %s us/pair", (long long)H, bn,
                     n);
            target_status(what, num(r, "pair_us") / num(mine, "pair_us"), "(info)", "", NULL);
            json_t *sb = json_object_get(r, "server"), *sm = json_object_get(mine, "server");
            if (json_is_object(sb) && json_is_object(sm)) {
                snprintf(what, sizeof what, "  server us per acquire, %s / %s", bn, n);
                target_status(what,
                              num(sb, "server_us_per_acquire") / num(sm, "server_us_per_acquire"),
                              "(info)", "", NULL);
                snprintf(what, sizeof what, "  longest acquire command, %s (ms)", bn);
                target_status(what, num(sb, "max_acquire_command_us") / 1e3, "(info)", "", NULL);
            }
        }
        json_array_foreach(c, i, r)
        {
            json_int_t C = 0;
            json_t *mine = book_peer(c, r, bn, n, "clients", &C, &any);
            if (mine == NULL)
                continue;
            snprintf(what, sizeof what, "contended C=%lld: %s grants/s / %s grants/s",
                     (long long)C, bn, n);
            target_status(what, num(r, "grants_per_s") / num(mine, "grants_per_s"), "(info)", "",
                          NULL);
            snprintf(what, sizeof what, "  %s grants out of order (margin)", bn);
            char note[64];
            snprintf(note, sizeof note, " (%s: %lld)", n,
                     (long long)num(mine, "out_of_order_margin"));
            target_status(what, num(r, "out_of_order_margin"), "(info)", "", note);
            double over = num(r, "holders_over_limit_events");
            snprintf(what, sizeof what, "  %s moments over the limit", bn);
            target(what, over, "== 0", over == 0, NULL);
        }
    }
}

static void print_targets(const bench_ctx *ctx)
{
    const bench_opts *o = ctx->o;
    json_t *root = ctx->json;
    printf("\n== the targets of issue 3, from this run (ratios are within this run)\n");
    json_t *u = json_object_get(root, "uncontended");
    if (u) {
        const char *note = o->affinity == AFF_SAME ? "" : "  (targets are for --pin)";
        for (int k = 0; k < 3; k++) {
            json_t *r = find_row(u, bench_kind_name(k), NULL, 0);
            if (r == NULL)
                continue;
            char what[96];
            snprintf(what, sizeof what, "uncontended %s pairs/s / floor (%s)", bench_kind_name(k),
                     o->affinity == AFF_SAME ? "pinned" : "not pinned");
            double v = num(r, "ratio_pairs_per_s");
            target(what, v, ">= 0.9", v >= 0.9, note);
        }
    }
    json_t *t = json_object_get(root, "threads");
    if (t) {
        size_t i;
        json_t *r;
        json_array_foreach(t, i, r)
        {
            int T = (int)json_integer_value(json_object_get(r, "threads"));
            if (T != 8 && T != 32)
                continue;
            char what[96];
            snprintf(what, sizeof what, "%d threads %s pairs/s / floor", T,
                     json_string_value(json_object_get(r, "strategy")));
            double v = num(r, "ratio_pairs_per_s");
            target(what, v, ">= 0.95", v >= 0.95, NULL);
        }
    }
    json_t *s = json_object_get(root, "scale");
    if (s) {
        for (int k = 0; k < 3; k++) {
            json_t *lo = find_row(s, bench_kind_name(k), "holders", 10);
            json_t *hi = find_row(s, bench_kind_name(k), "holders", 100000);
            if (lo == NULL || hi == NULL)
                continue;
            char what[96];
            snprintf(what, sizeof what, "scale %s cost(100,000) / cost(10)", bench_kind_name(k));
            double v = num(hi, "pair_us") / num(lo, "pair_us");
            target(what, v, "<= 2", v <= 2, NULL);
            snprintf(what, sizeof what, "  the same, each divided by its floor");
            v = (num(hi, "pair_us") / num(hi, "floor_pair_us")) /
                (num(lo, "pair_us") / num(lo, "floor_pair_us"));
            target(what, v, "<= 2", v <= 2, NULL);
        }
    }
    json_t *tk = json_object_get(root, "takeover");
    if (tk) {
        size_t i;
        json_t *r;
        json_array_foreach(tk, i, r)
        {
            const char *n = json_string_value(json_object_get(r, "strategy"));
            json_t *late = json_object_get(r, "late");
            char what[96];
            double p99 = json_number_value(json_object_get(late, "p99_us")) / 1e3;
            double mx = json_number_value(json_object_get(late, "max_us")) / 1e3;
            snprintf(what, sizeof what, "takeover %s p99 after the lease's end (ms)", n);
            target(what, p99, "<= 5", p99 <= 5, NULL);
            snprintf(what, sizeof what, "takeover %s max after the lease's end (ms)", n);
            target(what, mx, "<= 20", mx <= 20, NULL);
        }
    }
    json_t *rt = json_object_get(root, "rate");
    if (rt) {
        /* issue 12: exact, and no slot left unused while demand exceeds the rate */
        double v = num(rt, "window_violations");
        target("rate windows holding more than N grants", v, "== 0", v == 0, NULL);
        v = num(rt, "achieved_ratio");
        target("rate grants in K windows / K N", v, ">= 0.98", v >= 0.98, NULL);
        double wp = json_number_value(json_object_get(json_object_get(rt, "wake"), "p50_us"));
        target_status("rate wake-up p50 after a slot lapses (ms)", wp / 1e3, "(info)", "", NULL);
    }
    json_t *c = json_object_get(json_object_get(root, "contended"), "runs");
    if (c && o->limit == 4 && o->hold_min_ms == 1 && o->hold_max_ms == 5) {
        for (int k = 0; k < 3; k++) {
            json_t *r = find_row(c, bench_kind_name(k), "clients", 32);
            if (r == NULL)
                continue;
            const char *n = bench_kind_name(k);
            char what[96];
            double v = num(r, "max_holders");
            snprintf(what, sizeof what, "contended %s (32 clients) max holders", n);
            target(what, v, "== 4", v == 4, NULL);
            double trips = num(r, "round_trips_per_grant");
            snprintf(what, sizeof what, "contended %s round trips per grant", n);
            target(what, trips, k == BENCH_LOCKED ? "<= 8" : "<= 4",
                   trips <= (k == BENCH_LOCKED ? 8 : 4), NULL);
            double hp = json_number_value(
                json_object_get(json_object_get(r, "handoff"), "p50_us"));
            snprintf(what, sizeof what, "contended %s hand-off p50 (ms)", n);
            target(what, hp / 1e3, "<= 1", hp <= 1000, NULL);
            if (k == BENCH_FAIR) {
                double oo = num(r, "out_of_order_margin");
                char ow[96];
                snprintf(ow, sizeof ow, "contended fair grants out of order (margin %ld us)",
                         o->order_margin_us);
                target(ow, oo, "== 0", oo == 0, NULL);
                double os = num(r, "out_of_order_strict");
                target_status("contended fair grants out of order (strict)", os, "(info)", "",
                              "includes near-ties, see docs/benchmarks.md");
                double j = num(r, "jain_index");
                target("contended fair Jain's index", j, ">= 0.99", j >= 0.99, NULL);
            }
        }
    }
    print_book(ctx);
    /* issue 9 sets no target: it asks what TLS and WAIT cost */
    json_t *tl = json_object_get(root, "tls"), *sy = json_object_get(root, "sync");
    if (tl == NULL && sy == NULL)
        return;
    printf("\n== what TLS and WAIT cost (issue 9, no targets), from this run\n");
    size_t i;
    json_t *r;
    char what[96];
    json_array_foreach(json_object_get(tl, "uncontended"), i, r)
    {
        snprintf(what, sizeof what, "tls %s pairs/s, TLS / TCP, one client",
                 json_string_value(json_object_get(r, "strategy")));
        target_status(what, num(r, "ratio_pairs_per_s"), "(info)", "", NULL);
    }
    json_array_foreach(json_object_get(tl, "threads"), i, r)
    {
        snprintf(what, sizeof what, "tls %s pairs/s, TLS / TCP, %d threads",
                 json_string_value(json_object_get(r, "strategy")),
                 (int)json_integer_value(json_object_get(r, "threads")));
        target_status(what, num(r, "ratio_pairs_per_s"), "(info)", "", NULL);
    }
    json_array_foreach(json_object_get(sy, "rows"), i, r)
    {
        size_t k;
        json_t *set;
        json_array_foreach(json_object_get(r, "settings"), k, set)
        {
            int n = (int)json_integer_value(json_object_get(set, "replicas"));
            if (n == 0)
                continue;
            snprintf(what, sizeof what, "sync %s pairs/s, WAIT %d / no WAIT",
                     json_string_value(json_object_get(r, "strategy")), n);
            target_status(what, num(set, "ratio_pairs_per_s"), "(info)", "", NULL);
        }
    }
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    bench_opts o;
    parse_args(argc, argv, &o);
    bench_ctx ctx = {.o = &o, .t0_ns = bench_now_ns(), .json = json_object()};
    setvbuf(stdout, NULL, _IOLBF, 0);

    int cpu0, cpu1, ncpus;
    allowed_cpus(&cpu0, &cpu1, &ncpus);
    int bench_cpu = -1, server_cpu = -1;
    if (o.affinity == AFF_SAME) {
        bench_cpu = server_cpu = cpu0;
    } else if (o.affinity == AFF_SPLIT && cpu1 >= 0) {
        bench_cpu = cpu0;
        server_cpu = cpu1;
    }
    /* the private servers of the tls and sync workloads, which run even with --url */
    ctx.server_cpu = server_cpu;
    ctx.replica_cpu = o.affinity == AFF_SAME ? cpu0 : -1;
    bench_servers_init(&server); /* before the bench pins itself */
    if (o.url != NULL)
        server_cpu = -1; /* not ours to pin */

    char transport[32];
    if (o.url == NULL) {
        static const char *const extra[] = {"--maxmemory-policy", "noeviction", NULL};
        int rc = ts_server_start_pinned(&server, extra, !o.unix_socket, server_cpu);
        if (rc == 77)
            bench_die("redis-server not found (install it, set REDSEM_REDIS_SERVER, or use "
                      "--url)");
        if (rc != 0)
            bench_die("could not start a private redis-server");
        if (o.unix_socket)
            snprintf(ctx.url, sizeof ctx.url, "%s", server.url);
        else
            snprintf(ctx.url, sizeof ctx.url, "redis://127.0.0.1:%d", server.port);
        snprintf(transport, sizeof transport, "%s", o.unix_socket ? "unix socket" : "TCP loopback");
    } else {
        snprintf(ctx.url, sizeof ctx.url, "%s", o.url);
        snprintf(transport, sizeof transport, "%s",
                 strncmp(o.url, "unix:", 5) == 0 ? "unix socket" : "TCP");
    }
    if (bench_cpu >= 0)
        pin_self(bench_cpu);

    char rnd[REDSEM_ID_BUFSIZE];
    if (redsem_id_generate(rnd) != REDSEM_OK)
        bench_die("redsem_id_generate failed");
    snprintf(ctx.prefix, sizeof ctx.prefix, "redsem-bench:%d-%.8s:", (int)getpid(), rnd);

    ctx.raw_slots = bench_raw_slots(&ctx);

    /* ------------------------------------------------------------ parameters */
    redisContext *raw = bench_raw_connect(&ctx);
    char redis_version[64], redis_mode[32], redis_os[128];
    bench_info_field(raw, "server", "redis_version", redis_version, sizeof redis_version);
    bench_info_field(raw, "server", "redis_mode", redis_mode, sizeof redis_mode);
    bench_info_field(raw, "server", "os", redis_os, sizeof redis_os);
    redisFree(raw);
    char model[256], urlr[512], when[64];
    cpu_model(model, sizeof model);
    redact(ctx.url, urlr, sizeof urlr);
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    struct utsname un;
    if (uname(&un) != 0)
        memset(&un, 0, sizeof un);
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) < 0)
        load[0] = load[1] = load[2] = -1;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    static const char *const aff_names[] = {"split", "same", "none"};

    char cmdline[1024] = "";
    for (int i = 0; i < argc; i++) {
        size_t l = strlen(cmdline);
        snprintf(cmdline + l, sizeof cmdline - l, "%s%s", i ? " " : "", argv[i]);
    }
    json_t *jw = json_array(), *jk = json_array();
    for (int i = 0; i < BENCH_NWORKLOADS; i++)
        if (o.workloads[i])
            json_array_append_new(jw, json_string(workload_names[i]));
    for (int i = 0; i < BENCH_NALL; i++)
        if (o.kinds[i])
            json_array_append_new(jk, json_string(bench_kind_name(i)));
    json_t *jt = json_array(), *jc = json_array(), *jh = json_array();
    for (int i = 0; i < o.nthreads; i++)
        json_array_append_new(jt, json_integer(o.threads[i]));
    for (int i = 0; i < o.nclients; i++)
        json_array_append_new(jc, json_integer(o.clients[i]));
    for (int i = 0; i < o.nholders; i++)
        json_array_append_new(jh, json_integer(o.holders[i]));
    json_t *params = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:s}", "command", cmdline, "started_at",
        when, "redsem_version", redsem_version_string(), "redsem_commit", REDSEM_BENCH_COMMIT,
        "redis_version", redis_version, "redis_mode", redis_mode, "server",
        o.url ? "external (--url)" : "private (started by the bench)", "url", urlr, "procs",
        o.procs, "transport", transport);
    json_object_set_new(params, "workloads", jw);
    json_object_set_new(params, "strategies", jk);
    json_object_set_new(params, "pairs", json_integer(o.pairs));
    json_object_set_new(params, "rounds", json_integer(o.rounds));
    json_object_set_new(params, "threads", jt);
    json_object_set_new(params, "thread_secs", json_real(o.thread_secs));
    json_object_set_new(params, "thread_rounds", json_integer(o.rounds_threads));
    json_object_set_new(params, "threads_shared", json_boolean(o.threads_shared));
    json_object_set_new(params, "shared_client", json_boolean(o.shared_client));
    json_object_set_new(params, "renew", json_boolean(o.renew));
    json_object_set_new(params, "max_connections",
                        json_integer(o.max_connections > 0 ? o.max_connections
                                                           : REDSEM_DEFAULT_MAX_CONNECTIONS));
    json_object_set_new(params, "clients", jc);
    json_object_set_new(params, "limit", json_integer(o.limit));
    json_object_set_new(params, "hold_min_ms", json_real(o.hold_min_ms));
    json_object_set_new(params, "hold_max_ms", json_real(o.hold_max_ms));
    json_object_set_new(params, "duration_s", json_real(o.duration));
    json_object_set_new(params, "order_margin_us", json_integer(o.order_margin_us));
    json_object_set_new(params, "holders", jh);
    json_object_set_new(params, "scale_pairs", json_integer(o.scale_pairs));
    json_object_set_new(params, "fillers", json_integer(o.scale_fillers));
    json_object_set_new(params, "tls_pairs", json_integer(o.tls_pairs));
    json_object_set_new(params, "sync_pairs", json_integer(o.sync_pairs));
    json_object_set_new(params, "spread_sems", json_integer(o.spread_sems));
    json_object_set_new(params, "spread_threads", json_integer(o.spread_threads));
    json_object_set_new(params, "spread_secs", json_real(o.spread_secs));
    json_object_set_new(params, "loops", json_integer(o.loops));
    json_object_set_new(params, "slowlog", json_boolean(!o.no_slowlog));
    json_object_set_new(params, "loop_sems", json_integer(o.loop_sems));
    json_object_set_new(params, "loop_hold_min_ms", json_real(o.loop_hold_min_ms));
    json_object_set_new(params, "loop_hold_max_ms", json_real(o.loop_hold_max_ms));
    json_object_set_new(params, "loop_threads", json_integer(o.loop_threads));
    json_object_set_new(params, "target_reps", json_integer(o.target_reps));
    json_t *machine = json_pack(
        "{s:i, s:i, s:s, s:s, s:s, s:s, s:[f,f,f]}", "cores_online", (int)online, "cpus_allowed",
        ncpus, "cpu_model", model, "kernel", un.release, "machine", un.machine, "redis_os",
        redis_os, "loadavg_at_start", load[0], load[1], load[2]);
    json_t *aff = json_pack("{s:s}", "mode", aff_names[o.affinity]);
    json_object_set_new(aff, "bench_cpu", bench_cpu >= 0 ? json_integer(bench_cpu) : json_null());
    json_object_set_new(aff, "server_cpu",
                        server_cpu >= 0 ? json_integer(server_cpu) : json_null());
    json_object_set_new(params, "affinity", aff);
    json_object_set_new(ctx.json, "bench", json_string("redsem-bench"));
    json_object_set_new(ctx.json, "schema", json_integer(1));
    json_object_set_new(ctx.json, "params", params);
    json_object_set_new(ctx.json, "machine", machine);

    char bcpu[16] = "any", scpu[16] = "any";
    if (bench_cpu >= 0)
        snprintf(bcpu, sizeof bcpu, "%d", bench_cpu);
    if (server_cpu >= 0)
        snprintf(scpu, sizeof scpu, "%d", server_cpu);
    printf("redsem-bench %s (commit %s) against Redis %s, %s server over %s (%s)\n",
           redsem_version_string(), REDSEM_BENCH_COMMIT, redis_version,
           o.url ? "external" : "private", transport, urlr);
    printf("%ld cores online (%s); affinity %s: bench on CPU %s, server on CPU %s%s; load "
           "average %.2f\n",
           online, model, aff_names[o.affinity], bcpu, o.url ? "(external)" : scpu,
           o.affinity == AFF_SAME ? " (--pin: client-side cost shows)" : "", load[0]);
    printf("Only ratios within one run are comparable: the machine is shared and noisy.\n");

    /* ------------------------------------------------------------ workloads */
    if (o.workloads[BENCH_W_FLOOR])
        bench_run_uncontended(&ctx, true);
    if (o.workloads[BENCH_W_UNCONTENDED])
        bench_run_uncontended(&ctx, false);
    if (o.workloads[BENCH_W_THREADS])
        bench_run_threads(&ctx);
    if (o.workloads[BENCH_W_CONTENDED])
        bench_run_contended(&ctx);
    if (o.workloads[BENCH_W_SCALE])
        bench_run_scale(&ctx);
    if (o.workloads[BENCH_W_RENEWAL])
        bench_run_renewal(&ctx);
    if (o.workloads[BENCH_W_TAKEOVER])
        bench_run_takeover(&ctx);
    if (o.workloads[BENCH_W_RATE])
        bench_run_rate(&ctx);
    if (o.workloads[BENCH_W_WEIGHTED])
        bench_run_weighted(&ctx);
    if (o.workloads[BENCH_W_ASYNC])
        bench_run_async(&ctx);
    if (o.workloads[BENCH_W_LOOPS])
        bench_run_loops(&ctx);
    if (o.workloads[BENCH_W_TLS])
        bench_run_tls(&ctx);
    if (o.workloads[BENCH_W_SYNC])
        bench_run_sync(&ctx);
    if (o.workloads[BENCH_W_SPREAD])
        bench_run_spread(&ctx);
    if (o.workloads[BENCH_W_TARGETS])
        bench_run_targets(&ctx);
    bench_cleanup(&ctx, NULL);

    double elapsed = (double)(bench_now_ns() - ctx.t0_ns) / 1e9;
    json_object_set_new(params, "elapsed_s", json_real(elapsed));
    print_targets(&ctx);
    printf("\ndone in %.1f s%s\n", elapsed,
           ctx.exit_code == 2 ? "; FAILED: more holders than the limit (see above)" : "");
    if (o.json_path != NULL) {
        if (json_dump_file(ctx.json, o.json_path, JSON_INDENT(1) | JSON_REAL_PRECISION(6)) != 0)
            bench_die("cannot write %s", o.json_path);
        bench_progress(&ctx, "wrote %s", o.json_path);
    }
    json_decref(ctx.json);
    return ctx.exit_code;
}
