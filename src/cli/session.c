/* redsem(1): connecting, opening NAME, acquiring and adopting permits. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_client_options(const cli_opts *o, redsem_options **ret_opts)
{
    redsem_options *opts = NULL;
    int rc = redsem_options_new(&opts);
    if (rc != REDSEM_OK)
        return cli_fail(o, "connect", rc, NULL);
    rc = redsem_options_set_url(opts, o->url);
    if (rc != REDSEM_OK) {
        redsem_options_free(opts);
        if (rc == REDSEM_EINVAL) {
            /* the URL may hold a password: do not echo it */
            cli_msg(o, "malformed URL (from %s): use redis://[USER[:PASSWORD]@]HOST[:PORT][/DB], "
                       "rediss://... (TLS), unix:///PATH[?db=DB], "
                       "redis+sentinel://HOST[:PORT][,HOST[:PORT]...]/MASTER[?db=DB] or "
                       "redis+cluster://HOST[:PORT][,HOST[:PORT]...]",
                    o->url_source);
            return CLI_EXIT_USAGE;
        }
        return cli_fail(o, "connect", rc, NULL);
    }
    if ((o->tls_ca || o->tls_ca_dir) &&
        (rc = redsem_options_set_tls_ca(opts, o->tls_ca, o->tls_ca_dir)) != REDSEM_OK)
        goto bad_tls;
    if (o->tls_cert && (rc = redsem_options_set_tls_cert(opts, o->tls_cert, o->tls_key)) != REDSEM_OK)
        goto bad_tls;
    if (o->tls_server_name &&
        (rc = redsem_options_set_tls_server_name(opts, o->tls_server_name)) != REDSEM_OK)
        goto bad_tls;
    if (o->tls_insecure)
        (void)redsem_options_set_tls_insecure_skip_verify(opts, true);
    if (o->retry_set && (rc = redsem_options_set_retry_ms(opts, o->retry_ms)) != REDSEM_OK)
        goto bad_tls;
    if (o->allow_eviction)
        (void)redsem_options_set_allow_eviction(opts, true);
    if (o->sync_replicas > 0 &&
        (rc = redsem_options_set_sync_replicas(opts, o->sync_replicas, o->sync_timeout_ms)) !=
            REDSEM_OK)
        goto bad_tls;
    *ret_opts = opts;
    return 0;
bad_tls:
    redsem_options_free(opts);
    if (rc == REDSEM_EINVAL) {
        cli_msg(o, "invalid --tls-* or --sync-* option or REDSEM_TLS_* variable (an empty "
                   "value, or a server name with spaces or longer than 253 bytes)");
        return CLI_EXIT_USAGE;
    }
    return cli_fail(o, "connect", rc, NULL);
}

int cli_session_connect(const cli_opts *o, cli_session *s)
{
    memset(s, 0, sizeof *s);
    redsem_options *opts = NULL;
    int code = cli_client_options(o, &opts);
    if (code != 0)
        return code;
    char err[512] = "";
    int rc = redsem_client_new_verbose(opts, &s->client, err, sizeof err);
    redsem_options_free(opts);
    if (rc != REDSEM_OK)
        return cli_fail(o, NULL, rc, err);
    return 0;
}

int cli_session_open(const cli_opts *o, cli_session *s)
{
    int code = cli_session_connect(o, s);
    if (code != 0)
        return code;
    int rc;
    if (o->lock)
        rc = redsem_lock_open(s->client, o->name, o->lease_ms, &s->lock);
    else
        rc = redsem_sem_open(s->client, o->name, o->strategy, o->limit, o->lease_ms, &s->sem);
    if (rc != REDSEM_OK) {
        code = cli_fail(o, NULL, rc, redsem_client_errmsg(s->client));
        cli_session_close(s);
        return code;
    }
    return 0;
}

void cli_session_close(cli_session *s)
{
    redsem_sem_free(s->sem);
    redsem_lock_free(s->lock);
    redsem_rate_free(s->rate);
    redsem_client_free(s->client);
    memset(s, 0, sizeof *s);
}

static void describe_wait(int64_t wait_ms, char *buf, size_t len)
{
    if (wait_ms == 0)
        snprintf(buf, len, "at once");
    else
        snprintf(buf, len, "within --wait %lldms", (long long)wait_ms);
}

/* One acquire in id's name, given what is left of the wait (ms; -1: forever). */
typedef int (*acquire_fn)(void *arg, const char *id, int64_t timeout_ms);

/* Call acquire within wait_ms (0: once, at once; -1: forever) with a fresh id. An acquire
 * whose reply was lost (EUNKNOWN) may have granted in id's name: asking again with the same id
 * is idempotent and returns what it granted instead of taking a second one. A few tries, then
 * EUNKNOWN (what was granted unseen then expires by itself). Returns the last call's code;
 * *generate_failed tells a failed id generation from the acquire's own codes. */
static int acquire_retrying_unknown(int64_t wait_ms, acquire_fn acquire, void *arg,
                                    bool *generate_failed)
{
    char id[REDSEM_ID_BUFSIZE];
    int rc = redsem_id_generate(id);
    *generate_failed = rc != REDSEM_OK;
    if (rc != REDSEM_OK)
        return rc;
    int64_t deadline = wait_ms > 0 ? redsem_monotonic_ms() + wait_ms : 0;
    for (int attempt = 0;; attempt++) {
        int64_t timeout = wait_ms;
        if (wait_ms > 0) {
            timeout = deadline - redsem_monotonic_ms();
            if (timeout < 0)
                timeout = 0;
        }
        rc = acquire(arg, id, timeout);
        if (rc != REDSEM_EUNKNOWN || attempt >= 3)
            return rc;
    }
}

typedef struct permit_call {
    const cli_opts *o;
    cli_session *s;
    redsem_permit **ret_permit;
} permit_call;

static int acquire_permit(void *arg, const char *id, int64_t timeout_ms)
{
    permit_call *c = arg;
    if (c->o->lock)
        return redsem_lock_acquire_as(c->s->lock, id, timeout_ms, c->ret_permit);
    return redsem_sem_acquire_as_n(c->s->sem, id, c->o->permits, timeout_ms, c->ret_permit);
}

int cli_session_acquire(const cli_opts *o, cli_session *s, redsem_permit **ret_permit)
{
    permit_call call = {o, s, ret_permit};
    bool no_id;
    int rc = acquire_retrying_unknown(o->wait_ms, acquire_permit, &call, &no_id);
    if (no_id)
        return cli_fail(o, "acquire", rc, NULL);
    if (rc == REDSEM_OK)
        return 0;
    if (rc == REDSEM_EBUSY) {
        char when[64];
        describe_wait(o->wait_ms, when, sizeof when);
        if (o->lock)
            cli_msg(o, "no permit %s: the lock is held", when);
        else if (o->permits > 1)
            cli_msg(o, "no %u permits free together %s (limit %u)", o->permits, when,
                    redsem_sem_limit(s->sem));
        else
            cli_msg(o, "no permit %s: all %u permits are held", when, redsem_sem_limit(s->sem));
        return CLI_EXIT_TEMPFAIL;
    }
    return cli_fail(o, "acquire", rc, redsem_client_errmsg(s->client));
}

typedef struct rate_call {
    redsem_rate *rate;
    redsem_rate_grant *g;
} rate_call;

static int acquire_rate(void *arg, const char *id, int64_t timeout_ms)
{
    rate_call *c = arg;
    return redsem_rate_acquire_as(c->rate, id, timeout_ms, c->g);
}

int cli_session_rate(const cli_opts *o, cli_session *s, int64_t wait_ms, redsem_rate_grant *g)
{
    int rc = redsem_rate_open(s->client, o->name, o->rate_n, o->rate_window_ms, &s->rate);
    if (rc != REDSEM_OK)
        return cli_fail(o, "open the rate", rc, redsem_client_errmsg(s->client));
    rate_call call = {s->rate, g};
    bool no_id;
    rc = acquire_retrying_unknown(wait_ms, acquire_rate, &call, &no_id);
    if (no_id)
        return cli_fail(o, "rate", rc, NULL);
    if (rc == REDSEM_OK)
        return 0;
    if (rc == REDSEM_EBUSY) {
        char when[64];
        describe_wait(wait_ms, when, sizeof when);
        cli_msg(o, "no rate grant %s: %u grants in the last %lldms; the next slot frees in "
                   "%lldms",
                when, o->rate_n, (long long)o->rate_window_ms, (long long)g->retry_after_ms);
        return CLI_EXIT_TEMPFAIL;
    }
    return cli_fail(o, "rate", rc, redsem_client_errmsg(s->client));
}

int cli_session_adopt(const cli_opts *o, cli_session *s, redsem_permit **ret_permit)
{
    int rc;
    if (o->lock)
        rc = redsem_lock_adopt(s->lock, o->id, ret_permit);
    else
        rc = redsem_sem_adopt(s->sem, o->id, ret_permit);
    if (rc == REDSEM_OK)
        return 0;
    if (rc == REDSEM_ELOST) {
        cli_msg(o, "%s holds no permit of %s %s: its lease expired, it was released, or it "
                   "never existed",
                o->id, o->lock ? "the lock" : "the semaphore", o->name);
        return CLI_EXIT_LOST;
    }
    return cli_fail(o, NULL, rc, redsem_client_errmsg(s->client));
}
