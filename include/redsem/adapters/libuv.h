/* redsem - adapter for libuv (header-only, as hiredis' adapters are).
 *
 *   #include <uv.h>
 *   #include <redsem/adapters/libuv.h>
 *   redsem_async *a;  redsem_async_new(client, &a);
 *   redsem_uv_attach(a, uv_default_loop());      // then start operations, run the loop
 *   ...
 *   redsem_async_free(a);                        // the adapter's handles close on the loop
 *
 * redsem_uv_attach - bind a redsem_async to a libuv loop: a uv_poll_t per descriptor
 * redsem asks for (at present one) and a uv_timer_t. Returns REDSEM_OK, REDSEM_ENOMEM,
 * REDSEM_EINVAL (NULL argument) or REDSEM_ESTATE (a loop is set already). The adapter's
 * memory is freed by the loop after redsem_async_free() (uv_close callbacks), so run the
 * loop (or uv_run(loop, UV_RUN_NOWAIT)) once after freeing. Thread safety: the loop's thread.
 * Since: 0.4 */
#ifndef REDSEM_ADAPTERS_LIBUV_H
#define REDSEM_ADAPTERS_LIBUV_H

#include <stdlib.h>
#include <uv.h>

#include "../async.h"
#include "../error.h"

typedef struct redsem__uv {
    uv_loop_t *loop;
    redsem_async *async;
    uv_poll_t poll;
    uv_timer_t timer;
    int fd;
    int poll_on, closing, open_handles;
} redsem__uv;

static void redsem__uv_closed(uv_handle_t *h)
{
    redsem__uv *u = (redsem__uv *)h->data;
    if (--u->open_handles == 0)
        free(u);
}

static void redsem__uv_on_poll(uv_poll_t *h, int status, int events)
{
    redsem__uv *u = (redsem__uv *)h->data;
    int ev = (events & UV_READABLE ? REDSEM_WATCH_IN : 0) |
             (events & UV_WRITABLE ? REDSEM_WATCH_OUT : 0);
    if (status < 0)
        ev = REDSEM_WATCH_IN | REDSEM_WATCH_OUT; /* let redsem find the error */
    (void)redsem_async_action(u->async, u->fd, ev);
}

static void redsem__uv_on_timer(uv_timer_t *t)
{
    redsem__uv *u = (redsem__uv *)t->data;
    (void)redsem_async_action(u->async, -1, 0);
}

static void redsem__uv_socket(redsem_async *a, int fd, int what, void *data)
{
    redsem__uv *u = (redsem__uv *)data;
    (void)a;
    if (what & REDSEM_WATCH_REMOVE) {
        /* redsem_async_free(): the last call; close both handles, free on the loop */
        u->closing = 1;
        u->open_handles = 1 + (u->poll_on != 0);
        if (u->poll_on) {
            uv_poll_stop(&u->poll);
            uv_close((uv_handle_t *)&u->poll, redsem__uv_closed);
        }
        uv_timer_stop(&u->timer);
        uv_close((uv_handle_t *)&u->timer, redsem__uv_closed);
        return;
    }
    if (!u->poll_on) {
        if (uv_poll_init(u->loop, &u->poll, fd) != 0)
            return;
        u->poll.data = u;
        u->poll_on = 1;
        u->fd = fd;
    }
    uv_poll_start(&u->poll, (what & REDSEM_WATCH_IN ? UV_READABLE : 0) |
                                (what & REDSEM_WATCH_OUT ? UV_WRITABLE : 0),
                  redsem__uv_on_poll);
}

static void redsem__uv_timer(redsem_async *a, int64_t timeout_ms, void *data)
{
    redsem__uv *u = (redsem__uv *)data;
    (void)a;
    if (u->closing)
        return;
    if (timeout_ms < 0)
        uv_timer_stop(&u->timer);
    else
        uv_timer_start(&u->timer, redsem__uv_on_timer, (uint64_t)timeout_ms, 0);
}

static inline int redsem_uv_attach(redsem_async *async, uv_loop_t *loop)
{
    if (async == NULL || loop == NULL)
        return REDSEM_EINVAL;
    redsem__uv *u = (redsem__uv *)calloc(1, sizeof *u);
    if (u == NULL)
        return REDSEM_ENOMEM;
    u->loop = loop;
    u->async = async;
    u->fd = -1;
    uv_timer_init(loop, &u->timer);
    u->timer.data = u;
    int rc = redsem_async_set_loop(async, redsem__uv_socket, redsem__uv_timer, u);
    if (rc != REDSEM_OK) {
        u->open_handles = 1;
        uv_close((uv_handle_t *)&u->timer, redsem__uv_closed);
    }
    return rc;
}

#endif /* REDSEM_ADAPTERS_LIBUV_H */
