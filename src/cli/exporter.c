/* redsem(1): exporter - serve the server's figures to Prometheus over HTTP.
 *
 * HTTP is libmicrohttpd's (a thread per connection, at most 64): no HTTP code here. We bind
 * the listening socket ourselves, so that a bad address or a port in use is reported with the
 * system's reason before anything starts, and hand it to the daemon.
 *
 * One gatherer thread owns the Redis client and reads the figures; a scrape asks it for a
 * fresh reading and waits for it at most --scrape-timeout. Scrapes that come while a reading
 * is under way share the next one. A reading that does not come in time (Redis stalled or
 * unreachable) is answered with redsem_up 0 at the timeout: never a hang, always HTTP 200,
 * as exporters do. The client is made by the gatherer on the first scrape and again after a
 * failure to make it, so the exporter starts (and serves redsem_up 0) while Redis is down.
 * The gatherer logs on stderr when Redis becomes unreachable or reachable again, and when
 * --match finds more names than --max-names, once per change. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "cli.h"

typedef struct exporter {
    const cli_opts *o;
    redsem_options *opts;   /* for the client, made by the gatherer */
    redsem_client *client;  /* the gatherer's only */
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* wanted > done, or stop */
    pthread_cond_t done_cv; /* done moved, or stop (CLOCK_MONOTONIC) */
    uint64_t wanted, done;  /* readings asked for, and the last one made */
    char *text;             /* the reading numbered done (malloc'd) */
    bool stop;
    bool down, capped;      /* the gatherer's last state, for its log lines */
} exporter;

/* ------------------------------------------------------------------ --listen */

/* Parse ADDR:PORT ("127.0.0.1:9720", "[::1]:9720", ":9720", "localhost:9720") and bind a
 * listening socket there. Prints and returns the exit status on failure. */
static int listen_on(const cli_opts *o, int *ret_fd)
{
    const char *spec = o->listen, *colon;
    char host[64];
    if (spec[0] == '[') {
        const char *close_br = strchr(spec, ']');
        if (close_br == NULL || close_br[1] != ':' || (size_t)(close_br - spec - 1) >= sizeof host)
            goto bad;
        snprintf(host, sizeof host, "%.*s", (int)(close_br - spec - 1), spec + 1);
        colon = close_br + 1;
    } else {
        colon = strrchr(spec, ':');
        if (colon == NULL || (size_t)(colon - spec) >= sizeof host ||
            memchr(spec, ':', (size_t)(colon - spec)) != NULL)
            goto bad;
        snprintf(host, sizeof host, "%.*s", (int)(colon - spec), spec);
        if (host[0] == '\0')
            snprintf(host, sizeof host, "0.0.0.0");
        else if (strcmp(host, "localhost") == 0)
            snprintf(host, sizeof host, "127.0.0.1");
    }
    const char *port = colon + 1;
    size_t plen = strlen(port);
    if (plen < 1 || plen > 5 || strspn(port, "0123456789") != plen || atol(port) > 65535)
        goto bad;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL)
        goto bad;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    int err = 0;
    if (fd < 0)
        err = errno;
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
             bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0)
        err = errno;
    freeaddrinfo(ai);
    if (err != 0) {
        if (fd >= 0)
            close(fd);
        cli_msg(o, "--listen %s: %s%s", spec, strerror(err),
                err == EADDRINUSE ? " (another process serves that port: pick another)" : "");
        return CLI_EXIT_OSERR;
    }
    *ret_fd = fd;
    return 0;
bad:
    cli_msg(o, "--listen '%s': use ADDR:PORT with a numeric address and a port from 0 to "
               "65535, such as 127.0.0.1:9720, [::1]:9720 or :9720 (see redsem --help)",
            spec);
    return CLI_EXIT_USAGE;
}

/* "ADDR:PORT" of the bound socket, for the start-up line. */
static void bound_address(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[NI_MAXHOST] = "?", p[NI_MAXSERV] = "?";
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        (void)getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p,
                          NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, len, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", h, p);
}

/* ------------------------------------------------------------------ the gatherer */

static char *dup_text(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

static void note_down(exporter *ex, bool down, const char *why)
{
    if (down && !ex->down)
        cli_msg(ex->o, "Redis unreachable: %s; serving redsem_up 0 until it answers",
                why != NULL && *why ? why : "no reply");
    else if (!down && ex->down)
        cli_msg(ex->o, "Redis answers again");
    ex->down = down;
}

/* One reading: the text to serve (malloc'd; NULL out of memory). */
static char *gather(exporter *ex)
{
    const cli_opts *o = ex->o;
    if (ex->client == NULL) {
        char err[512] = "";
        int rc = redsem_client_new_verbose(ex->opts, &ex->client, err, sizeof err);
        if (rc != REDSEM_OK) {
            ex->client = NULL;
            char why[640];
            snprintf(why, sizeof why, "%s%s%s", redsem_strerror(rc), *err ? ": " : "", err);
            note_down(ex, true, why);
            return dup_text(cli_metrics_down_text());
        }
    }
    char *text = NULL;
    bool capped = false, up = true;
    int rc = cli_metrics_gather(o, ex->client, &text, &capped, &up);
    if (rc != REDSEM_OK) {
        char why[640];
        const char *detail = redsem_client_errmsg(ex->client);
        if (rc == REDSEM_ESTATE && o->match != NULL)
            detail = "a Redis Cluster cannot be SCANned as one server: give the NAMEs instead";
        snprintf(why, sizeof why, "%s%s%s%s", o->match != NULL ? "--match: " : "",
                 redsem_strerror(rc), *detail ? ": " : "", detail);
        note_down(ex, true, why);
        return dup_text(cli_metrics_down_text());
    }
    note_down(ex, !up, redsem_client_errmsg(ex->client));
    if (capped && !ex->capped)
        cli_msg(o, "--match '%s' matches more than %u names: serving the first %u "
                   "(redsem_scan_capped 1); narrow the pattern or raise --max-names",
                o->match, o->max_names, o->max_names);
    ex->capped = capped;
    return text;
}

static void *gatherer(void *arg)
{
    exporter *ex = arg;
    pthread_mutex_lock(&ex->mu);
    for (;;) {
        while (!ex->stop && ex->wanted == ex->done)
            pthread_cond_wait(&ex->work_cv, &ex->mu);
        if (ex->stop)
            break;
        uint64_t gen = ex->wanted;
        pthread_mutex_unlock(&ex->mu);
        char *text = gather(ex);
        pthread_mutex_lock(&ex->mu);
        free(ex->text);
        ex->text = text;
        ex->done = gen;
        pthread_cond_broadcast(&ex->done_cv);
    }
    pthread_mutex_unlock(&ex->mu);
    return NULL;
}

/* A fresh reading, or redsem_up 0 after --scrape-timeout (malloc'd; NULL out of memory). */
static char *scrape(exporter *ex)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    int64_t ms = ex->o->scrape_timeout_ms;
    deadline.tv_sec += (time_t)(ms / 1000);
    deadline.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ex->mu);
    uint64_t mine = ++ex->wanted;
    pthread_cond_signal(&ex->work_cv);
    int rc = 0;
    while (!ex->stop && ex->done < mine && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&ex->done_cv, &ex->mu, &deadline);
    char *text = NULL;
    if (ex->done >= mine && ex->text != NULL)
        text = dup_text(ex->text);
    pthread_mutex_unlock(&ex->mu);
    if (text == NULL && rc == ETIMEDOUT) {
        static const char late[] = "# redsem: no reading within --scrape-timeout\n";
        const char *down = cli_metrics_down_text();
        text = malloc(sizeof late + strlen(down));
        if (text != NULL)
            snprintf(text, sizeof late + strlen(down), "%s%s", late, down);
    } else if (text == NULL) {
        text = dup_text(cli_metrics_down_text());
    }
    return text;
}

/* ------------------------------------------------------------------ HTTP */

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *body,
                               const char *content_type)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    (void)MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        (void)MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    exporter *ex = cls;
    static const char plain[] = "text/plain; charset=utf-8";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n", plain);
    if (strcmp(url, "/metrics") != 0)
        return respond(conn, MHD_HTTP_NOT_FOUND, "not found: the figures are at /metrics\n",
                       plain);
    char *text = scrape(ex);
    if (text == NULL)
        return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", plain);
    enum MHD_Result ret = respond(conn, MHD_HTTP_OK, text, "text/plain; version=0.0.4; charset=utf-8");
    free(text);
    return ret;
}

/* ------------------------------------------------------------------ the command */

int cli_cmd_exporter(const cli_opts *o)
{
    exporter ex = {.o = o};
    int code = cli_client_options(o, &ex.opts);
    if (code != 0)
        return code;
    /* a reading never takes much longer than a scrape may: each connect and each request
     * are bounded by it, and so is the retry window (unless --retry says otherwise) */
    int64_t t = o->scrape_timeout_ms;
    (void)redsem_options_set_connect_timeout_ms(ex.opts, t);
    (void)redsem_options_set_command_timeout_ms(ex.opts, t);
    if (!o->retry_set)
        (void)redsem_options_set_retry_ms(ex.opts, t / 2 < 1000 ? t / 2 : 1000);
    int fd = -1;
    code = listen_on(o, &fd);
    if (code != 0) {
        redsem_options_free(ex.opts);
        return code;
    }
    /* SIGINT and SIGTERM are taken by sigwait() below; the threads made from here on inherit
     * the mask. A peer gone mid-answer must not kill us (libmicrohttpd sends with
     * MSG_NOSIGNAL, but a TLS or other write might not). */
    sigset_t stop_sigs, orig;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    signal(SIGPIPE, SIG_IGN);
    pthread_sigmask(SIG_BLOCK, &stop_sigs, &orig);

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&ex.mu, NULL);
    pthread_cond_init(&ex.work_cv, NULL);
    pthread_cond_init(&ex.done_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t th;
    bool started = pthread_create(&th, NULL, gatherer, &ex) == 0;
    struct MHD_Daemon *d = NULL;
    if (started)
        d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                                 MHD_USE_POLL,
                             0, NULL, NULL, on_request, &ex, MHD_OPTION_LISTEN_SOCKET, fd,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60, MHD_OPTION_END);
    if (d == NULL) {
        cli_msg(o, "cannot start the HTTP server: %s", strerror(started ? errno : EAGAIN));
        code = CLI_EXIT_OSERR;
        close(fd);
    } else {
        char addr[NI_MAXHOST + NI_MAXSERV + 4];
        bound_address(fd, addr, sizeof addr);
        cli_msg(o, "serving http://%s/metrics", addr);
        int sig = 0;
        while (sigwait(&stop_sigs, &sig) != 0)
            ;
        cli_msg(o, "stopping on %s", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    /* wake the scrapes still waiting and the gatherer, then stop the HTTP threads (which
     * closes the socket) and the gatherer (at most one reading: bounded by the timeouts) */
    pthread_mutex_lock(&ex.mu);
    ex.stop = true;
    pthread_cond_broadcast(&ex.work_cv);
    pthread_cond_broadcast(&ex.done_cv);
    pthread_mutex_unlock(&ex.mu);
    if (d != NULL)
        MHD_stop_daemon(d);
    if (started)
        pthread_join(th, NULL);
    free(ex.text);
    redsem_client_free(ex.client);
    redsem_options_free(ex.opts);
    pthread_cond_destroy(&ex.work_cv);
    pthread_cond_destroy(&ex.done_cv);
    pthread_mutex_destroy(&ex.mu);
    pthread_sigmask(SIG_SETMASK, &orig, NULL);
    return code;
}
