/* fencing: Kleppmann's "process pause" scenario, and why the resource must check fencing
 * tokens (M. Kleppmann, "How to do distributed locking", 2016).
 *
 *   fencing [URL] [STORAGE-FILE]      (URL default: $REDSEM_URL or redis://127.0.0.1:6379)
 *
 * The resource is a file store that remembers the highest fencing token it has accepted and
 * rejects writes carrying a lower one (it checks and writes under flock(2), its own local
 * concurrency control). Then:
 *   1. client A takes the lock (lease 400 ms), checks that it is still valid, and is paused
 *      (SIGSTOP: think GC pause, swap, a stopped VM) just before writing;
 *   2. the lease expires; client B takes the lock, gets a higher token, and writes: accepted;
 *   3. A is resumed (SIGCONT) and writes with its old token, believing it holds the lock:
 *      the store REJECTS it. A's validity check before the pause could not have saved it;
 *      redsem_permit_held() says false the moment A runs again, and its refresh says lost.
 * Exit status 0 when the stale write was rejected and B's write survived. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <redsem/redsem.h>

/* ---- the fenced resource: "highest-token data" in one file, updated under flock ---- */

static int store_write(const char *path, uint64_t token, const char *data)
{
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0)
        return -1;
    flock(fd, LOCK_EX);
    char buf[256] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    uint64_t highest = n > 0 ? strtoull(buf, NULL, 10) : 0;
    int accepted = token >= highest;
    if (accepted) {
        char line[256];
        int len = snprintf(line, sizeof line, "%" PRIu64 " %s\n", token, data);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
            accepted = -1;
    }
    flock(fd, LOCK_UN);
    close(fd);
    return accepted;
}

static int die(const char *who, redsem_client *c, int rc)
{
    fprintf(stderr, "fencing: %s: %s: %s\n", who, redsem_strerror(rc),
            c ? redsem_client_errmsg(c) : "");
    return 2;
}

static int client_a(const char *url, const char *name, const char *store, int ready_fd)
{
    redsem_client *c = NULL;
    redsem_lock *l = NULL;
    redsem_permit *p = NULL;
    int rc = redsem_client_connect(url, &c);
    if (rc)
        return die("A connect", c, rc);
    if ((rc = redsem_lock_open(c, name, 400, &l)) || (rc = redsem_lock_acquire(l, 5000, &p)))
        return die("A acquire", c, rc);
    printf("A: acquired, token %" PRIu64 ", valid for %" PRId64 " ms\n", redsem_permit_token(p),
           redsem_permit_validity_ms(p));
    if (!redsem_permit_held(p))
        return 2;
    printf("A: still valid, about to write... (pausing)\n");
    fflush(stdout);
    if (write(ready_fd, "x", 1) != 1)
        return 2;
    raise(SIGSTOP); /* the pause: between the validity check and the write */
    printf("A: resumed; held() now says %s; writing with token %" PRIu64 "\n",
           redsem_permit_held(p) ? "true" : "false", redsem_permit_token(p));
    int w = store_write(store, redsem_permit_token(p), "written-by-A");
    printf("A: the store %s the write\n", w == 1 ? "ACCEPTED" : "REJECTED");
    rc = redsem_permit_refresh(p);
    printf("A: refresh says %s\n", redsem_err_name(rc));
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_client_free(c);
    return w == 1 ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : getenv("REDSEM_URL");
    char store[256];
    if (argc > 2) {
        snprintf(store, sizeof store, "%s", argv[2]);
    } else {
        snprintf(store, sizeof store, "/tmp/redsem-fencing-XXXXXX");
        int fd = mkstemp(store);
        if (fd < 0)
            return 2;
        close(fd);
    }
    unlink(store);
    char name[64];
    snprintf(name, sizeof name, "fencing-demo-%ld", (long)getpid());
    setvbuf(stdout, NULL, _IOLBF, 0);

    int pipefd[2];
    if (pipe(pipefd) != 0)
        return 2;
    pid_t a = fork();
    if (a < 0)
        return 2;
    if (a == 0) {
        close(pipefd[0]);
        _exit(client_a(url, name, store, pipefd[1]));
    }
    close(pipefd[1]);
    char b;
    if (read(pipefd[0], &b, 1) != 1) {
        fprintf(stderr, "fencing: client A failed before pausing\n");
        return 2;
    }
    int st;
    waitpid(a, &st, WUNTRACED); /* A is stopped now */

    redsem_client *c = NULL;
    redsem_lock *l = NULL;
    redsem_permit *p = NULL;
    int rc = redsem_client_connect(url, &c);
    if (rc)
        return die("B connect", c, rc);
    if ((rc = redsem_lock_open(c, name, 400, &l)) || (rc = redsem_lock_acquire(l, 5000, &p)))
        return die("B acquire", c, rc);
    printf("B: acquired after A's lease expired, token %" PRIu64 "\n", redsem_permit_token(p));
    int w = store_write(store, redsem_permit_token(p), "written-by-B");
    printf("B: the store %s the write\n", w == 1 ? "ACCEPTED" : "REJECTED");
    redsem_permit_release(p);

    kill(a, SIGCONT);
    waitpid(a, &st, 0);
    int a_rejected = WIFEXITED(st) && WEXITSTATUS(st) == 0;

    char buf[256] = "";
    FILE *f = fopen(store, "r");
    if (f && fgets(buf, sizeof buf, f) == NULL)
        buf[0] = '\0';
    if (f)
        fclose(f);
    unlink(store);
    printf("store now holds: %s", buf);
    int ok = w == 1 && a_rejected && strstr(buf, "written-by-B") != NULL;
    printf("%s\n", ok ? "OK: the stale write was fenced off"
                      : "FAILED: the stale write got through");
    redsem_permit_free(p);
    redsem_lock_free(l);
    redsem_client_free(c);
    return ok ? 0 : 1;
}
