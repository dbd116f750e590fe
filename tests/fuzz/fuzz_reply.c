/* libFuzzer target: reply handling. The input is fed as the server's byte stream into the
 * library's transport (redsem__conn_read over a socketpair, hiredis' reader underneath);
 * every reply it yields goes through the interpreters of acquire replies
 * (redsem__parse_attempt), of status replies (redsem__status_from_reply), of error replies
 * (redsem__node_error_reply) and the integer helpers. Malformed or hostile replies must give a
 * code (REDSEM_EPROTO ...), never a crash, a leak or an out-of-bounds access.
 *   fuzz-reply [-max_total_time=60] CORPUS_DIR SEED_DIR */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void use(redsem_client *c, redisReply *r)
{
    redsem__attempt att;
    int rc = redsem__parse_attempt(c, r, &att, "fuzz");
    if (rc == REDSEM_OK && att.outcome != REDSEM__ATT_GRANTED && att.outcome != REDSEM__ATT_BUSY &&
        att.outcome != REDSEM__ATT_GUARD_BUSY && att.outcome != REDSEM__ATT_TOO_LATE &&
        att.outcome != REDSEM__ATT_WEIGHT && att.outcome != REDSEM__ATT_TOO_MANY)
        abort();
    /* weighted acquire's refusals carry a weight (held) or a limit of at least 1 */
    if (rc == REDSEM_OK &&
        (att.outcome == REDSEM__ATT_WEIGHT || att.outcome == REDSEM__ATT_TOO_MANY) &&
        att.weight < 1)
        abort();
    if (rc == REDSEM_OK && att.outcome == REDSEM__ATT_TOO_LATE && att.server_us <= 0)
        abort();
    redsem_status *st = NULL;
    if (redsem__status_from_reply(c, "redsem:{fuzz}:meta", r, &st) == REDSEM_OK) {
        if (st == NULL)
            abort();
        for (size_t i = 0; i < redsem_status_holders_listed(st); i++) {
            const char *id = NULL;
            if (redsem_status_holder(st, i, &id, NULL, NULL) != REDSEM_OK || id == NULL)
                abort();
        }
        for (size_t i = 0; i < redsem_status_waiters_listed(st); i++)
            if (redsem_status_waiter(st, i, NULL, NULL, NULL) != REDSEM_OK)
                abort();
        redsem_status_free(st);
    }
    if (r->type == REDIS_REPLY_ERROR) {
        redsem__ctx ctx = {.errmsg = ""};
        redsem__node n = {.ctx = &ctx}; /* only its error text is used */
        int code = redsem__node_error_reply(&n, r, "fuzz");
        if (code != REDSEM_ESERVER && code != REDSEM_EPERM && code != REDSEM_ECONFLICT)
            abort();
    }
    long long v;
    uint64_t u;
    (void)redsem__reply_int(r, &v);
    (void)redsem__reply_u64(r, &u);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && i < 4; i++)
        use(c, r->element[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    if (size > 65536 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return 0;
    int big = 1 << 20;
    (void)setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    (void)setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(sv[1], data + off, size - off);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    close(sv[1]);
    redsem_client *c = calloc(1, sizeof *c); /* only its error message buffer is used */
    redsem__conn conn;
    redsem__conn_init(&conn);
    conn.fd = sv[0];
    conn.io_timeout_ns = 0;
    bool have_reader = redsem__conn_reader(&conn) == REDSEM_OK; /* as redsem__conn_open */
    for (int i = 0; c && have_reader && i < 64; i++) {
        redisReply *r = NULL;
        int err_no = 0;
        char err[256];
        int io = redsem__conn_read(&conn, &r, 0, &err_no, err, sizeof err);
        if (io != REDSEM__IO_OK)
            break;
        use(c, r);
        freeReplyObject(r);
    }
    redsem__conn_close(&conn);
    free(c);
    return 0;
}
