/* redsem - allocation wrappers (one place to add an allocator hook later). */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

void *redsem__malloc(size_t size)
{
    return malloc(size ? size : 1);
}

void *redsem__calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *redsem__realloc(void *p, size_t size)
{
    return realloc(p, size ? size : 1);
}

char *redsem__memdup0(const void *p, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *s = redsem__malloc(len + 1);
    if (s == NULL)
        return NULL;
    if (len)
        memcpy(s, p, len);
    s[len] = '\0';
    return s;
}

char *redsem__strdup(const char *s)
{
    return s ? redsem__memdup0(s, strlen(s)) : NULL;
}

void redsem__free(void *p)
{
    free(p);
}
