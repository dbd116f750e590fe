/* redsem(1): run and lock - hold a permit while a command runs.
 *
 * 1. Acquire (signals keep their default actions meanwhile, so Ctrl-C ends a wait at once).
 * 2. Block the signals we handle, install their handlers, start automatic renewal. The
 *    renewer thread takes no signals (renew.c blocks them all in it; ours are blocked here
 *    too, so this holds whatever the library does), so every signal is taken by the main
 *    thread, and a handler never interrupts the renewer's I/O.
 * 3. posix_spawnp() CMD with the original signal mask, default dispositions for the signals
 *    we catch, REDSEM_NAME/ID/FENCE/PERMITS (and REDSEM_RATE_TOKEN/GRANTED_US with --rate) in its
 *    environment and (unless --foreground) a process
 *    group of its own. posix_spawn needs nothing unsafe between fork and exec, which matters
 *    in a process that has a second thread, and reports exec failures (127, 126).
 * 4. Unblock the signals in the main thread and supervise: poll a self-pipe written by the
 *    signal handlers and by the lost-lease callback (which runs on the renewer thread and
 *    only writes a byte: the main thread does the rest), forward signals, reap CMD, and on a lost
 *    lease SIGTERM CMD, then SIGKILL it after --kill-after.
 * 5. Block the signals again, release the permit (whatever happened) and exit with CMD's
 *    status, 128+N if a signal N killed it, or 79 if the lease was lost.
 *
 * Process groups (the default, as timeout(1) does): CMD leads a group of its own and every
 * signal goes to the whole group, so a lost lease also stops what CMD started (a shell
 * script's workers). A terminal's Ctrl-C reaches redsem's group only; redsem forwards it.
 * Such a CMD is not in the terminal's foreground group, so reading the terminal stops it:
 * --foreground keeps CMD in redsem's group instead; the terminal then signals both, and a
 * signal the terminal sent (si_code SI_KERNEL) is not forwarded a second time; only CMD
 * itself (not its children) is signalled by redsem. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

extern char **environ;

/* Signals sent to redsem that are passed on to CMD. */
static const int forwarded[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};

#define MAX_SIG 65

static int wake_fd[2] = {-1, -1};
static volatile sig_atomic_t pending[MAX_SIG];
static volatile sig_atomic_t foreground_mode;
static atomic_int lost_reason; /* 0, or a redsem_lost_reason */

static void wake(void)
{
    char b = 1;
    ssize_t n = write(wake_fd[1], &b, 1); /* non-blocking: a full pipe already wakes us */
    (void)n;
}

static void on_signal(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    int saved = errno;
    bool from_terminal = false;
#ifdef SI_KERNEL
    from_terminal = info != NULL && info->si_code == SI_KERNEL;
#else
    (void)info;
#endif
    if (sig > 0 && sig < MAX_SIG && !(foreground_mode && from_terminal))
        pending[sig] = 1;
    wake();
    errno = saved;
}

/* Runs on the renewer thread: only an atomic store and a write(). */
static void on_lost(redsem_permit *permit, redsem_lost_reason reason, void *user_data)
{
    (void)permit;
    (void)user_data;
    atomic_store(&lost_reason, (int)reason);
    wake();
}

static int64_t now_ms(void)
{
    return redsem_monotonic_ms();
}

/* ------------------------------------------------------------------ signals */

typedef struct sig_setup {
    sigset_t handled;   /* signals with our handler installed */
    sigset_t orig_mask; /* the mask redsem started with (CMD gets it back) */
    bool blocked;
} sig_setup;

static bool ignored_at_start(int sig)
{
    struct sigaction sa;
    return sigaction(sig, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN;
}

/* Choose the signals to handle and block them; handlers are installed by install(). */
static void block_signals(const cli_opts *o, sig_setup *ss)
{
    sigemptyset(&ss->handled);
    sigaddset(&ss->handled, SIGCHLD);
    /* a signal ignored when redsem started stays ignored, for redsem and for CMD (nohup) */
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        if (!ignored_at_start(forwarded[i]))
            sigaddset(&ss->handled, forwarded[i]);
    if (!o->foreground) {
        if (!ignored_at_start(SIGTSTP))
            sigaddset(&ss->handled, SIGTSTP);
        sigaddset(&ss->handled, SIGCONT);
    }
    pthread_sigmask(SIG_BLOCK, &ss->handled, &ss->orig_mask);
    ss->blocked = true;
}

static int install_handlers(const sig_setup *ss)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO; /* no SA_RESTART: poll() returns at once */
    sa.sa_mask = ss->handled;
    for (int sig = 1; sig < MAX_SIG; sig++)
        if (sigismember(&ss->handled, sig) == 1 && sigaction(sig, &sa, NULL) != 0)
            return -1;
    return 0;
}

static int make_wake_pipe(void)
{
    if (pipe(wake_fd) != 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(wake_fd[i], F_GETFL);
        if (fl < 0 || fcntl(wake_fd[i], F_SETFL, fl | O_NONBLOCK) != 0 ||
            fcntl(wake_fd[i], F_SETFD, FD_CLOEXEC) != 0)
            return -1;
    }
    return 0;
}

static void drain_wake_pipe(void)
{
    char buf[64];
    while (read(wake_fd[0], buf, sizeof buf) > 0)
        ;
}

/* ------------------------------------------------------------------ spawning */

static bool starts_with(const char *s, const char *pfx)
{
    return strncmp(s, pfx, strlen(pfx)) == 0;
}

/* Variables of ours in CMD's environment: environ's own copies are dropped. */
static const char *const own_vars[] = {"REDSEM_NAME=", "REDSEM_ID=", "REDSEM_FENCE=",
                                       "REDSEM_PERMITS=", "REDSEM_RATE_TOKEN=",
                                       "REDSEM_RATE_GRANTED_US="};
#define N_OWN_VARS (sizeof own_vars / sizeof own_vars[0])

static bool own_var(const char *e)
{
    for (size_t i = 0; i < N_OWN_VARS; i++)
        if (starts_with(e, own_vars[i]))
            return true;
    return false;
}

/* REDSEM_URL=... from environ without its passwords, as a new string (NULL if it has none,
 * or out of memory: then the variable is left out): the data nodes' (":PASSWORD" of the
 * userinfo, before the last '@' of the authority, which ends at the first '/' or '?') and the
 * Sentinels' ("sentinel_password=P" of the query). CMD keeps the address and the user: it can
 * reach the same Redis with a password of its own, but never reads ours from /proc. */
static char *url_without_passwords(const char *var, bool *redacted)
{
    size_t len = strlen(var);
    char *out = malloc(len + 1);
    *redacted = false;
    if (out == NULL) {
        *redacted = true;
        return NULL;
    }
    const char *scheme = strstr(var, "://");
    const char *auth = scheme != NULL ? scheme + 3 : var + len;
    size_t alen = strcspn(auth, "/?");
    const char *at = NULL;
    for (const char *q = auth; q < auth + alen; q++)
        if (*q == '@')
            at = q;
    const char *colon = at != NULL ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    size_t k = 0;
    for (const char *q = var; *q != '\0';) {
        if (colon != NULL && q == colon) {
            q = colon == auth ? at + 1 : at; /* drop ":PASSWORD" (and an '@' after no user) */
            *redacted = true;
            continue;
        }
        bool param_start = q > auth + alen && (q[-1] == '?' || q[-1] == '&');
        if (param_start && strncmp(q, "sentinel_password=", 18) == 0) {
            q += strcspn(q, "&");
            if (*q == '&')
                q++;
            else if (k > 0 && (out[k - 1] == '&' || out[k - 1] == '?'))
                k--; /* the last parameter: drop its separator too */
            *redacted = true;
            continue;
        }
        out[k++] = *q++;
    }
    out[k] = '\0';
    if (!*redacted) {
        free(out);
        return NULL;
    }
    return out;
}

/* environ without our variables and with REDSEM_URL's passwords removed, plus ours:
 * REDSEM_NAME; REDSEM_ID, REDSEM_FENCE and
 * REDSEM_PERMITS (its weight, --permits) of the permit p (if any); REDSEM_RATE_TOKEN and REDSEM_RATE_GRANTED_US of the rate grant g (if
 * any). Built before the spawn (no allocation happens between fork and exec). Free with
 * free_env(). */
static char **child_env(const cli_opts *o, const redsem_permit *p, const redsem_rate_grant *g)
{
    size_t n = 0;
    for (char **e = environ; e != NULL && *e != NULL; e++)
        n++;
    char **env = calloc(n + N_OWN_VARS + 2, sizeof *env);
    if (env == NULL)
        return NULL;
    size_t k = 0;
    char *url = NULL;
    bool seen_url = false;
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        if (own_var(*e))
            continue;
        if (starts_with(*e, "REDSEM_URL=")) {
            if (seen_url)
                continue; /* getenv() reads the first; a later one is nobody's */
            seen_url = true;
            bool redacted;
            url = url_without_passwords(*e, &redacted);
            if (redacted) {
                if (url == NULL) { /* out of memory */
                    free(env);
                    return NULL;
                }
                continue; /* added below, with ours */
            }
        }
        env[k++] = *e;
    }
    size_t own = k;
    if (url != NULL)
        env[k++] = url;
    char fence[32] = "", permits[16] = "", rate_token[32] = "", rate_us[32] = "";
    if (p != NULL) {
        snprintf(fence, sizeof fence, "%" PRIu64, redsem_permit_token(p));
        snprintf(permits, sizeof permits, "%" PRIu32, o->permits > 0 ? o->permits : 1);
    }
    if (g != NULL) {
        snprintf(rate_token, sizeof rate_token, "%" PRIu64, g->token);
        snprintf(rate_us, sizeof rate_us, "%" PRId64, g->granted_us);
    }
    const char *vals[N_OWN_VARS] = {o->name,           p ? redsem_permit_id(p) : NULL,
                                    p ? fence : NULL,  p ? permits : NULL,
                                    g ? rate_token : NULL, g ? rate_us : NULL};
    for (size_t i = 0; i < N_OWN_VARS; i++) {
        if (vals[i] == NULL)
            continue;
        size_t len = strlen(own_vars[i]) + strlen(vals[i]) + 1;
        char *v = malloc(len);
        if (v == NULL) {
            for (size_t j = own; j < k; j++)
                free(env[j]);
            free(env);
            return NULL;
        }
        snprintf(v, len, "%s%s", own_vars[i], vals[i]);
        env[k++] = v;
    }
    env[k] = NULL;
    return env;
}

static void free_env(char **env)
{
    if (env == NULL)
        return;
    /* ours are the entries of our variables (child_env() dropped environ's own) and a
     * REDSEM_URL without passwords that is not environ's own */
    for (size_t i = 0; env[i] != NULL; i++) {
        bool from_environ = false;
        for (char **e = environ; e != NULL && *e != NULL && !from_environ; e++)
            from_environ = *e == env[i];
        if (own_var(env[i]) || !from_environ)
            free(env[i]);
    }
    free(env);
}

/* Returns 0 with *ret_pid, or an exit status (message printed). */
static int spawn_cmd(const cli_opts *o, const sig_setup *ss, char **env, pid_t *ret_pid)
{
    posix_spawnattr_t attr;
    int err = posix_spawnattr_init(&attr);
    if (err != 0) {
        cli_msg(o, "cannot run %s: %s", o->argv[0], strerror(err));
        return CLI_EXIT_OSERR;
    }
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (!o->foreground) {
        flags |= POSIX_SPAWN_SETPGROUP;
        err = posix_spawnattr_setpgroup(&attr, 0);
    }
    if (err == 0)
        err = posix_spawnattr_setsigmask(&attr, &ss->orig_mask);
    if (err == 0)
        err = posix_spawnattr_setsigdefault(&attr, &ss->handled);
    if (err == 0)
        err = posix_spawnattr_setflags(&attr, flags);
    pid_t pid = 0;
    if (err == 0)
        err = posix_spawnp(&pid, o->argv[0], NULL, &attr, o->argv, env);
    posix_spawnattr_destroy(&attr);
    if (err == 0) {
        *ret_pid = pid;
        return 0;
    }
    cli_msg(o, "cannot run %s: %s", o->argv[0], strerror(err));
    switch (err) {
    case ENOENT:
    case ENOTDIR:
    case ENAMETOOLONG:
    case ELOOP:
        return CLI_EXIT_NOTFOUND;
    case EACCES:
    case EPERM:
    case ENOEXEC:
    case EISDIR:
    case ETXTBSY:
        return CLI_EXIT_NOEXEC;
    default:
        return CLI_EXIT_OSERR;
    }
}

/* ------------------------------------------------------------------ supervision */

static const char *lost_text(int reason)
{
    switch (reason) {
    case REDSEM_LOST_EXPIRED:
        return "a renewal found it expired, released or taken over";
    case REDSEM_LOST_DEADLINE:
        return "no renewal succeeded before it ran out (Redis unreachable or too slow)";
    default:
        return "its validity ran out without a renewal";
    }
}

static void signal_cmd(const cli_opts *o, pid_t pid, int sig)
{
    (void)kill(o->foreground ? pid : -pid, sig);
}

typedef struct outcome {
    int wstatus;
    bool lost;
} outcome;

/* Wait for CMD, forwarding signals and enforcing the lease. Signals are unblocked in this
 * thread meanwhile. */
static void supervise(const cli_opts *o, redsem_permit *p, pid_t pid, outcome *out)
{
    int64_t kill_at = 0;
    bool kill_sent = false;
    out->lost = false;
    for (;;) {
        int wstatus = 0;
        pid_t w = waitpid(pid, &wstatus, WNOHANG);
        if (w == pid) {
            out->wstatus = wstatus;
            break;
        }
        if (w < 0 && errno != EINTR) { /* cannot happen: pid is our child */
            out->wstatus = 0;
            cli_msg(o, "waitpid: %s", strerror(errno));
            break;
        }
        for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) {
            int sig = forwarded[i];
            if (pending[sig]) {
                pending[sig] = 0;
                signal_cmd(o, pid, sig);
            }
        }
        if (!o->foreground && pending[SIGTSTP]) {
            /* Ctrl-Z: stop CMD's group (SIGSTOP: it cannot refuse), then ourselves, as a
             * job; `fg` or `bg` continues us, and we continue CMD. */
            pending[SIGTSTP] = 0;
            signal_cmd(o, pid, SIGSTOP);
            (void)kill(getpid(), SIGSTOP);
            pending[SIGCONT] = 1;
        }
        if (!o->foreground && pending[SIGCONT]) {
            pending[SIGCONT] = 0;
            signal_cmd(o, pid, SIGCONT);
        }
        int reason = atomic_load(&lost_reason);
        if (!out->lost && (reason != 0 || (p != NULL && !redsem_permit_held(p)))) {
            out->lost = true;
            kill_at = now_ms() + o->kill_after_ms;
            cli_msg(o, "lease lost: %s; sending SIGTERM to %s (pid %ld)%s, SIGKILL after "
                       "%" PRId64 "ms",
                    lost_text(reason), o->argv[0], (long)pid,
                    o->foreground ? "" : " and its process group", o->kill_after_ms);
            signal_cmd(o, pid, SIGTERM);
            signal_cmd(o, pid, SIGCONT); /* a stopped CMD must see its SIGTERM */
        }
        int timeout = 1000;
        if (out->lost && !kill_sent) {
            int64_t left = kill_at - now_ms();
            if (left <= 0) {
                cli_msg(o, "%s (pid %ld) did not exit within %" PRId64 "ms: sending SIGKILL",
                        o->argv[0], (long)pid, o->kill_after_ms);
                signal_cmd(o, pid, SIGKILL);
                kill_sent = true;
            } else if (left < timeout) {
                timeout = (int)left;
            }
        }
        struct pollfd pfd = {.fd = wake_fd[0], .events = POLLIN};
        (void)poll(&pfd, 1, timeout);
        drain_wake_pipe();
    }
    /* Lost: CMD's group must not outlive the permit. Members left behind by the leader get
     * the rest of the grace period, then SIGKILL. */
    if (out->lost && !o->foreground && !kill_sent) {
        while (kill(-pid, 0) == 0 && now_ms() < kill_at)
            (void)poll(NULL, 0, 50);
        if (kill(-pid, 0) == 0)
            (void)kill(-pid, SIGKILL);
    }
}

static int exit_status_of(int wstatus)
{
    if (WIFEXITED(wstatus))
        return WEXITSTATUS(wstatus);
    if (WIFSIGNALED(wstatus))
        return 128 + WTERMSIG(wstatus);
    return CLI_EXIT_SOFTWARE;
}

/* ------------------------------------------------------------------ the command */

/* The end of a run that connected: --metrics-file gets the run's figures (the wait and its
 * outcome, the hold), then the session is closed. A file that cannot be written is reported;
 * CMD's own status (or redsem's, if CMD did not run) stands. */
static int finish(const cli_opts *o, cli_session *s, int code)
{
    (void)cli_metrics_file_write(o, s->client);
    cli_session_close(s);
    return code;
}

int cli_cmd_run(const cli_opts *o)
{
    /* --rate alone: a rate grant, no permit. --rate with --limit or --strategy: the grant
     * first, then a permit of the semaphore NAME in what is left of --wait; so a permit is
     * never held while waiting for the rate, and the two cannot deadlock
     * (docs/ratelimits.md). */
    bool rate = o->rate_n > 0;
    bool permit = !rate || o->lock || o->limit_set || o->strategy_set;
    cli_session s;
    int code = cli_metrics_file_check(o);
    if (code != 0)
        return code;
    code = permit ? cli_session_open(o, &s) : cli_session_connect(o, &s);
    if (code != 0)
        return code;
    redsem_rate_grant grant;
    cli_opts po = *o; /* the permit's options: its wait is what the rate left */
    if (rate) {
        int64_t start = redsem_monotonic_ms();
        code = cli_session_rate(o, &s, o->wait_ms, &grant);
        if (code != 0)
            return finish(o, &s, code);
        if (o->wait_ms > 0) {
            po.wait_ms = o->wait_ms - (redsem_monotonic_ms() - start);
            if (po.wait_ms < 0)
                po.wait_ms = 0;
        }
    }
    redsem_permit *p = NULL;
    if (permit && (code = cli_session_acquire(&po, &s, &p)) != 0)
        return finish(o, &s, code);

    /* From here on the permit is released on every path. */
    foreground_mode = o->foreground;
    sig_setup ss;
    block_signals(o, &ss);
    bool lost = false;
    char **env = NULL;
    if (make_wake_pipe() != 0 || install_handlers(&ss) != 0) {
        cli_msg(o, "cannot set up signal handling: %s", strerror(errno));
        code = CLI_EXIT_OSERR;
        goto release;
    }
    int rc = p != NULL ? redsem_permit_auto_renew(p, 0, on_lost, NULL) : REDSEM_OK;
    if (rc != REDSEM_OK) {
        code = cli_fail(o, "start automatic renewal", rc, redsem_client_errmsg(s.client));
        goto release;
    }
    if (atomic_load(&lost_reason) != 0 || (p != NULL && !redsem_permit_held(p))) {
        cli_msg(o, "lease lost before %s could start: %s", o->argv[0],
                lost_text(atomic_load(&lost_reason)));
        lost = true;
        code = CLI_EXIT_LOST;
        goto release;
    }
    env = child_env(o, p, rate ? &grant : NULL);
    if (env == NULL) {
        cli_msg(o, "out of memory");
        code = CLI_EXIT_SOFTWARE;
        goto release;
    }
    pid_t pid = 0;
    code = spawn_cmd(o, &ss, env, &pid);
    if (code != 0)
        goto release;

    pthread_sigmask(SIG_SETMASK, &ss.orig_mask, NULL);
    outcome out;
    supervise(o, p, pid, &out);
    pthread_sigmask(SIG_BLOCK, &ss.handled, NULL);
    lost = out.lost;
    code = lost ? CLI_EXIT_LOST : exit_status_of(out.wstatus);

release:
    rc = p != NULL ? redsem_permit_release(p) : REDSEM_OK;
    if (!lost && rc == REDSEM_ELOST && code != CLI_EXIT_SOFTWARE && code != CLI_EXIT_OSERR) {
        cli_msg(o, "lease lost before %s finished: the release found the permit expired or "
                   "taken over",
                o->argv[0]);
        code = CLI_EXIT_LOST;
    } else if (!lost && rc != REDSEM_OK && rc != REDSEM_ELOST) {
        /* CMD's own status stands: it ran while the permit was held; the lease on the
         * server now expires by itself. */
        char what[96];
        snprintf(what, sizeof what, "release (the permit expires within %" PRId64 "ms)",
                 o->lease_ms);
        (void)cli_fail(o, what, rc, redsem_client_errmsg(s.client));
    }
    redsem_permit_free(p);
    free_env(env);
    code = finish(o, &s, code);
    for (int i = 0; i < 2; i++)
        if (wake_fd[i] >= 0)
            close(wake_fd[i]);
    pthread_sigmask(SIG_SETMASK, &ss.orig_mask, NULL);
    return code;
}
