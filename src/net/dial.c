/* redsem - a connect that never blocks (net/net.h's dial): c-ares for a host name, a
 * non-blocking connect(2), TLS one handshake step at a time; the caller's event loop waits.
 * What it shares with the blocking open (socket.c: the connect, its error texts, the
 * connection made ready; tls.c: the TLS setup and each handshake step) it calls there. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include <ares.h>

#include "net/net.h"

static pthread_once_t ares_once = PTHREAD_ONCE_INIT;
static int ares_init_rc = ARES_SUCCESS;

/* ares_library_init is not thread-safe: once per process (on Linux it sets up nothing that a
 * fork would break). */
static void ares_init_once(void)
{
    ares_init_rc = ares_library_init(ARES_LIB_INIT_ALL);
}

/* c-ares' ARES_OPT_SOCK_STATE_CB: a socket of its own to watch for these events (both 0: it
 * was closed). */
static void sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
    redsem__dial *d = data;
    short ev = (short)((readable ? POLLIN : 0) | (writable ? POLLOUT : 0));
    int slot = -1;
    for (int i = 0; i < REDSEM__DIAL_SOCKS && slot < 0; i++)
        if (d->socks[i] == fd)
            slot = i;
    if (slot < 0 && ev == 0)
        return;
    if (slot < 0) { /* a new one (beyond REDSEM__DIAL_SOCKS: c-ares' timeout retries it) */
        for (int i = 0; i < REDSEM__DIAL_SOCKS && slot < 0; i++)
            if (d->socks[i] < 0)
                slot = i;
        if (slot < 0)
            return;
        d->gen++;
    }
    d->socks[slot] = ev != 0 ? fd : -1;
    d->sock_ev[slot] = ev;
    if (ev == 0)
        d->gen++;
}

/* ares_getaddrinfo's answer: its addresses kept (at most REDSEM__DIAL_ADDRS). */
static void resolved(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
    (void)timeouts;
    redsem__dial *d = arg;
    d->resolved = true;
    d->status = status;
    for (struct ares_addrinfo_node *ai = res ? res->nodes : NULL;
         ai != NULL && d->naddr < REDSEM__DIAL_ADDRS; ai = ai->ai_next)
        if (ai->ai_addrlen <= sizeof d->addr[0]) {
            memcpy(&d->addr[d->naddr], ai->ai_addr, ai->ai_addrlen);
            d->addrlen[d->naddr++] = ai->ai_addrlen;
        }
    if (res != NULL)
        ares_freeaddrinfo(res);
}

/* Drop the resolver (its sockets closed). */
static void end_resolver(redsem__dial *d)
{
    if (d->channel != NULL) {
        ares_destroy(d->channel);
        d->channel = NULL;
        d->gen++;
    }
    for (int i = 0; i < REDSEM__DIAL_SOCKS; i++)
        d->socks[i] = -1;
}

static void close_fd(redsem__dial *d)
{
    if (d->c->ssl != NULL)
        redsem__tls_free(d->c);
    if (d->fd >= 0) {
        close(d->fd);
        d->gen++;
    }
    d->fd = -1;
}

/* The connection is made: c takes it. */
static int ready(redsem__dial *d, char *err, size_t errlen)
{
    int fd = d->fd;
    d->fd = -1;
    d->gen++;
    int rc = redsem__conn_ready(d->c, fd, d->ep, d->io_timeout_ms, err, errlen);
    d->state = rc == REDSEM_OK ? REDSEM__DIAL_DONE : REDSEM__DIAL_IDLE;
    return rc;
}

/* One step of the TLS handshake. */
static int tls_step(redsem__dial *d, char *err, size_t errlen)
{
    int rc = redsem__tls_handshake(d->c, d->tls_host, &d->tls_ev, err, errlen);
    if (rc != REDSEM_OK) {
        close_fd(d);
        d->state = REDSEM__DIAL_IDLE;
        return rc;
    }
    return d->tls_ev != 0 ? REDSEM_OK : ready(d, err, errlen);
}

/* d->fd is connected: TLS on it, or ready. */
static int connected(redsem__dial *d, char *err, size_t errlen)
{
    if (d->tls_ctx == NULL)
        return ready(d, err, errlen);
    int rc = redsem__tls_begin(d->c, d->fd, d->tls_ctx, d->tls_host, err, errlen);
    if (rc != REDSEM_OK) {
        close_fd(d);
        d->state = REDSEM__DIAL_IDLE;
        return rc;
    }
    d->state = REDSEM__DIAL_TLS;
    return tls_step(d, err, errlen);
}

/* Connect to the next address (one that refuses at once: the one after). */
static int try_next(redsem__dial *d, char *err, size_t errlen)
{
    d->state = REDSEM__DIAL_CONNECTING;
    while (d->next < d->naddr) {
        const struct sockaddr *sa = (const struct sockaddr *)&d->addr[d->next];
        int st = redsem__sock_connect(sa->sa_family, sa, d->addrlen[d->next], &d->fd,
                                      &d->err_no);
        d->next++;
        if (st == REDSEM__IO_CLOSED)
            continue;
        d->gen++;
        return st == REDSEM__IO_PENDING ? REDSEM_OK : connected(d, err, errlen);
    }
    d->state = REDSEM__DIAL_IDLE;
    return redsem__connect_error(d->ep, REDSEM__IO_CLOSED, d->err_no, err, errlen);
}

/* The name was resolved (or not): connect to its addresses. */
static int after_resolve(redsem__dial *d, char *err, size_t errlen)
{
    end_resolver(d);
    if (d->status != ARES_SUCCESS || d->naddr == 0) {
        d->state = REDSEM__DIAL_IDLE;
        snprintf(err, errlen, "cannot resolve host '%s': %s", d->ep->host,
                 d->status != ARES_SUCCESS ? ares_strerror(d->status) : "no address");
        return d->status == ARES_ENOMEM ? REDSEM_ENOMEM : REDSEM_ECONN;
    }
    return try_next(d, err, errlen);
}

/* A numeric address needs no resolver: getaddrinfo with AI_NUMERICHOST does no I/O.
 * false: a name. */
static bool numeric(redsem__dial *d, const char *port)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    if (getaddrinfo(d->ep->host, port, &hints, &res) != 0)
        return false;
    for (struct addrinfo *ai = res; ai != NULL && d->naddr < REDSEM__DIAL_ADDRS; ai = ai->ai_next)
        if (ai->ai_addrlen <= sizeof d->addr[0]) {
            memcpy(&d->addr[d->naddr], ai->ai_addr, ai->ai_addrlen);
            d->addrlen[d->naddr++] = ai->ai_addrlen;
        }
    freeaddrinfo(res);
    d->status = ARES_SUCCESS;
    return true;
}

/* Ask c-ares for the addresses of the endpoint's host. */
static int start_resolver(redsem__dial *d, const char *port, char *err, size_t errlen)
{
    pthread_once(&ares_once, ares_init_once);
    struct ares_options o;
    memset(&o, 0, sizeof o);
    o.sock_state_cb = sock_state;
    o.sock_state_cb_data = d;
    ares_channel ch = NULL;
    int st = ares_init_rc != ARES_SUCCESS ? ares_init_rc
                                          : ares_init_options(&ch, &o, ARES_OPT_SOCK_STATE_CB);
    if (st != ARES_SUCCESS) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", d->ep->host, ares_strerror(st));
        return st == ARES_ENOMEM ? REDSEM_ENOMEM : REDSEM_ECONN;
    }
    d->channel = ch;
    d->state = REDSEM__DIAL_RESOLVING;
    struct ares_addrinfo_hints hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = ARES_AI_NUMERICSERV;
    /* may answer at once (the hosts file) */
    ares_getaddrinfo(ch, d->ep->host, port, &hints, resolved, d);
    return d->resolved ? after_resolve(d, err, errlen) : REDSEM_OK;
}

int redsem__dial_start(redsem__dial *d, redsem__conn *c, const redsem__endpoint *ep,
                       const redsem__conn_tls *tls, int64_t io_timeout_ms, char *err,
                       size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    d->ep = ep;
    d->fd = -1;
    for (int i = 0; i < REDSEM__DIAL_SOCKS; i++)
        d->socks[i] = -1;
    d->io_timeout_ms = io_timeout_ms;
    d->err_no = ECONNREFUSED;
    if (tls != NULL && tls->ctx != NULL) {
        d->tls_ctx = tls->ctx;
        d->tls_host = redsem__tls_name(ep, tls);
    }
    redsem__conn_close(c);
    if (ep->kind == REDSEM__EP_UNIX) {
        if (!redsem__unix_addr(ep->path, (struct sockaddr_un *)&d->addr[0], &d->err_no))
            return redsem__connect_error(ep, REDSEM__IO_CLOSED, d->err_no, err, errlen);
        d->addrlen[0] = sizeof(struct sockaddr_un);
        d->naddr = 1;
        return try_next(d, err, errlen);
    }
    char port[16];
    snprintf(port, sizeof port, "%d", ep->port);
    if (numeric(d, port))
        return after_resolve(d, err, errlen);
    return start_resolver(d, port, err, errlen);
}

int redsem__dial_wants(const redsem__dial *d, struct pollfd *w, int max, int64_t *deadline_ns)
{
    int n = 0;
    *deadline_ns = REDSEM__FOREVER;
    if (d->state == REDSEM__DIAL_RESOLVING) {
        for (int i = 0; i < REDSEM__DIAL_SOCKS && n < max; i++)
            if (d->socks[i] >= 0)
                w[n++] = (struct pollfd){.fd = d->socks[i], .events = d->sock_ev[i]};
        struct timeval tv;
        if (ares_timeout(d->channel, NULL, &tv) != NULL)
            *deadline_ns = redsem__now_ns() + (int64_t)tv.tv_sec * 1000000000LL +
                           (int64_t)tv.tv_usec * 1000;
    } else if ((d->state == REDSEM__DIAL_CONNECTING || d->state == REDSEM__DIAL_TLS) &&
               d->fd >= 0 && n < max) {
        short ev = d->state == REDSEM__DIAL_CONNECTING ? POLLOUT : d->tls_ev;
        w[n++] = (struct pollfd){.fd = d->fd, .events = ev};
    }
    return n;
}

/* The revents found for fd in ready (0: not ready). */
static short revents_of(int fd, const struct pollfd *ready, int n)
{
    for (int i = 0; i < n; i++)
        if (ready[i].fd == fd)
            return ready[i].revents;
    return 0;
}

int redsem__dial_step(redsem__dial *d, const struct pollfd *ready, int n, char *err,
                      size_t errlen)
{
    if (d->state == REDSEM__DIAL_RESOLVING) {
        int socks[REDSEM__DIAL_SOCKS];
        memcpy(socks, d->socks, sizeof socks); /* the callback may change d->socks */
        for (int i = 0; i < REDSEM__DIAL_SOCKS && !d->resolved; i++) {
            short ev = socks[i] >= 0 ? revents_of(socks[i], ready, n) : 0;
            if (ev != 0)
                ares_process_fd(d->channel,
                                ev & (POLLIN | POLLERR | POLLHUP) ? socks[i] : ARES_SOCKET_BAD,
                                ev & POLLOUT ? socks[i] : ARES_SOCKET_BAD);
        }
        if (!d->resolved) /* its timeouts */
            ares_process_fd(d->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
        return d->resolved ? after_resolve(d, err, errlen) : REDSEM_OK;
    }
    if (d->fd < 0 || revents_of(d->fd, ready, n) == 0)
        return REDSEM_OK;
    if (d->state == REDSEM__DIAL_TLS)
        return tls_step(d, err, errlen);
    if (redsem__sock_connected(d->fd, &d->err_no) == REDSEM__IO_OK)
        return connected(d, err, errlen);
    close_fd(d);
    return try_next(d, err, errlen);
}

int redsem__dial_timeout(redsem__dial *d, char *err, size_t errlen)
{
    int rc = REDSEM_ETIMEDOUT;
    if (d->state == REDSEM__DIAL_TLS) {
        rc = redsem__tls_wait_failed(d->c, d->tls_host, 0, err, errlen);
    } else if (d->state == REDSEM__DIAL_RESOLVING) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", d->ep->host,
                 ares_strerror(ARES_ETIMEOUT));
    } else {
        rc = redsem__connect_error(d->ep, REDSEM__IO_TIMEOUT, 0, err, errlen);
    }
    redsem__dial_cancel(d);
    return rc;
}

void redsem__dial_cancel(redsem__dial *d)
{
    if (d->state == REDSEM__DIAL_IDLE || d->state == REDSEM__DIAL_DONE)
        return;
    end_resolver(d);
    close_fd(d);
    d->state = REDSEM__DIAL_IDLE;
}
