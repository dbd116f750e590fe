/* lua-prelude.h: how a script is assembled from lua/prelude.lua and its body, shared by
 * tools/embed-lua.c (which embeds the scripts) and tests/check-lua-keys.c (which checks the
 * same text Redis runs). Static functions: each program includes it once. Build-time tools
 * only: they exit on an error.
 *
 * The prelude is a header followed by helper blocks, each starting with a line
 * "-- @fn NAME". A block is copied into a script only if the script, or a block already
 * copied, calls NAME( : Lua creates a closure for every local function each time a script
 * runs, so unused helpers would cost time on every call. */
#ifndef REDSEM_TOOLS_LUA_PRELUDE_H
#define REDSEM_TOOLS_LUA_PRELUDE_H

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(1);
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap)
            buf = realloc(buf, cap *= 2);
    }
    if (buf == NULL || ferror(f)) {
        fprintf(stderr, "embed-lua: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    *len = n;
    return buf;
}

static void base_name(const char *path, char *out, size_t outlen)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strcspn(b, ".");
    if (n >= outlen)
        n = outlen - 1;
    memcpy(out, b, n);
    out[n] = '\0';
}

typedef struct block {
    char name[64];
    const char *text;
    size_t len;
} block;

/* Split the prelude into its header and its "-- @fn NAME" blocks. */
static size_t split_prelude(const char *p, size_t len, size_t *header_len, block *blocks,
                            size_t max)
{
    static const char marker[] = "-- @fn ";
    size_t n = 0;
    *header_len = len;
    for (size_t i = 0; i + sizeof marker - 1 <= len; i++) {
        if ((i == 0 || p[i - 1] == '\n') && memcmp(p + i, marker, sizeof marker - 1) == 0) {
            if (n == 0)
                *header_len = i;
            else
                blocks[n - 1].len = (size_t)(p + i - blocks[n - 1].text);
            if (n == max) {
                fprintf(stderr, "embed-lua: too many prelude blocks\n");
                exit(1);
            }
            size_t k = 0, j = i + sizeof marker - 1;
            while (j < len && p[j] != '\n' && p[j] != ' ' && k + 1 < sizeof blocks[n].name)
                blocks[n].name[k++] = p[j++];
            blocks[n].name[k] = '\0';
            blocks[n].text = p + i;
            n++;
        }
    }
    if (n > 0)
        blocks[n - 1].len = (size_t)(p + len - blocks[n - 1].text);
    return n;
}

/* Does text call name( , with name not part of a longer identifier? */
static int calls(const char *text, size_t len, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl < len; i++) {
        if (memcmp(text + i, name, nl) == 0 && text[i + nl] == '(' &&
            (i == 0 || !(isalnum((unsigned char)text[i - 1]) || text[i - 1] == '_')) &&
            !(i >= 15 && memcmp(text + i - 15, "local function ", 15) == 0))
            return 1;
    }
    return 0;
}

/* The script as sent to Redis, accumulated to be emitted and hashed. */
typedef struct text {
    char *p;
    size_t len, cap;
} text;

static void append(text *t, const char *p, size_t n)
{
    if (t->len + n > t->cap) {
        t->cap = (t->len + n) * 2;
        t->p = realloc(t->p, t->cap);
        if (t->p == NULL) {
            fprintf(stderr, "embed-lua: out of memory\n");
            exit(1);
        }
    }
    memcpy(t->p + t->len, p, n);
    t->len += n;
}

/* The script as sent to Redis: the prelude's header, the blocks the body calls, "\n", the
 * body. t must start empty ({NULL, 0, 0}). */
static void assemble(text *t, const char *prelude, size_t header_len, const block *blocks,
                     size_t nblocks, const char *body, size_t blen)
{
    int used[64] = {0}, changed = 1;
    while (changed) {
        changed = 0;
        for (size_t b = 0; b < nblocks; b++) {
            if (used[b])
                continue;
            int need = calls(body, blen, blocks[b].name);
            for (size_t u = 0; u < nblocks && !need; u++)
                need = used[u] && calls(blocks[u].text, blocks[u].len, blocks[b].name);
            if (need)
                used[b] = changed = 1;
        }
    }
    append(t, prelude, header_len);
    for (size_t b = 0; b < nblocks; b++)
        if (used[b])
            append(t, blocks[b].text, blocks[b].len);
    append(t, "\n", 1);
    append(t, body, blen);
}

#endif
