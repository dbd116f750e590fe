/* redsem - connection options and the client handle. */
#ifndef REDSEM_CLIENT_H
#define REDSEM_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * THREADS. A redsem_client, and every semaphore, lock, rate limiter and permit made
 * from it, may be used by any number of threads at once: a thread pool shares one client.
 * Every request of all its threads (acquire attempts, releases, refreshes, status reads,
 * opens, PING) goes on one request connection per server (per primary in a Redis Cluster)
 * with many requests in flight on it (pipelined), and the blocking acquires waiting for a
 * wake-up share one wait connection (one BLPOP on all their lists), so blocked waiters never
 * hold the connection the requests need. The calling threads drive these connections
 * themselves: a thread whose request is in flight and finds no other thread reading reads
 * for all, and hands each its reply; the others sleep until theirs comes. Under Sentinel
 * the client also keeps one connection to one Sentinel, subscribed to its failover
 * announcements, which no thread waits on: it is read without blocking before requests.
 * The text of redsem_client_errmsg() is per thread, like errno. Three things remain
 * the caller's to order: freeing a handle (no call on it may be running or start after), the
 * handle setters redsem_sem_set_wait_lease_ms(), redsem_sem_set_guard_lease_ms() and
 * redsem_lock_set_reentrant() (before the handle is shared), and the use of one permit by two
 * threads at once (refresh and release race on the server, which decides; redsem never
 * corrupts memory, but the loser gets REDSEM_ELOST or REDSEM_ESTATE). A reentrant lock handle
 * is one owner: the threads that share it share its holds. There is no global state: no
 * global connection, no global script cache, no global initialisation call (sodium_init() is
 * called for you, it is idempotent and thread-safe). redsem_strerror(), redsem_err_name(),
 * redsem_is_fault(), redsem_id_generate() and the version calls may be called from any thread
 * at any time.
 *
 * redsem starts one background thread only: the renewer of a client, started by the first
 * redsem_permit_auto_renew() (renew.h; its renewals are requests on the client's request
 * connections, each capped by the first moment a holder must be told it lost its permit).
 * The event-loop API (async.h) starts none: its operations, and the renewal of the permits
 * they grant, run on the application's loop.
 *
 * ERRORS. Every call that sends to the server may also return REDSEM_ENOMEM (no memory for a
 * new connection, or to format a request) and, over TLS (rediss://), REDSEM_ETLS (a
 * reconnect and a Redis Cluster primary's first use each run a TLS
 * handshake, in which the server's certificate can be refused) and REDSEM_EEVICTION (a new
 * connection found that the server may evict keys: redsem_options_set_allow_eviction()),
 * whether or not the call's own list of returns names them. redsem_client_errmsg() gives the
 * detail. (The files of redsem_options_set_tls_ca() and redsem_options_set_tls_cert() are
 * read once, by redsem_client_new(): every connection of the client shares what was read.)
 *
 * FORK. Handles belong to the process that created them. In a child after fork() every call
 * on an inherited handle returns REDSEM_EFORKED without touching the network, so a child can
 * never refresh or release its parent's permits by accident; the child may only free the
 * handles (which closes its copy of the socket without sending anything).
 *
 * SIGNALS. redsem never raises SIGPIPE (sockets are written with MSG_NOSIGNAL), installs no
 * signal handlers and never prints or exits.
 *
 * OWNERSHIP TAGS used in the comments: "borrowed" (the caller keeps it; redsem does not keep
 * the pointer after the call returns), "copied" (redsem keeps its own copy), "owned-out"
 * (written only on REDSEM_OK; the caller frees it with the named function), "view" (valid
 * until the named event; never free it).
 */

/** Opaque connection options, built with redsem_options_new(). Since: 0.1 */
typedef struct redsem_options redsem_options;

/** Opaque client: its connections to Redis (one request and one wait connection per
 * server) with their script caches, shared by the threads that use it (see THREADS above).
 * Since: 0.1 */
typedef struct redsem_client redsem_client;

/** Default URL when none is set: "redis://127.0.0.1:6379". */
#define REDSEM_DEFAULT_URL "redis://127.0.0.1:6379"
/** Default connect timeout, ms. */
#define REDSEM_DEFAULT_CONNECT_TIMEOUT_MS 2000
/** Default command timeout, ms: how long one request waits for its reply. */
#define REDSEM_DEFAULT_COMMAND_TIMEOUT_MS 2000
/** Default request connections per server (redsem_options_set_max_connections). */
#define REDSEM_DEFAULT_MAX_CONNECTIONS 4
/** Largest value of redsem_options_set_max_connections(). */
#define REDSEM_MAX_CONNECTIONS_MAX 64
/** Default retry window, ms, after a connection-level failure (see set_retry_ms). */
#define REDSEM_DEFAULT_RETRY_MS 1000
/** Default key prefix. */
#define REDSEM_DEFAULT_KEY_PREFIX "redsem:"
/** Largest timeout accepted by the *_timeout_ms and retry setters: 24 h, in ms. */
#define REDSEM_TIMEOUT_MAX_MS 86400000LL

/**
 * redsem_options_new - make an options object holding every default.
 *
 * @ret_options  owned-out; free with redsem_options_free(). Must not be NULL.
 * Returns: REDSEM_OK; REDSEM_EINVAL if ret_options is NULL; REDSEM_ENOMEM.
 * Server: none. Thread safety: the new object is the caller's. Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_options_new(redsem_options **ret_options);

/**
 * redsem_options_free - free an options object. NULL is a no-op.
 *
 * Clients made from it keep their own copies and stay valid.
 * Thread safety: one thread at a time per options object. Since: 0.1
 */
REDSEM_API void redsem_options_free(redsem_options *options);

/**
 * redsem_options_set_url - where and how to connect.
 *
 * @options  borrowed; must not be NULL.
 * @url      copied; must not be NULL. Accepted forms (at most 4096 bytes):
 *             redis://[user[:password]@]host[:port][/db]
 *             unix:///absolute/path/to.sock[?db=N]   (also unix://[user[:password]@]/path)
 *           host is a name, an IPv4 address or a bracketed IPv6 address ([::1]); port is
 *           1..65535 (default 6379); db is 0..2147483647 (default 0). user and password may
 *           be percent-encoded (%40 for '@'). With a password and no user, AUTH password is
 *           sent; with both, AUTH user password (Redis 6 ACL). db != 0 sends SELECT db.
 *             rediss://[user[:password]@]host[:port][/db]
 *           is the same over TLS (OpenSSL), verified by default: the server's chain against
 *           the CA of redsem_options_set_tls_ca() (or the system's CA certificates) and its
 *           name, the URL's host or redsem_options_set_tls_server_name(), against the
 *           certificate's subject alternative names only (as an IP address when it is
 *           one; never the subject's CN; a wildcard only as a whole leftmost label).
 *             redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER
 *                 [?db=N][&sentinel_user=U&sentinel_password=P]
 *           a primary managed by Sentinel: the Sentinels (1..16; port default 26379) are
 *           asked in turn (SENTINEL get-master-addr-by-name MASTER; the first that answers
 *           is asked first next time), the address given is connected to with user,
 *           password and db, and must answer ROLE as the primary. The client stays
 *           subscribed to one Sentinel's +switch-master and +promoted-slave announcements
 *           (on the next Sentinel when that one goes away; one connection per client),
 *           reads them without blocking before its requests, takes the primary's address
 *           from them while subscribed (else asks again at every reconnect), and re-checks
 *           ROLE on each connection every second (in the same write as a request). After a
 *           failover (an announcement, a lost connection, a READONLY reply or a ROLE that is
 *           no longer master) a call stops using the old primary before sending and resends
 *           to the new one within its retry window (redsem_options_set_retry_ms(): make it
 *           longer than a failover takes). sentinel_user/sentinel_password (percent-encoded)
 *           are the Sentinels' own credentials. rediss+sentinel:// uses TLS for the
 *           Sentinels and the data nodes alike (the same CA and client certificate options;
 *           each verified by its own host name).
 *             redis+cluster://[user[:password]@]host[:port][,host[:port]...][/]
 *           a Redis Cluster (Since: 0.3): the seed nodes (1..16; port default 6379) are
 *           asked in turn for the slot map (CLUSTER SLOTS) when the client is made, within
 *           the connect timeout; a semaphore or lock is served by the primary that owns the
 *           hash slot of {NAME} (CRC16 mod 16384), each primary with its own connection,
 *           opened on first use. MOVED updates the map (re-read at most every 100 ms) and
 *           resends there; ASK resends once with ASKING to the node named; TRYAGAIN,
 *           CLUSTERDOWN and an unreachable primary (a failover) back off with jitter and
 *           resend within the retry window. user and password are every node's; no db (a
 *           cluster has only 0); no query. rediss+cluster:// is the same over TLS, every node
 *           verified by its own address or redsem_options_set_tls_server_name().
 *           redsem_client_new() fails with REDSEM_ECONN if no seed answers, REDSEM_EINVAL
 *           if a seed is not in cluster mode.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL or a malformed URL (the options are unchanged):
 *          longer than 4096 bytes; a byte outside 0x21..0x7e (a space, a control or non-ASCII
 *          byte: percent-encode it); another scheme; a user without a password (user@), an
 *          empty password, a bad %-escape or one that decodes to NUL (%00); a host that is
 *          empty, longer than 253 bytes or has a byte other than a letter, a digit, '-', '.'
 *          and '_' (in brackets: hex digits, ':' and '.'); a port outside 1..65535; a db
 *          outside 0..2147483647; a query or fragment in a redis:// or rediss:// URL; more
 *          than 16 Sentinels or seeds; a cluster URL with a db, path or query; a Sentinel URL
 *          with no /MASTER, a MASTER that is empty, longer than 255 bytes or has a byte a host
 *          may not have, a query item other than db, sentinel_user and sentinel_password (each
 *          once), an empty sentinel_user or sentinel_password, or sentinel_user without
 *          sentinel_password; a unix path that is not absolute, is "/" alone or is longer than
 *          107 bytes once decoded, a '#' in it, or a unix query other than ?db=N.
 *          REDSEM_ENOMEM.
 * Server: none (the URL is parsed now, used by redsem_client_new()).
 * Thread safety: one thread at a time per options object. Since: 0.1
 */
REDSEM_API int redsem_options_set_url(redsem_options *options, const char *url);

/**
 * redsem_options_set_tls_ca - the CA certificates that verify a rediss:// server.
 *
 * @ca_file  copied; a PEM file of one or more CA certificates, or NULL.
 * @ca_dir   copied; a directory of hashed CA certificates (c_rehash), or NULL.
 *           Both NULL (the default): the system's CA certificates (OpenSSL's default paths).
 *           Files are read by redsem_client_new(), which fails with REDSEM_EINVAL and the
 *           file's name and OpenSSL's reason if one cannot be read.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL options, or an empty string); REDSEM_ENOMEM.
 * Server: none. Thread safety: one thread at a time per options object.
 * Source: OpenSSL's SSL_CTX_load_verify_locations / SSL_CTX_set_default_verify_paths.
 * Since: 0.2
 */
REDSEM_API int redsem_options_set_tls_ca(redsem_options *options, const char *ca_file,
                                         const char *ca_dir);

/**
 * redsem_options_set_tls_cert - a client certificate and key for mutual TLS
 * (redis-server --tls-auth-clients yes).
 *
 * @cert_file  copied; PEM certificate (chain), or NULL for none (the default).
 * @key_file   copied; PEM private key, or NULL when it is in cert_file. Read, and checked
 *             against the certificate, by redsem_client_new() (REDSEM_EINVAL if not).
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL options, a key without a certificate, or an
 *          empty string); REDSEM_ENOMEM.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.2
 */
REDSEM_API int redsem_options_set_tls_cert(redsem_options *options, const char *cert_file,
                                           const char *key_file);

/**
 * redsem_options_set_tls_server_name - the name sent as SNI and verified against the server's
 * certificate, when it differs from the URL's host (connecting by address to a server whose
 * certificate names it, for instance).
 *
 * @name  copied; a DNS name or an IP address, 1..253 bytes of printable ASCII (0x21..0x7e: a
 *        byte <= 0x20 or >= 0x7f is refused); NULL: the URL's host (default).
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL options; an empty name, one longer than 253 bytes,
 *          or one with a refused byte; the options are unchanged); REDSEM_ENOMEM.
 * Server: none. Thread safety: one thread at a time per options object.
 * Source: the name check is OpenSSL's X509_VERIFY_PARAM_set1_host (RFC 6125), or
 * X509_VERIFY_PARAM_set1_ip_asc for an address. Since: 0.2
 */
REDSEM_API int redsem_options_set_tls_server_name(redsem_options *options, const char *name);

/**
 * redsem_options_set_tls_insecure_skip_verify - accept ANY server certificate: no chain and
 * no name check. The connection is encrypted but not authenticated: anyone in the path can
 * impersonate the server. For test setups only; never in production.
 *
 * @skip  true to skip verification; false (the default) to verify.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.2
 */
REDSEM_API int redsem_options_set_tls_insecure_skip_verify(redsem_options *options, bool skip);

/**
 * redsem_options_set_sync_replicas - require grants and refreshes to reach replicas.
 *
 * Every acquire attempt and every refresh (automatic renewal included) is followed, in the
 * same round trip (pipelined after the script), by WAIT replicas timeout_ms; the calls of a
 * client written on one connection around the same time share one WAIT (it counts the
 * replicas that acknowledged every write before it: group commit). A grant that
 * fewer replicas acknowledge in time is given back and the acquire returns REDSEM_EREPLICA;
 * a refresh returns REDSEM_EREPLICA and does not move the validity deadline (the renewer
 * retries it, and reports the permit lost if it never succeeds in time). What it buys, and
 * what not (a replica that acknowledged can still lose the write; a failover may promote one
 * that did not, unless every replica is waited for): docs/guarantees.md. The same idea as
 * Redisson's checkLockSyncedSlaves.
 *
 * @replicas    0 (the default: no WAIT) .. 64.
 * @timeout_ms  1 .. REDSEM_TIMEOUT_MAX_MS: how long WAIT may block; must be shorter than the
 *              command timeout when the client is created (REDSEM_EINVAL otherwise).
 *              Ignored when replicas is 0.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL options, or a value out of range).
 * Server: none now; later WAIT after the acquire scripts and refreshes (one per connection
 * in flight at a time, covering the calls written before it).
 * Thread safety: one thread at a time per options object. Since: 0.2
 */
REDSEM_API int redsem_options_set_sync_replicas(redsem_options *options, int replicas,
                                                int64_t timeout_ms);

/**
 * redsem_options_set_allow_eviction - connect to servers that may evict keys.
 *
 * Every redsem key has a TTL, so a server with maxmemory set and any maxmemory-policy other
 * than noeviction (volatile-lru, the default of several managed services, and every other
 * volatile-* or allkeys-* policy) may delete a semaphore's keys when memory runs short. The
 * semaphore then forgets its holders: a fair semaphore whose meta hash was evicted gave a
 * handle a second holder of a limit-1 semaphore (measured: docs/guarantees.md, "Eviction").
 * So by default every connection to a data node (the first, each reconnect, a Sentinel's
 * primary, each Redis Cluster node on its first use) reads
 * INFO memory after AUTH and SELECT, and refuses the server with REDSEM_EEVICTION when its
 * maxmemory is not 0 and its maxmemory_policy is not noeviction, or when the reply has no
 * such fields; an INFO refused by the ACL fails the connect with REDSEM_EPERM (allow INFO:
 * the minimal ACL in docs/guarantees.md has it). The check is made at connect time only: a
 * policy changed later (CONFIG SET) is seen at the next reconnect.
 *
 * @allow  true: skip the check (no INFO sent), accepting that eviction may break the limit;
 *         false (the default): refuse such servers.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options.
 * Server: none now; with false, INFO memory on every new connection (one more round trip
 * per connect, counted in redsem_client_stats.requests). Thread safety: one thread at a
 * time per options object. Since: 0.4.7
 */
REDSEM_API int redsem_options_set_allow_eviction(redsem_options *options, bool allow);

/**
 * redsem_options_set_connect_timeout_ms - bound on establishing one connection (name lookup
 * excluded: getaddrinfo() has no timeout), AUTH and SELECT included.
 *
 * @ms  1 .. REDSEM_TIMEOUT_MAX_MS milliseconds. Default REDSEM_DEFAULT_CONNECT_TIMEOUT_MS.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options or ms out of range.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.1
 */
REDSEM_API int redsem_options_set_connect_timeout_ms(redsem_options *options, int64_t ms);

/**
 * redsem_options_set_command_timeout_ms - how long one request waits for its reply.
 *
 * A request that gets no reply in time fails with REDSEM_ETIMEDOUT (REDSEM_EUNKNOWN for an
 * acquire, whose effect on the server is then unknown), and the connection is discarded, to
 * be re-opened by the next call. It is discarded abortively (a TCP reset): bytes the server
 * has not received yet (a network partition) are dropped, never delivered later. Bytes the
 * server already received (a server stalled by a long command, a fork, SIGSTOP) are still
 * executed when it resumes; an acquire among them grants nothing if it runs later than this
 * timeout + 100 ms after it was sent, by the server's clock (its "not-after" time: see
 * docs/guarantees.md). A blocking acquire's own timeout is separate: its waiting is not
 * bounded by this value.
 *
 * @ms  1 .. REDSEM_TIMEOUT_MAX_MS milliseconds. Default REDSEM_DEFAULT_COMMAND_TIMEOUT_MS.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options or ms out of range.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.1
 */
REDSEM_API int redsem_options_set_command_timeout_ms(redsem_options *options, int64_t ms);

/**
 * redsem_options_set_retry_ms - retry window after a connection-level failure.
 *
 * When a call finds the connection refused, reset or closed by the server (a restart, a
 * CLIENT KILL, an idle timeout), or the server still loading its data after a restart (its
 * "LOADING" error reply: nothing was executed), it reconnects if needed and sends the same
 * request again, with jittered exponential backoff (5 ms doubling to 100 ms), for up to this
 * many ms after the first failure; then it returns REDSEM_ECONN (REDSEM_EUNKNOWN for an
 * acquire that may have reached the server; REDSEM_ESERVER with the LOADING text if the
 * server was still loading). Every redsem request is idempotent for its holder identifier, so a
 * resend never takes a second permit. Timeouts (a stalled server) are not retried, except in
 * a Redis Cluster (redis+cluster://), where a node that times out, connecting or waiting for
 * a reply, may have failed over: the slot map is read again (from the other nodes first)
 * and the request re-sent within this window.
 *
 * @ms  0 (never retry: fail on the first connection error) .. REDSEM_TIMEOUT_MAX_MS.
 *      Default REDSEM_DEFAULT_RETRY_MS.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options or ms out of range.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.1
 */
REDSEM_API int redsem_options_set_retry_ms(redsem_options *options, int64_t ms);

/**
 * redsem_options_set_max_connections - the most request connections to each Redis server
 * the client may open.
 *
 * An upper bound, checked and kept: a client opens one request connection per server
 * whatever n is (any n in range has the same effect), shared by all its threads with many requests in flight (counted in
 * redsem_client_stats.pipelined), and one wait connection for its blocking waiters (see
 * THREADS above). Automatic renewal sends on the same request connection.
 *
 * @n  1 .. REDSEM_MAX_CONNECTIONS_MAX. Default REDSEM_DEFAULT_MAX_CONNECTIONS.
 * Returns: REDSEM_OK; REDSEM_EINVAL for NULL options or n out of range (options unchanged).
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.4
 */
REDSEM_API int redsem_options_set_max_connections(redsem_options *options, int n);

/**
 * redsem_options_set_key_prefix - prefix of every key redsem creates.
 *
 * A semaphore NAME lives in keys PREFIX{NAME}:suffix (see docs/design.md), so one
 * semaphore's keys share the hash tag {NAME} and one Redis Cluster slot.
 *
 * @prefix  copied; must not be NULL; 0..256 bytes of printable ASCII (0x21..0x7e) other than
 *          '{' and '}' (which would break the hash tag). Default REDSEM_DEFAULT_KEY_PREFIX.
 * Returns: REDSEM_OK; REDSEM_EINVAL (options unchanged); REDSEM_ENOMEM.
 * Server: none. Thread safety: one thread at a time per options object. Since: 0.1
 */
REDSEM_API int redsem_options_set_key_prefix(redsem_options *options, const char *prefix);

/**
 * redsem_client_new - connect to Redis and return a client.
 *
 * Connects now (AUTH and SELECT included) so that a wrong URL, password or database shows up
 * here rather than at the first acquire. Later, a call that finds the connection lost
 * reconnects by itself (see redsem_options_set_retry_ms()).
 *
 * @options     borrowed; NULL means all defaults (REDSEM_DEFAULT_URL, ...). The client keeps
 *              its own copy.
 * @ret_client  owned-out; free with redsem_client_free(). Must not be NULL. Not written on
 *              failure.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL ret_client; a TLS file that cannot be read or a
 *          key that does not match its certificate; a sync timeout not shorter than the
 *          command timeout); REDSEM_ENOMEM; REDSEM_ECONN (refused, unreachable, name not
 *          found, a TLS handshake that failed, no Sentinel that names a primary, an address
 *          that is not the primary, no cluster seed that answers); REDSEM_EINVAL also for a
 *          cluster URL whose seed is not in cluster mode; REDSEM_ETIMEDOUT (connect timeout);
 *          REDSEM_ETLS (the
 *          server's certificate was refused: unknown CA, expired, name mismatch; under
 *          Sentinel, a data node's, or every Sentinel's: one that fails otherwise, down or
 *          slow, makes it REDSEM_ECONN);
 *          REDSEM_EPERM (AUTH refused: WRONGPASS, NOAUTH, NOPERM; also a Sentinel's; INFO
 *          refused by the ACL, or with NOAUTH by a server that wants a password the URL
 *          does not give, unless eviction is allowed); REDSEM_EEVICTION (the server may
 *          evict keys: maxmemory with a policy other than noeviction, see
 *          redsem_options_set_allow_eviction());
 *          REDSEM_ESERVER (SELECT refused or other error reply); REDSEM_EPROTO. On failure no
 *          client exists, so the detail is not available through redsem_client_errmsg(); use
 *          redsem_client_new_verbose() for it.
 * Server: under Sentinel, first SENTINEL get-master-addr-by-name on the Sentinels in turn;
 *         connect (the TLS handshake for rediss://), then AUTH and SELECT as the URL asks,
 *         then TIME once (the server's clock, from which acquires get their not-after time; a
 *         TIME refused by an ACL is ignored, one that gets no reply within the command
 *         timeout fails with REDSEM_ETIMEDOUT); under Sentinel, ROLE (must be master); then
 *         INFO memory unless eviction is allowed (on every later connection too). In
 *         a cluster: CLUSTER SLOTS on the seeds in turn (after AUTH, TIME and INFO memory on
 *         the seed); the primaries are connected on their first call (INFO memory each).
 * Thread safety: the new client may be shared by any number of threads. Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_client_new(const redsem_options *options,
                                            redsem_client **ret_client);

/**
 * redsem_client_new_verbose - redsem_client_new() that also reports why it failed.
 *
 * @errbuf     borrowed; may be NULL; on failure receives a NUL-terminated message including
 *             Redis' or the OS's own text (e.g. "AUTH: WRONGPASS invalid username-password
 *             pair or user is disabled."); "out of memory" when options is NULL and the
 *             default options cannot be allocated (REDSEM_ENOMEM). Untouched on success.
 * @errbuf_len size of errbuf in bytes; ignored when errbuf is NULL.
 * Everything else as redsem_client_new().
 * Thread safety: the new client may be shared by any number of threads. Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_client_new_verbose(const redsem_options *options,
                                                    redsem_client **ret_client, char *errbuf,
                                                    size_t errbuf_len);

/**
 * redsem_client_connect - redsem_client_new() with default options and the given URL.
 *
 * @url  borrowed; NULL means REDSEM_DEFAULT_URL. Format as redsem_options_set_url().
 * Returns: as redsem_client_new(); REDSEM_EINVAL also for a malformed URL.
 * Thread safety: the new client may be shared by any number of threads. Since: 0.1
 */
REDSEM_API REDSEM_WUR int redsem_client_connect(const char *url, redsem_client **ret_client);

/**
 * redsem_client_free - close the client's connections and free it. NULL is a no-op.
 *
 * Does not release permits: free every semaphore, lock and permit made from the client
 * first (their leases then simply expire on the server). Stops the renewer thread, if any,
 * and waits for it to finish its round of renewals (at most until a permit's lost deadline
 * or one command timeout) and a lost-lease callback running. Permits it still renews stop
 * being renewed, as by redsem_permit_stop_renewal() (no lost callback; their leases run
 * out). Semaphores, locks and permits of the client left over may afterwards still be freed
 * (redsem_sem_free(), redsem_lock_free(), redsem_permit_free(); but in a child after fork()
 * only before the client), and permits read (id, token, validity ...), but nothing else may
 * be called on them. May be called from a lost-lease callback of its own renewer (renew.h):
 * the renewer thread then ends by itself once the callback returns. In a child after fork()
 * it closes the inherited sockets without sending anything.
 * Thread safety: any thread, once no call on the client or on anything made from it is
 * running or can start. Since: 0.1
 */
REDSEM_API void redsem_client_free(redsem_client *client);

/**
 * redsem_client_errmsg - detail of the last failed call on this client.
 *
 * Includes Redis' own error text where there was one (WRONGTYPE, NOPERM, OOM, ...) or the
 * OS's (ECONNREFUSED ...). Reset to "" at the start of each call.
 *
 * @client  borrowed; NULL gives "".
 * Returns: view, never NULL: the calling thread's text for this client (per thread, as errno).
 *          Valid until that thread's next call on that client, and never after the
 *          thread ends. Each thread keeps the texts of 8 clients, in slots given in turn to each
 *          client it calls that has none: once the thread has given slots to 8 other clients
 *          since this one got its own, the text is gone (a thread that calls at most 8 clients
 *          in its life never loses it this way). Copy the text to keep it.
 * Thread safety: any thread. Since: 0.1
 */
REDSEM_API const char *redsem_client_errmsg(const redsem_client *client);

/**
 * redsem_client_ping - round trip to the server (PING), reconnecting first if needed.
 *
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL); REDSEM_ECONN; REDSEM_ETIMEDOUT; REDSEM_EPERM;
 *          REDSEM_ESERVER; REDSEM_EPROTO; REDSEM_EFORKED.
 * Thread safety: any thread, at the same time as others (see "Threads" in
 * redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_client_ping(redsem_client *client);

/** Counters of what a client has sent, for operators and benchmarks: on the connections of
 * its threads and its renewer (which share them), and on those of its redsem_async loop
 * engines (what an engine counted stays after redsem_async_free()). Since: 0.1 */
typedef struct redsem_client_stats {
    uint64_t requests;     /* requests written to Redis (each EVALSHA, SET, BLPOP ... once;
                              the SCRIPT LOAD written with a script's first EVALSHA counts
                              in script_loads only) */
    uint64_t connects;     /* successful connections, the first one included */
    uint64_t script_loads; /* script bodies sent: a SCRIPT LOAD pipelined before the EVALSHA
                              (same write, same round trip) on a script's first use on a
                              server and after each NOSCRIPT; an EVAL with the body where
                              the server refuses SCRIPT LOAD (ACL) */
    uint64_t noscript;     /* NOSCRIPT replies seen (each answered by sending the body once
                              more, as above) */
    uint64_t retries;      /* requests re-sent after a connection-level failure (or, in a
                              Redis Cluster, after TRYAGAIN or CLUSTERDOWN) */
    uint64_t wakeups;      /* blocking waits ended by a wake-up signal */
    uint64_t redirects;    /* Redis Cluster MOVED and ASK replies followed (Since: 0.3) */
    uint64_t pool_waits;   /* always 0: a client has no pool of connections (one request
                              connection per server); kept for the ABI (Since: 0.4) */
    uint64_t pipelined;    /* requests written while others (other threads', or other
                              operations' on a redsem_async's loop) were in flight on the
                              same connection (Since: 0.4) */
    uint64_t direct_grants; /* fair and locked acquires decided by a wake-up that carried the
                               permit, with no attempt after it (one server, no
                               sync_replicas) (Since: 0.4.5) */
    uint64_t reserved[4];  /* zero; room for later counters without an ABI break */
} redsem_client_stats;

/**
 * redsem_client_get_stats - copy the client's counters.
 *
 * @client     borrowed; must not be NULL.
 * @ret_stats  borrowed; must not be NULL; filled on REDSEM_OK.
 * Returns: REDSEM_OK; REDSEM_EINVAL. Server: none. Thread safety: any thread, at the same time as
 * others (see "Threads" in redsem/client.h). Since: 0.1
 */
REDSEM_API int redsem_client_get_stats(const redsem_client *client,
                                       redsem_client_stats *ret_stats);

/** Length of a holder identifier in hex characters (20 random bytes). */
#define REDSEM_ID_LEN 40
/** Buffer size for a holder identifier, NUL included. */
#define REDSEM_ID_BUFSIZE 41

/**
 * redsem_id_generate - a fresh holder identifier: 20 random bytes from libsodium's
 * randombytes_buf(), hex-encoded in lower case (the "20 bytes from /dev/urandom" of the Redis
 * distributed-lock page).
 *
 * @out  borrowed; at least REDSEM_ID_BUFSIZE bytes; receives 40 hex chars and a NUL.
 * Returns: REDSEM_OK; REDSEM_EINVAL (NULL); REDSEM_ENOMEM if libsodium cannot initialise.
 * Thread safety: callable from any thread. Since: 0.1
 */
REDSEM_API int redsem_id_generate(char out[REDSEM_ID_BUFSIZE]);

/**
 * redsem_monotonic_ms - the clock that permit validity deadlines are expressed in:
 * CLOCK_MONOTONIC, in ms.
 *
 * Thread safety: callable from any thread. Since: 0.1
 */
REDSEM_API int64_t redsem_monotonic_ms(void);

#ifdef __cplusplus
}
#endif

#endif /* REDSEM_CLIENT_H */
