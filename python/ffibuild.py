"""Generate the C source of redsem._redsem, the cffi extension over <redsem/redsem.h>.

cffi's API (out-of-line, compiled) mode, as PyNaCl and pycares use it: the declarations
below are checked against the real header by the C compiler when the generated file is
built (meson compiles it; this script only writes it), so a mismatch is a build error, not
a crash. Usage: python3 ffibuild.py OUTPUT.c
"""

import sys

import cffi

CDEF = r"""
/* error.h */
static const int REDSEM_OK;
static const int REDSEM_EBUSY;
static const int REDSEM_ELOST;
static const int REDSEM_EUNKNOWN;
static const int REDSEM_ECANCELED;
static const int REDSEM_EINVAL;
static const int REDSEM_ENOMEM;
static const int REDSEM_ECONN;
static const int REDSEM_ETIMEDOUT;
static const int REDSEM_ESERVER;
static const int REDSEM_EPERM;
static const int REDSEM_EPROTO;
static const int REDSEM_ECONFLICT;
static const int REDSEM_EFORKED;
static const int REDSEM_ESTATE;
static const int REDSEM_ETLS;
static const int REDSEM_EREPLICA;
const char *redsem_strerror(int code);
const char *redsem_err_name(int code);
bool redsem_is_fault(int code);

/* client.h */
typedef struct redsem_options redsem_options;
typedef struct redsem_client redsem_client;
#define REDSEM_ID_LEN ...
#define REDSEM_ID_BUFSIZE ...
#define REDSEM_TIMEOUT_MAX_MS ...
int redsem_options_new(redsem_options **ret_options);
void redsem_options_free(redsem_options *options);
int redsem_options_set_url(redsem_options *options, const char *url);
int redsem_options_set_tls_ca(redsem_options *options, const char *ca_file, const char *ca_dir);
int redsem_options_set_tls_cert(redsem_options *options, const char *cert_file,
                                const char *key_file);
int redsem_options_set_tls_server_name(redsem_options *options, const char *name);
int redsem_options_set_tls_insecure_skip_verify(redsem_options *options, bool skip);
int redsem_options_set_sync_replicas(redsem_options *options, int replicas, int64_t timeout_ms);
int redsem_options_set_connect_timeout_ms(redsem_options *options, int64_t ms);
int redsem_options_set_command_timeout_ms(redsem_options *options, int64_t ms);
int redsem_options_set_retry_ms(redsem_options *options, int64_t ms);
int redsem_options_set_max_connections(redsem_options *options, int n);
int redsem_options_set_key_prefix(redsem_options *options, const char *prefix);
int redsem_client_new_verbose(const redsem_options *options, redsem_client **ret_client,
                              char *errbuf, size_t errbuf_len);
void redsem_client_free(redsem_client *client);
const char *redsem_client_errmsg(const redsem_client *client);
int redsem_client_ping(redsem_client *client);
typedef struct redsem_client_stats {
    uint64_t requests;
    uint64_t connects;
    uint64_t script_loads;
    uint64_t noscript;
    uint64_t retries;
    uint64_t wakeups;
    uint64_t redirects;
    uint64_t pool_waits;
    uint64_t pipelined;
    uint64_t direct_grants;
    ...;
} redsem_client_stats;
int redsem_client_get_stats(const redsem_client *client, redsem_client_stats *ret_stats);
int redsem_id_generate(char out[]);
int64_t redsem_monotonic_ms(void);

/* permit.h */
typedef struct redsem_permit redsem_permit;
const char *redsem_permit_id(const redsem_permit *permit);
uint64_t redsem_permit_token(const redsem_permit *permit);
uint32_t redsem_permit_weight(const redsem_permit *permit);
int64_t redsem_permit_deadline_ms(const redsem_permit *permit);
int64_t redsem_permit_validity_ms(const redsem_permit *permit);
bool redsem_permit_held(const redsem_permit *permit);
int redsem_permit_refresh(redsem_permit *permit);
int redsem_permit_release(redsem_permit *permit);
void redsem_permit_free(redsem_permit *permit);

/* semaphore.h */
typedef struct redsem_sem redsem_sem;
typedef enum redsem_strategy {
    REDSEM_STRATEGY_BASIC = 1,
    REDSEM_STRATEGY_FAIR = 2,
    REDSEM_STRATEGY_LOCKED = 3
} redsem_strategy;
#define REDSEM_WAIT_FOREVER ...
#define REDSEM_WAIT_MAX_MS ...
#define REDSEM_LIMIT_MAX ...
const char *redsem_strategy_name(int strategy);
int redsem_sem_open(redsem_client *client, const char *name, redsem_strategy strategy,
                    uint32_t limit, int64_t lease_ms, redsem_sem **ret_sem);
void redsem_sem_free(redsem_sem *sem);
int redsem_sem_set_wait_lease_ms(redsem_sem *sem, int64_t ms);
int redsem_sem_set_guard_lease_ms(redsem_sem *sem, int64_t ms);
const char *redsem_sem_name(const redsem_sem *sem);
redsem_strategy redsem_sem_strategy(const redsem_sem *sem);
uint32_t redsem_sem_limit(const redsem_sem *sem);
int64_t redsem_sem_lease_ms(const redsem_sem *sem);
int redsem_sem_acquire_as_n(redsem_sem *sem, const char *holder_id, uint32_t n,
                            int64_t timeout_ms, redsem_permit **ret_permit);
int redsem_sem_adopt(redsem_sem *sem, const char *holder_id, redsem_permit **ret_permit);
int redsem_sem_set_limit(redsem_sem *sem, uint32_t limit);
typedef struct redsem_status redsem_status;
int redsem_sem_status(redsem_sem *sem, size_t max_entries, redsem_status **ret_status);
int redsem_sem_inspect(redsem_client *client, const char *name, size_t max_entries,
                       redsem_status **ret_status);
void redsem_status_free(redsem_status *status);
int redsem_status_strategy(const redsem_status *status);
bool redsem_status_exists(const redsem_status *status);
uint32_t redsem_status_limit(const redsem_status *status);
size_t redsem_status_holder_count(const redsem_status *status);
size_t redsem_status_waiter_count(const redsem_status *status);
size_t redsem_status_holders_listed(const redsem_status *status);
size_t redsem_status_waiters_listed(const redsem_status *status);
uint32_t redsem_status_hold_count(const redsem_status *status);
uint64_t redsem_status_permits_in_use(const redsem_status *status);
const char *redsem_status_server(const redsem_status *status);
int redsem_status_holder(const redsem_status *status, size_t i, const char **ret_id,
                         uint64_t *ret_token, int64_t *ret_remaining_ms);
uint32_t redsem_status_holder_weight(const redsem_status *status, size_t i);
int redsem_status_waiter(const redsem_status *status, size_t i, const char **ret_id,
                         uint64_t *ret_ticket, int64_t *ret_remaining_ms);

/* lock.h */
typedef struct redsem_lock redsem_lock;
int redsem_lock_open(redsem_client *client, const char *name, int64_t lease_ms,
                     redsem_lock **ret_lock);
void redsem_lock_free(redsem_lock *lock);
int redsem_lock_acquire(redsem_lock *lock, int64_t timeout_ms, redsem_permit **ret_permit);
int redsem_lock_acquire_as(redsem_lock *lock, const char *token, int64_t timeout_ms,
                           redsem_permit **ret_permit);
int redsem_lock_adopt(redsem_lock *lock, const char *token, redsem_permit **ret_permit);
int redsem_lock_status(redsem_lock *lock, size_t max_entries, redsem_status **ret_status);

/* renew.h */
typedef enum redsem_lost_reason {
    REDSEM_LOST_EXPIRED = 1,
    REDSEM_LOST_DEADLINE = 2
} redsem_lost_reason;
typedef void (*redsem_lost_fn)(redsem_permit *permit, redsem_lost_reason reason, void *user_data);
int redsem_permit_auto_renew(redsem_permit *permit, int64_t interval_ms, redsem_lost_fn on_lost,
                             void *user_data);
int redsem_permit_stop_renewal(redsem_permit *permit);
typedef struct redsem_renew_stats {
    uint64_t renewals;
    uint64_t failures;
    uint64_t lost_expired;
    uint64_t lost_deadline;
    int64_t max_lateness_ms;
    uint64_t round_trips;
    ...;
} redsem_renew_stats;
int redsem_client_renew_stats(redsem_client *client, redsem_renew_stats *ret_stats);
int redsem_lock_set_reentrant(redsem_lock *lock, bool on);

/* rate.h */
typedef struct redsem_rate redsem_rate;
typedef struct redsem_rate_grant {
    uint64_t token;
    int64_t granted_us;
    int64_t server_us;
    int64_t retry_after_ms;
    char id[];
    ...;
} redsem_rate_grant;
typedef struct redsem_rate_info {
    bool exists;
    uint32_t limit;
    int64_t window_ms;
    uint32_t in_window;
    size_t waiters;
    int64_t next_free_ms;
    uint64_t last_token;
    int64_t server_us;
    ...;
} redsem_rate_info;
int redsem_rate_open(redsem_client *client, const char *name, uint32_t n, int64_t window_ms,
                     redsem_rate **ret_rate);
void redsem_rate_free(redsem_rate *rate);
int redsem_rate_acquire_as(redsem_rate *rate, const char *holder_id, int64_t timeout_ms,
                           redsem_rate_grant *ret_grant);
int redsem_rate_status(redsem_rate *rate, redsem_rate_info *ret_info);
int redsem_rate_inspect(redsem_client *client, const char *name, redsem_rate_info *ret_info);
const char *redsem_rate_name(const redsem_rate *rate);
uint32_t redsem_rate_limit(const redsem_rate *rate);
int64_t redsem_rate_window_ms(const redsem_rate *rate);

/* async.h */
typedef struct redsem_async redsem_async;
#define REDSEM_WATCH_IN ...
#define REDSEM_WATCH_OUT ...
#define REDSEM_WATCH_REMOVE ...
typedef void (*redsem_async_socket_fn)(redsem_async *async, int fd, int what, void *loop_data);
typedef void (*redsem_async_timer_fn)(redsem_async *async, int64_t timeout_ms, void *loop_data);
typedef struct redsem_result {
    uint64_t op;
    int rc;
    const char *errmsg;
    redsem_permit *permit;
    redsem_status *status;
    ...;
} redsem_result;
typedef void (*redsem_async_cb)(redsem_async *async, const redsem_result *result, void *user);
int redsem_async_new(redsem_client *client, redsem_async **ret_async);
int redsem_async_set_loop(redsem_async *async, redsem_async_socket_fn socket_fn,
                          redsem_async_timer_fn timer_fn, void *loop_data);
int redsem_async_action(redsem_async *async, int fd, int events);
size_t redsem_async_pending(redsem_async *async);
int redsem_async_cancel(redsem_async *async, uint64_t op);
void redsem_async_free(redsem_async *async);
int redsem_sem_acquire_async(redsem_async *async, redsem_sem *sem, uint32_t n,
                             int64_t timeout_ms, redsem_async_cb cb, void *user,
                             uint64_t *ret_op);
int redsem_lock_acquire_async(redsem_async *async, redsem_lock *lock, int64_t timeout_ms,
                              redsem_async_cb cb, void *user, uint64_t *ret_op);
int redsem_permit_refresh_async(redsem_async *async, redsem_permit *permit,
                                redsem_async_cb cb, void *user, uint64_t *ret_op);
int redsem_permit_release_async(redsem_async *async, redsem_permit *permit,
                                redsem_async_cb cb, void *user, uint64_t *ret_op);
int redsem_sem_status_async(redsem_async *async, redsem_sem *sem, size_t max_entries,
                            redsem_async_cb cb, void *user, uint64_t *ret_op);
int redsem_lock_status_async(redsem_async *async, redsem_lock *lock, size_t max_entries,
                             redsem_async_cb cb, void *user, uint64_t *ret_op);

/* Python callbacks (cffi takes the GIL on whatever thread calls them). */
extern "Python" void _redsem_on_lost(redsem_permit *, redsem_lost_reason, void *);
extern "Python" void _redsem_on_socket(redsem_async *, int, int, void *);
extern "Python" void _redsem_on_timer(redsem_async *, int64_t, void *);
extern "Python" void _redsem_on_done(redsem_async *, const redsem_result *, void *);
"""


def build(output):
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    # Linking is meson's job (the redsem dependency); cffi only writes the source.
    ffi.set_source("redsem._redsem", "#include <redsem/redsem.h>\n")
    ffi.emit_c_code(output)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: ffibuild.py OUTPUT.c")
    build(sys.argv[1])
