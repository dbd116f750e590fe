/* redsem - a Sentinel-managed primary (the Redis "Sentinel clients" guide): ask the Sentinels
 * in turn, SENTINEL get-master-addr-by-name, the first that answers moves to the front; the
 * node then connects to that address and checks with ROLE that it is the primary (node.c).
 *
 * The client also follows the Sentinels' announcements, as the guide asks: one connection per
 * client (the watch, shared by its engines) stays subscribed to +switch-master and
 * +promoted-slave on one Sentinel (on_message says what each tells). It is made by the first
 * resolve, on the connection of the Sentinel that answered (the question and SUBSCRIBE in one
 * write: the Sentinel runs both before anything else, so no switch falls between them), and
 * made again on the next Sentinel when it is lost. While it is up, the primary's address is
 * the one that Sentinel gave, updated by each announcement for our primary's name, and a
 * resolve takes it from there (no round trip). The watch is read without blocking (a
 * non-blocking recv or SSL_read, hiredis' reader on what arrived) before requests on the
 * primary's connections, at most every SWITCH_POLL_MS (in between one atomic load); a
 * connection to an address the primary moved away from is given up before the request is
 * sent, as after READONLY (node.c). A planned failover (SENTINEL FAILOVER) leaves the old
 * primary a writable primary for seconds, until Sentinel demotes it, and neither READONLY nor
 * a lost connection would tell its clients. Besides, node.c re-checks ROLE every
 * REDSEM__ROLE_CHECK_MS on each connection (in the same write as a request), for the switches
 * the watch misses (no Sentinel to subscribe to), once the old primary is demoted.
 *
 * Without a watch (a topology not given one) every resolve asks the Sentinels, as at every
 * reconnect: a call that lost its connection to a primary that failed over (Sentinel closes
 * clients' connections when it reconfigures a server) finds the new one within its retry
 * window. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <sodium.h>

#include "topo/topo.h"

/* How often the watch's connection is read for announcements, at most (ms): a request in
 * between only compares an atomic epoch. */
#define SWITCH_POLL_MS 5
/* After every Sentinel failed to take the subscription: the next try, no sooner (ms). */
#define RESUBSCRIBE_MS 1000

struct redsem__sentinel_watch {
    pthread_mutex_t mu;
    pid_t pid;                  /* the process that made it (fork: see watch_free) */
    redsem__conn *sub;          /* subscribed on Sentinel `first`; NULL: none */
    size_t first;               /* the Sentinel to ask first: the subscribed or last good one */
    bool subscribing;           /* a thread is making sub (outside mu) */
    int64_t retry_ns;           /* no new subscription from a request before this */
    /* the primary as the subscribed Sentinel names it (valid while sub is up) */
    bool known;
    char host[256];
    int port;
    _Atomic uint64_t epoch;     /* bumped at every change of the address known */
    _Atomic int64_t next_poll_ns;
};

redsem__sentinel_watch *redsem__sentinel_watch_new(void)
{
    redsem__sentinel_watch *w = redsem__calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    w->pid = getpid();
    atomic_init(&w->epoch, 1); /* a node's 0: never checked */
    atomic_init(&w->next_poll_ns, 0);
    return w;
}

static void sub_free(redsem__conn *c)
{
    if (c == NULL)
        return;
    redsem__conn_close(c); /* no close_notify, no RST: also right in a forked child */
    redsem__free(c);
}

void redsem__sentinel_watch_free(redsem__sentinel_watch *w)
{
    if (w == NULL)
        return;
    sub_free(w->sub);
    /* in a forked child another thread of the parent may have held it: leave it */
    if (w->pid == getpid())
        pthread_mutex_destroy(&w->mu);
    redsem__free(w);
}

/* Under mu: what the subscribed Sentinel names the primary now. */
static void set_known(redsem__sentinel_watch *w, const char *host, int port)
{
    if (w->known && w->port == port && strcmp(w->host, host) == 0)
        return;
    snprintf(w->host, sizeof w->host, "%s", host);
    w->port = port;
    w->known = true;
    atomic_fetch_add(&w->epoch, 1);
}

/* Under mu: the subscription is gone (the Sentinel went away, or spoke nonsense): the next
 * one goes to the next Sentinel. */
static void sub_lost(redsem__topo *t, redsem__sentinel_watch *w)
{
    sub_free(w->sub);
    w->sub = NULL;
    w->known = false;
    w->first = (w->first + 1) % t->given.nhosts;
}

/* Cut the last k space-separated words off text (in place): tok[0] is the last one, text
 * keeps what was before them. false if there are fewer. */
static bool cut_words(char *text, int k, char **tok)
{
    size_t l = strlen(text);
    for (int i = 0; i < k; i++) {
        while (l > 0 && text[l - 1] != ' ')
            l--;
        if (l == 0)
            return false;
        tok[i] = &text[l];
        text[--l] = '\0';
    }
    return true;
}

/* Under mu: one message read from the subscription: where the primary named t->given.master
 * is now, from either announcement (the name may hold spaces: the words are counted from the
 * end). Anything else (the subscriptions' confirmations, other primaries) is ignored.
 *   +switch-master "<name> <old ip> <old port> <new ip> <new port>": a Sentinel switched its
 *       configuration (the one that ran the failover at its end, the others as they hear of
 *       it: within a few hundred ms of the promotion);
 *   +promoted-slave "slave <ip:port> <ip> <port> @ <name> <old ip> <old port>": the one that
 *       runs the failover saw its chosen replica become a primary. From then on it names that
 *       replica (SENTINEL get-master-addr-by-name), and the failover can no longer be undone;
 *       its own +switch-master comes only once every replica was reconfigured, seconds later,
 *       while new clients already use the new primary. */
static void on_message(redsem__topo *t, redsem__sentinel_watch *w, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "message") != 0 ||
        r->element[1]->type != REDIS_REPLY_STRING || r->element[2]->type != REDIS_REPLY_STRING ||
        r->element[2]->len >= 1024)
        return;
    char text[1024];
    memcpy(text, r->element[2]->str, r->element[2]->len);
    text[r->element[2]->len] = '\0';
    char *tok[4], *host, *port_s;
    const char *name;
    if (strcmp(r->element[1]->str, "+switch-master") == 0) {
        if (!cut_words(text, 4, tok))
            return;
        name = text;
        host = tok[1];
        port_s = tok[0];
    } else if (strcmp(r->element[1]->str, "+promoted-slave") == 0) {
        char *at = strstr(text, " @ ");
        if (at == NULL || !cut_words(text, 2, tok))
            return;
        /* text is now "slave <ip:port> <ip> <port> @ <name>" */
        name = at + 3;
        *at = '\0';
        char *slave[2];
        if (!cut_words(text, 2, slave))
            return;
        host = slave[1];
        port_s = slave[0];
    } else {
        return;
    }
    long port = strtol(port_s, NULL, 10);
    if (strcmp(name, t->given.master) != 0 || port < 1 || port > 65535 || host[0] == '\0' ||
        strlen(host) > 253)
        return;
    set_known(w, host, (int)port);
}

/* Under mu: read what the Sentinel sent since the last time, without waiting. */
static void pump(redsem__topo *t, redsem__sentinel_watch *w)
{
    while (w->sub != NULL) {
        redsem__conn *c = w->sub;
        void *reply = NULL;
        if (redisReaderGetReply(c->reader, &reply) != REDIS_OK) {
            sub_lost(t, w);
            return;
        }
        if (reply != NULL) {
            on_message(t, w, reply);
            freeReplyObject(reply);
            continue;
        }
        char buf[4096];
        ssize_t got;
        int err_no = 0;
        if (c->ssl != NULL) {
            short ev = 0;
            got = redsem__tls_recv(c, buf, sizeof buf, &ev, &err_no); /* non-blocking */
            if (got == -2)
                return;
        } else {
            got = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return;
        }
        if (got <= 0 || redisReaderFeed(c->reader, buf, (size_t)got) != REDIS_OK) {
            sub_lost(t, w);
            return;
        }
    }
}

/* One request on a connection of our own, or two in one write (then, ret_then: not NULL). */
static int sentinel_request(redsem__conn *c, const redsem__args *a, const redsem__args *then,
                            int64_t deadline_ns, redisReply **ret, redisReply **ret_then,
                            char *err, size_t errlen)
{
    char *cmd = NULL, *cmd2 = NULL;
    int len = redsem__args_format(a, &cmd);
    int len2 = then != NULL && len >= 0 ? redsem__args_format(then, &cmd2) : 0;
    char *all = len >= 0 && len2 > 0 ? redsem__malloc((size_t)len + (size_t)len2) : NULL;
    if (len < 0 || len2 < 0 || (len2 > 0 && all == NULL)) {
        if (cmd != NULL)
            redisFreeCommand(cmd);
        if (cmd2 != NULL)
            redisFreeCommand(cmd2);
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    if (all != NULL) {
        memcpy(all, cmd, (size_t)len);
        memcpy(all + len, cmd2, (size_t)len2);
    }
    int err_no = 0;
    int io = redsem__conn_write(c, all != NULL ? all : cmd, (size_t)len + (size_t)len2,
                                deadline_ns, &err_no);
    /* an AUTH carries the Sentinels' password: zeroed before the memory is freed */
    sodium_memzero(cmd, (size_t)len);
    redisFreeCommand(cmd);
    if (cmd2 != NULL) {
        sodium_memzero(cmd2, (size_t)len2);
        redisFreeCommand(cmd2);
    }
    if (all != NULL)
        sodium_memzero(all, (size_t)len + (size_t)len2);
    redsem__free(all);
    if (io == REDSEM__IO_OK)
        io = redsem__conn_read(c, ret, deadline_ns, &err_no, err, errlen);
    if (io == REDSEM__IO_OK && then != NULL) {
        io = redsem__conn_read(c, ret_then, deadline_ns, &err_no, err, errlen);
        if (io != REDSEM__IO_OK) {
            freeReplyObject(*ret);
            *ret = NULL;
        }
    }
    return redsem__io_status(io, err_no, err, errlen);
}

void redsem__sentinel_args(const redsem__topo *t, bool auth, redsem__args *a)
{
    const redsem__endpoint *se = &t->given;
    redsem__args_init(a);
    if (auth) {
        redsem__args_str(a, "AUTH");
        if (se->sentinel_user != NULL)
            redsem__args_str(a, se->sentinel_user);
        redsem__args_str(a, se->sentinel_password);
        return;
    }
    redsem__args_str(a, "SENTINEL");
    redsem__args_str(a, "get-master-addr-by-name");
    redsem__args_str(a, se->master);
}

int redsem__sentinel_judge_auth(const redisReply *r, char *err, size_t errlen)
{
    if (r->type != REDIS_REPLY_ERROR)
        return REDSEM_OK;
    snprintf(err, errlen, "AUTH: %.200s", r->str);
    return REDSEM_EPERM;
}

int redsem__sentinel_judge(const redsem__topo *t, const redisReply *r, char **host, int *port,
                           char *err, size_t errlen)
{
    long p = 0;
    if (r->type == REDIS_REPLY_NIL) {
        snprintf(err, errlen, "knows no primary named '%s'", t->given.master);
        return REDSEM_ECONN;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%.200s", r->str);
        return strncmp(r->str, "NOAUTH", 6) == 0 || strncmp(r->str, "NOPERM", 6) == 0 ||
                       strncmp(r->str, "WRONGPASS", 9) == 0
                   ? REDSEM_EPERM
                   : REDSEM_ECONN;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[0]->len == 0 || r->element[0]->len > 253 ||
        (p = strtol(r->element[1]->str, NULL, 10)) < 1 || p > 65535) {
        snprintf(err, errlen, "unexpected reply to SENTINEL get-master-addr-by-name");
        return REDSEM_EPROTO;
    }
    if ((*host = redsem__strdup(r->element[0]->str)) == NULL) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    *port = (int)p;
    return REDSEM_OK;
}

/* Ask one Sentinel. On REDSEM_OK, *host (new string) and *port. With keep (not NULL), SUBSCRIBE
 * +switch-master goes in the same write as the question, and a subscribed connection is
 * handed over in *keep (NULL if the Sentinel refused the subscription: the answer stands). */
static int ask(redsem__topo *t, redsem__node *n, const redsem__hostport *s, int64_t deadline_ns,
               char **host, int *port, redsem__conn **keep, char *err, size_t errlen)
{
    const redsem__endpoint *se = &t->given;
    redsem__endpoint ep = {.kind = REDSEM__EP_TCP, .host = s->host, .port = s->port};
    redsem__conn own, *conn = keep != NULL ? redsem__malloc(sizeof *conn) : &own;
    if (conn == NULL) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    redsem__conn_init(conn);
    redsem__conn_tls tls = {n->tls_ctx, NULL}; /* verified against the Sentinel's own host */
    bool retryable;
    int rc = redsem__conn_open(conn, &ep, &tls, deadline_ns, n->command_timeout_ms,
                               &retryable, err, errlen);
    redsem__args a;
    redisReply *r = NULL, *sub = NULL;
    if (rc == REDSEM_OK && se->sentinel_password != NULL) {
        redsem__sentinel_args(t, true, &a);
        rc = sentinel_request(conn, &a, NULL, deadline_ns, &r, NULL, err, errlen);
        if (rc == REDSEM_OK)
            rc = redsem__sentinel_judge_auth(r, err, errlen);
        if (r != NULL)
            freeReplyObject(r);
        r = NULL;
    }
    if (rc == REDSEM_OK) {
        redsem__sentinel_args(t, false, &a);
        redsem__args then;
        redsem__args_init(&then);
        redsem__args_str(&then, "SUBSCRIBE");
        redsem__args_str(&then, "+switch-master");
        redsem__args_str(&then, "+promoted-slave"); /* its confirmation: read by pump */
        rc = sentinel_request(conn, &a, keep != NULL ? &then : NULL, deadline_ns, &r,
                              keep != NULL ? &sub : NULL, err, errlen);
    }
    if (rc == REDSEM_OK)
        rc = redsem__sentinel_judge(t, r, host, port, err, errlen);
    if (r != NULL)
        freeReplyObject(r);
    /* ["subscribe", "+switch-master", 1]: the connection now carries the announcements */
    bool subscribed = rc == REDSEM_OK && sub != NULL && sub->type == REDIS_REPLY_ARRAY &&
                      sub->elements == 3 && sub->element[0]->type == REDIS_REPLY_STRING &&
                      strcmp(sub->element[0]->str, "subscribe") == 0;
    if (sub != NULL)
        freeReplyObject(sub);
    if (keep != NULL) {
        if (subscribed) {
            *keep = conn;
            return rc;
        }
        *keep = NULL;
    }
    redsem__conn_close(conn);
    if (conn != &own)
        redsem__free(conn);
    return rc;
}

void redsem__sentinel_round_begin(redsem__sentinel_round *r, size_t first, char *err)
{
    *r = (redsem__sentinel_round){.first = first, .worst = REDSEM_ECONN};
    err[0] = '\0';
}

bool redsem__sentinel_round_next(const redsem__topo *t, redsem__sentinel_round *r,
                                 int64_t deadline_ns, size_t *which, int64_t *share_ns)
{
    size_t count = t->given.nhosts;
    int64_t now = redsem__now_ns();
    if (r->asked >= count || now >= deadline_ns)
        return false;
    /* each Sentinel gets a fair share of what is left, so that one that hangs does not use
     * up the time the others need */
    int64_t share = (deadline_ns - now) / (int64_t)(count - r->asked);
    *share_ns = deadline_ns == REDSEM__FOREVER || share < 100 * REDSEM__NS_PER_MS
                    ? deadline_ns
                    : now + share;
    *which = (r->first + r->asked) % count;
    r->asked++;
    return true;
}

void redsem__sentinel_round_failed(const redsem__topo *t, redsem__sentinel_round *r,
                                   size_t which, int rc, const char *why, char *err,
                                   size_t errlen)
{
    const redsem__hostport *s = &t->given.hosts[which];
    if (rc == REDSEM_EPERM)
        r->worst = rc;
    if (rc == REDSEM_ETLS)
        r->refused_tls++;
    int w = snprintf(err + r->used, r->used < errlen ? errlen - r->used : 0,
                     "%sSentinel %s:%d: %s", r->used ? "; " : "", s->host, s->port, why);
    if (w > 0)
        r->used += (size_t)w;
}

int redsem__sentinel_round_end(const redsem__topo *t, const redsem__sentinel_round *r,
                               char *err, size_t errlen)
{
    int worst = r->worst;
    if (r->used == 0)
        snprintf(err, errlen, "no Sentinel could be asked before the deadline");
    /* Every Sentinel refused TLS (its certificate did not verify): a configuration error that
     * retrying will not mend, as for a data node. With any other failure among them (one
     * down, one slow) it stays ECONN, retried: the others may answer on the next try. */
    if (worst != REDSEM_EPERM && r->refused_tls == t->given.nhosts)
        worst = REDSEM_ETLS;
    /* err is "Sentinel h:p: why; ..." */
    char tail[64];
    snprintf(tail, sizeof tail, " (primary '%s')", t->given.master);
    size_t l = strlen(err);
    if (l + strlen(tail) < errlen)
        memcpy(err + l, tail, strlen(tail) + 1);
    return worst;
}

/* Ask the Sentinels in turn from the first (t->first, or the watch's), each within a fair
 * share of the time left. On REDSEM_OK *host (new string), *port, *which (the Sentinel that
 * answered) and, with keep, its subscribed connection (or NULL). Otherwise the code (ECONN,
 * ETIMEDOUT, EPERM, ETLS, ENOMEM) and err says what each Sentinel said. */
static int ask_all(redsem__topo *t, redsem__node *n, size_t first, int64_t deadline_ns,
                   char **host, int *port, size_t *which, redsem__conn **keep, char *err,
                   size_t errlen)
{
    redsem__sentinel_round round;
    redsem__sentinel_round_begin(&round, first, err);
    size_t i;
    int64_t dl;
    while (redsem__sentinel_round_next(t, &round, deadline_ns, &i, &dl)) {
        char why[256] = "";
        int rc = ask(t, n, &t->given.hosts[i], dl, host, port, keep, why, sizeof why);
        if (rc == REDSEM_OK) {
            *which = i;
            return REDSEM_OK;
        }
        if (rc == REDSEM_ENOMEM) {
            snprintf(err, errlen, "out of memory");
            return rc;
        }
        redsem__sentinel_round_failed(t, &round, i, rc, why, err, errlen);
    }
    return redsem__sentinel_round_end(t, &round, err, errlen);
}

/* Under mu, by the thread that set w->subscribing: hand over what its asking found. */
static void subscribed(redsem__topo *t, redsem__sentinel_watch *w, int rc, const char *host,
                       int port, size_t which, redsem__conn *keep)
{
    w->subscribing = false;
    if (rc == REDSEM_OK)
        w->first = which;
    if (keep == NULL) {
        /* nothing to subscribe to now: a request tries again after a pause */
        w->retry_ns = redsem__now_ns() + RESUBSCRIBE_MS * REDSEM__NS_PER_MS;
        if (rc != REDSEM_OK)
            w->first = (w->first + 1) % t->given.nhosts;
        return;
    }
    sub_free(w->sub); /* none: only the subscribing thread installs one */
    w->sub = keep;
    set_known(w, host, port);
}

/* The resolve's first part: the primary's address into n->ep from the watch, while it is
 * subscribed (pending announcements read first, without waiting). REDSEM_OK: set; 1: not
 * known, *first is the Sentinel to ask first, and with subscribe (not NULL) *subscribe says
 * whether the caller is to take the subscription (w->subscribing set); REDSEM_ENOMEM. */
static int watch_lookup(redsem__topo *t, redsem__node *n, size_t *first, bool *subscribe,
                        char *err, size_t errlen)
{
    redsem__sentinel_watch *w = t->watch;
    n->watch_epoch = 0; /* the hook compares the next request's address anew */
    if (w == NULL)
        return 1;
    pthread_mutex_lock(&w->mu);
    pump(t, w);
    if (w->known) {
        /* the subscribed Sentinel's answer, kept current by its announcements */
        char *host = redsem__strdup(w->host);
        if (host == NULL) {
            pthread_mutex_unlock(&w->mu);
            snprintf(err, errlen, "out of memory");
            return REDSEM_ENOMEM;
        }
        redsem__free(n->ep.host);
        n->ep.host = host;
        n->ep.port = w->port;
        n->watch_epoch = atomic_load(&w->epoch);
        pthread_mutex_unlock(&w->mu);
        return REDSEM_OK;
    }
    *first = w->first;
    if (subscribe != NULL && w->sub == NULL && !w->subscribing)
        *subscribe = w->subscribing = true;
    pthread_mutex_unlock(&w->mu);
    return 1;
}

int redsem__sentinel_watched(void *topo, redsem__node *n, size_t *first, char *err,
                             size_t errlen)
{
    redsem__topo *t = topo;
    *first = t->first;
    return watch_lookup(t, n, first, NULL, err, errlen);
}

int redsem__sentinel_resolve(void *topo, redsem__node *n, int64_t deadline_ns, char *err,
                             size_t errlen)
{
    redsem__topo *t = topo;
    redsem__sentinel_watch *w = t->watch;
    size_t first = t->first;
    bool subscribe = false;
    int known = watch_lookup(t, n, &first, &subscribe, err, errlen);
    if (known != 1)
        return known;
    char *host = NULL;
    int port = 0;
    size_t which = 0;
    redsem__conn *keep = NULL;
    int rc = ask_all(t, n, first, deadline_ns, &host, &port, &which, subscribe ? &keep : NULL,
                     err, errlen);
    if (subscribe) {
        pthread_mutex_lock(&w->mu);
        subscribed(t, w, rc, host, port, which, keep);
        pthread_mutex_unlock(&w->mu);
    }
    if (rc != REDSEM_OK)
        return rc;
    redsem__free(n->ep.host);
    n->ep.host = host;
    n->ep.port = port;
    t->first = which;
    return REDSEM_OK;
}

/* The moved hook; subscribe: may subscribe again (blocking), else only reads the watch. */
static bool moved_check(void *topo, redsem__node *n, bool subscribe, char *err, size_t errlen)
{
    redsem__topo *t = topo;
    redsem__sentinel_watch *w = t->watch;
    if (w == NULL)
        return false;
    int64_t now = redsem__now_ns();
    if (n->watch_epoch == atomic_load_explicit(&w->epoch, memory_order_acquire) &&
        now < atomic_load_explicit(&w->next_poll_ns, memory_order_relaxed))
        return false; /* nothing new since this connection was last compared */
    pthread_mutex_lock(&w->mu);
    atomic_store_explicit(&w->next_poll_ns, now + SWITCH_POLL_MS * REDSEM__NS_PER_MS,
                          memory_order_relaxed);
    pump(t, w);
    /* lost, or never made (no Sentinel could be asked): subscribe again, on the next Sentinel,
     * here (this request waits for it: rare), at most every RESUBSCRIBE_MS */
    if (subscribe && w->sub == NULL && !w->subscribing && now >= w->retry_ns) {
        w->subscribing = true;
        size_t first = w->first;
        pthread_mutex_unlock(&w->mu);
        int64_t deadline = now + n->connect_timeout_ms * REDSEM__NS_PER_MS;
        int64_t cap = redsem__ctx_cap(n->ctx);
        if (cap != 0 && cap < deadline)
            deadline = cap;
        char *host = NULL, why[512];
        int port = 0;
        size_t which = 0;
        redsem__conn *keep = NULL;
        int rc = ask_all(t, n, first, deadline, &host, &port, &which, &keep, why, sizeof why);
        pthread_mutex_lock(&w->mu);
        subscribed(t, w, rc, host, port, which, keep);
        redsem__free(host);
    }
    bool moved = w->known && (n->ep.port != w->port || n->ep.host == NULL ||
                              strcmp(n->ep.host, w->host) != 0);
    if (moved)
        snprintf(err, errlen, "%s:%d is no longer the primary: Sentinel %s:%d announced "
                 "the switch to %s:%d", n->ep.host ? n->ep.host : "?", n->ep.port,
                 t->given.hosts[w->first].host, t->given.hosts[w->first].port, w->host, w->port);
    else
        n->watch_epoch = atomic_load_explicit(&w->epoch, memory_order_relaxed);
    pthread_mutex_unlock(&w->mu);
    return moved;
}

void redsem__sentinel_keep(redsem__topo *t, redsem__node *n)
{
    redsem__sentinel_watch *w = t->watch;
    if (w == NULL)
        return;
    int64_t now = redsem__now_ns();
    pthread_mutex_lock(&w->mu);
    pump(t, w);
    bool go = w->sub == NULL && !w->subscribing && now >= w->retry_ns;
    size_t first = w->first;
    w->subscribing = w->subscribing || go;
    pthread_mutex_unlock(&w->mu);
    if (!go)
        return;
    char *host = NULL, why[512];
    int port = 0;
    size_t which = 0;
    redsem__conn *keep = NULL;
    int rc = ask_all(t, n, first, now + n->connect_timeout_ms * REDSEM__NS_PER_MS, &host, &port,
                     &which, &keep, why, sizeof why);
    pthread_mutex_lock(&w->mu);
    subscribed(t, w, rc, host, port, which, keep);
    pthread_mutex_unlock(&w->mu);
    redsem__free(host);
}

bool redsem__sentinel_moved(void *topo, redsem__node *n, char *err, size_t errlen)
{
    return moved_check(topo, n, true, err, errlen);
}

bool redsem__sentinel_moved_nb(void *topo, redsem__node *n, char *err, size_t errlen)
{
    return moved_check(topo, n, false, err, errlen);
}
