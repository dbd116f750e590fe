/* redsem - the connection layer: endpoints (URLs) and the transport of one connection (a
 * socket with hiredis' protocol reader, per-call deadlines). Below the node; knows nothing of
 * requests, scripts or clients. Not API. */
#ifndef REDSEM_NET_H
#define REDSEM_NET_H

#include <sys/types.h>

#include "base/base.h"

struct redisReply;
struct redisReadTask;
struct redisReplyObjectFunctions;

/* ---------------------------------------------------------------- URL (url.c) */
enum { REDSEM__EP_TCP = 1, REDSEM__EP_UNIX = 2, REDSEM__EP_SENTINEL = 3, REDSEM__EP_CLUSTER = 4 };
#define REDSEM__HOSTS_MAX 16
typedef struct redsem__hostport {
    char *host;
    int port;
} redsem__hostport;
typedef struct redsem__endpoint {
    int kind;
    char *host;     /* TCP: name or address, brackets removed */
    int port;       /* TCP */
    char *path;     /* UNIX */
    char *user;     /* NULL: none */
    char *password; /* NULL: none */
    long db;
    bool tls;       /* rediss://, rediss+sentinel://, rediss+cluster:// */
    /* SENTINEL: the Sentinels to ask (hosts), the primary's name, the Sentinels' own
     * credentials (user and password are the data nodes'). CLUSTER: the seed nodes (hosts);
     * user and password are every node's. */
    redsem__hostport *hosts;
    size_t nhosts;
    char *master;
    char *sentinel_user;     /* NULL: none */
    char *sentinel_password; /* NULL: none */
} redsem__endpoint;

#define REDSEM__URL_MAX 4096
/* Parse url into ep (all strings owned by ep). Returns REDSEM_OK, REDSEM_EINVAL (with a
 * reason in err) or REDSEM_ENOMEM. ep is untouched on failure. */
int redsem__url_parse(const char *url, redsem__endpoint *ep, char *err, size_t errlen);
int redsem__endpoint_copy(redsem__endpoint *dst, const redsem__endpoint *src);
void redsem__endpoint_clear(redsem__endpoint *ep);

/* ---------------------------------------------------------------- TLS settings (tls.c) */
typedef struct redsem__tls_opts {
    char *ca_file;     /* NULL: the system's CA certificates (unless ca_dir) */
    char *ca_dir;      /* NULL: none */
    char *cert_file;   /* client certificate (mutual TLS); NULL: none */
    char *key_file;    /* its key; NULL: in cert_file */
    char *server_name; /* SNI and verification; NULL: the URL's host */
    bool insecure;     /* skip verification of the chain and of the name (tests only) */
} redsem__tls_opts;
void redsem__tls_opts_clear(redsem__tls_opts *t);
int redsem__tls_opts_copy(redsem__tls_opts *dst, const redsem__tls_opts *src);
/* An OpenSSL client context (SSL_CTX *) for o, or NULL with the reason in err (a file that
 * cannot be read, a key that does not match its certificate). Made once per client (reading
 * the CA file or the system's CA bundle costs ~18 ms of CPU and ~0.9 MiB with Debian's
 * bundle: bench -w tls, lanes) and shared by all its connections: after this setup it is only
 * read (SSL_new), which OpenSSL 3 allows from any thread. */
void *redsem__tls_ctx_new(const redsem__tls_opts *o, char *err, size_t errlen);
/* Another reference to ctx (SSL_CTX_up_ref, atomic); ctx itself. NULL: NULL. */
void *redsem__tls_ctx_ref(void *ctx);
/* Drop a reference (the last frees it). NULL: nothing. */
void redsem__tls_ctx_free(void *ctx);

/* ---------------------------------------------------------------- transport (socket.c) */
/* A socket plus a hiredis protocol reader. hiredis formats requests and parses replies;
 * the socket I/O is ours so that writes never raise SIGPIPE (MSG_NOSIGNAL) and every call
 * has one deadline, from its write to the last byte of its last reply, which hiredis 0.14's
 * blocking context (a timeout per read) cannot give. */
typedef struct redsem__conn {
    int fd; /* -1 when closed; a blocking socket with SO_RCVTIMEO/SO_SNDTIMEO */
    void *reader; /* redisReader* */
    int64_t io_timeout_ns; /* the SO_RCVTIMEO/SO_SNDTIMEO set on fd: the command timeout */
    int64_t call_deadline_ns; /* the deadline of the call under way (set by conn_write) */
    /* hiredis' reply constructors with the array one capped (see redsem__conn_reader) */
    struct redisReplyObjectFunctions *fns;
    void (*create_array)(void); /* hiredis' createArray, cast back in socket.c (its count
                                 * is an int in hiredis 0.14, a size_t in 1.x) */
    long long oversized; /* the element count of a refused aggregate header */
    void *ssl;           /* SSL *: a TLS connection (tls.c); NULL: plain */
} redsem__conn;

/* What a connection is to reach and how: a TLS context (NULL: plain) and the name to present
 * and verify (NULL: the endpoint's host). */
typedef struct redsem__conn_tls {
    void *ctx;
    const char *server_name;
} redsem__conn_tls;

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
int redsem__conn_open(redsem__conn *c, const redsem__endpoint *ep, const redsem__conn_tls *tls,
                      int64_t deadline_ns, int64_t io_timeout_ms, bool *retryable, char *err,
                      size_t errlen);
void redsem__conn_close(redsem__conn *c);
/* Close with a RST (SO_LINGER 0): unsent and unacknowledged bytes are discarded, so a request
 * abandoned after a failure can never be delivered later. */
void redsem__conn_abort(redsem__conn *c);
/* Write all of buf before deadline_ns (0: now + the command timeout); a full send buffer
 * waits in poll. The deadline becomes the call's: the reads that follow with deadline 0
 * end at it. REDSEM__IO_OK, _TIMEOUT (part may have been written) or _CLOSED. */
int redsem__conn_write(redsem__conn *c, const char *buf, size_t len, int64_t deadline_ns,
                       int *err_no);
/* Read one reply before deadline_ns; 0: the call's deadline, the one the last
 * redsem__conn_write used (so a call's replies, however many and however slowly their bytes
 * come, end within one command timeout of its write). On plain sockets a recv whose
 * SO_RCVTIMEO (the command timeout) ends by the deadline, give or take
 * REDSEM__RECV_SLACK_MS, blocks without a poll (an ordinary request's first recv: the common
 * path costs two system calls per request, as hiredis' blocking context does); any other
 * wait polls until the deadline. REDSEM__IO_OK (*ret set), _TIMEOUT, _CLOSED (*err_no),
 * _PROTO (reason in err) or _NOMEM. */
#define REDSEM__RECV_SLACK_MS 2
int redsem__conn_read(redsem__conn *c, struct redisReply **ret, int64_t deadline_ns,
                      int *err_no, char *err, size_t errlen);
/* Without blocking, for a pipe (node/conn.h): move bytes on an open connection, plain or TLS.
 * > 0 bytes moved; 0 closed by the peer (recv); -1 error (*err_no); -2 nothing now: wait for
 * *events (POLLIN, POLLOUT: TLS may want either for both). Never raises SIGPIPE. */
ssize_t redsem__conn_send_nb(redsem__conn *c, const char *buf, size_t len, short *events,
                             int *err_no);
ssize_t redsem__conn_recv_nb(redsem__conn *c, char *buf, size_t len, short *events,
                             int *err_no);
/* A REDSEM__IO_* status as a REDSEM_* code, with the reason in err for a timeout or a lost
 * connection (err_no: errno, 0 for a close by the peer); _PROTO keeps err as the reader
 * wrote it. */
int redsem__io_status(int io, int err_no, char *err, size_t errlen);
/* Wait for events on fd until deadline_ns (REDSEM__FOREVER: no limit). 1 ready, 0 timeout,
 * -1 error (errno). */
int redsem__wait_fd(int fd, short events, int64_t deadline_ns);

/* TLS on a connected non-blocking fd (tls.c, used by socket.c): the handshake until
 * deadline_ns, then c->ssl is set. REDSEM_OK, ECONN, ETIMEDOUT, ETLS (verification refused),
 * EINVAL or ENOMEM, with the reason in err. */
int redsem__tls_connect(redsem__conn *c, int fd, void *ctx, const char *host, int64_t deadline_ns,
                        char *err, size_t errlen);
/* > 0 bytes moved; 0 closed by the peer; -1 error (*err_no); -2 wait for *events first. */
ssize_t redsem__tls_recv(redsem__conn *c, char *buf, size_t len, short *events, int *err_no);
ssize_t redsem__tls_send(redsem__conn *c, const char *buf, size_t len, short *events,
                         int *err_no);
/* Whether OpenSSL holds bytes already read from the socket (a record, or read-ahead). */
bool redsem__tls_pending(const redsem__conn *c);
void redsem__tls_free(redsem__conn *c);

#endif /* REDSEM_NET_H */
