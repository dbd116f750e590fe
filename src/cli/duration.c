/* redsem(1): the DURATION argument of --lease, --wait and --kill-after. */
#include <string.h>

#include "cli.h"

int cli_parse_duration(const char *text, int64_t max_ms, int64_t *ret_ms)
{
    static const struct {
        const char *suffix;
        int64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"", 1000}};

    if (text == NULL || ret_ms == NULL || max_ms < 0)
        return -1;
    const char *p = text;
    if (*p < '0' || *p > '9')
        return -1; /* empty, sign, space, unit without a number */
    int64_t n = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        int64_t digit = *p - '0';
        if (n > (INT64_MAX - digit) / 10)
            return -1;
        n = n * 10 + digit;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].suffix) != 0)
            continue;
        if (n > max_ms / units[i].ms)
            return -1;
        *ret_ms = n * units[i].ms;
        return 0;
    }
    return -1;
}
