/* Tests of redsem(1): run the real binary (path in $REDSEM_BIN) as a child process against
 * the suite's private redis-server (tests/support/fixture.c), capture its output, wait for
 * it with a deadline. */
#ifndef REDSEM_TEST_CLI_HARNESS_H
#define REDSEM_TEST_CLI_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* A redsem process started by the tests. */
typedef struct cli_proc {
    pid_t pid;
    char out_path[320];
    char err_path[320];
    int code;    /* exit status, or 128+N if killed by signal N; -1 while running */
    char *out;   /* captured stdout, after cli_wait() */
    char *err;   /* captured stderr, after cli_wait() */
    int64_t started_ms;
    int64_t elapsed_ms;
} cli_proc;

/* Path of the redsem binary under test. */
const char *cli_bin(void);
/* A private temp dir for this test (removed by cli_cleanup()), and a path inside it. */
const char *cli_dir(void);
const char *cli_path(const char *file);
void cli_cleanup(void);

/* Start redsem with the given arguments (NULL-terminated). env: NULL-terminated extra
 * environment entries "K=V" (override), or "K" (unset); may be NULL. */
void cli_start(cli_proc *p, const char *const *env, const char *const *args);
/* The same with stdout closed instead of captured. */
void cli_start_closed_stdout(cli_proc *p, const char *const *env, const char *const *args);
/* Wait up to timeout_ms; on timeout SIGKILL it and fail the test. Returns the exit status. */
int cli_wait(cli_proc *p, int timeout_ms);
/* cli_start + cli_wait(30 s). */
int cli_runv(cli_proc *p, const char *const *env, const char *const *args);
void cli_proc_free(cli_proc *p);

#define CLI_ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
/* CLI(&p, env, "run", "NAME", "--", "true") */
#define CLI(p, env, ...) cli_runv((p), (env), CLI_ARGS(__VA_ARGS__))

/* Read a whole file (NULL if it does not exist); free() it. */
char *cli_slurp(const char *path);
bool cli_exists(const char *path);
/* Wait until path exists (up to timeout_ms); returns whether it does. */
bool cli_wait_file(const char *path, int timeout_ms);
/* The state letter of a process in /proc (R, S, T for stopped, Z ...), '?' if it is gone. */
char cli_proc_state(pid_t pid);

/* An environment whose REDSEM_URL names a port nothing listens on (connection refused). */
#define UNREACHABLE_ENV ((const char *const[]){"REDSEM_URL=redis://127.0.0.1:1", NULL})
/* tf_name(base) copied into one of 8 rotating buffers (tf_name's own buffer is reused by
 * its next call): valid until 8 more calls. */
char *cli_name(const char *base);

#endif
