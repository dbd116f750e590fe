/* redsem(1): metrics (the server's figures once, in Prometheus' text format), and what the
 * exporter and run --metrics-file share with it: gathering the figures, and writing a file
 * atomically for node_exporter's textfile collector. The text itself is the library's
 * (redsem_metrics_write_server, redsem_metrics_write); here only redsem_scan_capped is added,
 * which only the caller of redsem_scan_names knows. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* the library's HELP text for redsem_up (src/metrics.c), so that a scrape answered here reads
 * the same to Prometheus */
static const char down_text[] =
    "# HELP redsem_up Whether every read of this scrape succeeded (1) or Redis could not be "
    "read (0).\n"
    "# TYPE redsem_up gauge\n"
    "redsem_up 0\n";

const char *cli_metrics_down_text(void)
{
    return down_text;
}

/* Whether the text says redsem_up 0. */
static bool text_up(const char *text)
{
    return strncmp(text, "redsem_up 0\n", 12) != 0 && strstr(text, "\nredsem_up 0\n") == NULL;
}

/* Call write (the library's redsem_metrics_write_server or _write) into a buffer that grows
 * until the text fits; the text, malloc'd, in *ret_text. */
typedef int (*write_fn)(void *arg, char *buf, size_t len, size_t *needed);

static int write_grown(write_fn write, void *arg, size_t extra, char **ret_text)
{
    size_t len = 16384;
    *ret_text = NULL;
    for (int tries = 0; tries < 8; tries++) {
        char *buf = malloc(len + extra);
        if (buf == NULL)
            return REDSEM_ENOMEM;
        size_t needed = 0;
        int rc = write(arg, buf, len, &needed);
        if (rc == REDSEM_OK) {
            *ret_text = buf;
            return REDSEM_OK;
        }
        free(buf);
        if (rc != REDSEM_ERANGE)
            return rc;
        len = needed + needed / 4 + 1024; /* the figures may grow before the next call */
    }
    return REDSEM_ENOMEM;
}

typedef struct server_call {
    redsem_client *c;
    const char *const *names;
    size_t n;
} server_call;

static int write_server(void *arg, char *buf, size_t len, size_t *needed)
{
    server_call *sc = arg;
    return redsem_metrics_write_server(sc->c, sc->names, sc->n, buf, len, needed);
}

static const char capped_fmt[] =
    "# HELP redsem_scan_capped Whether --match found more names than --max-names (1: only the "
    "first %u are shown).\n"
    "# TYPE redsem_scan_capped gauge\n"
    "redsem_scan_capped %d\n";

int cli_metrics_gather(const cli_opts *o, redsem_client *c, char **ret_text, bool *capped,
                       bool *up)
{
    char **found = NULL;
    size_t nfound = 0;
    *ret_text = NULL;
    *capped = false;
    *up = true;
    server_call sc = {c, (const char *const *)o->names, o->nnames};
    if (o->match != NULL) {
        int rc = redsem_scan_names(c, o->match, o->max_names, &found, &nfound, capped);
        if (rc != REDSEM_OK)
            return rc;
        sc.names = (const char *const *)found;
        sc.n = nfound;
    }
    size_t extra = o->match != NULL ? sizeof capped_fmt + 32 : 0;
    int rc = write_grown(write_server, &sc, extra, ret_text);
    redsem_names_free(found, nfound);
    if (rc != REDSEM_OK)
        return rc;
    *up = text_up(*ret_text);
    if (o->match != NULL) {
        size_t used = strlen(*ret_text);
        snprintf(*ret_text + used, extra, capped_fmt, o->max_names, *capped ? 1 : 0);
    }
    return REDSEM_OK;
}

/* ------------------------------------------------------------------ metrics */

int cli_cmd_metrics(const cli_opts *o)
{
    cli_session s;
    int code = cli_session_connect(o, &s);
    if (code != 0)
        return code;
    char *text = NULL;
    bool capped = false, up = true;
    int rc = cli_metrics_gather(o, s.client, &text, &capped, &up);
    if (rc == REDSEM_ESTATE && o->match != NULL) {
        cli_msg(o, "--match needs SCAN on one server, which a Redis Cluster is not: give the "
                   "NAMEs instead");
        code = CLI_EXIT_USAGE;
    } else if (rc != REDSEM_OK)
        code = cli_fail(o, o->match != NULL ? "--match" : NULL, rc,
                        redsem_client_errmsg(s.client));
    else if (!up)
        /* one shot: the caller wants the figures, not a scrape's redsem_up 0 */
        code = cli_fail(o, "read the figures", REDSEM_ECONN, redsem_client_errmsg(s.client));
    else if (fputs(text, stdout) == EOF || fflush(stdout) != 0) {
        cli_msg(o, "cannot write the output");
        code = CLI_EXIT_OSERR;
    } else if (capped) {
        cli_msg(o, "--match '%s' matches more than %u names: printed the first %u "
                   "(redsem_scan_capped 1); narrow the pattern or raise --max-names",
                o->match, o->max_names, o->max_names);
        code = CLI_EXIT_USAGE;
    }
    free(text);
    cli_session_close(&s);
    return code;
}

/* ------------------------------------------------------------------ run --metrics-file */

/* The directory part of path (".", for a bare file name) into dir. */
static void dir_of(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, len, ".");
    else if (slash == path)
        snprintf(dir, len, "/");
    else
        snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

int cli_metrics_file_check(const cli_opts *o)
{
    if (o->metrics_file == NULL)
        return 0;
    char dir[4096];
    dir_of(o->metrics_file, dir, sizeof dir);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cli_msg(o, "--metrics-file %s: the directory %s %s", o->metrics_file, dir,
                errno == ENOENT ? "does not exist" : "is not a directory");
        return CLI_EXIT_USAGE;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        cli_msg(o, "--metrics-file %s: cannot create files in %s: %s", o->metrics_file, dir,
                strerror(errno));
        return CLI_EXIT_USAGE;
    }
    size_t plen = strlen(o->metrics_file);
    if ((plen > 0 && o->metrics_file[plen - 1] == '/') ||
        (stat(o->metrics_file, &st) == 0 && S_ISDIR(st.st_mode))) {
        cli_msg(o, "--metrics-file %s: is a directory, not a file", o->metrics_file);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

typedef struct client_call {
    const redsem_client *c;
} client_call;

static int write_client(void *arg, char *buf, size_t len, size_t *needed)
{
    return redsem_metrics_write(((client_call *)arg)->c, buf, len, needed);
}

static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

int cli_metrics_file_write(const cli_opts *o, const redsem_client *c)
{
    if (o->metrics_file == NULL || c == NULL)
        return 0;
    char *text = NULL;
    client_call cc = {c};
    int rc = write_grown(write_client, &cc, 0, &text);
    if (rc != REDSEM_OK) {
        (void)cli_fail(o, "--metrics-file", rc, NULL);
        return cli_exit_code(rc);
    }
    /* a temporary file in the same directory (rename() is atomic within one file system);
     * hidden and without the .prom suffix, so the textfile collector never reads it */
    char dir[4096], tmp[4200];
    dir_of(o->metrics_file, dir, sizeof dir);
    const char *base = strrchr(o->metrics_file, '/');
    base = base != NULL ? base + 1 : o->metrics_file;
    snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, base);
    int fd = mkstemp(tmp);
    int err = 0;
    if (fd < 0)
        err = errno;
    else {
        /* readable by the collector, which may run as another user (mkstemp makes 0600) */
        if (fchmod(fd, 0644) != 0 || !write_all(fd, text, strlen(text)) || fsync(fd) != 0)
            err = errno != 0 ? errno : EIO;
        if (close(fd) != 0 && err == 0)
            err = errno;
        if (err == 0 && rename(tmp, o->metrics_file) != 0)
            err = errno;
        if (err != 0)
            (void)unlink(tmp);
    }
    free(text);
    if (err != 0) {
        cli_msg(o, "--metrics-file %s: not written: %s", o->metrics_file, strerror(err));
        return CLI_EXIT_OSERR;
    }
    return 0;
}
