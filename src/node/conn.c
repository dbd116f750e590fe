/* redsem - one connection's request pipeline (node/conn.h): an output buffer, the FIFO of
 * requests in flight, hiredis' reader fed as bytes arrive; never blocks. */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "node/node.h"

void redsem__pipe_init(redsem__pipe *p, redsem__conn *conn)
{
    memset(p, 0, sizeof *p);
    p->conn = conn;
    p->dl_min = REDSEM__FOREVER;
}

int redsem__pipe_fd(const redsem__pipe *p)
{
    return p->conn->fd;
}

/* End q with rc (its replies freed unless rc is REDSEM_OK). */
static void finish(redsem__preq *q, int rc, int64_t now_ns)
{
    q->rc = rc;
    q->recv_ns = now_ns;
    if (rc != REDSEM_OK && !q->keep_partial)
        for (int i = 0; i < q->got; i++) {
            freeReplyObject(q->replies[i]);
            q->replies[i] = NULL;
        }
    q->done(q, q->arg);
}

void redsem__pipe_fail(redsem__pipe *p, int rc, const char *why)
{
    if (p->rc == REDSEM_OK) {
        p->rc = rc;
        snprintf(p->err, sizeof p->err, "%s", why);
    }
    int64_t now = redsem__now_ns();
    while (p->head != NULL) {
        redsem__preq *q = p->head;
        p->head = q->next;
        p->inflight--;
        finish(q, rc, now);
    }
    p->tail = NULL;
    p->dl_min = REDSEM__FOREVER;
}

void redsem__pipe_reset(redsem__pipe *p)
{
    redsem__pipe_fail(p, REDSEM_ECONN, "connection closed");
    redsem__free(p->out);
    redsem__pipe_init(p, p->conn);
}

int redsem__pipe_send(redsem__pipe *p, redsem__preq *q, const char *bytes, size_t len)
{
    if (p->rc != REDSEM_OK)
        return p->rc;
    if (p->out_off == p->out_len) { /* all written: start the buffer over */
        p->out_base += p->out_len;
        p->out_off = p->out_len = 0;
    }
    if (p->out_len + len > p->out_cap) {
        size_t cap = p->out_cap ? p->out_cap : 4096;
        while (cap < p->out_len + len)
            cap *= 2;
        char *o = redsem__realloc(p->out, cap);
        if (o == NULL)
            return REDSEM_ENOMEM;
        p->out = o;
        p->out_cap = cap;
    }
    memcpy(p->out + p->out_len, bytes, len);
    p->out_len += len;
    q->next = NULL;
    q->got = 0;
    q->rc = REDSEM_OK;
    q->written = false;
    q->sent_ns = q->recv_ns = 0;
    q->end = p->out_base + p->out_len;
    memset(q->replies, 0, sizeof q->replies);
    if (p->tail != NULL)
        p->tail->next = q;
    else
        p->head = q;
    p->tail = q;
    p->inflight++;
    if (!redsem__pipe_held(p, q) && q->deadline_ns < p->dl_min)
        p->dl_min = q->deadline_ns;
    return REDSEM_OK;
}

void redsem__pipe_hold(redsem__pipe *p)
{
    p->held = true;
    p->hold_end = p->out_base + p->out_len;
}

void redsem__pipe_unhold(redsem__pipe *p)
{
    p->held = false;
    redsem__pipe_retime(p);
}

void redsem__pipe_retime(redsem__pipe *p)
{
    p->dl_min = REDSEM__FOREVER;
    for (const redsem__preq *q = p->head; q != NULL && !redsem__pipe_held(p, q); q = q->next)
        if (q->deadline_ns < p->dl_min)
            p->dl_min = q->deadline_ns;
}

bool redsem__pipe_held(const redsem__pipe *p, const redsem__preq *q)
{
    return p->held && q->end > p->hold_end;
}

void redsem__pipe_wipe(redsem__pipe *p, const redsem__preq *q, size_t len)
{
    /* q's bytes: [end - len, end) of the stream, still in out if not overwritten since */
    uint64_t from = q->end - len > p->out_base ? q->end - len : p->out_base;
    uint64_t to = q->end < p->out_base + p->out_off ? q->end : p->out_base + p->out_off;
    if (to > from)
        sodium_memzero(p->out + (from - p->out_base), (size_t)(to - from));
}

/* The end of the bytes that may be written now (an index of out). */
static size_t out_limit(const redsem__pipe *p)
{
    return p->held ? (size_t)(p->hold_end - p->out_base) : p->out_len;
}

short redsem__pipe_wants(const redsem__pipe *p, int64_t *deadline_ns)
{
    *deadline_ns = REDSEM__FOREVER;
    if (p->rc != REDSEM_OK || p->head == NULL)
        return 0;
    *deadline_ns = p->dl_min; /* early at worst: the step then takes the exact one */
    bool out = p->out_off < out_limit(p) || p->read_wants_out;
    return (short)(POLLIN | (out ? POLLOUT : 0));
}

/* Mark the requests whose bytes all went out (and the first byte's time of the rest). */
static void note_written(redsem__pipe *p, int64_t now_ns)
{
    uint64_t done = p->out_base + p->out_off;
    for (redsem__preq *q = p->head; q != NULL && !redsem__pipe_held(p, q); q = q->next) {
        if (q->written)
            continue;
        if (q->sent_ns == 0)
            q->sent_ns = now_ns;
        if (q->end <= done)
            q->written = true;
        else
            break;
    }
}

/* Write what the socket takes. REDSEM_OK (all out, or it would block) or the fault. */
static int flush(redsem__pipe *p, int64_t now_ns)
{
    size_t limit = out_limit(p);
    while (p->out_off < limit) {
        short ev = 0;
        int err_no = 0;
        /* the requests whose first byte goes now: sent_ns before the write (as node.c) */
        note_written(p, now_ns);
        ssize_t n = redsem__conn_send_nb(p->conn, p->out + p->out_off, limit - p->out_off,
                                         &ev, &err_no);
        if (n == -2)
            return REDSEM_OK;
        if (n <= 0) {
            snprintf(p->err, sizeof p->err, "connection lost: %s",
                     err_no ? strerror(err_no) : "closed by the server");
            return REDSEM_ECONN;
        }
        p->out_off += (size_t)n;
        note_written(p, now_ns);
    }
    return REDSEM_OK;
}

/* Take every complete reply from the reader and hand it to the head request. */
static int take_replies(redsem__pipe *p, int64_t now_ns)
{
    redisReader *rd = p->conn->reader;
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
            if (p->conn->oversized)
                snprintf(p->err, sizeof p->err, "protocol error: a reply announced %lld "
                         "elements, more than any redsem reply has", p->conn->oversized);
            else
                snprintf(p->err, sizeof p->err, "protocol error: %s", rd->errstr);
            return rd->err == REDIS_ERR_OOM && !p->conn->oversized ? REDSEM_ENOMEM
                                                                   : REDSEM_EPROTO;
        }
        if (reply == NULL)
            return REDSEM_OK;
        redsem__preq *q = p->head;
        if (q == NULL || !q->written) {
            freeReplyObject(reply);
            snprintf(p->err, sizeof p->err, "protocol error: a reply nothing asked for");
            return REDSEM_EPROTO;
        }
        q->replies[q->got++] = reply;
        if (q->got == q->nreplies) {
            p->head = q->next;
            if (p->head == NULL)
                p->tail = NULL;
            p->inflight--;
            finish(q, REDSEM_OK, now_ns);
        }
    }
}

/* Read what arrived and complete the requests it answers. */
static int consume(redsem__pipe *p, int64_t now_ns)
{
    char buf[16384];
    for (;;) {
        short ev = 0;
        int err_no = 0;
        ssize_t n = redsem__conn_recv_nb(p->conn, buf, sizeof buf, &ev, &err_no);
        p->read_wants_out = n == -2 && ev == POLLOUT;
        if (n == -2)
            return REDSEM_OK;
        if (n <= 0) {
            snprintf(p->err, sizeof p->err, "connection lost: %s",
                     err_no ? strerror(err_no) : "closed by the server");
            return REDSEM_ECONN;
        }
        if (redisReaderFeed(p->conn->reader, buf, (size_t)n) != REDIS_OK) {
            snprintf(p->err, sizeof p->err, "protocol error: %s",
                     ((redisReader *)p->conn->reader)->errstr);
            return REDSEM_EPROTO;
        }
        int rc = take_replies(p, now_ns);
        /* a short read drained a plain socket; TLS reads one record at a time: on until
         * OpenSSL wants more (so that no byte waits in OpenSSL while the driver polls) */
        if (rc != REDSEM_OK || (p->conn->ssl == NULL && (size_t)n < sizeof buf))
            return rc;
    }
}

/* Whether a request in flight (not held) has its deadline at or before now_ns. */
static bool past_deadline(const redsem__pipe *p, int64_t now_ns)
{
    for (const redsem__preq *q = p->head; q != NULL && !redsem__pipe_held(p, q); q = q->next)
        if (q->deadline_ns <= now_ns && q->written)
            return true;
    return false;
}

int redsem__pipe_step(redsem__pipe *p, bool readable, bool writable, int64_t now_ns)
{
    if (p->rc != REDSEM_OK)
        return p->rc;
    int rc = REDSEM_OK;
    if (p->out_off < out_limit(p) || writable)
        rc = flush(p, now_ns);
    if (rc == REDSEM_OK && (readable || (writable && p->read_wants_out)))
        rc = consume(p, now_ns);
    /* a deadline passed (dl_min, early at worst, says when one may have): what arrived
     * meanwhile is read first (a reply that came while no driver read, or in the same
     * instant, is not given up on) */
    bool due = p->dl_min <= now_ns;
    if (rc == REDSEM_OK && due && !readable && past_deadline(p, now_ns))
        rc = consume(p, now_ns);
    if (rc == REDSEM_OK) {
        if (due)
            redsem__pipe_retime(p); /* the exact earliest of those still in flight */
        if (p->dl_min > now_ns)
            return REDSEM_OK;
        snprintf(p->err, sizeof p->err, "no reply from Redis within the deadline");
        rc = REDSEM_ETIMEDOUT;
    }
    char why[sizeof p->err];
    memcpy(why, p->err, sizeof why);
    redsem__pipe_fail(p, rc, why);
    return rc;
}
