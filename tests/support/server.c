/* Test support: private redis-server instances. See server.h. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

const char *ts_redis_server_path(void)
{
    const char *env = getenv("REDSEM_REDIS_SERVER");
    if (env && *env)
        return access(env, X_OK) == 0 ? env : NULL;
    static const char *const cands[] = {"/usr/bin/redis-server", "/usr/local/bin/redis-server",
                                        "/usr/sbin/redis-server"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++)
        if (access(cands[i], X_OK) == 0)
            return cands[i];
    return NULL;
}

int ts_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static int spawn(ts_server *s)
{
    const char *bin = ts_redis_server_path();
    if (bin == NULL)
        return 77;
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", s->port);
    const char *argv[80];
    int n = 0;
    argv[n++] = bin;
    if (s->conf[0] != '\0') {
        argv[n++] = s->conf;
        argv[n++] = "--sentinel";
    }
    argv[n++] = "--port";
    argv[n++] = portbuf;
    argv[n++] = "--bind";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--unixsocket";
    argv[n++] = s->sock;
    argv[n++] = "--unixsocketperm";
    argv[n++] = "700";
    argv[n++] = "--save";
    argv[n++] = "";
    argv[n++] = "--appendonly";
    argv[n++] = "no";
    argv[n++] = "--daemonize";
    argv[n++] = "no";
    argv[n++] = "--dir";
    argv[n++] = s->dir;
    argv[n++] = "--logfile";
    argv[n++] = s->log;
    argv[n++] = "--enable-debug-command";
    argv[n++] = "local";
    for (int i = 0; i < s->nextra && n < 78; i++)
        argv[n++] = s->extra[i];
    argv[n] = NULL;
    unlink(s->sock);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (s->cpu >= 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(s->cpu, &set);
            (void)sched_setaffinity(0, sizeof set, &set);
        }
        /* A test that fails half-way never stops its server: let the server die with the
         * thread that started it, and keep it off the test runner's stdout/stderr pipes. */
        pid_t parent = getppid();
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull >= 0) {
            dup2(devnull, 0);
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    if (ts_wait_ready(s, 10000) != 0) {
        fprintf(stderr, "redis-server did not become ready; log %s:\n", s->log);
        FILE *f = fopen(s->log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            fputs(line, stderr);
        if (f)
            fclose(f);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        s->pid = 0;
        return -1;
    }
    return 0;
}

int ts_server_start(ts_server *s, const char *const *extra, bool tcp)
{
    return ts_server_start_pinned(s, extra, tcp, -1);
}

/* A fresh s with its private dir (TMPDIR/redsem-KIND-XXXXXX), socket, URL and log paths.
 * 0, 77 without redis-server, -1 on failure. */
static int prepare(ts_server *s, const char *kind, int cpu)
{
    memset(s, 0, sizeof *s);
    s->cpu = cpu;
    if (ts_redis_server_path() == NULL)
        return 77;
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof s->dir, "%s/redsem-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", kind);
    if (mkdtemp(s->dir) == NULL) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(s->sock, sizeof s->sock, "%s/redis.sock", s->dir);
    snprintf(s->url, sizeof s->url, "unix://%s", s->sock);
    snprintf(s->log, sizeof s->log, "%s/redis.log", s->dir);
    return 0;
}

int ts_server_start_pinned(ts_server *s, const char *const *extra, bool tcp, int cpu)
{
    int rc = prepare(s, "test", cpu);
    if (rc != 0)
        return rc;
    for (int i = 0; extra && extra[i] && i < 32; i++)
        s->extra[s->nextra++] = extra[i];
    for (int attempt = 0; attempt < 5; attempt++) {
        s->port = tcp ? ts_free_port() : 0;
        rc = spawn(s);
        if (rc != -1 || !tcp)
            return rc;
    }
    return -1;
}

int ts_sentinel_start(ts_server *s, const char *master_name, int primary_port, int quorum,
                      int down_after_ms, int failover_timeout_ms)
{
    int rc = prepare(s, "sentinel", -1);
    if (rc != 0)
        return rc;
    snprintf(s->conf, sizeof s->conf, "%s/sentinel.conf", s->dir);
    FILE *f = fopen(s->conf, "w");
    if (f == NULL) {
        perror(s->conf);
        return -1;
    }
    fprintf(f, "sentinel monitor %s 127.0.0.1 %d %d\n", master_name, primary_port, quorum);
    fprintf(f, "sentinel down-after-milliseconds %s %d\n", master_name, down_after_ms);
    fprintf(f, "sentinel failover-timeout %s %d\n", master_name, failover_timeout_ms);
    fprintf(f, "sentinel parallel-syncs %s 1\n", master_name);
    fclose(f);
    for (int attempt = 0; attempt < 5; attempt++) {
        s->port = ts_free_port();
        rc = spawn(s);
        if (rc != -1)
            return rc;
    }
    return -1;
}

int ts_server_restart(ts_server *s)
{
    return spawn(s);
}

void ts_server_kill(ts_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGCONT);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}

void ts_server_pause(ts_server *s, bool pause)
{
    if (s->pid > 0)
        kill(s->pid, pause ? SIGSTOP : SIGCONT);
}

static void rm_dir(const char *dir)
{
    static const char *const files[] = {"redis.sock", "redis.log", "dump.rdb",
                                        "appendonly.aof", "users.acl"};
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    if (strstr(dir, "/redsem-test-") != NULL || strstr(dir, "/redsem-sentinel-") != NULL)
        (void)system(path);
}

void ts_server_stop(ts_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGCONT);
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 500; i++) {
            if (waitpid(s->pid, NULL, WNOHANG) == s->pid) {
                s->pid = 0;
                break;
            }
            usleep(10000);
        }
        if (s->pid > 0)
            ts_server_kill(s);
    }
    if (s->dir[0])
        rm_dir(s->dir);
    s->dir[0] = '\0';
}

int ts_wait_ready(const ts_server *s, int ms)
{
    for (int waited = 0; waited < ms; waited += 10) {
        if (s->pid > 0 && waitpid(s->pid, NULL, WNOHANG) == s->pid)
            return -1;
        struct timeval tv = {1, 0};
        redisContext *c = redisConnectUnixWithTimeout(s->sock, tv);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            bool ok = r && (r->type == REDIS_REPLY_STATUS ||
                            (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0));
            if (r)
                freeReplyObject(r);
            redisFree(c);
            if (ok)
                return 0;
        } else if (c) {
            redisFree(c);
        }
        usleep(10000);
    }
    return -1;
}

int ts_command(const ts_server *s, char *out, size_t outlen, const char *cmd, ...)
{
    const char *argv[64];
    size_t lens[64];
    int n = 0;
    va_list ap;
    va_start(ap, cmd);
    for (const char *a = cmd; a != NULL && n < 64; a = va_arg(ap, const char *)) {
        argv[n] = a;
        lens[n] = strlen(a);
        n++;
    }
    va_end(ap);
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectUnixWithTimeout(s->sock, tv);
    if (c == NULL || c->err) {
        if (out && outlen)
            snprintf(out, outlen, "connect: %s", c ? c->errstr : "oom");
        if (c)
            redisFree(c);
        return -1;
    }
    redisReply *r = redisCommandArgv(c, n, argv, lens);
    int rc = -1;
    if (r != NULL) {
        rc = r->type == REDIS_REPLY_ERROR ? -1 : 0;
        if (out && outlen) {
            if (r->type == REDIS_REPLY_INTEGER)
                snprintf(out, outlen, "%lld", r->integer);
            else if (r->str)
                snprintf(out, outlen, "%.*s", (int)r->len, r->str);
            else if (r->type == REDIS_REPLY_ARRAY)
                snprintf(out, outlen, "array:%zu", r->elements);
            else
                snprintf(out, outlen, "nil");
        }
        freeReplyObject(r);
    }
    redisFree(c);
    return rc;
}
