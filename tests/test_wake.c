/* White-box tests of the client's shared wait (src/wake.c), linked with the internal archive
 * and run against the suite's private redis-server. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "fixture.h"
#include "internal.h"

typedef struct blocked {
    redsem_client *c;
    const char *key;
    const char *elem; /* NULL, or the element of the id list that alone wakes it (fair) */
    int64_t since_ns; /* the acquire's start it claims */
    int64_t hard_ms;  /* its hard deadline, from now (0: 25 s) */
    bool signaled;
    redsem__wake_grant grant; /* a direct grant the element carried */
    int rc;
    atomic_int done;
} blocked;

static void *blpop_thread(void *arg)
{
    blocked *b = arg;
    int64_t hard_ms = b->hard_ms > 0 ? b->hard_ms : 25000;
    b->rc = redsem__blpop(b->c, b->key, strlen(b->key), b->elem, 20000,
                          redsem__now_ns() + hard_ms * REDSEM__NS_PER_MS, b->since_ns,
                          &b->signaled, &b->grant);
    atomic_store(&b->done, 1);
    return NULL;
}

/* Wait (at most 10 s) until n waits are registered in c's shared wait. */
static void await_registered(redsem_client *c, int n)
{
    int64_t end = tf_now_ms() + 10000;
    while (redsem__wake_waiters(c) < n && tf_now_ms() < end)
        tf_sleep_ms(1);
    cr_assert_eq(redsem__wake_waiters(c), n, "%d waits registered, want %d",
                 redsem__wake_waiters(c), n);
}

static void push_value(const char *key, const char *value)
{
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "LPUSH", key, value, NULL), 0);
}

static void push(const char *key)
{
    push_value(key, "1");
}

/* A holder id made of one repeated hex digit. */
static const char *id_of(char digit, char buf[REDSEM_ID_BUFSIZE])
{
    memset(buf, digit, REDSEM_ID_LEN);
    buf[REDSEM_ID_LEN] = '\0';
    return buf;
}

/* A fair waiter's element on its client's id list: "<id> <meta key>". */
static const char *elem_of(char digit, const char *meta, char buf[128])
{
    char id[REDSEM_ID_BUFSIZE];
    snprintf(buf, 128, "%s %s", id_of(digit, id), meta);
    return buf;
}

/* What grant_heads does for a waiter of c: its element on c's id list, and on the list's bell
 * (there only when the list was empty). */
static void push_elem(redsem_client *c, const char *elem, bool bell)
{
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "RPUSH", c->wake_ids, elem, NULL), 0);
    if (bell)
        push_value(c->wake_bell, elem);
}

/* Wait (at most 10 s) until key's list is empty (the shared BLPOP popped it). */
static void await_popped(const char *key)
{
    char out[64];
    int64_t end = tf_now_ms() + 10000;
    do {
        cr_assert_eq(ts_command(tf_server(), out, sizeof out, "LLEN", key, NULL), 0);
        if (strcmp(out, "0") == 0)
            return;
        tf_sleep_ms(1);
    } while (tf_now_ms() < end);
    cr_assert_fail("%s still holds %s elements after 10 s", key, out);
}

/* Wait (at most 10 s) until one of a, b is done; returns it, or NULL. */
static blocked *first_done(blocked *a, blocked *b)
{
    int64_t end = tf_now_ms() + 10000;
    while (tf_now_ms() < end) {
        if (atomic_load(&a->done))
            return a;
        if (atomic_load(&b->done))
            return b;
        tf_sleep_ms(1);
    }
    return NULL;
}

/* Two waiters on one list; the one whose acquire started later registers first (as after a
 * backoff: a waiter registers anew each time). One element pushed: it wakes the one whose
 * acquire started first (0.4.1 woke the one registered first), and the other keeps waiting
 * for the next element. */
Test(wake, the_oldest_acquire_on_a_list_gets_its_wake_up, .timeout = 60)
{
    redsem_client *c = tf_client();
    char key[160];
    snprintf(key, sizeof key, "%s:signal", tf_name("wake-age"));
    blocked young = {.c = c, .key = key, .since_ns = 2000}, old = {.c = c, .key = key,
                                                                   .since_ns = 1000};
    pthread_t ty, to;
    cr_assert_eq(pthread_create(&ty, NULL, blpop_thread, &young), 0);
    await_registered(c, 1);
    cr_assert_eq(pthread_create(&to, NULL, blpop_thread, &old), 0);
    await_registered(c, 2);
    push(key);
    blocked *first = first_done(&young, &old);
    cr_assert_not_null(first, "no waiter woke within 10 s of the push");
    cr_expect_eq(first, &old, "the waiter registered first woke, not the oldest acquire");
    cr_expect(first->signaled, "woken without the element");
    cr_expect_eq(first->rc, REDSEM_OK);
    tf_sleep_ms(50);
    blocked *other = first == &old ? &young : &old;
    cr_expect_eq(atomic_load(&other->done), 0, "one element woke both waiters");
    push(key);
    pthread_join(ty, NULL);
    pthread_join(to, NULL);
    cr_expect(other->signaled, "the second element did not reach the other waiter");
    cr_expect_eq(other->rc, REDSEM_OK);
    redsem_client_free(c);
}

/* After b's wake-up: a still waits (one element, one wake-up), and its own element then ends
 * its wait. Frees c. */
static void then_the_other(redsem_client *c, blocked *a, const char *ea, pthread_t ta,
                           pthread_t tb)
{
    tf_sleep_ms(50);
    cr_expect_eq(atomic_load(&a->done), 0, "one element woke both waiters");
    push_elem(c, ea, true);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_expect(a->signaled, "its own element did not reach the other waiter");
    cr_expect_eq(a->rc, REDSEM_OK);
    redsem_client_free(c);
}

/* Fair waiters of one client share its id list (their key is its bell), and an element names
 * the waiter granted, by id and semaphore: it wakes that waiter, even if another one waits
 * longer (0.4.2 woke the oldest of a list), and even if that other one has the same id on
 * another semaphore (one id may wait on two semaphores: ids are unique per semaphore). */
Test(wake, an_element_wakes_the_waiter_it_names, .timeout = 60)
{
    redsem_client *c = tf_client();
    char ea[128], eb[128];
    const char *key = c->wake_bell;
    blocked a = {.c = c, .key = key, .elem = elem_of('a', "m:{one}:meta", ea), .since_ns = 1000},
            b = {.c = c, .key = key, .elem = elem_of('a', "m:{two}:meta", eb), .since_ns = 2000};
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, blpop_thread, &a), 0);
    await_registered(c, 1);
    cr_assert_eq(pthread_create(&tb, NULL, blpop_thread, &b), 0);
    await_registered(c, 2);
    push_elem(c, eb, true);
    blocked *first = first_done(&a, &b);
    cr_assert_not_null(first, "no waiter woke within 10 s of the push");
    cr_expect_eq(first, &b, "another waiter woke, not the one the element names");
    cr_expect(first->signaled, "woken without the element");
    then_the_other(c, &a, ea, ta, tb);
}

/* An element drained while its waiter is not registered (between two attempts: its attempt
 * may have begun before the grant) is kept: the waiter's next wait ends at once, signaled,
 * instead of sleeping until its fallback. Here the other waiter keeps the shared BLPOP
 * running. */
Test(wake, an_element_drained_between_attempts_is_kept, .timeout = 60)
{
    redsem_client *c = tf_client();
    char ea[128], eb[128];
    const char *key = c->wake_bell;
    blocked a = {.c = c, .key = key, .elem = elem_of('a', "m:{x}:meta", ea), .since_ns = 1000},
            b = {.c = c, .key = key, .elem = elem_of('b', "m:{x}:meta", eb), .since_ns = 2000};
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, blpop_thread, &a), 0);
    await_registered(c, 1);
    push_elem(c, eb, true); /* b is not waiting now */
    await_popped(c->wake_ids);
    cr_assert_eq(pthread_create(&tb, NULL, blpop_thread, &b), 0);
    blocked *first = first_done(&a, &b);
    cr_assert_not_null(first, "b's wait did not end within 10 s: its popped id was lost");
    cr_expect_eq(first, &b, "the id woke another waiter");
    cr_expect(b.signaled, "b's wait ended without its wake-up");
    cr_expect_eq(b.rc, REDSEM_OK);
    then_the_other(c, &a, ea, ta, tb);
}

/* A bell can be lost: popped by a BLPOP whose connection is then lost (a fault: the reply
 * with the bell never came). The elements stay in the id list, and a BLPOP that watched the
 * bell and was lost drains the list at once. Here an element is pushed without its bell (as
 * the lost one left it) and the client's connections are killed under the BLPOP: the
 * element's waiter wakes then, not at its own deadline (20 s). A server of the test's own
 * (CLIENT KILL of every client). */
Test(wake, a_lost_bell_loses_no_wake_up, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 2000, 0);
    char ea[128], out[2048] = "";
    blocked a = {.c = c, .key = c->wake_bell, .elem = elem_of('a', "m:{y}:meta", ea),
                 .since_ns = 1000};
    pthread_t ta;
    cr_assert_eq(pthread_create(&ta, NULL, blpop_thread, &a), 0);
    await_registered(c, 1);
    for (int i = 0; i < 1000 && strstr(out, "blocked_clients:1") == NULL; i++) {
        tf_sleep_ms(5); /* its BLPOP under way */
        cr_assert_eq(ts_command(&srv, out, sizeof out, "INFO", "clients", NULL), 0);
    }
    cr_assert_eq(ts_command(&srv, out, sizeof out, "RPUSH", c->wake_ids, ea, NULL), 0);
    int64_t t0 = tf_now_ms();
    cr_assert_eq(ts_command(&srv, NULL, 0, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes",
                            NULL),
                 0);
    blocked *first = first_done(&a, &a);
    cr_assert_not_null(first, "a did not wake within 10 s: the element without a bell was lost");
    cr_expect(a.signaled, "a woke without its element");
    cr_expect_lt(tf_now_ms() - t0, 5000, "a woke %lld ms after the kill",
                 (long long)(tf_now_ms() - t0));
    pthread_join(ta, NULL);
    redsem_client_free(c);
    ts_server_stop(&srv);
}

/* A fair semaphore of limit 1 (lease 30 s) named after base, its one permit held: *p. */
static redsem_sem *full_fair(redsem_client *c, const char *base, redsem_permit **p)
{
    redsem_sem *s = NULL;
    cr_assert_eq(redsem_sem_open(c, tf_name(base), REDSEM_STRATEGY_FAIR, 1, 30000, &s),
                 REDSEM_OK);
    cr_assert_eq(redsem_sem_try_acquire(s, p), REDSEM_OK);
    return s;
}

/* One fair acquire attempt (fair_acquire.lua) that queues id as a waiter: with the client's
 * id list, as redsem 0.4.3 on one server sends it, or without (list NULL: redsem <= 0.4.2,
 * or a cluster client); with direct, also asking for a direct grant (0.4.5) under a wait
 * lease of wait_lease ms (else 30 s). */
static void attempt_dl(redsem_client *c, const redsem_sem *s, const char *id, const char *list,
                       int mode, bool direct, int64_t wait_lease)
{
    redsem__args a;
    redsem__args_init(&a);
    redsem__args_str(&a, s->k_meta);
    redsem__args_str(&a, s->k_owners);
    redsem__args_str(&a, s->k_timeouts);
    redsem__args_str(&a, s->k_sigprefix);
    redsem__args_str(&a, s->k_guard);
    redsem__args_str(&a, id);
    redsem__args_i64(&a, 1);     /* limit */
    redsem__args_i64(&a, 30000); /* lease */
    redsem__args_i64(&a, mode);  /* 1 wait, 2 again */
    redsem__args_i64(&a, wait_lease > 0 ? wait_lease : 30000); /* wait lease */
    redsem__args_str(&a, "fair");
    redsem__args_str(&a, id);
    redsem__args_i64(&a, 0); /* not after: none */
    redsem__args_i64(&a, 1); /* weight */
    if (list != NULL)
        redsem__args_str(&a, list);
    if (list != NULL && direct)
        redsem__args_str(&a, "1");
    redisReply *r = NULL;
    cr_assert_eq(redsem__eval(c, REDSEM__SCRIPT_FAIR_ACQUIRE, 5, &a, 0, NULL, &r), REDSEM_OK,
                 "%s", redsem_client_errmsg(c));
    cr_assert(r->type == REDIS_REPLY_STRING && r->str[0] == '0', "%s was not queued", id);
    freeReplyObject(r);
}

static void attempt_as(redsem_client *c, const redsem_sem *s, const char *id, const char *list,
                       int mode)
{
    attempt_dl(c, s, id, list, mode, false, 0);
}

static void queue_waiter(redsem_client *c, const redsem_sem *s, const char *id, const char *list)
{
    attempt_as(c, s, id, list, 1);
}

static void expect_reply(const char *want, const char *cmd, const char *k1, const char *k2)
{
    char out[256];
    ts_command(tf_server(), out, sizeof out, cmd, k1, k2, NULL);
    cr_expect_str_eq(out, want, "%s %s %s", cmd, k1, k2 != NULL ? k2 : "");
}

/* The server side of the id list: a fair waiter queued with its client's id list records it
 * (c:<id> in the meta hash), and the release that grants it pushes its id there; a waiter
 * queued without one (redsem <= 0.4.2: mixed versions during an upgrade) is still woken on
 * its own list, {name}:signal:<id>, with "1". A release forgets the holder's c: field. */
Test(wake, a_grant_wakes_a_waiter_where_its_client_waits, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL, *pa = NULL;
    redsem_sem *s = full_fair(c, "wake-where", &p);
    char ida[REDSEM_ID_BUFSIZE], idb[REDSEM_ID_BUFSIZE], field[64], own[1100];
    queue_waiter(c, s, id_of('a', ida), c->wake_ids);
    queue_waiter(c, s, id_of('b', idb), NULL);
    snprintf(field, sizeof field, "c:%s", ida);
    expect_reply(c->wake_ids, "HGET", s->k_meta, field);
    snprintf(field, sizeof field, "c:%s", idb);
    expect_reply("0", "HEXISTS", s->k_meta, field);
    /* a waiter taken over by another client (its next attempt carries that client's list)
     * is woken there */
    char idd[REDSEM_ID_BUFSIZE];
    queue_waiter(c, s, id_of('d', idd), "redsem:wake:0000000000000000:ids");
    attempt_as(c, s, idd, c->wake_ids, 2);
    snprintf(field, sizeof field, "c:%s", idd);
    expect_reply(c->wake_ids, "HGET", s->k_meta, field);

    cr_assert_eq(redsem_permit_release(p), REDSEM_OK); /* grants a, the head */
    char elem[1200];
    snprintf(elem, sizeof elem, "%s %s", ida, s->k_meta);
    expect_reply("1", "LLEN", c->wake_ids, NULL);
    expect_reply(elem, "LINDEX", c->wake_ids, "0");
    expect_reply("1", "LLEN", c->wake_bell, NULL);
    snprintf(own, sizeof own, "%s%s", s->k_sigprefix, ida);
    expect_reply("0", "EXISTS", own, NULL);

    cr_assert_eq(redsem_sem_adopt(s, ida, &pa), REDSEM_OK, "%s", redsem_client_errmsg(c));
    cr_assert_eq(redsem_permit_release(pa), REDSEM_OK); /* grants b */
    snprintf(field, sizeof field, "c:%s", ida);
    expect_reply("0", "HEXISTS", s->k_meta, field);
    expect_reply("1", "LLEN", c->wake_ids, NULL); /* nothing more for this client */
    expect_reply("1", "LLEN", c->wake_bell, NULL);
    snprintf(own, sizeof own, "%s%s", s->k_sigprefix, idb);
    expect_reply("1", "LLEN", own, NULL);
    redsem_permit_free(p);
    redsem_permit_free(pa);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* The id list's name comes from data (a waiter's c:<id>), so a script cannot check its type
 * before its first write: a foreign key there (or an ACL that does not cover it) must not
 * fail the release that grants, nor leave it half-applied. The grant stands (its waiter finds
 * it by its poll) and the foreign key is untouched. */
Test(wake, a_foreign_key_at_an_id_list_fails_no_release, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL, *pa = NULL;
    redsem_sem *s = full_fair(c, "wake-foreign", &p);
    char list[128], ida[REDSEM_ID_BUFSIZE], field[64], out[64];
    snprintf(list, sizeof list, "%s-not-a-list", tf_name("wake-foreign"));
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "SET", list, "mine", NULL), 0);
    queue_waiter(c, s, id_of('a', ida), list);
    cr_expect_eq(redsem_permit_release(p), REDSEM_OK, "%s", redsem_client_errmsg(c));
    snprintf(field, sizeof field, "t:%s", ida);
    expect_reply("1", "HEXISTS", s->k_meta, field); /* granted */
    expect_reply("mine", "GET", list, NULL);
    cr_expect_eq(redsem_sem_adopt(s, ida, &pa), REDSEM_OK, "%s", redsem_client_errmsg(c));
    redsem_permit_free(p);
    if (pa != NULL) {
        cr_expect_eq(redsem_permit_release(pa), REDSEM_OK);
        redsem_permit_free(pa);
    }
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* The server's clock, ms (TIME). */
static int64_t server_ms(void)
{
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "EVAL",
                            "local t = redis.call('TIME') return t[1] * 1000 + "
                            "math.floor(t[2] / 1000)", "0", NULL),
                 0);
    return strtoll(out, NULL, 10);
}

static int64_t score_of(const char *zset, const char *member)
{
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "ZSCORE", zset, member, NULL), 0);
    return strtoll(out, NULL, 10);
}

/* A direct grant (0.4.5), on the server: a waiter queued with its client's id list and "1"
 * (ARGV[11]) records its lease (L:<id>); the release that grants it sets its deadline to the
 * grant + that lease (not the wait lease's) and pushes "<id> <meta> <token> <server us>
 * <lease>", the token the one recorded. A waiter whose wait entry has expired (it died; not cleaned up
 * yet) gets no fresh lease: its permit keeps that expired deadline, and its element has no
 * token. */
Test(wake, a_direct_grant_carries_the_waiters_lease, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL, *pa = NULL;
    redsem_sem *s = full_fair(c, "wake-direct", &p);
    char ida[REDSEM_ID_BUFSIZE], ide[REDSEM_ID_BUFSIZE], field[64], out[1200];
    attempt_dl(c, s, id_of('a', ida), c->wake_ids, 1, true, 2000);
    attempt_dl(c, s, id_of('e', ide), c->wake_ids, 1, true, 2000);
    snprintf(field, sizeof field, "L:%s", ida);
    expect_reply("30000", "HGET", s->k_meta, field);

    /* the keys' expiry 40 s from now: it does not cover a new 30 s deadline by IDLE/2
     * (30 s), so the grant moves it */
    char exp[32];
    snprintf(exp, sizeof exp, "%lld", (long long)server_ms() + 40000);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "HSET", s->k_meta, "exp", exp, NULL),
                 0);
    const char *keys[] = {s->k_meta, s->k_owners, s->k_timeouts};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(ts_command(tf_server(), out, sizeof out, "PEXPIREAT", keys[i], exp, NULL), 0);
    int64_t before = server_ms();
    cr_assert_eq(redsem_permit_release(p), REDSEM_OK); /* grants a, the head */
    int64_t after = server_ms();
    int64_t d = score_of(s->k_timeouts, ida);
    cr_expect(d >= before + 30000 && d <= after + 30000,
              "a's deadline is %lld ms after the grant, not its lease (30000)",
              (long long)(d - before));
    expect_reply("0", "HEXISTS", s->k_meta, field);
    snprintf(field, sizeof field, "c:%s", ida);
    expect_reply("0", "HEXISTS", s->k_meta, field);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "HGET", s->k_meta, "exp", NULL), 0);
    cr_expect_geq(strtoll(out, NULL, 10), d + 30000, "the keys' expiry %s does not cover the "
                  "deadline %lld by IDLE/2", out, (long long)d);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(ts_command(tf_server(), out, sizeof out, "PEXPIRETIME", keys[i], NULL), 0);
        cr_expect_geq(strtoll(out, NULL, 10), d + 30000, "%s expires at %s", keys[i], out);
    }
    char tok[64];
    snprintf(field, sizeof field, "t:%s", ida);
    cr_assert_eq(ts_command(tf_server(), tok, sizeof tok, "HGET", s->k_meta, field, NULL), 0);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "LINDEX", c->wake_ids, "0", NULL), 0);
    char head[1100];
    snprintf(head, sizeof head, "%s %s %s ", ida, s->k_meta, tok);
    cr_expect(strncmp(out, head, strlen(head)) == 0, "element \"%s\", want \"%s<us>\"", out,
              head);
    char *rest = NULL;
    long long us = strtoll(out + strlen(head), &rest, 10);
    cr_expect(us / 1000 >= before && us / 1000 <= after, "the element's time %lld is not the "
              "grant's", us);
    cr_expect_str_eq(rest, " 30000", "the element does not end with the lease");

    /* e dies: its wait entry expires before the release that would grant it */
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "ZADD", s->k_timeouts, "XX", "1", ide,
                            NULL),
                 0);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "DEL", c->wake_ids, NULL), 0);
    cr_assert_eq(redsem_sem_adopt(s, ida, &pa), REDSEM_OK, "%s", redsem_client_errmsg(c));
    cr_assert_eq(redsem_permit_release(pa), REDSEM_OK); /* grants e */
    snprintf(field, sizeof field, "t:%s", ide);
    expect_reply("1", "HEXISTS", s->k_meta, field);
    cr_expect_eq(score_of(s->k_timeouts, ide), 1, "a dead waiter was given a fresh lease");
    char elem[1200];
    snprintf(elem, sizeof elem, "%s %s", ide, s->k_meta);
    expect_reply(elem, "LINDEX", c->wake_ids, "0");
    redsem_permit_free(p);
    redsem_permit_free(pa);
    redsem_sem_free(s);
    redsem_client_free(c);
}

typedef struct {
    redsem_sem *s;
    const char *id;
    int rc;
    redsem_permit *p;
    atomic_int done;
} acquirer;

static void *acquire_thread(void *arg)
{
    acquirer *q = arg;
    q->rc = redsem_sem_acquire_as(q->s, q->id, 10000, &q->p);
    atomic_store(&q->done, 1);
    return NULL;
}

static uint64_t direct_grants(redsem_client *c)
{
    redsem_client_stats st;
    cr_assert_eq(redsem_client_get_stats(c, &st), REDSEM_OK);
    return st.direct_grants;
}

/* The client side: a blocked fair acquire woken by its direct grant takes the permit from the
 * wake-up, with no attempt after it (the counter), and believes it valid no longer than the
 * server keeps it. Before that, a wake-up whose token is not newer than what the waiter's
 * last attempt saw (an element of an earlier wait of the same id, delayed or kept) is taken
 * for a plain wake-up: the waiter tries, finds no permit, and waits on. */
Test(wake, a_woken_waiter_takes_its_direct_grant_and_no_stale_one, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL;
    redsem_sem *s = full_fair(c, "wake-take", &p);
    char ida[REDSEM_ID_BUFSIZE], elem[1200];
    acquirer q = {.s = s, .id = id_of('a', ida)};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, acquire_thread, &q), 0);
    await_registered(c, 1);
    uint64_t before = direct_grants(c);

    /* stale: a token older than the holder's (what the waiter's attempt saw as the fence) */
    long long now_us = (long long)server_ms() * 1000;
    snprintf(elem, sizeof elem, "%s %s 1 %lld 30000", ida, s->k_meta, now_us);
    push_elem(c, elem, true);
    /* another lease than this acquire's (another handle's wait of the same id) */
    snprintf(elem, sizeof elem, "%s %s %lld %lld 1000", ida, s->k_meta, now_us + 5000,
             now_us + 5000);
    push_elem(c, elem, true);
    tf_sleep_ms(300);
    cr_expect_eq(atomic_load(&q.done), 0, "a stale direct grant was taken (rc %s)",
                 redsem_err_name(q.rc));
    cr_expect_eq(direct_grants(c), before);

    cr_assert_eq(redsem_permit_release(p), REDSEM_OK); /* grants a */
    pthread_join(t, NULL);
    cr_assert_eq(q.rc, REDSEM_OK, "%s", redsem_client_errmsg(c));
    cr_expect_eq(direct_grants(c), before + 1, "the wake-up's grant was not taken directly");
    char field[64], tok[64];
    snprintf(field, sizeof field, "t:%s", ida);
    cr_assert_eq(ts_command(tf_server(), tok, sizeof tok, "HGET", s->k_meta, field, NULL), 0);
    cr_expect_eq(redsem_permit_token(q.p), strtoull(tok, NULL, 10));
    cr_expect_gt(redsem_permit_token(q.p), redsem_permit_token(p));
    int64_t valid = redsem_permit_validity_ms(q.p);
    int64_t left = score_of(s->k_timeouts, ida) - server_ms();
    cr_expect(valid > 25000, "validity %lld ms: not the lease", (long long)valid);
    cr_expect(valid <= left, "the client believes its permit valid %lld ms, the server keeps it "
              "%lld ms", (long long)valid, (long long)left);
    cr_expect_eq(redsem_permit_release(q.p), REDSEM_OK);
    redsem_permit_free(q.p);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* An L: field left behind (a redsem <= 0.4.4 script granted or cleaned up a 0.4.5 waiter:
 * it does not know the field) must not give a later wait of that id a stale lease: the
 * release of the id's permit removes it, and so does a wait of the id queued without a
 * direct grant (a client with sync replicas, or one that takes the id over). */
Test(wake, a_stale_lease_field_is_removed, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL, *px = NULL;
    redsem_sem *s = full_fair(c, "wake-stale-l", &p);
    char idx[REDSEM_ID_BUFSIZE], field[64], out[64];
    id_of('b', idx);
    snprintf(field, sizeof field, "L:%s", idx);
    /* as an old release's grant leaves it: x holds, L:x stays */
    attempt_dl(c, s, idx, c->wake_ids, 1, true, 2000);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "HSET", s->k_meta, field, "600000",
                            NULL),
                 0);
    cr_assert_eq(redsem_permit_release(p), REDSEM_OK); /* grants x (directly: L: is there) */
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "HSET", s->k_meta, field, "600000",
                            NULL),
                 0);
    cr_assert_eq(redsem_sem_adopt(s, idx, &px), REDSEM_OK, "%s", redsem_client_errmsg(c));
    cr_assert_eq(redsem_permit_release(px), REDSEM_OK);
    expect_reply("0", "HEXISTS", s->k_meta, field);
    redsem_permit_free(px);
    redsem_permit_free(p);

    /* a wait of x queued without a direct grant, an old L:x in place */
    cr_assert_eq(redsem_sem_try_acquire(s, &p), REDSEM_OK);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "HSET", s->k_meta, field, "600000",
                            NULL),
                 0);
    attempt_dl(c, s, idx, c->wake_ids, 1, false, 2000);
    expect_reply("0", "HEXISTS", s->k_meta, field);
    cr_assert_eq(redsem_permit_release(p), REDSEM_OK); /* grants x, the old way */
    char elem[1200];
    snprintf(elem, sizeof elem, "%s %s", idx, s->k_meta);
    expect_reply(elem, "LINDEX", c->wake_ids, "-1");
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* set_limit hands the new permits to the head of the queue (grant_heads), which since 0.4.5
 * also reads and writes timeouts (a direct grant's deadline): a foreign key there fails the
 * call before its first write (found by review: the limit was raised and the head granted,
 * then the script failed half-way). */
Test(wake, set_limit_checks_the_timeouts_type_first, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL;
    redsem_sem *s = full_fair(c, "wake-limit-type", &p);
    char idx[REDSEM_ID_BUFSIZE], out[64];
    attempt_dl(c, s, id_of('c', idx), c->wake_ids, 1, true, 2000);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "DEL", s->k_timeouts, NULL), 0);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "SET", s->k_timeouts, "foreign", NULL),
                 0);
    int rc = redsem_sem_set_limit(s, 2);
    cr_expect(rc == REDSEM_ESERVER && strstr(redsem_client_errmsg(c), "WRONGTYPE") != NULL,
              "%s (%s)", redsem_err_name(rc), redsem_client_errmsg(c));
    expect_reply("1", "HGET", s->k_meta, "limit");
    expect_reply("1", "ZCARD", s->k_owners, NULL);
    expect_reply("foreign", "GET", s->k_timeouts, NULL);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* An element kept for a waiter between two attempts goes only to the waiter it names: ids a
 * caller chooses (acquire_as) can be made to collide in the 64-bit hash the shared wait
 * matches by, and since 0.4.5 an element can carry a grant (found by review: a waiter whose
 * id collided took another's kept direct grant, and two holders held a limit-1 semaphore).
 * These two ids collide in FNV-1a-64, and so do "<id> <meta key>" for any one meta key. */
Test(wake, a_kept_element_goes_only_to_the_waiter_it_names, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *meta = "m:{collide}:meta";
    const char *ida = "0123456789abcdef0123456757b6a8481b299f19";
    const char *idb = "0123456789abcdef01234567ee52019edd0fc67b";
    char ex[128], ea[128], eb[160];
    snprintf(ea, sizeof ea, "%s %s", ida, meta);
    snprintf(eb, sizeof eb, "%s %s 1795674732721235 1795674732721235 30000", idb, meta);
    /* x keeps the shared BLPOP running while a and b are not registered */
    blocked x = {.c = c, .key = c->wake_bell, .elem = elem_of('f', meta, ex), .since_ns = 1000},
            a = {.c = c, .key = c->wake_bell, .elem = ea, .since_ns = 2000};
    pthread_t tx, ta;
    cr_assert_eq(pthread_create(&tx, NULL, blpop_thread, &x), 0);
    await_registered(c, 1);
    push_elem(c, eb, true); /* b's grant, drained and kept: b is between attempts */
    await_popped(c->wake_ids);
    await_popped(c->wake_bell);
    cr_assert_eq(pthread_create(&ta, NULL, blpop_thread, &a), 0);
    tf_sleep_ms(300);
    cr_expect_eq(atomic_load(&a.done), 0, "a's wait ended on b's kept element (token %llu)",
                 (unsigned long long)a.grant.token);
    push_elem(c, ea, true);
    pthread_join(ta, NULL);
    cr_expect(a.signaled);
    cr_expect_eq(a.grant.token, 0, "a took b's grant");
    push_elem(c, ex, true);
    pthread_join(tx, NULL);
    cr_expect(x.signaled);
    redsem_client_free(c);
}

/* The wake-up lists can be written by any user with access to the prefix's keys: an element
 * is believed only within what it can say. A token below the grant's server time (no grant
 * draws one) is a plain wake-up; one that claims a grant far in the server's future gives a
 * permit valid no longer than the lease from now (found by review: 11 days). */
Test(wake, a_forged_grant_is_believed_no_longer_than_the_lease, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL;
    redsem_sem *s = full_fair(c, "wake-forged", &p);
    char ida[REDSEM_ID_BUFSIZE], elem[1200];
    acquirer q = {.s = s, .id = id_of('d', ida)};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, acquire_thread, &q), 0);
    await_registered(c, 1);
    long long far = (long long)(server_ms() + 1000000000LL) * 1000;
    snprintf(elem, sizeof elem, "%s %s %lld %lld 30000", ida, s->k_meta,
             (long long)redsem_permit_token(p) + 1, far);
    push_elem(c, elem, true);
    tf_sleep_ms(300);
    cr_expect_eq(atomic_load(&q.done), 0, "a token below its grant's time was taken");
    snprintf(elem, sizeof elem, "%s %s %lld %lld 30000", ida, s->k_meta, far, far);
    push_elem(c, elem, true);
    pthread_join(t, NULL);
    cr_assert_eq(q.rc, REDSEM_OK, "%s", redsem_client_errmsg(c));
    cr_expect_leq(redsem_permit_validity_ms(q.p), 30000, "validity %lld ms",
                  (long long)redsem_permit_validity_ms(q.p));
    redsem_permit_free(q.p);
    cr_expect_eq(redsem_permit_release(p), REDSEM_OK);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* An acquire that returned without a permit is no longer queued: nobody waits on s, and
 * once the holder releases p (then freed) another acquire (timeout_ms: 0 tries once) gets
 * the permit, which a direct grant to the departed acquire would have withheld. */
static void left_and_handed_on(redsem_sem *s, redsem_permit *p, int64_t timeout_ms)
{
    cr_expect_eq(tf_waiters(s), 0, "the acquire that returned is still queued");
    cr_assert_eq(redsem_permit_release(p), REDSEM_OK);
    redsem_permit *z = NULL;
    cr_expect_eq(redsem_sem_acquire(s, timeout_ms, &z), REDSEM_OK, "the permit went to nobody");
    if (z != NULL) {
        cr_expect_eq(redsem_permit_release(z), REDSEM_OK);
        redsem_permit_free(z);
    }
    redsem_permit_free(p);
}

/* A queued fair waiter whose wait fails (here: another wait of the client registers a list
 * that is a foreign string, and the shared BLPOP fails with WRONGTYPE for every waiter of
 * the round) leaves the queue before it returns the fault: a release may grant a queued
 * entry with its whole lease (a direct grant), and nobody would hold it (found by review:
 * such a wait returned REDSEM_EUNKNOWN without leaving, and the next release gave the dead
 * acquire 30 s). */
Test(wake, a_failed_wait_leaves_the_queue, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_permit *p = NULL;
    redsem_sem *s = full_fair(c, "wake-failed-wait", &p);
    char ida[REDSEM_ID_BUFSIZE];
    acquirer q = {.s = s, .id = id_of('9', ida)};
    pthread_t t, tf;
    cr_assert_eq(pthread_create(&t, NULL, acquire_thread, &q), 0);
    await_registered(c, 1);
    char fkey[128], out[64];
    snprintf(fkey, sizeof fkey, "%s:signal", tf_name("wake-foreign-list"));
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "SET", fkey, "foreign", NULL), 0);
    blocked f = {.c = c, .key = fkey, .since_ns = 1};
    cr_assert_eq(pthread_create(&tf, NULL, blpop_thread, &f), 0);
    pthread_join(tf, NULL);
    pthread_join(t, NULL);
    cr_expect_eq(f.rc, REDSEM_ESERVER);
    cr_expect_eq(q.rc, REDSEM_ESERVER, "%s", redsem_err_name(q.rc));
    left_and_handed_on(s, p, 0);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* A locked waiter whose deadline comes while the guard is busy (here held under another
 * token until after that deadline) keeps trying to leave the queue, within a command
 * timeout, and says REDSEM_EBUSY only once it has left: a release may grant a queued entry
 * with its whole lease (a direct grant), and nobody would hold it (found by review: the one
 * last attempt met the busy guard, and the acquire returned REDSEM_EBUSY still queued). */
typedef struct timed_acquirer {
    redsem_sem *s;
    int64_t timeout_ms;
    int rc;
    redsem_permit *p;
} timed_acquirer;

static void *timed_acquire_thread(void *arg)
{
    timed_acquirer *t = arg;
    t->rc = redsem_sem_acquire(t->s, t->timeout_ms, &t->p);
    return NULL;
}

Test(wake, a_waiter_at_its_deadline_leaves_the_queue_past_a_busy_guard, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    cr_assert_eq(redsem_sem_open(c, tf_name("wake-guard-deadline"), REDSEM_STRATEGY_LOCKED, 1,
                                 30000, &s),
                 REDSEM_OK);
    cr_assert_eq(redsem_sem_try_acquire(s, &p), REDSEM_OK);
    timed_acquirer t = {.s = s, .timeout_ms = 500};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, timed_acquire_thread, &t), 0);
    await_registered(c, 1);
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "SET", s->k_guard, "someone-else", "PX",
                            "900", NULL),
                 0);
    pthread_join(th, NULL);
    cr_expect_eq(t.rc, REDSEM_EBUSY, "%s", redsem_err_name(t.rc));
    left_and_handed_on(s, p, 2000);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* Leaving the queue at the deadline is bounded: a locked waiter whose guard stays busy, on
 * a link whose replies come 850 ms late (command timeout 1000 ms), returns within one
 * command timeout of its deadline (plus scheduling), REDSEM_EUNKNOWN since it could not
 * leave (found by review: the attempts to leave counted a command timeout from the moment
 * they began, and the last of them could take another whole command timeout: 1.8 s). */
int64_t fw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

Test(wake, leaving_the_queue_at_the_deadline_is_bounded_on_a_slow_link, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, true), 0);
    fp_proxy *px = fp_proxy_start(srv.port);
    char url[128];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", fp_proxy_port(px));
    redsem_client *h = tf_client_for(srv.url, -1, 0);
    redsem_client *w = tf_client_for(url, -1, 1000);
    redsem_sem *sh = NULL, *sw = NULL;
    cr_assert_eq(redsem_sem_open(h, "slow", REDSEM_STRATEGY_LOCKED, 1, 30000, &sh), REDSEM_OK);
    cr_assert_eq(redsem_sem_open(w, "slow", REDSEM_STRATEGY_LOCKED, 1, 30000, &sw), REDSEM_OK);
    redsem_permit *p = NULL;
    cr_assert_eq(redsem_sem_try_acquire(sh, &p), REDSEM_OK);
    fp_proxy_set_reply_delay_ms(px, 850);
    timed_acquirer t = {.s = sw, .timeout_ms = 6000};
    pthread_t th;
    int64_t start = tf_now_ms();
    cr_assert_eq(pthread_create(&th, NULL, timed_acquire_thread, &t), 0);
    while (tf_waiters(sh) < 1 && tf_now_ms() < start + 5000)
        tf_sleep_ms(5);
    cr_assert_eq(tf_waiters(sh), 1);
    char out[64];
    cr_assert_eq(ts_command(&srv, out, sizeof out, "SET", sh->k_guard, "someone-else", "PX",
                            "30000", NULL),
                 0);
    pthread_join(th, NULL);
    int64_t past = tf_now_ms() - start - t.timeout_ms;
    cr_expect_eq(t.rc, REDSEM_EUNKNOWN, "%s", redsem_err_name(t.rc));
    cr_expect_leq(past, 1000 + 400, "returned %lld ms after its deadline (command timeout 1000)",
                  (long long)past);
    redsem_permit_free(p);
    redsem_sem_free(sh);
    redsem_sem_free(sw);
    redsem_client_free(h);
    redsem_client_free(w);
    fp_proxy_stop(px);
    ts_server_stop(&srv);
}

/* The scripts read every key that can fail before their first write (prelude.lua), so that
 * a foreign key at one of a semaphore's names fails the call without changing anything
 * (found by review: basic set_limit raised the limit, then failed on the waiters set; a fair
 * release removed the permit, then failed on the queue, and reported the release failed). */
Test(wake, a_foreign_key_fails_set_limit_and_release_before_any_write, .timeout = 60)
{
    redsem_client *c = tf_client();
    redsem_sem *s = NULL;
    redsem_permit *p = NULL;
    char out[64], field[64];
    cr_assert_eq(redsem_sem_open(c, tf_name("wake-basic-limit"), REDSEM_STRATEGY_BASIC, 1,
                                 30000, &s),
                 REDSEM_OK);
    cr_assert_eq(redsem_sem_try_acquire(s, &p), REDSEM_OK);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "SET", s->k_waiters, "foreign", NULL),
                 0);
    cr_expect_eq(redsem_sem_set_limit(s, 3), REDSEM_ESERVER);
    expect_reply("1", "HGET", s->k_meta, "limit");
    redsem_permit_free(p);
    redsem_sem_free(s);

    cr_assert_eq(redsem_sem_open(c, tf_name("wake-fair-release"), REDSEM_STRATEGY_FAIR, 2, 30000,
                                 &s),
                 REDSEM_OK);
    cr_assert_eq(redsem_sem_try_acquire(s, &p), REDSEM_OK);
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "SET", s->k_owners, "foreign", NULL), 0);
    cr_expect_eq(redsem_permit_release(p), REDSEM_ESERVER);
    snprintf(field, sizeof field, "t:%s", redsem_permit_id(p));
    expect_reply("1", "HEXISTS", s->k_meta, field);
    expect_reply("1", "HGET", s->k_meta, "used");
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}
