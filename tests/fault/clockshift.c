/* LD_PRELOAD shim for redis-server in the fault suite's clock-jump scenario: adds an offset,
 * read from a shared file, to the wall clock (gettimeofday, time, clock_gettime with
 * CLOCK_REALTIME*), which Redis uses for TIME inside scripts and for key expiry. The file
 * (REDSEM_CLOCKSHIFT_FILE) holds one int64: the offset in microseconds; the test writes it to
 * make the server's clock jump forward or back while it runs. Not part of the library. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *shift;

static int64_t offset_us(void)
{
    if (shift == NULL) {
        const char *path = getenv("REDSEM_CLOCKSHIFT_FILE");
        int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        if (fd < 0)
            return 0;
        void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
            return 0;
        shift = p;
    }
    return *shift;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*real)(clockid_t, struct timespec *);
    if (real == NULL) {
        void *sym = dlsym(RTLD_NEXT, "clock_gettime");
        memcpy(&real, &sym, sizeof real); /* POSIX: dlsym's pointer is callable */
    }
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        int64_t us = (int64_t)ts->tv_sec * 1000000 + ts->tv_nsec / 1000 + offset_us();
        ts->tv_sec = us / 1000000;
        ts->tv_nsec = (us % 1000000) * 1000 + ts->tv_nsec % 1000;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz)
{
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    (void)tz;
    return rc;
}

time_t time(time_t *t)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
