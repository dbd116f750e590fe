/* TLS (rediss://) against a real redis-server --tls-port, with certificates that
 * support/gen-certs.sh makes with the openssl command for each test: verified connects by
 * address and by name, every strategy and the lock, waiting and automatic renewal over TLS,
 * mutual TLS, and each way it must refuse: unknown CA, wrong name (a name only in the CN, a
 * partial wildcard), expired certificate, plain TCP to a TLS port, TLS to a plain port,
 * missing files. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"
#include "redsem/async.h"


#define TO .timeout = 60

typedef struct tls_env {
    char dir[256];
    char path[8][320]; /* file paths, kept alive for the server's argv */
    ts_server srv;
    int port;
    char args[16][340];
    const char *argv[20];
} tls_env;

static const char *certs_dir(tls_env *e)
{
    snprintf(e->dir, sizeof e->dir, "/tmp/redsem-tls-XXXXXX");
    cr_assert_not_null(mkdtemp(e->dir));
    const char *gen = getenv("REDSEM_GEN_CERTS");
    cr_assert_not_null(gen, "REDSEM_GEN_CERTS is not set (run through meson test)");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s %s", gen, e->dir);
    cr_assert_eq(system(cmd), 0, "%s failed (is the openssl command installed?)", cmd);
    return e->dir;
}

static const char *file(tls_env *e, int slot, const char *name)
{
    snprintf(e->path[slot], sizeof e->path[slot], "%s/%s", e->dir, name);
    return e->path[slot];
}

/* A redis-server with a TLS port (and its plain unix socket for the fixture's checks):
 * cert is the server certificate's file name in the certs dir; clients: "no", "optional"
 * or "yes" (a client certificate is required). */
static void start_tls_server(tls_env *e, const char *cert, const char *clients)
{
    certs_dir(e);
    e->port = ts_free_port();
    cr_assert_gt(e->port, 0);
    int n = 0;
    const char *pairs[][2] = {
        {"--tls-port", NULL},
        {"--tls-cert-file", file(e, 0, cert)},
        {"--tls-key-file", file(e, 1, "server.key")},
        {"--tls-ca-cert-file", file(e, 2, "ca.crt")},
        {"--tls-auth-clients", clients},
    };
    snprintf(e->args[0], sizeof e->args[0], "%d", e->port);
    pairs[0][1] = e->args[0];
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        e->argv[n++] = pairs[i][0];
        e->argv[n++] = pairs[i][1];
    }
    e->argv[n] = NULL;
    cr_assert_eq(ts_server_start(&e->srv, e->argv, false), 0, "redis-server --tls-port failed");
}

static void stop(tls_env *e)
{
    ts_server_stop(&e->srv);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    (void)system(cmd);
}

/* A client of url with the given CA, client certificate and server name (NULL: none). */
static int connect_tls(const char *url, const char *ca, const char *cert, const char *key,
                       const char *server_name, bool insecure, redsem_client **c, char *err,
                       size_t errlen)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_url(o, url), REDSEM_OK, "%s", url);
    cr_assert_eq(redsem_options_set_tls_ca(o, ca, NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_cert(o, cert, key), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_server_name(o, server_name), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_insecure_skip_verify(o, insecure), REDSEM_OK);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, 2000), REDSEM_OK);
    int rc = redsem_client_new_verbose(o, c, err, errlen);
    redsem_options_free(o);
    return rc;
}

static void url_of(char *out, size_t len, const char *scheme, const char *host, int port)
{
    snprintf(out, len, "%s://%s:%d", scheme, host, port);
}

/* Every strategy and the lock over TLS: try, blocking acquire woken by a release (BLPOP over
 * TLS), refresh, automatic renewal past the lease (on the client's TLS connections). */
Test(tls, every_strategy_and_the_lock_work_over_tls, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "no");
    char url[128], err[512];
    url_of(url, sizeof url, "rediss", "127.0.0.1", e.port);
    redsem_client *a = NULL, *b = NULL;
    cr_assert_eq(connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &a, err,
                             sizeof err),
                 REDSEM_OK, "%s", err);
    cr_assert_eq(connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &b, err,
                             sizeof err),
                 REDSEM_OK, "%s", err);
    OK(a, redsem_client_ping(a));
    for (int k = 0; k < 4; k++) {
        redsem_sem *sa = NULL, *sb = NULL;
        redsem_lock *la = NULL, *lb = NULL;
        char name[32];
        snprintf(name, sizeof name, "tls-%d", k);
        if (k < 3) {
            OK(a, redsem_sem_open(a, name, (redsem_strategy)(k + 1), 1, 300, &sa));
            OK(b, redsem_sem_open(b, name, (redsem_strategy)(k + 1), 1, 300, &sb));
        } else {
            OK(a, redsem_lock_open(a, name, 300, &la));
            OK(b, redsem_lock_open(b, name, 300, &lb));
        }
        redsem_permit *pa = NULL, *pb = NULL;
        OK(a, sa ? redsem_sem_try_acquire(sa, &pa) : redsem_lock_try_acquire(la, &pa));
        OK(a, redsem_permit_auto_renew(pa, 0, NULL, NULL));
        tf_sleep_ms(700); /* more than two leases: only the TLS renewer keeps it */
        cr_assert(redsem_permit_held(pa), "kind %d: the renewer did not keep the permit", k);
        EXPECT(b, REDSEM_EBUSY, sb ? redsem_sem_try_acquire(sb, &pb) : redsem_lock_try_acquire(lb, &pb));
        OK(a, redsem_permit_refresh(pa));
        OK(a, redsem_permit_release(pa));
        OK(b, sb ? redsem_sem_acquire(sb, 2000, &pb) : redsem_lock_acquire(lb, 2000, &pb));
        OK(b, redsem_permit_release(pb));
        redsem_permit_free(pa);
        redsem_permit_free(pb);
        redsem_sem_free(sa);
        redsem_sem_free(sb);
        redsem_lock_free(la);
        redsem_lock_free(lb);
    }
    redsem_client_free(a);
    redsem_client_free(b);
    stop(&e);
}

/* A blocked waiter over TLS is granted after a release: BLPOP with deadlines over TLS. */
struct releaser {
    redsem_permit *p;
    int rc;
};

static void *release_later(void *arg)
{
    struct releaser *r = arg;
    tf_sleep_ms(300);
    r->rc = redsem_permit_release(r->p);
    return NULL;
}

Test(tls, a_blocked_waiter_is_woken_over_tls, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "no");
    char url[128], err[512];
    url_of(url, sizeof url, "rediss", "localhost", e.port); /* verified by name */
    redsem_client *a = NULL, *b = NULL;
    cr_assert_eq(connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &a, err,
                             sizeof err),
                 REDSEM_OK, "%s", err);
    cr_assert_eq(connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &b, err,
                             sizeof err),
                 REDSEM_OK, "%s", err);
    redsem_sem *sa = NULL, *sb = NULL;
    OK(a, redsem_sem_open(a, "wake", REDSEM_STRATEGY_FAIR, 1, 10000, &sa));
    OK(b, redsem_sem_open(b, "wake", REDSEM_STRATEGY_FAIR, 1, 10000, &sb));
    redsem_permit *pb = NULL;
    struct releaser r = {NULL, -1};
    OK(a, redsem_sem_try_acquire(sa, &r.p));
    pthread_t t; /* client a is used by this thread only from here on */
    cr_assert_eq(pthread_create(&t, NULL, release_later, &r), 0);
    OK(b, redsem_sem_acquire(sb, 5000, &pb));
    pthread_join(t, NULL);
    cr_assert_eq(r.rc, REDSEM_OK, "release: %s", redsem_err_name(r.rc));
    /* it waited in BLPOPs over TLS (a wake-up or a poll may end the last one: that it is
     * woken by the signal is test_semaphore's business; here, that blocking reads with a
     * deadline work over TLS) */
    redsem_client_stats st;
    OK(b, redsem_client_get_stats(b, &st));
    cr_assert_geq(st.requests, 3, "the waiter never blocked (%llu requests)",
                  (unsigned long long)st.requests);
    OK(b, redsem_permit_release(pb));
    redsem_permit_free(pb);
    redsem_permit_free(r.p);
    redsem_sem_free(sa);
    redsem_sem_free(sb);
    redsem_client_free(a);
    redsem_client_free(b);
    stop(&e);
}

/* Mutual TLS: a server that requires a client certificate refuses a client without one and
 * accepts one with the CA's client certificate. */
Test(tls, mutual_tls, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "yes");
    char url[128], err[512] = "";
    url_of(url, sizeof url, "rediss", "127.0.0.1", e.port);
    redsem_client *c = NULL;
    int rc = connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &c, err, sizeof err);
    cr_assert_neq(rc, REDSEM_OK, "connected without a client certificate");
    cr_assert(strstr(err, "client certificate") != NULL, "no reason given: %s", err);
    rc = connect_tls(url, file(&e, 3, "ca.crt"), file(&e, 4, "client.crt"),
                     file(&e, 5, "client.key"), NULL, false, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_OK, "with a client certificate: %s", err);
    OK(c, redsem_client_ping(c));
    redsem_client_free(c);
    stop(&e);
}

/* Each refusal: a clear code, a message that says why, within the connect timeout. */
Test(tls, refusals_are_clear, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "no");
    char url[128], err[512];
    struct {
        const char *what, *scheme, *host, *ca, *name;
        int port_kind; /* 0 the TLS port, 1 a plain TCP port */
        int want;
        const char *text;
    } cases[] = {
        {"unknown CA", "rediss", "127.0.0.1", "other-ca.crt", NULL, 0, REDSEM_ETLS,
         "was refused: self-signed certificate in certificate chain"},
        {"wrong name", "rediss", "127.0.0.1", "ca.crt", "wrong.example.com", 0, REDSEM_ETLS,
         "hostname mismatch"},
        {"address not in the certificate", "rediss", "127.0.0.1", "ca.crt", "127.0.0.2", 0,
         REDSEM_ETLS, "IP address mismatch"},
        {"plain TCP to the TLS port", "redis", "127.0.0.1", "ca.crt", NULL, 0, REDSEM_ECONN,
         "use rediss://"},
        {"missing CA file", "rediss", "127.0.0.1", "no-such-ca.crt", NULL, 0, REDSEM_EINVAL,
         "no-such-ca.crt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        url_of(url, sizeof url, cases[i].scheme, cases[i].host, e.port);
        redsem_client *c = NULL;
        err[0] = '\0';
        int64_t t0 = tf_now_ms();
        int rc = connect_tls(url, file(&e, 3, cases[i].ca), NULL, NULL, cases[i].name, false,
                             &c, err, sizeof err);
        int64_t took = tf_now_ms() - t0;
        cr_expect_eq(rc, cases[i].want, "%s: %s (%s)", cases[i].what, redsem_err_name(rc), err);
        cr_expect(strstr(err, cases[i].text) != NULL, "%s: the message does not say '%s': %s",
                  cases[i].what, cases[i].text, err);
        /* bounded by the 2 s connect timeout (plus the retry window for ECONN), never a hang */
        cr_expect_lt(took, 5000, "%s took %lld ms", cases[i].what, (long long)took);
        redsem_client_free(c);
    }
    /* verification skipped on purpose: the wrong CA is accepted */
    url_of(url, sizeof url, "rediss", "127.0.0.1", e.port);
    redsem_client *c = NULL;
    cr_assert_eq(connect_tls(url, file(&e, 3, "other-ca.crt"), NULL, NULL, NULL, true, &c, err,
                             sizeof err),
                 REDSEM_OK, "insecure: %s", err);
    OK(c, redsem_client_ping(c));
    redsem_client_free(c);
    stop(&e);
}

Test(tls, an_expired_certificate_is_refused, TO)
{
    tls_env e;
    start_tls_server(&e, "expired.crt", "no");
    char url[128], err[512] = "";
    url_of(url, sizeof url, "rediss", "127.0.0.1", e.port);
    redsem_client *c = NULL;
    int rc = connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &c, err, sizeof err);
    cr_assert_eq(rc, REDSEM_ETLS, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "expired") != NULL, "%s", err);
    stop(&e);
}

/* One TLS context per client, shared by all its connections: the CA file is read once, when
 * the client is made, so a connection made later (here: the wait connection of a blocking
 * acquire, and the request connections of threads calling at once) does not read it again
 * and works after the file is gone (with a context per connection it failed with
 * REDSEM_EINVAL, "cannot load the CA file"). The threads share the context (SSL_new from
 * several threads at once: clean under ThreadSanitizer). */
struct tls_pairs {
    redsem_sem *s;
    int rc;
};

static void *tls_pairs_main(void *arg)
{
    struct tls_pairs *t = arg;
    for (int i = 0; i < 30 && t->rc == REDSEM_OK; i++) {
        redsem_permit *p = NULL;
        t->rc = redsem_sem_acquire(t->s, 5000, &p);
        if (t->rc == REDSEM_OK)
            t->rc = redsem_permit_release(p);
        redsem_permit_free(p);
    }
    return NULL;
}

Test(tls, one_context_per_client_the_ca_file_is_read_once, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "no");
    char url[128], err[512] = "", ca[400], cmd[900];
    url_of(url, sizeof url, "rediss", "127.0.0.1", e.port);
    snprintf(ca, sizeof ca, "%s/ca-copy.crt", e.dir);
    snprintf(cmd, sizeof cmd, "cp %s/ca.crt %s", e.dir, ca);
    cr_assert_eq(system(cmd), 0);
    redsem_client *c = NULL, *h = NULL;
    cr_assert_eq(connect_tls(url, ca, NULL, NULL, NULL, false, &c, err, sizeof err), REDSEM_OK,
                 "%s", err);
    cr_assert_eq(connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &h, err,
                             sizeof err),
                 REDSEM_OK, "%s", err);
    cr_assert_eq(unlink(ca), 0);
    redsem_sem *sc = NULL, *sh = NULL;
    OK(c, redsem_sem_open(c, "once", REDSEM_STRATEGY_FAIR, 1, 10000, &sc));
    OK(h, redsem_sem_open(h, "once", REDSEM_STRATEGY_FAIR, 1, 10000, &sh));
    redsem_permit *held = NULL, *p = NULL;
    OK(h, redsem_sem_try_acquire(sh, &held));
    /* a blocking acquire: c makes its wait connection now, after the CA file is gone */
    EXPECT(c, REDSEM_EBUSY, redsem_sem_acquire(sc, 300, &p));
    OK(h, redsem_permit_release(held));
    redsem_permit_free(held);
    struct tls_pairs t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (struct tls_pairs){sc, REDSEM_OK};
        cr_assert_eq(pthread_create(&th[i], NULL, tls_pairs_main, &t[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_expect_eq(t[i].rc, REDSEM_OK, "thread %d: %s (%s)", i, redsem_err_name(t[i].rc),
                     redsem_client_errmsg(c));
    }
    redsem_client_stats st;
    OK(c, redsem_client_get_stats(c, &st));
    cr_assert_geq(st.connects, 2, "no connection was made after the CA file was removed");
    redsem_sem_free(sc);
    redsem_sem_free(sh);
    redsem_client_free(c);
    redsem_client_free(h);
    stop(&e);
}

/* The name is checked against the certificate's subject alternative names only: a
 * certificate whose name is only in its subject's CN (no SAN) is refused, and so is a partial
 * wildcard SAN ("r*.redsem.test" for redis.redsem.test); one with SANs and no CN is
 * accepted, by name and by address. (OpenSSL's defaults accept the first two.) */
Test(tls, names_are_checked_against_subject_alternative_names_only, TO)
{
    struct {
        const char *cert, *host, *name;
        int want;
        const char *text;
    } cases[] = {
        {"cn-only.crt", "localhost", NULL, REDSEM_ETLS, "hostname mismatch"},
        {"partial-wildcard.crt", "127.0.0.1", "redis.redsem.test", REDSEM_ETLS,
         "hostname mismatch"},
        {"san-only.crt", "localhost", NULL, REDSEM_OK, ""},
        {"san-only.crt", "127.0.0.1", NULL, REDSEM_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tls_env e;
        start_tls_server(&e, cases[i].cert, "no");
        char url[128], err[512] = "";
        url_of(url, sizeof url, "rediss", cases[i].host, e.port);
        redsem_client *c = NULL;
        int rc = connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, cases[i].name, false, &c,
                             err, sizeof err);
        cr_expect_eq(rc, cases[i].want, "%s as %s: %s (%s)", cases[i].cert,
                     cases[i].name ? cases[i].name : cases[i].host, redsem_err_name(rc), err);
        cr_expect(strstr(err, cases[i].text) != NULL, "%s: the message does not say '%s': %s",
                  cases[i].cert, cases[i].text, err);
        if (c != NULL)
            OK(c, redsem_client_ping(c));
        redsem_client_free(c);
        stop(&e);
    }
}

/* TLS to a port that speaks plain RESP. */
Test(tls, tls_to_a_plain_port_is_refused, TO)
{
    ts_server srv;
    cr_assert_eq(ts_server_start(&srv, NULL, true), 0);
    tls_env e;
    certs_dir(&e);
    char url[128], err[512] = "";
    url_of(url, sizeof url, "rediss", "127.0.0.1", srv.port);
    redsem_client *c = NULL;
    int64_t t0 = tf_now_ms();
    int rc = connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &c, err, sizeof err);
    /* the plain port reads the ClientHello as the start of an inline command and waits for
     * more: the handshake ends at the connect timeout (2 s), with a message that says why */
    cr_assert_eq(rc, REDSEM_ETIMEDOUT, "%s: %s", redsem_err_name(rc), err);
    cr_assert(strstr(err, "use redis://") != NULL, "%s", err);
    cr_assert_lt(tf_now_ms() - t0, 5000);
    ts_server_stop(&srv);
    e.srv.pid = 0;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e.dir);
    (void)system(cmd);
}

/* Run redsem(1) through the shell with env and args; returns its exit status, stderr in err. */
static int run_cli(tls_env *e, const char *env, const char *args, char *err, size_t errlen)
{
    const char *bin = getenv("REDSEM_BIN");
    cr_assert_not_null(bin, "REDSEM_BIN is not set (run through meson test)");
    char errfile[400], cmd[2048];
    snprintf(errfile, sizeof errfile, "%s/cli.err", e->dir);
    snprintf(cmd, sizeof cmd, "env %s %s %s >/dev/null 2>%s", env, bin, args, errfile);
    int st = system(cmd);
    FILE *f = fopen(errfile, "r");
    size_t n = f ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The CLI over TLS: --tls-* flags and the REDSEM_TLS_* variables, and a refused certificate
 * (exit status 77, with the reason on stderr). */
Test(tls, the_cli_over_tls, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "yes");
    char args[1500], env[1200], err[2048];
    snprintf(env, sizeof env, "REDSEM_URL=rediss://localhost:%d REDSEM_TLS_CA=%s/ca.crt "
             "REDSEM_TLS_CERT=%s/client.crt REDSEM_TLS_KEY=%s/client.key", e.port, e.dir, e.dir,
             e.dir);
    int code = run_cli(&e, env, "run --limit 2 tlsjob -- true", err, sizeof err);
    cr_assert_eq(code, 0, "run over TLS (variables): exit %d: %s", code, err);
    snprintf(args, sizeof args, "status --url rediss://127.0.0.1:%d --tls-ca %s/ca.crt "
             "--tls-cert %s/client.crt --tls-key %s/client.key tlsjob", e.port, e.dir, e.dir,
             e.dir);
    code = run_cli(&e, "", args, err, sizeof err);
    cr_assert_eq(code, 0, "status over TLS (flags): exit %d: %s", code, err);
    snprintf(args, sizeof args, "status --url rediss://127.0.0.1:%d --tls-ca %s/other-ca.crt "
             "--tls-cert %s/client.crt --tls-key %s/client.key tlsjob", e.port, e.dir, e.dir,
             e.dir);
    code = run_cli(&e, "", args, err, sizeof err);
    cr_assert_eq(code, 77, "an unknown CA: exit %d: %s", code, err);
    cr_assert(strstr(err, "refused") != NULL, "%s", err);
    snprintf(args, sizeof args, "status --url rediss://127.0.0.1:%d --tls-key %s/client.key x",
             e.port, e.dir);
    code = run_cli(&e, "", args, err, sizeof err);
    cr_assert_eq(code, 64, "--tls-key without --tls-cert: exit %d: %s", code, err);
    stop(&e);
}

/* ---------------------------------------------------------------- the event-loop API */

/* A poll() loop for the event-loop API that ticks every 10 ms: the descriptor the
 * redsem_async names and its one timer (so that the loop engine, when built, runs it). */
typedef struct tls_loop {
    redsem_async *a;
    int fd, ticks;
    int64_t timer_at_ms; /* -1: none */
    int done, rc;
    redsem_permit *permit;
    char errmsg[512];
    int ticks_at; /* when the callback ran */
} tls_loop;

static void tl_socket(redsem_async *a, int fd, int what, void *data)
{
    tls_loop *l = data;
    (void)a;
    l->fd = (what & REDSEM_WATCH_REMOVE) ? -1 : fd;
}

static void tl_timer(redsem_async *a, int64_t ms, void *data)
{
    tls_loop *l = data;
    (void)a;
    l->timer_at_ms = ms < 0 ? -1 : tf_now_ms() + ms;
}

static void tl_done(redsem_async *a, const redsem_result *r, void *user)
{
    tls_loop *l = user;
    (void)a;
    l->done++;
    l->rc = r->rc;
    l->permit = r->permit;
    l->ticks_at = l->ticks;
    snprintf(l->errmsg, sizeof l->errmsg, "%s", r->errmsg);
}

/* Turn l until its callback ran (at most 20 s). */
static void tl_run(tls_loop *l)
{
    int64_t end = tf_now_ms() + 20000;
    while (!l->done && tf_now_ms() < end) {
        int64_t wait = 10;
        if (l->timer_at_ms >= 0 && l->timer_at_ms - tf_now_ms() < wait)
            wait = l->timer_at_ms > tf_now_ms() ? l->timer_at_ms - tf_now_ms() : 0;
        struct pollfd p = {l->fd, POLLIN, 0};
        int n = poll(&p, l->fd >= 0 ? 1 : 0, (int)wait);
        l->ticks++;
        if (n > 0)
            cr_expect_geq(redsem_async_action(l->a, l->fd, REDSEM_WATCH_IN), 0);
        if (l->timer_at_ms >= 0 && tf_now_ms() >= l->timer_at_ms) {
            l->timer_at_ms = -1;
            cr_expect_geq(redsem_async_action(l->a, -1, 0), 0);
        }
    }
    cr_assert(l->done, "no callback within 20 s");
}

/* The event-loop API over TLS to a host name (the loop engine, when built: resolved, connected
 * and handshaken without blocking the loop): a try-acquire is granted; then, the server
 * stopped (it completes no TLS handshake), a new redsem_async's acquire fails at the connect
 * timeout while the loop keeps turning (the loop engine's TLS handshake blocked it before). */
Test(tls, the_event_loop_api_over_tls, TO)
{
    tls_env e;
    start_tls_server(&e, "server.crt", "no");
    char url[128], err[512];
    url_of(url, sizeof url, "rediss", "localhost", e.port);
    redsem_client *c = NULL;
    cr_assert_eq(connect_tls(url, file(&e, 3, "ca.crt"), NULL, NULL, NULL, false, &c, err,
                             sizeof err),
                 REDSEM_OK, "%s", err);
    redsem_sem *s = NULL;
    OK(c, redsem_sem_open(c, "tls-loop", REDSEM_STRATEGY_BASIC, 1, 5000, &s));
    for (int stopped = 0; stopped < 2; stopped++) {
        tls_loop l = {.fd = -1, .timer_at_ms = -1};
        OK(c, redsem_async_new(c, &l.a));
        OK(c, redsem_async_set_loop(l.a, tl_socket, tl_timer, &l));
        if (stopped)
            ts_server_pause(&e.srv, true);
        OK(c, redsem_sem_acquire_async(l.a, s, 1, 0, tl_done, &l, NULL));
        tl_run(&l);
        if (stopped)
            ts_server_pause(&e.srv, false);
        if (!stopped) {
            cr_assert_eq(l.rc, REDSEM_OK, "%s: %s", redsem_err_name(l.rc), l.errmsg);
            OK(c, redsem_permit_release(l.permit));
            redsem_permit_free(l.permit);
        } else {
            /* the engine connects anew: nothing was written */
            cr_expect(l.rc == REDSEM_ETIMEDOUT || l.rc == REDSEM_ECONN,
                      "%s: %s", redsem_err_name(l.rc), l.errmsg);
            /* 2 s at a turn each 10 ms at most: about 200; blocked, one */
            cr_expect_geq(l.ticks_at, 10, "the loop turned %d times during the connect",
                          l.ticks_at);
        }
        redsem_async_free(l.a);
    }
    redsem_sem_free(s);
    redsem_client_free(c);
    stop(&e);
}
