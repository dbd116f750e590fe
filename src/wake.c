/* redsem - the shared wait: the threads of one client that wait for a wake-up (a blocking
 * acquire between its attempts) share one BLPOP on one connection, instead of holding a
 * connection each.
 *
 * A waiting thread registers its wake-up list and its own deadline, then sleeps on its own
 * condition variable. One of them, the leader, runs BLPOP on every registered list at once
 * (BLPOP takes many keys and pops from the first that has an element), with the earliest
 * deadline as its timeout. When it returns, the leader wakes the thread whose list had the
 * element (the longest waiting one on that list, by its acquire's start: one element is one
 * wake-up) and those whose deadline has passed, then waits again for the rest. A thread that
 * registers a list the running BLPOP does not watch, or a wait that must end before it,
 * pushes to the client's control list
 * (one of the BLPOP's keys, with a TTL), which ends that BLPOP at once so that the leader
 * starts a new one that watches it too: a release still wakes a waiter within a round trip.
 * A wake-up is never lost: an element pushed while no BLPOP watches its list stays in the
 * list until the next BLPOP, which returns at once. When the leader's own wait ends it hands
 * the role to another waiter. The acquire loop's bounded, jittered fallback (acquire.c) is
 * unchanged: every waiter also wakes by its own deadline.
 *
 * A Redis Cluster client keeps one wait connection per waiting thread (redsem__blpop_alone):
 * one BLPOP cannot watch lists in different slots. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "internal.h"

/* distinct lists one BLPOP watches at most (the control list included); a waiter beyond
 * them wakes by its own deadline, as the fallback does */
#define WAKE_KEYS_MAX 512
/* the control list lives this long after its last push (ms) */
#define WAKE_CTL_TTL_MS 10000
/* slots of the leader's hash set of keys: a power of 2, at least twice WAKE_KEYS_MAX */
#define WAKE_SET_SIZE 1024

/* FNV-1a */
static uint32_t key_hash(const char *k, size_t len)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)k[i]) * 16777619u;
    return h;
}

typedef struct redsem__waiter {
    struct redsem__waiter *next;
    const char *key; /* NULL: a leader that waits for nothing of its own (redsem__wake_park) */
    size_t keylen;
    int64_t until_ns; /* its wait ends (BLPOP timeout) */
    int64_t since_ns; /* it began waiting (its acquire's start): the oldest on a list wins */
    int64_t hard_ns;  /* and at the latest (our clock) */
    char *errmsg;     /* its thread's error text */
    pthread_cond_t cv;
    const atomic_bool *cancel; /* its operation's cancel flag (async.c), or NULL */
    bool watched;     /* in the running BLPOP's keys */
    bool lead, done, signaled;
    int rc;
    /* A parked wait (the event-loop API: no thread sleeps on cv): on_done(arg, rc, signaled)
     * runs when it ends, under wake_mu, on the leader's thread; need_lead(arg) when the lead
     * must pass and no thread waits. Heap-allocated with its key, freed by whoever ends it. */
    redsem__park_fn on_done;
    bool (*need_lead)(void *arg);
    void *arg;
} redsem__waiter;

/* Under wake_mu: end a parked waiter (its callback, then its memory). */
static void end_parked(redsem__waiter *x)
{
    x->on_done(x->arg, x->rc, x->signaled);
    redsem__free((char *)x->key);
    redsem__free(x);
}

/* Under wake_mu: whether any parked waiter is registered. */
static bool any_parked(const redsem_client *c)
{
    for (const redsem__waiter *x = c->waiters; x != NULL; x = x->next)
        if (x->on_done != NULL)
            return true;
    return false;
}

int redsem__wake_init(redsem_client *c)
{
    unsigned char rnd[8];
    char hex[17];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
    size_t len = c->prefix_len + sizeof "wake:" + sizeof hex;
    c->wake_ctl = redsem__malloc(len);
    if (c->wake_ctl == NULL)
        return REDSEM_ENOMEM;
    snprintf(c->wake_ctl, len, "%swake:%s", c->prefix, hex);
    c->wake_keys = redsem__calloc(WAKE_KEYS_MAX, sizeof *c->wake_keys);
    c->wake_lens = redsem__calloc(WAKE_KEYS_MAX, sizeof *c->wake_lens);
    return c->wake_keys != NULL && c->wake_lens != NULL ? REDSEM_OK : REDSEM_ENOMEM;
}

void redsem__wake_free(redsem_client *c)
{
    if (c->pid != getpid()) {
        /* a forked child: one thread; the parent's may have held wake_mu at fork, so no lock */
        for (redsem__waiter *x = c->waiters, *next; x != NULL; x = next) {
            next = x->next;
            if (x->on_done != NULL) { /* heap: a parked wait (a thread's is on its stack) */
                redsem__free((char *)x->key);
                redsem__free(x);
            }
        }
        c->waiters = NULL;
        /* the copies of a round the parent's leader was in (NULL once freed; its control
         * list's name, which the leader puts after them, is the client's) */
        for (int i = 0; c->wake_keys != NULL && i < WAKE_KEYS_MAX; i++)
            if (c->wake_keys[i] != NULL && c->wake_keys[i] != c->wake_ctl)
                redsem__free((char *)c->wake_keys[i]);
    }
    redsem__free(c->wake_keys);
    redsem__free(c->wake_lens);
    redsem__free(c->wake_ctl);
}

static void unlink_waiter(redsem_client *c, redsem__waiter *w)
{
    for (redsem__waiter **p = &c->waiters; *p != NULL; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            return;
        }
}

/* LPUSH + PEXPIRE of the control list, in one round trip. */
static int call_poke(redsem__node *n, void *arg)
{
    const char *ctl = arg;
    redsem__args push, ttl;
    redsem__args_init(&push);
    redsem__args_str(&push, "LPUSH");
    redsem__args_str(&push, ctl);
    redsem__args_str(&push, "1");
    redsem__args_init(&ttl);
    redsem__args_str(&ttl, "PEXPIRE");
    redsem__args_str(&ttl, ctl);
    redsem__args_i64(&ttl, WAKE_CTL_TTL_MS);
    redisReply *r1 = NULL, *r2 = NULL;
    int rc = redsem__node_request2(n, &push, &ttl, REDSEM__REQ_RETRY, 0, &r1, &r2, NULL);
    if (rc == REDSEM_OK) {
        freeReplyObject(r1);
        freeReplyObject(r2);
    }
    return rc;
}

static bool same_key(const redsem__waiter *a, const redsem__waiter *b)
{
    return a->keylen == b->keylen && memcmp(a->key, b->key, a->keylen) == 0;
}

/* Under wake_mu: whether a waiter on w's list is in the running BLPOP. */
static bool watched(const redsem_client *c, const redsem__waiter *w)
{
    for (const redsem__waiter *x = c->waiters; x != NULL; x = x->next)
        if (x->watched && same_key(x, w))
            return true;
    return false;
}

/* The leader's loop, with wake_mu held (released around each BLPOP), until its own wait is
 * done; then the role goes to the next waiter. */
static void lead(redsem_client *c, redsem__waiter *me)
{
    int set[WAKE_SET_SIZE]; /* indexes into keys, by key hash (open addressing) */
    /* the client's: one leader at a time (wake_leading) */
    const char **keys = c->wake_keys;
    size_t *lens = c->wake_lens;
    redsem__lane *l = NULL;
    int last = REDSEM_OK;
    while (!me->done) {
        int rc = REDSEM_OK;
        int nkeys = 0;
        for (int i = 0; i < WAKE_SET_SIZE; i++)
            set[i] = -1;
        int64_t until = INT64_MAX, hard = INT64_MAX;
        for (redsem__waiter *x = c->waiters; x != NULL; x = x->next) {
            if (x->key == NULL)
                continue; /* a parked waiters' leader: nothing of its own */
            if (x->until_ns < until)
                until = x->until_ns;
            if (x->cancel != NULL && atomic_load(x->cancel))
                until = 0; /* a cancelled wait ends now (a 1 ms BLPOP) */
            if (x->hard_ns < hard)
                hard = x->hard_ns;
            x->watched = false;
            if (rc != REDSEM_OK)
                continue;
            /* a key already in this BLPOP (several waiters of one basic semaphore share its
             * list): a hash set of the keys so far, so that a round costs O(waiters) */
            uint32_t h = key_hash(x->key, x->keylen);
            uint32_t slot = h & (WAKE_SET_SIZE - 1);
            bool dup = false;
            while (set[slot] >= 0) {
                int k = set[slot];
                if (lens[k] == x->keylen && memcmp(keys[k], x->key, x->keylen) == 0) {
                    dup = true;
                    break;
                }
                slot = (slot + 1) & (WAKE_SET_SIZE - 1);
            }
            if (!dup && nkeys < WAKE_KEYS_MAX - 1) {
                /* a copy: a waiter that gives up (its safety net) takes its key with it */
                char *k = redsem__memdup0(x->key, x->keylen);
                if (k == NULL) {
                    rc = REDSEM_ENOMEM;
                    continue;
                }
                keys[nkeys] = k;
                lens[nkeys] = x->keylen;
                set[slot] = nkeys++;
                x->watched = true;
            } else if (dup) {
                x->watched = true;
            }
        }
        int which = -1;
        if (rc == REDSEM_OK) {
            keys[nkeys] = c->wake_ctl; /* last: a wake-up's element is popped first */
            lens[nkeys] = strlen(c->wake_ctl);
            c->wake_blocked = true;
            c->wake_poked = false;
            c->wake_until = until;
            c->wake_hard = hard;
            pthread_mutex_unlock(&c->wake_mu);
            if (l == NULL)
                rc = redsem__lane_get(c, true, &l);
            if (rc == REDSEM_OK) {
                int64_t now = redsem__now_ns();
                int64_t wait_ms = until > now ? (until - now + REDSEM__NS_PER_MS - 1) /
                                                    REDSEM__NS_PER_MS : 1;
                l->ctx.errmsg[0] = '\0';
                l->ctx.deadline_cap_ns = hard; /* reconnects too end by the earliest cut */
                rc = redsem__node_blpop_many(redsem__topo_node(&l->topo, NULL, 0), keys, lens,
                                             nkeys + 1, wait_ms, hard, &which);
            }
            pthread_mutex_lock(&c->wake_mu);
            c->wake_blocked = false;
        }
        last = rc;
        int64_t now = redsem__now_ns();
        /* Nothing popped before any wait ended: the wait was cut (UNBLOCKED from a demoted
         * primary): every waiter goes back to its acquire loop, which tries again (on the new
         * primary), as a lone wait would. Our own hard deadline (which == -2) ends only the
         * waits that reached theirs. */
        bool cut = rc == REDSEM_OK && which == -1 && now < until;
        const char *popped = rc == REDSEM_OK && which >= 0 && which < nkeys ? keys[which] : NULL;
        size_t popped_len = popped != NULL ? lens[which] : 0;
        /* one element popped is one wake-up: it goes to the longest-waiting waiter on that
         * list, by its acquire's start (a waiter that woke by its deadline, or lost its
         * permit to a barging acquire, registers anew but keeps its age; on a tie the one
         * registered first: waiters are pushed at the front); the others on the same list
         * (basic: one list per semaphore) wait for theirs */
        redsem__waiter *woken = NULL;
        for (redsem__waiter *x = c->waiters; popped != NULL && x != NULL; x = x->next)
            if (x->key != NULL && x->keylen == popped_len &&
                memcmp(x->key, popped, popped_len) == 0 &&
                (woken == NULL || x->since_ns <= woken->since_ns))
                woken = x;
        for (redsem__waiter **p = &c->waiters; *p != NULL;) {
            redsem__waiter *x = *p;
            bool fin = false;
            if (rc != REDSEM_OK) {
                x->rc = rc;
                redsem__text_copy(x->errmsg, l != NULL ? l->ctx.errmsg : me->errmsg);
                fin = true;
            } else if (x == woken) {
                x->signaled = true;
                REDSEM__COUNT(&l->ctx, wakeups, 1);
                fin = true;
            } else if (x->key == NULL) {
                /* a parked waiters' leader: until none is left, or its owner stops it */
                fin = !any_parked(c) || (x->cancel != NULL && atomic_load(x->cancel));
            } else if (cut || now >= x->until_ns || now >= x->hard_ns ||
                       (x->cancel != NULL && atomic_load(x->cancel))) {
                fin = true;
            }
            if (!fin) {
                p = &x->next;
                continue;
            }
            *p = x->next;
            x->done = true;
            if (x->on_done != NULL)
                end_parked(x);
            else if (x != me)
                pthread_cond_signal(&x->cv);
        }
        /* each entry NULL as it is freed (and the control list's): a child forked meanwhile
         * frees the copies it finds (redsem__wake_free), never one twice */
        keys[nkeys] = NULL;
        for (int i = 0; i < nkeys; i++) {
            const char *k = keys[i];
            keys[i] = NULL;
            redsem__free((char *)k);
        }
        if (!me->done && me->key == NULL &&
            (!any_parked(c) || (me->cancel != NULL && atomic_load(me->cancel)))) {
            unlink_waiter(c, me);
            me->done = true;
        }
    }
    if (l != NULL) {
        pthread_mutex_unlock(&c->wake_mu);
        redsem__lane_put(c, l, last);
        pthread_mutex_lock(&c->wake_mu);
    }
    /* the role goes to a waiting thread; parked waiters alone ask their owner for a thread
     * (redsem__wake_park's need_lead) */
    redsem__waiter *next = c->waiters;
    while (next != NULL && next->on_done != NULL)
        next = next->next;
    if (next != NULL) {
        next->lead = true;
        pthread_cond_signal(&next->cv);
    } else {
        c->wake_leading = false;
        /* the first owner that can take it (one being freed says no) */
        for (redsem__waiter *x = c->waiters; x != NULL; x = x->next)
            if (x->on_done != NULL && x->need_lead(x->arg))
                break;
    }
}

/* Under wake_mu, with the role taken (wake_leading set by the caller): lead on this thread,
 * for the parked waiters, until none is left or *stop is set (then the role passes on, as
 * when a thread's own wait ends: redsem__wake_cancelled() ends the running BLPOP for it). */
static void lead_parked(redsem_client *c, const atomic_bool *stop)
{
    redsem__waiter me = {.key = NULL, .errmsg = redsem__errbuf(c), .rc = REDSEM_OK,
                         .until_ns = INT64_MAX, .hard_ns = INT64_MAX, .lead = true,
                         .cancel = stop};
    me.next = c->waiters;
    c->waiters = &me;
    lead(c, &me);
}

int redsem__blpop(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                  int64_t hard_deadline_ns, int64_t since_ns, bool *signaled)
{
    *signaled = false;
    if (c->ep.kind == REDSEM__EP_CLUSTER)
        return redsem__blpop_alone(c, key, keylen, wait_ms, hard_deadline_ns, signaled);
    int64_t now = redsem__now_ns();
    redsem__waiter w = {.key = key, .keylen = keylen, .errmsg = redsem__errbuf(c),
                        .cancel = redsem__cancel, .rc = REDSEM_OK, .since_ns = since_ns};
    w.until_ns = now + (wait_ms < 1 ? 1 : wait_ms) * REDSEM__NS_PER_MS;
    w.hard_ns = hard_deadline_ns;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);

    pthread_mutex_lock(&c->wake_mu);
    if (redsem__cancelled()) {
        /* checked under wake_mu: redsem__wake_cancelled() either sees this waiter or ran
         * before it and set the flag first */
        pthread_mutex_unlock(&c->wake_mu);
        pthread_cond_destroy(&w.cv);
        return REDSEM_OK;
    }
    bool poke = false;
    if (!c->wake_leading) {
        c->wake_leading = true;
        w.lead = true;
    } else if (c->wake_blocked && !c->wake_poked &&
               (!watched(c, &w) || w.until_ns < c->wake_until || w.hard_ns < c->wake_hard)) {
        /* a list the running BLPOP does not watch, or a wait that ends before it does */
        c->wake_poked = true;
        poke = true;
    }
    w.next = c->waiters;
    c->waiters = &w;
    if (poke) {
        /* end the running BLPOP, so that the next one watches this list too */
        pthread_mutex_unlock(&c->wake_mu);
        char saved[REDSEM__ERRMSG_LEN];
        redsem__text_copy(saved, w.errmsg);
        if (redsem__routed(c, false, c->wake_ctl, strlen(c->wake_ctl), REDSEM__REQ_RETRY, NULL,
                           call_poke, c->wake_ctl) != REDSEM_OK)
            redsem__text_copy(w.errmsg, saved); /* the wait times out instead */
        pthread_mutex_lock(&c->wake_mu);
    }
    /* a waiter's safety net, should the leader be late: its own deadline + the command
     * timeout + 1 s (the leader's BLPOP gives up by then) */
    int64_t give_up = (w.hard_ns < w.until_ns ? w.hard_ns : w.until_ns) +
                      (c->command_timeout_ms + 1000) * REDSEM__NS_PER_MS;
    struct timespec ts = {(time_t)(give_up / 1000000000), (long)(give_up % 1000000000)};
    while (!w.done && !w.lead) {
        if (pthread_cond_timedwait(&w.cv, &c->wake_mu, &ts) != 0 && !w.done && !w.lead) {
            unlink_waiter(c, &w);
            w.done = true;
        }
    }
    if (!w.done)
        lead(c, &w);
    pthread_mutex_unlock(&c->wake_mu);
    pthread_cond_destroy(&w.cv);
    *signaled = w.signaled;
    return w.rc;
}

int redsem__wake_park(redsem_client *c, const char *key, size_t keylen, int64_t wait_ms,
                      int64_t hard_deadline_ns, int64_t since_ns, const atomic_bool *cancel,
                      char *errmsg, redsem__park_fn on_done, bool (*need_lead)(void *arg),
                      void *arg, const atomic_bool *stop)
{
    redsem__waiter *w = redsem__calloc(1, sizeof *w);
    char *k = redsem__memdup0(key, keylen);
    if (w == NULL || k == NULL) {
        redsem__free(w);
        redsem__free(k);
        return REDSEM_ENOMEM;
    }
    int64_t now = redsem__now_ns();
    w->key = k;
    w->keylen = keylen;
    w->errmsg = errmsg;
    w->cancel = cancel;
    w->rc = REDSEM_OK;
    w->until_ns = now + (wait_ms < 1 ? 1 : wait_ms) * REDSEM__NS_PER_MS;
    w->hard_ns = hard_deadline_ns;
    w->since_ns = since_ns;
    w->on_done = on_done;
    w->need_lead = need_lead;
    w->arg = arg;

    pthread_mutex_lock(&c->wake_mu);
    if (cancel != NULL && atomic_load(cancel)) {
        /* checked under wake_mu, as redsem__blpop does */
        pthread_mutex_unlock(&c->wake_mu);
        redsem__free(k);
        redsem__free(w);
        return 1;
    }
    bool lead_now = false, poke = false;
    if (!c->wake_leading) {
        c->wake_leading = true;
        lead_now = true;
    } else if (c->wake_blocked && !c->wake_poked &&
               (!watched(c, w) || w->until_ns < c->wake_until || w->hard_ns < c->wake_hard)) {
        c->wake_poked = true;
        poke = true;
    }
    w->next = c->waiters;
    c->waiters = w;
    /* from here w belongs to the wait: it may end (and be freed) whenever wake_mu is free */
    if (poke) {
        pthread_mutex_unlock(&c->wake_mu);
        char saved[REDSEM__ERRMSG_LEN];
        redsem__text_copy(saved, redsem__errbuf(c));
        if (redsem__routed(c, false, c->wake_ctl, strlen(c->wake_ctl), REDSEM__REQ_RETRY, NULL,
                           call_poke, c->wake_ctl) != REDSEM_OK)
            redsem__text_copy(redsem__errbuf(c), saved); /* the wait times out instead */
        return REDSEM_OK;
    }
    if (lead_now)
        lead_parked(c, stop);
    pthread_mutex_unlock(&c->wake_mu);
    return REDSEM_OK;
}

void redsem__wake_lead(redsem_client *c, const atomic_bool *stop)
{
    pthread_mutex_lock(&c->wake_mu);
    if (!c->wake_leading && any_parked(c) && !(stop != NULL && atomic_load(stop))) {
        c->wake_leading = true;
        lead_parked(c, stop);
    }
    pthread_mutex_unlock(&c->wake_mu);
}

int redsem__wake_waiters(redsem_client *c)
{
    int n = 0;
    pthread_mutex_lock(&c->wake_mu);
    for (const redsem__waiter *x = c->waiters; x != NULL; x = x->next)
        n += x->key != NULL;
    pthread_mutex_unlock(&c->wake_mu);
    return n;
}

void redsem__wake_cancelled(redsem_client *c)
{
    bool poke = false;
    pthread_mutex_lock(&c->wake_mu);
    for (redsem__waiter **p = &c->waiters; *p != NULL;) {
        redsem__waiter *x = *p;
        if (x->cancel == NULL || !atomic_load(x->cancel)) {
            p = &x->next;
            continue;
        }
        if (x->lead || x->key == NULL) {
            /* the leader, inside its BLPOP: end it (its loop then sees the flag) */
            if (c->wake_blocked && !c->wake_poked) {
                c->wake_poked = true;
                poke = true;
            }
            p = &x->next;
            continue;
        }
        *p = x->next;
        x->done = true;
        if (x->on_done != NULL)
            end_parked(x);
        else
            pthread_cond_signal(&x->cv);
    }
    pthread_mutex_unlock(&c->wake_mu);
    if (poke)
        (void)redsem__routed(c, false, c->wake_ctl, strlen(c->wake_ctl), REDSEM__REQ_RETRY, NULL,
                             call_poke, c->wake_ctl);
}
