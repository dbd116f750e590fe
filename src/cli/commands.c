/* redsem(1): acquire, refresh, release, status. JSON output is built with jansson. */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>

#include <jansson.h>

#include "cli.h"

/* ------------------------------------------------------------------ JSON helpers */

#if JSON_INTEGER_IS_LONG_LONG
#define CLI_JSON_INT_MAX LLONG_MAX
#else
#define CLI_JSON_INT_MAX LONG_MAX
#endif

static json_t *json_u64(uint64_t v)
{
    /* fencing tokens are below 2^53 (Lua doubles on the server); never expected to clip */
    return json_integer(v > (uint64_t)CLI_JSON_INT_MAX ? CLI_JSON_INT_MAX : (json_int_t)v);
}

/* Set key to value (stolen); remembers a failure in *ok. */
static void put(json_t *obj, const char *key, json_t *value, bool *ok)
{
    if (value == NULL || json_object_set_new(obj, key, value) != 0)
        *ok = false;
}

/* Print obj as one compact line on stdout and free it. Returns the exit status. */
static int emit(const cli_opts *o, json_t *obj, bool ok)
{
    int code = CLI_EXIT_OK;
    if (!ok || obj == NULL) {
        cli_msg(o, "out of memory building the JSON output");
        code = CLI_EXIT_SOFTWARE;
    } else if (json_dumpf(obj, stdout, JSON_COMPACT) != 0 || fputc('\n', stdout) == EOF ||
               fflush(stdout) != 0) {
        cli_msg(o, "cannot write the output");
        code = CLI_EXIT_OSERR;
    }
    json_decref(obj);
    return code;
}

static json_t *permit_json(const cli_opts *o, const redsem_permit *p, int64_t lease_ms)
{
    json_t *obj = json_object();
    bool ok = obj != NULL;
    if (ok) {
        put(obj, "name", json_string(o->name), &ok);
        put(obj, "kind", json_string(o->lock ? "lock" : "semaphore"), &ok);
        put(obj, "id", json_string(redsem_permit_id(p)), &ok);
        put(obj, "fence", json_u64(redsem_permit_token(p)), &ok);
        if (!o->lock)
            put(obj, "permits", json_integer(redsem_permit_weight(p)), &ok);
        put(obj, "lease_ms", json_integer(lease_ms), &ok);
        put(obj, "validity_ms", json_integer(redsem_permit_validity_ms(p)), &ok);
    }
    if (!ok) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* ------------------------------------------------------------------ acquire */

int cli_cmd_acquire(const cli_opts *o)
{
    cli_session s;
    int code = cli_session_open(o, &s);
    if (code != 0)
        return code;
    redsem_permit *p = NULL;
    code = cli_session_acquire(o, &s, &p);
    if (code == 0) {
        /* The permit stays held on the server after we exit: only the local object is freed,
         * and nothing renews it. */
        if (o->json) {
            json_t *obj = permit_json(o, p, o->lease_ms);
            code = emit(o, obj, obj != NULL);
        } else if (printf("%s %" PRIu64 "\n", redsem_permit_id(p), redsem_permit_token(p)) < 0 ||
                   fflush(stdout) != 0) {
            cli_msg(o, "cannot write the output");
            code = CLI_EXIT_OSERR;
        }
        if (code != 0) {
            /* nobody learned the ID: give the permit back rather than leave it to expire */
            (void)redsem_permit_release(p);
        }
        redsem_permit_free(p);
    }
    cli_session_close(&s);
    return code;
}

/* ------------------------------------------------------------------ refresh, release */

/* Adopt the permit NAME ID (o->id) and refresh it (printing it with --json) or release it. */
static int on_adopted(const cli_opts *o, bool refresh)
{
    cli_session s;
    int code = cli_session_open(o, &s);
    if (code != 0)
        return code;
    redsem_permit *p = NULL;
    code = cli_session_adopt(o, &s, &p);
    if (code == 0) {
        int rc = refresh ? redsem_permit_refresh(p) : redsem_permit_release(p);
        if (rc != REDSEM_OK)
            code = cli_fail(o, NULL, rc, redsem_client_errmsg(s.client));
        else if (refresh && o->json) {
            json_t *obj = permit_json(o, p, o->lease_ms);
            code = emit(o, obj, obj != NULL);
        }
        redsem_permit_free(p);
    }
    cli_session_close(&s);
    return code;
}

int cli_cmd_refresh(const cli_opts *o)
{
    return on_adopted(o, true);
}

int cli_cmd_release(const cli_opts *o)
{
    return on_adopted(o, false);
}

/* ------------------------------------------------------------------ status */

static json_t *entries_json(const redsem_status *st, bool holders, bool *ok)
{
    json_t *arr = json_array();
    if (arr == NULL) {
        *ok = false;
        return NULL;
    }
    size_t n = holders ? redsem_status_holders_listed(st) : redsem_status_waiters_listed(st);
    for (size_t i = 0; i < n && *ok; i++) {
        const char *id = NULL;
        uint64_t num = 0;
        int64_t left = 0;
        int rc = holders ? redsem_status_holder(st, i, &id, &num, &left)
                         : redsem_status_waiter(st, i, &id, &num, &left);
        if (rc != REDSEM_OK)
            break;
        json_t *e = json_object();
        if (e == NULL || json_array_append_new(arr, e) != 0) {
            *ok = false;
            break;
        }
        put(e, "id", json_string(id), ok);
        put(e, holders ? "fence" : "ticket", json_u64(num), ok);
        put(e, "remaining_ms", json_integer(left), ok);
        if (holders)
            put(e, "permits", json_integer(redsem_status_holder_weight(st, i)), ok);
    }
    return arr;
}

static json_t *rate_json(const redsem_rate_info *ri, bool *ok)
{
    if (!ri->exists)
        return json_null();
    json_t *r = json_object();
    if (r == NULL) {
        *ok = false;
        return NULL;
    }
    put(r, "limit", json_integer(ri->limit), ok);
    put(r, "window_ms", json_integer(ri->window_ms), ok);
    put(r, "in_window", json_integer(ri->in_window), ok);
    put(r, "waiter_count", json_integer((json_int_t)ri->waiters), ok);
    put(r, "next_free_ms", json_integer(ri->next_free_ms), ok);
    put(r, "last_token", json_u64(ri->last_token), ok);
    return r;
}

static int status_json(const cli_opts *o, const redsem_status *st, const redsem_rate_info *ri)
{
    json_t *obj = json_object();
    bool ok = obj != NULL;
    if (ok) {
        int strategy = redsem_status_strategy(st);
        put(obj, "name", json_string(o->name), &ok);
        put(obj, "kind", json_string(o->lock ? "lock" : "semaphore"), &ok);
        put(obj, "exists", json_boolean(redsem_status_exists(st)), &ok);
        put(obj, "strategy",
            o->lock || strategy == 0 ? json_null() : json_string(redsem_strategy_name(strategy)),
            &ok);
        put(obj, "limit", json_integer(redsem_status_limit(st)), &ok);
        put(obj, "server", json_string(redsem_status_server(st)), &ok);
        put(obj, "holder_count", json_integer((json_int_t)redsem_status_holder_count(st)), &ok);
        put(obj, "permits_in_use", json_u64(redsem_status_permits_in_use(st)), &ok);
        put(obj, "waiter_count", json_integer((json_int_t)redsem_status_waiter_count(st)), &ok);
        if (o->lock)
            put(obj, "hold_count", json_integer(redsem_status_hold_count(st)), &ok);
        put(obj, "holders", entries_json(st, true, &ok), &ok);
        put(obj, "waiters", entries_json(st, false, &ok), &ok);
        if (!o->lock)
            put(obj, "rate", rate_json(ri, &ok), &ok);
    }
    return emit(o, obj, ok);
}

static int status_text(const cli_opts *o, const redsem_status *st, const redsem_rate_info *ri)
{
    int strategy = redsem_status_strategy(st);
    if (o->lock)
        printf("lock %s: %s\n", o->name,
               redsem_status_holder_count(st) > 0 ? "held" : "free");
    else if (!redsem_status_exists(st))
        printf("semaphore %s: not on the server\n", o->name);
    else
        printf("semaphore %s: strategy %s, limit %" PRIu32 "\n", o->name,
               redsem_strategy_name(strategy), redsem_status_limit(st));
    printf("server: %s\n", redsem_status_server(st));
    for (int pass = 0; pass < 2; pass++) {
        bool holders = pass == 0;
        size_t count = holders ? redsem_status_holder_count(st) : redsem_status_waiter_count(st);
        size_t listed = holders ? redsem_status_holders_listed(st)
                                : redsem_status_waiters_listed(st);
        if (holders && !o->lock)
            printf("holders: %zu, permits in use: %" PRIu64 "\n", count,
                   redsem_status_permits_in_use(st));
        else
            printf("%s: %zu\n", holders ? "holders" : "waiters", count);
        for (size_t i = 0; i < listed; i++) {
            const char *id = NULL;
            uint64_t num = 0;
            int64_t left = 0;
            if ((holders ? redsem_status_holder(st, i, &id, &num, &left)
                         : redsem_status_waiter(st, i, &id, &num, &left)) != REDSEM_OK)
                break;
            if (holders && !o->lock)
                printf("  %s  permits %" PRIu32 "  fence %" PRIu64 "  lease left %" PRId64
                       "ms\n",
                       id, redsem_status_holder_weight(st, i), num, left);
            else if (holders)
                printf("  %s  fence %" PRIu64 "  lease left %" PRId64 "ms\n", id, num, left);
            else if (num != 0)
                printf("  %s  ticket %" PRIu64 "  wait lease left %" PRId64 "ms\n", id, num,
                       left);
            else
                printf("  %s  wait lease left %" PRId64 "ms\n", id, left);
        }
        if (listed < count)
            printf("  ... %zu more\n", count - listed);
    }
    if (o->lock && redsem_status_hold_count(st) > 1)
        printf("hold count: %" PRIu32 "\n", redsem_status_hold_count(st));
    if (ri->exists) {
        printf("rate %s: at most %" PRIu32 " per %" PRId64 "ms; %" PRIu32
               " in the current window, %zu waiting; ",
               o->name, ri->limit, ri->window_ms, ri->in_window, ri->waiters);
        if (ri->next_free_ms == 0)
            printf("a slot is free now\n");
        else
            printf("next free slot in %" PRId64 "ms\n", ri->next_free_ms);
    }
    if (fflush(stdout) != 0) {
        cli_msg(o, "cannot write the output");
        return CLI_EXIT_OSERR;
    }
    return CLI_EXIT_OK;
}

int cli_cmd_status(const cli_opts *o)
{
    cli_session s;
    /* A semaphore is inspected by name: what the server records, whatever --strategy and
     * --limit say, and nothing is recorded for a NAME nobody uses. */
    int code = o->lock ? cli_session_open(o, &s) : cli_session_connect(o, &s);
    if (code != 0)
        return code;
    redsem_status *st = NULL;
    redsem_rate_info ri = {.exists = false};
    int rc = o->lock ? redsem_lock_status(s.lock, CLI_STATUS_MAX_ENTRIES, &st)
                     : redsem_sem_inspect(s.client, o->name, CLI_STATUS_MAX_ENTRIES, &st);
    /* NAME's rate limit (run --rate), if there is one: its own keys, the same name */
    if (rc == REDSEM_OK && !o->lock)
        rc = redsem_rate_inspect(s.client, o->name, &ri);
    if (rc != REDSEM_OK)
        code = cli_fail(o, NULL, rc, redsem_client_errmsg(s.client));
    else
        code = o->json ? status_json(o, st, &ri) : status_text(o, st, &ri);
    redsem_status_free(st);
    cli_session_close(&s);
    return code;
}
