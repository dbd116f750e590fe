/* redsem - the connection layer: endpoints (URLs) and the transport of one connection (a
 * socket with hiredis' protocol reader, per-call deadlines). Below the node; knows nothing of
 * requests, scripts or clients. Not API. */
#ifndef REDSEM_NET_H
#define REDSEM_NET_H

#include <sys/socket.h>
#include <sys/types.h>

struct pollfd;

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
 * bundle: bench -w tls) and shared by all its connections: after this setup it is only
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
    REDSEM__IO_NOMEM = 4,
    REDSEM__IO_PENDING = 5  /* a connect under way (EINPROGRESS): wait for POLLOUT */
};

void redsem__conn_init(redsem__conn *c);
/* Create c->reader: hiredis' reader, whose array constructor refuses an aggregate header of
 * more than REDSEM__MAX_REPLY_ELEMENTS (hiredis 0.14 allocates the announced count before
 * any element arrives). REDSEM_OK or REDSEM_ENOMEM. */
int redsem__conn_reader(redsem__conn *c);
/* Blocking (the calling thread polls until deadline_ns): resolve (getaddrinfo), connect,
 * TLS handshake. Returns REDSEM_OK, REDSEM_ECONN, REDSEM_ETIMEDOUT or REDSEM_ENOMEM;
 * *retryable says whether trying again may help (refused: yes; name not found: no). */
int redsem__conn_open(redsem__conn *c, const redsem__endpoint *ep, const redsem__conn_tls *tls,
                      int64_t deadline_ns, int64_t io_timeout_ms, bool *retryable, char *err,
                      size_t errlen);
/* The pieces redsem__conn_open and a dial (dial.c) share. sock_connect: a non-blocking
 * socket of family connected to addr: REDSEM__IO_OK (connected), _PENDING (wait for POLLOUT,
 * then sock_connected) with *fd set, or _CLOSED with *err_no. sock_connected: the outcome of
 * a pending connect (SO_ERROR): _OK or _CLOSED with *err_no. unix_addr: ep's socket path as
 * an address (false: too long, *err_no ENAMETOOLONG). connect_error: the code and text of a
 * failed connect to ep (st _TIMEOUT or _CLOSED with err_no). tls_name: the name TLS presents
 * and verifies. conn_ready: c takes the connected fd (TCP options set, its reader made);
 * REDSEM_OK or REDSEM_ENOMEM (fd and c->ssl then closed). */
int redsem__sock_connect(int family, const struct sockaddr *addr, socklen_t len, int *fd,
                         int *err_no);
int redsem__sock_connected(int fd, int *err_no);
struct sockaddr_un;
bool redsem__unix_addr(const char *path, struct sockaddr_un *sa, int *err_no);
int redsem__connect_error(const redsem__endpoint *ep, int st, int err_no, char *err,
                          size_t errlen);
const char *redsem__tls_name(const redsem__endpoint *ep, const redsem__conn_tls *tls);
int redsem__conn_ready(redsem__conn *c, int fd, const redsem__endpoint *ep,
                       int64_t io_timeout_ms, char *err, size_t errlen);
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

/* ---------------------------------------------------------------- a connect that never blocks (dial.c) */
/* A dial opens one connection of an endpoint without blocking, for an event loop (the loop
 * engine, src/drive_loop.c), in the shape of libcurl's multi_socket and c-ares: it names the
 * descriptors to watch and its earliest deadline (dial_wants), and the loop steps it when one
 * is ready or the deadline came (dial_step). Its states, in order: RESOLVING (a host name,
 * through c-ares' ares_getaddrinfo on sockets of its own; a numeric address or a unix socket
 * skips it), CONNECTING (a non-blocking connect(2), each address in turn until one takes
 * it), TLS (rediss://: OpenSSL's handshake one step at a time, as tls.c does it for the
 * blocking open) and DONE (c open: its descriptor, TLS and reader set, as redsem__conn_open
 * leaves it). Its own deadline it does not watch: the caller's (the connect timeout) ends it
 * with dial_timeout. Error texts are the blocking open's. Not thread-safe. */
enum {
    REDSEM__DIAL_IDLE = 0,
    REDSEM__DIAL_RESOLVING = 1,
    REDSEM__DIAL_CONNECTING = 2,
    REDSEM__DIAL_TLS = 3,
    REDSEM__DIAL_DONE = 4
};
#define REDSEM__DIAL_SOCKS 6 /* c-ares' sockets watched at once (UDP and TCP, per server) */
#define REDSEM__DIAL_ADDRS 8 /* addresses of a name tried in turn */
typedef struct redsem__dial {
    int state;
    redsem__conn *c;             /* opened (borrowed) */
    const redsem__endpoint *ep;  /* borrowed until the dial ends */
    void *tls_ctx;               /* SSL_CTX *, NULL: plain */
    const char *tls_host;        /* the name TLS presents and verifies (borrowed) */
    int64_t io_timeout_ms;
    void *channel;               /* ares_channel while resolving */
    int socks[REDSEM__DIAL_SOCKS]; /* c-ares' sockets, -1: free */
    short sock_ev[REDSEM__DIAL_SOCKS];
    int status;                  /* ares_getaddrinfo's status, once its callback ran */
    bool resolved;
    struct sockaddr_storage addr[REDSEM__DIAL_ADDRS];
    socklen_t addrlen[REDSEM__DIAL_ADDRS];
    int naddr, next;             /* the addresses, and the next one to try */
    int fd;                      /* the socket connecting, or under TLS (-1: none) */
    int err_no;                  /* the last connect's error */
    short tls_ev;                /* what the TLS handshake waits for */
    unsigned gen;                /* bumped when one of its descriptors opens or closes */
} redsem__dial;
/* Start opening c (closed) to ep with tls (ctx NULL: plain); ep and tls->server_name must
 * outlive the dial. REDSEM_OK (under way, or DONE already: see d->state) or a failure
 * (ECONN, ENOMEM) with the reason in err; nothing is left open then. */
int redsem__dial_start(redsem__dial *d, redsem__conn *c, const redsem__endpoint *ep,
                       const redsem__conn_tls *tls, int64_t io_timeout_ms, char *err,
                       size_t errlen);
/* The descriptors to watch now (at most max: REDSEM__DIAL_SOCKS + 1 is enough) with their
 * events (POLLIN, POLLOUT), and in *deadline_ns c-ares' next timeout (REDSEM__FOREVER:
 * none). How many. */
int redsem__dial_wants(const redsem__dial *d, struct pollfd *w, int max, int64_t *deadline_ns);
/* Do what is due: ready (n entries, revents as poll()'s) says which descriptors are; c-ares'
 * timeouts are processed too. REDSEM_OK (d->state: under way or DONE) or the failure, with
 * the reason in err; nothing is left open then. */
int redsem__dial_step(redsem__dial *d, const struct pollfd *ready, int n, char *err,
                      size_t errlen);
/* The caller's deadline passed: the dial ends, its code (REDSEM_ETIMEDOUT) and text those of
 * the blocking open in the same phase. */
int redsem__dial_timeout(redsem__dial *d, char *err, size_t errlen);
/* End a dial under way (nothing of it stays open); a dial not started or ended: nothing. */
void redsem__dial_cancel(redsem__dial *d);

/* TLS on a connected non-blocking fd (tls.c, used by socket.c and dial.c; tls.c calls none
 * of them). begin: the SSL object on fd with SNI and the name to verify (host), c->ssl set;
 * REDSEM_OK, EINVAL or ENOMEM with the reason in err. handshake: one step of it, never
 * blocking: REDSEM_OK with *events 0 (done) or POLLIN/POLLOUT (wait for them, then step
 * again); or ECONN / ETLS (verification refused) with the reason in err and c->ssl freed.
 * wait_failed: the handshake's wait ended without readiness (err_no 0: its deadline; else
 * poll's errno): c->ssl freed, REDSEM_ETIMEDOUT or ECONN with the reason in err. */
int redsem__tls_begin(redsem__conn *c, int fd, void *ctx, const char *host, char *err,
                      size_t errlen);
int redsem__tls_handshake(redsem__conn *c, const char *host, short *events, char *err,
                          size_t errlen);
int redsem__tls_wait_failed(redsem__conn *c, const char *host, int err_no, char *err,
                            size_t errlen);
/* > 0 bytes moved; 0 closed by the peer; -1 error (*err_no); -2 wait for *events first. */
ssize_t redsem__tls_recv(redsem__conn *c, char *buf, size_t len, short *events, int *err_no);
ssize_t redsem__tls_send(redsem__conn *c, const char *buf, size_t len, short *events,
                         int *err_no);
/* Whether OpenSSL holds bytes already read from the socket (a record, or read-ahead). */
bool redsem__tls_pending(const redsem__conn *c);
void redsem__tls_free(redsem__conn *c);

#endif /* REDSEM_NET_H */
