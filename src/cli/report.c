/* redsem(1): reporting: messages on stderr and the exit code of each library status. Below
 * main.c, commands.c, run.c and session.c, which all report through it. */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cli_exit_code(int rc)
{
    switch (rc) {
    case REDSEM_OK:
        return CLI_EXIT_OK;
    case REDSEM_EBUSY:
        return CLI_EXIT_TEMPFAIL;
    case REDSEM_ELOST:
        return CLI_EXIT_LOST;
    case REDSEM_EUNKNOWN:
    case REDSEM_EREPLICA:
    case REDSEM_ECONN:
    case REDSEM_ETIMEDOUT:
        return CLI_EXIT_UNAVAILABLE;
    case REDSEM_EINVAL:
        return CLI_EXIT_USAGE;
    case REDSEM_ESERVER:
    case REDSEM_EPROTO:
        return CLI_EXIT_PROTOCOL;
    case REDSEM_EPERM:
    case REDSEM_ETLS:
        return CLI_EXIT_NOPERM;
    case REDSEM_ECONFLICT:
    case REDSEM_EEVICTION:
        return CLI_EXIT_CONFIG;
    default: /* ENOMEM, EFORKED, ESTATE, unknown */
        return CLI_EXIT_SOFTWARE;
    }
}

/* NAME as given, for a message: at most 64 bytes, anything but printable ASCII shown as '?'
 * (a name can be huge or binary before the library rejects it, and must not write control
 * sequences to a terminal). */
const char *cli_shown_name(const char *name, char out[72])
{
    size_t i = 0;
    for (; name[i] != '\0' && i < 64; i++) {
        unsigned char ch = (unsigned char)name[i];
        out[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    snprintf(out + i, 72 - i, "%s", name[i] != '\0' ? "..." : "");
    return out;
}

static void prefix(const cli_opts *o)
{
    fputs("redsem:", stderr);
    if (o != NULL && o->cmd_name != NULL)
        fprintf(stderr, " %s", o->cmd_name);
    char shown[72];
    if (o != NULL && o->name != NULL)
        fprintf(stderr, " %s", cli_shown_name(o->name, shown));
    fputs(": ", stderr);
}

void cli_msg(const cli_opts *o, const char *fmt, ...)
{
    prefix(o);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* The library's detail for rc (its message, which carries the server's own text), on stderr:
 * anything but printable ASCII becomes '?' (a server's or a peer's text must not write
 * control sequences to a terminal), and the library calls it points to are named by the
 * options that make them. */
static void print_detail(const char *detail)
{
    static const struct {
        const char *call, *flag;
    } flags[] = {
        {"redsem_options_set_tls_cert", "--tls-cert (REDSEM_TLS_CERT)"},
        {"redsem_options_set_tls_ca", "--tls-ca (REDSEM_TLS_CA)"},
        {"redsem_options_set_tls_server_name", "--tls-server-name (REDSEM_TLS_SERVER_NAME)"},
        {"redsem_options_set_retry_ms", "--retry (REDSEM_RETRY)"},
        {"redsem_options_set_allow_eviction", "--allow-eviction"},
    };
    for (const char *p = detail; *p != '\0';) {
        bool named = false;
        for (size_t i = 0; i < sizeof flags / sizeof *flags && !named; i++) {
            size_t n = strlen(flags[i].call);
            /* the whole identifier only: set_tls_ca is a prefix of no other entry's call,
             * but a longer one may come */
            if (strncmp(p, flags[i].call, n) == 0 &&
                !(p[n] == '_' || (p[n] >= 'a' && p[n] <= 'z'))) {
                fputs(flags[i].flag, stderr);
                p += n;
                if (strncmp(p, "()", 2) == 0)
                    p += 2;
                named = true;
            }
        }
        if (!named) {
            unsigned char ch = (unsigned char)*p++;
            fputc(ch >= 0x20 && ch < 0x7f ? ch : '?', stderr);
        }
    }
}

int cli_fail(const cli_opts *o, const char *what, int rc, const char *detail)
{
    prefix(o);
    if (what != NULL && *what)
        fprintf(stderr, "%s: ", what);
    fputs(redsem_strerror(rc), stderr);
    if (detail != NULL && *detail) {
        fputs(": ", stderr);
        print_detail(detail);
    }
    if (rc == REDSEM_ECONFLICT)
        fputs(o != NULL && o->rate_n > 0
                  ? " (every command on one NAME must use the same --strategy, --limit and --rate)"
                  : " (every command on one NAME must use the same --strategy and --limit)",
              stderr);
    fputc('\n', stderr);
    return cli_exit_code(rc);
}
