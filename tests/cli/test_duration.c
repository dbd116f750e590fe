/* Unit tests of redsem(1)'s DURATION parser (src/cli/duration.c). No server. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "cli.h"

Test(duration, accepted)
{
    static const struct {
        const char *text;
        int64_t ms;
    } ok[] = {
        {"0", 0},           {"0ms", 0},          {"250ms", 250},         {"1", 1000},
        {"30", 30000},      {"30s", 30000},      {"5m", 300000},         {"1h", 3600000},
        {"007s", 7000},     {"720h", 2592000000}, {"2592000000ms", 2592000000},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t ms = -7;
        cr_assert_eq(cli_parse_duration(ok[i].text, REDSEM_WAIT_MAX_MS, &ms), 0, "'%s'",
                     ok[i].text);
        cr_assert_eq(ms, ok[i].ms, "'%s' gave %lld", ok[i].text, (long long)ms);
    }
}

Test(duration, refused)
{
    static const char *const bad[] = {
        "",        "ms",    "s",        "-1",      "+1",      " 1",    "1 ",     "1 s",
        "1.5s",    "1e3",   "1x",       "1sec",    "1S",      "1MS",   "1hh",    "1ms5",
        "0x10",    "1d",    "1w",       "forever", "721h",    "2592000001ms",
        "99999999999999999999",         "9223372036854775807", "9223372036854775807h",
        "9223372036854775808ms",        "153722867280912931m",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t ms = -7;
        cr_assert_eq(cli_parse_duration(bad[i], REDSEM_WAIT_MAX_MS, &ms), -1, "'%s' accepted",
                     bad[i]);
        cr_assert_eq(ms, -7, "'%s': output written on failure", bad[i]);
    }
    int64_t ms;
    cr_assert_eq(cli_parse_duration(NULL, 10, &ms), -1);
    cr_assert_eq(cli_parse_duration("1", 10, NULL), -1);
    cr_assert_eq(cli_parse_duration("11ms", 10, &ms), -1);
    cr_assert_eq(cli_parse_duration("10ms", 10, &ms), 0);
    cr_assert_eq(ms, 10);
    cr_assert_eq(cli_parse_duration("9223372036854775807ms", INT64_MAX, &ms), 0);
    cr_assert_eq(ms, INT64_MAX);
    cr_assert_eq(cli_parse_duration("2562047788015h", INT64_MAX, &ms), 0);
    cr_assert_eq(ms, 2562047788015LL * 3600000);
    cr_assert_eq(cli_parse_duration("2562047788016h", INT64_MAX, &ms), -1);
}
