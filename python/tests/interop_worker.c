/* interop-worker: the C side of the Python binding's interoperation test.
 *
 *   interop-worker URL NAME LIMIT WITNESS ROUNDS HOLD_US
 *
 * ROUNDS times: acquire a permit of the fair semaphore NAME (limit LIMIT, lease 10 s, wait
 * up to 120 s), enter the witness (witness.py's file: "cur max" under flock), hold HOLD_US
 * microseconds, leave the witness, release. The witness lives outside Redis: the Python
 * process and `redsem run` count themselves in the same file. Exit 0; 1 on a library
 * error (printed); 2 on a usage error. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

#include <redsem/redsem.h>

static int witness(const char *path, int delta)
{
    int fd = open(path, O_RDWR);
    if (fd < 0 || flock(fd, LOCK_EX) != 0)
        return -1;
    char buf[64] = {0};
    long cur = 0, max = 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0)
        sscanf(buf, "%ld %ld", &cur, &max);
    cur += delta;
    if (cur > max)
        max = cur;
    int len = snprintf(buf, sizeof buf, "%ld %ld\n", cur, max);
    int rc = ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)len, 0) == len ? 0 : -1;
    close(fd); /* drops the lock */
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: interop-worker URL NAME LIMIT WITNESS ROUNDS HOLD_US\n");
        return 2;
    }
    const char *url = argv[1], *name = argv[2], *wfile = argv[4];
    long limit = atol(argv[3]), rounds = atol(argv[5]), hold_us = atol(argv[6]);
    redsem_client *c;
    redsem_sem *sem;
    int rc = redsem_client_connect(url, &c);
    if (rc != REDSEM_OK)
        return fprintf(stderr, "connect: %s\n", redsem_strerror(rc)), 1;
    rc = redsem_sem_open(c, name, REDSEM_STRATEGY_FAIR, (uint32_t)limit, 10000, &sem);
    for (long i = 0; rc == REDSEM_OK && i < rounds; i++) {
        redsem_permit *p;
        rc = redsem_sem_acquire(sem, 120000, &p);
        if (rc != REDSEM_OK)
            break;
        if (witness(wfile, +1) != 0 || (usleep((useconds_t)hold_us), witness(wfile, -1)) != 0)
            rc = REDSEM_EINVAL;
        int rrc = redsem_permit_release(p);
        if (rc == REDSEM_OK)
            rc = rrc;
        redsem_permit_free(p);
    }
    if (rc != REDSEM_OK)
        fprintf(stderr, "interop-worker: %s: %s\n", redsem_err_name(rc), redsem_client_errmsg(c));
    redsem_sem_free(sem);
    redsem_client_free(c);
    return rc == REDSEM_OK ? 0 : 1;
}
