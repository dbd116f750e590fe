/* Fault suite: kinds, clocks and the shared-memory witnesses. See fault.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"

static const char *const kind_names[] = {"?", "basic", "fair", "locked", "lock"};

const char *fw_kind_name(fw_kind k)
{
    return k >= FW_BASIC && k <= FW_LOCK ? kind_names[k] : "?";
}

int fw_kind_parse(const char *s, fw_kind *out)
{
    for (int k = FW_BASIC; k <= FW_LOCK; k++) {
        if (strcmp(s, kind_names[k]) == 0) {
            *out = (fw_kind)k;
            return 0;
        }
    }
    return -1;
}

int64_t fw_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void fw_sleep_ns(int64_t ns)
{
    if (ns > 0)
        fw_sleep_until_ns(fw_now_ns() + ns);
}

void fw_sleep_until_ns(int64_t t)
{
    struct timespec ts = {.tv_sec = t / 1000000000LL, .tv_nsec = t % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ------------------------------------------------------------------ shared area */

static fw_shared *map_fd(int fd)
{
    void *p = mmap(NULL, sizeof(fw_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

fw_shared *fw_shared_create(const char *path, uint32_t limit)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, sizeof(fw_shared)) != 0) {
        close(fd);
        return NULL;
    }
    fw_shared *sh = map_fd(fd);
    if (sh != NULL) {
        memset(sh, 0, sizeof *sh);
        sh->limit = limit;
    }
    return sh;
}

fw_shared *fw_shared_open(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    return fd < 0 ? NULL : map_fd(fd);
}

void fw_shared_unmap(fw_shared *sh)
{
    if (sh != NULL)
        munmap(sh, sizeof *sh);
}

int fw_live_occupants(fw_shared *sh, int except, int64_t now)
{
    int n = 0;
    for (int i = 0; i < FW_MAX_SLOTS; i++)
        if (i != except && atomic_load(&sh->slot[i].active) &&
            atomic_load(&sh->slot[i].deadline_ns) > now)
            n++;
    return n;
}

int fw_witness_enter(fw_shared *sh, int slot, uint64_t token, int64_t deadline_ns)
{
    fw_slot *s = &sh->slot[slot];
    atomic_store(&s->token, token);
    atomic_store(&s->deadline_ns, deadline_ns);
    atomic_store(&s->wrote, 0);
    atomic_store(&s->enter_ns, fw_now_ns());
    atomic_store(&s->active, 1);
    int n = atomic_fetch_add(&sh->occupancy, 1) + 1;
    atomic_fetch_add(&sh->acquisitions, 1);
    int m = atomic_load(&sh->max_occupancy);
    while (n > m && !atomic_compare_exchange_weak(&sh->max_occupancy, &m, n))
        ;
    int64_t now = fw_now_ns();
    if ((uint32_t)n >= sh->limit) {
        int64_t zero = 0;
        atomic_compare_exchange_strong(&sh->first_full_ns, &zero, now);
    }
    if ((uint32_t)n <= sh->limit)
        return 0;
    /* Above the limit: is it real, or is a holder past its validity still counted (paused)? */
    int live = 1 + fw_live_occupants(sh, slot, now);
    if ((uint32_t)live <= sh->limit) {
        atomic_fetch_add(&sh->nstale, 1);
        return 0;
    }
    int k = atomic_fetch_add(&sh->nviol, 1);
    if (k < FW_MAX_VIOL) {
        fw_violation *v = &sh->viol[k];
        v->t_ns = now;
        v->slot = slot;
        v->token = token;
        v->live = live;
        v->nothers = 0;
        for (int i = 0; i < FW_MAX_SLOTS && v->nothers < 8; i++) {
            if (i != slot && atomic_load(&sh->slot[i].active) &&
                atomic_load(&sh->slot[i].deadline_ns) > now) {
                v->others[v->nothers] = i;
                v->other_tokens[v->nothers] = atomic_load(&sh->slot[i].token);
                v->nothers++;
            }
        }
    }
    return 1;
}

void fw_witness_leave(fw_shared *sh, int slot)
{
    atomic_store(&sh->slot[slot].active, 0);
    atomic_fetch_sub(&sh->occupancy, 1);
}

int fw_witness_reap(fw_shared *sh, int slot)
{
    int was = 1;
    if (atomic_compare_exchange_strong(&sh->slot[slot].active, &was, 0)) {
        atomic_fetch_sub(&sh->occupancy, 1);
        return 1;
    }
    return 0;
}

int fw_fence_write(fw_shared *sh, uint64_t token, bool held)
{
    uint64_t cur = atomic_load(&sh->fence_highest);
    for (;;) {
        if (token < cur) {
            atomic_fetch_add(&sh->fence_rejected, 1);
            if (!held)
                atomic_fetch_add(&sh->fence_stale_rejected, 1);
            return 0;
        }
        if (atomic_compare_exchange_weak(&sh->fence_highest, &cur, token))
            break;
    }
    atomic_fetch_add(&sh->fence_accepted, 1);
    if (!held)
        atomic_fetch_add(&sh->fence_stale_accepted, 1);
    return 1;
}
