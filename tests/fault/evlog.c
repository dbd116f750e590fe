/* Fault suite: per-process event logs. One text line per event:
 *   <t_ns> <slot> <EVENT> <id|-> <token> <rc> <a> <b>
 * written with one write(2) on an O_APPEND descriptor, so a SIGKILL loses nothing that was
 * logged and lines of one file never interleave. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fault.h"

static const char *const names[EV__COUNT] = {
    [EV_START] = "START", [EV_REQ] = "REQ",   [EV_ACQ] = "ACQ",   [EV_UNK] = "UNK",
    [EV_BUSY] = "BUSY",   [EV_ERR] = "ERR",   [EV_CHK] = "CHK",   [EV_LOST] = "LOST",
    [EV_FWR] = "FWR",     [EV_END] = "END",   [EV_RFR] = "RFR",   [EV_REL] = "REL",
    [EV_EXIT] = "EXIT",   [EV_KILL] = "KILL", [EV_STOP] = "STOP", [EV_CONT] = "CONT",
    [EV_FAULT] = "FAULT", [EV_NOTE] = "NOTE", [EV_DL] = "DL", [EV_STATS] = "STATS",
};

const char *ev_name(int ev)
{
    return ev > 0 && ev < EV__COUNT && names[ev] ? names[ev] : "?";
}

static int ev_parse(const char *s)
{
    for (int i = 1; i < EV__COUNT; i++)
        if (names[i] && strcmp(names[i], s) == 0)
            return i;
    return 0;
}

int fw_log_open(fw_log *l, const char *path, int slot)
{
    l->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    l->slot = slot;
    return l->fd < 0 ? -1 : 0;
}

void fw_log_close(fw_log *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

void fw_emit(fw_log *l, int ev, const char *id, uint64_t token, int rc, int64_t a, int64_t b)
{
    char line[256];
    char clean[64];
    size_t j = 0;
    for (const char *p = id ? id : "-"; *p && j < sizeof clean - 1; p++)
        clean[j++] = (*p > 0x20 && *p < 0x7f) ? *p : '_';
    clean[j] = '\0';
    if (j == 0)
        snprintf(clean, sizeof clean, "-");
    int n = snprintf(line, sizeof line, "%lld %d %s %s %llu %d %lld %lld\n",
                     (long long)fw_now_ns(), l->slot, ev_name(ev), clean,
                     (unsigned long long)token, rc, (long long)a, (long long)b);
    if (n > 0 && l->fd >= 0)
        (void)!write(l->fd, line, (size_t)n);
}

static int cmp_ev(const void *x, const void *y)
{
    const fw_event *a = x, *b = y;
    if (a->t_ns != b->t_ns)
        return a->t_ns < b->t_ns ? -1 : 1;
    return a->slot - b->slot;
}

static int read_file(const char *path, fw_event **v, size_t *n, size_t *cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        fw_event e;
        char evs[16];
        long long t, a, b;
        unsigned long long tok;
        memset(&e, 0, sizeof e);
        if (sscanf(line, "%lld %d %15s %63s %llu %d %lld %lld", &t, &e.slot, evs, e.id, &tok,
                   &e.rc, &a, &b) != 8)
            continue;
        e.t_ns = t;
        e.token = tok;
        e.a = a;
        e.b = b;
        e.ev = ev_parse(evs);
        if (e.ev == 0)
            continue;
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 4096;
            fw_event *nv = realloc(*v, *cap * sizeof *nv);
            if (nv == NULL) {
                fclose(f);
                return -1;
            }
            *v = nv;
        }
        (*v)[(*n)++] = e;
    }
    fclose(f);
    return 0;
}

ssize_t fw_log_read_file(const char *path, fw_event **out)
{
    fw_event *v = NULL;
    size_t n = 0, cap = 0;
    if (read_file(path, &v, &n, &cap) != 0) {
        free(v);
        return -1;
    }
    *out = v;
    return (ssize_t)n;
}

ssize_t fw_logs_read(const char *dir, fw_event **out)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    size_t n = 0, cap = 0;
    fw_event *v = NULL;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".log") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (read_file(path, &v, &n, &cap) != 0 && errno != ENOENT) {
            closedir(d);
            free(v);
            return -1;
        }
    }
    closedir(d);
    if (n > 1)
        qsort(v, n, sizeof *v, cmp_ev);
    *out = v;
    return (ssize_t)n;
}
