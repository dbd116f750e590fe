/* redsem - metrics: what a client recorded, and what the server holds, for Prometheus and
 * other monitoring systems. */
#ifndef REDSEM_METRICS_H
#define REDSEM_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "client.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * CLIENT SIDE. Every client records, with no round trip and no I/O, for each semaphore, lock
 * and rate limiter name it used (label kind: "semaphore", "lock" or "rate"):
 *   redsem_acquire_wait_seconds  histogram: from an acquire's call to its result (for the
 *                                event-loop API too: from its call, not from when the
 *                                loop's report starts it), labelled
 *                                with its outcome: granted, busy (REDSEM_EBUSY: none free
 *                                within the timeout, or a try-acquire that found none),
 *                                timeout (REDSEM_ETIMEDOUT), cancelled (REDSEM_ECANCELED),
 *                                unknown (REDSEM_EUNKNOWN), error (any other code). Blocking
 *                                acquires, try-acquires and the event-loop API's acquires
 *                                alike, of every kind; calls refused before any I/O (bad
 *                                arguments, a NULL handle) are not recorded.
 *   redsem_hold_seconds          histogram (semaphores, locks): from a grant (its acquire's
 *                                return) to its release, when the server answered the release
 *                                (REDSEM_OK or REDSEM_ELOST), by the client's monotonic clock.
 *   redsem_grants_total          counter (semaphores, locks): permits granted. Permits made
 *                                by redsem_sem_adopt() / redsem_lock_adopt() are not grants
 *                                and record nothing (no hold, no loss, no refresh).
 *   redsem_leases_lost_total     counter (semaphores, locks), label reason: "expired" (the
 *                                server said the lease was gone, at a release, a refresh or a
 *                                renewal, after the permit's validity deadline had passed by
 *                                the client's clock), "taken" (it said so before that
 *                                deadline: removed or taken over), "renewal_failed" (the
 *                                renewer reached the deadline without a successful renewal).
 *                                A permit counts once.
 *   redsem_renewals_total        counter (semaphores, locks), label outcome: ok, lost, error:
 *                                refreshes by redsem_permit_refresh() and by the renewer.
 *   redsem_rate_limit_total      counter (rate limiters), label outcome: allowed, limited
 *                                (REDSEM_EBUSY), error.
 * then the counters of redsem_client_get_stats() as redsem_client_<field>_total (no labels),
 * and redsem_metrics_names_dropped_total: the handles (semaphore, lock or rate limiter) whose
 * name found no room under the cap, so that their figures went to the name "_other" (a name
 * past the cap counts once per handle that uses it).
 *
 * Histogram buckets (REDSEM_METRICS_BUCKETS of them, the same for both histograms), upper
 * bounds in seconds: 0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1
 * 2.5 5 10 30 60 120 300 +Inf: from an uncontended round trip on loopback (100 us) to waits
 * of minutes. A sample equal to a bound falls in that bound's bucket (Prometheus' "le").
 *
 * Cost. A handle finds its name's figures at its first acquire (a hash lookup without a lock
 * in a table made with the client, 24 to 40 bytes per name of the cap: 24 kB for the
 * default, 25 MB for REDSEM_METRICS_NAMES_MAX; only a name's first use, and a handle's first
 * use past the cap, take the table's lock) and keeps them; then every figure is one relaxed
 * atomic add, and an acquire reads the monotonic clock twice. A name's figures take about 1.3 kB,
 * allocated at its first use and kept until the client is freed.
 */

/** Default of redsem_options_set_metrics_names_max(). */
#define REDSEM_METRICS_NAMES_DEFAULT 1000
/** Largest value of redsem_options_set_metrics_names_max(). */
#define REDSEM_METRICS_NAMES_MAX 1000000
/** Buckets of each histogram, +Inf included. */
#define REDSEM_METRICS_BUCKETS 21

/**
 * redsem_options_set_metrics_names_max - how many distinct (name, kind) pairs a client keeps
 * figures for. Past the cap, the figures of new names are added to the name "_other" (one
 * per kind), and redsem_metrics_names_dropped_total counts the handles that went there.
 *
 * @options  borrowed; must not be NULL.
 * @max      0 .. REDSEM_METRICS_NAMES_MAX names; 0 keeps every figure in "_other" (no
 *           per-name series). Default REDSEM_METRICS_NAMES_DEFAULT.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options or max out of range (options
 *          unchanged).
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.5
 */
REDSEM_API int redsem_options_set_metrics_names_max(redsem_options *options, uint32_t max);

/**
 * redsem_options_set_metrics - whether clients made with these options record figures.
 *
 * @options  borrowed; must not be NULL.
 * @on       true (the default): record; false: record nothing (no table is made; the
 *           exposition then has only the client's transport counters).
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.5
 */
REDSEM_API int redsem_options_set_metrics(redsem_options *options, bool on);

/**
 * redsem_metrics_write - the client's figures (see CLIENT SIDE above) in the Prometheus text
 * exposition format 0.0.4: for each family a "# HELP" and a "# TYPE" line, then its samples;
 * label values escaped (backslash, double quote and newline as \\, \" and \n); histograms as
 * cumulative NAME_bucket{...,le="..."} lines ending with le="+Inf", then NAME_sum and
 * NAME_count. A family with no sample is left out (per name: a wait histogram only for the
 * outcomes seen; the counters of every name with all their label values, zeros included).
 * Names are in the order they were first used.
 *
 * @client  borrowed; must not be NULL.
 * @buf     borrowed; the text and a NUL go here; may be NULL when len is 0 (to ask the size).
 * @len     size of buf in bytes.
 * @needed  borrowed; may be NULL; receives the bytes the whole text needs, NUL included,
 *          whether or not it fit (the figures may grow before a second call: leave room).
 * Returns: REDSEM_OK (buf holds the whole text); REDSEM_ERANGE (it did not fit: buf, when
 *          len > 0, holds a NUL-terminated prefix cut at a line end, and *needed the size);
 *          REDSEM_EINVAL (NULL client; NULL buf with len > 0).
 * Server: none (no I/O). Thread safety: any thread, at the same time as the client's other
 * calls; the figures are read one at a time with atomic loads, so a scrape that runs with
 * acquires may see a histogram's _count one sample off its buckets (never a non-cumulative
 * bucket: each is read once and summed). Source: Prometheus "Exposition formats", text format
 * 0.0.4. Since: 0.5
 */
REDSEM_API int redsem_metrics_write(const redsem_client *client, char *buf, size_t len,
                                    size_t *needed);

/** Type of a metric family. Since: 0.5 */
typedef enum redsem_metric_type {
    REDSEM_METRIC_COUNTER = 0,
    REDSEM_METRIC_GAUGE = 1,
    REDSEM_METRIC_HISTOGRAM = 2
} redsem_metric_type;

/** One label of a sample: views valid during the visitor's call only. Since: 0.5 */
typedef struct redsem_metric_label {
    const char *name, *value; /* value unescaped, as the client got it (NUL-terminated) */
} redsem_metric_label;

/** One sample given to a redsem_metric_visitor. Every pointer is a view valid during the
 * visitor's call only (copy what you keep). Since: 0.5 */
typedef struct redsem_metric {
    const char *family; /* "redsem_acquire_wait_seconds" (no _bucket/_sum/_count suffix) */
    const char *help;   /* the HELP text */
    redsem_metric_type type;
    const redsem_metric_label *labels; /* nlabels of them (name, kind, outcome ...); may be
                                          NULL when nlabels is 0 */
    size_t nlabels;
    double value; /* counter or gauge; 0 for a histogram */
    /* histogram: nbuckets (REDSEM_METRICS_BUCKETS) upper bounds in seconds, ascending, the
     * last INFINITY, and their cumulative counts (counts[nbuckets - 1] == count); sum in
     * seconds. NULL / 0 for a counter or gauge. */
    const double *bounds;
    const uint64_t *counts;
    size_t nbuckets;
    double sum;
    uint64_t count;
} redsem_metric;

/** Called once per sample; returns 0 to go on, anything else to stop. Since: 0.5 */
typedef int (*redsem_metric_visitor)(const redsem_metric *m, void *arg);

/**
 * redsem_metrics_visit - the figures of redsem_metrics_write(), one call of fn per sample
 * (a histogram is one call with its buckets), in the same order, for an OpenTelemetry or
 * StatsD bridge. Families with no sample are not visited.
 *
 * @client  borrowed; must not be NULL.
 * @fn      must not be NULL; called on the calling thread, before this call returns; it may
 *          call other redsem functions on the client, including recording ones.
 * @arg     passed to fn as it is; may be NULL.
 * Returns: REDSEM_OK (every sample visited); the first non-zero value fn returned (which
 *          stopped the visit; no more calls follow); REDSEM_EINVAL (NULL client or fn).
 * Server: none (no I/O). Thread safety: as redsem_metrics_write(). Since: 0.5
 */
REDSEM_API int redsem_metrics_visit(const redsem_client *client, redsem_metric_visitor fn,
                                    void *arg);

/**
 * redsem_metrics_write_server - what the server holds now for the given names, in the same
 * text format: redsem_up (1 when every read succeeded; 0 when one failed: Redis could not be
 * reached, timed out or refused), and, when up, for each name that exists as a semaphore, a
 * lock or a rate limiter (one name may be several; a name missing on the server gives no
 * series), in families:
 *   redsem_limit{name,kind}                permits (1 for a lock; N for a rate limiter)
 *   redsem_permits_in_use{name,kind}       permits held (weights summed); not for rate
 *   redsem_holders{name,kind}              live holders; not for rate
 *   redsem_waiters{name,kind}              live registered or queued waiters
 *   redsem_oldest_wait_seconds{name,kind}  the age of the oldest waiter, as this client's
 *                                          scrapes saw it: the time since the first scrape
 *                                          that listed the longest-seen of the waiters listed
 *                                          now (at most 256 per name; 0 when none, and at a
 *                                          waiter's first scrape: the server does not record
 *                                          when a waiter arrived); not for rate
 *   redsem_rate_window_grants{name}        a rate limiter's grants in its current window
 *   redsem_leases_expired_total{name,kind} semaphores: holders the acquire scripts' clean-up
 *                                          removed after their lease ran out, never released,
 *                                          since the semaphore's keys were made (a lock's
 *                                          lease ends by its key's own expiry, not counted)
 * The client keeps, per name scraped that has waiters listed, the ids of those waiters (for
 * the oldest wait); a name scraped with none, or gone from the server, is forgotten.
 *
 * @client  borrowed; must not be NULL.
 * @names   borrowed; n NUL-terminated names (1..REDSEM_NAME_MAX bytes of printable ASCII
 *          without '{' and '}'); may be NULL when n is 0 (only redsem_up is written). A
 *          name given more than once is read and written once, where first given (a series
 *          twice in one scrape is an error to Prometheus).
 * @n       0 .. 100000 names.
 * @buf, @len, @needed  as redsem_metrics_write().
 * Returns: REDSEM_OK (also when a read failed: then "redsem_up 0" and no name's series are
 *          written, and redsem_client_errmsg() says why); REDSEM_ERANGE (as
 *          redsem_metrics_write(); the figures were read: call again with room to re-read);
 *          REDSEM_EINVAL (NULL client, NULL names with n > 0, a NULL or invalid name, n too
 *          large, NULL buf with len > 0); REDSEM_ENOMEM; REDSEM_EFORKED.
 * Server: read-only, three round trips per name: the EVALSHA of status.lua (strategy read
 * from the semaphore's meta hash), of lock_status.lua and of rate.lua's status mode (no
 * writes; works for a read-only ACL user). Thread safety: any thread, at the same time as
 * others. Since: 0.5
 */
REDSEM_API int redsem_metrics_write_server(redsem_client *client, const char *const *names,
                                           size_t n, char *buf, size_t len, size_t *needed);

/**
 * redsem_scan_names - the names of the semaphores, locks and rate limiters on the server
 * whose name matches a glob pattern (Redis' MATCH syntax), found by SCAN over the client's
 * key prefix.
 *
 * @client     borrowed; must not be NULL.
 * @pattern    borrowed; a glob on the NAME (not the key): "*" for all; must not be NULL;
 *             1..1024 bytes.
 * @max        1 .. 1000000: at most this many names are returned.
 * @ret_names  owned-out; an array of *ret_n NUL-terminated names, sorted, distinct; free with
 *             redsem_names_free(*ret_names, *ret_n). NULL when *ret_n is 0. Must not be NULL.
 * @ret_n      borrowed; must not be NULL.
 * @capped     borrowed; may be NULL; true when more than max names matched: the scan stopped
 *             once it had found more than max, and the first max of those, sorted, are
 *             returned. (A name is taken from every key PREFIX{NAME}... matched: the
 *             pattern's '*' may also match a '}' of such a key.)
 * Returns: REDSEM_OK; REDSEM_EINVAL; REDSEM_ENOMEM; REDSEM_ECONN; REDSEM_ETIMEDOUT;
 *          REDSEM_EPERM (SCAN refused by the ACL); REDSEM_ESERVER; REDSEM_EPROTO;
 *          REDSEM_EFORKED; REDSEM_ESTATE for a Redis Cluster client (not supported: SCAN
 *          would have to visit every primary).
 * Server: SCAN cursor MATCH PREFIX{PATTERN}* COUNT 1000 (the prefix's glob characters
 * escaped) until the cursor returns to 0 or the cap is passed (read-only; one round trip per
 * SCAN call; SCAN's own guarantees: a name present throughout is found, one created or
 * removed meanwhile may or may not be). Thread safety: any thread, at the
 * same time as others. Since: 0.5
 */
REDSEM_API int redsem_scan_names(redsem_client *client, const char *pattern, size_t max,
                                 char ***ret_names, size_t *ret_n, bool *capped);

/**
 * redsem_names_free - free the array of redsem_scan_names(). NULL is a no-op.
 * @names  owned by the caller, from redsem_scan_names(); @n its count.
 * Thread safety: any thread, once. Since: 0.5
 */
REDSEM_API void redsem_names_free(char **names, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_METRICS_H */
