/* Unit tests that need no server: status codes, versions, options, URLs, identifiers,
 * argument validation that happens before any network I/O, NULL tolerance. */
#include <criterion/criterion.h>
#include <string.h>

#include <redsem/redsem.h>

Test(errors, every_code_has_a_name_and_text)
{
    static const int codes[] = {
#define X(name, value, text) value,
        REDSEM_ERRNO_MAP(X)
#undef X
    };
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++) {
        cr_assert_neq(strcmp(redsem_err_name(codes[i]), "REDSEM_E?"), 0);
        cr_assert_neq(strcmp(redsem_strerror(codes[i]), "unknown redsem status"), 0);
        cr_assert_eq(strncmp(redsem_err_name(codes[i]), "REDSEM_", 7), 0);
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(codes[i], codes[j], "duplicate value %d", codes[i]);
    }
    cr_assert_str_eq(redsem_err_name(REDSEM_EBUSY), "REDSEM_EBUSY");
    cr_assert_str_eq(redsem_err_name(12345), "REDSEM_E?");
    cr_assert_str_eq(redsem_strerror(-999), "unknown redsem status");
    cr_assert_str_eq(redsem_strerror(REDSEM_OK), "success");
}

Test(errors, expected_outcomes_are_not_faults)
{
    cr_assert_not(redsem_is_fault(REDSEM_OK));
    cr_assert_not(redsem_is_fault(REDSEM_EBUSY));
    cr_assert_not(redsem_is_fault(REDSEM_ELOST));
    cr_assert_not(redsem_is_fault(REDSEM_ECANCELED));
    cr_assert_not(redsem_is_fault(REDSEM_EUNKNOWN));
    cr_assert(redsem_is_fault(REDSEM_EINVAL));
    cr_assert(redsem_is_fault(REDSEM_ECONN));
    cr_assert(redsem_is_fault(REDSEM_ETIMEDOUT));
    cr_assert(redsem_is_fault(REDSEM_ESERVER));
    cr_assert(redsem_is_fault(REDSEM_EPERM));
    cr_assert(redsem_is_fault(REDSEM_EFORKED));
}

Test(version, header_matches_library)
{
    cr_assert_eq(redsem_version(), REDSEM_VERSION_HEX);
    cr_assert_str_eq(redsem_version_string(), REDSEM_VERSION_STRING);
}

Test(options, defaults_and_ranges)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, 0), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, -5), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, REDSEM_TIMEOUT_MAX_MS + 1), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(o, 1), REDSEM_OK);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 0), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, INT64_MAX), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 250), REDSEM_OK);
    cr_assert_eq(redsem_options_set_retry_ms(o, -1), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_retry_ms(o, 0), REDSEM_OK);
    cr_assert_eq(redsem_options_set_key_prefix(o, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_key_prefix(o, "a{b"), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_key_prefix(o, "a}b"), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_key_prefix(o, "with space"), REDSEM_EINVAL);
    char big[300];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cr_assert_eq(redsem_options_set_key_prefix(o, big), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_key_prefix(o, ""), REDSEM_OK);
    cr_assert_eq(redsem_options_set_key_prefix(o, "app:locks:"), REDSEM_OK);
    cr_assert_eq(redsem_options_set_connect_timeout_ms(NULL, 5), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_url(NULL, "redis://x"), REDSEM_EINVAL);
    redsem_options_free(o);
    redsem_options_free(NULL);
}

static const char *const good_urls[] = {
    "redis://localhost",
    "redis://127.0.0.1:6379",
    "redis://127.0.0.1:1/15",
    "redis://[::1]:6380/2",
    "redis://[::1]",
    "redis://:secret@host",
    "redis://user:secret@host:7000/3",
    "redis://us%40er:p%3Ass%2Fword@host/",
    "redis://a_b-c.d:65535",
    "unix:///tmp/redis.sock",
    "unix:///tmp/redis.sock?db=7",
    "unix://:pw@/tmp/redis.sock",
    "unix://user:pw@/tmp/redis.sock?db=1",
    "unix:///tmp/with%20space.sock",
    "rediss://localhost",
    "rediss://user:pw@redis.example.com:6380/2",
    "rediss://[::1]:6380",
    "redis+sentinel://127.0.0.1/mymaster",
    "redis+sentinel://h1:26379,h2:26380,[::1]:26381/mymaster",
    "redis+sentinel://user:pw@h1,h2/mymaster?db=3",
    "redis+sentinel://h1/m?sentinel_user=s&sentinel_password=p%40ss&db=1",
    "redis+sentinel://h1/m?sentinel_password=secret",
    "rediss+sentinel://h1:26379/mymaster",
    "redis+cluster://127.0.0.1:7000",
    "redis+cluster://127.0.0.1:7000/",
    "redis+cluster://h1:7000,h2:7001,[::1]:7002",
    "redis+cluster://user:p%40ss@h1:7000,h2",
    "redis+cluster://:secret@h1",
    "rediss+cluster://h1:7000,h2:7001",
};

static const char *const bad_urls[] = {
    "",
    "localhost:6379",
    "http://localhost",
    "rediss://",
    "rediss://host:0",
    "redis+sentinel://h1",
    "redis+sentinel://h1/",
    "redis+sentinel:///m",
    "redis+sentinel://h1,/m",
    "redis+sentinel://,h1/m",
    "redis+sentinel://h1:0/m",
    "redis+sentinel://h1/m/x",
    "redis+sentinel://h1/m?db=x",
    "redis+sentinel://h1/m?foo=1",
    "redis+sentinel://h1/m?db",
    "redis+sentinel://h1/m?sentinel_user=u",
    "redis+sentinel://h1/m?sentinel_password=",
    "redis+sentinel://h1/m?db=1&db=2",
    "redis+sentinel://h1?x/m",
    "redis+sentinel://h,h,h,h,h,h,h,h,h,h,h,h,h,h,h,h,h/m",
    "redis+cluster://",
    "redis+cluster:///",
    "redis+cluster://h1,",
    "redis+cluster://,h1",
    "redis+cluster://h1:0",
    "redis+cluster://h1/0",
    "redis+cluster://h1/mymaster",
    "redis+cluster://h1?db=1",
    "redis+cluster://h1/?x",
    "redis+cluster://user@h1",
    "redis+cluster://h,h,h,h,h,h,h,h,h,h,h,h,h,h,h,h,h",
    "rediss+cluster://",
    "redis://",
    "redis://:6379",
    "redis://host:0",
    "redis://host:65536",
    "redis://host:-1",
    "redis://host:12ab",
    "redis://host:",
    "redis://host/db",
    "redis://host/-1",
    "redis://host/2147483648",
    "redis://host?db=1",
    "redis://ho st",
    "redis://host\n",
    "redis://[::1",
    "redis://[]:6379",
    "redis://[::1]x",
    "redis://[zz]",
    "redis://user@host",
    "redis://user:@host",
    "redis://u:p%zz@host",
    "redis://u:p%0@host",
    "redis://u:p%00@host",
    "unix://",
    "unix://relative.sock",
    "unix:///",
    "unix:///tmp/x.sock?db=x",
    "unix:///tmp/x.sock?foo=1",
    "unix:///tmp/x.sock#frag",
    "unix://user@/tmp/x",
    "unix:///%zz",
};

Test(url, accepts_the_documented_forms)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    for (size_t i = 0; i < sizeof good_urls / sizeof *good_urls; i++)
        cr_expect_eq(redsem_options_set_url(o, good_urls[i]), REDSEM_OK, "rejected %s",
                     good_urls[i]);
    redsem_options_free(o);
}

Test(url, rejects_malformed_urls)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    for (size_t i = 0; i < sizeof bad_urls / sizeof *bad_urls; i++)
        cr_expect_eq(redsem_options_set_url(o, bad_urls[i]), REDSEM_EINVAL, "accepted %s",
                     bad_urls[i]);
    /* a path longer than sun_path, a huge URL, and a URL that is not NUL-terminated early */
    char path[200] = "unix:///";
    memset(path + 8, 'p', 150);
    path[158] = '\0';
    cr_expect_eq(redsem_options_set_url(o, path), REDSEM_EINVAL);
    static char huge[1 << 20];
    memset(huge, 'a', sizeof huge - 1);
    memcpy(huge, "redis://", 8);
    cr_expect_eq(redsem_options_set_url(o, huge), REDSEM_EINVAL);
    redsem_options_free(o);
}

Test(url, client_connect_rejects_bad_url_without_io)
{
    redsem_client *c = (redsem_client *)0x1;
    cr_assert_eq(redsem_client_connect("bogus://x", &c), REDSEM_EINVAL);
    cr_assert_eq(c, (redsem_client *)0x1, "out-param written on failure");
    cr_assert_eq(redsem_client_connect("redis://x", NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_client_new(NULL, NULL), REDSEM_EINVAL);
}

Test(client, refused_port_gives_econn_with_detail)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    /* port 1 on loopback: nothing listens there in a sandbox or CI */
    cr_assert_eq(redsem_options_set_url(o, "redis://127.0.0.1:1"), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    cr_assert_eq(redsem_client_new_verbose(o, &c, err, sizeof err), REDSEM_ECONN);
    cr_assert_null(c);
    cr_assert(strstr(err, "refused") != NULL, "message: %s", err);
    cr_assert_eq(redsem_options_set_url(o, "redis://no-such-host.invalid:6379"), REDSEM_OK);
    err[0] = '\0';
    cr_assert_eq(redsem_client_new_verbose(o, &c, err, sizeof err), REDSEM_ECONN);
    cr_assert(strstr(err, "resolve") != NULL, "message: %s", err);
    cr_assert_eq(redsem_options_set_url(o, "unix:///nonexistent/redsem.sock"), REDSEM_OK);
    cr_assert_eq(redsem_client_new_verbose(o, &c, err, sizeof err), REDSEM_ECONN);
    redsem_options_free(o);
}

Test(ids, are_forty_hex_chars_and_distinct)
{
    char a[REDSEM_ID_BUFSIZE], b[REDSEM_ID_BUFSIZE];
    cr_assert_eq(redsem_id_generate(NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_id_generate(a), REDSEM_OK);
    cr_assert_eq(redsem_id_generate(b), REDSEM_OK);
    cr_assert_eq(strlen(a), REDSEM_ID_LEN);
    cr_assert_str_neq(a, b);
    for (size_t i = 0; i < REDSEM_ID_LEN; i++)
        cr_assert(strchr("0123456789abcdef", a[i]) != NULL);
}

Test(strategy, names_round_trip)
{
    redsem_strategy s;
    cr_assert_str_eq(redsem_strategy_name(REDSEM_STRATEGY_BASIC), "basic");
    cr_assert_str_eq(redsem_strategy_name(REDSEM_STRATEGY_FAIR), "fair");
    cr_assert_str_eq(redsem_strategy_name(REDSEM_STRATEGY_LOCKED), "locked");
    cr_assert_str_eq(redsem_strategy_name(0), "lock");
    cr_assert_str_eq(redsem_strategy_name(9), "?");
    cr_assert_eq(redsem_strategy_parse("fair", &s), REDSEM_OK);
    cr_assert_eq(s, REDSEM_STRATEGY_FAIR);
    cr_assert_eq(redsem_strategy_parse("Fair", &s), REDSEM_EINVAL);
    cr_assert_eq(redsem_strategy_parse(NULL, &s), REDSEM_EINVAL);
    cr_assert_eq(redsem_strategy_parse("basic", NULL), REDSEM_EINVAL);
}

Test(null, accessors_and_destructors_tolerate_null)
{
    redsem_client_free(NULL);
    redsem_sem_free(NULL);
    redsem_lock_free(NULL);
    redsem_permit_free(NULL);
    redsem_status_free(NULL);
    cr_assert_str_eq(redsem_client_errmsg(NULL), "");
    cr_assert_str_eq(redsem_permit_id(NULL), "");
    cr_assert_eq(redsem_permit_token(NULL), 0);
    cr_assert_eq(redsem_permit_validity_ms(NULL), 0);
    cr_assert_eq(redsem_permit_deadline_ms(NULL), 0);
    cr_assert_not(redsem_permit_held(NULL));
    cr_assert_eq(redsem_permit_refresh(NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_permit_release(NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_client_ping(NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_client_get_stats(NULL, NULL), REDSEM_EINVAL);
    redsem_permit *p = NULL;
    cr_assert_eq(redsem_sem_try_acquire(NULL, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_acquire(NULL, 10, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_acquire_as(NULL, NULL, 10, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_adopt(NULL, NULL, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_set_limit(NULL, 3), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_status(NULL, 0, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_inspect(NULL, "x", 0, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_set_wait_lease_ms(NULL, 100), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_set_guard_lease_ms(NULL, 100), REDSEM_EINVAL);
    cr_assert_eq(redsem_lock_try_acquire(NULL, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_lock_acquire(NULL, 5, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_lock_acquire_as(NULL, NULL, 5, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_lock_adopt(NULL, NULL, &p), REDSEM_EINVAL);
    cr_assert_eq(redsem_lock_status(NULL, 0, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_sem_open(NULL, "x", REDSEM_STRATEGY_BASIC, 1, 1000, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_lock_open(NULL, "x", 1000, NULL), REDSEM_EINVAL);
    cr_assert_str_eq(redsem_sem_name(NULL), "");
    cr_assert_eq(redsem_sem_limit(NULL), 0);
    cr_assert_eq(redsem_status_holder_count(NULL), 0);
    cr_assert_eq(redsem_status_holder(NULL, 0, NULL, NULL, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_status_waiter(NULL, 0, NULL, NULL, NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_monotonic_ms() > 0, 1);
}

Test(options, tls_settings)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_ca(NULL, "/x", NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_ca(o, "", NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_ca(o, NULL, ""), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_ca(o, "/etc/ca.pem", NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_ca(o, NULL, NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_cert(o, NULL, "/k.pem"), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_cert(o, "", NULL), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_cert(o, "/c.pem", "/k.pem"), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_cert(o, NULL, NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_server_name(o, ""), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_server_name(o, "a b"), REDSEM_EINVAL);
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cr_assert_eq(redsem_options_set_tls_server_name(o, longname), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_server_name(o, "redis.example.com"), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_server_name(o, NULL), REDSEM_OK);
    cr_assert_eq(redsem_options_set_tls_insecure_skip_verify(NULL, true), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_tls_insecure_skip_verify(o, true), REDSEM_OK);
    redsem_options_free(o);
}

Test(options, sync_replicas_ranges)
{
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    cr_assert_eq(redsem_options_set_sync_replicas(NULL, 1, 100), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_sync_replicas(o, -1, 100), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_sync_replicas(o, 65, 100), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_sync_replicas(o, 1, 0), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_sync_replicas(o, 1, REDSEM_TIMEOUT_MAX_MS + 1), REDSEM_EINVAL);
    cr_assert_eq(redsem_options_set_sync_replicas(o, 0, 0), REDSEM_OK);
    cr_assert_eq(redsem_options_set_sync_replicas(o, 2, 100), REDSEM_OK);
    /* a WAIT timeout not shorter than the command timeout is refused at client creation */
    cr_assert_eq(redsem_options_set_command_timeout_ms(o, 100), REDSEM_OK);
    redsem_client *c = NULL;
    char err[256] = "";
    cr_assert_eq(redsem_client_new_verbose(o, &c, err, sizeof err), REDSEM_EINVAL);
    cr_assert(strstr(err, "shorter than the command timeout") != NULL, "%s", err);
    cr_assert_null(c);
    redsem_options_free(o);
}
