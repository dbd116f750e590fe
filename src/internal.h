/* redsem - private declarations shared by the library's source files. Not API. */
#ifndef REDSEM_INTERNAL_H
#define REDSEM_INTERNAL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "redsem/redsem.h"
#include "lua_scripts.h"

struct redisReply;
struct redisReadTask;
struct redisReplyObjectFunctions;

/* ---------------------------------------------------------------- allocation (alloc.c) */
/* Every allocation of the library goes through these, so that an allocator hook can be
 * added in one place later (STYLE 2.6). redsem__calloc checks n * size for overflow. */
void *redsem__malloc(size_t size);
void *redsem__calloc(size_t n, size_t size);
void *redsem__realloc(void *p, size_t size);
char *redsem__strdup(const char *s);
char *redsem__memdup0(const void *p, size_t len); /* copy + NUL */
void redsem__free(void *p);

/* ---------------------------------------------------------------- time (util.c) */
#define REDSEM__NS_PER_MS 1000000LL
#define REDSEM__FOREVER INT64_MAX
int64_t redsem__now_ns(void); /* CLOCK_MONOTONIC */
int64_t redsem__deadline_after_ms(int64_t ms); /* now + ms, saturating; ms < 0 => forever */
/* Sleep until min(now + ns, deadline); returns early on EINTR only. */
void redsem__sleep_ns(int64_t ns);
/* Uniform random integer in [lo, hi] (libsodium). */
int64_t redsem__rand_between(int64_t lo, int64_t hi);
/* Validity deadline: sent + lease - (lease/100 + 2 ms). */
int64_t redsem__validity_deadline(int64_t sent_ns, int64_t lease_ms);
/* The renewer declares a permit lost this long before its validity deadline:
 * min(lease/50, 25 ms), at least 1 ms. */
int64_t redsem__lost_early_ms(int64_t lease_ms);
/* A refresh applies only while the lease has at least this left on the server: the drift
 * margin, the early warning, and a slack of min(early + 5 ms, lease/10) (see util.c). */
int64_t redsem__refresh_margin_ms(int64_t lease_ms);

/* ---------------------------------------------------------------- validation (util.c) */
bool redsem__valid_name(const char *name);
bool redsem__valid_prefix(const char *prefix);
bool redsem__valid_id(const char *id);
bool redsem__valid_lease(int64_t ms);
bool redsem__valid_wait(int64_t ms);
int redsem__new_id(char out[REDSEM_ID_BUFSIZE]);

/* ---------------------------------------------------------------- URL (url.c) */
enum { REDSEM__EP_TCP = 1, REDSEM__EP_UNIX = 2 };
typedef struct redsem__endpoint {
    int kind;
    char *host;     /* TCP: name or address, brackets removed */
    int port;       /* TCP */
    char *path;     /* UNIX */
    char *user;     /* NULL: none */
    char *password; /* NULL: none */
    long db;
} redsem__endpoint;

#define REDSEM__URL_MAX 4096
/* Parse url into ep (all strings owned by ep). Returns REDSEM_OK, REDSEM_EINVAL (with a
 * reason in err) or REDSEM_ENOMEM. ep is untouched on failure. */
int redsem__url_parse(const char *url, redsem__endpoint *ep, char *err, size_t errlen);
int redsem__endpoint_copy(redsem__endpoint *dst, const redsem__endpoint *src);
void redsem__endpoint_clear(redsem__endpoint *ep);

/* ---------------------------------------------------------------- transport (conn.c) */
/* A socket plus a hiredis protocol reader. hiredis formats requests and parses replies;
 * the socket I/O is ours so that writes never raise SIGPIPE (MSG_NOSIGNAL) and every wait
 * has a precise deadline (poll), which hiredis 0.14's blocking context cannot give. */
typedef struct redsem__conn {
    int fd; /* -1 when closed; a blocking socket with SO_RCVTIMEO/SO_SNDTIMEO */
    void *reader; /* redisReader* */
    int64_t io_timeout_ns; /* the SO_RCVTIMEO/SO_SNDTIMEO set on fd: the command timeout */
    /* hiredis' reply constructors with the array one capped (see redsem__conn_reader) */
    struct redisReplyObjectFunctions *fns;
    void *(*create_array)(const struct redisReadTask *task, int elements);
    long long oversized; /* the element count of a refused aggregate header */
} redsem__conn;

/* No redsem reply holds more elements than a status listing REDSEM_LIMIT_MAX holders. */
#define REDSEM__MAX_REPLY_ELEMENTS (3 * (long long)REDSEM_LIMIT_MAX)

enum {
    REDSEM__IO_OK = 0,
    REDSEM__IO_TIMEOUT = 1, /* deadline passed */
    REDSEM__IO_CLOSED = 2,  /* EOF, reset, refused: the connection is gone */
    REDSEM__IO_PROTO = 3,   /* unparsable reply */
    REDSEM__IO_NOMEM = 4
};

void redsem__conn_init(redsem__conn *c);
/* Create c->reader: hiredis' reader, whose array constructor refuses an aggregate header of
 * more than REDSEM__MAX_REPLY_ELEMENTS (hiredis 0.14 allocates the announced count before
 * any element arrives). REDSEM_OK or REDSEM_ENOMEM. */
int redsem__conn_reader(redsem__conn *c);
/* Returns REDSEM_OK, REDSEM_ECONN, REDSEM_ETIMEDOUT or REDSEM_ENOMEM; *retryable says whether
 * trying again may help (refused: yes; name not found: no). */
int redsem__conn_open(redsem__conn *c, const redsem__endpoint *ep, int64_t deadline_ns,
                      int64_t io_timeout_ms, bool *retryable, char *err, size_t errlen);
void redsem__conn_close(redsem__conn *c);
/* Close with a RST (SO_LINGER 0): unsent and unacknowledged bytes are discarded, so a request
 * abandoned after a failure can never be delivered later. */
void redsem__conn_abort(redsem__conn *c);
/* Write all of buf before deadline_ns (0: now + the command timeout); a full send buffer
 * waits in poll. REDSEM__IO_OK, _TIMEOUT (part may have been written) or _CLOSED. */
int redsem__conn_write(redsem__conn *c, const char *buf, size_t len, int64_t deadline_ns,
                       int *err_no);
/* deadline_ns == 0: an ordinary request, bounded by the socket's own receive timeout (one
 * blocking recv, no poll: the common path costs two system calls per request, as hiredis'
 * blocking context does); otherwise poll until deadline_ns. */
int redsem__conn_read(redsem__conn *c, struct redisReply **ret, int64_t deadline_ns,
                      int *err_no, char *err, size_t errlen);

/* ---------------------------------------------------------------- requests (client.c) */
#define REDSEM__MAX_ARGS 24
typedef struct redsem__args {
    int n;
    const char *v[REDSEM__MAX_ARGS];
    size_t len[REDSEM__MAX_ARGS];
    char num[REDSEM__MAX_ARGS][24];
} redsem__args;
void redsem__args_init(redsem__args *a);
void redsem__args_str(redsem__args *a, const char *s);
void redsem__args_mem(redsem__args *a, const char *s, size_t len);
void redsem__args_i64(redsem__args *a, int64_t v);

/* Request flags. */
#define REDSEM__REQ_RETRY 0x1 /* re-send after a connection-level failure (idempotent) */

/* Outcome detail of a request, for callers that must tell "not applied" from "maybe". */
typedef struct redsem__req_info {
    bool maybe_applied; /* a copy was fully written and its reply never came */
    int64_t sent_ns;    /* when the copy that got the reply was written (start of write) */
    int64_t recv_ns;    /* when its reply was read */
} redsem__req_info;

/* One request/reply. Connects first if needed. *ret_reply is set on REDSEM_OK only and may
 * be an error reply (the caller classifies it). deadline_ns bounds the reply wait; 0 means
 * now + command timeout. */
int redsem__request(redsem_client *c, const redsem__args *a, int flags, int64_t deadline_ns,
                    struct redisReply **ret_reply, redsem__req_info *info);

/* Run one embedded script: EVAL with its body on this client's first use, EVALSHA after,
 * EVAL again after NOSCRIPT (one more round trip only then); error replies
 * are classified into codes with the text in errmsg. On REDSEM_OK *ret_reply is a non-error
 * reply owned by the caller. keys/args are appended after "EVALSHA sha numkeys". */
int redsem__eval(redsem_client *c, int script, int nkeys, const redsem__args *keys_and_args,
                 int flags, redsem__req_info *info, struct redisReply **ret_reply);

/* Map an error reply to a code and record it. */
int redsem__error_reply(redsem_client *c, const struct redisReply *r, const char *what);

/* BLPOP key for up to wait_ms (server side), giving up at hard_deadline_ns (the connection
 * is then discarded). Returns REDSEM_OK with *signaled, or a fault. */
int redsem__blpop(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                  int64_t hard_deadline_ns, bool *signaled);

int redsem__set_err(redsem_client *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void redsem__clear_err(redsem_client *c);
int redsem__check_owner(redsem_client *c); /* EFORKED after fork */

/* Reply helpers: return false if the shape is wrong. */
bool redsem__reply_int(const struct redisReply *r, long long *out);
/* The first element of a script's {status, ...} array reply; REDSEM_EPROTO otherwise. */
int redsem__reply_status(redsem_client *c, const struct redisReply *r, const char *what,
                         long long *status);
bool redsem__reply_u64(const struct redisReply *r, uint64_t *out);

/* ---------------------------------------------------------------- client */
struct redsem_options {
    redsem__endpoint ep;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    char *prefix;
};

typedef struct redsem__renewer redsem__renewer;

struct redsem_client {
    redsem__endpoint ep;
    int64_t connect_timeout_ms;
    int64_t command_timeout_ms;
    int64_t retry_ms;
    char *prefix;
    size_t prefix_len;
    pid_t pid; /* owner process */
    redsem__conn conn;
    bool connected;
    /* script i was sent with its body (EVAL) and has not been reported missing since */
    bool script_sent[REDSEM__SCRIPT_COUNT];
    redsem_client_stats stats;
    char errmsg[512];
    redsem__renewer *renewer; /* NULL unless automatic renewal was enabled */
    int64_t deadline_cap_ns;  /* if non-zero, no request (nor its retries) outlives this */
    /* The server's clock (TIME, us) minus our CLOCK_MONOTONIC (us), as last measured: from
     * TIME at connect, then from every acquire reply. Used only to tell the server until when
     * an acquire may still run (its "not after"), never to judge a lease. */
    int64_t clock_offset_us;
    bool clock_offset_known;
};

/* Open a client (used for the caller's client and for the renewer's own connection). */
int redsem__client_open(const redsem_options *o, redsem_client **ret, char *err, size_t errlen);
/* Copy a client's settings into options (renewer connection). */
int redsem__client_options(const redsem_client *c, redsem_options **ret);

/* Build "PREFIX{NAME}SUFFIX". */
char *redsem__key(const redsem_client *c, const char *name, const char *suffix);

/* ---------------------------------------------------------------- acquire machinery */
enum {
    REDSEM__MODE_TRY = 0,   /* new request, leave if not granted */
    REDSEM__MODE_WAIT = 1,  /* new request, stay (register / queue) if not granted */
    REDSEM__MODE_AGAIN = 2, /* already registered: re-check and renew the wait lease */
    REDSEM__MODE_LAST = 3   /* already registered: final check, leave if not granted */
};
extern const char *const redsem__mode_names[4];

enum {
    REDSEM__ATT_GRANTED = 1,
    REDSEM__ATT_BUSY = 0,
    REDSEM__ATT_GUARD_BUSY = -2,
    REDSEM__ATT_TOO_LATE = -3 /* the server ran it after its not-after time: nothing done */
};

typedef struct redsem__attempt {
    int outcome;       /* REDSEM__ATT_* */
    uint64_t token;    /* granted: fencing token */
    uint32_t limit;    /* limit in effect on the server */
    int64_t next_ms;   /* busy: ms until the earliest lease deadline, -1 unknown */
    uint32_t holds;    /* lock: reentrant hold count */
    int64_t sent_ns;   /* granted: when the granting request was sent */
    int64_t server_us; /* the server's clock when it ran the script (0 if not reported) */
} redsem__attempt;

/* What the generic waiting loop needs from a semaphore strategy or the lock. */
typedef struct redsem__acquirer {
    redsem_client *client;
    void *handle;
    /* One attempt; returns REDSEM_OK with *att filled, or a code (with info->maybe_applied). */
    int (*attempt)(void *handle, const char *id, int mode, redsem__attempt *att,
                   redsem__req_info *info);
    /* Key to BLPOP on while waiting (may depend on id). */
    const char *(*wait_key)(void *handle, const char *id, size_t *len, char *buf, size_t buflen);
    int64_t wait_lease_ms; /* > 0: renew registration at least every third of it */
} redsem__acquirer;

/* The latest server time (us) at which an acquire sent now may still run: now + the command
 * timeout + a margin for the offset's error, on the server's clock; 0 (no limit) until the
 * client has measured the offset. */
int64_t redsem__not_after_us(const redsem_client *c);
/* Record the server's clock as seen in a reply read at recv_ns. */
void redsem__note_server_clock(redsem_client *c, int64_t server_us, int64_t recv_ns);

/* Parse the {status, a, b, now} reply of an acquire script into att. */
int redsem__parse_attempt(redsem_client *c, const struct redisReply *r, redsem__attempt *att,
                          const char *what);

int redsem__acquire_loop(const redsem__acquirer *acq, const char *id, int64_t timeout_ms,
                         redsem__attempt *att);
/* Before any I/O: the fork check, ret_permit, the timeout, and the holder id (given_id
 * validated and copied, or a new random one; NULL is EINVAL when id_required). */
int redsem__acquire_args(redsem_client *c, redsem_permit **ret_permit, int64_t timeout_ms,
                         const char *given_id, bool id_required, char id[REDSEM_ID_BUFSIZE]);
/* Wait for a grant and make it a permit of the given kind for q->handle. */
int redsem__acquire_permit(const redsem__acquirer *q, int kind, const char *id,
                           int64_t timeout_ms, int64_t lease_ms, redsem_permit **ret_permit);

/* ---------------------------------------------------------------- permits */
enum { REDSEM__PERMIT_SEM = 1, REDSEM__PERMIT_LOCK = 2 };
enum { REDSEM__HELD = 0, REDSEM__RELEASED = 1, REDSEM__LOST = 2 };

struct redsem_permit {
    int kind;
    redsem_client *client;
    redsem_sem *sem;   /* kind SEM */
    redsem_lock *lock; /* kind LOCK */
    char id[REDSEM_ID_BUFSIZE];
    uint64_t token;
    int64_t lease_ms;
    _Atomic int64_t deadline_ns; /* validity deadline, monotonic */
    _Atomic int state;           /* REDSEM__HELD / RELEASED / LOST */
    uint32_t limit_seen;         /* semaphore limit when granted (fair release hint) */
    void *renewal;               /* renewer entry, NULL if not renewed */
};

redsem_permit *redsem__permit_new(int kind, redsem_client *c, const char *id,
                                  const redsem__attempt *att, int64_t lease_ms);
/* Look up a live holder and make a permit object for it (redsem_sem_adopt / lock_adopt). */
int redsem__adopt(redsem_client *c, int kind, void *handle, const char *id, int64_t lease_ms,
                  const char *k1, const char *k2, const char *k3, redsem_permit **ret_permit);
/* Release one permit on the server through client c (semaphore or lock, by kind). */
int redsem__permit_release_on(redsem_client *c, redsem_permit *p);
/* Server-side refresh / release of one permit without touching renewal (used by the renewer
 * with its own client). */
int redsem__permit_refresh_on(redsem_client *c, redsem_permit *p, int64_t *sent_ns);

/* ---------------------------------------------------------------- semaphore / lock */
struct redsem_sem {
    redsem_client *client;
    char *name;
    redsem_strategy strategy;
    uint32_t limit;
    int64_t lease_ms;
    int64_t wait_lease_ms;
    int64_t guard_lease_ms;
    char *k_meta, *k_holders, *k_waiters, *k_signal; /* basic */
    char *k_owners, *k_timeouts, *k_sigprefix, *k_guard; /* fair / locked */
    size_t sigprefix_len;
};

struct redsem_lock {
    redsem_client *client;
    char *name;
    int64_t lease_ms;
    bool reentrant;
    char owner[REDSEM_ID_BUFSIZE]; /* reentrant owner identity */
    char *k_mutex, *k_meta, *k_waiters, *k_signal;
};

int redsem__sem_refresh(redsem_client *c, redsem_sem *s, redsem_permit *p, int64_t *sent_ns);
int redsem__sem_release(redsem_client *c, redsem_sem *s, redsem_permit *p);
int redsem__lock_refresh(redsem_client *c, redsem_lock *l, redsem_permit *p, int64_t *sent_ns);
int redsem__lock_release(redsem_client *c, redsem_lock *l, redsem_permit *p);

/* ---------------------------------------------------------------- renewal (renew.c) */
void redsem__renewer_stop(redsem_client *c);
void redsem__renewal_detach(redsem_permit *p);

/* ---------------------------------------------------------------- status */
typedef struct redsem__entry {
    char *id;
    uint64_t token;
    int64_t remaining_ms;
} redsem__entry;

struct redsem_status {
    int strategy;
    bool exists;
    uint32_t limit;
    size_t holder_count, waiter_count;
    size_t nholders, nwaiters;
    redsem__entry *holders, *waiters;
    uint32_t holds;
};

int redsem__status_from_reply(redsem_client *c, const struct redisReply *r,
                              redsem_status **ret);

#endif /* REDSEM_INTERNAL_H */
