/* Tests of redsem(1)'s metrics commands (issue 26): metrics, exporter, run --metrics-file,
 * status --watch, against the suite's private redis-server (tests/support/fixture.c).
 *
 * The text is checked with Prometheus' own `promtool check metrics` (skipped, with a
 * message, when promtool is not installed: Debian's prometheus package has it) and for
 * values that must be exact. HTTP requests go through Python's urllib (python3 is a
 * dependency already: tools/deps.sh), never through HTTP code of ours; JSON is read with
 * jansson. The Prometheus test starts a real Prometheus on loopback. Every bound is
 * generous (a busy 2-core machine) and none is a speed claim. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "fixture.h"
#include "harness.h"
#include "server.h"

static void setup(void)
{
    setenv("REDSEM_URL", tf_url(), 1);
}

/* Background processes of the running test (exporters, workers, Prometheus, the file
 * server): each is stopped by pid when the test is done with it; those left by a failed
 * assertion are killed here. */
static pid_t bg_pids[32];

static void bg_add(pid_t pid)
{
    for (size_t i = 0; i < sizeof bg_pids / sizeof *bg_pids; i++) {
        if (bg_pids[i] == 0) {
            bg_pids[i] = pid;
            return;
        }
    }
}

static void bg_forget(pid_t pid)
{
    for (size_t i = 0; i < sizeof bg_pids / sizeof *bg_pids; i++)
        if (bg_pids[i] == pid)
            bg_pids[i] = 0;
}

static void teardown(void)
{
    for (size_t i = 0; i < sizeof bg_pids / sizeof *bg_pids; i++) {
        if (bg_pids[i] > 0) {
            kill(bg_pids[i], SIGKILL);
            waitpid(bg_pids[i], NULL, 0);
            bg_pids[i] = 0;
        }
    }
    cli_cleanup();
}

TestSuite(metrics, .init = setup, .fini = teardown, .timeout = 180);

/* ------------------------------------------------------------------ helpers */

/* The value of the first sample of family (exact name, then '{' or ' ') whose labels
 * contain every "k=\"v\"" of want (NULL-terminated); found: true. */
static bool sample(const char *text, const char *family, const char *const *want, double *ret)
{
    size_t flen = strlen(family);
    for (const char *line = text; line != NULL && *line; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        if (strncmp(line, family, flen) != 0 || (line[flen] != '{' && line[flen] != ' '))
            continue;
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[2048];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), line);
        bool all = true;
        for (size_t i = 0; want != NULL && want[i] != NULL && all; i++)
            all = strstr(buf, want[i]) != NULL;
        if (!all)
            continue;
        const char *sp = strrchr(buf, ' ');
        cr_assert(sp != NULL, "sample line without a value: %s", buf);
        *ret = strtod(sp + 1, NULL);
        return true;
    }
    return false;
}

#define LABELS(...) ((const char *const[]){__VA_ARGS__, NULL})

static double must_sample(const char *text, const char *family, const char *const *want)
{
    double v = 0;
    cr_assert(sample(text, family, want, &v), "no %s sample with %s in:\n%s", family,
              want != NULL && want[0] != NULL ? want[0] : "(any labels)", text);
    return v;
}

static char name_label[8][400];
static int name_label_n;
/* "name=\"NAME\"" */
static const char *nl(const char *name)
{
    char *b = name_label[name_label_n++ % 8];
    snprintf(b, sizeof name_label[0], "name=\"%s\"", name);
    return b;
}

static bool have_program(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

/* promtool check metrics on text: returns promtool's exit status; its output in *out. */
static int promtool_check(const char *text, char **out)
{
    const char *in = cli_path("promtool-in.txt");
    const char *res = cli_path("promtool-out.txt");
    FILE *f = fopen(in, "w");
    cr_assert(f != NULL);
    fputs(text, f);
    fclose(f);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "promtool check metrics < '%s' > '%s' 2>&1", in, res);
    int st = system(cmd);
    *out = cli_slurp(res);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void expect_promtool_ok(const char *text)
{
    if (!have_program("promtool")) {
        cr_log_warn("promtool not installed (Debian: apt-get install prometheus): the text "
                    "format is not checked by Prometheus' own linter in this run");
        return;
    }
    char *out = NULL;
    int st = promtool_check(text, &out);
    cr_assert_eq(st, 0, "promtool check metrics failed (%d): %s\non:\n%s", st, out, text);
    free(out);
}

/* GET url through Python's urllib (timeout s): the HTTP status, and the body in *body. */
static int http_get(const char *url, int timeout_s, char **body)
{
    static const char py[] =
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        "    r = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))\n"
        "    code, data = r.status, r.read()\n"
        "except urllib.error.HTTPError as e:\n"
        "    code, data = e.code, e.read()\n"
        "except Exception as e:\n"
        "    code, data = 0, str(e).encode()\n"
        "sys.stdout.write('%d\\n' % code)\n"
        "sys.stdout.flush()\n"
        "sys.stdout.buffer.write(data)\n";
    const char *script = cli_path("get.py");
    if (!cli_exists(script)) {
        FILE *f = fopen(script, "w");
        cr_assert(f != NULL);
        fputs(py, f);
        fclose(f);
    }
    const char *res = cli_path("get-out.txt");
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "python3 '%s' '%s' %d > '%s' 2>&1", script, url, timeout_s, res);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "python3 failed: %d", st);
    char *text = cli_slurp(res);
    cr_assert(text != NULL);
    int code = atoi(text);
    char *nl_ = strchr(text, '\n');
    *body = strdup(nl_ != NULL ? nl_ + 1 : "");
    free(text);
    return code;
}

/* Start `redsem exporter --listen 127.0.0.1:0 ARGS...` and return its port, read from the
 * "serving http://127.0.0.1:PORT/metrics" line on its stderr. */
static int start_exporter(cli_proc *p, const char *const *env, const char *const *args)
{
    const char *all[32] = {"exporter", "--listen", "127.0.0.1:0"};
    size_t n = 3;
    for (size_t i = 0; args[i] != NULL && n < 31; i++)
        all[n++] = args[i];
    all[n] = NULL;
    cli_start(p, env, all);
    bg_add(p->pid);
    for (int i = 0; i < 1200; i++) {
        char *err = cli_slurp(p->err_path);
        const char *at = err != NULL ? strstr(err, "serving http://127.0.0.1:") : NULL;
        if (at != NULL && strchr(at, '\n') != NULL) {
            int port = atoi(at + strlen("serving http://127.0.0.1:"));
            free(err);
            cr_assert_gt(port, 0);
            return port;
        }
        free(err);
        cr_assert_eq(cli_proc_state(p->pid) == 'Z' || cli_proc_state(p->pid) == '?', false,
                     "the exporter ended before serving");
        tf_sleep_ms(50);
    }
    cr_assert_fail("the exporter did not start within 60 s");
    return -1;
}

static int stop_exporter(cli_proc *p)
{
    kill(p->pid, SIGTERM);
    int code = cli_wait(p, 60000);
    bg_forget(p->pid);
    return code;
}

/* acquire --limit LIMIT NAME, keeping the permit (lease 60 s). */
static void hold(const char *name, const char *limit)
{
    cli_proc p;
    int code = CLI(&p, NULL, "acquire", "--limit", limit, "--lease", "60s", name);
    cr_assert_eq(code, 0, "acquire exited %d: %s", code, p.err);
    cli_proc_free(&p);
}

/* ------------------------------------------------------------------ metrics */

Test(metrics, prints_the_server_figures)
{
    const char *name = cli_name("m-once");
    hold(name, "3");
    hold(name, "3");
    cli_proc p;
    int code = CLI(&p, NULL, "metrics", name);
    cr_assert_eq(code, 0, "metrics exited %d: %s", code, p.err);
    cr_assert_str_empty(p.err);
    cr_assert_eq(must_sample(p.out, "redsem_up", NULL), 1);
    cr_assert_eq(must_sample(p.out, "redsem_limit", LABELS(nl(name), "kind=\"semaphore\"")), 3);
    cr_assert_eq(must_sample(p.out, "redsem_permits_in_use", LABELS(nl(name))), 2);
    cr_assert_eq(must_sample(p.out, "redsem_holders", LABELS(nl(name))), 2);
    cr_assert_eq(must_sample(p.out, "redsem_waiters", LABELS(nl(name))), 0);
    expect_promtool_ok(p.out);
    cli_proc_free(&p);
}

Test(metrics, a_missing_name_gives_no_series)
{
    const char *name = cli_name("m-missing");
    cli_proc p;
    int code = CLI(&p, NULL, "metrics", name);
    cr_assert_eq(code, 0, "metrics exited %d: %s", code, p.err);
    cr_assert_eq(must_sample(p.out, "redsem_up", NULL), 1);
    cr_assert_null(strstr(p.out, nl(name)), "series of a missing name:\n%s", p.out);
    cli_proc_free(&p);
}

/* Leases that ran out without a release: exact, after a scripted run (two permits left to
 * expire, then an acquire whose clean-up removes them). */
Test(metrics, expired_leases_are_counted)
{
    const char *name = cli_name("m-expired");
    cli_proc p;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(CLI(&p, NULL, "acquire", "--limit", "2", "--lease", "50ms", name), 0, "%s",
                     p.err);
        cli_proc_free(&p);
    }
    tf_sleep_ms(300);
    /* this acquire finds both expired: the clean-up removes them */
    cr_assert_eq(CLI(&p, NULL, "run", "--limit", "2", "--wait", "30s", name, "--", "true"), 0,
                 "%s", p.err);
    cli_proc_free(&p);
    cr_assert_eq(CLI(&p, NULL, "metrics", name), 0, "%s", p.err);
    cr_assert_eq(must_sample(p.out, "redsem_leases_expired_total", LABELS(nl(name))), 2,
                 "%s", p.out);
    cr_assert_eq(must_sample(p.out, "redsem_holders", LABELS(nl(name))), 0);
    cli_proc_free(&p);
}

Test(metrics, match_finds_names_and_caps)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s", tf_name("m-match"));
    char names[3][128];
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], sizeof names[i], "%s-%d", prefix, i);
        hold(names[i], "2");
    }
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s-*", prefix);
    cli_proc p;
    int code = CLI(&p, NULL, "metrics", "--match", pattern);
    cr_assert_eq(code, 0, "metrics --match exited %d: %s", code, p.err);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(must_sample(p.out, "redsem_permits_in_use", LABELS(nl(names[i]))), 1);
    cr_assert_eq(must_sample(p.out, "redsem_scan_capped", NULL), 0);
    expect_promtool_ok(p.out);
    cli_proc_free(&p);

    /* more names than --max-names: the first 2 printed, the cap reported, exit 64 */
    code = CLI(&p, NULL, "metrics", "--max-names", "2", "--match", pattern);
    cr_assert_eq(code, 64, "exited %d: %s", code, p.err);
    cr_assert_eq(must_sample(p.out, "redsem_scan_capped", NULL), 1);
    cr_assert_not_null(strstr(p.err, "matches more than 2 names"), "%s", p.err);
    cr_assert_not_null(strstr(p.err, "--max-names"), "%s", p.err);
    int shown = 0;
    for (int i = 0; i < 3; i++) {
        double v;
        shown += sample(p.out, "redsem_permits_in_use", LABELS(nl(names[i])), &v);
    }
    cr_assert_eq(shown, 2, "%d names shown with --max-names 2", shown);
    expect_promtool_ok(p.out);
    cli_proc_free(&p);
}

Test(metrics, redis_refusing_the_connection)
{
    cli_proc p;
    int code = CLI(&p, UNREACHABLE_ENV, "metrics", "--retry", "0", "x");
    cr_assert_eq(code, 69, "exited %d: %s", code, p.err);
    cr_assert_not_null(strstr(p.err, "redsem: metrics x: "), "%s", p.err);
    cr_assert_str_empty(p.out);
    cli_proc_free(&p);
}

Test(metrics, usage_errors)
{
    static const struct {
        const char *args[8];
        const char *text;
    } cases[] = {
        {{"metrics"}, "NAME or --match PATTERN is missing"},
        {{"metrics", "--match", "a*", "b"}, "not both"},
        {{"metrics", "--match", ""}, "--match"},
        {{"metrics", "--max-names", "0", "--match", "a*"}, "--max-names '0'"},
        {{"metrics", "--max-names", "100001", "--match", "a*"}, "--max-names"},
        {{"metrics", "bad{name"}, "NAME 'bad{name'"},
        {{"metrics", "--listen", "127.0.0.1:1", "x"}, "--listen is not an option of metrics"},
        {{"metrics", "--lease", "1s", "x"}, "--lease is not an option of metrics"},
        {{"exporter", "x"}, "--listen ADDR:PORT is missing"},
        {{"exporter", "--listen", "nonsense", "x"}, "--listen 'nonsense'"},
        {{"exporter", "--listen", "127.0.0.1:65536", "x"}, "--listen '127.0.0.1:65536'"},
        {{"exporter", "--listen", "127.0.0.1:", "x"}, "--listen '127.0.0.1:'"},
        {{"exporter", "--listen", "example.com:80", "x"}, "numeric address"},
        {{"exporter", "--listen", "[::1:80", "x"}, "--listen '[::1:80'"},
        {{"exporter", "--listen", "127.0.0.1:0", "--scrape-timeout", "1ms", "x"},
         "--scrape-timeout '1ms'"},
        {{"status", "--watch=0", "x"}, "--watch '0'"},
        /* an INTERVAL out of range is refused, not taken for a NAME (which watched forever) */
        {{"status", "--watch", "2h", "x"}, "--watch '2h'"},
        {{"status", "--watch", "50ms", "x"}, "--watch '50ms'"},
        {{"status", "--watch", "--json", "x"}, "no --json"},
        {{"status", "--watch"}, "NAME is missing"},
        {{"status", "--match", "a*"}, "--match is not an option of status"},
        {{"acquire", "--metrics-file", "/tmp/x.prom", "x"},
         "--metrics-file is not an option of acquire"},
        {{"run", "--metrics-file", "", "x", "--", "true"}, "--metrics-file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_proc p;
        int code = cli_runv(&p, NULL, cases[i].args);
        cr_assert_eq(code, 64, "case %zu (%s): exited %d: %s", i, cases[i].args[0], code, p.err);
        cr_assert_not_null(strstr(p.err, cases[i].text), "case %zu: '%s' not in: %s", i,
                           cases[i].text, p.err);
        cr_assert_not_null(strstr(p.err, "redsem: "), "case %zu: %s", i, p.err);
        cli_proc_free(&p);
    }
}

/* ------------------------------------------------------------------ exporter */

Test(metrics, exporter_serves_metrics)
{
    const char *name = cli_name("m-exp");
    hold(name, "2");
    cli_proc e;
    int port = start_exporter(&e, NULL, CLI_ARGS(name));
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    char *body = NULL;
    int status = http_get(url, 60, &body);
    cr_assert_eq(status, 200, "status %d: %s", status, body);
    cr_assert_eq(must_sample(body, "redsem_up", NULL), 1);
    cr_assert_eq(must_sample(body, "redsem_permits_in_use", LABELS(nl(name))), 1);
    cr_assert_eq(must_sample(body, "redsem_limit", LABELS(nl(name))), 2);
    expect_promtool_ok(body);
    free(body);
    /* a second scrape reads again: one more permit held */
    hold(name, "2");
    status = http_get(url, 60, &body);
    cr_assert_eq(status, 200);
    cr_assert_eq(must_sample(body, "redsem_permits_in_use", LABELS(nl(name))), 2);
    free(body);
    /* other paths: 404 */
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    status = http_get(url, 60, &body);
    cr_assert_eq(status, 404, "status %d for /", status);
    free(body);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metricsx", port);
    status = http_get(url, 60, &body);
    cr_assert_eq(status, 404, "status %d for /metricsx", status);
    free(body);
    int code = stop_exporter(&e);
    cr_assert_eq(code, 0, "exporter exited %d: %s", code, e.err);
    cli_proc_free(&e);
}

Test(metrics, exporter_match)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "%s", tf_name("m-expm"));
    char names[3][128];
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], sizeof names[i], "%s-%d", prefix, i);
        hold(names[i], "1");
    }
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s-*", prefix);
    cli_proc e;
    int port = start_exporter(&e, NULL, CLI_ARGS("--max-names", "2", "--match", pattern));
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    char *body = NULL;
    int status = http_get(url, 60, &body);
    cr_assert_eq(status, 200, "status %d: %s", status, body);
    cr_assert_eq(must_sample(body, "redsem_scan_capped", NULL), 1);
    cr_assert_eq(must_sample(body, "redsem_up", NULL), 1);
    expect_promtool_ok(body);
    free(body);
    cr_assert_eq(stop_exporter(&e), 0);
    cr_assert_not_null(strstr(e.err, "matches more than 2 names"), "%s", e.err);
    cli_proc_free(&e);
}

/* Redis refusing: HTTP 200 with redsem_up 0, not a hang; the log says why, once. */
Test(metrics, exporter_redis_down)
{
    cli_proc e;
    int port = start_exporter(&e, UNREACHABLE_ENV, CLI_ARGS("--scrape-timeout", "5s", "x"));
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    for (int i = 0; i < 2; i++) {
        char *body = NULL;
        int status = http_get(url, 60, &body);
        cr_assert_eq(status, 200, "status %d: %s", status, body);
        cr_assert_eq(must_sample(body, "redsem_up", NULL), 0);
        expect_promtool_ok(body);
        free(body);
    }
    cr_assert_eq(stop_exporter(&e), 0, "%s", e.err);
    const char *first = strstr(e.err, "Redis unreachable");
    cr_assert_not_null(first, "%s", e.err);
    cr_assert_null(strstr(first + 1, "Redis unreachable"), "logged twice: %s", e.err);
    cli_proc_free(&e);
}

/* Redis stalled (SIGSTOP): the scrape is answered with redsem_up 0 at --scrape-timeout. */
Test(metrics, exporter_redis_stalled)
{
    ts_server srv;
    int rc = ts_server_start(&srv, NULL, false);
    if (rc == 77)
        cr_skip_test("redis-server not installed");
    cr_assert_eq(rc, 0);
    char env_url[480];
    snprintf(env_url, sizeof env_url, "REDSEM_URL=%s", srv.url);
    const char *env[] = {env_url, NULL};
    cli_proc e;
    int port = start_exporter(&e, env, CLI_ARGS("--scrape-timeout", "1s", "x"));
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
    char *body = NULL;
    cr_assert_eq(http_get(url, 60, &body), 200);
    cr_assert_eq(must_sample(body, "redsem_up", NULL), 1, "%s", body);
    free(body);
    ts_server_pause(&srv, true);
    int status = http_get(url, 60, &body);
    ts_server_pause(&srv, false);
    cr_assert_eq(status, 200, "status %d: %s", status, body);
    cr_assert_eq(must_sample(body, "redsem_up", NULL), 0, "%s", body);
    free(body);
    /* it recovers once Redis answers again */
    bool up = false;
    for (int i = 0; i < 60 && !up; i++) {
        cr_assert_eq(http_get(url, 60, &body), 200);
        double v = 0;
        up = sample(body, "redsem_up", NULL, &v) && v == 1;
        free(body);
        if (!up)
            tf_sleep_ms(500);
    }
    cr_assert(up, "redsem_up never 1 again after SIGCONT");
    cr_assert_eq(stop_exporter(&e), 0, "%s", e.err);
    cli_proc_free(&e);
    ts_server_stop(&srv);
}

Test(metrics, exporter_port_in_use)
{
    cli_proc e;
    int port = start_exporter(&e, NULL, CLI_ARGS("x"));
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    cli_proc p;
    int code = CLI(&p, NULL, "exporter", "--listen", listen, "x");
    cr_assert_eq(code, 71, "exited %d: %s", code, p.err);
    cr_assert_not_null(strstr(p.err, "Address already in use"), "%s", p.err);
    cr_assert_not_null(strstr(p.err, listen), "%s", p.err);
    cli_proc_free(&p);
    cr_assert_eq(stop_exporter(&e), 0);
    cli_proc_free(&e);
}

/* ------------------------------------------------------------------ run --metrics-file */

static char *read_file_or_fail(const char *path)
{
    char *t = cli_slurp(path);
    cr_assert_not_null(t, "%s was not written", path);
    return t;
}

/* No temporary file is left next to the metrics file. */
static void only_file_in(const char *dir, const char *file)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "ls -A '%s' > '%s' 2>&1", dir, cli_path("ls.txt"));
    cr_assert_eq(system(cmd), 0);
    char *ls = cli_slurp(cli_path("ls.txt"));
    char want[300];
    snprintf(want, sizeof want, "%s\n", file);
    cr_assert_str_eq(ls, want, "files in %s: %s", dir, ls);
    free(ls);
}

Test(metrics, run_metrics_file)
{
    const char *name = cli_name("m-run");
    char dir[640];
    snprintf(dir, sizeof dir, "%s", cli_path("textfile"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    char path[700];
    snprintf(path, sizeof path, "%s/run.prom", dir);
    cli_proc p;
    int code = CLI(&p, NULL, "run", "--limit", "1", "--metrics-file", path, name, "--", "sh",
                   "-c", "exit 3");
    cr_assert_eq(code, 3, "exited %d: %s", code, p.err);
    cli_proc_free(&p);
    char *t = read_file_or_fail(path);
    cr_assert_eq(must_sample(t, "redsem_acquire_wait_seconds_count",
                             LABELS(nl(name), "outcome=\"granted\"")),
                 1, "%s", t);
    cr_assert_eq(must_sample(t, "redsem_hold_seconds_count", LABELS(nl(name))), 1);
    cr_assert_eq(must_sample(t, "redsem_grants_total", LABELS(nl(name))), 1);
    expect_promtool_ok(t);
    free(t);
    only_file_in(dir, "run.prom");
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0644, "mode %o", st.st_mode & 0777);

    /* no permit within --wait: the file says busy, no grant, and replaces the last one */
    hold(name, "1");
    code = CLI(&p, NULL, "run", "--limit", "1", "--wait", "0", "--metrics-file", path, name,
               "--", "true");
    cr_assert_eq(code, 75, "exited %d: %s", code, p.err);
    cli_proc_free(&p);
    t = read_file_or_fail(path);
    cr_assert_eq(must_sample(t, "redsem_acquire_wait_seconds_count",
                             LABELS(nl(name), "outcome=\"busy\"")),
                 1, "%s", t);
    double v = 0;
    cr_assert(!sample(t, "redsem_acquire_wait_seconds_count",
                      LABELS(nl(name), "outcome=\"granted\""), &v) ||
                  v == 0,
              "%s", t);
    cr_assert(!sample(t, "redsem_grants_total", LABELS(nl(name)), &v) || v == 0, "%s", t);
    expect_promtool_ok(t);
    free(t);
    only_file_in(dir, "run.prom");
}

Test(metrics, run_metrics_file_lock)
{
    const char *name = cli_name("m-runlock");
    char path[700];
    snprintf(path, sizeof path, "%s", cli_path("lock.prom"));
    cli_proc p;
    int code = CLI(&p, NULL, "lock", "--metrics-file", path, name, "--", "true");
    cr_assert_eq(code, 0, "exited %d: %s", code, p.err);
    cli_proc_free(&p);
    char *t = read_file_or_fail(path);
    cr_assert_eq(must_sample(t, "redsem_grants_total", LABELS(nl(name), "kind=\"lock\"")), 1,
                 "%s", t);
    expect_promtool_ok(t);
    free(t);
}

Test(metrics, run_metrics_file_in_a_missing_directory)
{
    const char *name = cli_name("m-runmissing");
    const char *marker = cli_path("ran");
    char path[700], script[700];
    snprintf(path, sizeof path, "%s/no/such/dir/run.prom", cli_dir());
    snprintf(script, sizeof script, "touch '%s'", marker);
    cli_proc p;
    int code = CLI(&p, NULL, "run", "--metrics-file", path, name, "--", "sh", "-c", script);
    cr_assert_eq(code, 64, "exited %d: %s", code, p.err);
    cr_assert_not_null(strstr(p.err, "does not exist"), "%s", p.err);
    cr_assert_not_null(strstr(p.err, "--metrics-file"), "%s", p.err);
    cr_assert(!cli_exists(marker), "CMD ran");
    cli_proc_free(&p);
}

/* A PATH that is a directory is refused before CMD runs, as one in a missing directory is:
 * at the end, rename() over a directory would fail after CMD ran, the figures lost. */
Test(metrics, run_metrics_file_that_is_a_directory)
{
    const char *name = cli_name("m-rundir");
    const char *marker = cli_path("ran-dir");
    char dir[700], script[700];
    snprintf(dir, sizeof dir, "%s", cli_path("a-dir.prom"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    snprintf(script, sizeof script, "touch '%s'", marker);
    cli_proc p;
    int code = CLI(&p, NULL, "run", "--metrics-file", dir, name, "--", "sh", "-c", script);
    cr_assert_eq(code, 64, "exited %d: %s", code, p.err);
    cr_assert_not_null(strstr(p.err, "is a directory"), "%s", p.err);
    cr_assert_not_null(strstr(p.err, "--metrics-file"), "%s", p.err);
    cr_assert(!cli_exists(marker), "CMD ran");
    cli_proc_free(&p);
}

/* ------------------------------------------------------------------ status --watch */

static int count_lines(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

Test(metrics, watch_plain_lines_and_sigterm)
{
    const char *a = cli_name("m-watch-a");
    const char *b = cli_name("m-watch-b");
    hold(a, "2");
    cli_proc p;
    cli_start(&p, NULL, CLI_ARGS("status", "--watch", "100ms", a, b));
    char want_a[256], want_b[256];
    snprintf(want_a, sizeof want_a,
             "name=%s kind=semaphore in_use=1 limit=2 holders=1 waiters=0 oldest_wait=", a);
    snprintf(want_b, sizeof want_b, "name=%s kind=none\n", b);
    bool two_rounds = false;
    for (int i = 0; i < 1200 && !two_rounds; i++) {
        char *out = cli_slurp(p.out_path);
        two_rounds = out != NULL && count_lines(out, want_a) >= 2 && count_lines(out, want_b) >= 2;
        free(out);
        if (!two_rounds)
            tf_sleep_ms(50);
    }
    cr_assert(two_rounds, "no two rounds of plain lines within 60 s");
    kill(p.pid, SIGTERM);
    int code = cli_wait(&p, 60000);
    cr_assert_eq(code, 0, "exited %d: %s", code, p.err);
    cr_assert_null(strstr(p.out, "\033["), "escape sequences when stdout is not a terminal");
    cli_proc_free(&p);
}

Test(metrics, watch_ends_on_sigint)
{
    const char *a = cli_name("m-watch-int");
    cli_proc p;
    cli_start(&p, NULL, CLI_ARGS("status", "--watch=1h", a));
    bool drawn = false;
    for (int i = 0; i < 1200 && !drawn; i++) {
        char *out = cli_slurp(p.out_path);
        drawn = out != NULL && strstr(out, "kind=none\n") != NULL;
        free(out);
        if (!drawn)
            tf_sleep_ms(50);
    }
    cr_assert(drawn);
    kill(p.pid, SIGINT);
    int code = cli_wait(&p, 60000); /* ends at once, not after the hour */
    cr_assert_eq(code, 0, "exited %d: %s", code, p.err);
    cli_proc_free(&p);
}

Test(metrics, watch_redis_refusing)
{
    cli_proc p;
    int code = CLI(&p, UNREACHABLE_ENV, "status", "--retry", "0", "--watch", "x");
    cr_assert_eq(code, 69, "exited %d: %s", code, p.err);
    cli_proc_free(&p);
}

/* ------------------------------------------------------------------ a real Prometheus */

/* Start argv in the background, stdout and stderr to log; returns its pid. Through
 * /usr/bin/env, so that the valgrind test setup (which skips the programs in /usr/bin) runs these other
 * programs natively. */
static pid_t spawn_bg(const char *const *argv, const char *log)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* a safety net should the test die first; it is stopped by pid below */
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        const char *args[16] = {"/usr/bin/env"};
        for (size_t i = 0; argv[i] != NULL && i < 14; i++)
            args[i + 1] = argv[i];
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    bg_add(pid);
    return pid;
}

/* SIGTERM, then SIGKILL if it has not ended within 30 s. */
static void stop_bg(pid_t pid)
{
    if (pid <= 0)
        return;
    bg_forget(pid);
    kill(pid, SIGTERM);
    for (int i = 0; i < 600; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        tf_sleep_ms(50);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Poll url until it answers 200 (up to timeout_ms). */
static bool wait_http_ok(const char *url, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 250) {
        char *body = NULL;
        int status = http_get(url, 10, &body);
        free(body);
        if (status == 200)
            return true;
        tf_sleep_ms(250);
    }
    return false;
}

/* An instant query through Prometheus' HTTP API: the first result's value (false: none). */
static bool prom_query(int port, const char *query, double *ret)
{
    char enc[1024];
    size_t k = 0;
    for (const char *p = query; *p && k + 4 < sizeof enc; p++) {
        unsigned char ch = (unsigned char)*p;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '_' || ch == '.' || ch == '~')
            enc[k++] = (char)ch;
        else
            k += (size_t)snprintf(enc + k, sizeof enc - k, "%%%02X", ch);
    }
    enc[k] = '\0';
    char url[1200];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/api/v1/query?query=%s", port, enc);
    char *body = NULL;
    int status = http_get(url, 30, &body);
    cr_assert_eq(status, 200, "query %s: status %d: %s", query, status, body);
    json_error_t err;
    json_t *j = json_loads(body, 0, &err);
    cr_assert_not_null(j, "query %s: not JSON: %s", query, body);
    cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "success", "%s", body);
    json_t *result = json_object_get(json_object_get(j, "data"), "result");
    cr_assert(json_is_array(result), "%s", body);
    bool found = false;
    if (json_array_size(result) > 0) {
        json_t *value = json_object_get(json_array_get(result, 0), "value");
        const char *v = json_string_value(json_array_get(value, 1));
        cr_assert_not_null(v, "%s", body);
        *ret = strtod(v, NULL);
        found = true;
    }
    json_decref(j);
    free(body);
    return found;
}

/* Poll query until its value satisfies want (>= min), up to timeout_ms; the last value. */
static double prom_wait(int port, const char *query, double min, int timeout_ms)
{
    double v = -1;
    for (int waited = 0; waited < timeout_ms; waited += 500) {
        double got = 0;
        if (prom_query(port, query, &got)) {
            v = got;
            if (v >= min)
                return v;
        }
        tf_sleep_ms(500);
    }
    return v;
}

/* Prometheus scrapes `redsem exporter` while CLI workers hold and wait, and the workers'
 * --metrics-file texts (served as node_exporter's textfile collector would: here by
 * Python's http.server, one target per file). Read back through the query API: permits in
 * use never above the limit, waiters seen, the wait histogram's count equal to the workers'
 * acquires. */
Test(metrics, prometheus_scrapes_the_exporter, .timeout = 900)
{
    if (!have_program("prometheus"))
        cr_skip_test("prometheus not installed (Debian: apt-get install prometheus)");
    enum { WORKERS = 5 };
    const char *name = cli_name("m-prom");
    char www[640];
    snprintf(www, sizeof www, "%s", cli_path("www"));
    cr_assert_eq(mkdir(www, 0755), 0);
    char ready[700];
    snprintf(ready, sizeof ready, "%s/ready", www);
    FILE *f = fopen(ready, "w");
    cr_assert_not_null(f);
    fputs("ok\n", f);
    fclose(f);

    /* the exporter, the file server, then Prometheus on free loopback ports */
    cli_proc e;
    int exp_port = start_exporter(&e, NULL, CLI_ARGS(name));
    int fs_port = ts_free_port();
    cr_assert_gt(fs_port, 0);
    char fs_port_s[16];
    snprintf(fs_port_s, sizeof fs_port_s, "%d", fs_port);
    pid_t fs = spawn_bg(CLI_ARGS("python3", "-m", "http.server", "--bind", "127.0.0.1",
                                 "--directory", www, fs_port_s),
                        cli_path("fileserver.log"));
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/ready", fs_port);
    cr_assert(wait_http_ok(url, 60000), "the file server did not start");

    int prom_port = ts_free_port();
    cr_assert_gt(prom_port, 0);
    char cfg[640];
    snprintf(cfg, sizeof cfg, "%s", cli_path("prometheus.yml"));
    f = fopen(cfg, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "global:\n"
            "  scrape_interval: 2s\n"
            "  scrape_timeout: 2s\n"
            "scrape_configs:\n"
            "  - job_name: redsem\n"
            "    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n"
            "  - job_name: runs\n"
            "    static_configs:\n",
            exp_port);
    for (int i = 0; i < WORKERS; i++)
        fprintf(f,
                "      - targets: ['127.0.0.1:%d']\n"
                "        labels: {__metrics_path__: '/w%d.prom', worker: 'w%d'}\n",
                fs_port, i, i);
    fclose(f);
    char cfg_arg[700], data_arg[700], listen_arg[64];
    snprintf(cfg_arg, sizeof cfg_arg, "--config.file=%s", cfg);
    snprintf(data_arg, sizeof data_arg, "--storage.tsdb.path=%s", cli_path("prom-data"));
    snprintf(listen_arg, sizeof listen_arg, "--web.listen-address=127.0.0.1:%d", prom_port);
    pid_t prom = spawn_bg(CLI_ARGS("prometheus", cfg_arg, data_arg, listen_arg,
                                   "--log.level=warn"),
                          cli_path("prometheus.log"));
    snprintf(url, sizeof url, "http://127.0.0.1:%d/-/ready", prom_port);
    bool prom_ready = wait_http_ok(url, 120000);
    if (!prom_ready) {
        char *log = cli_slurp(cli_path("prometheus.log"));
        stop_bg(prom);
        stop_bg(fs);
        stop_exporter(&e);
        cr_assert_fail("Prometheus did not become ready: %s", log);
    }

    /* WORKERS runs of a semaphore of 2: two hold until GO exists, the others wait */
    char go[640];
    snprintf(go, sizeof go, "%s", cli_path("go"));
    char script[800];
    /* bounded (about 10 minutes), should the test fail before GO */
    snprintf(script, sizeof script,
             "i=0; while [ ! -e '%s' ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i+1)); done",
             go);
    static cli_proc w[WORKERS];
    char files[WORKERS][700];
    for (int i = 0; i < WORKERS; i++) {
        snprintf(files[i], sizeof files[i], "%s/w%d.prom", www, i);
        cli_start(&w[i], NULL,
                  CLI_ARGS("run", "--limit", "2", "--metrics-file", files[i], name, "--", "sh",
                           "-c", script));
        bg_add(w[i].pid);
    }
    char q[512];
    snprintf(q, sizeof q, "max_over_time(redsem_waiters{name=\"%s\"}[1h])", name);
    double waiters = prom_wait(prom_port, q, WORKERS - 2, 300000);
    snprintf(q, sizeof q, "max_over_time(redsem_permits_in_use{name=\"%s\"}[1h])", name);
    double in_use = prom_wait(prom_port, q, 2, 300000);

    /* let them all through */
    f = fopen(go, "w");
    cr_assert_not_null(f);
    fclose(f);
    for (int i = 0; i < WORKERS; i++) {
        int code = cli_wait(&w[i], 300000);
        bg_forget(w[i].pid);
        cr_assert_eq(code, 0, "worker %d exited %d: %s", i, code, w[i].err);
        cli_proc_free(&w[i]);
    }
    snprintf(q, sizeof q, "sum(redsem_acquire_wait_seconds_count{name=\"%s\"})", name);
    double acquires = prom_wait(prom_port, q, WORKERS, 300000);
    snprintf(q, sizeof q,
             "sum(redsem_acquire_wait_seconds_count{name=\"%s\",outcome=\"granted\"})", name);
    double granted = -1;
    bool have_granted = prom_query(prom_port, q, &granted);
    snprintf(q, sizeof q, "max_over_time(redsem_permits_in_use{name=\"%s\"}[1h])", name);
    double max_in_use = -1;
    bool have_max = prom_query(prom_port, q, &max_in_use);
    snprintf(q, sizeof q, "min_over_time(redsem_limit{name=\"%s\"}[1h])", name);
    double limit = -1;
    bool have_limit = prom_query(prom_port, q, &limit);

    stop_bg(prom);
    stop_bg(fs);
    cr_assert_eq(stop_exporter(&e), 0, "%s", e.err);
    cli_proc_free(&e);

    cr_assert_geq(waiters, 1, "Prometheus never saw a waiter (max %g)", waiters);
    cr_assert_eq(in_use, 2, "Prometheus never saw the 2 permits in use (max %g)", in_use);
    cr_assert(have_max && have_limit);
    cr_assert_eq(limit, 2, "redsem_limit %g", limit);
    cr_assert_leq(max_in_use, limit, "permits in use %g above the limit %g", max_in_use, limit);
    cr_assert_eq(acquires, WORKERS, "wait histogram count %g, %d acquires", acquires, WORKERS);
    cr_assert(have_granted);
    cr_assert_eq(granted, WORKERS, "granted count %g", granted);
}

/* Wait until the watch's output has a line with every one of want (up to 120 s). */
static bool watch_saw(const cli_proc *p, const char *name, const char *const *want)
{
    char tag[200];
    snprintf(tag, sizeof tag, " name=%s ", name);
    for (int i = 0; i < 2400; i++) {
        char *out = cli_slurp(p->out_path);
        bool seen = false;
        char *save = NULL;
        for (char *line = out != NULL ? strtok_r(out, "\n", &save) : NULL; line && !seen;
             line = strtok_r(NULL, "\n", &save)) {
            seen = strstr(line, tag) != NULL;
            for (size_t k = 0; seen && want[k] != NULL; k++)
                seen = strstr(line, want[k]) != NULL;
        }
        free(out);
        if (seen)
            return true;
        tf_sleep_ms(50);
    }
    return false;
}

/* A waiter that gives up is a timeout; a new holder is a grant (as the watch saw them). */
Test(metrics, watch_counts_grants_and_timeouts)
{
    const char *name = cli_name("m-watch-gt");
    cli_proc h;
    int code = CLI(&h, NULL, "acquire", "--limit", "1", "--lease", "60s", name);
    cr_assert_eq(code, 0, "%s", h.err);
    char id[64];
    cr_assert_eq(sscanf(h.out, "%63s", id), 1);
    cli_proc_free(&h);
    cli_proc w;
    cli_start(&w, NULL, CLI_ARGS("status", "--watch", "100ms", name));
    bg_add(w.pid);
    cr_assert(watch_saw(&w, name, LABELS("holders=1 waiters=0", "grants=0", "timeouts=0")));
    /* a waiter that gives up after 3 s */
    cli_proc r;
    cli_start(&r, NULL, CLI_ARGS("run", "--limit", "1", "--wait", "3s", name, "--", "true"));
    cr_assert(watch_saw(&w, name, LABELS("waiters=1")), "the waiter was not seen");
    code = cli_wait(&r, 120000);
    cr_assert_eq(code, 75, "exited %d: %s", code, r.err);
    cli_proc_free(&r);
    cr_assert(watch_saw(&w, name, LABELS("waiters=0", "timeouts=1")), "no timeout seen");
    /* the permit given back, a run that holds for 2 s: one grant */
    cr_assert_eq(CLI(&r, NULL, "release", "--limit", "1", name, id), 0, "%s", r.err);
    cli_proc_free(&r);
    cr_assert_eq(CLI(&r, NULL, "run", "--limit", "1", name, "--", "sleep", "2"), 0, "%s", r.err);
    cli_proc_free(&r);
    cr_assert(watch_saw(&w, name, LABELS("grants=1")), "no grant seen");
    kill(w.pid, SIGTERM);
    code = cli_wait(&w, 60000);
    bg_forget(w.pid);
    cr_assert_eq(code, 0, "%s", w.err);
    cli_proc_free(&w);
}

/* On a terminal: the table, redrawn in place (cursor home, no scrolling lines); Ctrl-C
 * (SIGINT from the terminal) ends it with status 0. */
Test(metrics, watch_redraws_on_a_terminal)
{
    const char *name = cli_name("m-watch-tty");
    hold(name, "3");
    char errf[640];
    snprintf(errf, sizeof errf, "%s", cli_path("watch-tty.err"));
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    cr_assert(master >= 0, "posix_openpt: %s", strerror(errno));
    cr_assert_eq(grantpt(master), 0);
    cr_assert_eq(unlockpt(master), 0);
    char slave[256];
    cr_assert_eq(ptsname_r(master, slave, sizeof slave), 0);
    const char *argv[] = {cli_bin(), "status", "--watch", "100ms", name, NULL};
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        setsid();
        int t = open(slave, O_RDWR);
        if (t < 0 || ioctl(t, TIOCSCTTY, 0) != 0)
            _exit(120);
        int e = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(t, 0);
        dup2(t, 1);
        dup2(e >= 0 ? e : t, 2);
        execv(argv[0], (char *const *)argv);
        _exit(121);
    }
    bg_add(pid);
    static char out[1 << 20];
    size_t len = 0;
    char row[200];
    snprintf(row, sizeof row, "%s ", name);
    bool redrawn = false;
    for (int64_t until = tf_now_ms() + 120000; !redrawn && tf_now_ms() < until;) {
        struct pollfd pfd = {.fd = master, .events = POLLIN};
        if (poll(&pfd, 1, 200) > 0) {
            ssize_t n = read(master, out + len, sizeof out - 1 - len);
            if (n > 0)
                len += (size_t)n;
            out[len] = '\0';
        }
        /* the first draw clears the screen; two more start at the cursor's home */
        const char *first = strstr(out, "\033[H\033[2J");
        const char *second = first != NULL ? strstr(first + 1, "\033[H") : NULL;
        const char *third = second != NULL ? strstr(second + 1, "\033[H") : NULL;
        redrawn = third != NULL && strstr(third, row) != NULL && strstr(third, "\033[J");
    }
    cr_assert(redrawn, "no table redrawn in place within 120 s: %s", out);
    cr_assert_not_null(strstr(out, "IN USE/LIMIT"));
    cr_assert_not_null(strstr(out, "1/3"), "%s", out);
    cr_assert_null(strstr(out, "name="), "plain lines on a terminal");
    cr_assert_eq(write(master, "\003", 1), 1); /* Ctrl-C */
    int status = 0;
    pid_t w = 0;
    for (int64_t until = tf_now_ms() + 60000; (w = waitpid(pid, &status, WNOHANG)) == 0 &&
                                               tf_now_ms() < until;) {
        char drain[4096];
        struct pollfd pfd = {.fd = master, .events = POLLIN};
        if (poll(&pfd, 1, 50) > 0 && read(master, drain, sizeof drain) < 0)
            tf_sleep_ms(10);
    }
    close(master);
    cr_assert_eq(w, pid, "status --watch did not end on Ctrl-C");
    bg_forget(pid);
    char *e = cli_slurp(errf);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x: %s", status,
              e ? e : "");
    free(e);
}
