/* redsem - status code names and texts, generated from REDSEM_ERRNO_MAP. */
#include "internal.h"

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
