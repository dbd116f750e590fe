/* White-box tests of the interpreters of script replies (src/acquire.c, src/proto/resp.c):
 * both shapes of an acquire reply, the array {status, a, b, now us} and the compact string
 * "status a b now" (a fair "not granted": "0 a b now fence") the scripts return on their hot
 * paths, give the same attempt; anything else is REDSEM_EPROTO. Replies are made by
 * hiredis' own reader from RESP bytes. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

static redisReply *reply_of(const char *resp)
{
    redisReader *rd = redisReaderCreate();
    cr_assert_not_null(rd);
    cr_assert_eq(redisReaderFeed(rd, resp, strlen(resp)), REDIS_OK);
    void *r = NULL;
    cr_assert_eq(redisReaderGetReply(rd, &r), REDIS_OK);
    cr_assert_not_null(r, "incomplete RESP in the test: %s", resp);
    redisReaderFree(rd);
    return r;
}

static int parse(const char *resp, redsem__attempt *att)
{
    redsem_client *c = calloc(1, sizeof *c); /* only its error message buffer is used */
    cr_assert_not_null(c);
    redisReply *r = reply_of(resp);
    int rc = redsem__parse_attempt(c, r, att, "test");
    freeReplyObject(r);
    free(c);
    return rc;
}

static char *bulk(const char *s)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "$%zu\r\n%s\r\n", strlen(s), s);
    return buf;
}

Test(reply, a_grant_reads_the_same_in_both_shapes)
{
    redsem__attempt a, b;
    cr_assert_eq(parse("*4\r\n:1\r\n:1700000000123456\r\n:4\r\n:1700000000123999\r\n", &a),
                 REDSEM_OK);
    cr_assert_eq(parse(bulk("1 1700000000123456 4 1700000000123999"), &b), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_GRANTED);
    cr_assert_eq(b.outcome, REDSEM__ATT_GRANTED);
    cr_assert_eq(b.token, 1700000000123456ULL);
    cr_assert_eq(b.limit, 4);
    cr_assert_eq(b.server_us, 1700000000123999LL);
    cr_assert_eq(a.token, b.token);
    cr_assert_eq(a.limit, b.limit);
    cr_assert_eq(a.server_us, b.server_us);
}

Test(reply, busy_too_late_and_guard_busy_in_the_compact_shape)
{
    redsem__attempt a;
    cr_assert_eq(parse(bulk("0 250 3 1700000000000001"), &a), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_BUSY);
    cr_assert_eq(a.next_ms, 250);
    cr_assert_eq(a.limit, 3);
    cr_assert_not(a.fence_known);
    cr_assert_eq(parse(bulk("0 -1 3 1700000000000001"), &a), REDSEM_OK);
    cr_assert_eq(a.next_ms, -1);
    /* a fair waiter's: the fence after the server's time (0: no token drawn yet) */
    cr_assert_eq(parse(bulk("0 -1 3 1700000000000001 1700000000000000"), &a), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_BUSY);
    cr_assert(a.fence_known);
    cr_assert_eq(a.fence, 1700000000000000ULL);
    cr_assert_eq(a.server_us, 1700000000000001LL);
    cr_assert_eq(parse(bulk("0 -1 3 1700000000000001 0"), &a), REDSEM_OK);
    cr_assert(a.fence_known);
    cr_assert_eq(a.fence, 0);
    cr_assert_eq(parse(bulk("-3 1700000000000001"), &a), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_TOO_LATE);
    cr_assert_eq(a.server_us, 1700000000000001LL);
    cr_assert_eq(parse(bulk("-2"), &a), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_GUARD_BUSY);
    cr_assert_eq(parse(bulk("-4 3 1700000000000001"), &a), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_WEIGHT);
    cr_assert_eq(a.weight, 3);
    cr_assert_eq(parse("*3\r\n:-5\r\n:4\r\n:1700000000000001\r\n", &a), REDSEM_OK);
    cr_assert_eq(a.outcome, REDSEM__ATT_TOO_MANY);
    cr_assert_eq(a.limit, 4);
    cr_assert_eq(parse(bulk("-4 0"), &a), REDSEM_EPROTO);
    /* five values only in a "not granted" */
    cr_assert_eq(parse(bulk("1 1700000000123456 4 1700000000123999 5"), &a), REDSEM_EPROTO);
    cr_assert_eq(parse(bulk("-5"), &a), REDSEM_EPROTO);
}

Test(reply, a_malformed_compact_reply_is_a_protocol_error)
{
    const char *bad[] = {"",          "x",         "1",           "1 2",
                         "1  2 3",    "1 2 3 ",    " 1 2 3",      "1 2 3 4 5",
                         "1 2x 3",    "1 - 3",     "2 1 1",       "1 1 -1",
                         "1 1 4294967296", "1 1234567890123456789 3", "-3", "-3 0",
                         "1\t2 3",  "0 2 3 4 5 6"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        redsem__attempt a;
        const char *resp = strlen(bad[i]) ? bulk(bad[i]) : "$0\r\n\r\n";
        cr_expect_eq(parse(resp, &a), REDSEM_EPROTO, "accepted \"%s\"", bad[i]);
    }
}

Test(reply, a_status_is_a_bare_integer_or_the_first_of_an_array)
{
    long long v = 0;
    redisReply *r = reply_of(":1\r\n");
    cr_assert(redsem__reply_status_of(r, &v));
    cr_assert_eq(v, 1);
    freeReplyObject(r);
    r = reply_of("*1\r\n:-1\r\n");
    cr_assert(redsem__reply_status_of(r, &v));
    cr_assert_eq(v, -1);
    freeReplyObject(r);
    r = reply_of("$1\r\n1\r\n");
    cr_assert_not(redsem__reply_status_of(r, &v));
    freeReplyObject(r);
}
