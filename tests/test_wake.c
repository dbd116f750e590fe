/* White-box tests of the client's shared wait (src/wake.c), linked with the internal archive
 * and run against the suite's private redis-server. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "fixture.h"
#include "internal.h"

typedef struct blocked {
    redsem_client *c;
    const char *key;
    int64_t since_ns; /* the acquire's start it claims */
    bool signaled;
    int rc;
    atomic_int done;
} blocked;

static void *blpop_thread(void *arg)
{
    blocked *b = arg;
    b->rc = redsem__blpop(b->c, b->key, strlen(b->key), 20000,
                          redsem__now_ns() + 25000 * REDSEM__NS_PER_MS, b->since_ns,
                          &b->signaled);
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

static void push(const char *key)
{
    char out[64];
    cr_assert_eq(ts_command(tf_server(), out, sizeof out, "LPUSH", key, "1", NULL), 0);
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
