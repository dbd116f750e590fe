/* redsem - the waiting loop shared by the three strategies and the lock.
 *
 * One attempt is one script (plus the guard for the locked strategy). A blocking acquire that
 * is not granted registers (basic, lock: in a waiters set; fair, locked: in the queue, keeping
 * its ticket) and blocks on a Redis list with BLPOP. Releases push to that list, so a waiter
 * wakes as soon as a permit is handed over; the script also says when the earliest lease
 * expires, and the wait never lasts past that, by the server's timeout or, on an idle server
 * whose timeouts fire late, by our own clock; a jittered backoff (50 ms doubling to 1 s)
 * bounds the wait in case a wake-up was lost. No fixed sleeps. */
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

const char *const redsem__mode_names[4] = {"try", "wait", "again", "last"};

/* The values of an acquire script's reply, in either of its two shapes: an array of integers
 * {status, a, b, now us}, or the same integers in one bulk string separated by single spaces
 * ("1 1700000000123456 4 1700000000123456"; a fair "not granted" adds a fifth, the fence).
 * The scripts return the string on their hot paths: Redis 7.0 converts a Lua table to a
 * reply at several times the cost of a string (docs/design.md, "What a script costs").
 * Returns how many values were read (1..5), or 0. */
#define ATTEMPT_VALUES_MAX 5
static size_t attempt_values(const redisReply *r, long long v[ATTEMPT_VALUES_MAX])
{
    size_t n = 0;
    if (r->type == REDIS_REPLY_ARRAY) {
        for (; n < r->elements && n < 4; n++)
            if (!redsem__reply_int(r->element[n], &v[n]))
                return n == 0 ? 0 : n;
        return n;
    }
    if (r->type != REDIS_REPLY_STRING || r->len == 0 || r->len > 128)
        return 0;
    const char *p = r->str, *end = r->str + r->len;
    while (n < ATTEMPT_VALUES_MAX) {
        bool neg = p < end && *p == '-';
        const char *d = p + neg;
        unsigned long long x = 0;
        while (d < end && *d >= '0' && *d <= '9' && d - p < 18 + (int)neg)
            x = x * 10 + (unsigned)(*d++ - '0');
        if (d == p + neg || (d < end && *d != ' '))
            return 0; /* no digits, too many, or a stray byte */
        v[n++] = neg ? -(long long)x : (long long)x;
        if (d == end)
            return n;
        p = d + 1;
        if (p == end)
            return 0; /* a trailing space */
    }
    return 0; /* more than five values */
}

/* Parse the reply of an acquire script: {status, a, b, now us} (see attempt_values). */
int redsem__parse_attempt(redsem_client *c, const redisReply *r, redsem__attempt *att,
                         const char *what)
{
    long long v[ATTEMPT_VALUES_MAX] = {0, 0, 0, 0, 0};
    memset(att, 0, sizeof *att);
    att->next_ms = -1;
    size_t n = attempt_values(r, v);
    if (n < 1)
        return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply shape", what);
    long long st = v[0], a = v[1], b = v[2];
    if (st == REDSEM__ATT_GUARD_BUSY) {
        att->outcome = REDSEM__ATT_GUARD_BUSY;
        return REDSEM_OK;
    }
    if (st == REDSEM__ATT_WEIGHT || st == REDSEM__ATT_TOO_MANY) {
        if (n < 2 || a < 1 || a > UINT32_MAX)
            return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply values", what);
        att->outcome = (int)st;
        att->weight = (uint32_t)a;
        att->limit = (uint32_t)a;
        return REDSEM_OK;
    }
    if (st == REDSEM__ATT_TOO_LATE) {
        if (n < 2 || a <= 0)
            return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply values", what);
        att->outcome = REDSEM__ATT_TOO_LATE;
        att->server_us = a;
        return REDSEM_OK;
    }
    if (n < 3 || (st != 0 && st != 1) || b < 0 || b > UINT32_MAX || (n > 4 && st != 0))
        return redsem__set_err(c, REDSEM_EPROTO, "%s: unexpected reply values", what);
    if (n >= 4 && v[3] > 0)
        att->server_us = v[3];
    if (st == 1) {
        att->outcome = REDSEM__ATT_GRANTED;
        att->token = (uint64_t)a;
        att->holds = (uint32_t)b; /* lock: hold count in place of the limit */
        att->limit = (uint32_t)b;
    } else {
        att->outcome = REDSEM__ATT_BUSY;
        att->next_ms = a;
        att->limit = (uint32_t)b;
        if (n >= 5 && v[4] >= 0) {
            att->fence = (uint64_t)v[4];
            att->fence_known = true;
        }
    }
    return REDSEM_OK;
}

/* A grant: keep what the permit needs from the request that got it. */
static int granted(redsem__attempt *att, const redsem__req_info *info)
{
    att->sent_ns = info->sent_ns;
    att->replicas_acked = info->replicas_acked;
    return REDSEM_OK;
}

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
/* The fallback of a fair waiter woken by its element on its client's id list (wake.c;
 * q->wake_meta): its grant's wake-up reaches it alone, however many waiters share the list;
 * one drained while it was between attempts is kept for it; and the list is drained again
 * after a BLPOP whose bell may have been lost. So it only polls for what no wake-up reports
 * (a drain whose reply was lost with its connection; a release by redsem <= 0.4.2, which
 * pushes to the waiter's own list). Its wait lease (renewed every third of it) and the
 * expiry takeover (next_ms) still cut its waits. A short backoff there would cost one
 * attempt per waiter every 50 ms: with 600 waiters, more server time than the grants. */
#define BACKOFF_BY_ID_MS 1000

/* REDSEM_EUNKNOWN after the fault rc, with the thread's error text: a request whose reply
 * was lost, or (queued) a waiter that failed and could not leave the queue. */
static int unknown_why(redsem_client *c, const char *id, int rc, bool queued)
{
    char detail[REDSEM__ERRMSG_LEN], tail[256];
    memcpy(detail, redsem__errbuf(c), sizeof detail);
    if (queued)
        snprintf(tail, sizeof tail,
                 "holder %s is still queued and may be granted a permit (then held until its "
                 "lease expires) until its wait lease ends; acquire again with that id and a "
                 "timeout to find out",
                 id);
    else
        snprintf(tail, sizeof tail,
                 "the request may have been applied: holder %s may hold a permit until its "
                 "lease expires; acquire again with that id to find out",
                 id);
    return redsem__set_err(c, REDSEM_EUNKNOWN, "%s (%s); %s", detail, redsem_err_name(rc), tail);
}

static int unknown(redsem_client *c, const char *id, int rc)
{
    return unknown_why(c, id, rc, false);
}

static int acquire_done(const redsem__acquirer *q, const redsem__kind *kind, const char *id,
                        int64_t lease_ms, int rc, redsem__attempt att, bool given_back,
                        redsem_permit **ret_permit);

/* What the outcome of an attempt asked for continues (s->cont). */
enum { CONT_NONE = 0, CONT_MAIN, CONT_FAULT, CONT_LEAVE };

/* Ask the driver for an attempt in mode, whose outcome goes to cont. */
static int ask_attempt(redsem__acq_state *s, int mode, int cont)
{
    s->att_mode = mode;
    s->cont = cont;
    return REDSEM__ATTEMPT;
}


/* A locked attempt found the guard busy. The guard is held for about two round trips (~50
 * us on a LAN): a short jittered pause, doubling from 100-200 us while the guard stays busy
 * (s->guard_backoff_us, 0 at first), at most 5 ms, and never past until_ns (REDSEM__FOREVER:
 * no bound); then the attempt in mode, whose outcome goes to cont. */
static int ask_nap(redsem__acq_state *s, int64_t until_ns, int mode, int cont)
{
    int64_t *backoff_us = &s->guard_backoff_us;
    *backoff_us = *backoff_us ? *backoff_us * 2 : 200;
    if (*backoff_us > 5000)
        *backoff_us = 5000;
    int64_t now = redsem__now_ns();
    int64_t nap_ns = redsem__rand_between(*backoff_us / 2, *backoff_us) * 1000;
    if (until_ns != REDSEM__FOREVER && until_ns - now < nap_ns)
        nap_ns = until_ns - now;
    s->nap_until_ns = now + (nap_ns > 0 ? nap_ns : 0);
    (void)ask_attempt(s, mode, cont);
    return REDSEM__NAP;
}

/* A registered waiter whose wait or attempt failed with a fault (rc) leaves the queue before
 * it returns, with one attempt in mode "last" (a permit handed over meanwhile is taken), so
 * that no registration of it withholds a permit afterwards:
 * - a basic or lock waiter, or one of a Redis Cluster client, after a lost connection (CLIENT
 *   KILL, a server closing idle clients, a restart beyond the retry window) only: a fair or
 *   locked entry's grant lapses with its wait lease;
 * - a fair or locked waiter of a one-server client (q->wake_meta) after any fault: a release
 *   may grant its entry with its whole lease (a direct grant), so if it cannot leave
 *   (a timeout: the server is stalled and the call must end by its deadline; or the attempt
 *   fails too) it returns REDSEM_EUNKNOWN, still queued. Found by review: a refused attempt
 *   (OOM), a failed shared BLPOP or a refused reconnect returned a plain code, and the next
 *   release held the permit for the lease in the dead acquire's name.
 * Left, it returns rc with rc's text.
 * fault_begin asks for that attempt (or decides at once); fault_reply takes its outcome. */
static int fault_begin(redsem__acq_state *s, int rc)
{
    redsem_client *c = s->q.client;
    if (s->q.wake_meta == NULL && rc != REDSEM_ECONN)
        return rc;
    memcpy(s->saved, redsem__errbuf(c), sizeof s->saved);
    s->fault_rc = rc;
    if (rc == REDSEM_ETIMEDOUT)
        return unknown_why(c, s->id, rc, true);
    return ask_attempt(s, REDSEM__MODE_LAST, CONT_FAULT);
}

static int fault_reply(redsem__acq_state *s)
{
    redsem_client *c = s->q.client;
    redsem__attempt *att = &s->att;
    bool direct = s->q.wake_meta != NULL;
    int rc = s->fault_rc, rc2 = s->att_rc;
    if (rc2 == REDSEM_OK && att->outcome == REDSEM__ATT_GRANTED)
        return granted(att, &s->att_info);
    if (rc2 != REDSEM_OK && s->att_info.maybe_applied && !direct)
        return unknown(c, s->id, rc2);
    bool left = rc2 == REDSEM_OK &&
                (att->outcome == REDSEM__ATT_BUSY || att->outcome == REDSEM__ATT_TOO_MANY);
    if (left || !direct) {
        memcpy(redsem__errbuf(c), s->saved, sizeof s->saved);
        return rc;
    }
    if (rc2 == REDSEM_OK)
        memcpy(redsem__errbuf(c), s->saved, sizeof s->saved);
    return unknown_why(c, s->id, rc2 != REDSEM_OK ? rc2 : rc, true);
}


/* A registered waiter that must end (its deadline came, it was cancelled, or the server ran
 * its attempts too late three times) leaves the queue with attempts in mode "last" (a permit
 * handed over meanwhile is taken), then returns end_rc (REDSEM_EBUSY, REDSEM_ECANCELED or
 * REDSEM_ETIMEDOUT) with its text. A locked waiter whose guard is busy pauses and tries
 * again, and a reply that came too late (the server ran it after its not-after time: nothing
 * was done) is tried twice more, all until one command timeout after the deadline (at least
 * half a command timeout from now, if the deadline passed long ago), which also caps every
 * wait for a connection and every round trip on the way (redsem__call_cap_set). A fault goes
 * as in fault_begin. If the waiter could not leave, a fair or locked waiter of a
 * one-server client (which a release may grant with its whole lease) returns
 * REDSEM_EUNKNOWN, still queued; the others' entries lapse with their wait lease, and they
 * return end_rc. Found by review: the single last attempt
 * returned REDSEM_EBUSY after a busy guard (or a fault that sent nothing) with the waiter
 * still queued, and the next release held a permit for its lease in the name of an acquire
 * that had been told it got none; a second review found the three-too-late path and an
 * unbounded last round trip. leave_begin asks for the first attempt; leave_reply takes each outcome. */
static int leave_begin(redsem__acq_state *s, int end_rc, const char *why)
{
    redsem_client *c = s->q.client;
    int64_t from = redsem__now_ns();
    if (s->deadline != REDSEM__FOREVER && s->deadline < from)
        from = s->deadline;
    int64_t give_up = from + c->command_timeout_ms * REDSEM__NS_PER_MS;
    if (give_up < redsem__now_ns() + c->command_timeout_ms * REDSEM__NS_PER_MS / 2)
        give_up = redsem__now_ns() + c->command_timeout_ms * REDSEM__NS_PER_MS / 2;
    s->give_up = give_up;
    s->cap_ns = give_up;
    s->end_rc = end_rc;
    s->why = why;
    s->leave_too_late = 0;
    s->guard_backoff_us = 0;
    return ask_attempt(s, REDSEM__MODE_LAST, CONT_LEAVE);
}

/* The end of leaving the queue: left (the attempt said so) or not. */
static int leave_end(const redsem__acq_state *s, bool left)
{
    redsem_client *c = s->q.client;
    const char *how = left ? "the queue was left" : "its queue entry lapses with its wait lease";
    if (s->end_rc == REDSEM_EBUSY)
        return redsem__set_err(c, REDSEM_EBUSY, "%s (limit %u; %s)", s->why,
                               s->att.limit != 0 ? s->att.limit : s->queued_limit, how);
    return redsem__set_err(c, s->end_rc, "%s (%s)", s->why, how);
}

static int leave_reply(redsem__acq_state *s)
{
    redsem_client *c = s->q.client;
    redsem__attempt *att = &s->att;
    bool direct = s->q.wake_meta != NULL;
    int rc = s->att_rc;
    if (rc == REDSEM_OK && att->outcome == REDSEM__ATT_GRANTED)
        return granted(att, &s->att_info);
    if (rc != REDSEM_OK && s->att_info.maybe_applied)
        return unknown_why(c, s->id, rc, direct);
    if (rc != REDSEM_OK)
        return fault_begin(s, rc);
    if (att->outcome == REDSEM__ATT_BUSY || att->outcome == REDSEM__ATT_TOO_MANY)
        return leave_end(s, true);
    bool again = redsem__now_ns() < s->give_up;
    if (att->outcome == REDSEM__ATT_TOO_LATE && ++s->leave_too_late <= 2 && again)
        return ask_attempt(s, REDSEM__MODE_LAST, CONT_LEAVE);
    if (att->outcome == REDSEM__ATT_GUARD_BUSY && again)
        return ask_nap(s, s->give_up, REDSEM__MODE_LAST, CONT_LEAVE);
    if (!direct)
        return leave_end(s, false); /* its entry lapses with its wait lease */
    (void)redsem__set_err(c, REDSEM_ETIMEDOUT, "%s; %s", s->why,
                          att->outcome == REDSEM__ATT_GUARD_BUSY
                              ? "the guard stayed busy until a command timeout after it"
                          : att->outcome == REDSEM__ATT_TOO_LATE
                              ? "the server ran the attempts to leave the queue after "
                                "their deadline too (stalled, or its clock jumps)"
                              : "the attempt to leave the queue was refused");
    return unknown_why(c, s->id, REDSEM_ETIMEDOUT, true);
}


/* A fair or locked waiter woken with a direct grant (prelude.lua's grant_heads handed it the
 * permit with its lease, and said so in the wake-up's element): the acquire is decided
 * without another attempt, saving the woken waiter a round trip and a script. Taken only if
 * the grant is of this wait: its token is greater than the fence the waiter's last queued
 * attempt saw (tokens of one semaphore only grow, whatever the clock does, so an element of
 * an earlier wait of the same id, kept or delayed, has a smaller one), its server time is
 * not before that attempt's, and its lease is this acquire's (L:<id> is the lease of the
 * last attempt of the id: another handle's, if one id waits through two at once). The
 * permit's deadline on the server is the grant's time (whole ms) + the lease; our validity
 * counts from that attempt's send time plus the server time between that attempt and the
 * grant (less 1 % for drift), so it ends no later than the server's deadline (the attempt
 * ran after it was sent; the server's clock measures that interval as it measures the lease:
 * a step of its clock shortens this permit as it shortens any lease, docs/guarantees.md).
 * Not for a client that waits for replicas after each grant (its waiters record no lease,
 * and an attempt then waits for them). Otherwise the wake-up is a plain one, and the next
 * attempt finds the permit (the idempotent retry path). */
static bool direct_grant(const redsem__acq_state *s, redsem__attempt *att)
{
    const redsem__wake_grant *g = &s->grant;
    /* a token is drawn as max(fence + 1, the server's clock): never below the grant's time */
    if (!s->signaled || g->token == 0 || !s->queued_known || g->token <= s->queued_fence ||
        g->server_us < s->queued_server_us || g->token < (uint64_t)g->server_us ||
        g->lease_ms != s->q.lease_ms || s->q.wake_meta == NULL ||
        s->q.client->sync_replicas > 0)
        return false;
    memset(att, 0, sizeof *att);
    att->outcome = REDSEM__ATT_GRANTED;
    att->token = g->token;
    att->limit = s->queued_limit;
    att->holds = s->queued_limit;
    att->server_us = g->server_us;
    att->replicas_acked = -1;
    /* the deadline is the grant's time in whole ms + the lease; the interval from that
     * attempt to it is counted as the server measured it, less the same 1 % drift margin
     * as the lease (redsem__validity_deadline) */
    int64_t since_us = g->server_us - g->server_us % 1000 - s->queued_server_us;
    if (since_us > 0)
        since_us -= since_us / 100;
    att->sent_ns = s->queued_sent_ns + since_us * 1000;
    /* never later than now: whatever an element says (its list can be written by any user
     * with access to the prefix's keys), validity does not exceed the lease from now */
    int64_t now = redsem__now_ns();
    if (att->sent_ns > now)
        att->sent_ns = now;
    (void)__atomic_fetch_add(&s->q.client->direct_grants, 1, __ATOMIC_RELAXED);
    return true;
}

/* The loop's state before its first attempt. */
static void state_init(redsem__acq_state *s, const redsem__acquirer *q, const char *id,
                       int64_t timeout_ms)
{
    memset(s, 0, sizeof *s);
    s->q = *q;
    memcpy(s->id, id, sizeof s->id);
    s->blocking = timeout_ms != 0;
    s->deadline = s->blocking ? redsem__deadline_after_ms(timeout_ms) : 0;
    s->since_ns = redsem__now_ns();
    s->mode = s->blocking ? REDSEM__MODE_WAIT : REDSEM__MODE_TRY;
    s->backoff_ms = q->wake_meta != NULL ? BACKOFF_BY_ID_MS : BACKOFF_MIN_MS;
}

/* A waiter not granted by its attempt: the wait it asks for (REDSEM__WAIT), or the end of
 * the acquire (its deadline came, or it was cancelled: it leaves the queue), or a pause
 * before the next attempt (the guard was busy). */
static int ask_wait(redsem__acq_state *s)
{
    const redsem__acquirer *q = &s->q;
    redsem_client *c = q->client;
    const redsem__attempt *att = &s->att;
    int64_t now = redsem__now_ns();
    bool cancelled = s->cancel != NULL && atomic_load(s->cancel);
    int64_t deadline = s->deadline;
    if (now >= deadline || cancelled) {
        if (!s->registered)
            return cancelled ? redsem__set_err(c, REDSEM_ECANCELED, "cancelled")
                             : redsem__set_err(c, REDSEM_EBUSY, "no permit within the timeout");
        /* Leave the queue; a permit handed over at the last moment is still taken. */
        return leave_begin(s, cancelled ? REDSEM_ECANCELED : REDSEM_EBUSY,
                           cancelled ? "cancelled" : "no permit within the timeout");
    }
    int64_t left_ms = deadline == REDSEM__FOREVER
                          ? INT64_MAX
                          : (deadline - now + REDSEM__NS_PER_MS - 1) / REDSEM__NS_PER_MS;
    if (att->outcome == REDSEM__ATT_GUARD_BUSY)
        return ask_nap(s, deadline, s->mode, CONT_MAIN);
    s->guard_backoff_us = 0;
    int64_t wait = redsem__rand_between(s->backoff_ms * 3 / 4, s->backoff_ms);
    if (att->next_ms >= 0 && att->next_ms < wait)
        wait = att->next_ms;
    if (q->wait_lease_ms > 0 && q->wait_lease_ms / 3 < wait)
        wait = q->wait_lease_ms / 3;
    if (left_ms < wait)
        wait = left_ms;
    /* Expiry takeover. The earliest lease ends next_ms after the script's clock rounded
     * down to the ms (deadlines are whole ms), that is next_ms ms - (server_us mod 1000)
     * us after the script ran, so by our clock before info.recv_ns + that. Redis fires a
     * BLPOP timeout only when its event loop wakes: on an idle server at its next tick, up
     * to 1000/hz ms late (100 ms at the default hz 10). So the wait is also cut on our
     * side, 0.2 ms after that end: a reply still missing then is abandoned with its
     * connection (the next attempt reconnects: one connect), and the next attempt runs
     * within about a millisecond of the expiry. A busy server answers the BLPOP itself
     * first, and nothing is cut. */
    int64_t cut = deadline;
    if (att->next_ms >= 0) {
        int64_t left_us = att->next_ms * 1000 - (att->server_us > 0 ? att->server_us % 1000 : 0);
        int64_t expiry = s->att_info.recv_ns + (left_us + 200) * 1000;
        if (expiry < cut)
            cut = expiry;
    }
    if (s->wkey == NULL) { /* the first wait: made once, not on every acquire */
        s->wkey = q->wait_key(q->handle, s->id, &s->keylen, s->keybuf, sizeof s->keybuf);
        if (q->wake_meta != NULL)
            snprintf(s->elem, sizeof s->elem, "%.*s %s", REDSEM_ID_LEN, s->id, q->wake_meta);
    }
    s->wait_ms = wait;
    s->cut_ns = cut;
    s->waited = true;
    s->wait_rc = REDSEM_OK;
    s->signaled = false;
    s->grant = (redsem__wake_grant){0, 0, 0};
    return REDSEM__WAIT;
}

/* The outcome of an attempt of the loop itself (not one to leave the queue). */
static int main_reply(redsem__acq_state *s)
{
    const redsem__acquirer *q = &s->q;
    redsem_client *c = q->client;
    const char *id = s->id;
    redsem__attempt *att = &s->att;
    int rc = s->att_rc;
    if (rc != REDSEM_OK && s->att_info.maybe_applied)
        return unknown(c, id, rc);
    if (rc != REDSEM_OK)
        return s->registered ? fault_begin(s, rc) : rc;
    if (att->outcome == REDSEM__ATT_GRANTED)
        return granted(att, &s->att_info);
    if (att->outcome == REDSEM__ATT_WEIGHT)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "holder %s already holds (or waits for) %u permits; this "
                               "request wants %u: one holder id is one permit object "
                               "(nothing was changed)",
                               id, att->weight, q->weight);
    if (att->outcome == REDSEM__ATT_TOO_MANY)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "%u permits wanted, but the limit on the server is %u "
                               "(nothing was taken)",
                               q->weight, att->limit);
    if (att->outcome == REDSEM__ATT_TOO_LATE) {
        /* The server ran the request after the time we had given it: our estimate of its
         * clock was off (a clock step, a long idle drift) or it was stalled. The attempt
         * recorded the server's clock from the reply: try again, a few times at most. */
        if (++s->too_late > 2) {
            const char *why = "the server ran the acquire after its deadline, 3 times in "
                              "a row (stalled, or its clock jumps)";
            /* registered: leave the queue first (or REDSEM_EUNKNOWN, still queued) */
            return s->registered ? leave_begin(s, REDSEM_ETIMEDOUT, why)
                                 : redsem__set_err(c, REDSEM_ETIMEDOUT, "%s", why);
        }
        return ask_attempt(s, s->mode, CONT_MAIN);
    }
    s->too_late = 0;
    if (!s->blocking)
        return redsem__set_err(c, REDSEM_EBUSY, "no permit free (limit %u)", att->limit);
    if (att->outcome == REDSEM__ATT_BUSY) {
        s->registered = true;
        s->mode = REDSEM__MODE_AGAIN;
        /* queued (a blocking fair or locked attempt): what a direct grant is checked by */
        s->queued_known = att->fence_known && att->server_us > 0;
        s->queued_fence = att->fence;
        s->queued_sent_ns = s->att_info.sent_ns;
        s->queued_server_us = att->server_us;
        s->queued_limit = att->limit;
    }
    return ask_wait(s);
}

/* The loop's body, one step at a time, a driver doing what each step asks: it returns the
 * acquire's status (s->att filled on a grant), REDSEM__ATTEMPT or REDSEM__NAP (run the
 * attempt s->att_mode, now or at s->nap_until_ns, set s->att_rc, s->att and s->att_info, and
 * call again), or REDSEM__WAIT (wait for a wake-up as s->wkey, s->wait_ms and s->cut_ns say,
 * set s->wait_rc and s->signaled, and call again). */
static int acquire_step(redsem__acq_state *s)
{
    int cont = s->cont;
    s->cont = CONT_NONE;
    if (cont == CONT_MAIN)
        return main_reply(s);
    if (cont == CONT_FAULT)
        return fault_reply(s);
    if (cont == CONT_LEAVE)
        return leave_reply(s);
    if (s->waited) {
        s->waited = false;
        if (s->wait_rc != REDSEM_OK)
            return fault_begin(s, s->wait_rc);
        if (direct_grant(s, &s->att))
            return REDSEM_OK;
        if (s->q.wake_meta != NULL)
            s->backoff_ms = BACKOFF_BY_ID_MS;
        else
            s->backoff_ms = s->signaled ? BACKOFF_MIN_MS
                                        : (s->backoff_ms * 2 > BACKOFF_MAX_MS
                                               ? BACKOFF_MAX_MS
                                               : s->backoff_ms * 2);
    }
    return ask_attempt(s, s->mode, CONT_MAIN);
}

void redsem__acquire_begin(redsem__acq_state *s, const redsem__acquirer *q,
                           const redsem__kind *kind, const char *id, int64_t timeout_ms,
                           int64_t lease_ms)
{
    state_init(s, q, id, timeout_ms);
    s->kind = kind;
    s->lease_ms = lease_ms;
}

int redsem__acquire_next(redsem__acq_state *s)
{
    return acquire_step(s);
}

static int recorded(const redsem__acquirer *q, int rc, int64_t start_ns,
                    redsem_permit **ret_permit);

int redsem__acquire_finish(redsem__acq_state *s, int rc, redsem_permit **ret_permit)
{
    rc = acquire_done(&s->q, s->kind, s->id, s->lease_ms, rc, s->att, s->given_back,
                      ret_permit);
    return recorded(&s->q, rc, s->since_ns, ret_permit);
}

int redsem__acquire_args(redsem_client *c, redsem_permit **ret_permit, int64_t timeout_ms,
                         const char *given_id, bool id_required, char id[REDSEM_ID_BUFSIZE])
{
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if (ret_permit == NULL)
        return redsem__set_err(c, REDSEM_EINVAL, "ret_permit is NULL");
    if (!redsem__valid_wait(timeout_ms))
        return redsem__set_err(c, REDSEM_EINVAL,
                               "timeout %lld ms: use 0 (try), 1..%lld, or REDSEM_WAIT_FOREVER",
                               (long long)timeout_ms, REDSEM_WAIT_MAX_MS);
    if (given_id == NULL && id_required)
        return redsem__set_err(c, REDSEM_EINVAL, "the holder id is NULL");
    if (given_id == NULL)
        return redsem__new_id(id);
    if (!redsem__valid_id(given_id))
        return redsem__set_err(c, REDSEM_EINVAL, "a holder id is %d lower-case hex characters",
                               REDSEM_ID_LEN);
    memcpy(id, given_id, REDSEM_ID_BUFSIZE);
    return REDSEM_OK;
}

/* A decided acquire: a grant made a permit of the given kind (or given back), or rc. */
bool redsem__grant_short(const redsem_client *c, const redsem__attempt *att)
{
    return c->sync_replicas > 0 && att->replicas_acked < c->sync_replicas;
}

redsem_permit *redsem__permit_new(const redsem__kind *kind, void *handle, redsem_client *c,
                                  const char *id, const redsem__attempt *att, int64_t lease_ms)
{
    redsem_permit *p = redsem__calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    p->kind = kind;
    p->handle = handle;
    p->client = c;
    memcpy(p->id, id, REDSEM_ID_BUFSIZE);
    p->token = att->token;
    p->weight = att->weight ? att->weight : 1;
    p->lease_ms = lease_ms;
    atomic_store(&p->deadline_ns, redsem__validity_deadline(att->sent_ns, lease_ms));
    atomic_store(&p->state, REDSEM__HELD);
    return p;
}

static int acquire_done(const redsem__acquirer *q, const redsem__kind *kind, const char *id,
                        int64_t lease_ms, int rc, redsem__attempt att, bool given_back,
                        redsem_permit **ret_permit)
{
    redsem_client *c = q->client;
    if (rc != REDSEM_OK)
        return rc;
    att.weight = q->weight ? q->weight : 1;
    if (redsem__grant_short(c, &att)) {
        /* Granted on the primary, but not known to the replicas the caller asked for: a
         * failover now could hand the permit to someone else. Its driver gave it back
         * (given_back; the engine, drive_loop.c) before it came here. */
        char why[REDSEM__ERRMSG_LEN];
        memcpy(why, redsem__errbuf(c), sizeof why);
        return redsem__set_err(c, REDSEM_EREPLICA,
                               "granted, but %d of the %d replicas required acknowledged it "
                               "within %lld ms: the permit was %s%s%s",
                               att.replicas_acked < 0 ? 0 : att.replicas_acked, c->sync_replicas,
                               (long long)c->sync_timeout_ms,
                               given_back ? "given back" : "not given back (its lease ends)",
                               why[0] ? "; " : "", why);
    }
    redsem_permit *p = redsem__permit_new(kind, q->handle, c, id, &att, lease_ms);
    if (p == NULL) /* granted, but nowhere to keep it: no call from here (inside the engine) */
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory (the permit was granted: its "
                                                 "lease of %lld ms ends by itself)",
                               (long long)lease_ms);
    *ret_permit = p;
    return REDSEM_OK;
}

/* An acquire decided (rc, not REDSEM__PARKED) after it started at start_ns: recorded in its
 * name's figures (metrics.c), and a permit granted tagged with them and its grant time. */
static int recorded(const redsem__acquirer *q, int rc, int64_t start_ns,
                    redsem_permit **ret_permit)
{
    if (q->metrics == NULL)
        return rc;
    int64_t now = redsem__now_ns();
    redsem__metrics_acquired(q->metrics, rc, start_ns, now);
    if (rc == REDSEM_OK) {
        (*ret_permit)->metrics = q->metrics;
        (*ret_permit)->granted_ns = now;
    }
    return rc;
}

