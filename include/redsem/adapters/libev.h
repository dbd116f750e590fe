/* redsem - adapter for libev (header-only, as hiredis' adapters are).
 *
 *   #include <ev.h>
 *   #include <redsem/adapters/libev.h>
 *   redsem_async *a;  redsem_async_new(client, &a);
 *   redsem_ev_attach(a, EV_DEFAULT);             // then start operations, ev_run()
 *   ...
 *   redsem_async_free(a);                        // stops and frees the adapter's watchers
 *
 * redsem_ev_attach - bind a redsem_async to a libev loop: one ev_io per descriptor redsem
 * asks for (at present one) and one ev_timer. Returns REDSEM_OK, REDSEM_ENOMEM, REDSEM_EINVAL
 * (NULL argument) or REDSEM_ESTATE (a loop is set already). Thread safety: the loop's
 * thread. Since: 0.4 */
#ifndef REDSEM_ADAPTERS_LIBEV_H
#define REDSEM_ADAPTERS_LIBEV_H

#include <stdlib.h>
#include <ev.h>

#include "../async.h"
#include "../error.h"

typedef struct redsem__ev {
    struct ev_loop *loop;
    redsem_async *async;
    ev_io io;
    ev_timer timer;
    int io_on;
} redsem__ev;

static void redsem__ev_on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    redsem__ev *e = (redsem__ev *)w->data;
    (void)loop;
    (void)redsem_async_action(e->async, w->fd,
                              (revents & EV_READ ? REDSEM_WATCH_IN : 0) |
                                  (revents & EV_WRITE ? REDSEM_WATCH_OUT : 0));
}

static void redsem__ev_on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    redsem__ev *e = (redsem__ev *)w->data;
    (void)loop;
    (void)revents;
    (void)redsem_async_action(e->async, -1, 0);
}

static void redsem__ev_socket(redsem_async *a, int fd, int what, void *data)
{
    redsem__ev *e = (redsem__ev *)data;
    (void)a;
    if (e->io_on)
        ev_io_stop(e->loop, &e->io);
    e->io_on = 0;
    if (what & REDSEM_WATCH_REMOVE) {
        /* redsem_async_free(): the last call */
        ev_timer_stop(e->loop, &e->timer);
        free(e);
        return;
    }
    ev_io_init(&e->io, redsem__ev_on_io, fd,
               (what & REDSEM_WATCH_IN ? EV_READ : 0) | (what & REDSEM_WATCH_OUT ? EV_WRITE : 0));
    e->io.data = e;
    ev_io_start(e->loop, &e->io);
    e->io_on = 1;
}

static void redsem__ev_timer(redsem_async *a, int64_t timeout_ms, void *data)
{
    redsem__ev *e = (redsem__ev *)data;
    (void)a;
    ev_timer_stop(e->loop, &e->timer);
    if (timeout_ms >= 0) {
        ev_timer_set(&e->timer, (ev_tstamp)timeout_ms / 1000.0, 0.);
        ev_timer_start(e->loop, &e->timer);
    }
}

static inline int redsem_ev_attach(redsem_async *async, struct ev_loop *loop)
{
    if (async == NULL || loop == NULL)
        return REDSEM_EINVAL;
    redsem__ev *e = (redsem__ev *)calloc(1, sizeof *e);
    if (e == NULL)
        return REDSEM_ENOMEM;
    e->loop = loop;
    e->async = async;
    ev_init(&e->timer, redsem__ev_on_timer);
    e->timer.data = e;
    int rc = redsem_async_set_loop(async, redsem__ev_socket, redsem__ev_timer, e);
    if (rc != REDSEM_OK) {
        if (e->io_on)
            ev_io_stop(loop, &e->io);
        free(e);
    }
    return rc;
}

#endif /* REDSEM_ADAPTERS_LIBEV_H */
