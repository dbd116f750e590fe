/* redsem - the transport: one socket, hiredis' protocol reader, per-call deadlines.
 *
 * The socket is connected non-blocking (connect is bounded by poll; the pieces a dial of the
 * event loop shares, net/dial.c, are here: sock_connect, connect_error, conn_ready), then
 * switched to blocking mode with SO_RCVTIMEO/SO_SNDTIMEO set to the command timeout. A call has one
 * deadline, set by its write (the caller's, or the write's start + the command timeout) and
 * kept in the connection for its reads. An ordinary request's reply is read with one
 * blocking recv, whose SO_RCVTIMEO ends at that deadline (within REDSEM__RECV_SLACK_MS);
 * every other wait (a write, a reply that comes in pieces, BLPOP's long deadline) uses
 * MSG_DONTWAIT and polls until the deadline, so no call outlives the deadline of its call,
 * however slowly a server trickles its reply.
 *
 * Why not hiredis' blocking redisContext: hiredis 0.14 writes with write(2), which raises
 * SIGPIPE on a reset connection (a library must never kill its host process), and its
 * timeouts are per-socket SO_RCVTIMEO values, which bound each read rather than the call.
 * hiredis still does the protocol: redisFormatCommandArgv() encodes and redisReader
 * parses. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "net/net.h"

void redsem__conn_init(redsem__conn *c)
{
    c->fd = -1;
    c->reader = NULL;
    c->fns = NULL;
    c->create_array = NULL;
    c->oversized = 0;
    c->ssl = NULL;
    c->io_timeout_ns = 0;
    c->call_deadline_ns = 0;
}

void redsem__conn_close(redsem__conn *c)
{
    if (c->ssl != NULL)
        redsem__tls_free(c);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->reader)
        redisReaderFree(c->reader);
    c->reader = NULL;
    redsem__free(c->fns);
    c->fns = NULL;
}

/* The element count hiredis passes to createArray: an int up to 0.14, a size_t since 1.0. */
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
typedef size_t array_count;
#define COUNT_NEGATIVE(n) ((void)(n), false)
#else
typedef int array_count;
#define COUNT_NEGATIVE(n) ((n) < 0)
#endif
typedef void *(*create_array_fn)(const redisReadTask *task, array_count elements);

/* hiredis 0.14 callocs an aggregate's element array from the count in its header: "*2000000000"
 * alone, from a broken or hostile peer, would reserve 16 GB (1.x caps it at 2^32-1 elements,
 * still 32 GB). */
static void *capped_array(const redisReadTask *task, array_count elements)
{
    redsem__conn *c = task->privdata;
    if (COUNT_NEGATIVE(elements) || elements > REDSEM__MAX_REPLY_ELEMENTS) {
        c->oversized = (long long)elements;
        return NULL; /* the reader then fails: see redsem__conn_read */
    }
    return ((create_array_fn)c->create_array)(task, elements);
}

int redsem__conn_reader(redsem__conn *c)
{
    redisReader *rd = redisReaderCreate();
    redisReplyObjectFunctions *fns = redsem__malloc(sizeof *fns);
    if (rd == NULL || fns == NULL) {
        if (rd)
            redisReaderFree(rd);
        redsem__free(fns);
        return REDSEM_ENOMEM;
    }
    *fns = *rd->fn; /* hiredis' own constructors, but for arrays */
    c->create_array = (void (*)(void))fns->createArray;
    fns->createArray = capped_array;
    rd->fn = fns;
    rd->privdata = c; /* hiredis hands it to every read task */
    c->fns = fns;
    c->oversized = 0;
    c->reader = rd;
    return REDSEM_OK;
}

void redsem__conn_abort(redsem__conn *c)
{
    /* SO_LINGER 0: close() sends a RST and throws the send queue away. A plain close() keeps
     * retransmitting unacknowledged bytes, so a request given up after a timeout (a network
     * partition) could still reach the server seconds later, when the network heals. */
    if (c->fd >= 0) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        (void)setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    redsem__conn_close(c);
}

/* wait_fd as an I/O status: REDSEM__IO_OK ready, _TIMEOUT, or _CLOSED with errno. */
static int wait_io(int fd, short events, int64_t deadline_ns, int *err_no);

/* Wait for events on fd until deadline_ns (REDSEM__FOREVER: no limit). 1 ready, 0 timeout,
 * -1 error (errno). */
static int wait_fd(int fd, short events, int64_t deadline_ns)
{
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = events};
        int64_t left = deadline_ns == REDSEM__FOREVER ? -1 : deadline_ns - redsem__now_ns();
        if (deadline_ns != REDSEM__FOREVER && left <= 0)
            return 0;
        struct timespec ts, *tsp = NULL;
        if (left >= 0) {
            ts.tv_sec = left / 1000000000LL;
            ts.tv_nsec = left % 1000000000LL;
            tsp = &ts;
        }
        int n = ppoll(&pfd, 1, tsp, NULL);
        if (n > 0)
            return 1;
        if (n == 0)
            continue; /* re-check the clock; ppoll may wake slightly early */
        if (errno != EINTR)
            return -1;
    }
}

int redsem__sock_connected(int fd, int *err_no)
{
    int so = 0;
    socklen_t sl = sizeof so;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0)
        so = errno;
    if (so != 0) {
        *err_no = so;
        return REDSEM__IO_CLOSED;
    }
    return REDSEM__IO_OK;
}

int redsem__sock_connect(int family, const struct sockaddr *addr, socklen_t len, int *fd,
                         int *err_no)
{
    *fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (*fd < 0) {
        *err_no = errno;
        return REDSEM__IO_CLOSED;
    }
    if (connect(*fd, addr, len) == 0)
        return REDSEM__IO_OK;
    /* a unix socket whose backlog is full says EAGAIN */
    if (errno == EINPROGRESS || (family == AF_UNIX && errno == EAGAIN))
        return REDSEM__IO_PENDING;
    *err_no = errno;
    close(*fd);
    *fd = -1;
    return REDSEM__IO_CLOSED;
}

bool redsem__unix_addr(const char *path, struct sockaddr_un *sa, int *err_no)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    size_t len = strlen(path);
    if (len >= sizeof sa->sun_path) {
        *err_no = ENAMETOOLONG;
        return false;
    }
    memcpy(sa->sun_path, path, len);
    return true;
}

int redsem__connect_error(const redsem__endpoint *ep, int st, int err_no, char *err,
                          size_t errlen)
{
    bool unix_ = ep->kind == REDSEM__EP_UNIX;
    if (st == REDSEM__IO_TIMEOUT) {
        if (unix_)
            snprintf(err, errlen, "connect to unix:%s timed out", ep->path);
        else
            snprintf(err, errlen, "connect to %s:%d timed out", ep->host, ep->port);
        return REDSEM_ETIMEDOUT;
    }
    if (unix_)
        snprintf(err, errlen, "connect to unix:%s: %s", ep->path, strerror(err_no));
    else
        snprintf(err, errlen, "connect to %s:%d: %s", ep->host, ep->port, strerror(err_no));
    return REDSEM_ECONN;
}

const char *redsem__tls_name(const redsem__endpoint *ep, const redsem__conn_tls *tls)
{
    return tls->server_name ? tls->server_name
                            : ep->kind == REDSEM__EP_TCP ? ep->host : "localhost";
}

/* One connect (sock_connect), waited for until deadline_ns. */
static int connect_wait(int family, const struct sockaddr *addr, socklen_t len,
                        int64_t deadline_ns, int *fd, int *err_no)
{
    int st = redsem__sock_connect(family, addr, len, fd, err_no);
    if (st != REDSEM__IO_PENDING)
        return st;
    st = wait_io(*fd, POLLOUT, deadline_ns, err_no);
    if (st == REDSEM__IO_OK)
        st = redsem__sock_connected(*fd, err_no);
    if (st != REDSEM__IO_OK) {
        close(*fd);
        *fd = -1;
    }
    return st;
}

/* After a non-blocking connect: make the socket blocking, bounded by the command timeout. */
static int make_blocking(int fd, int64_t io_timeout_ms)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
        return -1;
    struct timeval tv = {.tv_sec = (time_t)(io_timeout_ms / 1000),
                         .tv_usec = (suseconds_t)(io_timeout_ms % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0)
        return -1;
    return 0;
}

/* TLS on the connected fd, its handshake polled until deadline_ns. */
static int tls_connect(redsem__conn *c, int fd, void *ctx, const char *host, int64_t deadline_ns,
                       char *err, size_t errlen)
{
    int rc = redsem__tls_begin(c, fd, ctx, host, err, errlen);
    for (short ev = 0; rc == REDSEM_OK;) {
        rc = redsem__tls_handshake(c, host, &ev, err, errlen);
        if (rc != REDSEM_OK || ev == 0)
            break;
        int w = wait_fd(fd, ev, deadline_ns);
        if (w <= 0)
            return redsem__tls_wait_failed(c, host, w == 0 ? 0 : errno, err, errlen);
    }
    return rc;
}

int redsem__conn_ready(redsem__conn *c, int fd, const redsem__endpoint *ep,
                       int64_t io_timeout_ms, char *err, size_t errlen)
{
    if (ep->kind == REDSEM__EP_TCP) {
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    }
    c->io_timeout_ns = io_timeout_ms * REDSEM__NS_PER_MS;
    c->call_deadline_ns = 0;
    if (redsem__conn_reader(c) != REDSEM_OK) {
        if (c->ssl != NULL)
            redsem__tls_free(c);
        close(fd);
        snprintf(err, errlen, "out of memory creating the reply reader");
        return REDSEM_ENOMEM;
    }
    c->fd = fd;
    return REDSEM_OK;
}

int redsem__conn_open(redsem__conn *c, const redsem__endpoint *ep, const redsem__conn_tls *tls,
                      int64_t deadline_ns, int64_t io_timeout_ms, bool *retryable, char *err,
                      size_t errlen)
{
    int fd = -1, err_no = 0, st;
    *retryable = true;
    redsem__conn_close(c);
    if (ep->kind == REDSEM__EP_UNIX) {
        struct sockaddr_un sa;
        st = REDSEM__IO_CLOSED;
        if (redsem__unix_addr(ep->path, &sa, &err_no))
            st = connect_wait(AF_UNIX, (struct sockaddr *)&sa, sizeof sa, deadline_ns, &fd,
                              &err_no);
    } else {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        char port[16];
        snprintf(port, sizeof port, "%d", ep->port);
        int gai = getaddrinfo(ep->host, port, &hints, &res);
        if (gai != 0) {
            *retryable = gai == EAI_AGAIN;
            snprintf(err, errlen, "cannot resolve host '%s': %s", ep->host,
                     gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
            return gai == EAI_MEMORY ? REDSEM_ENOMEM : REDSEM_ECONN;
        }
        st = REDSEM__IO_CLOSED;
        err_no = ECONNREFUSED;
        for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
            st = connect_wait(ai->ai_family, ai->ai_addr, ai->ai_addrlen, deadline_ns, &fd,
                              &err_no);
            if (st == REDSEM__IO_OK || st == REDSEM__IO_TIMEOUT)
                break;
        }
        freeaddrinfo(res);
    }
    if (st != REDSEM__IO_OK)
        return redsem__connect_error(ep, st, err_no, err, errlen);
    if (tls != NULL && tls->ctx != NULL) {
        /* TLS keeps the socket non-blocking: every read and write polls until its deadline */
        int rc = tls_connect(c, fd, tls->ctx, redsem__tls_name(ep, tls), deadline_ns, err,
                             errlen);
        if (rc != REDSEM_OK) {
            /* a refused certificate or a port that does not speak TLS: trying again will
             * not help */
            *retryable = rc == REDSEM_ETIMEDOUT;
            close(fd);
            return rc;
        }
    } else if (make_blocking(fd, io_timeout_ms) < 0) {
        snprintf(err, errlen, "socket setup: %s", strerror(errno));
        close(fd);
        return REDSEM_ECONN;
    }
    return redsem__conn_ready(c, fd, ep, io_timeout_ms, err, errlen);
}

int redsem__conn_write(redsem__conn *c, const char *buf, size_t len, int64_t deadline_ns,
                       int *err_no)
{
    /* deadline 0: an ordinary request, bounded by the command timeout from now; the reads
     * of its replies end at the same deadline */
    if (deadline_ns == 0)
        deadline_ns = redsem__now_ns() + c->io_timeout_ns;
    c->call_deadline_ns = deadline_ns;
    size_t off = 0;
    while (c->ssl != NULL && off < len) {
        short ev = 0;
        ssize_t n = redsem__tls_send(c, buf + off, len - off, &ev, err_no);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n != -2)
            return REDSEM__IO_CLOSED;
        int w = wait_io(c->fd, ev, deadline_ns, err_no);
        if (w != REDSEM__IO_OK)
            return w;
    }
    while (off < len) {
        /* MSG_DONTWAIT: a full send buffer (a stalled server) waits in poll, bounded by the
         * call's deadline, not by SO_SNDTIMEO. MSG_NOSIGNAL: never raise SIGPIPE. */
        ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_io(c->fd, POLLOUT, deadline_ns, err_no);
            if (w != REDSEM__IO_OK)
                return w;
            continue;
        }
        *err_no = n < 0 ? errno : EPIPE;
        return REDSEM__IO_CLOSED;
    }
    return REDSEM__IO_OK;
}

int redsem__conn_read(redsem__conn *c, redisReply **ret, int64_t deadline_ns, int *err_no,
                      char *err, size_t errlen)
{
    redisReader *rd = c->reader;
    char buf[16384];
    /* 0: the call's deadline, set by its write (a read without a write: the command timeout
     * from now) */
    if (deadline_ns == 0)
        deadline_ns = c->call_deadline_ns ? c->call_deadline_ns
                                          : redsem__now_ns() + c->io_timeout_ns;
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
            if (c->oversized) {
                snprintf(err, errlen, "protocol error: a reply announced %lld elements, more "
                         "than any redsem reply has", c->oversized);
                return REDSEM__IO_PROTO;
            }
            snprintf(err, errlen, "protocol error: %s", rd->errstr);
            return rd->err == REDIS_ERR_OOM ? REDSEM__IO_NOMEM : REDSEM__IO_PROTO;
        }
        if (reply != NULL) {
            *ret = reply;
            return REDSEM__IO_OK;
        }
        ssize_t n;
        if (c->ssl != NULL) {
            /* TLS: OpenSSL may hold bytes already read (read-ahead, a record), and then they
             * are read first; otherwise wait for the socket before reading (no EAGAIN read) */
            short ev = POLLIN;
            if (!redsem__tls_pending(c)) {
                int w = wait_io(c->fd, ev, deadline_ns, err_no);
                if (w != REDSEM__IO_OK)
                    return w;
            }
            n = redsem__tls_recv(c, buf, sizeof buf, &ev, err_no);
            if (n == -2) {
                int w = wait_io(c->fd, ev, deadline_ns, err_no);
                if (w != REDSEM__IO_OK)
                    return w;
                continue;
            }
            if (n < 0)
                return REDSEM__IO_CLOSED;
        } else {
            int64_t now = redsem__now_ns();
            if (now >= deadline_ns)
                return REDSEM__IO_TIMEOUT;
            /* now + timeout <= deadline + slack, without overflow (a deadline may be
             * INT64_MAX: none; deadline_ns > now here) */
            if (deadline_ns - now >=
                c->io_timeout_ns - REDSEM__RECV_SLACK_MS * REDSEM__NS_PER_MS) {
                /* blocking: SO_RCVTIMEO (the command timeout) ends by the deadline; if it
                 * ends before it, the loop waits on for the rest */
                n = recv(c->fd, buf, sizeof buf, 0);
            } else {
                int w = wait_io(c->fd, POLLIN, deadline_ns, err_no);
                if (w != REDSEM__IO_OK)
                    return w;
                n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
            }
        }
        if (n > 0) {
            if (redisReaderFeed(rd, buf, (size_t)n) != REDIS_OK) {
                snprintf(err, errlen, "protocol error: %s", rd->errstr);
                return REDSEM__IO_PROTO;
            }
            continue;
        }
        if (n == 0) {
            *err_no = 0;
            return REDSEM__IO_CLOSED;
        }
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
            continue; /* the deadline is checked above */
        *err_no = errno;
        return REDSEM__IO_CLOSED;
    }
}

int redsem__io_status(int io, int err_no, char *err, size_t errlen)
{
    switch (io) {
    case REDSEM__IO_OK:
        return REDSEM_OK;
    case REDSEM__IO_TIMEOUT:
        snprintf(err, errlen, "no reply from Redis within the deadline");
        return REDSEM_ETIMEDOUT;
    case REDSEM__IO_CLOSED:
        snprintf(err, errlen, "connection lost: %s",
                 err_no ? strerror(err_no) : "closed by the server");
        return REDSEM_ECONN;
    case REDSEM__IO_NOMEM:
        return REDSEM_ENOMEM;
    default:
        return REDSEM_EPROTO;
    }
}

static int wait_io(int fd, short events, int64_t deadline_ns, int *err_no)
{
    int w = wait_fd(fd, events, deadline_ns);
    if (w > 0)
        return REDSEM__IO_OK;
    if (w == 0)
        return REDSEM__IO_TIMEOUT;
    *err_no = errno;
    return REDSEM__IO_CLOSED;
}

ssize_t redsem__conn_send_nb(redsem__conn *c, const char *buf, size_t len, short *events,
                             int *err_no)
{
    if (c->ssl != NULL)
        return redsem__tls_send(c, buf, len, events, err_no);
    for (;;) {
        ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            return n;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *events = POLLOUT;
            return -2;
        }
        *err_no = n < 0 ? errno : EPIPE;
        return -1;
    }
}

ssize_t redsem__conn_recv_nb(redsem__conn *c, char *buf, size_t len, short *events,
                             int *err_no)
{
    if (c->ssl != NULL)
        return redsem__tls_recv(c, buf, len, events, err_no);
    for (;;) {
        ssize_t n = recv(c->fd, buf, len, MSG_DONTWAIT);
        if (n >= 0)
            return n;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *events = POLLIN;
            return -2;
        }
        *err_no = errno;
        return -1;
    }
}
