/* Metrics (metrics.h): the client's figures after a scripted run must be exact (grants,
 * busy acquires, lost leases, renewals, rate outcomes, the names cap and "_other"); the text
 * must be valid Prometheus 0.0.4 (histogram invariants, label escaping; `promtool check
 * metrics` where installed); the buffer and argument rules; the visitor; the server's
 * figures (limit, in use, holders, waiters, oldest wait, window grants, the clean-up's count
 * of expired leases, redsem_up 0 when Redis is gone); SCAN of names with its cap; threads
 * sharing one client (counts add up). */
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

enum { BIG = 1 << 20 };

/* The client's exposition (asserted to fit in BIG). */
static char *text_of(redsem_client *c)
{
    char *buf = malloc(BIG);
    cr_assert_not_null(buf);
    size_t needed = 0;
    OK(c, redsem_metrics_write(c, buf, BIG, &needed));
    cr_assert_eq(needed, strlen(buf) + 1);
    return buf;
}

static char *server_text_of(redsem_client *c, const char *const *names, size_t n)
{
    char *buf = malloc(BIG);
    cr_assert_not_null(buf);
    size_t needed = 0;
    OK(c, redsem_metrics_write_server(c, names, n, buf, BIG, &needed));
    cr_assert_eq(needed, strlen(buf) + 1);
    return buf;
}

/* The value of the sample line "SERIES VALUE" in text; -1 if absent. */
static double value_of(const char *text, const char *series)
{
    size_t len = strlen(series);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, series, len) == 0 && p[len] == ' ')
            return strtod(p + len + 1, NULL);
    return -1;
}

#define EXPECT_VALUE(text, want, ...)                                                          \
    do {                                                                                       \
        char series_[1024];                                                                    \
        snprintf(series_, sizeof series_, __VA_ARGS__);                                        \
        double got_ = value_of((text), series_);                                               \
        cr_expect_eq(got_, (double)(want), "%s: %g, want %g", series_, got_, (double)(want)); \
    } while (0)

/* Every histogram in text: buckets ascending in le and cumulative, +Inf last and equal to
 * _count, _sum >= 0; every sample line belongs to a family with HELP and TYPE. Returns the
 * number of histogram series checked. */
static int check_histograms(const char *text)
{
    int series = 0;
    char prefix[1024] = "";
    double last_le = -1, last_count = -1, inf_count = -1;
    char typed[64][128];
    int ntyped = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        cr_assert_not_null(e, "the text ends with a newline");
        char line[2048];
        size_t len = (size_t)(e - p);
        cr_assert_lt(len, sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        p = e + 1;
        if (strncmp(line, "# TYPE ", 7) == 0) {
            cr_assert_lt(ntyped, 64);
            sscanf(line + 7, "%127s", typed[ntyped++]);
            continue;
        }
        if (line[0] == '#')
            continue;
        /* its family was typed */
        bool known = false;
        for (int i = 0; i < ntyped && !known; i++) {
            size_t fl = strlen(typed[i]);
            known = strncmp(line, typed[i], fl) == 0 &&
                    (line[fl] == '{' || line[fl] == ' ' || line[fl] == '_');
        }
        cr_expect(known, "sample of a family without TYPE: %s", line);
        char *le = strstr(line, "le=\"");
        if (strstr(line, "_bucket{") != NULL && le != NULL) {
            char pre[1024];
            snprintf(pre, sizeof pre, "%.*s", (int)(le - line), line);
            double v = strtod(strrchr(line, ' ') + 1, NULL);
            double bound = strncmp(le + 4, "+Inf", 4) == 0 ? INFINITY : strtod(le + 4, NULL);
            if (strcmp(pre, prefix) != 0) {
                cr_expect_eq(inf_count, last_count, "a histogram ended before +Inf: %s", prefix);
                snprintf(prefix, sizeof prefix, "%s", pre);
                last_le = -1;
                last_count = 0;
                inf_count = -1;
                series++;
            }
            cr_expect_gt(bound, last_le, "le not ascending: %s", line);
            cr_expect_geq(v, last_count, "buckets not cumulative: %s", line);
            last_le = bound;
            last_count = v;
            if (isinf(bound))
                inf_count = v;
        } else if (strstr(line, "_count") != NULL && prefix[0] != '\0' &&
                   strstr(line, "_bucket") == NULL && inf_count >= 0) {
            double v = strtod(strrchr(line, ' ') + 1, NULL);
            cr_expect_eq(v, inf_count, "_count %g != +Inf bucket %g: %s", v, inf_count, line);
            prefix[0] = '\0';
            inf_count = last_count = -1;
        } else if (strstr(line, "_sum") != NULL && prefix[0] != '\0') {
            cr_expect_geq(strtod(strrchr(line, ' ') + 1, NULL), 0, "%s", line);
        }
    }
    return series;
}

/* promtool check metrics on text, or a skip when promtool is not installed. */
static void promtool_check(const char *text)
{
    if (system("command -v promtool >/dev/null 2>&1") != 0)
        cr_skip_test("promtool is not installed (Debian: apt-get install prometheus): "
                     "the exposition was not checked by Prometheus' own linter");
    char path[] = "/tmp/redsem-metrics-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    char out[4096] = "";
    size_t got = fread(out, 1, sizeof out - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    unlink(path);
    /* a parse error exits 1, a lint finding (no HELP, a counter without _total ...) 3 */
    cr_expect(st == 0, "promtool check metrics: status %d:\n%s", st, out);
}

/* ---------------------------------------------------------------- exact figures */

/* One semaphore, limit 1, lease 1 s: 3 grants, 2 busy (a try, a 30 ms wait), a refresh ok,
 * a refresh that finds the lease run out (lost, expired), 3 holds; then a holder left to
 * expire and cleaned up by the next acquire (the server's count). The lease leaves a loaded
 * machine a second for what must happen within it. */
STRATEGY_TEST(metrics, exact_semaphore_figures, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("exact");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, strategy, 1, 1000, &s));
    redsem_permit *p1 = NULL, *p2 = NULL, *p3 = NULL, *x = NULL;
    OK(c, redsem_sem_try_acquire(s, &p1));
    EXPECT(c, REDSEM_EBUSY, redsem_sem_try_acquire(s, &x));
    EXPECT(c, REDSEM_EBUSY, redsem_sem_acquire(s, 30, &x));
    OK(c, redsem_permit_refresh(p1));
    OK(c, redsem_permit_release(p1));
    OK(c, redsem_sem_acquire(s, 1000, &p2));
    tf_sleep_ms(1300);
    EXPECT(c, REDSEM_ELOST, redsem_permit_refresh(p2));
    EXPECT(c, REDSEM_ELOST, redsem_permit_release(p2)); /* lost already: not counted twice */
    OK(c, redsem_sem_try_acquire(s, &p3));
    OK(c, redsem_permit_release(p3));

    char *t = text_of(c);
    const char *k = "kind=\"semaphore\"";
    EXPECT_VALUE(t, 3, "redsem_grants_total{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 3, "redsem_acquire_wait_seconds_count{name=\"%s\",%s,outcome=\"granted\"}",
                 name, k);
    EXPECT_VALUE(t, 2, "redsem_acquire_wait_seconds_count{name=\"%s\",%s,outcome=\"busy\"}",
                 name, k);
    /* outcomes never seen have no series */
    EXPECT_VALUE(t, -1, "redsem_acquire_wait_seconds_count{name=\"%s\",%s,outcome=\"timeout\"}",
                 name, k);
    EXPECT_VALUE(t, 3, "redsem_hold_seconds_count{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 1, "redsem_leases_lost_total{name=\"%s\",%s,reason=\"expired\"}", name, k);
    EXPECT_VALUE(t, 0, "redsem_leases_lost_total{name=\"%s\",%s,reason=\"taken\"}", name, k);
    EXPECT_VALUE(t, 0, "redsem_leases_lost_total{name=\"%s\",%s,reason=\"renewal_failed\"}",
                 name, k);
    EXPECT_VALUE(t, 1, "redsem_renewals_total{name=\"%s\",%s,outcome=\"ok\"}", name, k);
    EXPECT_VALUE(t, 1, "redsem_renewals_total{name=\"%s\",%s,outcome=\"lost\"}", name, k);
    EXPECT_VALUE(t, 0, "redsem_renewals_total{name=\"%s\",%s,outcome=\"error\"}", name, k);
    EXPECT_VALUE(t, 0, "redsem_metrics_names_dropped_total");
    /* the 30 ms wait is in a bucket above 25 ms: at most the try-acquire at or below it */
    char series[1024];
    snprintf(series, sizeof series,
             "redsem_acquire_wait_seconds_bucket{name=\"%s\",%s,outcome=\"busy\",le=\"0.025\"}",
             name, k);
    cr_expect_leq(value_of(t, series), 1, "%s", t);
    cr_expect_gt(check_histograms(t), 0);
    /* transport counters are there, and agree with redsem_client_get_stats() */
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_expect_geq(value_of(t, "redsem_client_requests_total"), 8);
    cr_expect_leq(value_of(t, "redsem_client_requests_total"), (double)st.requests);
    free(t);

    /* the server's side: a holder left to expire, cleaned up by the next acquire */
    redsem_permit_free(p2);
    redsem_permit_free(p3);
    p2 = p3 = NULL;
    OK(c, redsem_sem_acquire(s, 1000, &p2));
    tf_sleep_ms(1300);
    OK(c, redsem_sem_try_acquire(s, &p3));
    const char *names[] = {name, tf_name("missing")};
    t = server_text_of(c, names, 2);
    EXPECT_VALUE(t, 1, "redsem_up");
    EXPECT_VALUE(t, 1, "redsem_limit{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 1, "redsem_permits_in_use{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 1, "redsem_holders{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 0, "redsem_waiters{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 0, "redsem_oldest_wait_seconds{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 1, "redsem_leases_expired_total{name=\"%s\",%s}", name, k);
    cr_expect_null(strstr(t, names[1]), "a missing name gives no series:\n%s", t);
    free(t);
    (void)redsem_permit_release(p3); /* (its lease may have run out on a loaded machine) */
    redsem_permit_free(p1);
    redsem_permit_free(p2);
    redsem_permit_free(p3);
    redsem_sem_free(s);
    redsem_client_free(c);
}

Test(metrics, exact_lock_and_rate_figures, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *ln = tf_name("lock"), *rn = tf_name("rate");
    redsem_lock *l = NULL;
    OK(c, redsem_lock_open(c, ln, 5000, &l));
    redsem_permit *p = NULL, *x = NULL;
    OK(c, redsem_lock_try_acquire(l, &p));
    EXPECT(c, REDSEM_EBUSY, redsem_lock_try_acquire(l, &x));
    redsem_rate *r = NULL;
    OK(c, redsem_rate_open(c, rn, 2, 60000, &r));
    redsem_rate_grant g;
    OK(c, redsem_rate_try_acquire(r, &g));
    OK(c, redsem_rate_try_acquire(r, &g));
    EXPECT(c, REDSEM_EBUSY, redsem_rate_try_acquire(r, &g));

    char *t = text_of(c);
    EXPECT_VALUE(t, 1, "redsem_grants_total{name=\"%s\",kind=\"lock\"}", ln);
    EXPECT_VALUE(t, 1, "redsem_acquire_wait_seconds_count{name=\"%s\",kind=\"lock\","
                       "outcome=\"busy\"}", ln);
    EXPECT_VALUE(t, 0, "redsem_hold_seconds_count{name=\"%s\",kind=\"lock\"}", ln);
    EXPECT_VALUE(t, 2, "redsem_rate_limit_total{name=\"%s\",outcome=\"allowed\"}", rn);
    EXPECT_VALUE(t, 1, "redsem_rate_limit_total{name=\"%s\",outcome=\"limited\"}", rn);
    EXPECT_VALUE(t, 0, "redsem_rate_limit_total{name=\"%s\",outcome=\"error\"}", rn);
    EXPECT_VALUE(t, 2, "redsem_acquire_wait_seconds_count{name=\"%s\",kind=\"rate\","
                       "outcome=\"granted\"}", rn);
    cr_expect_null(strstr(t, "redsem_grants_total{name=\"rate"), "no grants series for a rate");
    check_histograms(t);
    free(t);

    const char *names[] = {ln, rn};
    t = server_text_of(c, names, 2);
    EXPECT_VALUE(t, 1, "redsem_up");
    EXPECT_VALUE(t, 1, "redsem_limit{name=\"%s\",kind=\"lock\"}", ln);
    EXPECT_VALUE(t, 1, "redsem_holders{name=\"%s\",kind=\"lock\"}", ln);
    EXPECT_VALUE(t, 2, "redsem_limit{name=\"%s\",kind=\"rate\"}", rn);
    EXPECT_VALUE(t, 2, "redsem_rate_window_grants{name=\"%s\"}", rn);
    EXPECT_VALUE(t, 0, "redsem_waiters{name=\"%s\",kind=\"rate\"}", rn);
    free(t);
    OK(c, redsem_permit_release(p));
    t = text_of(c);
    EXPECT_VALUE(t, 1, "redsem_hold_seconds_count{name=\"%s\",kind=\"lock\"}", ln);
    free(t);
    redsem_permit_free(p);
    redsem_rate_free(r);
    redsem_lock_free(l);
    redsem_client_free(c);
}

/* The cap: 2 names of their own, the third's figures in "_other", counted as dropped; 0:
 * everything in "_other". Recording off: no per-name series at all. */
static redsem_client *client_with(uint32_t max, bool on)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, tf_url()), REDSEM_OK);
    cr_assert_eq(redsem_options_set_metrics_names_max(o, max), REDSEM_OK);
    cr_assert_eq(redsem_options_set_metrics(o, on), REDSEM_OK);
    redsem_client *c = NULL;
    cr_assert_eq(redsem_client_new(o, &c), REDSEM_OK);
    redsem_options_free(o);
    return c;
}

static void use_name(redsem_client *c, const char *name)
{
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_BASIC, 5, 5000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_release(p));
    redsem_permit_free(p);
    redsem_sem_free(s);
}

Test(metrics, names_cap_and_other, .timeout = 60)
{
    redsem_client *c = client_with(2, true);
    char a[128], b[128], d[128];
    snprintf(a, sizeof a, "%s", tf_name("capa"));
    snprintf(b, sizeof b, "%s", tf_name("capb"));
    snprintf(d, sizeof d, "%s", tf_name("capd"));
    use_name(c, a);
    use_name(c, b);
    use_name(c, d);
    use_name(c, d);
    use_name(c, a);
    char *t = text_of(c);
    EXPECT_VALUE(t, 2, "redsem_grants_total{name=\"%s\",kind=\"semaphore\"}", a);
    EXPECT_VALUE(t, 1, "redsem_grants_total{name=\"%s\",kind=\"semaphore\"}", b);
    EXPECT_VALUE(t, -1, "redsem_grants_total{name=\"%s\",kind=\"semaphore\"}", d);
    EXPECT_VALUE(t, 2, "redsem_grants_total{name=\"_other\",kind=\"semaphore\"}");
    EXPECT_VALUE(t, 2, "redsem_hold_seconds_count{name=\"_other\",kind=\"semaphore\"}");
    /* two handles of the third name found no room */
    EXPECT_VALUE(t, 2, "redsem_metrics_names_dropped_total");
    free(t);
    redsem_client_free(c);

    c = client_with(0, true);
    use_name(c, a);
    t = text_of(c);
    EXPECT_VALUE(t, 1, "redsem_grants_total{name=\"_other\",kind=\"semaphore\"}");
    EXPECT_VALUE(t, 1, "redsem_metrics_names_dropped_total");
    free(t);
    redsem_client_free(c);

    c = client_with(1000, false);
    use_name(c, a);
    t = text_of(c);
    cr_expect_null(strstr(t, "redsem_grants_total"), "recording off:\n%s", t);
    cr_expect_geq(value_of(t, "redsem_client_requests_total"), 2);
    free(t);
    redsem_client_free(c);
}

/* A name with a double quote and a backslash (both allowed in names) is escaped. */
Test(metrics, label_values_escaped, .timeout = 60)
{
    redsem_client *c = tf_client();
    char name[128], tail[100];
    snprintf(tail, sizeof tail, "%s", tf_name("esc"));
    snprintf(name, sizeof name, "q\"b\\s-%s", tail);
    use_name(c, name);
    char *t = text_of(c);
    char want[256];
    snprintf(want, sizeof want,
             "redsem_grants_total{name=\"q\\\"b\\\\s-%s\",kind=\"semaphore\"} 1\n", tail);
    cr_expect_not_null(strstr(t, want), "want %s in:\n%s", want, t);
    check_histograms(t);
    promtool_check(t);
    free(t);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- buffer and arguments */

Test(metrics, buffer_too_small_gives_erange_and_needed, .timeout = 60)
{
    redsem_client *c = tf_client();
    use_name(c, tf_name("range"));
    size_t needed = 0;
    EXPECT(c, REDSEM_ERANGE, redsem_metrics_write(c, NULL, 0, &needed));
    cr_assert_gt(needed, 100);
    char *full = malloc(needed);
    size_t again = 0;
    OK(c, redsem_metrics_write(c, full, needed, &again));
    cr_expect_eq(again, needed);
    cr_expect_eq(strlen(full), needed - 1);
    char *part = malloc(needed);
    memset(part, 'x', needed);
    again = 0;
    EXPECT(c, REDSEM_ERANGE, redsem_metrics_write(c, part, needed - 1, &again));
    cr_expect_eq(again, needed);
    size_t pl = strlen(part);
    cr_expect_lt(pl, needed - 1);
    cr_expect(pl == 0 || part[pl - 1] == '\n', "the prefix ends at a line end");
    cr_expect_eq(strncmp(part, full, pl), 0, "a prefix of the whole text");
    EXPECT(c, REDSEM_ERANGE, redsem_metrics_write(c, part, 1, NULL));
    cr_expect_str_eq(part, "");
    /* the server's text too */
    const char *names[] = {"whatever"};
    EXPECT(c, REDSEM_ERANGE, redsem_metrics_write_server(c, names, 1, NULL, 0, &needed));
    cr_expect_gt(needed, 20);
    free(full);
    free(part);
    redsem_client_free(c);
}

static int count_visits(const redsem_metric *m, void *arg)
{
    (void)m;
    ++*(int *)arg;
    return 0;
}

Test(metrics, null_and_bad_arguments_are_einval, .timeout = 60)
{
    redsem_client *c = tf_client();
    char buf[16];
    size_t n;
    cr_expect_eq(redsem_metrics_write(NULL, buf, sizeof buf, &n), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_write(c, NULL, 5, &n), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_visit(NULL, count_visits, NULL), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_visit(c, NULL, NULL), REDSEM_EINVAL);
    const char *names[] = {"ok", NULL};
    const char *bad[] = {"a{b}"};
    cr_expect_eq(redsem_metrics_write_server(NULL, names, 1, buf, sizeof buf, &n), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_write_server(c, NULL, 1, buf, sizeof buf, &n), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_write_server(c, names, 2, buf, sizeof buf, &n), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_write_server(c, bad, 1, buf, sizeof buf, &n), REDSEM_EINVAL);
    cr_expect_eq(redsem_metrics_write_server(c, names, 1, NULL, 3, &n), REDSEM_EINVAL);
    char **out = NULL;
    size_t nout = 0;
    bool capped;
    cr_expect_eq(redsem_scan_names(NULL, "*", 10, &out, &nout, &capped), REDSEM_EINVAL);
    cr_expect_eq(redsem_scan_names(c, NULL, 10, &out, &nout, &capped), REDSEM_EINVAL);
    cr_expect_eq(redsem_scan_names(c, "", 10, &out, &nout, &capped), REDSEM_EINVAL);
    cr_expect_eq(redsem_scan_names(c, "*", 0, &out, &nout, &capped), REDSEM_EINVAL);
    cr_expect_eq(redsem_scan_names(c, "*", 10, NULL, &nout, &capped), REDSEM_EINVAL);
    cr_expect_eq(redsem_scan_names(c, "*", 10, &out, NULL, &capped), REDSEM_EINVAL);
    redsem_names_free(NULL, 3);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_expect_eq(redsem_options_set_metrics_names_max(NULL, 5), REDSEM_EINVAL);
    cr_expect_eq(redsem_options_set_metrics_names_max(o, REDSEM_METRICS_NAMES_MAX + 1),
                 REDSEM_EINVAL);
    cr_expect_eq(redsem_options_set_metrics_names_max(o, REDSEM_METRICS_NAMES_MAX), REDSEM_OK);
    cr_expect_eq(redsem_options_set_metrics(NULL, true), REDSEM_EINVAL);
    redsem_options_free(o);
    cr_expect_str_eq(redsem_err_name(REDSEM_ERANGE), "REDSEM_ERANGE");
    cr_expect(redsem_is_fault(REDSEM_ERANGE));
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- the visitor */

typedef struct visit_state {
    int calls, stop_after;
    double grants;
    const char *want_name;
    bool hist_ok;
} visit_state;

static int visitor(const redsem_metric *m, void *arg)
{
    visit_state *v = arg;
    v->calls++;
    if (strcmp(m->family, "redsem_grants_total") == 0 && m->nlabels == 2 &&
        strcmp(m->labels[0].value, v->want_name) == 0)
        v->grants = m->value;
    if (m->type == REDSEM_METRIC_HISTOGRAM) {
        bool ok = m->nbuckets == REDSEM_METRICS_BUCKETS && isinf(m->bounds[m->nbuckets - 1]) &&
                  m->counts[m->nbuckets - 1] == m->count && m->sum >= 0;
        for (size_t i = 1; i < m->nbuckets; i++)
            ok = ok && m->bounds[i] > m->bounds[i - 1] && m->counts[i] >= m->counts[i - 1];
        v->hist_ok = v->hist_ok && ok;
    }
    return v->stop_after > 0 && v->calls == v->stop_after ? 42 : 0;
}

Test(metrics, visitor_sees_the_figures_and_stops, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("visit");
    use_name(c, name);
    use_name(c, name);
    visit_state v = {.want_name = name, .hist_ok = true};
    OK(c, redsem_metrics_visit(c, visitor, &v));
    cr_expect_eq(v.grants, 2);
    cr_expect(v.hist_ok);
    cr_expect_gt(v.calls, 10);
    int all = v.calls;
    visit_state s = {.want_name = name, .stop_after = 3, .hist_ok = true};
    cr_expect_eq(redsem_metrics_visit(c, visitor, &s), 42);
    cr_expect_eq(s.calls, 3);
    cr_expect_lt(s.calls, all);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- the server side */

typedef struct blocked {
    redsem_sem *s;
    const char *id; /* the waiter's holder id; NULL: a random one */
    int rc;
    redsem_permit *held; /* the permit that makes it wait */
    pthread_t th;
} blocked;

static void *block_acquire(void *arg)
{
    blocked *b = arg;
    redsem_permit *p = NULL;
    b->rc = b->id != NULL ? redsem_sem_acquire_as(b->s, b->id, 20000, &p)
                          : redsem_sem_acquire(b->s, 20000, &p);
    if (b->rc == REDSEM_OK) {
        (void)redsem_permit_release(p);
        redsem_permit_free(p);
    }
    return NULL;
}

/* b->s (limit 1) held, and a thread waiting on it (listed by the server). */
static void queue_waiter(redsem_client *c, blocked *b)
{
    OK(c, redsem_sem_try_acquire(b->s, &b->held));
    cr_assert_eq(pthread_create(&b->th, NULL, block_acquire, b), 0);
    for (int i = 0; i < 200 && tf_waiters(b->s) < 1; i++)
        tf_sleep_ms(10);
}

/* The waiter of queue_waiter() granted (and done). */
static void grant_waiter(redsem_client *c, blocked *b)
{
    OK(c, redsem_permit_release(b->held));
    pthread_join(b->th, NULL);
    cr_expect_eq(b->rc, REDSEM_OK);
    redsem_permit_free(b->held);
}

/* A waiter seen by two scrapes 400 ms apart is at least ~0.4 s old at the second. */
STRATEGY_TEST(metrics, server_waiters_and_oldest_wait, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("oldest");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, strategy, 1, 10000, &s));
    blocked b = {.s = s};
    queue_waiter(c, &b);
    const char *names[] = {name};
    char *t = server_text_of(c, names, 1);
    EXPECT_VALUE(t, 1, "redsem_waiters{name=\"%s\",kind=\"semaphore\"}", name);
    char series[512];
    snprintf(series, sizeof series, "redsem_oldest_wait_seconds{name=\"%s\",kind=\"semaphore\"}",
             name);
    cr_expect_eq(value_of(t, series), 0, "first seen now: %s", t);
    free(t);
    tf_sleep_ms(400);
    t = server_text_of(c, names, 1);
    cr_expect_geq(value_of(t, series), 0.35, "%s", t);
    promtool_check(t);
    free(t);
    grant_waiter(c, &b);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* Redis gone: REDSEM_OK with redsem_up 0 and the reason in the error text. */
Test(metrics, server_down_gives_up_0, .timeout = 60)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, false), 0);
    redsem_client *c = tf_client_for(srv.url, 0, 500);
    ts_server_stop(&srv);
    const char *names[] = {"gone"};
    char buf[4096];
    size_t needed = 0;
    OK(c, redsem_metrics_write_server(c, names, 1, buf, sizeof buf, &needed));
    EXPECT_VALUE(buf, 0, "redsem_up");
    cr_expect_null(strstr(buf, "redsem_limit{"));
    cr_expect_neq(redsem_client_errmsg(c)[0], '\0', "the reason is given");
    redsem_client_free(c);
}

Test(metrics, scan_names_with_cap, .timeout = 60)
{
    redsem_client *c = tf_client();
    char base[128];
    snprintf(base, sizeof base, "%s", tf_name("scan"));
    char n1[160], n2[160], n3[160];
    snprintf(n1, sizeof n1, "%s-a", base);
    snprintf(n2, sizeof n2, "%s-b", base);
    snprintf(n3, sizeof n3, "%s-c", base);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, n1, REDSEM_STRATEGY_FAIR, 2, 5000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    redsem_lock *l = NULL;
    OK(c, redsem_lock_open(c, n2, 5000, &l));
    redsem_permit *q = NULL;
    OK(c, redsem_lock_try_acquire(l, &q));
    redsem_rate *r = NULL;
    OK(c, redsem_rate_open(c, n3, 5, 60000, &r));
    redsem_rate_grant g;
    OK(c, redsem_rate_try_acquire(r, &g));
    char pattern[160];
    snprintf(pattern, sizeof pattern, "%s-*", base);
    char **names = NULL;
    size_t n = 0;
    bool capped = true;
    OK(c, redsem_scan_names(c, pattern, 100, &names, &n, &capped));
    cr_assert_eq(n, 3);
    cr_expect(!capped);
    cr_expect_str_eq(names[0], n1);
    cr_expect_str_eq(names[1], n2);
    cr_expect_str_eq(names[2], n3);
    /* the scrape of what SCAN found */
    char *t = server_text_of(c, (const char *const *)names, n);
    EXPECT_VALUE(t, 1, "redsem_permits_in_use{name=\"%s\",kind=\"semaphore\"}", n1);
    EXPECT_VALUE(t, 2, "redsem_limit{name=\"%s\",kind=\"semaphore\"}", n1);
    EXPECT_VALUE(t, 1, "redsem_holders{name=\"%s\",kind=\"lock\"}", n2);
    EXPECT_VALUE(t, 1, "redsem_rate_window_grants{name=\"%s\"}", n3);
    promtool_check(t);
    free(t);
    redsem_names_free(names, n);
    OK(c, redsem_scan_names(c, pattern, 2, &names, &n, &capped));
    cr_expect_eq(n, 2);
    cr_expect(capped);
    redsem_names_free(names, n);
    snprintf(pattern, sizeof pattern, "%s-nothing*", base);
    OK(c, redsem_scan_names(c, pattern, 2, &names, &n, NULL));
    cr_expect_eq(n, 0);
    cr_expect_null(names);
    OK(c, redsem_permit_release(p));
    OK(c, redsem_permit_release(q));
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_rate_free(r);
    redsem_lock_free(l);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- threads */

enum { THREADS = 4, PAIRS = 200 };

typedef struct worker {
    redsem_client *c;
    const char *name;
    int grants;
} worker;

static void *pairs(void *arg)
{
    worker *w = arg;
    redsem_sem *s = NULL;
    if (redsem_sem_open(w->c, w->name, REDSEM_STRATEGY_BASIC, 100, 5000, &s) != REDSEM_OK)
        return NULL;
    for (int i = 0; i < PAIRS; i++) {
        redsem_permit *p = NULL;
        if (redsem_sem_try_acquire(s, &p) == REDSEM_OK) {
            w->grants++;
            (void)redsem_permit_release(p);
            redsem_permit_free(p);
        }
    }
    redsem_sem_free(s);
    return NULL;
}

static int scrape_while(const redsem_metric *m, void *arg)
{
    (void)m;
    (void)arg;
    return 0;
}

/* Threads sharing one client on two names (each handle finding its slot at once, some the
 * same): the counts add up exactly; scrapes run meanwhile. */
Test(metrics, threads_sharing_a_client_add_up, .timeout = 120)
{
    redsem_client *c = tf_client();
    char a[128], b[128];
    snprintf(a, sizeof a, "%s", tf_name("tha"));
    snprintf(b, sizeof b, "%s", tf_name("thb"));
    worker w[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.c = c, .name = i % 2 ? a : b};
        cr_assert_eq(pthread_create(&th[i], NULL, pairs, &w[i]), 0);
    }
    for (int i = 0; i < 20; i++) {
        OK(c, redsem_metrics_visit(c, scrape_while, NULL));
        tf_sleep_ms(5);
    }
    int ga = 0, gb = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        if (i % 2)
            ga += w[i].grants;
        else
            gb += w[i].grants;
    }
    cr_expect_eq(ga + gb, THREADS * PAIRS);
    char *t = text_of(c);
    EXPECT_VALUE(t, ga, "redsem_grants_total{name=\"%s\",kind=\"semaphore\"}", a);
    EXPECT_VALUE(t, gb, "redsem_grants_total{name=\"%s\",kind=\"semaphore\"}", b);
    EXPECT_VALUE(t, ga, "redsem_hold_seconds_count{name=\"%s\",kind=\"semaphore\"}", a);
    check_histograms(t);
    free(t);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- the event-loop API */

static int async_fd = -1;
static void on_socket(redsem_async *a, int fd, int what, void *data)
{
    (void)a;
    (void)data;
    async_fd = (what & REDSEM_WATCH_REMOVE) ? -1 : fd;
}

static int async_done, async_rc;
static redsem_permit *async_permit;
static void on_done(redsem_async *a, const redsem_result *r, void *user)
{
    (void)a;
    (void)user;
    async_rc = r->rc;
    async_permit = r->rc == REDSEM_OK ? r->permit : NULL;
    async_done++;
}

static void run_until(redsem_async *a, int n)
{
    for (int i = 0; i < 2000 && async_done < n; i++) {
        struct pollfd p = {async_fd, POLLIN, 0};
        if (async_fd >= 0 && poll(&p, 1, 10) > 0)
            (void)redsem_async_action(a, async_fd, REDSEM_WATCH_IN);
        else if (async_fd < 0)
            tf_sleep_ms(10);
    }
    cr_assert_eq(async_done, n, "the operation did not finish");
}

/* A waiting acquire through the event-loop API (parked between its attempts, resumed on a
 * worker) is recorded with its whole wait; its release through the API records the hold. */
Test(metrics, event_loop_api_is_recorded, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("async");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, 10000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    redsem_async *a = NULL;
    OK(c, redsem_async_new(c, &a));
    OK(c, redsem_async_set_loop(a, on_socket, NULL, NULL));
    OK(c, redsem_sem_acquire_async(a, s, 1, 10000, on_done, NULL, NULL));
    tf_sleep_ms(300);
    OK(c, redsem_permit_release(p));
    run_until(a, 1);
    cr_assert_eq(async_rc, REDSEM_OK, "%s", redsem_err_name(async_rc));
    redsem_permit *got = async_permit;
    OK(c, redsem_permit_release_async(a, got, on_done, NULL, NULL));
    run_until(a, 2);
    cr_expect_eq(async_rc, REDSEM_OK);
    char *t = text_of(c);
    const char *k = "kind=\"semaphore\"";
    EXPECT_VALUE(t, 2, "redsem_grants_total{name=\"%s\",%s}", name, k);
    EXPECT_VALUE(t, 2, "redsem_hold_seconds_count{name=\"%s\",%s}", name, k);
    /* the waiting acquire waited at least 300 ms: not in the 0.25 s bucket (where the
     * try-acquire is, unless the machine stalled it that long) */
    char series[512];
    snprintf(series, sizeof series,
             "redsem_acquire_wait_seconds_bucket{name=\"%s\",%s,outcome=\"granted\",le=\"0.25\"}",
             name, k);
    cr_expect_leq(value_of(t, series), 1, "the waiting acquire is above 0.25 s:\n%s", t);
    EXPECT_VALUE(t, 2, "redsem_acquire_wait_seconds_count{name=\"%s\",%s,outcome=\"granted\"}",
                 name, k);
    free(t);
    redsem_permit_free(got);
    redsem_permit_free(p);
    redsem_async_free(a);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* ---------------------------------------------------------------- automatic renewal */

static atomic_int lost_calls;
static atomic_int lost_reason;
static void on_lost(redsem_permit *p, redsem_lost_reason why, void *user)
{
    (void)p;
    (void)user;
    atomic_store(&lost_reason, (int)why);
    atomic_fetch_add(&lost_calls, 1);
}

/* The renewer's refreshes are counted; its permit removed on the server before its deadline
 * is lost as "taken", once (the release after it adds no loss). */
Test(metrics, renewer_counts_renewals_and_a_taken_lease, .timeout = 60)
{
    redsem_client *c = tf_client();
    const char *name = tf_name("renewer");
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_BASIC, 1, 3000, &s));
    redsem_permit *p = NULL;
    OK(c, redsem_sem_try_acquire(s, &p));
    OK(c, redsem_permit_auto_renew(p, 100, on_lost, NULL));
    tf_sleep_ms(450);
    char key[256];
    snprintf(key, sizeof key, "redsem:{%s}:holders", name);
    cr_assert_eq(ts_command(tf_server(), NULL, 0, "DEL", key, NULL), 0);
    for (int i = 0; i < 300 && atomic_load(&lost_calls) == 0; i++)
        tf_sleep_ms(10);
    cr_assert_eq(atomic_load(&lost_calls), 1);
    cr_expect_eq(atomic_load(&lost_reason), REDSEM_LOST_EXPIRED);
    EXPECT(c, REDSEM_ELOST, redsem_permit_release(p));
    char *t = text_of(c);
    const char *k = "kind=\"semaphore\"";
    char series[512];
    snprintf(series, sizeof series, "redsem_renewals_total{name=\"%s\",%s,outcome=\"ok\"}", name,
             k);
    cr_expect_geq(value_of(t, series), 2, "%s", t);
    EXPECT_VALUE(t, 1, "redsem_renewals_total{name=\"%s\",%s,outcome=\"lost\"}", name, k);
    EXPECT_VALUE(t, 1, "redsem_leases_lost_total{name=\"%s\",%s,reason=\"taken\"}", name, k);
    EXPECT_VALUE(t, 0, "redsem_leases_lost_total{name=\"%s\",%s,reason=\"expired\"}", name, k);
    EXPECT_VALUE(t, 1, "redsem_hold_seconds_count{name=\"%s\",%s}", name, k);
    free(t);
    redsem_permit_free(p);
    redsem_sem_free(s);
    redsem_client_free(c);
}

/* The number of lines of text that start with prefix. */
static int lines_starting(const char *text, const char *prefix)
{
    int n = 0;
    size_t len = strlen(prefix);
    for (const char *p = text; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        n += strncmp(p, prefix, len) == 0;
    return n;
}

/* A name given twice (redsem metrics a a, an exporter's list with a repeat) is read and
 * written once: a series twice in one scrape is an error to Prometheus (duplicate sample). */
Test(metrics, server_name_given_twice_gives_one_series, .timeout = 60)
{
    redsem_client *c = tf_client();
    char a[160], b[160];
    snprintf(a, sizeof a, "%s", tf_name("dup-a"));
    snprintf(b, sizeof b, "%s", tf_name("dup-b"));
    redsem_sem *sa = NULL, *sb = NULL;
    OK(c, redsem_sem_open(c, a, REDSEM_STRATEGY_FAIR, 2, 5000, &sa));
    OK(c, redsem_sem_open(c, b, REDSEM_STRATEGY_FAIR, 3, 5000, &sb));
    redsem_permit *p = NULL, *q = NULL;
    OK(c, redsem_sem_try_acquire(sa, &p));
    OK(c, redsem_sem_try_acquire(sb, &q));
    const char *names[] = {a, b, a, a, b};
    char *t = server_text_of(c, names, 5);
    char series[256];
    snprintf(series, sizeof series, "redsem_limit{name=\"%s\",", a);
    cr_expect_eq(lines_starting(t, series), 1, "%s", t);
    snprintf(series, sizeof series, "redsem_holders{name=\"%s\",", b);
    cr_expect_eq(lines_starting(t, series), 1, "%s", t);
    EXPECT_VALUE(t, 2, "redsem_limit{name=\"%s\",kind=\"semaphore\"}", a);
    EXPECT_VALUE(t, 3, "redsem_limit{name=\"%s\",kind=\"semaphore\"}", b);
    /* in the order first given */
    cr_expect_lt(strstr(t, a) - t, strstr(t, b) - t);
    promtool_check(t);
    free(t);
    OK(c, redsem_permit_release(p));
    OK(c, redsem_permit_release(q));
    redsem_permit_free(p);
    redsem_permit_free(q);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(c);
}

/* Threads whose first acquires on one handle past the cap race: the handle counts once in
 * redsem_metrics_names_dropped_total ("a name past the cap counts once per handle"). */
enum { RACERS = 8 };
static pthread_barrier_t racers_go;
static void *race_first_use(void *arg)
{
    redsem_sem *s = arg;
    pthread_barrier_wait(&racers_go);
    redsem_permit *p = NULL;
    if (redsem_sem_try_acquire(s, &p) == REDSEM_OK) {
        (void)redsem_permit_release(p);
        redsem_permit_free(p);
    }
    return NULL;
}

Test(metrics, a_handle_past_the_cap_counts_once_under_threads, .timeout = 120)
{
    char name[128];
    snprintf(name, sizeof name, "%s", tf_name("caprace"));
    for (int round = 0; round < 50; round++) {
        redsem_client *c = client_with(0, true);
        redsem_sem *s = NULL;
        OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 64, 5000, &s));
        pthread_barrier_init(&racers_go, NULL, RACERS);
        pthread_t th[RACERS];
        for (int i = 0; i < RACERS; i++)
            cr_assert_eq(pthread_create(&th[i], NULL, race_first_use, s), 0);
        for (int i = 0; i < RACERS; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&racers_go);
        char *t = text_of(c);
        cr_assert_eq(value_of(t, "redsem_metrics_names_dropped_total"), 1, "round %d:\n%s",
                     round, t);
        cr_assert_eq(value_of(t, "redsem_grants_total{name=\"_other\",kind=\"semaphore\"}"),
                     RACERS, "round %d:\n%s", round, t);
        free(t);
        redsem_sem_free(s);
        redsem_client_free(c);
    }
}

/* One waiter (a fixed holder id) on a fresh semaphore, seen by a scrape; then it is granted. */
static void wait_once_seen(redsem_client *c, const char *name)
{
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, 1, 10000, &s));
    char id[REDSEM_ID_LEN + 1];
    memset(id, 'a', REDSEM_ID_LEN);
    id[REDSEM_ID_LEN] = '\0';
    blocked b = {.s = s, .id = id};
    queue_waiter(c, &b);
    const char *names[] = {name};
    char *t = server_text_of(c, names, 1);
    EXPECT_VALUE(t, 1, "redsem_waiters{name=\"%s\",kind=\"semaphore\"}", name);
    EXPECT_VALUE(t, 0, "redsem_oldest_wait_seconds{name=\"%s\",kind=\"semaphore\"}", name);
    free(t);
    grant_waiter(c, &b);
    redsem_sem_free(s);
}

/* A name gone from the server is forgotten by the scrapes' memory of waiters: made again
 * later, a waiter with the same id starts from its first scrape again (the memory stays
 * bounded by the names that have waiters now). */
Test(metrics, server_forgets_the_waiters_of_a_name_gone, .timeout = 60)
{
    redsem_client *c = tf_client();
    char name[160];
    snprintf(name, sizeof name, "%s", tf_name("forget"));
    wait_once_seen(c, name);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "redis-cli -s '%s' --scan --pattern 'redsem:{%s}*' | "
             "xargs -r redis-cli -s '%s' DEL > /dev/null",
             tf_sock(), name, tf_sock());
    cr_assert_eq(system(cmd), 0);
    const char *names[] = {name};
    char *t = server_text_of(c, names, 1);
    EXPECT_VALUE(t, 1, "redsem_up");
    cr_assert_null(strstr(t, "redsem_limit{"), "the keys are gone:\n%s", t);
    free(t);
    tf_sleep_ms(400);
    /* made again; the same waiter id, first listed by the scrape in wait_once_seen */
    wait_once_seen(c, name);
    redsem_client_free(c);
}
