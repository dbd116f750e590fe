/* Fault suite: the checker over the recorded histories.
 *
 * A holder interval starts when acquire returned and ends at the earliest of: leaving the
 * critical section (END, logged before release is sent), learning the lease was lost (LOST),
 * the runner's SIGKILL of the worker (KILL), and the validity deadline (the latest one the
 * worker logged: ACQ, DL, CHK, END). An acquire with an unknown outcome (UNK) counts as
 * maybe-held from the start of the call until its return + lease + drift. The sweep line
 * over the definite intervals must never exceed the limit; the maximum with maybe-held
 * intervals is reported. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"

typedef struct open_iv {
    bool open;
    fw_interval iv;
    int64_t deadline_ns;
    int64_t end_ns; /* 0: not ended yet */
    const char *why;
} open_iv;

static void close_iv(open_iv *o, fw_interval **v, size_t *n, size_t *cap, int64_t at,
                     const char *why)
{
    if (!o->open)
        return;
    int64_t end = o->end_ns ? o->end_ns : at;
    const char *w = o->end_ns ? o->why : why;
    if (o->deadline_ns > 0 && o->deadline_ns < end) {
        end = o->deadline_ns;
        w = "deadline";
    }
    if (end < o->iv.start_ns)
        end = o->iv.start_ns;
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 1024;
        *v = realloc(*v, *cap * sizeof **v);
    }
    o->iv.end_ns = end;
    o->iv.why_end = w;
    (*v)[(*n)++] = o->iv;
    o->open = false;
}

ssize_t fw_intervals(const fw_event *ev, size_t n, const fw_check_params *p, fw_interval **out)
{
    open_iv cur[FW_MAX_SLOTS];
    memset(cur, 0, sizeof cur);
    fw_interval *v = NULL;
    size_t nv = 0, cap = 0;
    int64_t maybe_extra = (p->lease_ms + p->drift_ms) * 1000000LL;
    for (size_t i = 0; i < n; i++) {
        const fw_event *e = &ev[i];
        int s = e->slot;
        if (e->ev == EV_KILL || e->ev == EV_STOP || e->ev == EV_CONT)
            s = (int)e->a;
        if (s < 0 || s >= FW_MAX_SLOTS)
            continue;
        open_iv *o = &cur[s];
        switch (e->ev) {
        case EV_ACQ:
            close_iv(o, &v, &nv, &cap, e->t_ns, "reacquired");
            memset(o, 0, sizeof *o);
            o->open = true;
            o->iv.slot = s;
            snprintf(o->iv.id, sizeof o->iv.id, "%s", e->id);
            o->iv.token = e->token;
            o->iv.start_ns = e->t_ns;
            o->deadline_ns = e->a;
            break;
        case EV_DL:
            if (o->open && e->a > o->deadline_ns && !o->end_ns)
                o->deadline_ns = e->a;
            break;
        case EV_CHK:
            if (o->open && !o->end_ns)
                o->deadline_ns = e->b;
            break;
        case EV_LOST:
            if (o->open && !o->end_ns) {
                o->end_ns = e->t_ns;
                o->why = "lost";
            }
            break;
        case EV_END:
            if (o->open) {
                if (!o->end_ns) {
                    o->end_ns = e->t_ns;
                    o->why = "release";
                }
                close_iv(o, &v, &nv, &cap, e->t_ns, "release");
            }
            break;
        case EV_KILL:
            close_iv(o, &v, &nv, &cap, e->t_ns, "kill");
            break;
        case EV_UNK: {
            if (nv == cap) {
                cap = cap ? cap * 2 : 1024;
                v = realloc(v, cap * sizeof *v);
            }
            fw_interval iv = {.slot = s, .start_ns = e->a, .end_ns = e->t_ns + maybe_extra,
                              .maybe = true, .why_end = "maybe"};
            snprintf(iv.id, sizeof iv.id, "%s", e->id);
            v[nv++] = iv;
            break;
        }
        default:
            break;
        }
    }
    for (int s = 0; s < FW_MAX_SLOTS; s++)
        close_iv(&cur[s], &v, &nv, &cap, INT64_MAX, "deadline");
    *out = v;
    return (ssize_t)nv;
}

typedef struct edge {
    int64_t t;
    int delta; /* +1 start, -1 end */
    bool maybe;
    size_t iv;
} edge;

static int cmp_edge(const void *x, const void *y)
{
    const edge *a = x, *b = y;
    if (a->t != b->t)
        return a->t < b->t ? -1 : 1;
    return a->delta - b->delta; /* ends first: intervals are half-open */
}

void fw_check(const fw_event *ev, size_t n, const fw_check_params *p, fw_check_result *r)
{
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < n; i++) {
        const fw_event *e = &ev[i];
        switch (e->ev) {
        case EV_ACQ: r->acq++; break;
        case EV_BUSY: r->busy++; break;
        case EV_UNK: r->unknown++; break;
        case EV_ERR:
            r->errors++;
            if (-e->rc >= 0 && -e->rc < 32)
                r->errors_by_code[-e->rc]++;
            break;
        case EV_LOST: r->lost++; break;
        case EV_KILL: r->kills++; break;
        case EV_REL:
            if (e->rc == REDSEM_OK)
                r->rel_ok++;
            else if (e->rc == REDSEM_ELOST)
                r->rel_lost++;
            else
                r->rel_err++;
            break;
        case EV_FWR:
            if (e->a == 1 && e->b == 0)
                r->stale_accepted++;
            break;
        default: break;
        }
    }
    fw_interval *iv = NULL;
    ssize_t ni = fw_intervals(ev, n, p, &iv);
    if (ni <= 0) {
        free(iv);
        return;
    }
    edge *e = malloc(2 * (size_t)ni * sizeof *e);
    size_t ne = 0;
    for (ssize_t i = 0; i < ni; i++) {
        if (iv[i].maybe)
            r->maybe++;
        else
            r->intervals++;
        if (iv[i].end_ns <= iv[i].start_ns)
            continue;
        e[ne++] = (edge){iv[i].start_ns, +1, iv[i].maybe, (size_t)i};
        e[ne++] = (edge){iv[i].end_ns, -1, iv[i].maybe, (size_t)i};
    }
    qsort(e, ne, sizeof *e, cmp_edge);
    int def = 0, all = 0;
    int64_t above_since = 0;
    /* the definite intervals open now, to name the two of the first violation */
    size_t *openv = calloc((size_t)ni, sizeof *openv);
    size_t nopen = 0;
    for (size_t i = 0; i < ne; i++) {
        all += e[i].delta;
        if (e[i].maybe)
            goto next;
        def += e[i].delta;
        if (e[i].delta > 0) {
            openv[nopen++] = e[i].iv;
        } else {
            for (size_t k = 0; k < nopen; k++)
                if (openv[k] == e[i].iv) {
                    openv[k] = openv[--nopen];
                    break;
                }
        }
        if (e[i].delta > 0 && (uint32_t)def > p->limit) {
            if (r->violations == 0 && nopen >= 2) {
                r->viol_a = iv[openv[0]];
                r->viol_b = iv[e[i].iv];
            }
            r->violations++;
            if (!above_since)
                above_since = e[i].t;
        }
        if ((uint32_t)def <= p->limit && above_since) {
            r->violation_ns += e[i].t - above_since;
            above_since = 0;
        }
    next:
        if (def > r->max_definite)
            r->max_definite = def;
        if (all > r->max_with_maybe)
            r->max_with_maybe = all;
    }
    free(openv);
    free(e);
    free(iv);
}

void fw_check_print(const char *label, const fw_check_result *r)
{
    fprintf(stderr,
            "CHECK %s: intervals=%zu unknown=%zu max_definite=%d max_with_maybe=%d "
            "violations=%zu (%.1f ms above the limit) acq=%zu busy=%zu errors=%zu lost=%zu "
            "kills=%zu release ok/lost/err=%zu/%zu/%zu stale_fenced_accepted=%zu\n",
            label, r->intervals, r->maybe, r->max_definite, r->max_with_maybe, r->violations,
            (double)r->violation_ns / 1e6, r->acq, r->busy, r->errors, r->lost, r->kills,
            r->rel_ok, r->rel_lost, r->rel_err, r->stale_accepted);
    if (r->errors) {
        fprintf(stderr, "  errors by code:");
        for (int c = 0; c < 32; c++)
            if (r->errors_by_code[c])
                fprintf(stderr, " %s=%zu", redsem_err_name(-c), r->errors_by_code[c]);
        fprintf(stderr, "\n");
    }
    if (r->violations)
        fprintf(stderr,
                "  first violation: slot %d token %llu [%lld, %lld) end=%s  vs  slot %d token "
                "%llu [%lld, %lld) end=%s\n",
                r->viol_a.slot, (unsigned long long)r->viol_a.token,
                (long long)r->viol_a.start_ns, (long long)r->viol_a.end_ns, r->viol_a.why_end,
                r->viol_b.slot, (unsigned long long)r->viol_b.token,
                (long long)r->viol_b.start_ns, (long long)r->viol_b.end_ns, r->viol_b.why_end);
}
