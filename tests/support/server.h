/* Test support: private, throwaway redis-server instances (unix socket in a 0700 temp dir,
 * no TCP unless asked, no persistence unless asked). Used by the tests, the fault suite and
 * the bench. Not part of the library. */
#ifndef REDSEM_TEST_SERVER_H
#define REDSEM_TEST_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct ts_server {
    pid_t pid;
    char dir[256];   /* private temp dir */
    char sock[320];  /* DIR/redis.sock */
    char url[400];   /* unix://DIR/redis.sock */
    char log[320];   /* DIR/redis.log */
    int port;        /* TCP port, 0 if none */
    const char *extra[32];
    int nextra;
    int cpu;         /* pin to this CPU (-1: no pinning) */
    char conf[320];  /* a Sentinel: its config file (Sentinel rewrites it); "" otherwise */
} ts_server;

/* Path of the redis-server binary (REDSEM_REDIS_SERVER or "redis-server" on PATH), or NULL. */
const char *ts_redis_server_path(void);

/* Start a server; it is killed if the thread that started it exits. extra: NULL-terminated extra arguments ("--maxmemory", "1mb", ...), copied
 * pointers must stay valid for restarts. tcp: also listen on a free loopback port.
 * Returns 0, 77 if redis-server is not installed, -1 on failure (message on stderr). */
int ts_server_start(ts_server *s, const char *const *extra, bool tcp);
/* Same, with the server pinned to one CPU (cpu < 0: not pinned). */
int ts_server_start_pinned(ts_server *s, const char *const *extra, bool tcp, int cpu);
/* Start a Sentinel (redis-server CONF --sentinel) on a free loopback port and its own unix
 * socket, monitoring the primary 127.0.0.1:primary_port as master_name with the given quorum
 * and timings. Returns as ts_server_start. */
int ts_sentinel_start(ts_server *s, const char *master_name, int primary_port, int quorum,
                      int down_after_ms, int failover_timeout_ms);
/* Start again with the same socket, port, dir and arguments (after kill/stop_keep). */
int ts_server_restart(ts_server *s);
/* SIGKILL (no cleanup of the dir), for restart tests. */
void ts_server_kill(ts_server *s);
/* SIGSTOP / SIGCONT the server. */
void ts_server_pause(ts_server *s, bool pause);
/* SIGTERM, wait, remove the dir. Safe to call twice. */
void ts_server_stop(ts_server *s);
/* Send one command (argv style) on a fresh connection; returns 0 if the reply is not an
 * error. reply_out (may be NULL) receives the reply as a string (integer/status/bulk/error). */
int ts_command(const ts_server *s, char *reply_out, size_t reply_len, const char *cmd, ...);
/* A loopback TCP port that was free a moment ago (for --tls-port and the like), or -1. */
int ts_free_port(void);
/* Wait until the server answers PING (up to ms). 0 ok. */
int ts_wait_ready(const ts_server *s, int ms);

#endif
