/* redsem(1): connecting, opening NAME, acquiring and adopting permits. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_session_connect(const cli_opts *o, cli_session *s)
{
    memset(s, 0, sizeof *s);
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
                       "rediss://... (TLS), unix:///PATH[?db=DB] or "
                       "redis+sentinel://HOST[:PORT][,HOST[:PORT]...]/MASTER[?db=DB]",
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
    if (o->sync_replicas > 0 &&
        (rc = redsem_options_set_sync_replicas(opts, o->sync_replicas, o->sync_timeout_ms)) !=
            REDSEM_OK)
        goto bad_tls;
    char err[512] = "";
    rc = redsem_client_new_verbose(opts, &s->client, err, sizeof err);
    redsem_options_free(opts);
    if (rc != REDSEM_OK)
        return cli_fail(o, NULL, rc, err);
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
    redsem_client_free(s->client);
    memset(s, 0, sizeof *s);
}

static void describe_wait(const cli_opts *o, char *buf, size_t len)
{
    if (o->wait_ms == 0)
        snprintf(buf, len, "at once");
    else
        snprintf(buf, len, "within --wait %lldms", (long long)o->wait_ms);
}

int cli_session_acquire(const cli_opts *o, cli_session *s, redsem_permit **ret_permit)
{
    char id[REDSEM_ID_BUFSIZE];
    int rc = redsem_id_generate(id);
    if (rc != REDSEM_OK)
        return cli_fail(o, "acquire", rc, NULL);
    int64_t deadline = o->wait_ms > 0 ? redsem_monotonic_ms() + o->wait_ms : 0;
    /* An acquire whose reply was lost (EUNKNOWN) may have granted a permit in id's name:
     * asking again with the same id is idempotent and tells. A few tries, then give up (the
     * lease of a permit granted unseen then expires by itself). */
    for (int attempt = 0;; attempt++) {
        int64_t timeout = o->wait_ms;
        if (o->wait_ms > 0) {
            timeout = deadline - redsem_monotonic_ms();
            if (timeout < 0)
                timeout = 0;
        }
        if (o->lock)
            rc = redsem_lock_acquire_as(s->lock, id, timeout, ret_permit);
        else
            rc = redsem_sem_acquire_as(s->sem, id, timeout, ret_permit);
        if (rc != REDSEM_EUNKNOWN || attempt >= 3)
            break;
    }
    if (rc == REDSEM_OK)
        return 0;
    if (rc == REDSEM_EBUSY) {
        char when[64];
        describe_wait(o, when, sizeof when);
        if (o->lock)
            cli_msg(o, "no permit %s: the lock is held", when);
        else
            cli_msg(o, "no permit %s: all %u permits are held", when, redsem_sem_limit(s->sem));
        return CLI_EXIT_TEMPFAIL;
    }
    return cli_fail(o, "acquire", rc, redsem_client_errmsg(s->client));
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
