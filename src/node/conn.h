/* redsem - one connection's request pipeline: the core of the engine. Part of the node layer
 * (included by node/node.h). Not API.
 *
 * A pipe drives one open connection (a redsem__conn of net/: a socket, or TLS on it, and
 * hiredis' reader) with many requests in flight on it: an output buffer, the FIFO of requests
 * written or waiting to be, and the reader fed with bytes as they arrive; replies are matched
 * to requests in order. It never blocks and starts no thread, in the shape of libpq's
 * PQsendQuery / PQflush / PQconsumeInput and of hiredis' async context:
 *
 *   redsem__pipe_send()   queue a request's bytes (no I/O);
 *   redsem__pipe_wants()  which events it waits for on redsem__pipe_fd() (POLLIN, POLLOUT)
 *                         and its earliest deadline (the earliest of its requests');
 *   redsem__pipe_step()   do what the socket takes now: write what it accepts, read what
 *                         arrived, complete each request whose replies are all in, and fail
 *                         every request in flight when a deadline passed or the connection
 *                         is lost.
 *
 * A request completes exactly once, through its done callback, called from inside
 * redsem__pipe_step() or redsem__pipe_fail(). The engine (drive_loop.c) calls the three for
 * each of its connections, stepped by its drivers: the calling threads (drive_sync.c) or an
 * event loop (async.c). A pipe is not thread-safe: its driver serializes the calls.
 *
 * Faults: a request whose bytes were all handed to the socket is "written"; when the
 * connection is lost or a deadline passes, every request in flight ends with REDSEM_ECONN or
 * REDSEM_ETIMEDOUT and its written flag tells whether it may have been applied. The pipe then
 * refuses new requests until redsem__pipe_reset() (the driver drops the connection: an
 * abortive close, so nothing we gave up on is delivered later) and opens a new one. */
#ifndef REDSEM_NODE_CONN_H
#define REDSEM_NODE_CONN_H

#include "net/net.h"

struct redisReply;

/* The most replies one request may expect (a SCRIPT LOAD, an EVALSHA, a WAIT, a ROLE). */
#define REDSEM__PREQ_REPLIES_MAX 4

typedef struct redsem__preq redsem__preq;
/* One request in a pipe. The caller owns it (on its stack, in a waiting thread) and must keep
 * it until done was called; fields marked "out" are the pipe's. */
struct redsem__preq {
    int nreplies;        /* in: replies it expects, 1..REDSEM__PREQ_REPLIES_MAX */
    int64_t deadline_ns; /* in: give up at this time (CLOCK_MONOTONIC ns, > 0) */
    void (*done)(redsem__preq *q, void *arg); /* in: called once, when it ends */
    void *arg;                                /* in */
    struct redisReply *replies[REDSEM__PREQ_REPLIES_MAX]; /* out: the caller frees them */
    int rc;          /* out: REDSEM_OK (every reply in), ECONN, ETIMEDOUT, EPROTO, ENOMEM */
    bool written;    /* out: all its bytes went to the socket (a fault: "maybe applied") */
    int64_t sent_ns; /* out: when its first byte went to the socket */
    int64_t recv_ns; /* out: when its last reply was read */
    /* in: on a fault, the replies that came (got of them) are left to done, which frees
     * them (a handshake judges what a broken server did answer) */
    bool keep_partial;
    /* the pipe's */
    redsem__preq *next;
    int got;      /* replies in (out, read by a keep_partial request's done) */
    uint64_t end; /* the output stream's offset just after its bytes */
};

typedef struct redsem__pipe {
    redsem__conn *conn; /* the open connection it drives (borrowed) */
    char *out;          /* bytes not yet written: out[out_off .. out_len) */
    size_t out_off, out_len, out_cap;
    uint64_t out_base; /* the stream offset of out[0] */
    redsem__preq *head, *tail; /* in flight, oldest first */
    int inflight;
    /* TLS: the last read could not go on before a write (OpenSSL's WANT_WRITE); a write
     * that must read first needs nothing more: POLLIN is wanted while anything is in flight,
     * and a step tries the write whenever bytes wait */
    bool read_wants_out;
    /* held: the bytes after the stream offset hold_end wait (redsem__pipe_hold) */
    bool held;
    uint64_t hold_end;
    /* No request in flight (not held) has an earlier deadline: lowered by each one queued,
     * exact after redsem__pipe_retime (a step whose now reached it takes the exact one);
     * early, never late, after replies took the earliest. */
    int64_t dl_min;
    int rc;        /* REDSEM_OK, or the fault that ended the connection */
    char err[256]; /* why, when rc is not REDSEM_OK */
} redsem__pipe;

/* Start driving conn (open, its reader made: redsem__conn_open). */
void redsem__pipe_init(redsem__pipe *p, redsem__conn *conn);
/* Fail what is in flight (REDSEM_ECONN, "connection closed") and free the buffer; the
 * connection itself is the caller's. */
void redsem__pipe_reset(redsem__pipe *p);
int redsem__pipe_fd(const redsem__pipe *p);
/* Queue q with its bytes (copied). REDSEM_OK, REDSEM_ENOMEM, or the pipe's fault (q is then
 * not queued and done is not called). */
int redsem__pipe_send(redsem__pipe *p, redsem__preq *q, const char *bytes, size_t len);
/* The events the pipe waits for (POLLIN while requests are in flight, POLLOUT while bytes
 * wait) and in *deadline_ns the earliest deadline of its requests (REDSEM__FOREVER: none).
 * 0 events: idle, or failed. */
short redsem__pipe_wants(const redsem__pipe *p, int64_t *deadline_ns);
/* Do what the socket takes without blocking: write while writable (or always tried when
 * bytes wait: a send that would block costs one system call), read while readable, complete
 * the requests whose replies are in, and fail all in flight when one's deadline is <= now_ns
 * or the connection broke. REDSEM_OK, or the fault (p->rc) after which the connection must
 * be dropped. */
int redsem__pipe_step(redsem__pipe *p, bool readable, bool writable, int64_t now_ns);
/* A request in flight had its deadline_ns moved: the pipe takes its earliest again. */
void redsem__pipe_retime(redsem__pipe *p);
/* Hold back what is queued from now on: its bytes are not written and its requests'
 * deadlines do not run (they are not "in flight" yet) until redsem__pipe_unhold. The loop
 * engine queues a connection's handshake, holds, and lets the requests queued while it opens
 * go once the handshake was judged (a failed one fails them as never written). */
void redsem__pipe_hold(redsem__pipe *p);
void redsem__pipe_unhold(redsem__pipe *p);
/* Zero what is left in p's buffer of q's bytes (written: q has a reply), as AUTH's password
 * is wiped from every other buffer it was in. */
void redsem__pipe_wipe(redsem__pipe *p, const redsem__preq *q, size_t len);
/* Whether q (queued on p) is held back. */
bool redsem__pipe_held(const redsem__pipe *p, const redsem__preq *q);
/* End every request in flight with rc (written ones "maybe applied") and refuse new ones. */
void redsem__pipe_fail(redsem__pipe *p, int rc, const char *why);

#endif /* REDSEM_NODE_CONN_H */
