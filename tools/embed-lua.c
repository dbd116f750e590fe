/* embed-lua: turn the Lua scripts of lua/ into C arrays at build time (run by meson, native).
 *
 *   embed-lua OUT.c OUT.h PRELUDE.lua SCRIPT.lua...
 *
 * Each script becomes PRELUDE + SCRIPT, stored as a NUL-terminated byte array, with its name
 * (the file's base name) and length in redsem__script_defs[], indexed by the enum
 * REDSEM__SCRIPT_<NAME> written to OUT.h. Nothing is read from disk at run time.
 *
 * Each script's SHA1 (the name EVALSHA calls it by) is computed here with OpenSSL's
 * libcrypto, so that a client knows every script's SHA without asking the server: its first
 * call of a script is SCRIPT LOAD of the body pipelined before the EVALSHA (one round trip),
 * later calls are EVALSHA alone (src/node/script.c).
 *
 * The prelude is a header followed by helper blocks, each starting with a line
 * "-- @fn NAME". A block is copied into a script only if the script, or a block already
 * copied, calls NAME( : Lua creates a closure for every local function each time a script
 * runs, so unused helpers would cost time on every call. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

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

static void emit_bytes(FILE *f, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s0x%02x,", i % 16 == 0 ? "\n    " : " ", (unsigned char)p[i]);
}

/* Lower-case hex SHA1 of the script, as SCRIPT LOAD answers it. */
static void sha1_hex(const text *t, char out[41])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(t->p, t->len, md, &mdlen, EVP_sha1(), NULL) || mdlen != 20) {
        fprintf(stderr, "embed-lua: SHA1 failed\n");
        exit(1);
    }
    for (unsigned i = 0; i < 20; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: embed-lua OUT.c OUT.h PRELUDE.lua SCRIPT.lua...\n");
        return 2;
    }
    FILE *c = fopen(argv[1], "w"), *h = fopen(argv[2], "w");
    if (c == NULL || h == NULL) {
        perror("embed-lua: output");
        return 1;
    }
    size_t plen, header_len;
    char *prelude = slurp(argv[3], &plen);
    block blocks[64];
    size_t nblocks = split_prelude(prelude, plen, &header_len, blocks, 64);
    int n = argc - 4;
    char(*shas)[41] = calloc((size_t)n, sizeof *shas);
    if (shas == NULL) {
        fprintf(stderr, "embed-lua: out of memory\n");
        return 1;
    }

    fprintf(h, "/* Generated by tools/embed-lua.c from the scripts in lua/. Do not edit. */\n"
               "#ifndef REDSEM_LUA_SCRIPTS_H\n#define REDSEM_LUA_SCRIPTS_H\n\n"
               "#include <stddef.h>\n\n"
               "typedef struct redsem__script_def {\n"
               "    const char *name;\n    const char *text;\n    size_t len;\n"
               "    const char *sha; /* SHA1 of text, 40 lower-case hex digits */\n"
               "} redsem__script_def;\n\nenum {\n");
    fprintf(c, "/* Generated by tools/embed-lua.c from the scripts in lua/. Do not edit. */\n"
               "#include \"lua_scripts.h\"\n\n");
    for (int i = 0; i < n; i++) {
        char name[128], upper[128];
        base_name(argv[4 + i], name, sizeof name);
        for (size_t k = 0; k <= strlen(name); k++)
            upper[k] = (char)toupper((unsigned char)name[k]);
        fprintf(h, "    REDSEM__SCRIPT_%s = %d,\n", upper, i);
        size_t slen;
        char *body = slurp(argv[4 + i], &slen);
        int used[64] = {0}, changed = 1;
        while (changed) {
            changed = 0;
            for (size_t b = 0; b < nblocks; b++) {
                if (used[b])
                    continue;
                int need = calls(body, slen, blocks[b].name);
                for (size_t u = 0; u < nblocks && !need; u++)
                    need = used[u] && calls(blocks[u].text, blocks[u].len, blocks[b].name);
                if (need)
                    used[b] = changed = 1;
            }
        }
        text t = {NULL, 0, 0};
        append(&t, prelude, header_len);
        for (size_t b = 0; b < nblocks; b++)
            if (used[b])
                append(&t, blocks[b].text, blocks[b].len);
        append(&t, "\n", 1);
        append(&t, body, slen);
        fprintf(c, "static const char script_%s[] = {", name);
        emit_bytes(c, t.p, t.len);
        fprintf(c, "\n    0x00};\n\n");
        sha1_hex(&t, shas[i]);
        free(t.p);
        free(body);
    }
    fprintf(h, "    REDSEM__SCRIPT_COUNT = %d\n};\n\n"
               "extern const redsem__script_def redsem__script_defs[REDSEM__SCRIPT_COUNT];\n\n"
               "#endif\n", n);
    fprintf(c, "const redsem__script_def redsem__script_defs[%d] = {\n", n);
    for (int i = 0; i < n; i++) {
        char name[128];
        base_name(argv[4 + i], name, sizeof name);
        fprintf(c, "    {\"%s\", script_%s, sizeof script_%s - 1, \"%s\"},\n", name, name, name,
                shas[i]);
    }
    fprintf(c, "};\n");
    free(prelude);
    free(shas);
    if (fclose(c) != 0 || fclose(h) != 0) {
        perror("embed-lua: write");
        return 1;
    }
    return 0;
}
