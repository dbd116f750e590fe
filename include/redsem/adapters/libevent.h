/* redsem - adapter for libevent 2 (header-only, as hiredis' adapters are).
 *
 *   #include <event2/event.h>
 *   #include <redsem/adapters/libevent.h>
 *   redsem_async *a;  redsem_async_new(client, &a);
 *   redsem_event_attach(a, base);                // then start operations, run the base
 *   ...
 *   redsem_async_free(a);                        // frees the adapter's events too
 *
 * redsem_event_attach - bind a redsem_async to a libevent event_base: one persistent event
 * per descriptor redsem asks for (at present one) and one timer event. Returns REDSEM_OK,
 * REDSEM_ENOMEM, REDSEM_EINVAL (NULL argument) or REDSEM_ESTATE (a loop is set already).
 * Thread safety: the base's thread. Since: 0.4 */
#ifndef REDSEM_ADAPTERS_LIBEVENT_H
#define REDSEM_ADAPTERS_LIBEVENT_H

#include <stdlib.h>
#include <event2/event.h>

#include "../async.h"
#include "../error.h"

typedef struct redsem__event {
    struct event_base *base;
    redsem_async *async;
    struct event *io, *timer;
    int fd;
} redsem__event;

static void redsem__event_on_io(evutil_socket_t fd, short events, void *data)
{
    redsem__event *e = (redsem__event *)data;
    (void)redsem_async_action(e->async, (int)fd,
                              (events & EV_READ ? REDSEM_WATCH_IN : 0) |
                                  (events & EV_WRITE ? REDSEM_WATCH_OUT : 0));
}

static void redsem__event_on_timer(evutil_socket_t fd, short events, void *data)
{
    redsem__event *e = (redsem__event *)data;
    (void)fd;
    (void)events;
    (void)redsem_async_action(e->async, -1, 0);
}

static void redsem__event_socket(redsem_async *a, int fd, int what, void *data)
{
    redsem__event *e = (redsem__event *)data;
    (void)a;
    if (what & REDSEM_WATCH_REMOVE) {
        /* redsem_async_free(): the last call */
        if (e->io != NULL)
            event_free(e->io);
        event_free(e->timer);
        free(e);
        return;
    }
    if (e->io != NULL)
        event_free(e->io);
    e->fd = fd;
    e->io = event_new(e->base, fd,
                      (short)(EV_PERSIST | (what & REDSEM_WATCH_IN ? EV_READ : 0) |
                              (what & REDSEM_WATCH_OUT ? EV_WRITE : 0)),
                      redsem__event_on_io, e);
    if (e->io != NULL)
        event_add(e->io, NULL);
}

static void redsem__event_timer(redsem_async *a, int64_t timeout_ms, void *data)
{
    redsem__event *e = (redsem__event *)data;
    (void)a;
    if (timeout_ms < 0) {
        event_del(e->timer);
        return;
    }
    struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
    event_add(e->timer, &tv);
}

static inline int redsem_event_attach(redsem_async *async, struct event_base *base)
{
    if (async == NULL || base == NULL)
        return REDSEM_EINVAL;
    redsem__event *e = (redsem__event *)calloc(1, sizeof *e);
    if (e == NULL)
        return REDSEM_ENOMEM;
    e->base = base;
    e->async = async;
    e->fd = -1;
    e->timer = evtimer_new(base, redsem__event_on_timer, e);
    if (e->timer == NULL) {
        free(e);
        return REDSEM_ENOMEM;
    }
    int rc = redsem_async_set_loop(async, redsem__event_socket, redsem__event_timer, e);
    if (rc != REDSEM_OK) {
        if (e->io != NULL)
            event_free(e->io);
        event_free(e->timer);
        free(e);
    }
    return rc;
}

#endif /* REDSEM_ADAPTERS_LIBEVENT_H */
