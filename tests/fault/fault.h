/* The fault-injection acceptance suite (issue 6): shared pieces of the worker, the scenario
 * runners and the checker.
 *
 *   witness.c  the shared-memory witnesses every worker writes to: an occupancy counter
 *              (incremented after acquire returns, decremented before release) with a slot
 *              per worker, the mutex's non-atomic read-sleep-write register, and a fenced
 *              register that rejects tokens lower than the highest it has seen;
 *   evlog.c    per-process event logs (one line per event, CLOCK_MONOTONIC timestamps);
 *   checker.c  the checks over the logs: sweep-line maximum of holder intervals, unknown
 *              outcomes as maybe-held, recovery times, under-grant;
 *   proxy.c    a fault-injecting TCP proxy (pass, blackhole, drop replies, close);
 *   harness.c  spawning pinned workers, faults, server monitor, quiescence.
 *
 * Nothing here is part of the library; the worker links only the public API. */
#ifndef REDSEM_FAULT_H
#define REDSEM_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <redsem/redsem.h>

/* ------------------------------------------------------------------ kinds */

/* What a worker contends for: a semaphore strategy or the lock. */
typedef enum fw_kind { FW_BASIC = 1, FW_FAIR = 2, FW_LOCKED = 3, FW_LOCK = 4 } fw_kind;
const char *fw_kind_name(fw_kind k);
int fw_kind_parse(const char *s, fw_kind *out);

/* ------------------------------------------------------------------ clocks */

int64_t fw_now_ns(void); /* CLOCK_MONOTONIC, shared by every process of the host */
void fw_sleep_ns(int64_t ns);
void fw_sleep_until_ns(int64_t t);

/* ------------------------------------------------------------------ witnesses (witness.c) */

#define FW_MAX_SLOTS 256
#define FW_MAX_VIOL 64

typedef struct fw_slot {
    _Atomic int active;            /* between witness_enter and witness_leave */
    _Atomic int wrote;             /* the fenced register was written in this section */
    _Atomic int in_acquire;        /* inside an acquire call */
    _Atomic int64_t deadline_ns;   /* the permit's validity deadline (updated while held) */
    _Atomic uint64_t token;
    _Atomic int pid;
    char id[REDSEM_ID_BUFSIZE];    /* holder id of the current / last acquire attempt */
    _Atomic int64_t enter_ns;
} fw_slot;

typedef struct fw_violation {
    int64_t t_ns;
    int slot;                      /* the worker whose entry made it exceed */
    uint64_t token;
    int live;                      /* live occupants counted, self included */
    int others[8];                 /* the other live occupants' slots */
    uint64_t other_tokens[8];
    int nothers;
} fw_violation;

typedef struct fw_shared {
    uint32_t limit;
    _Atomic int stop;              /* workers finish their current section and exit */
    _Atomic int occupancy;         /* the plain counter */
    _Atomic int max_occupancy;
    _Atomic int64_t first_full_ns; /* first time occupancy reached the limit (0: never) */
    _Atomic uint64_t acquisitions; /* successful acquires, all workers */
    _Atomic int nviol;             /* live occupants above the limit: violations */
    _Atomic int nstale;            /* counter above the limit only because of expired holders */
    fw_violation viol[FW_MAX_VIOL];
    /* the mutex register: read at the start of a section, written +1 at its end */
    volatile uint64_t reg;
    _Atomic uint64_t reg_sections; /* sections that wrote the register */
    /* the fenced register */
    _Atomic uint64_t fence_highest;
    _Atomic uint64_t fence_accepted;
    _Atomic uint64_t fence_rejected;
    _Atomic uint64_t fence_stale_accepted; /* accepted although the writer's validity had ended */
    _Atomic uint64_t fence_stale_rejected;
    fw_slot slot[FW_MAX_SLOTS];
} fw_shared;

/* Create (runner) or map (worker) the shared area in a file. */
fw_shared *fw_shared_create(const char *path, uint32_t limit);
fw_shared *fw_shared_open(const char *path);
void fw_shared_unmap(fw_shared *sh);

/* Worker side. enter returns 1 if this entry is a violation (recorded). */
int fw_witness_enter(fw_shared *sh, int slot, uint64_t token, int64_t deadline_ns);
void fw_witness_leave(fw_shared *sh, int slot);
/* Fenced write; returns 1 accepted, 0 rejected. held: whether the writer's validity lasts. */
int fw_fence_write(fw_shared *sh, uint64_t token, bool held);
/* Runner side, after a worker died: clear its slot (and the counter) if it was inside. Returns
 * 1 if it was inside its critical section. */
int fw_witness_reap(fw_shared *sh, int slot);
/* Live occupants now (active and before their validity deadline), excluding `except`. */
int fw_live_occupants(fw_shared *sh, int except, int64_t now_ns);

/* ------------------------------------------------------------------ event logs (evlog.c) */

/* Event types. */
enum {
    EV_START = 1, /* worker started: a = pid */
    EV_REQ,       /* acquire call starts: id; a = timeout ms */
    EV_ACQ,       /* granted: id, token; a = validity deadline ns */
    EV_UNK,       /* REDSEM_EUNKNOWN: id; a = when the call started */
    EV_BUSY,      /* REDSEM_EBUSY */
    EV_ERR,       /* another code: rc; a = when the call started */
    EV_CHK,       /* end of the hold: token; a = held (0/1); b = deadline ns */
    EV_LOST,      /* the holder learned it lost: token; a = reason (1 callback expired,
                     2 callback deadline, 3 held() false); b = deadline ns */
    EV_FWR,       /* fenced write: token; a = accepted; b = held */
    EV_END,       /* leaves the critical section (before release): token; a = deadline ns */
    EV_RFR,       /* refresh after a loss: rc */
    EV_REL,       /* release: rc */
    EV_EXIT,      /* worker exits normally */
    EV_DL,        /* the validity deadline moved (renewal): token; a = deadline ns */
    EV_STATS,     /* client counters since the first section: token = NOSCRIPT replies,
                     a = script loads, b = requests, rc = retries */
    /* runner events */
    EV_KILL,      /* a = worker slot */
    EV_STOP,      /* a = worker slot */
    EV_CONT,      /* a = worker slot */
    EV_FAULT,     /* a = fault begins (1) / ends (0); id = label */
    EV_NOTE,      /* free text in id */
    EV__COUNT
};
const char *ev_name(int ev);

typedef struct fw_event {
    int64_t t_ns;
    int slot;
    int ev;
    char id[64];
    uint64_t token;
    int rc;
    int64_t a, b;
} fw_event;

typedef struct fw_log {
    int fd;
    int slot;
} fw_log;

int fw_log_open(fw_log *l, const char *path, int slot);
void fw_log_close(fw_log *l);
/* One line per call, written with a single write(2) (survives SIGKILL, no buffering). */
void fw_emit(fw_log *l, int ev, const char *id, uint64_t token, int rc, int64_t a, int64_t b);

/* Read one log file (in file order). Returns the count or -1. Caller frees *out. */
ssize_t fw_log_read_file(const char *path, fw_event **out);
/* Read every "*.log" in dir, sorted by time. Returns the count or -1. Caller frees *out. */
ssize_t fw_logs_read(const char *dir, fw_event **out);

/* ------------------------------------------------------------------ checker (checker.c) */

typedef struct fw_interval {
    int slot;
    char id[REDSEM_ID_BUFSIZE];
    uint64_t token;
    int64_t start_ns, end_ns;
    bool maybe;   /* an acquire whose outcome is unknown */
    const char *why_end; /* release, lost, kill, deadline, maybe */
} fw_interval;

typedef struct fw_check_params {
    uint32_t limit;
    int64_t lease_ms;
    int64_t drift_ms;       /* added to maybe-held intervals: lease/100 + 2 by default */
} fw_check_params;

typedef struct fw_check_result {
    size_t intervals;       /* definite holder intervals */
    size_t maybe;           /* unknown outcomes */
    int max_definite;       /* sweep-line maximum over definite intervals */
    int max_with_maybe;     /* the same counting maybe-held intervals */
    size_t violations;      /* instants where definite holders exceed the limit */
    int64_t violation_ns;   /* total time above the limit */
    fw_interval viol_a, viol_b; /* two intervals of the first violation */
    size_t acq, busy, unknown, errors, lost, kills;
    size_t rel_ok, rel_lost, rel_err;
    size_t stale_accepted;  /* fenced writes accepted from a holder past its validity */
    size_t errors_by_code[32];
} fw_check_result;

/* Build the holder intervals from a sorted event list. Caller frees *out. */
ssize_t fw_intervals(const fw_event *ev, size_t n, const fw_check_params *p, fw_interval **out);
void fw_check(const fw_event *ev, size_t n, const fw_check_params *p, fw_check_result *r);
/* One line summary for the test log. */
void fw_check_print(const char *label, const fw_check_result *r);

/* ------------------------------------------------------------------ proxy (proxy.c) */

enum {
    FP_PASS = 0,         /* forward both ways */
    FP_BLACKHOLE = 1,    /* forward nothing, accept nothing; what was sent waits (as TCP
                            retransmission would) and flows on heal, unless the client aborted
                            the connection meanwhile (then it is dropped, as the client's
                            kernel would have stopped retransmitting) */
    FP_DROP_REPLIES = 2, /* forward requests; read and discard replies */
    FP_CLOSE = 3,        /* close every connection; accept and close new ones */
    FP_DROP_EVAL_REPLIES = 4 /* forward everything but the replies to EVALSHA requests with
                                3 keys or more: the acquire scripts, not the locked strategy's
                                guard scripts (1 key). The library never pipelines: one
                                request, then its reply */
};

typedef struct fp_proxy fp_proxy;
/* Listen on 127.0.0.1:<ephemeral> and forward to 127.0.0.1:target_port, in a thread. */
fp_proxy *fp_proxy_start(int target_port);
int fp_proxy_port(const fp_proxy *p);
void fp_proxy_set_mode(fp_proxy *p, int mode);
/* Hold every chunk of replies ms before forwarding it (0: none), in FP_PASS mode. */
void fp_proxy_set_reply_delay_ms(fp_proxy *p, int64_t ms);
size_t fp_proxy_connections(fp_proxy *p); /* accepted so far */
size_t fp_proxy_dropped_on_heal(fp_proxy *p); /* connections found aborted on heal */
void fp_proxy_stop(fp_proxy *p);

#endif /* REDSEM_FAULT_H */
