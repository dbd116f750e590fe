/* redsem - names: status code names and texts (generated from REDSEM_ERRNO_MAP), versions,
 * strategy names, and the error text of a client's context. */
#include <stdio.h>
#include <string.h>

#include "base/base.h"

const char *redsem_strerror(int code)
{
    switch (code) {
#define REDSEM__ERR_TEXT(name, value, text)                                                    \
    case (value):                                                                              \
        return text;
        REDSEM_ERRNO_MAP(REDSEM__ERR_TEXT)
#undef REDSEM__ERR_TEXT
    default:
        return "unknown redsem status";
    }
}

const char *redsem_err_name(int code)
{
    switch (code) {
#define REDSEM__ERR_NAME(name, value, text)                                                    \
    case (value):                                                                              \
        return "REDSEM_" #name;
        REDSEM_ERRNO_MAP(REDSEM__ERR_NAME)
#undef REDSEM__ERR_NAME
    default:
        return "REDSEM_E?";
    }
}

bool redsem_is_fault(int code)
{
    return code <= -10;
}

unsigned redsem_version(void)
{
    return REDSEM_VERSION_HEX;
}

const char *redsem_version_string(void)
{
    return REDSEM_VERSION_STRING;
}

int redsem__ctx_err(redsem__ctx *ctx, int code, const char *fmt, ...)
{
    if (ctx != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
        va_end(ap);
    }
    return code;
}

static const char *const strategy_names[] = {"lock", "basic", "fair", "locked"};

const char *redsem_strategy_name(int strategy)
{
    if (strategy >= 0 && strategy <= 3)
        return strategy_names[strategy];
    return "?";
}

int redsem_strategy_parse(const char *name, redsem_strategy *ret_strategy)
{
    if (name == NULL || ret_strategy == NULL)
        return REDSEM_EINVAL;
    for (int s = REDSEM_STRATEGY_BASIC; s <= REDSEM_STRATEGY_LOCKED; s++) {
        if (strcmp(name, strategy_names[s]) == 0) {
            *ret_strategy = (redsem_strategy)s;
            return REDSEM_OK;
        }
    }
    return REDSEM_EINVAL;
}
