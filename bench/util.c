/* redsem-bench - time, samples, percentiles, library and raw hiredis helpers. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench.h"

/* ================================================================ kinds */

static const char *const kind_names[BENCH_NALL] = {"basic", "fair", "locked", "lock",
                                                   "book-fair", "book-locked"};

const char *bench_kind_name(int kind)
{
    return kind >= 0 && kind < BENCH_NALL ? kind_names[kind] : "?";
}

int bench_kind_acquire_trips(int kind)
{
    return kind == BENCH_LOCKED ? 3 : 1;
}

/* ================================================================ time, randomness */

int64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void bench_sleep_ns(int64_t ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

uint64_t bench_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

uint64_t bench_seed(void)
{
    char id[REDSEM_ID_BUFSIZE];
    uint64_t s = 0;
    if (redsem_id_generate(id) == REDSEM_OK)
        s = strtoull(id + 24, NULL, 16);
    s ^= (uint64_t)bench_now_ns();
    return s ? s : 0x9E3779B97F4A7C15ULL;
}

/* ================================================================ samples */

void samples_init(bench_samples *s)
{
    s->v = NULL;
    s->n = s->cap = 0;
}

void samples_free(bench_samples *s)
{
    free(s->v);
    samples_init(s);
}

void samples_add(bench_samples *s, int64_t ns)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        int64_t *v = realloc(s->v, cap * sizeof *v);
        if (v == NULL)
            bench_die("out of memory (samples)");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = ns;
}

void samples_merge(bench_samples *dst, const bench_samples *src)
{
    for (size_t i = 0; i < src->n; i++)
        samples_add(dst, src->v[i]);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the ceil(q * n)-th smallest value, q given in parts per million. */
static int64_t rank_ppm(const int64_t *v, size_t n, uint64_t ppm)
{
    uint64_t r = ((uint64_t)n * ppm + 999999) / 1000000;
    if (r < 1)
        r = 1;
    if (r > n)
        r = n;
    return v[r - 1];
}

bench_pct bench_percentiles(int64_t *v, size_t n)
{
    bench_pct p = {.n = n};
    if (n == 0)
        return p;
    qsort(v, n, sizeof *v, cmp_i64);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    p.mean = sum / (double)n / 1e3;
    p.p50 = (double)rank_ppm(v, n, 500000) / 1e3;
    p.p90 = (double)rank_ppm(v, n, 900000) / 1e3;
    p.p99 = (double)rank_ppm(v, n, 990000) / 1e3;
    p.p999 = (double)rank_ppm(v, n, 999000) / 1e3;
    p.max = (double)v[n - 1] / 1e3;
    return p;
}

json_t *bench_pct_json(const bench_pct *p)
{
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "n", (json_int_t)p->n, "mean_us",
                     p->mean, "p50_us", p->p50, "p90_us", p->p90, "p99_us", p->p99, "p999_us",
                     p->p999, "max_us", p->max);
}

double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_jain(const uint64_t *x, size_t n)
{
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        s += (double)x[i];
        s2 += (double)x[i] * (double)x[i];
    }
    if (n == 0 || s2 == 0)
        return 1;
    return s * s / ((double)n * s2);
}

/* ================================================================ output */

void bench_progress(const bench_ctx *ctx, const char *fmt, ...)
{
    if (ctx->o->quiet)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "redsem-bench [%6.1f s] %s\n", (double)(bench_now_ns() - ctx->t0_ns) / 1e9,
            buf);
}

_Noreturn void bench_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("redsem-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

void bench_rule(int width)
{
    for (int i = 0; i < width; i++)
        putchar('-');
    putchar('\n');
}

/* ================================================================ library clients */

int bench_client_try(const bench_ctx *ctx, redsem_client **ret, char *err, size_t errlen)
{
    redsem_options *o = NULL;
    if (redsem_options_new(&o) != REDSEM_OK) {
        snprintf(err, errlen, "out of memory");
        return REDSEM_ENOMEM;
    }
    int rc = redsem_options_set_url(o, ctx->url);
    if (rc == REDSEM_OK)
        rc = redsem_options_set_key_prefix(o, ctx->prefix);
    /* Generous: on a 2-core machine 32 busy clients can stall one for a while. */
    if (rc == REDSEM_OK)
        rc = redsem_options_set_command_timeout_ms(o, 10000);
    if (rc == REDSEM_OK && ctx->tls_ca != NULL)
        rc = redsem_options_set_tls_ca(o, ctx->tls_ca, NULL);
    if (rc == REDSEM_OK && ctx->sync_replicas > 0)
        rc = redsem_options_set_sync_replicas(o, ctx->sync_replicas, ctx->sync_timeout_ms);
    if (rc == REDSEM_OK && ctx->o != NULL && ctx->o->max_connections > 0)
        rc = redsem_options_set_max_connections(o, ctx->o->max_connections);
    if (rc == REDSEM_OK && ctx->metrics_off)
        rc = redsem_options_set_metrics(o, false);
    if (rc == REDSEM_OK)
        rc = redsem_client_new_verbose(o, ret, err, errlen);
    else
        snprintf(err, errlen, "bad options");
    redsem_options_free(o);
    return rc;
}

redsem_client *bench_client(const bench_ctx *ctx)
{
    redsem_client *c = NULL;
    char err[512] = "";
    int rc = bench_client_try(ctx, &c, err, sizeof err);
    if (rc != REDSEM_OK)
        bench_die("cannot connect to %s: %s (%s)", ctx->url, redsem_strerror(rc), err);
    return c;
}

void bench_floor_name(const char *name, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s", name);
    if (out[0] != '\0')
        out[0] = out[0] == 'F' ? 'G' : 'F';
}

/* CRC16-XMODEM, as the Redis Cluster specification's HASH_SLOT (the library has its own; the
 * bench links only the public API). */
int bench_name_slot(const char *name)
{
    uint16_t crc = 0;
    for (const char *p = name; *p; p++) {
        crc ^= (uint16_t)((unsigned char)*p << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc & 16383;
}

void bench_name(bench_ctx *ctx, const char *tag, char *out, size_t outlen)
{
    char fname[REDSEM_NAME_MAX + 1];
    for (;;) {
        snprintf(out, outlen, "%s-%u", tag, ++ctx->seq);
        if (ctx->raw_slots == NULL)
            return;
        bench_floor_name(out, fname, sizeof fname);
        if (ctx->raw_slots[bench_name_slot(out)] && ctx->raw_slots[bench_name_slot(fname)])
            return;
    }
}

int bench_handle_open(redsem_client *c, int kind, const char *name, uint32_t limit,
                      int64_t lease_ms, bench_handle *h)
{
    memset(h, 0, sizeof *h);
    h->kind = kind;
    if (kind == BENCH_LOCK)
        return redsem_lock_open(c, name, lease_ms, &h->lock);
    static const redsem_strategy st[] = {REDSEM_STRATEGY_BASIC, REDSEM_STRATEGY_FAIR,
                                         REDSEM_STRATEGY_LOCKED};
    return redsem_sem_open(c, name, st[kind], limit, lease_ms, &h->sem);
}

void bench_handle_close(bench_handle *h)
{
    redsem_sem_free(h->sem);
    redsem_lock_free(h->lock);
    h->sem = NULL;
    h->lock = NULL;
}

int bench_acquire(bench_handle *h, int64_t timeout_ms, redsem_permit **p)
{
    if (h->kind == BENCH_LOCK)
        return redsem_lock_acquire(h->lock, timeout_ms, p);
    return redsem_sem_acquire(h->sem, timeout_ms, p);
}

int bench_acquire_as(bench_handle *h, const char *id, int64_t timeout_ms, redsem_permit **p)
{
    if (h->kind == BENCH_LOCK)
        return redsem_lock_acquire_as(h->lock, id, timeout_ms, p);
    return redsem_sem_acquire_as(h->sem, id, timeout_ms, p);
}

void bench_lib_pair(bench_handle *h, redsem_client *c, int64_t *acq_ns, int64_t *rel_ns)
{
    redsem_permit *p = NULL;
    int64_t t0 = bench_now_ns();
    int rc = bench_acquire(h, 5000, &p);
    int64_t t1 = bench_now_ns();
    if (rc != REDSEM_OK)
        bench_die("acquire: %s (%s)", redsem_err_name(rc), redsem_client_errmsg(c));
    rc = redsem_permit_release(p);
    int64_t t2 = bench_now_ns();
    if (rc != REDSEM_OK)
        bench_die("release: %s (%s)", redsem_err_name(rc), redsem_client_errmsg(c));
    redsem_permit_free(p);
    *acq_ns = t1 - t0;
    *rel_ns = t2 - t1;
}

static redsem_client_stats client_stats(const redsem_client *c)
{
    redsem_client_stats st;
    if (redsem_client_get_stats(c, &st) != REDSEM_OK)
        memset(&st, 0, sizeof st);
    return st;
}

uint64_t bench_requests(const redsem_client *c)
{
    return client_stats(c).requests;
}

uint64_t bench_pool_waits(const redsem_client *c)
{
    return client_stats(c).pool_waits;
}

/* ================================================================ raw hiredis */

/* Percent-decode [s, s+len) into out (NUL-terminated). */
static void pct_decode(const char *s, size_t len, char *out, size_t outlen)
{
    size_t j = 0;
    for (size_t i = 0; i < len && j + 1 < outlen; i++) {
        if (s[i] == '%' && i + 2 < len) {
            char hex[3] = {s[i + 1], s[i + 2], 0};
            char *end = NULL;
            long v = strtol(hex, &end, 16);
            if (end == hex + 2) {
                out[j++] = (char)v;
                i += 2;
                continue;
            }
        }
        out[j++] = s[i];
    }
    out[j] = '\0';
}

typedef struct raw_target {
    bool unix_socket;
    char host[256];
    int port;
    char path[512];
    char user[256];
    char password[256];
    long db;
} raw_target;

/* The subset of the library's URL syntax the raw connections need (see client.h). */
static int parse_url(const char *url, raw_target *t)
{
    memset(t, 0, sizeof *t);
    t->port = 6379;
    const char *p;
    if (strncmp(url, "redis://", 8) == 0) {
        p = url + 8;
    } else if (strncmp(url, "redis+cluster://", 16) == 0) {
        p = url + 16; /* the first seed node (the host ends at ':' or ',') */
    } else if (strncmp(url, "unix://", 7) == 0) {
        p = url + 7;
        t->unix_socket = true;
    } else {
        return -1;
    }
    /* credentials: up to the last '@' before the path (unix) or the end of the authority */
    const char *auth_end = t->unix_socket ? strchr(p, '/') : strpbrk(p, "/?");
    if (auth_end == NULL)
        auth_end = p + strlen(p);
    const char *at = NULL;
    for (const char *q = p; q < auth_end; q++)
        if (*q == '@')
            at = q;
    if (at != NULL) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon != NULL) {
            pct_decode(p, (size_t)(colon - p), t->user, sizeof t->user);
            pct_decode(colon + 1, (size_t)(at - colon - 1), t->password, sizeof t->password);
        } else {
            pct_decode(p, (size_t)(at - p), t->password, sizeof t->password);
        }
        p = at + 1;
    }
    if (t->unix_socket) {
        const char *q = strchr(p, '?');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == 0 || len >= sizeof t->path)
            return -1;
        memcpy(t->path, p, len);
        if (q && strncmp(q, "?db=", 4) == 0)
            t->db = strtol(q + 4, NULL, 10);
        return 0;
    }
    const char *hend;
    if (*p == '[') {
        hend = strchr(p, ']');
        if (hend == NULL || (size_t)(hend - p - 1) >= sizeof t->host)
            return -1;
        memcpy(t->host, p + 1, (size_t)(hend - p - 1));
        hend++;
    } else {
        hend = p + strcspn(p, ":/?,");
        if (hend == p || (size_t)(hend - p) >= sizeof t->host)
            return -1;
        memcpy(t->host, p, (size_t)(hend - p));
    }
    if (*hend == ':')
        t->port = (int)strtol(hend + 1, (char **)&hend, 10);
    if (*hend == '/' && hend[1])
        t->db = strtol(hend + 1, NULL, 10);
    return 0;
}

static bool reply_ok(redisContext *c, redisReply *r, const char *what)
{
    bool ok = r != NULL && r->type != REDIS_REPLY_ERROR;
    if (!ok)
        fprintf(stderr, "redsem-bench: %s: %s\n", what,
                r ? r->str : (c->errstr[0] ? c->errstr : "no reply"));
    if (r)
        freeReplyObject(r);
    return ok;
}

redisContext *bench_raw_connect(const bench_ctx *ctx)
{
    raw_target t;
    if (parse_url(ctx->url, &t) != 0)
        bench_die("cannot parse URL %s for the raw connections", ctx->url);
    struct timeval tv = {5, 0};
    redisContext *c = t.unix_socket ? redisConnectUnixWithTimeout(t.path, tv)
                                    : redisConnectWithTimeout(t.host, t.port, tv);
    if (c == NULL || c->err)
        bench_die("raw connect to %s: %s", ctx->url, c ? c->errstr : "out of memory");
    struct timeval ct = {30, 0};
    redisSetTimeout(c, ct);
    if (t.password[0]) {
        redisReply *r = t.user[0] ? redisCommand(c, "AUTH %s %s", t.user, t.password)
                                  : redisCommand(c, "AUTH %s", t.password);
        if (!reply_ok(c, r, "AUTH"))
            bench_die("raw connection: AUTH failed");
    }
    if (t.db != 0 && !reply_ok(c, redisCommand(c, "SELECT %ld", t.db), "SELECT"))
        bench_die("raw connection: SELECT failed");
    return c;
}

unsigned char *bench_raw_slots(const bench_ctx *ctx)
{
    if (strncmp(ctx->url, "redis+cluster://", 16) != 0)
        return NULL;
    redisContext *c = bench_raw_connect(ctx);
    redisReply *id = redisCommand(c, "CLUSTER MYID");
    redisReply *r = redisCommand(c, "CLUSTER SLOTS");
    if (id == NULL || id->type != REDIS_REPLY_STRING || r == NULL || r->type != REDIS_REPLY_ARRAY)
        bench_die("%s: CLUSTER MYID / CLUSTER SLOTS failed", ctx->url);
    unsigned char *slots = calloc(16384, 1);
    if (slots == NULL)
        bench_die("out of memory");
    size_t served = 0;
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[2]->elements < 3 ||
            strcmp(e->element[2]->element[2]->str, id->str) != 0)
            continue;
        for (long long s = e->element[0]->integer; s <= e->element[1]->integer && s < 16384; s++)
            slots[s] = 1;
        served += (size_t)(e->element[1]->integer - e->element[0]->integer + 1);
    }
    if (served == 0)
        bench_die("%s: the first node of the URL serves no hash slot (name a primary first)",
                  ctx->url);
    freeReplyObject(id);
    freeReplyObject(r);
    redisFree(c);
    return slots;
}

int bench_cmdstats_get(redisContext *c, bench_cmdstats *out)
{
    out->n = 0;
    redisReply *r = redisCommand(c, "INFO commandstats");
    if (r == NULL || r->type != REDIS_REPLY_STRING) {
        if (r)
            freeReplyObject(r);
        return -1;
    }
    /* cmdstat_evalsha:calls=12,usec=34,usec_per_call=2.83,rejected_calls=0,failed_calls=0 */
    const char *p = r->str;
    while ((p = strstr(p, "cmdstat_")) != NULL && out->n < BENCH_MAX_CMDS) {
        p += 8;
        const char *colon = strchr(p, ':');
        if (colon == NULL)
            break;
        size_t len = (size_t)(colon - p);
        if (len >= sizeof out->name[0])
            len = sizeof out->name[0] - 1;
        memcpy(out->name[out->n], p, len);
        out->name[out->n][len] = '\0';
        const char *calls = strstr(colon, "calls=");
        out->calls[out->n] = calls ? strtoull(calls + 6, NULL, 10) : 0;
        const char *usec = strstr(colon, "usec=");
        out->usec[out->n] = usec ? strtoull(usec + 5, NULL, 10) : 0;
        out->n++;
        p = colon;
    }
    freeReplyObject(r);
    return 0;
}

uint64_t bench_cmdstats_calls(const bench_cmdstats *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0)
            return s->calls[i];
    return 0;
}

uint64_t bench_cmdstats_request_usec(const bench_cmdstats *s, int kind)
{
    uint64_t sum = 0;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], "evalsha") == 0 || strcmp(s->name[i], "blpop") == 0)
            sum += s->usec[i];
    /* every strategy's requests are EVALSHA now, the locked guard's included; the book's
     * guard is a plain SET */
    if (kind == BENCH_BOOK_LOCKED)
        for (int i = 0; i < s->n; i++)
            if (strcmp(s->name[i], "set") == 0)
                sum += s->usec[i];
    return sum;
}

double bench_server_cpu_us(redisContext *c)
{
    char u[64], y[64];
    bench_info_field(c, "cpu", "used_cpu_user_main_thread", u, sizeof u);
    bench_info_field(c, "cpu", "used_cpu_sys_main_thread", y, sizeof y);
    if (!u[0] || !y[0]) {
        bench_info_field(c, "cpu", "used_cpu_user", u, sizeof u);
        bench_info_field(c, "cpu", "used_cpu_sys", y, sizeof y);
    }
    if (!u[0] || !y[0])
        return -1;
    return (strtod(u, NULL) + strtod(y, NULL)) * 1e6;
}

double bench_thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

void bench_info_field(redisContext *c, const char *section, const char *field, char *out,
                      size_t outlen)
{
    out[0] = '\0';
    redisReply *r = redisCommand(c, "INFO %s", section);
    if (r == NULL)
        return;
    if (r->type == REDIS_REPLY_STRING) {
        size_t fl = strlen(field);
        for (const char *p = r->str; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
            if (strncmp(p, field, fl) == 0 && p[fl] == ':') {
                size_t len = strcspn(p + fl + 1, "\r\n");
                if (len >= outlen)
                    len = outlen - 1;
                memcpy(out, p + fl + 1, len);
                out[len] = '\0';
                break;
            }
        }
    }
    freeReplyObject(r);
}

long bench_connected_clients(redisContext *c)
{
    char v[32];
    bench_info_field(c, "clients", "connected_clients", v, sizeof v);
    return v[0] ? strtol(v, NULL, 10) : -1;
}

long bench_cleanup(const bench_ctx *ctx, const char *name)
{
    redisContext *c = bench_raw_connect(ctx);
    char pattern[256];
    /* '[' ']' '*' '?' '\' are glob-special; our prefix and names contain none of them. */
    if (name)
        snprintf(pattern, sizeof pattern, "%s{%s}*", ctx->prefix, name);
    else
        snprintf(pattern, sizeof pattern, "%s*", ctx->prefix);
    long removed = 0;
    char cursor[32] = "0";
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
            if (r)
                freeReplyObject(r);
            break;
        }
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        redisReply *keys = r->element[1];
        if (keys->elements > 0) {
            const char **argv = malloc((keys->elements + 1) * sizeof *argv);
            size_t *lens = malloc((keys->elements + 1) * sizeof *lens);
            if (argv == NULL || lens == NULL)
                bench_die("out of memory");
            argv[0] = "UNLINK";
            lens[0] = 6;
            for (size_t i = 0; i < keys->elements; i++) {
                argv[i + 1] = keys->element[i]->str;
                lens[i + 1] = keys->element[i]->len;
            }
            redisReply *u = redisCommandArgv(c, (int)keys->elements + 1, argv, lens);
            if (u && u->type == REDIS_REPLY_INTEGER)
                removed += u->integer;
            if (u)
                freeReplyObject(u);
            free(argv);
            free(lens);
        }
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    /* UNLINK frees big values in the server's background thread, which would compete for
     * the CPU with the next measurement: wait until it is done (up to 10 s). */
    for (int i = 0; i < 1000; i++) {
        char pending[32];
        bench_info_field(c, "memory", "lazyfree_pending_objects", pending, sizeof pending);
        if (pending[0] == '\0' || strtoll(pending, NULL, 10) == 0)
            break;
        bench_sleep_ns(10 * 1000000LL);
    }
    redisFree(c);
    return removed;
}
