/* Tests of redsem(1): see harness.h. */
#include "harness.h"
#include "fixture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <redsem/redsem.h>

extern char **environ;

static char test_dir[256];
static int nprocs;

const char *cli_bin(void)
{
    const char *b = getenv("REDSEM_BIN");
    cr_assert(b != NULL && *b, "REDSEM_BIN is not set (run the tests with meson test)");
    return b;
}

const char *cli_dir(void)
{
    if (test_dir[0] == '\0') {
        const char *tmp = getenv("TMPDIR");
        snprintf(test_dir, sizeof test_dir, "%s/redsem-cli-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        cr_assert(mkdtemp(test_dir) != NULL, "mkdtemp: %s", strerror(errno));
    }
    return test_dir;
}

const char *cli_path(const char *file)
{
    static char buf[8][640];
    static int n;
    char *b = buf[n++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", cli_dir(), file);
    return b;
}

void cli_cleanup(void)
{
    if (test_dir[0] == '\0' || strstr(test_dir, "/redsem-cli-") == NULL)
        return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", test_dir);
    int rc = system(cmd);
    (void)rc;
    test_dir[0] = '\0';
}

static size_t env_key_len(const char *e)
{
    const char *eq = strchr(e, '=');
    return eq ? (size_t)(eq - e) : strlen(e);
}

/* environ with env's entries applied; the strings are borrowed. */
static char **merged_env(const char *const *env)
{
    size_t n = 0, m = 0;
    while (environ[n] != NULL)
        n++;
    while (env != NULL && env[m] != NULL)
        m++;
    char **out = calloc(n + m + 1, sizeof *out);
    cr_assert(out != NULL);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool overridden = false;
        for (size_t j = 0; j < m; j++) {
            size_t kl = env_key_len(env[j]);
            if (env_key_len(environ[i]) == kl && strncmp(environ[i], env[j], kl) == 0)
                overridden = true;
        }
        if (!overridden)
            out[k++] = environ[i];
    }
    for (size_t j = 0; j < m; j++)
        if (strchr(env[j], '=') != NULL)
            out[k++] = (char *)env[j];
    out[k] = NULL;
    return out;
}

static void start(cli_proc *p, const char *const *env, const char *const *args, bool stdout_open)
{
    memset(p, 0, sizeof *p);
    p->code = -1;
    int id = nprocs++;
    snprintf(p->out_path, sizeof p->out_path, "%s/proc%d.out", cli_dir(), id);
    snprintf(p->err_path, sizeof p->err_path, "%s/proc%d.err", cli_dir(), id);
    size_t n = 0;
    while (args[n] != NULL)
        n++;
    const char **argv = calloc(n + 2, sizeof *argv);
    cr_assert(argv != NULL);
    argv[0] = cli_bin();
    for (size_t i = 0; i < n; i++)
        argv[i + 1] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (stdout_open)
        posix_spawn_file_actions_addopen(&fa, 1, p->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    else
        posix_spawn_file_actions_addclose(&fa, 1);
    posix_spawn_file_actions_addopen(&fa, 2, p->err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char **envp = merged_env(env);
    p->started_ms = redsem_monotonic_ms();
    /* Default dispositions and no blocked signals for redsem and, through it, for the
     * commands it runs, whatever the test runner inherited: under nohup(1), say, SIGHUP is
     * ignored, and a forwarded SIGHUP would then rightly leave the command running. */
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t dfl, none;
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGHUP);
    sigaddset(&dfl, SIGINT);
    sigaddset(&dfl, SIGQUIT);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGUSR1);
    sigaddset(&dfl, SIGUSR2);
    sigaddset(&dfl, SIGPIPE);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    int err = posix_spawn(&p->pid, argv[0], &fa, &at, (char *const *)argv, envp);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    free(envp);
    free(argv);
    cr_assert_eq(err, 0, "posix_spawn %s: %s", cli_bin(), strerror(err));
}

void cli_start(cli_proc *p, const char *const *env, const char *const *args)
{
    start(p, env, args, true);
}

void cli_start_closed_stdout(cli_proc *p, const char *const *env, const char *const *args)
{
    start(p, env, args, false);
}

int cli_wait(cli_proc *p, int timeout_ms)
{
    int64_t deadline = redsem_monotonic_ms() + timeout_ms;
    int status = 0;
    for (;;) {
        pid_t w = waitpid(p->pid, &status, WNOHANG);
        if (w == p->pid)
            break;
        cr_assert(w == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
        if (redsem_monotonic_ms() > deadline) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            char *e = cli_slurp(p->err_path);
            cr_assert_fail("redsem (pid %ld) still running after %d ms; stderr: %s",
                           (long)p->pid, timeout_ms, e ? e : "");
        }
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    p->elapsed_ms = redsem_monotonic_ms() - p->started_ms;
    p->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    p->out = cli_slurp(p->out_path);
    p->err = cli_slurp(p->err_path);
    if (p->out == NULL)
        p->out = strdup("");
    if (p->err == NULL)
        p->err = strdup("");
    return p->code;
}

int cli_runv(cli_proc *p, const char *const *env, const char *const *args)
{
    cli_start(p, env, args);
    return cli_wait(p, 30000);
}

void cli_proc_free(cli_proc *p)
{
    free(p->out);
    free(p->err);
    p->out = p->err = NULL;
}

char *cli_slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    cr_assert(buf != NULL);
    size_t r;
    while ((r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += r;
        if (cap - len - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert(buf != NULL);
        }
    }
    buf[len] = '\0';
    fclose(f);
    return buf;
}

bool cli_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

bool cli_wait_file(const char *path, int timeout_ms)
{
    int64_t deadline = redsem_monotonic_ms() + timeout_ms;
    while (!cli_exists(path)) {
        if (redsem_monotonic_ms() > deadline)
            return false;
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return true;
}

char cli_proc_state(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    char *s = cli_slurp(path);
    if (s == NULL)
        return '?';
    /* pid (comm) S ... : the state follows the last ')' */
    const char *rp = strrchr(s, ')');
    char st = rp != NULL && rp[1] == ' ' ? rp[2] : '?';
    free(s);
    return st;
}

char *cli_name(const char *base)
{
    static char names[8][128];
    static int n;
    char *b = names[n++ % 8];
    snprintf(b, sizeof names[0], "%s", tf_name(base));
    return b;
}
