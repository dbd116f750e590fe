/* White-box tests of the transport (src/net/socket.c, tls.c), linked with the internal
 * archive: a write and a trickled reply end at the call's deadline. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "net/net.h"

/* A unix socket that is listened on and never read: the kernel completes the connect (the
 * backlog holds it), then the client's send buffer and the peer's receive buffer fill up. */
static int silent_listener(char *path, size_t pathlen)
{
    snprintf(path, pathlen, "/tmp/redsem-conn-%ld.sock", (long)getpid());
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 4), 0);
    return fd;
}

/* A write that cannot complete ends at the call's deadline, not at the socket's own
 * SO_SNDTIMEO (the command timeout, 30 s here). The bound checked is 10 s: far above the
 * 200 ms deadline however loaded the machine, far below the 30 s the old blocking send took. */
Test(conn, a_write_honours_the_call_deadline, .timeout = 60)
{
    char path[128];
    int lfd = silent_listener(path, sizeof path);
    redsem__endpoint ep = {.kind = REDSEM__EP_UNIX, .path = path};
    redsem__conn c;
    redsem__conn_init(&c);
    bool retryable = false;
    char err[256] = "";
    int rc = redsem__conn_open(&c, &ep, NULL, redsem__now_ns() + 5000 * REDSEM__NS_PER_MS, 30000,
                               &retryable, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "connect: %s", err);
    size_t len = 64u << 20; /* more than any socket buffer */
    char *buf = calloc(1, len);
    cr_assert_not_null(buf);
    int64_t t0 = redsem__now_ns();
    int err_no = 0;
    int io = redsem__conn_write(&c, buf, len, t0 + 200 * REDSEM__NS_PER_MS, &err_no);
    int64_t took_ms = (redsem__now_ns() - t0) / REDSEM__NS_PER_MS;
    cr_assert_eq(io, REDSEM__IO_TIMEOUT, "write of 64 MB to a silent peer: io %d", io);
    cr_assert_geq(took_ms, 200, "returned %lld ms after the start, before its deadline",
                  (long long)took_ms);
    cr_assert_lt(took_ms, 10000, "returned %lld ms after the start: bounded by SO_SNDTIMEO, "
                 "not by the call's 200 ms deadline", (long long)took_ms);
    free(buf);
    redsem__conn_abort(&c);
    close(lfd);
    unlink(path);
}

/* ---------------------------------------------------------------- a byte-trickling server */

/* A server that reads a request, then answers with reply one byte every 100 ms: each byte
 * comes well within the command timeout, the whole reply long after it. Over TCP on
 * 127.0.0.1, a unix socket, or TLS (OpenSSL's server side on the TCP socket, with a
 * throwaway self-signed certificate: each byte its own TLS record). Not Redis: it answers any
 * request with the same bytes. */
typedef struct trickler {
    int lfd;
    int port;           /* TCP */
    char path[108];     /* unix */
    SSL_CTX *tls;       /* NULL: plain */
    const char *reply;
    atomic_bool stop;
    pthread_t thread;
} trickler;

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A self-signed certificate and key, made in memory (OpenSSL 3.0 calls only). */
static SSL_CTX *server_tls_ctx(void)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    cr_assert(key != NULL && x != NULL);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"trickler", -1,
                               -1, 0);
    X509_set_issuer_name(x, name);
    X509_set_pubkey(x, key);
    cr_assert_gt(X509_sign(x, key, EVP_sha256()), 0);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    cr_assert_not_null(ctx);
    cr_assert_eq(SSL_CTX_use_certificate(ctx, x), 1);
    cr_assert_eq(SSL_CTX_use_PrivateKey(ctx, key), 1);
    X509_free(x);
    EVP_PKEY_free(key);
    return ctx;
}

/* Serve one connection: read the request, then trickle the reply until it is all sent or the
 * client goes away. */
static void trickle_one(trickler *t, int fd)
{
    SSL *ssl = NULL;
    if (t->tls != NULL) {
        ssl = SSL_new(t->tls);
        SSL_set_fd(ssl, fd);
        if (SSL_accept(ssl) != 1) {
            SSL_free(ssl);
            return;
        }
    }
    char buf[4096];
    if ((ssl ? SSL_read(ssl, buf, sizeof buf) : (int)recv(fd, buf, sizeof buf, 0)) <= 0) {
        SSL_free(ssl);
        return;
    }
    for (const char *p = t->reply; *p != '\0' && !atomic_load(&t->stop); p++) {
        nap_ms(100);
        if ((ssl ? SSL_write(ssl, p, 1) : (int)send(fd, p, 1, MSG_NOSIGNAL)) != 1)
            break; /* the client gave up (a reset) */
    }
    SSL_free(ssl);
}

static void *trickler_main(void *arg)
{
    trickler *t = arg;
    while (!atomic_load(&t->stop)) {
        struct pollfd pfd = {.fd = t->lfd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        int fd = accept(t->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        trickle_one(t, fd);
        close(fd);
    }
    return NULL;
}

enum { TR_TCP, TR_UNIX, TR_TLS };

static void trickler_start(trickler *t, int kind, const char *reply)
{
    memset(t, 0, sizeof *t);
    atomic_init(&t->stop, false);
    t->reply = reply;
    if (kind == TR_UNIX) {
        snprintf(t->path, sizeof t->path, "/tmp/redsem-trickle-%ld.sock", (long)getpid());
        unlink(t->path);
        t->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        memcpy(sa.sun_path, t->path, strlen(t->path) + 1);
        cr_assert_eq(bind(t->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    } else {
        t->lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        cr_assert_eq(bind(t->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
        socklen_t sl = sizeof sa;
        cr_assert_eq(getsockname(t->lfd, (struct sockaddr *)&sa, &sl), 0);
        t->port = ntohs(sa.sin_port);
        if (kind == TR_TLS)
            t->tls = server_tls_ctx();
    }
    cr_assert_eq(listen(t->lfd, 8), 0);
    cr_assert_eq(pthread_create(&t->thread, NULL, trickler_main, t), 0);
}

static void trickler_stop(trickler *t)
{
    atomic_store(&t->stop, true);
    pthread_join(t->thread, NULL);
    close(t->lfd);
    if (t->path[0] != '\0')
        unlink(t->path);
    SSL_CTX_free(t->tls);
}

/* A connection to t with the given command timeout (TLS: verification off, the trickler's
 * certificate is its own; client_ctx is freed by the caller). */
static void connect_to(const trickler *t, redsem__conn *c, int64_t timeout_ms, void **client_ctx)
{
    redsem__endpoint ep = {.kind = REDSEM__EP_TCP, .host = "127.0.0.1", .port = t->port};
    if (t->path[0] != '\0')
        ep = (redsem__endpoint){.kind = REDSEM__EP_UNIX, .path = (char *)t->path};
    redsem__conn_tls tls = {NULL, NULL};
    char err[256] = "";
    *client_ctx = NULL;
    if (t->tls != NULL) {
        redsem__tls_opts o = {.insecure = true};
        *client_ctx = tls.ctx = redsem__tls_ctx_new(&o, err, sizeof err);
        cr_assert_not_null(tls.ctx, "%s", err);
    }
    redsem__conn_init(c);
    bool retryable;
    int rc = redsem__conn_open(c, &ep, &tls, redsem__now_ns() + 5000 * REDSEM__NS_PER_MS,
                               timeout_ms, &retryable, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "connect: %s", err);
}

/* A call's command timeout bounds its whole reply, from the write to the last byte, however
 * the bytes are spread: a server that trickles a reply one byte every 100 ms (each byte well
 * within the 500 ms timeout) is given up at the timeout. Two shapes: one long reply (4 s of
 * trickle), and fifteen pipelined short replies (each 400 ms of trickle, within the timeout
 * on its own; 6 s in all). The bound checked is 2.5 s: five timeouts, far above 500 ms
 * however loaded the machine, below the trickle's total (the old per-recv timeout of plain
 * sockets returned the whole reply, REDSEM__IO_OK, after 4 s; the old per-reply timeout of
 * TLS the fifteen replies after 6 s). */
static void a_slow_reply_times_out(int kind)
{
    static const char *const replies[2] = {"$33\r\nabcdefghijklmnopqrstuvwxyz0123456\r\n",
                                           ":1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"
                                           ":1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"
                                           ":1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"};
    static const int nreplies[2] = {1, 15};
    static const char ping[] = "*1\r\n$4\r\nPING\r\n";
    for (int shape = 0; shape < 2; shape++) {
        trickler t;
        trickler_start(&t, kind, replies[shape]);
        redsem__conn c;
        void *cctx;
        connect_to(&t, &c, 500, &cctx);
        int64_t t0 = redsem__now_ns();
        int err_no = 0, io = REDSEM__IO_OK;
        char err[256] = "";
        for (int i = 0; i < nreplies[shape]; i++)
            io = redsem__conn_write(&c, ping, sizeof ping - 1, 0, &err_no);
        cr_assert_eq(io, REDSEM__IO_OK);
        int got = 0;
        /* one call: the replies are read with the deadline of the last write (0: the
         * call's); the writes take microseconds */
        for (int i = 0; i < nreplies[shape] && io == REDSEM__IO_OK; i++) {
            redisReply *r = NULL;
            io = redsem__conn_read(&c, &r, 0, &err_no, err, sizeof err);
            if (io == REDSEM__IO_OK) {
                got++;
                freeReplyObject(r);
            }
        }
        int64_t took_ms = (redsem__now_ns() - t0) / REDSEM__NS_PER_MS;
        cr_assert_eq(io, REDSEM__IO_TIMEOUT,
                     "shape %d: io %d after %lld ms, %d of %d replies: the trickled reply was "
                     "not given up at the 500 ms command timeout", shape, io,
                     (long long)took_ms, got, nreplies[shape]);
        cr_assert_geq(took_ms, 490, "shape %d: gave up after %lld ms, before the timeout",
                      shape, (long long)took_ms);
        cr_assert_lt(took_ms, 2500, "shape %d: gave up after %lld ms: the 500 ms timeout "
                     "bounds each read, not the call", shape, (long long)took_ms);
        redsem__conn_abort(&c);
        redsem__tls_ctx_free(cctx);
        trickler_stop(&t);
    }
}

Test(conn, a_trickled_reply_ends_at_the_command_timeout_over_tcp, .timeout = 60)
{
    a_slow_reply_times_out(TR_TCP);
}

Test(conn, a_trickled_reply_ends_at_the_command_timeout_over_unix, .timeout = 60)
{
    a_slow_reply_times_out(TR_UNIX);
}

Test(conn, a_trickled_reply_ends_at_the_command_timeout_over_tls, .timeout = 60)
{
    a_slow_reply_times_out(TR_TLS);
}
