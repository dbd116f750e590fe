/* redsem - the wake-ups a grant carries for its waiters, and the names of a client's id list.
 *
 * A fair or locked waiter (since 0.4.3) is woken through its client's id list,
 * PREFIXwake:<tag>:ids, whose elements say which waiters were granted ("<id> <meta key>",
 * prelude.lua's grant_heads); a push that makes the list non-empty also rings its bell (the
 * same name + ":bell"), and the waiters' key in the engine's BLPOP is that bell: one key for
 * every fair waiter of the client. A grant made by one client for another's waiter comes back
 * in the script's reply ({'wake', reply, kind, target, element, ...}), and the client that
 * made the call pushes it (wake_push.lua) on the engine: redsem__wake_unwrap and
 * redsem__wake_push_call build those pushes; the engine (drive_loop.c) sends them, drains
 * the id list when its bell pops and wakes the waiters its elements name. A basic semaphore's
 * or a lock's waiters wait on their handle's own list. */
#include <stdio.h>
#include <string.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "internal.h"

int redsem__wake_init(redsem_client *c)
{
    unsigned char rnd[8];
    char hex[17];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
    size_t len = c->prefix_len + sizeof "wake:" + sizeof hex + sizeof ":ids";
    c->wake_ids = redsem__malloc(len);
    if (c->wake_ids == NULL)
        return REDSEM_ENOMEM;
    snprintf(c->wake_ids, len, "%swake:%s:ids", c->prefix, hex);
    len += sizeof ":bell";
    c->wake_bell = redsem__malloc(len);
    if (c->wake_bell == NULL)
        return REDSEM_ENOMEM;
    snprintf(c->wake_bell, len, "%s:bell", c->wake_ids);
    atomic_init(&c->waits, 0);
    return REDSEM_OK;
}

void redsem__wake_free(redsem_client *c)
{
    redsem__free(c->wake_ids);
    redsem__free(c->wake_bell);
}

bool redsem__wake_any(redsem_client *c)
{
    return atomic_load_explicit(&c->waits, memory_order_relaxed) > 0;
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
