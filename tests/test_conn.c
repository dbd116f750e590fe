/* White-box tests of the transport (src/conn.c), linked with the internal archive. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

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
