/* redsem - metrics (metrics.h): the exposition of what a client recorded (record.c) in the
 * Prometheus text format 0.0.4 and through a visitor; the server's figures read at scrape
 * time with the status reads of semaphores, locks and rate limiters; SCAN of names. Above
 * the objects it reads (sem.c, lock.c, rate.c, status.c) and the client; nothing calls it
 * but the application. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "internal.h"

#define NB REDSEM_METRICS_BUCKETS

static const char *const kind_names[REDSEM__MK_N] = {"semaphore", "lock", "rate"};
static const char *const out_names[REDSEM__MO_N] = {"granted",   "busy",  "timeout",
                                             "cancelled", "error", "unknown"};
static const char *const lost_names[REDSEM__ML_N] = {"expired", "taken", "renewal_failed"};
static const char *const renew_names[REDSEM__MR_N] = {"ok", "lost", "error"};
static const char *const rate_names[REDSEM__MT_N] = {"allowed", "limited", "error"};

/* The buckets' upper bounds in seconds (record.c has them in ns). */
static const double bounds_s[NB] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                    0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                    5,      10,      30,     60,    120,   300,   INFINITY};
/* ------------------------------------------------------------------ the samples */

/* Each sample, family by family, to one sink: the text writer or the visitor. */
typedef int (*sink_fn)(const redsem_metric *m, void *arg);

#define HELP_WAIT "Time from an acquire's call to its result, by outcome."
#define HELP_HOLD "Time from a grant to its release."
#define HELP_GRANTS "Permits granted to this client."
#define HELP_LOST "Leases this client lost, by reason."
#define HELP_RENEW "Refreshes of leases (by the caller or the renewer), by outcome."
#define HELP_RATE "Rate limiter acquires, by outcome."

static uint64_t ld(const _Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* A histogram's snapshot into m (counts cumulative, read once each). */
static void hist_sample(redsem_metric *m, const redsem__hist *h, uint64_t counts[NB])
{
    uint64_t acc = 0;
    for (int i = 0; i < NB; i++) {
        acc += ld(&h->b[i]);
        counts[i] = acc;
    }
    m->bounds = bounds_s;
    m->counts = counts;
    m->nbuckets = NB;
    m->count = acc;
    m->sum = (double)ld(&h->sum_ns) / 1e9;
}

static int visit_all(const redsem_client *c, sink_fn fn, void *arg)
{
    redsem__metrics *mt = c->metrics;
    size_t n = mt != NULL && !mt->off ? atomic_load_explicit(&mt->norder, memory_order_acquire)
                                      : 0;
    redsem__mslot *const *order = mt != NULL ? mt->order : NULL;
    uint64_t counts[NB];
    redsem_metric_label l[3];
    int rc;
#define EMIT(fam, hlp, typ, nl)                                                                \
    do {                                                                                       \
        m.family = (fam);                                                                      \
        m.help = (hlp);                                                                        \
        m.type = (typ);                                                                        \
        m.labels = l;                                                                          \
        m.nlabels = (nl);                                                                      \
        if ((rc = fn(&m, arg)) != 0)                                                           \
            return rc;                                                                         \
    } while (0)
    redsem_metric m;
    /* the wait histogram: every outcome seen */
    for (size_t i = 0; i < n; i++) {
        const redsem__mslot *s = order[i];
        for (int o = 0; o < REDSEM__MO_N; o++) {
            memset(&m, 0, sizeof m);
            hist_sample(&m, &s->wait[o], counts);
            if (m.count == 0)
                continue;
            l[0] = (redsem_metric_label){"name", s->name};
            l[1] = (redsem_metric_label){"kind", kind_names[s->kind]};
            l[2] = (redsem_metric_label){"outcome", out_names[o]};
            EMIT("redsem_acquire_wait_seconds", HELP_WAIT, REDSEM_METRIC_HISTOGRAM, 3);
        }
    }
    for (size_t i = 0; i < n; i++) {
        const redsem__mslot *s = order[i];
        if (s->kind == REDSEM__MK_RATE)
            continue;
        memset(&m, 0, sizeof m);
        hist_sample(&m, &s->hold, counts);
        l[0] = (redsem_metric_label){"name", s->name};
        l[1] = (redsem_metric_label){"kind", kind_names[s->kind]};
        EMIT("redsem_hold_seconds", HELP_HOLD, REDSEM_METRIC_HISTOGRAM, 2);
    }
    /* the per-name counters: one sample per name and label value */
    static const struct {
        const char *family, *help, *label; /* label NULL: no third label */
        const char *const *values;
        int nvalues;
        size_t off; /* of the counters in the slot */
        bool rate;  /* rate limiters only (no kind label), else all but them */
    } per_name[] = {
        {"redsem_grants_total", HELP_GRANTS, NULL, NULL, 1, offsetof(redsem__mslot, grants),
         false},
        {"redsem_leases_lost_total", HELP_LOST, "reason", lost_names, REDSEM__ML_N,
         offsetof(redsem__mslot, lost), false},
        {"redsem_renewals_total", HELP_RENEW, "outcome", renew_names, REDSEM__MR_N,
         offsetof(redsem__mslot, renew), false},
        {"redsem_rate_limit_total", HELP_RATE, "outcome", rate_names, REDSEM__MT_N,
         offsetof(redsem__mslot, rate), true},
    };
    for (size_t f = 0; f < sizeof per_name / sizeof per_name[0]; f++) {
        for (size_t i = 0; i < n; i++) {
            const redsem__mslot *s = order[i];
            if ((s->kind == REDSEM__MK_RATE) != per_name[f].rate)
                continue;
            const _Atomic uint64_t *v =
                (const _Atomic uint64_t *)((const char *)s + per_name[f].off);
            for (int r = 0; r < per_name[f].nvalues; r++) {
                memset(&m, 0, sizeof m);
                m.value = (double)ld(&v[r]);
                size_t nl = 0;
                l[nl++] = (redsem_metric_label){"name", s->name};
                if (!per_name[f].rate)
                    l[nl++] = (redsem_metric_label){"kind", kind_names[s->kind]};
                if (per_name[f].label != NULL)
                    l[nl++] = (redsem_metric_label){per_name[f].label, per_name[f].values[r]};
                EMIT(per_name[f].family, per_name[f].help, REDSEM_METRIC_COUNTER, nl);
            }
        }
    }
    redsem_client_stats st;
    (void)redsem_client_get_stats(c, &st);
    static const struct {
        const char *family, *help;
        size_t off;
    } counters[] = {
#define C(f, field, h) {"redsem_client_" f "_total", h, offsetof(redsem_client_stats, field)}
        C("requests", requests, "Requests this client wrote to Redis."),
        C("connects", connects, "Connections this client made."),
        C("script_loads", script_loads, "Script bodies this client sent (SCRIPT LOAD)."),
        C("noscript", noscript, "NOSCRIPT replies this client got."),
        C("retries", retries, "Requests re-sent after a connection-level failure."),
        C("redirects", redirects, "Redis Cluster MOVED and ASK replies followed."),
        C("pool_waits", pool_waits, "Requests that waited for a free request connection."),
        C("wakeups", wakeups, "Blocking waits ended by a wake-up signal."),
        C("pipelined", pipelined, "Script calls written in one write with other calls."),
        C("direct_grants", direct_grants, "Acquires decided by a wake-up that carried the permit."),
#undef C
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++) {
        memset(&m, 0, sizeof m);
        uint64_t v;
        memcpy(&v, (const char *)&st + counters[i].off, sizeof v);
        m.value = (double)v;
        EMIT(counters[i].family, counters[i].help, REDSEM_METRIC_COUNTER, 0);
    }
    memset(&m, 0, sizeof m);
    m.value = mt != NULL ? (double)ld(&mt->dropped) : 0;
    EMIT("redsem_metrics_names_dropped_total",
         "Handles whose name found no room under the names cap (recorded as _other).",
         REDSEM_METRIC_COUNTER, 0);
#undef EMIT
    return 0;
}

/* ------------------------------------------------------------------ the text writer */

typedef struct text {
    char *buf;
    size_t len;
    size_t pos;      /* bytes the text needs so far, NUL excluded */
    size_t line_end; /* end of the last whole line that fit */
    const char *family; /* of the last sample written: HELP and TYPE once per family */
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = t->pos < t->len ? t->buf + t->pos : NULL;
    size_t room = t->pos < t->len ? t->len - t->pos : 0;
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->pos += (size_t)n;
}

/* A label value with \, " and newline escaped. */
static void put_escaped(text *t, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            put(t, "\\\\");
        else if (*v == '"')
            put(t, "\\\"");
        else if (*v == '\n')
            put(t, "\\n");
        else
            put(t, "%c", *v);
    }
}

/* A line ends: remember it if it fit (with room for the NUL). */
static void line_done(text *t)
{
    put(t, "\n");
    if (t->pos < t->len)
        t->line_end = t->pos;
}

/* NAME{labels[,le="x"]} */
static void put_series(text *t, const redsem_metric *m, const char *suffix, const char *le)
{
    put(t, "%s%s", m->family, suffix);
    if (m->nlabels == 0 && le == NULL)
        return;
    put(t, "{");
    for (size_t i = 0; i < m->nlabels; i++) {
        put(t, "%s%s=\"", i ? "," : "", m->labels[i].name);
        put_escaped(t, m->labels[i].value);
        put(t, "\"");
    }
    if (le != NULL)
        put(t, "%sle=\"%s\"", m->nlabels ? "," : "", le);
    put(t, "}");
}

static const char *type_name(redsem_metric_type ty)
{
    return ty == REDSEM_METRIC_COUNTER ? "counter" : ty == REDSEM_METRIC_GAUGE ? "gauge"
                                                                                : "histogram";
}

/* A value as Prometheus reads it: integers exactly, else shortest round trip. */
static void put_value(text *t, double v)
{
    if (v >= 0 && v < 9e15 && (double)(uint64_t)v == v) {
        put(t, "%llu", (unsigned long long)v);
        return;
    }
    char s[32];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, v);
        if (strtod(s, NULL) == v)
            break;
    }
    put(t, "%s", s);
}

static int text_sink(const redsem_metric *m, void *arg)
{
    text *t = arg;
    if (t->family == NULL || strcmp(t->family, m->family) != 0) {
        put(t, "# HELP %s %s", m->family, m->help);
        line_done(t);
        put(t, "# TYPE %s %s", m->family, type_name(m->type));
        line_done(t);
        t->family = m->family;
    }
    if (m->type != REDSEM_METRIC_HISTOGRAM) {
        put_series(t, m, "", NULL);
        put(t, " ");
        put_value(t, m->value);
        line_done(t);
        return 0;
    }
    for (size_t i = 0; i < m->nbuckets; i++) {
        char le[32];
        if (m->bounds[i] > 1e300) /* INFINITY: no libm needed */
            snprintf(le, sizeof le, "+Inf");
        else
            snprintf(le, sizeof le, "%g", m->bounds[i]);
        put_series(t, m, "_bucket", le);
        put(t, " %llu", (unsigned long long)m->counts[i]);
        line_done(t);
    }
    put_series(t, m, "_sum", NULL);
    put(t, " ");
    put_value(t, m->sum);
    line_done(t);
    put_series(t, m, "_count", NULL);
    put(t, " %llu", (unsigned long long)m->count);
    line_done(t);
    return 0;
}

static void text_init(text *t, char *buf, size_t len)
{
    *t = (text){.buf = buf, .len = len};
    if (len > 0)
        buf[0] = '\0';
}

/* The end of a text: REDSEM_OK, or REDSEM_ERANGE with the prefix cut at a line end. */
static int text_end(text *t, size_t *needed)
{
    if (needed != NULL)
        *needed = t->pos + 1;
    if (t->pos < t->len)
        return REDSEM_OK;
    if (t->len > 0)
        t->buf[t->line_end] = '\0';
    return REDSEM_ERANGE;
}

int redsem_metrics_write(const redsem_client *c, char *buf, size_t len, size_t *needed)
{
    if (c == NULL || (buf == NULL && len > 0))
        return REDSEM_EINVAL;
    text t;
    text_init(&t, buf, len);
    (void)visit_all(c, text_sink, &t);
    return text_end(&t, needed);
}

int redsem_metrics_visit(const redsem_client *c, redsem_metric_visitor fn, void *arg)
{
    if (c == NULL || fn == NULL)
        return REDSEM_EINVAL;
    return visit_all(c, fn, arg);
}

/* ------------------------------------------------------------------ the server's figures */

/* Waiters listed per name by a scrape: the oldest wait is the oldest among them. */
#define SCRAPE_LISTED 256
/* Names per redsem_metrics_write_server() call at most. */
#define SCRAPE_NAMES_MAX 100000

/* What one scrape read for one (name, kind) that exists. */
typedef struct srv_rec {
    const char *name;
    int kind;
    uint32_t limit;
    uint64_t in_use, holders, waiters, expired, window_grants;
    double oldest_s;
} srv_rec;

static int seen_name_cmp(const redsem__seen_name *a, int kind, const char *name)
{
    return a->kind != kind ? (a->kind > kind) - (a->kind < kind) : strcmp(a->name, name);
}

static int seen_waiter_cmp(const void *a, const void *b)
{
    return strcmp(((const redsem__seen_waiter *)a)->id, ((const redsem__seen_waiter *)b)->id);
}

/* The age in seconds of the oldest waiter of st that scrapes have seen (the time since the
 * first scrape that listed it), remembering st's listed waiters for the next scrape. 0 when
 * none is listed (st NULL: the name is not on the server), or without memory. */
static double oldest_wait(redsem__metrics *m, int kind, const char *name,
                          const redsem_status *st, int64_t now)
{
    size_t n = st != NULL ? redsem_status_waiters_listed(st) : 0;
    redsem__seen_waiter *w = n ? redsem__calloc(n, sizeof *w) : NULL;
    if (n && w == NULL)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const char *id = "";
        (void)redsem_status_waiter(st, i, &id, NULL, NULL);
        snprintf(w[i].id, sizeof w[i].id, "%s", id);
        w[i].first_ns = now;
    }
    if (n > 0)
        qsort(w, n, sizeof *w, seen_waiter_cmp);
    pthread_mutex_lock(&m->seen_mu);
    size_t lo = 0, hi = m->nseen;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (seen_name_cmp(&m->seen[mid], kind, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    redsem__seen_name *e = NULL;
    if (lo < m->nseen && seen_name_cmp(&m->seen[lo], kind, name) == 0)
        e = &m->seen[lo];
    if (n == 0) {
        /* nothing to remember: forget the name (the memory stays bounded by the names
         * with waiters now, and a waiter seen again later starts from now) */
        if (e != NULL) {
            redsem__free(e->name);
            redsem__free(e->w);
            memmove(e, e + 1, (m->nseen - lo - 1) * sizeof *e);
            m->nseen--;
        }
        pthread_mutex_unlock(&m->seen_mu);
        return 0;
    }
    if (e == NULL) {
        char *copy = redsem__strdup(name);
        if (m->nseen == m->seen_cap) {
            size_t cap = m->seen_cap ? 2 * m->seen_cap : 16;
            redsem__seen_name *v = copy ? redsem__realloc(m->seen, cap * sizeof *v) : NULL;
            if (v != NULL) {
                m->seen = v;
                m->seen_cap = cap;
            }
        }
        if (copy == NULL || m->nseen == m->seen_cap) {
            pthread_mutex_unlock(&m->seen_mu);
            redsem__free(copy);
            redsem__free(w);
            return 0;
        }
        memmove(&m->seen[lo + 1], &m->seen[lo], (m->nseen - lo) * sizeof *m->seen);
        m->nseen++;
        e = &m->seen[lo];
        *e = (redsem__seen_name){.name = copy, .kind = kind};
    }
    int64_t first = now;
    for (size_t i = 0; i < n; i++) {
        const redsem__seen_waiter *old =
            e->n ? bsearch(&w[i], e->w, e->n, sizeof *w, seen_waiter_cmp) : NULL;
        if (old != NULL)
            w[i].first_ns = old->first_ns;
        if (w[i].first_ns < first)
            first = w[i].first_ns;
    }
    redsem__free(e->w);
    e->w = w;
    e->n = n;
    pthread_mutex_unlock(&m->seen_mu);
    return (double)(now - first) / 1e9;
}

/* The server's figures of one name into recs (0..3 of them: it may be a semaphore, a lock
 * and a rate limiter at once). REDSEM_OK or the first read's fault. */
static int read_name(redsem_client *c, const char *name, srv_rec *recs, size_t *nrecs)
{
    redsem_status *st = NULL;
    int rc = redsem_sem_inspect(c, name, SCRAPE_LISTED, &st);
    int64_t now = redsem__now_ns();
    if (rc != REDSEM_OK)
        return rc;
    double oldest = oldest_wait(c->metrics, REDSEM__MK_SEM, name,
                                redsem_status_exists(st) ? st : NULL, now);
    if (redsem_status_exists(st))
        recs[(*nrecs)++] = (srv_rec){
            .name = name, .kind = REDSEM__MK_SEM, .limit = redsem_status_limit(st),
            .in_use = redsem_status_permits_in_use(st),
            .holders = redsem_status_holder_count(st),
            .waiters = redsem_status_waiter_count(st), .expired = st->expired,
            .oldest_s = oldest};
    redsem_status_free(st);
    redsem_lock *l = NULL;
    if ((rc = redsem_lock_open(c, name, REDSEM_LEASE_MIN_MS, &l)) != REDSEM_OK)
        return rc;
    rc = redsem_lock_status(l, SCRAPE_LISTED, &st);
    now = redsem__now_ns();
    redsem_lock_free(l);
    if (rc != REDSEM_OK)
        return rc;
    oldest = oldest_wait(c->metrics, REDSEM__MK_LOCK, name, redsem_status_exists(st) ? st : NULL,
                         now);
    if (redsem_status_exists(st))
        recs[(*nrecs)++] = (srv_rec){
            .name = name, .kind = REDSEM__MK_LOCK, .limit = 1,
            .in_use = redsem_status_holder_count(st),
            .holders = redsem_status_holder_count(st),
            .waiters = redsem_status_waiter_count(st), .oldest_s = oldest};
    redsem_status_free(st);
    redsem_rate_info ri;
    if ((rc = redsem_rate_inspect(c, name, &ri)) != REDSEM_OK)
        return rc;
    if (ri.exists)
        recs[(*nrecs)++] = (srv_rec){.name = name, .kind = REDSEM__MK_RATE, .limit = ri.limit,
                                     .waiters = ri.waiters, .window_grants = ri.in_window};
    return REDSEM_OK;
}

/* One gauge or counter family over the records (those of the kinds it applies to). */
static void put_family(text *t, const char *family, const char *help, redsem_metric_type ty,
                       const srv_rec *recs, size_t n, bool rate_only, bool no_rate,
                       size_t field)
{
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        const srv_rec *r = &recs[i];
        if ((rate_only && r->kind != REDSEM__MK_RATE) || (no_rate && r->kind == REDSEM__MK_RATE))
            continue;
        if (!any) {
            put(t, "# HELP %s %s", family, help);
            line_done(t);
            put(t, "# TYPE %s %s", family, type_name(ty));
            line_done(t);
            any = true;
        }
        redsem_metric_label l[2] = {{"name", r->name}, {"kind", kind_names[r->kind]}};
        redsem_metric m = {.family = family, .labels = l, .nlabels = rate_only ? 1 : 2};
        put_series(t, &m, "", NULL);
        put(t, " ");
        const char *base = (const char *)r + field;
        if (field == offsetof(srv_rec, oldest_s)) {
            double v;
            memcpy(&v, base, sizeof v);
            put(t, "%.3f", v);
        } else if (field == offsetof(srv_rec, limit)) {
            uint32_t v;
            memcpy(&v, base, sizeof v);
            put(t, "%u", v);
        } else {
            uint64_t v;
            memcpy(&v, base, sizeof v);
            put(t, "%llu", (unsigned long long)v);
        }
        line_done(t);
    }
}

/* A name and its place in the caller's list, sorted by name, then by place. */
typedef struct placed_name {
    const char *name;
    size_t i;
} placed_name;

static int placed_cmp(const void *a, const void *b)
{
    const placed_name *x = a, *y = b;
    int d = strcmp(x->name, y->name);
    return d != 0 ? d : (x->i > y->i) - (x->i < y->i);
}

/* For each of the n names, whether an earlier one is the same (malloc'd; NULL: no memory). */
static bool *repeated_names(const char *const *names, size_t n)
{
    bool *repeat = redsem__calloc(n, sizeof *repeat);
    placed_name *v = redsem__calloc(n, sizeof *v);
    if (repeat == NULL || v == NULL) {
        redsem__free(repeat);
        redsem__free(v);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = (placed_name){names[i], i};
    qsort(v, n, sizeof *v, placed_cmp);
    for (size_t i = 1; i < n; i++)
        repeat[v[i].i] = strcmp(v[i].name, v[i - 1].name) == 0;
    redsem__free(v);
    return repeat;
}

int redsem_metrics_write_server(redsem_client *c, const char *const *names, size_t n, char *buf,
                                size_t len, size_t *needed)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    if ((names == NULL && n > 0) || (buf == NULL && len > 0) || n > SCRAPE_NAMES_MAX)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "names NULL with n > 0, buf NULL with len > 0, or more than %d "
                               "names",
                               SCRAPE_NAMES_MAX);
    for (size_t i = 0; i < n; i++)
        if (names[i] == NULL || !redsem__valid_name(names[i]))
            return redsem__set_err(c, REDSEM_EINVAL,
                                   "name %zu: must be 1..%d bytes of printable ASCII without "
                                   "'{' '}'",
                                   i, REDSEM_NAME_MAX);
    srv_rec *recs = n ? redsem__calloc(3 * n, sizeof *recs) : NULL;
    bool *repeat = n ? repeated_names(names, n) : NULL;
    if (n && (recs == NULL || repeat == NULL)) {
        redsem__free(recs);
        redsem__free(repeat);
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    }
    size_t nrecs = 0;
    int up_rc = REDSEM_OK;
    for (size_t i = 0; i < n && up_rc == REDSEM_OK; i++)
        if (!repeat[i]) /* a series twice in one scrape is an error to Prometheus */
            up_rc = read_name(c, names[i], recs, &nrecs);
    redsem__free(repeat);
    if (up_rc == REDSEM_ENOMEM) {
        redsem__free(recs);
        return up_rc;
    }
    if (up_rc != REDSEM_OK)
        nrecs = 0; /* down: no name's series (the error text says why) */
    text t;
    text_init(&t, buf, len);
    put(&t, "# HELP redsem_up Whether every read of this scrape succeeded (1) or Redis could "
            "not be read (0).");
    line_done(&t);
    put(&t, "# TYPE redsem_up gauge");
    line_done(&t);
    put(&t, "redsem_up %d", up_rc == REDSEM_OK);
    line_done(&t);
    put_family(&t, "redsem_limit", "Permits of a semaphore (1 for a lock, N for a rate limiter).",
               REDSEM_METRIC_GAUGE, recs, nrecs, false, false, offsetof(srv_rec, limit));
    put_family(&t, "redsem_permits_in_use", "Permits held now (weights summed).",
               REDSEM_METRIC_GAUGE, recs, nrecs, false, true, offsetof(srv_rec, in_use));
    put_family(&t, "redsem_holders", "Live holders now.", REDSEM_METRIC_GAUGE, recs, nrecs,
               false, true, offsetof(srv_rec, holders));
    put_family(&t, "redsem_waiters", "Live registered or queued waiters now.",
               REDSEM_METRIC_GAUGE, recs, nrecs, false, false, offsetof(srv_rec, waiters));
    put_family(&t, "redsem_oldest_wait_seconds",
               "Age of the oldest listed waiter, since a scrape of this client first saw it.",
               REDSEM_METRIC_GAUGE, recs, nrecs, false, true, offsetof(srv_rec, oldest_s));
    put_family(&t, "redsem_rate_window_grants", "Grants of a rate limiter in its current window.",
               REDSEM_METRIC_GAUGE, recs, nrecs, true, false, offsetof(srv_rec, window_grants));
    /* the clean-up's counter: semaphores only (a lock's lease ends by the key's own expiry) */
    size_t nsem = 0;
    for (size_t i = 0; i < nrecs; i++)
        if (recs[i].kind == REDSEM__MK_SEM)
            recs[nsem++] = recs[i];
    put_family(&t, "redsem_leases_expired_total",
               "Holders the scripts' clean-up removed after their lease ran out, never released.",
               REDSEM_METRIC_COUNTER, recs, nsem, false, true, offsetof(srv_rec, expired));
    redsem__free(recs);
    return text_end(&t, needed); /* down: the failed read's error text stays */
}

/* ------------------------------------------------------------------ SCAN */

/* Names found so far: sorted and distinct at the end. */
static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The NAME of a key PREFIX{NAME}... (NULL if it is not of that form). */
static char *name_of_key(const redsem_client *c, const char *key, size_t len)
{
    if (len < c->prefix_len + 2 || memcmp(key, c->prefix, c->prefix_len) != 0 ||
        key[c->prefix_len] != '{')
        return NULL;
    const char *s = key + c->prefix_len + 1;
    const char *e = memchr(s, '}', len - c->prefix_len - 1);
    if (e == NULL || e == s)
        return NULL;
    char *name = redsem__memdup0(s, (size_t)(e - s));
    if (name != NULL && !redsem__valid_name(name)) {
        redsem__free(name);
        return NULL;
    }
    return name;
}

int redsem_scan_names(redsem_client *c, const char *pattern, size_t max, char ***ret_names,
                      size_t *ret_n, bool *capped)
{
    if (c == NULL)
        return REDSEM_EINVAL;
    int rc = redsem__check_owner(c);
    if (rc != REDSEM_OK)
        return rc;
    size_t plen = pattern != NULL ? strlen(pattern) : 0;
    if (pattern == NULL || plen == 0 || plen > 1024 || max < 1 || max > 1000000 ||
        ret_names == NULL || ret_n == NULL)
        return redsem__set_err(c, REDSEM_EINVAL,
                               "pattern NULL or not 1..1024 bytes, max not 1..1000000, or "
                               "ret_names / ret_n NULL");
    if (c->ep.kind == REDSEM__EP_CLUSTER)
        return redsem__set_err(c, REDSEM_ESTATE,
                               "SCAN of names is not supported on a Redis Cluster client");
    /* MATCH PREFIX{PATTERN}* (the prefix's own glob characters escaped) */
    size_t mlen = 2 * c->prefix_len + plen + 4;
    char *match = redsem__malloc(mlen);
    if (match == NULL)
        return redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < c->prefix_len; i++) {
        if (strchr("*?[]\\", c->prefix[i]) != NULL)
            match[k++] = '\\';
        match[k++] = c->prefix[i];
    }
    k += (size_t)snprintf(match + k, mlen - k, "{%s}*", pattern);
    size_t n = 0, cap = 0;
    char **names = NULL;
    bool over = false;
    char cursor[32] = "0";
    do {
        redsem__args a;
        redsem__args_init(&a);
        redsem__args_str(&a, "SCAN");
        redsem__args_str(&a, cursor);
        redsem__args_str(&a, "MATCH");
        redsem__args_str(&a, match);
        redsem__args_str(&a, "COUNT");
        redsem__args_str(&a, "1000");
        redisReply *r = NULL;
        rc = redsem__request(c, &a, REDSEM__REQ_RETRY, 0, &r, NULL);
        if (rc != REDSEM_OK)
            break;
        if (r->type == REDIS_REPLY_ERROR) {
            rc = redsem__set_err(c, strncmp(r->str, "NOPERM", 6) == 0 ? REDSEM_EPERM
                                                                      : REDSEM_ESERVER,
                                 "SCAN: %.200s", r->str);
            freeReplyObject(r);
            break;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof cursor ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            rc = redsem__set_err(c, REDSEM_EPROTO, "SCAN: unexpected reply");
            break;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
        const redisReply *keys = r->element[1];
        for (size_t i = 0; i < keys->elements && rc == REDSEM_OK; i++) {
            const redisReply *key = keys->element[i];
            if (key->type != REDIS_REPLY_STRING)
                continue;
            char *name = name_of_key(c, key->str, key->len);
            if (name == NULL)
                continue;
            if (n == cap) {
                size_t ncap = cap ? 2 * cap : 64;
                char **v = redsem__realloc(names, ncap * sizeof *v);
                if (v == NULL) {
                    redsem__free(name);
                    rc = redsem__set_err(c, REDSEM_ENOMEM, "out of memory");
                    break;
                }
                names = v;
                cap = ncap;
            }
            names[n++] = name;
        }
        freeReplyObject(r);
        if (rc != REDSEM_OK)
            break;
        /* distinct names so far; past the cap: stop */
        if (n > 0)
            qsort(names, n, sizeof *names, name_cmp);
        size_t d = 0;
        for (size_t i = 0; i < n; i++) {
            if (d > 0 && strcmp(names[d - 1], names[i]) == 0)
                redsem__free(names[i]);
            else
                names[d++] = names[i];
        }
        n = d;
        if (n > max) {
            over = true;
            break;
        }
    } while (strcmp(cursor, "0") != 0);
    redsem__free(match);
    if (rc != REDSEM_OK) {
        redsem_names_free(names, n);
        return rc;
    }
    if (over) {
        for (size_t i = max; i < n; i++)
            redsem__free(names[i]);
        n = max;
    }
    if (n == 0) {
        redsem__free(names);
        names = NULL;
    }
    *ret_names = names;
    *ret_n = n;
    if (capped != NULL)
        *capped = over;
    return REDSEM_OK;
}

void redsem_names_free(char **names, size_t n)
{
    if (names == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        redsem__free(names[i]);
    redsem__free(names);
}
