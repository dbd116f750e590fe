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
 * A fair or locked waiter (since 0.4.3) is woken through its client's id list,
 * PREFIXwake:<tag>:ids, whose elements say which waiters were granted ("<id> <meta key>",
 * prelude.lua's grant_heads, pushed by the client of the call that granted them:
 * redsem__wake_push); a push that makes the list non-empty also rings its bell
 * (the same name + ":bell"), and the waiters' key in the BLPOP is that bell: one key for
 * every fair waiter of the client. A leader that pops the bell drains the list
 * (wake_drain.lua, up to WAKE_DRAIN_MAX at a time, again while a drain comes back full) and
 * hands each element to the waiter it names. The ids stay in the list until drained, so a
 * bell lost with a dropped BLPOP (our own deadline cut it, or a fault) loses nothing: the
 * next round, or the next leader, drains first (wake_drain_due). An element whose waiter is
 * not registered (between two attempts: its attempt may have begun before the grant) is kept
 * for a while (WAKE_PEND_MAX, WAKE_PEND_NS), and that waiter's next registration finds it
 * and ends at once: such a wake-up is not lost to the fallback either.
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
/* ids popped while their waiter was between attempts: how many are kept, and how long */
#define WAKE_PEND_MAX 256
#define WAKE_PEND_NS (10000 * REDSEM__NS_PER_MS)

struct redsem__wake_pend {
    uint64_t h;    /* key_hash() of the element ("<id> <meta key>", a direct grant's numbers
                      taken off) */
    int64_t at_ns; /* 0: free */
    redsem__wake_grant grant; /* the direct grant it carried (token 0: none) */
    char *elem;    /* its bytes (heap; NULL: none, its grant then dropped), compared before a
                      waiter takes it: the hash alone could give one waiter another's grant */
    size_t len;
};

/* registered waiters the array holds at first (it grows by doubling) */
#define WAKE_WV_MIN 64
/* ids one drain of the client's id list takes at most (wake_drain.lua) */
#define WAKE_DRAIN_MAX 256
/* the drained elements remembered, so that a bell that gives one of them again is ignored */
#define WAKE_RECENT_MAX 256
/* an element as long as grant_heads makes it: "<id> <meta key>" (the key < 1024 bytes), and
 * a direct grant's " <token> <server us> <lease ms>" */
#define WAKE_ELEM_MAX (REDSEM_ID_LEN + 1 + 1024 + 3 * 21)

/* FNV-1a, 64 bits. Two keys with the same hash and length count as one list: for any two of
 * the at most WAKE_KEYS_MAX keys of a round a collision has a chance of about 2^-45, and it
 * would only leave a waiter to its fallback. */
static uint64_t key_hash(const char *k, size_t len)
{
    uint64_t h = 14695981039346656037u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)k[i]) * 1099511628211u;
    return h;
}

typedef struct redsem__waiter {
    int slot;        /* its entry in c->wv while registered */
    const char *key; /* NULL: a leader that waits for nothing of its own (redsem__wake_park) */
    size_t keylen;
    int64_t until_ns; /* its wait ends (BLPOP timeout) */
    int64_t since_ns; /* it began waiting (its acquire's start): the oldest on a list wins */
    int64_t hard_ns;  /* and at the latest (our clock) */
    const char *elem; /* NULL, or a fair waiter's element on the id list (wake_id) */
    size_t elemlen;
    redsem__wake_grant *grant; /* NULL, or where a direct grant its element carries goes */
    uint64_t hash, elemh; /* key_hash() of key and elem (0 without), made once (enlist) */
    char *errmsg;     /* its thread's error text */
    pthread_cond_t cv;
    const atomic_bool *cancel; /* its operation's cancel flag (async.c), or NULL */
    bool lead, done, signaled;
    int rc;
    /* A parked wait (the event-loop API: no thread sleeps on cv): on_done(arg, rc, signaled)
     * runs when it ends, under wake_mu, on the leader's thread; need_lead(arg) when the lead
     * must pass and no thread waits. Heap-allocated with its key, freed by whoever ends it. */
    redsem__park_fn on_done;
    bool (*need_lead)(void *arg);
    void *arg;
} redsem__waiter;

/* A registered waiter's entry in c->wv, with what the leader's rounds read of it: the rounds
 * scan this array, not the waiters (on threads' stacks and the heap, one cache miss each:
 * with 600 waiters and a round per wake-up, most of the client's time). */
typedef struct redsem__wentry {
    redsem__waiter *w;
    uint64_t hash; /* key_hash(key) */
    size_t keylen; /* 0: no key (a parked waiters' leader) */
    int64_t until_ns, hard_ns, since_ns;
    uint64_t elemh; /* key_hash(w->elem), if w->elem */
    bool parked;  /* w->on_done != NULL */
    bool watched; /* its list is in the running BLPOP's keys */
    bool woken;   /* given an element this round */
} redsem__wentry;


/* Under wake_mu: register w. A wait with a key leaves room for one more entry after its
 * own, so that lead_parked()'s (no key) never needs memory. */
static int add_waiter(redsem_client *c, redsem__waiter *w)
{
    if (w->key != NULL && c->wn + 2 > c->wcap) {
        int cap = c->wcap * 2;
        redsem__wentry *v = redsem__realloc(c->wv, (size_t)cap * sizeof *v);
        if (v == NULL)
            return REDSEM_ENOMEM;
        c->wv = v;
        c->wcap = cap;
    }
    redsem__wentry *e = &c->wv[c->wn];
    *e = (redsem__wentry){.w = w, .hash = w->hash, .keylen = w->key != NULL ? w->keylen : 0,
                          .until_ns = w->until_ns, .hard_ns = w->hard_ns,
                          .since_ns = w->since_ns, .elemh = w->elemh,
                          .parked = w->on_done != NULL};
    w->slot = c->wn++;
    c->wnparked += e->parked;
    return REDSEM_OK;
}

/* Under wake_mu: unregister the waiter of entry i (the last entry takes its place). */
static void remove_at(redsem_client *c, int i)
{
    c->wnparked -= c->wv[i].parked;
    c->wv[i].w->slot = -1;
    c->wv[i] = c->wv[--c->wn];
    if (i < c->wn)
        c->wv[i].w->slot = i;
}

static void unlink_waiter(redsem_client *c, redsem__waiter *w)
{
    if (w->slot >= 0 && w->slot < c->wn && c->wv[w->slot].w == w)
        remove_at(c, w->slot);
}

/* Under wake_mu: end a parked waiter (its callback, then its memory). */
static void end_parked(redsem__waiter *x)
{
    x->on_done(x->arg, x->rc, x->signaled);
    redsem__free((char *)x->key);
    redsem__free((char *)x->elem);
    redsem__free(x);
}

/* Under wake_mu: whether any parked waiter is registered. */
static bool any_parked(const redsem_client *c)
{
    return c->wnparked > 0;
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
    /* this client's list of fair wake-ups: other random bytes than the control list's */
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
    len = c->prefix_len + sizeof "wake:" + sizeof hex + sizeof ":ids";
    c->wake_ids = redsem__malloc(len);
    if (c->wake_ids == NULL)
        return REDSEM_ENOMEM;
    snprintf(c->wake_ids, len, "%swake:%s:ids", c->prefix, hex);
    len += sizeof ":bell";
    c->wake_bell = redsem__malloc(len);
    if (c->wake_bell == NULL)
        return REDSEM_ENOMEM;
    snprintf(c->wake_bell, len, "%s:bell", c->wake_ids);
    c->wake_keys = redsem__calloc(WAKE_KEYS_MAX, sizeof *c->wake_keys);
    c->wake_lens = redsem__calloc(WAKE_KEYS_MAX, sizeof *c->wake_lens);
    c->wake_pend = redsem__calloc(WAKE_PEND_MAX, sizeof *c->wake_pend);
    c->wv = redsem__calloc(WAKE_WV_MIN, sizeof *c->wv);
    c->wcap = WAKE_WV_MIN;
    c->wake_recent = redsem__calloc(WAKE_RECENT_MAX, sizeof *c->wake_recent);
    return c->wake_keys != NULL && c->wake_lens != NULL && c->wake_pend != NULL &&
                   c->wv != NULL && c->wake_recent != NULL
               ? REDSEM_OK
               : REDSEM_ENOMEM;
}

/* Under wake_mu: keep an element ("<id> <meta key>", len bytes, its hash h; g: the direct
 * grant it carried) drained for a waiter not registered now (in place of the oldest kept, or
 * of one too old). Its bytes are kept too: only the waiter it names may take it (ids chosen
 * by callers can be made to collide in a 64-bit FNV hash, and a grant given to the wrong
 * waiter would be a permit the server never gave it). Out of memory, only the hash is kept,
 * without the grant: a waiter with a colliding hash then gets a spurious wake-up at most. */
static void pend_add(redsem_client *c, const char *elem, size_t len, uint64_t h,
                     const redsem__wake_grant *g, int64_t now)
{
    struct redsem__wake_pend *slot = &c->wake_pend[0];
    for (int i = 0; i < WAKE_PEND_MAX; i++) {
        struct redsem__wake_pend *p = &c->wake_pend[i];
        if (p->at_ns == 0 || now - p->at_ns > WAKE_PEND_NS) {
            slot = p;
            break;
        }
        if (p->at_ns < slot->at_ns)
            slot = p;
    }
    char *old = slot->elem;
    slot->elem = NULL; /* before the free: a child forked in between frees it once */
    redsem__free(old);
    slot->h = h;
    slot->at_ns = now > 0 ? now : 1;
    slot->elem = redsem__memdup0(elem, len);
    slot->len = len;
    slot->grant = slot->elem != NULL ? *g : (redsem__wake_grant){0, 0, 0};
}

/* Under wake_mu: whether an element drained for waiter w is kept (it is then taken, its
 * direct grant, if any, copied to *w->grant when that is not NULL). */
static bool pend_take(redsem_client *c, const redsem__waiter *w, int64_t now)
{
    for (int i = 0; i < WAKE_PEND_MAX; i++) {
        struct redsem__wake_pend *p = &c->wake_pend[i];
        if (p->at_ns == 0 || p->h != w->elemh ||
            (p->elem != NULL && (p->len != w->elemlen || memcmp(p->elem, w->elem, p->len) != 0)))
            continue;
        bool fresh = now - p->at_ns <= WAKE_PEND_NS;
        p->at_ns = 0;
        if (fresh && w->grant != NULL)
            *w->grant = p->grant;
        char *old = p->elem;
        p->elem = NULL; /* before the free: a child forked in between frees it once */
        redsem__free(old);
        if (fresh)
            return true;
        /* a stale one: a fresh one for the same waiter may be kept too */
    }
    return false;
}

/* The digits of a decimal field that ends at end (exclusive) and starts after a space, at
 * most 19 (a uint64 token or a server time in us): its start, or NULL. */
static const char *num_field(const char *start, const char *end, uint64_t *v)
{
    const char *p = end;
    while (p > start && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == end || end - p > 19 || p == start || p[-1] != ' ')
        return NULL;
    uint64_t x = 0;
    for (const char *d = p; d < end; d++)
        x = x * 10 + (uint64_t)(*d - '0');
    *v = x;
    return p - 1; /* the space before it */
}

/* An element of the client's id list: "<id> <meta key>", or a direct grant's "<id> <meta key>
 * <token> <server us> <lease ms>" (prelude.lua's grant_heads). A meta key ends in "}:meta",
 * never in a digit, so the two shapes cannot be mistaken for each other. *len becomes the
 * length of "<id> <meta key>", *g the grant (token 0: none). */
static void split_elem(const char *elem, size_t *len, redsem__wake_grant *g)
{
    *g = (redsem__wake_grant){0, 0, 0};
    const char *end = elem + *len;
    uint64_t lease = 0, us = 0, tok = 0;
    const char *sp1 = num_field(elem, end, &lease);
    const char *sp2 = sp1 != NULL ? num_field(elem, sp1, &us) : NULL;
    const char *sp3 = sp2 != NULL ? num_field(elem, sp2, &tok) : NULL;
    if (sp3 == NULL || tok == 0 || us == 0 || us > INT64_MAX || lease == 0 ||
        lease > INT64_MAX)
        return;
    *len = (size_t)(sp3 - elem);
    g->token = tok;
    g->server_us = (int64_t)us;
    g->lease_ms = (int64_t)lease;
}

void redsem__wake_free(redsem_client *c)
{
    if (c->pid != getpid()) {
        /* a forked child: one thread; the parent's may have held wake_mu at fork, so no lock */
        for (int i = 0; c->wv != NULL && i < c->wn; i++) {
            redsem__waiter *x = c->wv[i].w;
            if (c->wv[i].parked) { /* heap: a parked wait (a thread's is on its stack) */
                redsem__free((char *)x->key);
                redsem__free((char *)x->elem);
                redsem__free(x);
            }
        }
        c->wn = 0;
        /* the copies of a round the parent's leader was in (NULL once freed; its control
         * list's name, which the leader puts after them, is the client's) */
        for (int i = 0; c->wake_keys != NULL && i < WAKE_KEYS_MAX; i++)
            if (c->wake_keys[i] != NULL && c->wake_keys[i] != c->wake_ctl)
                redsem__free((char *)c->wake_keys[i]);
    }
    redsem__free(c->wv);
    redsem__free(c->wake_recent);
    redsem__free(c->wake_keys);
    redsem__free(c->wake_lens);
    for (int i = 0; c->wake_pend != NULL && i < WAKE_PEND_MAX; i++)
        redsem__free(c->wake_pend[i].elem);
    redsem__free(c->wake_pend);
    redsem__free(c->wake_ids);
    redsem__free(c->wake_bell);
    redsem__free(c->wake_ctl);
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

/* Under wake_mu: whether a waiter on the list key (hash h) is in the running BLPOP. */
static bool watched(const redsem_client *c, uint64_t h, size_t keylen)
{
    for (int i = 0; i < c->wn; i++)
        if (c->wv[i].watched && c->wv[i].hash == h && c->wv[i].keylen == keylen)
            return true;
    return false;
}

/* Under wake_mu: give an element drained from the client's id list to the waiter it names
 * (with the direct grant it carries, if any), or keep it for a while if that waiter is not
 * registered now. */
static void wake_id(redsem_client *c, const char *elem, size_t len, int64_t now)
{
    redsem__wake_grant g;
    split_elem(elem, &len, &g);
    uint64_t h = key_hash(elem, len);
    for (int i = 0; i < c->wn; i++) {
        redsem__wentry *e = &c->wv[i];
        if (e->elemh == h && !e->woken && e->w->elem != NULL && e->w->elemlen == len &&
            memcmp(e->w->elem, elem, len) == 0) {
            e->woken = true;
            if (e->w->grant != NULL)
                *e->w->grant = g;
            return;
        }
    }
    pend_add(c, elem, len, h, &g, now);
}

/* One round of the leader: the keys of its BLPOP (copies in c->wake_keys, their lengths in
 * c->wake_lens, their hashes in khash, their indexes by hash in set: open addressing) and
 * what the round got. */
typedef struct lead_round {
    int set[WAKE_SET_SIZE];
    uint64_t khash[WAKE_KEYS_MAX];
    int nkeys;
    size_t bell_len; /* the client's bell (the same every round) */
    uint64_t bell_hash;
    /* this round drains the id list instead of a BLPOP: after the bell, after a drain that
     * came back full, after a BLPOP dropped with its connection (its bell may be lost); the
     * client's flag, so that the next leader does it if this one stops */
    bool drain;
    bool with_bell;      /* this round's BLPOP watches the bell */
    int64_t until, hard; /* the earliest wait's end, and hard deadline */
    int which;           /* the key the BLPOP popped from (-1 none; -2 our deadline cut it) */
    char val[WAKE_ELEM_MAX + 1]; /* what the BLPOP popped */
    redisReply *ids;     /* a drain's */
    bool drained;
} lead_round;

/* Under wake_mu: the round's keys, each registered list once, with the earliest wait's end
 * and hard deadline, each entry marked watched if its list is in. REDSEM_OK or
 * REDSEM_ENOMEM (the deadlines are still found). */
static int round_keys(redsem_client *c, const redsem__waiter *me, lead_round *r)
{
    const char **keys = c->wake_keys; /* the client's: one leader at a time (wake_leading) */
    size_t *lens = c->wake_lens;
    int rc = REDSEM_OK;
    r->nkeys = 0;
    for (int i = 0; i < WAKE_SET_SIZE; i++)
        r->set[i] = -1;
    /* a cancelled wait ends now: redsem__wake_cancelled() ends the others' at once (the
     * leader's own, by a 1 ms BLPOP) */
    r->until = me->cancel != NULL && atomic_load(me->cancel) ? 0 : INT64_MAX;
    r->hard = INT64_MAX;
    for (int i = 0; i < c->wn; i++) {
        redsem__wentry *e = &c->wv[i];
        if (e->keylen == 0)
            continue; /* a parked waiters' leader: nothing of its own */
        if (e->until_ns < r->until)
            r->until = e->until_ns;
        if (e->hard_ns < r->hard)
            r->hard = e->hard_ns;
        e->watched = false;
        if (rc != REDSEM_OK)
            continue;
        /* a key already in this BLPOP (the waiters of one semaphore share its list): a
         * hash set of the keys so far, so that a round costs O(waiters) */
        uint32_t slot = (uint32_t)e->hash & (WAKE_SET_SIZE - 1);
        bool dup = false;
        while (r->set[slot] >= 0) {
            int k = r->set[slot];
            if (r->khash[k] == e->hash && lens[k] == e->keylen) {
                dup = true;
                break;
            }
            slot = (slot + 1) & (WAKE_SET_SIZE - 1);
        }
        /* the bell always has a place: it stands for every fair waiter of the client */
        bool bell = e->hash == r->bell_hash && e->keylen == r->bell_len;
        if (!dup && (r->nkeys < WAKE_KEYS_MAX - 2 || (bell && r->nkeys < WAKE_KEYS_MAX - 1))) {
            /* a copy: a waiter that gives up (its safety net) takes its key with it */
            char *k = redsem__memdup0(e->w->key, e->keylen);
            if (k == NULL) {
                rc = REDSEM_ENOMEM;
                continue;
            }
            keys[r->nkeys] = k;
            lens[r->nkeys] = e->keylen;
            r->khash[r->nkeys] = e->hash;
            r->set[slot] = r->nkeys++;
            e->watched = true;
        } else if (dup) {
            e->watched = true;
        }
    }
    r->with_bell = false;
    for (int k = 0; k < r->nkeys && !r->with_bell; k++)
        r->with_bell = r->khash[k] == r->bell_hash && lens[k] == r->bell_len;
    return rc;
}

/* Under wake_mu (let go meanwhile): the round's BLPOP on its keys and the control list, or
 * its drain of the id list, on the wait lane *l (borrowed first if NULL). Its status. */
static int round_wait(redsem_client *c, lead_round *r, redsem__lane **l)
{
    const char **keys = c->wake_keys;
    size_t *lens = c->wake_lens;
    int rc = REDSEM_OK;
    keys[r->nkeys] = c->wake_ctl; /* last: a wake-up's element is popped first */
    lens[r->nkeys] = strlen(c->wake_ctl);
    /* a drain does not block: a new wait needs no poke, the next BLPOP sees it */
    c->wake_blocked = !r->drain;
    c->wake_poked = false;
    c->wake_until = r->until;
    c->wake_hard = r->hard;
    pthread_mutex_unlock(&c->wake_mu);
    if (*l == NULL)
        rc = redsem__lane_get(c, true, l);
    if (rc == REDSEM_OK) {
        int64_t now = redsem__now_ns();
        int64_t wait_ms = r->until > now ? (r->until - now + REDSEM__NS_PER_MS - 1) /
                                               REDSEM__NS_PER_MS : 1;
        redsem__node *n = redsem__topo_node(&(*l)->topo, NULL, 0);
        (*l)->ctx.errmsg[0] = '\0';
        /* reconnects too end by the earliest cut; a drain (which does not wait) has
         * its command timeout: cut, it would fail every wait and lose what it took */
        (*l)->ctx.deadline_cap_ns = r->drain ? INT64_MAX : r->hard;
        (*l)->ctx.wait_cap_ns = 0;
        if (r->drain) {
            redsem__args ka;
            redsem__args_init(&ka);
            redsem__args_str(&ka, c->wake_ids);
            redsem__args_i64(&ka, WAKE_DRAIN_MAX);
            rc = redsem__node_eval(n, REDSEM__SCRIPT_WAKE_DRAIN, 1, &ka,
                                   REDSEM__REQ_RETRY, NULL, &r->ids);
            if (rc == REDSEM_OK && r->ids->type != REDIS_REPLY_ARRAY) {
                freeReplyObject(r->ids);
                r->ids = NULL;
                rc = redsem__ctx_err(&(*l)->ctx, REDSEM_EPROTO, "wake_drain: unexpected reply");
            }
            r->drained = rc == REDSEM_OK;
        } else {
            rc = redsem__node_blpop_many(n, keys, lens, r->nkeys + 1, wait_ms, r->hard,
                                         &r->which, r->val, sizeof r->val);
        }
    }
    pthread_mutex_lock(&c->wake_mu);
    c->wake_blocked = false;
    return rc;
}

/* Under wake_mu: give what the round got (rc: its status). One element popped is one
 * wake-up. An id (the client's id list) goes to the waiter with that id, and is kept for a
 * while if none is registered now. Any other element goes to the longest-waiting waiter on
 * its list, by its acquire's start (a basic waiter that woke by its deadline, or lost its
 * permit to a barging acquire, registers anew but keeps its age; on a tie the first found);
 * the others on the same list (basic: one list per semaphore) wait for theirs. The bell means
 * more may be queued behind its element (a busy server grants faster than one BLPOP each):
 * the next round drains the list, and so on while a drain comes back full. */
static void round_give(redsem_client *c, lead_round *r, int rc, int64_t now)
{
    const size_t *lens = c->wake_lens;
    bool popped = rc == REDSEM_OK && r->which >= 0 && r->which < r->nkeys;
    if (r->drained) {
        for (size_t j = 0; j < r->ids->elements; j++) {
            const redisReply *x = r->ids->element[j];
            if (x->type != REDIS_REPLY_STRING)
                continue;
            uint64_t h = key_hash(x->str, x->len);
            /* the list's head may be what a bell gave already (given once, not twice) */
            bool given = j == 0 && c->wake_skip != 0 && h == c->wake_skip;
            c->wake_skip = 0;
            if (given)
                continue;
            c->wake_recent[c->wake_recent_next++ % WAKE_RECENT_MAX] = h;
            wake_id(c, x->str, x->len, now);
        }
        c->wake_skip = 0;
        c->wake_drain_due = r->ids->elements >= WAKE_DRAIN_MAX;
        freeReplyObject(r->ids);
    } else if (rc != REDSEM_OK || r->which == -2) {
        /* a connection dropped with the BLPOP: a bell it popped is lost, not the ids */
        if (r->with_bell || r->drain)
            c->wake_drain_due = true;
    } else if (popped && r->khash[r->which] == r->bell_hash && lens[r->which] == r->bell_len) {
        /* the bell, with the element that rang it: given now (unless a drain gave it
         * already: then it is forgotten), and the list drained next */
        size_t vl = strlen(r->val);
        uint64_t h = key_hash(r->val, vl);
        bool given = false;
        for (int k = 0; k < WAKE_RECENT_MAX && !given; k++)
            if (c->wake_recent[k] == h) {
                c->wake_recent[k] = 0;
                given = true;
            }
        if (!given && vl > 0) {
            wake_id(c, r->val, vl, now);
            c->wake_skip = h;
        }
        c->wake_drain_due = true;
    } else if (popped) {
        int woken = -1;
        for (int i = 0; i < c->wn; i++) {
            const redsem__wentry *e = &c->wv[i];
            if (e->keylen == lens[r->which] && e->hash == r->khash[r->which] && !e->woken &&
                (woken < 0 || e->since_ns < c->wv[woken].since_ns))
                woken = i;
        }
        if (woken >= 0)
            c->wv[woken].woken = true;
    }
}

/* Under wake_mu: end the waits the round ended (rc: its status; l: the wait lane, NULL if
 * none was had; cut: the BLPOP was cut before any wait ended): each is unregistered, told
 * (its thread signaled, or a parked wait's callback run), its outcome and error text set. */
static void round_end(redsem_client *c, redsem__waiter *me, redsem__lane *l, int rc, bool cut,
                      int64_t now)
{
    for (int i = 0; i < c->wn;) {
        const redsem__wentry *e = &c->wv[i];
        redsem__waiter *x = e->w;
        bool fin = false;
        if (rc != REDSEM_OK) {
            x->rc = rc;
            redsem__text_copy(x->errmsg, l != NULL ? l->ctx.errmsg : me->errmsg);
            fin = true;
        } else if (e->woken) {
            x->signaled = true;
            REDSEM__COUNT(&l->ctx, wakeups, 1);
            fin = true;
        } else if (e->keylen == 0) {
            /* a parked waiters' leader: until none is left, or its owner stops it */
            fin = !any_parked(c) || (x->cancel != NULL && atomic_load(x->cancel));
        } else if (cut || now >= e->until_ns || now >= e->hard_ns ||
                   (x == me && x->cancel != NULL && atomic_load(x->cancel))) {
            fin = true;
        }
        if (!fin) {
            i++;
            continue;
        }
        remove_at(c, i); /* the last entry comes to i: looked at next */
        x->done = true;
        if (x->on_done != NULL)
            end_parked(x);
        else if (x != me)
            pthread_cond_signal(&x->cv);
    }
}

/* Under wake_mu: free the copies of a round's nkeys keys, each entry NULL as it is freed (and
 * the control list's): a child forked meanwhile frees the copies it finds
 * (redsem__wake_free), never one twice. */
static void round_free_keys(redsem_client *c, int nkeys)
{
    const char **keys = c->wake_keys;
    keys[nkeys] = NULL;
    for (int i = 0; i < nkeys; i++) {
        const char *k = keys[i];
        keys[i] = NULL;
        redsem__free((char *)k);
    }
}

/* Under wake_mu (let go meanwhile), the leader's own wait done: give its wait lane l back
 * (last: the last round's status), and the role to a waiting thread; parked waiters alone
 * ask their owner for a thread (redsem__wake_park's need_lead). */
static void pass_lead(redsem_client *c, redsem__lane *l, int last)
{
    if (l != NULL) {
        pthread_mutex_unlock(&c->wake_mu);
        redsem__lane_put(c, l, last);
        pthread_mutex_lock(&c->wake_mu);
    }
    redsem__waiter *next = NULL;
    for (int i = 0; i < c->wn && next == NULL; i++)
        if (!c->wv[i].parked)
            next = c->wv[i].w;
    if (next != NULL) {
        next->lead = true;
        pthread_cond_signal(&next->cv);
    } else {
        c->wake_leading = false;
        /* the first owner that can take it (one being freed says no) */
        for (int i = 0; i < c->wn; i++)
            if (c->wv[i].w->need_lead(c->wv[i].w->arg))
                break;
    }
}

/* The leader's loop, with wake_mu held (released around each BLPOP), until its own wait is
 * done; then the role goes to the next waiter. */
static void lead(redsem_client *c, redsem__waiter *me)
{
    lead_round r;
    redsem__lane *l = NULL;
    int last = REDSEM_OK;
    r.bell_len = strlen(c->wake_bell);
    r.bell_hash = key_hash(c->wake_bell, r.bell_len);
    while (!me->done) {
        r.drain = c->wake_drain_due;
        int rc = round_keys(c, me, &r);
        r.which = -1;
        r.val[0] = '\0';
        r.ids = NULL;
        r.drained = false;
        if (rc == REDSEM_OK)
            rc = round_wait(c, &r, &l);
        last = rc;
        int64_t now = redsem__now_ns();
        /* Nothing popped before any wait ended: the wait was cut (UNBLOCKED from a demoted
         * primary): every waiter goes back to its acquire loop, which tries again (on the new
         * primary), as a lone wait would. Our own hard deadline (which == -2) ends only the
         * waits that reached theirs. */
        bool cut = rc == REDSEM_OK && !r.drained && r.which == -1 && now < r.until;
        round_give(c, &r, rc, now);
        round_end(c, me, l, rc, cut, now);
        round_free_keys(c, r.nkeys);
        if (!me->done && me->key == NULL &&
            (!any_parked(c) || (me->cancel != NULL && atomic_load(me->cancel)))) {
            unlink_waiter(c, me);
            me->done = true;
        }
    }
    pass_lead(c, l, last);
}

/* Under wake_mu, with the role taken (wake_leading set by the caller): lead on this thread,
 * for the parked waiters, until none is left or *stop is set (then the role passes on, as
 * when a thread's own wait ends: redsem__wake_cancelled() ends the running BLPOP for it). */
static void lead_parked(redsem_client *c, const atomic_bool *stop)
{
    redsem__waiter me = {.key = NULL, .errmsg = redsem__errbuf(c), .rc = REDSEM_OK,
                         .until_ns = INT64_MAX, .hard_ns = INT64_MAX, .lead = true,
                         .cancel = stop};
    (void)add_waiter(c, &me); /* cannot fail: a wait with a key leaves room for it */
    lead(c, &me);
}

/* Under wake_mu: register w, unless its cancel flag is set (1: checked under wake_mu, so
 * that redsem__wake_cancelled() either sees w or ran before it and set the flag first) or
 * an element drained for it is kept (2: its wake-up came while it was between attempts; the
 * wait is over, signaled); or REDSEM_ENOMEM. Registered: *lead says it takes the lead (none
 * exists), *poke that the running BLPOP must be ended for it (poke_leader(), without
 * wake_mu): a list that BLPOP does not watch, or a wait that ends before it does. */
static int enlist(redsem_client *c, redsem__waiter *w, int64_t now, bool *lead, bool *poke)
{
    if (w->cancel != NULL && atomic_load(w->cancel))
        return 1;
    w->hash = key_hash(w->key, w->keylen);
    w->elemh = w->elem != NULL ? key_hash(w->elem, w->elemlen) : 0;
    if (w->elem != NULL && pend_take(c, w, now))
        return 2;
    *lead = !c->wake_leading;
    *poke = !*lead && c->wake_blocked && !c->wake_poked &&
            (!watched(c, w->hash, w->keylen) || w->until_ns < c->wake_until ||
             w->hard_ns < c->wake_hard);
    if (add_waiter(c, w) != REDSEM_OK)
        return REDSEM_ENOMEM;
    c->wake_leading = true;
    c->wake_poked = c->wake_poked || *poke;
    return REDSEM_OK;
}

/* End the running BLPOP by a push to the control list, so that the next one watches a new
 * wait; a failed push leaves errmsg as it was (the wait times out instead). */
static void poke_leader(redsem_client *c, char *errmsg)
{
    char saved[REDSEM__ERRMSG_LEN];
    redsem__text_copy(saved, errmsg);
    if (redsem__routed(c, false, c->wake_ctl, strlen(c->wake_ctl), REDSEM__REQ_RETRY, NULL,
                       call_poke, c->wake_ctl) != REDSEM_OK)
        redsem__text_copy(errmsg, saved);
}

int redsem__blpop(redsem_client *c, const char *key, size_t keylen, const char *elem,
                  int64_t wait_ms, int64_t hard_deadline_ns, int64_t since_ns, bool *signaled,
                  redsem__wake_grant *grant)
{
    *signaled = false;
    if (c->ep.kind == REDSEM__EP_CLUSTER)
        return redsem__blpop_alone(c, key, keylen, wait_ms, hard_deadline_ns, signaled);
    int64_t now = redsem__now_ns();
    redsem__waiter w = {.key = key, .keylen = keylen, .errmsg = redsem__errbuf(c),
                        .cancel = NULL, .rc = REDSEM_OK, .since_ns = since_ns,
                        .slot = -1};
    w.elem = elem;
    w.elemlen = elem != NULL ? strlen(elem) : 0;
    w.grant = grant;
    w.until_ns = now + (wait_ms < 1 ? 1 : wait_ms) * REDSEM__NS_PER_MS;
    w.hard_ns = hard_deadline_ns;

    bool poke = false;
    pthread_mutex_lock(&c->wake_mu);
    int rc = enlist(c, &w, now, &w.lead, &poke);
    if (rc != REDSEM_OK) {
        pthread_mutex_unlock(&c->wake_mu);
        *signaled = rc == 2; /* 1, cancelled: its loop sees the flag */
        return rc == REDSEM_ENOMEM
                   ? redsem__set_err(c, REDSEM_ENOMEM, "out of memory (registering a wait)")
                   : REDSEM_OK;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    if (poke) {
        pthread_mutex_unlock(&c->wake_mu);
        poke_leader(c, w.errmsg);
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

int redsem__wake_park(redsem_client *c, const char *key, size_t keylen, const char *elem,
                      int64_t wait_ms, int64_t hard_deadline_ns, int64_t since_ns,
                      const atomic_bool *cancel, char *errmsg, redsem__wake_grant *grant,
                      redsem__park_fn on_done, bool (*need_lead)(void *arg), void *arg,
                      const atomic_bool *stop)
{
    redsem__waiter *w = redsem__calloc(1, sizeof *w);
    char *k = redsem__memdup0(key, keylen);
    size_t elemlen = elem != NULL ? strlen(elem) : 0;
    char *el = elem != NULL ? redsem__memdup0(elem, elemlen) : NULL;
    if (w == NULL || k == NULL || (elem != NULL && el == NULL)) {
        redsem__free(w);
        redsem__free(k);
        redsem__free(el);
        return REDSEM_ENOMEM;
    }
    int64_t now = redsem__now_ns();
    w->slot = -1;
    w->key = k;
    w->keylen = keylen;
    w->errmsg = errmsg;
    w->cancel = cancel;
    w->rc = REDSEM_OK;
    w->until_ns = now + (wait_ms < 1 ? 1 : wait_ms) * REDSEM__NS_PER_MS;
    w->hard_ns = hard_deadline_ns;
    w->since_ns = since_ns;
    w->elem = el;
    w->elemlen = elemlen;
    w->grant = grant;
    w->on_done = on_done;
    w->need_lead = need_lead;
    w->arg = arg;

    bool lead_now = false, poke = false;
    pthread_mutex_lock(&c->wake_mu);
    int rc = enlist(c, w, now, &lead_now, &poke);
    if (rc != REDSEM_OK) {
        pthread_mutex_unlock(&c->wake_mu);
        redsem__free(k);
        redsem__free(el);
        redsem__free(w);
        return rc;
    }
    /* from here w belongs to the wait: it may end (and be freed) whenever wake_mu is free */
    if (poke) {
        pthread_mutex_unlock(&c->wake_mu);
        poke_leader(c, redsem__errbuf(c));
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
    for (int i = 0; i < c->wn; i++)
        n += c->wv[i].keylen != 0;
    pthread_mutex_unlock(&c->wake_mu);
    return n;
}

bool redsem__wake_any(redsem_client *c)
{
    pthread_mutex_lock(&c->wake_mu);
    bool any = c->wn > 0;
    pthread_mutex_unlock(&c->wake_mu);
    return any;
}

void redsem__wake_cancelled(redsem_client *c)
{
    bool poke = false;
    pthread_mutex_lock(&c->wake_mu);
    for (int i = 0; i < c->wn;) {
        redsem__waiter *x = c->wv[i].w;
        if (x->cancel == NULL || !atomic_load(x->cancel)) {
            i++;
            continue;
        }
        if (x->lead || x->key == NULL) {
            /* the leader, inside its BLPOP: end it (its loop then sees the flag) */
            if (c->wake_blocked && !c->wake_poked) {
                c->wake_poked = true;
                poke = true;
            }
            i++;
            continue;
        }
        remove_at(c, i);
        x->done = true;
        if (x->on_done != NULL)
            end_parked(x);
        else
            pthread_cond_signal(&x->cv);
    }
    pthread_mutex_unlock(&c->wake_mu);
    if (poke)
        poke_leader(c, redsem__errbuf(c));
}

/* ---------------------------------------------------------------- wake-ups to push */

/* Whether name (len bytes) is an id list of a client with c's key prefix,
 * PREFIXwake:<16 hex digits>:ids, as redsem__wake_init() names them: the only list a
 * kind-'i' wake-up may go to, whatever a meta hash's c: field says. */
static bool id_list_name(const redsem_client *c, const char *name, size_t len)
{
    static const char ids[] = ":ids";
    size_t pl = c->prefix_len, want = pl + 5 + 16 + sizeof ids - 1;
    if (len != want || memcmp(name, c->prefix, pl) != 0 || memcmp(name + pl, "wake:", 5) != 0 ||
        memcmp(name + pl + 5 + 16, ids, sizeof ids - 1) != 0)
        return false;
    for (size_t i = pl + 5; i < pl + 5 + 16; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    return true;
}

bool redsem__wake_push_call(redsem_client *c, const char *sigprefix, const redisReply *r,
                            size_t *from, redsem__wake_call *wc)
{
    const redisReply *kinds[REDSEM__WAKE_PUSH_MAX], *elems[REDSEM__WAKE_PUSH_MAX];
    int k = 0;
    size_t i = *from;
    size_t spl = strlen(sigprefix);
    for (; i + 2 < r->elements && k < REDSEM__WAKE_PUSH_MAX; i += 3) {
        const redisReply *kind = r->element[i], *t = r->element[i + 1], *e = r->element[i + 2];
        char *key = wc->keys[k];
        if (kind->type != REDIS_REPLY_STRING || t->type != REDIS_REPLY_STRING ||
            e->type != REDIS_REPLY_STRING || kind->len != 1 || e->len > 1024)
            continue;
        if (kind->str[0] == 'i' && c->ep.kind != REDSEM__EP_CLUSTER &&
            t->len < REDSEM__WAKE_KEY_MAX && id_list_name(c, t->str, t->len)) {
            memcpy(key, t->str, t->len);
            key[t->len] = '\0';
        } else if (kind->str[0] == 's' && t->len == REDSEM_ID_LEN &&
                   spl + REDSEM_ID_LEN < REDSEM__WAKE_KEY_MAX) {
            char id[REDSEM_ID_LEN + 1];
            memcpy(id, t->str, REDSEM_ID_LEN);
            id[REDSEM_ID_LEN] = '\0';
            if (!redsem__valid_id(id))
                continue;
            snprintf(key, REDSEM__WAKE_KEY_MAX, "%s%s", sigprefix, id);
        } else {
            continue;
        }
        kinds[k] = kind;
        elems[k] = e;
        k++;
    }
    *from = i;
    if (k == 0)
        return false;
    redsem__call_init(&wc->call, REDSEM__SCRIPT_WAKE_PUSH, REDSEM__REQ_RETRY, NULL);
    redsem__args *a = &wc->call.ka;
    for (int j = 0; j < k; j++) {
        redsem__args_str(a, wc->keys[j]);
        if (kinds[j]->str[0] == 'i') {
            size_t kl = strlen(wc->keys[j]);
            memcpy(wc->bells[j], wc->keys[j], kl);
            memcpy(wc->bells[j] + kl, ":bell", sizeof ":bell");
            redsem__args_str(a, wc->bells[j]);
        } else {
            redsem__args_str(a, wc->keys[j]);
        }
    }
    wc->call.nkeys = 2 * k;
    for (int j = 0; j < k; j++) {
        redsem__args_mem(a, kinds[j]->str, 1);
        redsem__args_mem(a, elems[j]->str, elems[j]->len);
    }
    return true;
}

redisReply *redsem__wake_unwrap(redisReply **reply)
{
    redisReply *r = *reply;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len != 4 ||
        memcmp(r->element[0]->str, "wake", 4) != 0)
        return NULL;
    /* the reply is the script's own; the wrapper goes to the caller */
    *reply = r->element[1];
    r->element[1] = NULL;
    return r;
}

int redsem__wake_push(redsem_client *c, const char *sigprefix, redisReply **reply)
{
    redisReply *r = redsem__wake_unwrap(reply);
    if (r == NULL)
        return REDSEM_OK;
    /* a wake-up that cannot be pushed is not this call's failure: the grant stands, and its
     * waiter finds it by its next attempt (acquire.c's poll); keep the caller's error text */
    char saved[REDSEM__ERRMSG_LEN];
    char *err = redsem__errbuf(c);
    memcpy(saved, err, sizeof saved);
    redsem__wake_call wc;
    for (size_t i = 2; redsem__wake_push_call(c, sigprefix, r, &i, &wc);) {
        redisReply *pr = NULL;
        if (redsem__eval(c, wc.call.script, wc.call.nkeys, &wc.call.ka, wc.call.flags, NULL,
                         &pr) == REDSEM_OK)
            freeReplyObject(pr);
    }
    memcpy(err, saved, sizeof saved);
    freeReplyObject(r);
    return REDSEM_OK;
}
