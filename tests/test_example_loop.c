/* examples/loop.c, run as a user would run it: against the suite's own redis-server (its
 * unix:// URL), with a small limit and many requests, so most acquires wait their turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

#define TO .timeout = 300

/* Runs the example with args; its exit status in *status, its output in out. */
static void run_example(const char *args, int *status, char *out, size_t outlen)
{
    const char *bin = getenv("REDSEM_LOOP_EXAMPLE");
    cr_assert_not_null(bin, "REDSEM_LOOP_EXAMPLE not set by meson");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char line[512];
    out[0] = '\0';
    while (fgets(line, sizeof line, f))
        strncat(out, line, outlen - strlen(out) - 1);
    int st = pclose(f);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(example_loop, caps_the_upstream_calls_at_the_limit, TO)
{
    char args[512], out[8192];
    int status;
    snprintf(args, sizeof args, "'%s' 3 300", tf_url());
    run_example(args, &status, out, sizeof out);
    cr_assert_eq(status, 0, "exit %d:\n%s", status, out);
    cr_assert(strstr(out, "300 requests, limit 3: at most 3 upstream calls at once (cap held), "
                          "300 grants, 0 errors") != NULL,
              "%s", out);
}

Test(example_loop, help_and_bad_arguments, TO)
{
    char out[4096];
    int status;
    run_example("--help", &status, out, sizeof out);
    cr_assert_eq(status, 0, "%s", out);
    cr_assert(strstr(out, "usage: loop [URL [LIMIT [REQUESTS]]]") != NULL, "%s", out);
    run_example("redis://127.0.0.1:1 0", &status, out, sizeof out);
    cr_assert_eq(status, 2, "%s", out);
    cr_assert(strstr(out, "usage:") != NULL, "%s", out);
}
