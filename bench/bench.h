/* redsem-bench - shared declarations of the benchmark harness.
 *
 * The harness links only the public API of libredsem (redsem/redsem.h). Raw hiredis is used
 * for three things the library deliberately does not offer: the "floor" loops (the same
 * number of round trips with a trivial script), INFO commandstats, and removing the bench's
 * own keys from the server afterwards. */
#ifndef REDSEM_BENCH_H
#define REDSEM_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include <redsem/redsem.h>

struct redisContext;
struct ts_server;

/* ---------------------------------------------------------------- strategies */
/* The four things measured: the three semaphore strategies and the lock. */
enum { BENCH_BASIC = 0, BENCH_FAIR = 1, BENCH_LOCKED = 2, BENCH_LOCK = 3, BENCH_NKINDS = 4 };
/* Not the library's: Redis in Action's fair semaphore and its lock-guarded variant, as
 * reference scripts (reference.c), measured by the scale and contended workloads only.
 * Named "book-fair" and "book-locked". */
enum { BENCH_BOOK_FAIR = 4, BENCH_BOOK_LOCKED = 5, BENCH_NALL = 6 };
const char *bench_kind_name(int kind); /* any of the BENCH_NALL */
/* Round trips per uncontended acquire and per release (the floor reproduces both). */
int bench_kind_acquire_trips(int kind);

/* ---------------------------------------------------------------- options */
#define BENCH_MAX_LIST 16
#define BENCH_NWORKLOADS_MAX 15
#define BENCH_LOOP_THREADS_MAX 16 /* --loop-threads */

enum { AFF_SPLIT = 0, AFF_SAME = 1, AFF_NONE = 2 };

typedef struct bench_opts {
    const char *url;       /* NULL: private server */
    bool unix_socket;      /* private server: use its unix socket instead of TCP loopback */
    int affinity;          /* AFF_* */
    const char *json_path; /* NULL: no JSON */
    bool workloads[BENCH_NWORKLOADS_MAX]; /* indexed by BENCH_W_* */
    bool kinds[BENCH_NALL]; /* the library's BENCH_NKINDS, then the book's references */
    long pairs;   /* uncontended pairs per strategy (all rounds together) */
    int rounds;   /* interleaved rounds (floor, strategy) */
    int threads[BENCH_MAX_LIST];
    int nthreads;
    double thread_secs; /* seconds per threaded batch */
    int rounds_threads; /* batches of each (floor, library) per thread count */
    bool threads_shared; /* threads share one semaphore of limit T */
    bool shared_client;  /* threads, contended (threads): all use one redsem_client */
    bool renew;          /* threads: every library permit is put under automatic renewal */
    int max_connections; /* redsem_options_set_max_connections(); 0: the library's default */
    int clients[BENCH_MAX_LIST];
    int nclients;
    uint32_t limit;
    double hold_min_ms, hold_max_ms;
    double duration; /* seconds per contended run */
    bool procs;
    long holders[BENCH_MAX_LIST];
    int nholders;
    long scale_pairs;
    int scale_fillers;
    long order_margin_us;
    long tls_pairs;  /* tls: pairs per strategy and transport (all rounds together) */
    long sync_pairs; /* sync: pairs per strategy and WAIT setting (all rounds together) */
    long spread_sems;   /* spread: semaphores */
    int spread_threads; /* spread: threads */
    double spread_secs; /* spread: seconds per run */
    int loops;          /* loops: acquire-hold-release loops on one libuv loop */
    int loop_sems;      /* loops: semaphores they share */
    double loop_hold_min_ms, loop_hold_max_ms; /* loops: hold time */
    int loop_threads;   /* loops: threads that start the releases (0: the loop's) */
    int target_reps;    /* targets: repetitions (medians over them) */
    bool no_slowlog; /* scale, contended: leave the server's SLOWLOG settings alone */
    bool quiet; /* no progress on stderr */
} bench_opts;

enum {
    BENCH_W_UNCONTENDED = 0,
    BENCH_W_THREADS = 1,
    BENCH_W_CONTENDED = 2,
    BENCH_W_SCALE = 3,
    BENCH_W_FLOOR = 4,
    BENCH_W_RENEWAL = 5,
    BENCH_W_TAKEOVER = 6,
    BENCH_W_TLS = 7,  /* not in the default suite */
    BENCH_W_SYNC = 8, /* not in the default suite */
    BENCH_W_RATE = 9,
    BENCH_W_WEIGHTED = 10,
    BENCH_W_SPREAD = 11, /* not in the default suite */
    BENCH_W_ASYNC = 12,
    BENCH_W_LOOPS = 13,
    BENCH_W_TARGETS = 14, /* not in the default suite: issue 25's targets, repeated */
    BENCH_NWORKLOADS = 15
};

/* ---------------------------------------------------------------- run context */
typedef struct bench_ctx {
    const bench_opts *o;
    char url[512];       /* what the library clients connect to */
    char prefix[96];     /* key prefix of this run, "redsem-bench:<pid>-<rand>:" */
    int64_t t0_ns;       /* start of the run, for progress lines */
    json_t *json;        /* root object (NULL when --json was not given: results are still
                            built, then dropped) */
    int exit_code;       /* 0, or 2 after a safety violation */
    unsigned seq;        /* for unique semaphore names */
    /* Library clients only (bench_client): the raw hiredis connections have no TLS (hiredis
     * 0.14) and never WAIT. The tls and sync workloads set these on copies of the context. */
    const char *tls_ca;      /* rediss:// URL: verify the server with this CA file */
    int sync_replicas;       /* > 0: redsem_options_set_sync_replicas(sync_timeout_ms) */
    int64_t sync_timeout_ms;
    /* The private servers the tls and sync workloads start (also with --url): the primary's
     * CPU and the replicas' (-1: not pinned, on any CPU the bench may use). */
    int server_cpu, replica_cpu;
    /* --url redis+cluster://: the hash slots served by the first seed node, the one the raw
     * connections reach (bench_name picks names there); NULL for any other URL */
    unsigned char *raw_slots;
    bool metrics_off; /* library clients: redsem_options_set_metrics(o, false) (metrics.c) */
} bench_ctx;

/* ---------------------------------------------------------------- time, randomness */
int64_t bench_now_ns(void);
void bench_sleep_ns(int64_t ns);
/* xorshift64*; seed must not be 0. */
uint64_t bench_rand(uint64_t *state);
uint64_t bench_seed(void);

/* ---------------------------------------------------------------- samples */
typedef struct bench_samples {
    int64_t *v; /* ns */
    size_t n, cap;
} bench_samples;

void samples_init(bench_samples *s);
void samples_free(bench_samples *s);
void samples_add(bench_samples *s, int64_t ns);
void samples_merge(bench_samples *dst, const bench_samples *src);

/* Percentiles by the nearest-rank rule (the smallest value with at least q of the samples at
 * or below it), in microseconds. */
typedef struct bench_pct {
    size_t n;
    double mean, p50, p90, p99, p999, max; /* us */
} bench_pct;

bench_pct bench_percentiles(int64_t *v, size_t n); /* sorts v */
json_t *bench_pct_json(const bench_pct *p);
double bench_median(double *v, size_t n); /* sorts v */
/* Jain's fairness index (sum x)^2 / (n sum x^2); 1 for n == 0 or all zero. */
double bench_jain(const uint64_t *x, size_t n);

/* ---------------------------------------------------------------- output */
void bench_progress(const bench_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Fatal setup error: message on stderr, exit 1. */
_Noreturn void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- library clients */
redsem_client *bench_client(const bench_ctx *ctx); /* exits on failure */
/* Same, returning the status and a message instead of exiting (for worker processes). */
int bench_client_try(const bench_ctx *ctx, redsem_client **ret, char *err, size_t errlen);
/* A fresh semaphore name "<tag>-<n>" unique within the run. In a cluster (raw_slots), one
 * whose keys and whose floor's keys are on the raw connections' node. */
void bench_name(bench_ctx *ctx, const char *tag, char *out, size_t outlen);
/* The floor's name for a semaphore name (same length, another hash tag). */
void bench_floor_name(const char *name, char *out, size_t outlen);
/* The Redis Cluster hash slot of the keys of semaphore NAME (hash tag {NAME}). */
int bench_name_slot(const char *name);
/* raw_slots of a redis+cluster:// URL (NULL for any other): exits on failure. */
unsigned char *bench_raw_slots(const bench_ctx *ctx);

/* A handle for one kind: a semaphore (basic, fair, locked) or the lock. */
typedef struct bench_handle {
    int kind;
    redsem_sem *sem;
    redsem_lock *lock;
} bench_handle;

int bench_handle_open(redsem_client *c, int kind, const char *name, uint32_t limit,
                      int64_t lease_ms, bench_handle *h);
void bench_handle_close(bench_handle *h);
int bench_acquire(bench_handle *h, int64_t timeout_ms, redsem_permit **p);
int bench_acquire_as(bench_handle *h, const char *id, int64_t timeout_ms, redsem_permit **p);
uint64_t bench_requests(const redsem_client *c); /* redsem_client_get_stats().requests */
uint64_t bench_pool_waits(const redsem_client *c); /* redsem_client_get_stats().pool_waits */
/* One acquire (up to 5 s) + release on h, timed: their durations in ns; exits on failure. */
void bench_lib_pair(bench_handle *h, redsem_client *c, int64_t *acq_ns, int64_t *rel_ns);

/* ---------------------------------------------------------------- raw hiredis */
struct redisContext *bench_raw_connect(const bench_ctx *ctx);
/* INFO commandstats as (name, calls) pairs. */
#define BENCH_MAX_CMDS 256
typedef struct bench_cmdstats {
    int n;
    char name[BENCH_MAX_CMDS][48];
    uint64_t calls[BENCH_MAX_CMDS];
    uint64_t usec[BENCH_MAX_CMDS];
} bench_cmdstats;
int bench_cmdstats_get(struct redisContext *c, bench_cmdstats *out);
uint64_t bench_cmdstats_calls(const bench_cmdstats *s, const char *name);
/* usec the server spent executing the requests the bench's clients send for this kind: EVALSHA
 * and BLPOP, plus SET for book-locked's guard (the library's guard runs SET in a script). A script's EVALSHA usec includes the
 * commands the script calls, which Redis also counts under their own names, so summing
 * every command would count those twice. */
uint64_t bench_cmdstats_request_usec(const bench_cmdstats *s, int kind);
/* CPU time of the server's main thread (user + sys, INFO cpu), in us; -1 if unknown. */
double bench_server_cpu_us(struct redisContext *c);
/* CPU time of the calling thread, us. */
double bench_thread_cpu_us(void);
/* "redis_version" etc. from INFO server; writes "" if absent. */
void bench_info_field(struct redisContext *c, const char *section, const char *field, char *out,
                      size_t outlen);
/* INFO clients connected_clients (the connections the server has open, this one included);
 * -1 if unknown. */
long bench_connected_clients(struct redisContext *c);
/* UNLINK every key of this run whose name starts with PREFIX{NAME} (NAME NULL: all keys of
 * the run). Returns how many were removed. */
long bench_cleanup(const bench_ctx *ctx, const char *name);

/* ---------------------------------------------------------------- private servers (servers.c) */
/* Once, in main() before the bench pins itself to a CPU: remember the CPUs allowed
 * (bench_server_start's "any CPU"), and at exit and on SIGINT, SIGTERM and SIGHUP stop every
 * private server and remove the tracked directories. `main` is the bench's own private
 * server, which main() starts itself (its pid 0 until then); borrowed for the process's
 * life. */
void bench_servers_init(struct ts_server *main);
/* Start one more private redis-server (ts_server_start_pinned; cpu < 0: on every CPU the
 * bench was allowed at its start, not only the bench's own); it is stopped, and its
 * directory removed, at exit and on SIGINT/SIGTERM/SIGHUP. Must be called from the main
 * thread (a private server dies with the thread that started it). Returns as
 * ts_server_start. */
int bench_server_start(const char *const *extra, bool tcp, int cpu, struct ts_server *s);
void bench_server_stop(struct ts_server *s);
/* A temporary directory holding the listed files (NULL-terminated, a static array):
 * removed with them at exit and on those signals unless bench_tempdir_remove() did it first. */
void bench_tempdir_track(const char *dir, const char *const *files);
void bench_tempdir_remove(const char *dir);

/* ---------------------------------------------------------------- the floor */
/* A raw hiredis connection that sends, per pair, the same requests as the library would for
 * one kind (same count, same number of KEYS and ARGV, key names of the same length) with a
 * trivial script ("return 1") in place of the real one. */
typedef struct bench_floor bench_floor;
bench_floor *bench_floor_new(const bench_ctx *ctx, int kind, const char *name);
void bench_floor_free(bench_floor *f);
int bench_floor_acquire(bench_floor *f); /* 0 ok */
int bench_floor_release(bench_floor *f);

/* ---------------------------------------------------------------- the book's references */
/* One client of the book's fair (BENCH_BOOK_FAIR) or locked (BENCH_BOOK_LOCKED) semaphore on
 * its own raw connection, holding at most one permit at a time; floor: the same requests
 * with "return 1" in place of every script and of the guard's SET. timeout_s: the book's
 * semaphore timeout (its lease), on the client's clock. Exits on a setup failure. */
typedef struct bench_ref bench_ref;
bench_ref *bench_ref_new(const bench_ctx *ctx, int kind, const char *name, uint32_t limit,
                         double timeout_s, bool floor);
void bench_ref_free(bench_ref *r);
/* One attempt as published: the ticket (> 0) if granted, 0 if not (rank >= limit, or the
 * locked one's guard busy for 10 ms), -1 on an error (printed on stderr). */
long long bench_ref_try(bench_ref *r);
/* Attempts until granted, 1 ms apart (the book's acquire does not wait), up to timeout_ms:
 * as bench_ref_try. */
long long bench_ref_acquire(bench_ref *r, int64_t timeout_ms);
int bench_ref_release(bench_ref *r); /* 0 ok, -1 error */
uint64_t bench_ref_requests(const bench_ref *r); /* requests sent (round trips) */
/* The state of holders from+1..to as the book's acquire leaves it (tickets from+1..to, every
 * timeout now), written directly with pipelined ZADDs. */
void bench_ref_fill(const bench_ctx *ctx, const char *name, long from, long to);
/* The keys: timeout set, owner set, counter, guard. */
void bench_ref_keys(const bench_ctx *ctx, const char *name, char key[4][640]);
enum { BENCH_REF_ACQUIRE = 0, BENCH_REF_RELEASE = 1, BENCH_REF_GUARD_RELEASE = 2 };
const char *bench_ref_sha(int script);

/* What the server spent on acquires, from its SLOWLOG (every command logged, with its
 * execution time, while a bench_slowlog is on): the sum and the longest single command of
 * the kind's acquire path (fair: fair_acquire.lua; locked: the guard script too; book-fair:
 * its acquire script; book-locked: the guard's SET, the acquire script, the guard's release),
 * and of its releases. A command holds the server for its whole execution: acquire_max_us is
 * the longest time one acquire kept every other client waiting. */
typedef struct bench_busy {
    bool valid; /* false: the server refused CONFIG SET, no figures */
    long threshold_us; /* the SLOWLOG's: > 0, only commands at least this slow are counted */
    uint64_t acquire_cmds, release_cmds, all_cmds;
    double acquire_us, release_us;
    long long acquire_max_us, any_max_us;
    /* every acquire-path command's time (as ns, like every sample): the max also catches a
     * server process descheduled by the machine, the p99 much less */
    bench_samples acq;
} bench_busy;
void bench_busy_free(bench_busy *b);
typedef struct bench_slowlog bench_slowlog;
/* Log every command slower than slower_than_us (0: all), keeping max_len entries; NULL if the
 * server refuses CONFIG SET. Restores the settings in bench_slowlog_stop(). */
bench_slowlog *bench_slowlog_start(const bench_ctx *ctx, long slower_than_us, long max_len);
/* Adds the entries logged since the last call to b (for kind), and empties the log. -1 if s
 * is NULL or on an error. */
int bench_slowlog_collect(bench_slowlog *s, int kind, bench_busy *b);
void bench_slowlog_stop(bench_slowlog *s);
json_t *bench_busy_json(bench_busy *b, uint64_t acquires); /* sorts b->acq */

/* ---------------------------------------------------------------- workloads */
void bench_run_uncontended(bench_ctx *ctx, bool floor_only);
/* The metrics recording's cost on the uncontended pair (metrics.c; run by the uncontended
 * workload at its end). */
void bench_run_metrics_cost(bench_ctx *ctx);
void bench_run_threads(bench_ctx *ctx);
void bench_run_contended(bench_ctx *ctx);
void bench_run_scale(bench_ctx *ctx);
void bench_run_renewal(bench_ctx *ctx);
void bench_run_takeover(bench_ctx *ctx);
void bench_run_tls(bench_ctx *ctx);
void bench_run_sync(bench_ctx *ctx);
void bench_run_rate(bench_ctx *ctx);
void bench_run_weighted(bench_ctx *ctx);
void bench_run_spread(bench_ctx *ctx);
void bench_run_async(bench_ctx *ctx);
void bench_run_loops(bench_ctx *ctx);
void bench_run_targets(bench_ctx *ctx);

/* Table helpers: a fixed-width row printer that also works as the header. */
void bench_rule(int width);

#endif /* REDSEM_BENCH_H */
