/* Scenario 13, bad input through the public API and the CLI: NULL pointers, empty, huge
 * (1 MiB) and binary names, limits and leases out of range or overflowing, malformed URLs.
 * Each call returns REDSEM_EINVAL (accessors their documented neutral value), never crashes
 * and sends nothing; the CLI exits with its usage status 64, never by a signal, and no
 * sanitizer report appears on its stderr (this binary runs under ASan+UBSan in CI too). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static int calls, einval;

#define BAD(expr)                                                                              \
    do {                                                                                       \
        int rc_ = (expr);                                                                      \
        calls++;                                                                               \
        einval += rc_ == REDSEM_EINVAL;                                                        \
        cr_expect_eq(rc_, REDSEM_EINVAL, "%s returned %s", #expr, redsem_err_name(rc_));       \
    } while (0)

static char *big(size_t n, char fill)
{
    char *s = malloc(n + 1);
    memset(s, fill, n);
    s[n] = '\0';
    return s;
}

Test(input, api, .timeout = 120)
{
    fh_run r;
    fh_setup(&r, "input-api", FW_BASIC, 1, 1000, NULL, false);
    redsem_client *c = fh_client(r.srv.url, -1, -1);
    redsem_options *o = NULL;
    cr_assert_eq(redsem_options_new(&o), REDSEM_OK);
    char *mib = big(1 << 20, 'n');
    char *mib_url = big(1 << 20, 'u');
    memcpy(mib_url, "redis://", 8);
    const char *names[] = {NULL, "", mib, "bin\x01name", "sp ace", "br{ace", "br}ace", "\xff\xfe",
                           "tab\tname", "nl\nname"};
    const char *urls[] = {"", "http://x", "redis://", "redis://:@h", "redis://h:0",
                          "redis://h:65536", "redis://h:-1", "redis://h:12ab",
                          "redis://h/notadb", "redis://h/99999999999", "redis://[::1",
                          "redis://[]:1", "redis://u@h", "redis://h?x=1", "rediss://h:0",
                          "redis+sentinel://h", "redis+sentinel://h/m?db=x",
                          "redis+sentinel://h/m?sentinel_user=u",
                          "unix://", "unix://relative/path", "unix:///p?db=x", "unix:///p%zz",
                          "unix:///p%00x", "redis://h h", "redis://h\x01", mib_url};
    const int64_t bad_ms[] = {INT64_MIN, -2, -1, 0, REDSEM_TIMEOUT_MAX_MS + 1, INT64_MAX};
    const int64_t bad_lease[] = {INT64_MIN, -1, 0, REDSEM_LEASE_MIN_MS - 1,
                                 REDSEM_LEASE_MAX_MS + 1, INT64_MAX};
    const uint32_t bad_limit[] = {0, REDSEM_LIMIT_MAX + 1, UINT32_MAX};
    const char *bad_ids[] = {NULL, "", "abc", "0123456789abcdef0123456789abcdef0123456",
                             "0123456789abcdef0123456789abcdef012345678",
                             "0123456789ABCDEF0123456789abcdef01234567",
                             "0123456789abcdef0123456789abcdef0123456g",
                             "0123456789abcdef0123456789abcdef0123456 "};
    /* options */
    BAD(redsem_options_new(NULL));
    redsem_options_free(NULL);
    BAD(redsem_options_set_url(NULL, "redis://h"));
    BAD(redsem_options_set_url(o, NULL));
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++)
        BAD(redsem_options_set_url(o, urls[i]));
    for (size_t i = 0; i < sizeof bad_ms / sizeof *bad_ms; i++) {
        if (bad_ms[i] != 0) /* 0 is a valid retry window */
            BAD(redsem_options_set_retry_ms(o, bad_ms[i]));
        BAD(redsem_options_set_connect_timeout_ms(o, bad_ms[i]));
        BAD(redsem_options_set_command_timeout_ms(o, bad_ms[i]));
    }
    BAD(redsem_options_set_connect_timeout_ms(NULL, 100));
    BAD(redsem_options_set_command_timeout_ms(NULL, 100));
    BAD(redsem_options_set_retry_ms(NULL, 100));
    BAD(redsem_options_set_key_prefix(NULL, "p:"));
    BAD(redsem_options_set_key_prefix(o, NULL));
    BAD(redsem_options_set_key_prefix(o, "a{b"));
    BAD(redsem_options_set_key_prefix(o, "a b"));
    BAD(redsem_options_set_key_prefix(o, mib));
    /* clients */
    redsem_client *nc = (redsem_client *)0x1;
    BAD(redsem_client_new(o, NULL));
    BAD(redsem_client_new_verbose(o, NULL, NULL, 0));
    BAD(redsem_client_connect("redis://h", NULL));
    for (size_t i = 0; i < sizeof urls / sizeof *urls; i++)
        BAD(redsem_client_connect(urls[i], &nc));
    cr_expect_eq(nc, (redsem_client *)0x1, "out-param written on failure");
    redsem_client_free(NULL);
    cr_expect_str_eq(redsem_client_errmsg(NULL), "");
    BAD(redsem_client_ping(NULL));
    redsem_client_stats cst;
    BAD(redsem_client_get_stats(NULL, &cst));
    BAD(redsem_client_get_stats(c, NULL));
    redsem_renew_stats rst;
    BAD(redsem_client_renew_stats(NULL, &rst));
    BAD(redsem_client_renew_stats(c, NULL));
    BAD(redsem_id_generate(NULL));
    redsem_strategy strat;
    BAD(redsem_strategy_parse(NULL, &strat));
    BAD(redsem_strategy_parse("basic", NULL));
    BAD(redsem_strategy_parse("BASIC", &strat));
    BAD(redsem_strategy_parse("", &strat));
    cr_expect_str_eq(redsem_strategy_name(-1), "?");
    cr_expect_str_eq(redsem_strategy_name(INT32_MAX), "?");
    cr_expect_not_null(redsem_strerror(INT32_MIN));
    cr_expect_not_null(redsem_err_name(12345));
    /* semaphores */
    redsem_sem *s = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        BAD(redsem_sem_open(c, names[i], REDSEM_STRATEGY_BASIC, 1, 1000, &s));
    BAD(redsem_sem_open(NULL, "n", REDSEM_STRATEGY_BASIC, 1, 1000, &s));
    BAD(redsem_sem_open(c, "n", REDSEM_STRATEGY_BASIC, 1, 1000, NULL));
    BAD(redsem_sem_open(c, "n", (redsem_strategy)0, 1, 1000, &s));
    BAD(redsem_sem_open(c, "n", (redsem_strategy)4, 1, 1000, &s));
    BAD(redsem_sem_open(c, "n", (redsem_strategy)-1, 1, 1000, &s));
    for (size_t i = 0; i < sizeof bad_limit / sizeof *bad_limit; i++)
        BAD(redsem_sem_open(c, "n", REDSEM_STRATEGY_FAIR, bad_limit[i], 1000, &s));
    for (size_t i = 0; i < sizeof bad_lease / sizeof *bad_lease; i++)
        BAD(redsem_sem_open(c, "n", REDSEM_STRATEGY_FAIR, 1, bad_lease[i], &s));
    cr_expect_null(s);
    cr_assert_eq(redsem_sem_open(c, "n", REDSEM_STRATEGY_FAIR, 1, 1000, &s), REDSEM_OK);
    redsem_sem_free(NULL);
    for (size_t i = 0; i < sizeof bad_lease / sizeof *bad_lease; i++) {
        BAD(redsem_sem_set_wait_lease_ms(s, bad_lease[i]));
        BAD(redsem_sem_set_guard_lease_ms(s, bad_lease[i]));
    }
    BAD(redsem_sem_set_wait_lease_ms(NULL, 100));
    BAD(redsem_sem_set_guard_lease_ms(NULL, 100));
    cr_expect_str_eq(redsem_sem_name(NULL), "");
    cr_expect_eq(redsem_sem_limit(NULL), 0);
    cr_expect_eq(redsem_sem_lease_ms(NULL), 0);
    cr_expect_eq((int)redsem_sem_strategy(NULL), 0);
    redsem_permit *p = NULL;
    BAD(redsem_sem_try_acquire(NULL, &p));
    BAD(redsem_sem_try_acquire(s, NULL));
    BAD(redsem_sem_acquire(NULL, 0, &p));
    BAD(redsem_sem_acquire(s, 0, NULL));
    const int64_t bad_wait[] = {INT64_MIN, -2, REDSEM_WAIT_MAX_MS + 1, INT64_MAX};
    for (size_t i = 0; i < sizeof bad_wait / sizeof *bad_wait; i++)
        BAD(redsem_sem_acquire(s, bad_wait[i], &p));
    for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
        BAD(redsem_sem_acquire_as(s, bad_ids[i], 0, &p));
        BAD(redsem_sem_adopt(s, bad_ids[i], &p));
    }
    char id[REDSEM_ID_BUFSIZE];
    cr_assert_eq(redsem_id_generate(id), REDSEM_OK);
    BAD(redsem_sem_acquire_as(NULL, id, 0, &p));
    BAD(redsem_sem_acquire_as(s, id, 0, NULL));
    BAD(redsem_sem_adopt(NULL, id, &p));
    BAD(redsem_sem_adopt(s, id, NULL));
    for (size_t i = 0; i < sizeof bad_limit / sizeof *bad_limit; i++)
        BAD(redsem_sem_set_limit(s, bad_limit[i]));
    BAD(redsem_sem_set_limit(NULL, 1));
    redsem_status *st = NULL;
    BAD(redsem_sem_status(NULL, 1, &st));
    BAD(redsem_sem_status(s, 1, NULL));
    BAD(redsem_sem_status(s, (size_t)REDSEM_LIMIT_MAX + 1, &st));
    BAD(redsem_sem_status(s, SIZE_MAX, &st));
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        BAD(redsem_sem_inspect(c, names[i], 1, &st));
    BAD(redsem_sem_inspect(NULL, "n", 1, &st));
    BAD(redsem_sem_inspect(c, "n", 1, NULL));
    BAD(redsem_sem_inspect(c, "n", SIZE_MAX, &st));
    cr_expect_null(p);
    cr_expect_null(st);
    /* status accessors */
    redsem_status_free(NULL);
    cr_expect_eq(redsem_status_strategy(NULL), 0);
    cr_expect_not(redsem_status_exists(NULL));
    cr_expect_eq(redsem_status_limit(NULL), 0);
    cr_expect_eq(redsem_status_holder_count(NULL), 0);
    cr_expect_eq(redsem_status_waiter_count(NULL), 0);
    cr_expect_eq(redsem_status_holders_listed(NULL), 0);
    cr_expect_eq(redsem_status_waiters_listed(NULL), 0);
    cr_expect_eq(redsem_status_hold_count(NULL), 0);
    BAD(redsem_status_holder(NULL, 0, NULL, NULL, NULL));
    BAD(redsem_status_waiter(NULL, 0, NULL, NULL, NULL));
    cr_assert_eq(redsem_sem_status(s, 4, &st), REDSEM_OK);
    BAD(redsem_status_holder(st, 0, NULL, NULL, NULL)); /* nobody holds */
    BAD(redsem_status_holder(st, SIZE_MAX, NULL, NULL, NULL));
    BAD(redsem_status_waiter(st, SIZE_MAX, NULL, NULL, NULL));
    redsem_status_free(st);
    /* permits */
    cr_expect_str_eq(redsem_permit_id(NULL), "");
    cr_expect_eq(redsem_permit_token(NULL), 0);
    cr_expect_eq(redsem_permit_deadline_ms(NULL), 0);
    cr_expect_eq(redsem_permit_validity_ms(NULL), 0);
    cr_expect_not(redsem_permit_held(NULL));
    BAD(redsem_permit_refresh(NULL));
    BAD(redsem_permit_release(NULL));
    redsem_permit_free(NULL);
    BAD(redsem_permit_auto_renew(NULL, 0, NULL, NULL));
    BAD(redsem_permit_stop_renewal(NULL));
    cr_assert_eq(redsem_sem_try_acquire(s, &p), REDSEM_OK);
    const int64_t bad_interval[] = {INT64_MIN, -1, 1000 - 57, 1000 - (1000 / 100 + 2),
                                    INT64_MAX}; /* 57: a 1 s lease's refresh margin */
    for (size_t i = 0; i < sizeof bad_interval / sizeof *bad_interval; i++)
        BAD(redsem_permit_auto_renew(p, bad_interval[i], NULL, NULL));
    cr_expect_eq(redsem_permit_release(p), REDSEM_OK);
    redsem_permit_free(p);
    p = NULL;
    redsem_sem_free(s);
    /* locks */
    redsem_lock *l = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        BAD(redsem_lock_open(c, names[i], 1000, &l));
    for (size_t i = 0; i < sizeof bad_lease / sizeof *bad_lease; i++)
        BAD(redsem_lock_open(c, "n", bad_lease[i], &l));
    BAD(redsem_lock_open(NULL, "n", 1000, &l));
    BAD(redsem_lock_open(c, "n", 1000, NULL));
    cr_assert_eq(redsem_lock_open(c, "n", 1000, &l), REDSEM_OK);
    redsem_lock_free(NULL);
    BAD(redsem_lock_try_acquire(NULL, &p));
    BAD(redsem_lock_try_acquire(l, NULL));
    BAD(redsem_lock_acquire(NULL, 0, &p));
    for (size_t i = 0; i < sizeof bad_wait / sizeof *bad_wait; i++)
        BAD(redsem_lock_acquire(l, bad_wait[i], &p));
    for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
        BAD(redsem_lock_acquire_as(l, bad_ids[i], 0, &p));
        BAD(redsem_lock_adopt(l, bad_ids[i], &p));
    }
    BAD(redsem_lock_acquire_as(NULL, id, 0, &p));
    BAD(redsem_lock_adopt(NULL, id, &p));
    BAD(redsem_lock_status(NULL, 1, &st));
    BAD(redsem_lock_status(l, 1, NULL));
    BAD(redsem_lock_status(l, SIZE_MAX, &st));
    BAD(redsem_lock_set_reentrant(NULL, true));
    cr_assert_eq(redsem_lock_set_reentrant(l, true), REDSEM_OK);
    BAD(redsem_lock_acquire_as(l, id, 0, &p)); /* a reentrant lock's token is its owner */
    redsem_lock_free(l);
    fprintf(stderr, "SCENARIO 13 api: %d calls with bad input, %d returned REDSEM_EINVAL, no "
                    "crash\n",
            calls, einval);
    redsem_options_free(o);
    redsem_client_free(c);
    free(mib);
    free(mib_url);
    fh_teardown(&r);
}

/* ------------------------------------------------------------------ the CLI */

static int run_cli(const char *const *argv, char *err, size_t errlen, int *sig)
{
    const char *bin = getenv("REDSEM_BIN");
    int pe[2];
    cr_assert_eq(pipe(pe), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(pe[1], 2);
        int nul = open("/dev/null", O_RDWR);
        dup2(nul, 0);
        dup2(nul, 1);
        close(pe[0]);
        const char *av[64];
        int n = 0;
        av[n++] = bin;
        for (int i = 0; argv[i] && n < 63; i++)
            av[n++] = argv[i];
        av[n] = NULL;
        execv(bin, (char *const *)av);
        _exit(127);
    }
    close(pe[1]);
    size_t got = 0;
    ssize_t k;
    char sink[4096];
    for (;;) { /* drain everything (keep the start): a closed pipe would SIGPIPE the CLI */
        if (got < errlen - 1)
            k = read(pe[0], err + got, errlen - 1 - got);
        else
            k = read(pe[0], sink, sizeof sink);
        if (k <= 0)
            break;
        if (got < errlen - 1)
            got += (size_t)k;
    }
    err[got] = '\0';
    close(pe[0]);
    int st;
    waitpid(pid, &st, 0);
    *sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(input, cli, .timeout = 120)
{
    const char *bin = getenv("REDSEM_BIN");
    if (bin == NULL || access(bin, X_OK) != 0)
        cr_skip_test("SKIP: REDSEM_BIN is not set to the redsem binary");
    fh_run r;
    fh_setup(&r, "input-cli", FW_BASIC, 1, 1000, NULL, false);
    char *huge = big(100 * 1024, 'n'); /* execve limits one argument to 128 KiB */
    const char *u = r.srv.url;
    const char *const cases[][10] = {
        {NULL},
        {"frobnicate", NULL},
        {"acquire", NULL},
        {"acquire", "--url", u, "", NULL},
        {"acquire", "--url", u, "a{b}", NULL},
        {"acquire", "--url", u, "bin\x01name", NULL},
        {"acquire", "--url", u, huge, NULL},
        {"acquire", "--url", u, "--limit", "0", "n", NULL},
        {"acquire", "--url", u, "--limit", "1000001", "n", NULL},
        {"acquire", "--url", u, "--limit", "-1", "n", NULL},
        {"acquire", "--url", u, "--limit", "99999999999999999999", "n", NULL},
        {"acquire", "--url", u, "--limit", "3x", "n", NULL},
        {"acquire", "--url", u, "--lease", "0", "n", NULL},
        {"acquire", "--url", u, "--lease", "-5s", "n", NULL},
        {"acquire", "--url", u, "--lease", "99999999999999999999h", "n", NULL},
        {"acquire", "--url", u, "--lease", "5x", "n", NULL},
        {"acquire", "--url", u, "--wait", "-1", "n", NULL},
        {"acquire", "--url", u, "--wait", "soon", "n", NULL},
        {"acquire", "--url", u, "--strategy", "nope", "n", NULL},
        {"acquire", "--url", "http://x", "n", NULL},
        {"acquire", "--url", "", "n", NULL},
        {"acquire", "--url", "redis://h:99999", "n", NULL},
        {"acquire", "--url", "redis://[::1", "n", NULL},
        {"acquire", "--url", u, "--bogus", "n", NULL},
        {"release", "--url", u, "n", NULL},
        {"release", "--url", u, "n", "not-an-id", NULL},
        {"refresh", "--url", u, "n", "0123456789ABCDEF0123456789abcdef01234567", NULL},
        {"run", "--url", u, "n", NULL},
        {"run", "--url", u, "n", "--", NULL},
        {"status", NULL},
        {"lock", "--url", u, "--limit", "0", "n", "--", "true", NULL},
    };
    int n = (int)(sizeof cases / sizeof *cases), usage = 0, crashes = 0, reports = 0;
    for (int i = 0; i < n; i++) {
        char err[8192];
        int sig = 0;
        int st = run_cli(cases[i], err, sizeof err, &sig);
        bool report = strstr(err, "AddressSanitizer") || strstr(err, "runtime error") ||
                      strstr(err, "LeakSanitizer");
        usage += st == 64;
        crashes += sig != 0;
        reports += report;
        char shown[120] = "";
        for (int k = 0; cases[i][k] && strlen(shown) < 80; k++) {
            strncat(shown, " ", sizeof shown - strlen(shown) - 1);
            strncat(shown, strlen(cases[i][k]) > 40 ? "<100 KiB>" : cases[i][k],
                    sizeof shown - strlen(shown) - 1);
        }
        cr_expect_eq(sig, 0, "redsem%s: killed by signal %d", shown, sig);
        cr_expect_not(report, "redsem%s: sanitizer report:\n%s", shown, err);
        cr_expect_eq(st, 64, "redsem%s: exit %d (usage is 64): %s", shown, st, err);
    }
    fprintf(stderr, "SCENARIO 13 cli: %d bad invocations: %d exited with the usage status 64, "
                    "%d killed by a signal, %d sanitizer reports\n",
            n, usage, crashes, reports);
    free(huge);
    fh_teardown(&r);
}
