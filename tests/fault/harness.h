/* Fault suite: the runner side (used by the criterion scenario files). */
#ifndef REDSEM_FAULT_HARNESS_H
#define REDSEM_FAULT_HARNESS_H

#include <pthread.h>
#include <stdatomic.h>

#include <hiredis/hiredis.h>

#include "fault.h"
#include "server.h"

#define FH_RUNNER_SLOT (FW_MAX_SLOTS - 1)
#define FH_MAX_SAMPLES 200000

/* One server observation of a holder (for "no permit stays held beyond lease + 1 s"). */
typedef struct fh_sample {
    int64_t t_ns;
    char id[REDSEM_ID_BUFSIZE];
    int64_t remaining_ms;
} fh_sample;

typedef struct fh_run {
    char label[128];
    char dir[256];
    char name[128];
    fw_kind kind;
    uint32_t limit;
    int64_t lease_ms;
    fw_shared *sh;
    fw_log log;
    ts_server srv;
    bool have_server;
    char url[512];          /* what workers use (the server's, or a proxy's) */
    pid_t pid[FW_MAX_SLOTS]; /* the worker process of each first slot (0 elsewhere) */
    int first[FW_MAX_SLOTS]; /* the first slot of the process a slot's contender runs in */
    int nthreads[FW_MAX_SLOTS]; /* contenders (slots) of the process of each first slot */
    int nslots;
    /* server monitor */
    pthread_t mon;
    bool mon_running;
    _Atomic int mon_stop;
    _Atomic int mon_max_holders;
    _Atomic int64_t mon_polls;
    int64_t mon_interval_ns;
    bool mon_record;        /* keep every holder observation in samples[] */
    fh_sample *samples;
    _Atomic size_t nsamples;
} fh_run;

/* Number of online CPUs >= 2: pin the server to CPU 0, the runner and workers to CPU 1. */
bool fh_pinning(void);

/* Make a run: temp dir, shared witnesses, runner log; start a private server (pinned) with
 * extra arguments unless server_args is (const char *const *)-1 (no server). tcp: listen on
 * a loopback port too. Fails the test on error (criterion assert). */
void fh_setup(fh_run *r, const char *label, fw_kind kind, uint32_t limit, int64_t lease_ms,
              const char *const *server_args, bool tcp);
/* Stop the monitor, kill every worker, stop the server, remove the dir (kept when the
 * environment has REDSEM_FAULT_KEEP=1). */
void fh_teardown(fh_run *r);

/* Start a worker with the run's kind/name/limit/lease on url (NULL: r->url) and extra
 * NULL-terminated arguments. Returns its slot. */
int fh_spawn(fh_run *r, const char *url, const char *const *extra);
/* Start a worker process of `threads` contender threads sharing one client (fault-worker
 * --threads): it takes the slots first..first+threads-1, each thread logging to its slot's
 * log. Returns the first slot. */
int fh_spawn_threads(fh_run *r, const char *url, int threads, const char *const *extra);
/* SIGKILL a worker, reap it, log KILL (one per slot of its process); returns 1 if it died
 * inside its critical section (any of its threads). */
int fh_kill(fh_run *r, int slot);
/* SIGSTOP a worker and wait until it is stopped; log STOP. */
void fh_stop(fh_run *r, int slot);
void fh_cont(fh_run *r, int slot);
/* Wait up to ms for every worker to exit by itself; returns how many are still running. */
int fh_wait(fh_run *r, int64_t ms);
/* Ask every worker to finish (shared stop flag), wait up to ms, then SIGKILL stragglers.
 * Returns how many had to be killed. */
int fh_finish(fh_run *r, int64_t ms);
/* A worker in its critical section (after its fenced write, not in acquire), chosen at
 * random, waiting up to ms for one; -1 if none. except: a slot to skip (-1 none). */
int fh_pick_holder(fh_run *r, int except, int64_t ms);
/* ns from t0 until `limit` live occupants other than `except` hold (the capacity is back),
 * polling every ms; -1 if not within timeout_ms. */
int64_t fh_wait_full(fh_run *r, int except, int64_t t0, int64_t timeout_ms);

/* Wait up to ms for worker `slot` to log event ev about token (0: any) at or after t_ns;
 * fills *out and returns true when found. */
bool fh_wait_event(fh_run *r, int slot, int ev, uint64_t token, int64_t t_ns, int64_t ms,
                   fw_event *out);
void fh_note(fh_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fh_fault(fh_run *r, const char *label, bool begins);

/* Server monitor: a thread polling the semaphore's (or lock's) status every interval_ms on
 * its own connection; keeps the maximum live holder count; with record, every holder seen. */
void fh_monitor_start(fh_run *r, int64_t interval_ms, bool record);
void fh_monitor_stop(fh_run *r);

/* Read the logs and run the checker. */
void fh_check(fh_run *r, fw_check_result *res);

/* Quiescence: waits lease + 1 s, then checks that every key of the name has a TTL, that the
 * sets are empty or consistent, and that a fresh client gets exactly `limit` permits.
 * Asserts; prints a QUIESCENCE line. */
void fh_quiescence(fh_run *r);

/* hiredis connection to the run's server (unix socket). */
redisContext *fh_redis(fh_run *r);
/* A client of the run's server (unix socket) with retry / command timeout (-1 default). */
redsem_client *fh_client(const char *url, int64_t retry_ms, int64_t cmd_timeout_ms);
/* Open the run's semaphore or lock on client c. */
void fh_open(fh_run *r, redsem_client *c, redsem_sem **s, redsem_lock **l);
int fh_acquire(redsem_sem *s, redsem_lock *l, int64_t timeout_ms, redsem_permit **p);
int fh_status(redsem_sem *s, redsem_lock *l, redsem_status **st);

/* Number of open file descriptors of this process. */
int fh_count_fds(void);

#endif
