/* The bench's reference scripts (bench/reference/): Redis in Action's fair semaphore
 * (6.3.2-6.3.3) and the guard release of its locked variant (6.3.4), checked against a case
 * worked by hand from the book's algorithm, so that redsem-bench compares redsem with the
 * algorithm as published, not with a straw man. The scripts are read from the source tree
 * (BOOKREFS_DIR), the files the bench embeds; the book's acquire takes the client's clock as
 * an argument, so every step here is exact. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

#define TO .timeout = 60

static char *slurp(const char *file)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", BOOKREFS_DIR, file);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    static char buf[3][16384];
    static int next;
    char *b = buf[next++ % 3];
    size_t n = fread(b, 1, sizeof buf[0] - 1, f);
    fclose(f);
    b[n] = '\0';
    return b;
}

typedef struct book {
    redisContext *rc;
    const char *acquire, *release, *guard_release;
    char key[4][256]; /* timeout set, owner set, counter, guard */
} book;

static void book_open(book *b)
{
    b->rc = redisConnectUnix(tf_sock());
    cr_assert(b->rc != NULL && !b->rc->err);
    b->acquire = slurp("book_fair_acquire.lua");
    b->release = slurp("book_fair_release.lua");
    b->guard_release = slurp("book_guard_release.lua");
    const char *name = tf_name("book");
    snprintf(b->key[0], sizeof b->key[0], "{%s}:book", name);
    snprintf(b->key[1], sizeof b->key[1], "{%s}:book:owner", name);
    snprintf(b->key[2], sizeof b->key[2], "{%s}:book:counter", name);
    snprintf(b->key[3], sizeof b->key[3], "{%s}:book:lock", name);
}

/* acquire_fair_semaphore(conn, sem, limit, timeout) at the client time `now`: the ticket, or
 * 0 if not granted. */
static long long acquire(book *b, const char *id, int limit, const char *now, int timeout)
{
    redisReply *r = redisCommand(b->rc, "EVAL %s 3 %s %s %s %s %d %s %d", b->acquire, b->key[0],
                                 b->key[1], b->key[2], id, limit, now, timeout);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER, "acquire %s: %s", id,
              r && r->str ? r->str : "bad reply");
    long long t = r->integer;
    freeReplyObject(r);
    return t;
}

static long long release(book *b, const char *id)
{
    redisReply *r = redisCommand(b->rc, "EVAL %s 2 %s %s %s", b->release, b->key[0], b->key[1], id);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER);
    long long n = r->integer;
    freeReplyObject(r);
    return n;
}

/* The owner set as "id:ticket id:ticket ..." in rank order, and the timeout set's members. */
static void owners(book *b, char *out, size_t len)
{
    redisReply *r = redisCommand(b->rc, "ZRANGE %s 0 -1 WITHSCORES", b->key[1]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
    out[0] = '\0';
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        size_t l = strlen(out);
        snprintf(out + l, len - l, "%s%s:%s", i ? " " : "", r->element[i]->str,
                 r->element[i + 1]->str);
    }
    freeReplyObject(r);
}

static void timeouts(book *b, char *out, size_t len)
{
    redisReply *r = redisCommand(b->rc, "ZRANGE %s 0 -1", b->key[0]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
    out[0] = '\0';
    for (size_t i = 0; i < r->elements; i++) {
        size_t l = strlen(out);
        snprintf(out + l, len - l, "%s%s", i ? " " : "", r->element[i]->str);
    }
    freeReplyObject(r);
}

#define EXPECT_SETS(b, want_owners, want_timeouts)                                             \
    do {                                                                                       \
        char o_[512], t_[512];                                                                 \
        owners((b), o_, sizeof o_);                                                            \
        timeouts((b), t_, sizeof t_);                                                          \
        cr_assert_str_eq(o_, (want_owners));                                                   \
        cr_assert_str_eq(t_, (want_timeouts));                                                 \
    } while (0)

/* Limit 2, timeout 10 s, the clients' clocks given. Worked by hand:
 *   A at 100: no owner; ticket 1, rank 0 < 2: granted.
 *   B at 101: ticket 2, rank 1: granted.
 *   C at 102: ticket 3, rank 2: refused, and C leaves both sets (the counter stays at 3).
 *   B releases: still held, 1. D at 103: owners A:1, D:4, rank 1: granted.
 *   E at 111.5: ZREMRANGEBYSCORE drops the timeouts <= 101.5, A's (100); ZINTERSTORE then
 *     drops A from the owners: owners D:4, E:5, rank 1: granted. A's release finds nothing, 0.
 *   F at 112: ticket 6, rank 2: refused.
 *   D releases. G at 104 (a clock 8 s behind E's): ranked by its ticket 7, not by its time:
 *     owners E:5, G:7: granted. H at 95 (the slowest clock yet): ticket 8, rank 2: refused;
 *     the basic semaphore (6.3.1), ranked by time, would have let it steal a permit. */
Test(bookrefs, fair_grants_in_ticket_order_and_drops_an_expired_owner, TO)
{
    book b;
    book_open(&b);
    cr_assert_eq(acquire(&b, "A", 2, "100", 10), 1);
    cr_assert_eq(acquire(&b, "B", 2, "101", 10), 2);
    cr_assert_eq(acquire(&b, "C", 2, "102", 10), 0);
    EXPECT_SETS(&b, "A:1 B:2", "A B");
    redisReply *r = redisCommand(b.rc, "GET %s", b.key[2]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STRING);
    cr_assert_str_eq(r->str, "3");
    freeReplyObject(r);

    cr_assert_eq(release(&b, "B"), 1);
    cr_assert_eq(acquire(&b, "D", 2, "103", 10), 4);
    EXPECT_SETS(&b, "A:1 D:4", "A D");

    cr_assert_eq(acquire(&b, "E", 2, "111.5", 10), 5);
    EXPECT_SETS(&b, "D:4 E:5", "D E");
    cr_assert_eq(release(&b, "A"), 0);
    cr_assert_eq(acquire(&b, "F", 2, "112", 10), 0);
    EXPECT_SETS(&b, "D:4 E:5", "D E");

    cr_assert_eq(release(&b, "D"), 1);
    cr_assert_eq(acquire(&b, "G", 2, "104", 10), 7);
    cr_assert_eq(acquire(&b, "H", 2, "95", 10), 0);
    EXPECT_SETS(&b, "E:5 G:7", "G E"); /* timeouts by time: G 104, E 111.5 */
    redisFree(b.rc);
}

/* An owner whose timeout entry is gone (expired and removed) no longer counts, even though
 * its ticket is the smallest: the intersection is what makes the timeouts bind the owners. */
Test(bookrefs, fair_intersection_removes_owners_without_a_timeout, TO)
{
    book b;
    book_open(&b);
    cr_assert_eq(acquire(&b, "A", 1, "100", 10), 1);
    cr_assert_eq(acquire(&b, "B", 1, "100", 10), 0); /* limit 1: taken */
    redisReply *r = redisCommand(b.rc, "ZREM %s A", b.key[0]);
    cr_assert(r != NULL && r->integer == 1);
    freeReplyObject(r);
    cr_assert_eq(acquire(&b, "B", 1, "100", 10), 3);
    EXPECT_SETS(&b, "B:3", "B");
    redisFree(b.rc);
}

/* The locked variant's guard: SET lock:<sem> id NX PX, released by compare-and-delete. */
Test(bookrefs, guard_release_deletes_only_its_own_guard, TO)
{
    book b;
    book_open(&b);
    redisReply *r = redisCommand(b.rc, "SET %s mine NX PX 10000", b.key[3]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
    r = redisCommand(b.rc, "SET %s other NX PX 10000", b.key[3]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_NIL); /* busy: the attempt fails */
    freeReplyObject(r);
    r = redisCommand(b.rc, "EVAL %s 1 %s other", b.guard_release, b.key[3]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
    freeReplyObject(r);
    r = redisCommand(b.rc, "EVAL %s 1 %s mine", b.guard_release, b.key[3]);
    cr_assert(r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    r = redisCommand(b.rc, "EXISTS %s", b.key[3]);
    cr_assert(r != NULL && r->integer == 0);
    freeReplyObject(r);
    redisFree(b.rc);
}
