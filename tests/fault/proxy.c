/* Fault suite: a fault-injecting TCP proxy, one thread, one listener, per-proxy mode.
 *
 * PASS forwards both ways. BLACKHOLE forwards nothing and accepts nothing, like a network
 * partition: what a side sent waits (TCP would keep retransmitting it) and flows when the
 * partition heals - except on a connection that the client ABORTED meanwhile (RST:
 * close() with SO_LINGER 0), whose pending bytes are dropped, because an aborting kernel
 * discards its send queue and stops retransmitting. DROP_REPLIES forwards requests and
 * throws the replies away (the request is applied, its reply is lost). CLOSE closes every
 * connection and closes new ones at once. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fault.h"

#define MAXPAIRS 512
#define BUFSZ 65536

typedef struct dir {
    char buf[BUFSZ];
    size_t len, off;
    bool eof; /* the reading side ended; shut the writing side down once drained */
    int64_t ready_ns; /* with a reply delay: not forwarded before this (monotonic ns) */
} dir;

typedef struct pair {
    int c, s;
    int drop_next; /* replies still to drop (FP_DROP_EVAL_REPLIES) */
    dir cs, sc; /* client->server, server->client */
} pair;

struct fp_proxy {
    int lfd, port, target;
    int wake[2];
    pthread_t thread;
    _Atomic int mode;
    _Atomic int stop;
    _Atomic size_t accepted, dropped;
    _Atomic int64_t reply_delay_ns; /* each chunk of replies is held this long */
    pair *pairs[MAXPAIRS];
    int npairs;
};

static void set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void pair_free(fp_proxy *p, int i)
{
    pair *q = p->pairs[i];
    close(q->c);
    close(q->s);
    free(q);
    p->pairs[i] = p->pairs[--p->npairs];
}

static int connect_target(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_nonblock(fd);
    return fd;
}

static bool aborted(int fd)
{
    int err = 0;
    socklen_t sl = sizeof err;
    return getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 && err == ECONNRESET;
}

static void accept_all(fp_proxy *p, int mode)
{
    for (;;) {
        int c = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0)
            return;
        atomic_fetch_add(&p->accepted, 1);
        if (mode == FP_CLOSE || p->npairs >= MAXPAIRS || aborted(c)) {
            close(c);
            continue;
        }
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int s = connect_target(p->target);
        if (s < 0) {
            /* the server refuses: so does the proxy (an abortive close, like a RST) */
            struct linger lg = {1, 0};
            setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            close(c);
            continue;
        }
        pair *q = calloc(1, sizeof *q);
        q->c = c;
        q->s = s;
        p->pairs[p->npairs++] = q;
    }
}

/* The number of keys of an EVALSHA request ("*N $7 EVALSHA $40 <sha> $k <numkeys> ...") or of
 * an EVAL carrying a script's body (a client's first call of it: "*N $4 EVAL $len <body>
 * $k <numkeys>", when the whole header arrived in this read), -1 for anything else. */
static int eval_keys(const char *buf, size_t len)
{
    static const char head[] = "EVALSHA\r\n$40\r\n";
    static const char ehead[] = "$4\r\nEVAL\r\n$";
    const char *end = buf + len;
    const char *p = memmem(buf, len, head, sizeof head - 1);
    if (p != NULL) {
        p += sizeof head - 1 + 40 + 2; /* the sha and its CRLF */
    } else {
        p = memmem(buf, len, ehead, sizeof ehead - 1);
        if (p == NULL)
            return -1;
        p += sizeof ehead - 1;
        long blen = strtol(p, NULL, 10);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (blen <= 0 || nl == NULL || end - (nl + 1) < blen + 2)
            return -1;
        p = nl + 1 + blen + 2; /* the body and its CRLF */
    }
    if (p >= end || *p != '$')
        return -1;
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (nl == NULL || nl + 1 >= end)
        return -1;
    return atoi(nl + 1);
}

/* Move bytes from `from` through d to `to`; discard instead of writing when drop is set.
 * Returns -1 when the pair is finished. */
static int pump(int from, int to, dir *d, bool drop, short rev_from, int *evals,
                int64_t delay_ns)
{
    if (d->len == d->off && !d->eof && (rev_from & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t n = recv(from, d->buf, sizeof d->buf, 0);
        if (n > 0) {
            d->len = (size_t)n;
            d->off = 0;
            d->ready_ns = delay_ns > 0 ? fw_now_ns() + delay_ns : 0;
            if (evals && eval_keys(d->buf, d->len) >= 3)
                (*evals)++;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            d->eof = true;
            if (n < 0)
                return -1; /* reset: give up the pair */
        }
    }
    if (d->len > d->off && d->ready_ns > 0 && fw_now_ns() < d->ready_ns)
        return 0; /* delayed: the poll timeout brings us back */
    if (d->len > d->off) {
        if (drop) {
            d->off = d->len = 0;
        } else { /* non-blocking: EAGAIN keeps the bytes for the next round */
            ssize_t n = send(to, d->buf + d->off, d->len - d->off, MSG_NOSIGNAL);
            if (n > 0)
                d->off += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR)
                return -1;
            if (d->off == d->len)
                d->off = d->len = 0;
        }
    }
    if (d->eof && d->len == d->off) {
        shutdown(to, SHUT_WR);
        return 1;
    }
    return 0;
}

static void *run(void *arg)
{
    fp_proxy *p = arg;
    struct pollfd pf[2 + 2 * MAXPAIRS];
    int last_mode = FP_PASS;
    while (!atomic_load(&p->stop)) {
        int mode = atomic_load(&p->mode);
        if (mode != last_mode) {
            if (last_mode == FP_BLACKHOLE) {
                /* heal: drop what aborted clients had sent, as their kernels would have */
                for (int i = p->npairs - 1; i >= 0; i--)
                    if (aborted(p->pairs[i]->c)) {
                        atomic_fetch_add(&p->dropped, 1);
                        pair_free(p, i);
                    }
            }
            if (mode == FP_CLOSE)
                while (p->npairs > 0)
                    pair_free(p, p->npairs - 1);
            last_mode = mode;
        }
        int n = 0;
        pf[n++] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
        if (mode != FP_BLACKHOLE)
            pf[n++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
        int base = n;
        if (mode != FP_BLACKHOLE) {
            for (int i = 0; i < p->npairs; i++) {
                pair *q = p->pairs[i];
                short ce = 0, se = 0;
                if (q->cs.len == q->cs.off && !q->cs.eof)
                    ce |= POLLIN;
                else if (q->cs.len > q->cs.off)
                    se |= POLLOUT;
                if (q->sc.len == q->sc.off && !q->sc.eof)
                    se |= POLLIN;
                else if (q->sc.len > q->sc.off)
                    ce |= POLLOUT;
                pf[n++] = (struct pollfd){.fd = q->c, .events = ce};
                pf[n++] = (struct pollfd){.fd = q->s, .events = se};
            }
        }
        int timeout = 100;
        for (int i = 0; i < p->npairs && mode != FP_BLACKHOLE; i++) {
            dir *d = &p->pairs[i]->sc;
            if (d->len > d->off && d->ready_ns > 0) {
                int64_t left = (d->ready_ns - fw_now_ns()) / 1000000 + 1;
                if (left < timeout)
                    timeout = left < 0 ? 0 : (int)left;
            }
        }
        int r = poll(pf, (nfds_t)n, timeout);
        if (r < 0 && errno != EINTR)
            break;
        if (pf[0].revents & POLLIN) {
            char b[64];
            while (read(p->wake[0], b, sizeof b) > 0)
                ;
        }
        if (mode == FP_BLACKHOLE || atomic_load(&p->mode) != mode)
            continue; /* a new mode applies to whatever poll just reported: start over */
        if (pf[1].revents & POLLIN)
            accept_all(p, mode);
        int npairs = (n - base) / 2;
        for (int i = npairs - 1; i >= 0; i--) {
            pair *q = p->pairs[i];
            short cr = pf[base + 2 * i].revents, sr = pf[base + 2 * i + 1].revents;
            bool evalmode = mode == FP_DROP_EVAL_REPLIES;
            int a = pump(q->c, q->s, &q->cs, false, cr, evalmode ? &q->drop_next : NULL, 0);
            bool drop = mode == FP_DROP_REPLIES;
            if (evalmode && q->drop_next > 0 && q->sc.len == q->sc.off && (sr & POLLIN)) {
                drop = true;
                q->drop_next--;
            }
            int b = pump(q->s, q->c, &q->sc, drop, sr, NULL, atomic_load(&p->reply_delay_ns));
            if (a < 0 || b < 0 || (a == 1 && b == 1))
                pair_free(p, i);
        }
    }
    while (p->npairs > 0)
        pair_free(p, p->npairs - 1);
    return NULL;
}

fp_proxy *fp_proxy_start(int target_port)
{
    fp_proxy *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->target = target_port;
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(p->lfd, 128) != 0 || getsockname(p->lfd, (struct sockaddr *)&sa, &sl) != 0 ||
        pipe2(p->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        if (p->lfd >= 0)
            close(p->lfd);
        free(p);
        return NULL;
    }
    p->port = ntohs(sa.sin_port);
    if (pthread_create(&p->thread, NULL, run, p) != 0) {
        close(p->lfd);
        free(p);
        return NULL;
    }
    return p;
}

int fp_proxy_port(const fp_proxy *p)
{
    return p->port;
}

void fp_proxy_set_reply_delay_ms(fp_proxy *p, int64_t ms)
{
    atomic_store(&p->reply_delay_ns, ms * 1000000);
    (void)!write(p->wake[1], "m", 1);
}

void fp_proxy_set_mode(fp_proxy *p, int mode)
{
    atomic_store(&p->mode, mode);
    (void)!write(p->wake[1], "m", 1);
}

size_t fp_proxy_connections(fp_proxy *p)
{
    return atomic_load(&p->accepted);
}

size_t fp_proxy_dropped_on_heal(fp_proxy *p)
{
    return atomic_load(&p->dropped);
}

void fp_proxy_stop(fp_proxy *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stop, 1);
    (void)!write(p->wake[1], "s", 1);
    pthread_join(p->thread, NULL);
    close(p->lfd);
    close(p->wake[0]);
    close(p->wake[1]);
    free(p);
}
