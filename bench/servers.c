/* redsem-bench: the private servers it starts (the main one, and those of the tls, sync
 * and spread workloads) and their temporary directories, stopped and removed at exit and on
 * SIGINT, SIGTERM and SIGHUP (bench.h, "more private servers"). */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "server.h"

static ts_server *main_server; /* bench_servers_init()'s */
static pid_t main_pid;

/* The private servers the tls and sync workloads start, and their temporary directories. */
#define MAX_TRACKED 8
static ts_server *volatile tracked[MAX_TRACKED];
static struct {
    char dir[256];
    const char *const *files;
    volatile int on;
} tracked_dirs[MAX_TRACKED];
static cpu_set_t start_mask; /* the CPUs allowed at the start, before the bench pinned itself */
static bool have_start_mask;

int bench_server_start(const char *const *extra, bool tcp, int cpu, ts_server *s)
{
    int slot = 0;
    while (slot < MAX_TRACKED && tracked[slot] != NULL)
        slot++;
    if (slot == MAX_TRACKED)
        bench_die("too many private servers");
    /* the child inherits this thread's affinity: for "any CPU", the one the bench started
     * with, not the CPU it pinned itself to */
    cpu_set_t cur;
    bool restore = cpu < 0 && have_start_mask && sched_getaffinity(0, sizeof cur, &cur) == 0 &&
                   sched_setaffinity(0, sizeof start_mask, &start_mask) == 0;
    int rc = ts_server_start_pinned(s, extra, tcp, cpu);
    if (restore)
        (void)sched_setaffinity(0, sizeof cur, &cur);
    if (rc == 0)
        tracked[slot] = s;
    return rc;
}

void bench_server_stop(ts_server *s)
{
    for (int i = 0; i < MAX_TRACKED; i++)
        if (tracked[i] == s)
            tracked[i] = NULL;
    ts_server_stop(s);
}

void bench_tempdir_track(const char *dir, const char *const *files)
{
    for (int i = 0; i < MAX_TRACKED; i++) {
        if (!tracked_dirs[i].on) {
            snprintf(tracked_dirs[i].dir, sizeof tracked_dirs[i].dir, "%s", dir);
            tracked_dirs[i].files = files;
            tracked_dirs[i].on = 1;
            return;
        }
    }
    bench_die("too many temporary directories");
}

/* async-signal-safe */
static void remove_dir(int i)
{
    char path[512];
    for (const char *const *f = tracked_dirs[i].files; f && *f; f++) {
        size_t n = strlen(tracked_dirs[i].dir), m = strlen(*f);
        if (n + 1 + m < sizeof path) {
            memcpy(path, tracked_dirs[i].dir, n);
            path[n] = '/';
            memcpy(path + n + 1, *f, m + 1);
            unlink(path);
        }
    }
    rmdir(tracked_dirs[i].dir);
    tracked_dirs[i].on = 0;
}

void bench_tempdir_remove(const char *dir)
{
    for (int i = 0; i < MAX_TRACKED; i++)
        if (tracked_dirs[i].on && strcmp(tracked_dirs[i].dir, dir) == 0)
            remove_dir(i);
}

/* Every tracked server through stop (bench_server_stop, or kill_server in a signal handler),
 * then every tracked directory removed. */
static void end_tracked(void (*stop)(ts_server *))
{
    for (int i = 0; i < MAX_TRACKED; i++)
        if (tracked[i] != NULL)
            stop(tracked[i]);
    for (int i = 0; i < MAX_TRACKED; i++)
        if (tracked_dirs[i].on)
            remove_dir(i);
}

static void stop_server(void)
{
    if (getpid() != main_pid)
        return;
    end_tracked(bench_server_stop);
    if (main_server != NULL && main_server->pid > 0)
        ts_server_stop(main_server);
}

/* async-signal-safe: stop a private server, remove its files */
static void kill_server(ts_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGCONT);
        kill(s->pid, SIGTERM);
        unlink(s->sock);
        unlink(s->log);
        rmdir(s->dir);
    }
}

static void on_signal(int sig)
{
    /* async-signal-safe subset: stop the private servers, remove their files, leave */
    if (main_server != NULL)
        kill_server(main_server);
    end_tracked(kill_server);
    _exit(128 + sig);
}

void bench_servers_init(ts_server *main)
{
    main_server = main;
    main_pid = getpid();
    have_start_mask = sched_getaffinity(0, sizeof start_mask, &start_mask) == 0;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    atexit(stop_server);
}
