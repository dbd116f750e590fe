/* check-lua-keys: every key a script reads or writes must be one it was given in KEYS.
 *
 *   check-lua-keys PRELUDE.lua SCRIPT.lua...
 *
 * Redis requires a script to name in KEYS every key it touches (a cluster routes the script
 * by them, ACLs and proxies read them). Each script is checked as Redis runs it: the
 * prelude's header, the helpers it calls and its body (tools/lua-prelude.h, as
 * tools/embed-lua.c assembles it). The key argument of each redis.call or redis.pcall (the
 * argument after the command's name), and each argument that a local function passes on to
 * such a key argument, must be:
 *   - a KEYS[...] expression, or KEYS itself (a table of keys), or a table constructor of
 *     such expressions ({meta, owners}), or "cond and <such>";
 *   - a name every definition of which is such an expression (local a, b = KEYS[1], KEYS[2]),
 *     a parameter of a function (then every call of that function is checked at that
 *     position), or the value of a for-in loop over ipairs(<such>).
 * Anything else fails, and a key built from ARGV or by concatenation (..) says so. Names are
 * resolved by function (the innermost function that defines the name, then the enclosing
 * ones), not by block: within one function, a name defined anywhere from anything else is
 * not a key (a conservative rule: rename a variable that clashes). A small tokenizer, not a Lua parser:
 * it knows the forms the scripts of lua/ use. Exit 0 when every script passes, 1 otherwise. */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function" /* lua-prelude.h's base_name */
#endif
#include "lua-prelude.h"

enum { T_NAME, T_NUM, T_STR, T_OP };

typedef struct tok {
    int type;
    char s[64]; /* the text (cut); strings: their quoted text is not needed */
    int line;
    int func; /* index of the innermost enclosing function, -1 none */
} tok;

typedef struct func {
    char name[64]; /* "" for an anonymous function */
    char params[16][64];
    int nparams;
    int keyparam[16]; /* 1: flows to a key argument */
    int parent;       /* the enclosing function, -1 the script's main chunk */
} func;

enum { D_PARAM, D_EXPR, D_ELEM, D_UNCLEAN };
typedef struct def {
    char name[64];
    int kind;
    int a, b; /* D_EXPR: tokens [a, b); D_ELEM: the iterated expression [a, b) */
    int func, param; /* D_PARAM */
    int scope;       /* the function it is defined in, -1 the main chunk */
} def;

static tok *T;
static int nt;
static func F[256];
static int nf;
static def D[4096];
static int nd;

static int is(int i, const char *s)
{
    return i >= 0 && i < nt && strcmp(T[i].s, s) == 0 && T[i].type != T_STR;
}

static void add_tok(int type, const char *p, size_t n, int line)
{
    static int cap;
    if (nt == cap) {
        cap = cap ? cap * 2 : 1024;
        T = realloc(T, (size_t)cap * sizeof *T);
        if (T == NULL)
            exit(2);
    }
    tok *t = &T[nt++];
    t->type = type;
    if (n >= sizeof t->s)
        n = sizeof t->s - 1;
    memcpy(t->s, p, n);
    t->s[n] = '\0';
    t->line = line;
    t->func = -1;
}

/* Long bracket [[...]] / [==[...]==] at p (p[0] == '['): its length, 0 if none. */
static size_t long_bracket(const char *p, size_t left)
{
    size_t lvl = 1;
    while (lvl < left && p[lvl] == '=')
        lvl++;
    if (lvl >= left || p[lvl] != '[')
        return 0;
    size_t eq = lvl - 1;
    for (size_t i = lvl + 1; i + eq + 1 < left; i++)
        if (p[i] == ']') {
            size_t j = 1;
            while (j <= eq && p[i + j] == '=')
                j++;
            if (j == eq + 1 && p[i + j] == ']')
                return i + j + 1;
        }
    return left;
}

static void tokenize(const char *p, size_t len)
{
    int line = 1;
    size_t i = 0;
    while (i < len) {
        char ch = p[i];
        if (ch == '\n') {
            line++;
            i++;
        } else if (isspace((unsigned char)ch)) {
            i++;
        } else if (ch == '-' && i + 1 < len && p[i + 1] == '-') {
            size_t lb = (i + 2 < len && p[i + 2] == '[') ? long_bracket(p + i + 2, len - i - 2) : 0;
            size_t end = lb ? i + 2 + lb : i;
            if (!lb)
                while (end < len && p[end] != '\n')
                    end++;
            for (size_t k = i; k < end; k++)
                line += p[k] == '\n';
            i = end;
        } else if (isalpha((unsigned char)ch) || ch == '_') {
            size_t j = i;
            while (j < len && (isalnum((unsigned char)p[j]) || p[j] == '_'))
                j++;
            add_tok(T_NAME, p + i, j - i, line);
            i = j;
        } else if (isdigit((unsigned char)ch)) {
            size_t j = i;
            while (j < len && (isalnum((unsigned char)p[j]) || p[j] == '.'))
                j++;
            add_tok(T_NUM, p + i, j - i, line);
            i = j;
        } else if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < len && p[j] != ch) {
                if (p[j] == '\\')
                    j++;
                j++;
            }
            add_tok(T_STR, p + i + 1, j - i - 1 < len ? j - i - 1 : 0, line);
            i = j + 1;
        } else if (ch == '[' && long_bracket(p + i, len - i)) {
            size_t lb = long_bracket(p + i, len - i);
            add_tok(T_STR, "", 0, line);
            for (size_t k = i; k < i + lb; k++)
                line += p[k] == '\n';
            i += lb;
        } else {
            static const char *const ops[] = {"...", "..", "==", "~=", "<=", ">=", NULL};
            size_t n = 1;
            for (int k = 0; ops[k]; k++)
                if (strncmp(p + i, ops[k], strlen(ops[k])) == 0) {
                    n = strlen(ops[k]);
                    break;
                }
            add_tok(T_OP, p + i, n, line);
            i += n;
        }
    }
}

static int is_keyword(const char *s)
{
    static const char *const kw[] = {"and", "break", "do", "else", "elseif", "end", "false",
                                     "for", "function", "if", "in", "local", "nil", "not",
                                     "or", "repeat", "return", "then", "true", "until",
                                     "while", NULL};
    for (int k = 0; kw[k]; k++)
        if (strcmp(s, kw[k]) == 0)
            return 1;
    return 0;
}

/* The matching close of the bracket at i; nt if none. */
static int close_of(int i)
{
    int depth = 0;
    for (int j = i; j < nt; j++) {
        if (T[j].type != T_OP)
            continue;
        if (is(j, "(") || is(j, "[") || is(j, "{"))
            depth++;
        else if (is(j, ")") || is(j, "]") || is(j, "}"))
            if (--depth == 0)
                return j;
    }
    return nt;
}

static int binary_op(int i)
{
    static const char *const ops[] = {"..", "+", "-", "*", "/", "%", "^", "==", "~=", "<",
                                      ">", "<=", ">=", "and", "or", NULL};
    for (int k = 0; ops[k]; k++)
        if (is(i, ops[k]))
            return 1;
    return 0;
}

/* The end (exclusive) of the expression starting at i. */
static int expr_end(int i)
{
    int want_operand = 1;
    while (i < nt) {
        if (want_operand) {
            if (is(i, "not") || is(i, "-") || is(i, "#")) {
                i++;
                continue;
            }
            if (is(i, "(") || is(i, "{")) {
                i = close_of(i) + 1;
            } else if (T[i].type == T_NAME || T[i].type == T_NUM || T[i].type == T_STR ||
                       is(i, "...")) {
                if (T[i].type == T_NAME && is_keyword(T[i].s) && !is(i, "nil") &&
                    !is(i, "true") && !is(i, "false"))
                    return i;
                i++;
            } else {
                return i;
            }
            want_operand = 0;
        } else if (binary_op(i)) {
            want_operand = 1;
            i++;
        } else if (is(i, "(") || is(i, "[") || is(i, "{")) {
            i = close_of(i) + 1;
        } else if (is(i, ".") || is(i, ":")) {
            i += 2;
        } else if (T[i].type == T_STR) {
            i++;
        } else {
            return i;
        }
    }
    return i;
}

static int cur; /* scan(): the function being scanned */

static void add_def(const char *name, int kind, int a, int b, int fn, int param)
{
    if (nd == (int)(sizeof D / sizeof D[0]))
        exit(2);
    def *d = &D[nd++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->kind = kind;
    d->a = a;
    d->b = b;
    d->func = fn;
    d->param = param;
    d->scope = kind == D_PARAM ? fn : cur;
}

/* Functions, their parameters, block nesting, and every definition of a name. */
static void scan(void)
{
    int stack[512], sp = 0; /* function index, or -1 for another block */
    cur = -1;
    for (int i = 0; i < nt; i++) {
        T[i].func = cur;
        if (T[i].type != T_NAME && !is(i, "="))
            continue;
        if (is(i, "function")) {
            func *f = &F[nf];
            memset(f, 0, sizeof *f);
            f->parent = cur;
            int j = i + 1;
            if (T[j].type == T_NAME && !is(j, "("))
                snprintf(f->name, sizeof f->name, "%s", T[j++].s);
            while (is(j, ".") || is(j, ":"))
                j += 2;
            if (is(j, "("))
                for (j++; j < nt && !is(j, ")"); j++)
                    if (T[j].type == T_NAME && f->nparams < 16) {
                        snprintf(f->params[f->nparams], 64, "%s", T[j].s);
                        add_def(T[j].s, D_PARAM, 0, 0, nf, f->nparams);
                        f->nparams++;
                    }
            stack[sp++] = nf;
            cur = nf++;
            if (nf == (int)(sizeof F / sizeof F[0]))
                exit(2);
            i = j;
            continue;
        }
        if (is(i, "if") || is(i, "do") || is(i, "repeat")) {
            stack[sp++] = -1;
        } else if (is(i, "end") || is(i, "until")) {
            if (sp > 0)
                sp--;
            cur = -1;
            for (int k = sp - 1; k >= 0; k--)
                if (stack[k] >= 0) {
                    cur = stack[k];
                    break;
                }
        } else if (is(i, "for")) {
            /* for a, b in EXPR do | for i = ... do */
            int j = i + 1, names[4], n = 0;
            while (T[j].type == T_NAME && n < 4) {
                names[n++] = j++;
                if (!is(j, ","))
                    break;
                j++;
            }
            if (is(j, "in")) {
                int a = j + 1, b = expr_end(a);
                /* ipairs(X) / pairs(X): the loop's value is an element of X */
                bool ip = (is(a, "ipairs") || is(a, "pairs")) && is(a + 1, "(");
                for (int k = 0; k < n; k++) {
                    if (ip && k == 1)
                        add_def(T[names[k]].s, D_ELEM, a + 2, close_of(a + 1), -1, 0);
                    else
                        add_def(T[names[k]].s, D_UNCLEAN, 0, 0, -1, 0);
                }
                (void)b;
            } else {
                for (int k = 0; k < n; k++)
                    add_def(T[names[k]].s, D_UNCLEAN, 0, 0, -1, 0);
            }
        } else if (is(i, "=") && T[i].type == T_OP) {
            /* an assignment: NAME (, NAME)* = EXPR (, EXPR)*, unless inside a table
             * constructor (a field) or with a field or index on the left */
            int depth = 0;
            for (int k = i - 1; k >= 0; k--) {
                if (is(k, "}") || is(k, ")") || is(k, "]"))
                    depth--;
                else if (is(k, "{") || is(k, "(") || is(k, "["))
                    if (++depth > 0)
                        break;
                if (T[k].line < T[i].line - 50)
                    break;
            }
            if (depth > 0)
                continue; /* a field of a table constructor */
            int names[16], n = 0, k = i - 1;
            while (k >= 0 && T[k].type == T_NAME && !is_keyword(T[k].s) && n < 16) {
                if (k > 0 && (is(k - 1, ".") || is(k - 1, ":")))
                    break;
                names[n++] = k;
                if (!is(k - 1, ","))
                    break;
                k -= 2;
            }
            if (n == 0 || (k > 0 && (is(k - 1, ".") || is(k - 1, ":"))) ||
                (is(i - 1, "]")))
                continue; /* a field or an index: no name defined */
            /* names[n - 1] is the first on the left; past the last expression, the rest
             * of a call's results (not keys) */
            int a = i + 1;
            bool more = true;
            for (int m = n - 1; m >= 0; m--) {
                if (!more) {
                    add_def(T[names[m]].s, D_UNCLEAN, 0, 0, -1, 0);
                    continue;
                }
                int b = expr_end(a);
                add_def(T[names[m]].s, D_EXPR, a, b, -1, 0);
                if (is(b, ","))
                    a = b + 1;
                else
                    more = false;
            }
        }
    }
}

static const char *why; /* the reason of the last unclean verdict */
static int body_line;   /* the assembled script's line where the file's body starts */

/* "FILE:LINE" of a token: in the file checked, or in the prelude (a helper) */
static void where(const char *file, int line)
{
    if (line >= body_line)
        fprintf(stderr, "%s:%d", file, line - body_line + 1);
    else
        fprintf(stderr, "%s: a prelude helper (line %d of the script as assembled)", file, line);
}

static int clean_expr(int a, int b, int depth);

/* The definitions of name seen from function scope: those of the innermost function (from
 * scope outwards) that has any; the level found, or -2 for none. */
static int level_of(const char *name, int scope)
{
    for (int f = scope;; f = F[f].parent) {
        for (int d = 0; d < nd; d++)
            if (D[d].scope == f && strcmp(D[d].name, name) == 0)
                return f;
        if (f < 0)
            return -2;
    }
}

static int find_func(const char *name)
{
    for (int f = nf - 1; f >= 0; f--)
        if (strcmp(F[f].name, name) == 0)
            return f;
    return -1;
}

static int clean_name(const char *name, int scope, int depth)
{
    if (depth > 32)
        return 0;
    int found = 0, level = level_of(name, scope);
    for (int d = 0; d < nd && level != -2; d++) {
        if (D[d].scope != level || strcmp(D[d].name, name) != 0)
            continue;
        found = 1;
        switch (D[d].kind) {
        case D_PARAM:
            /* a parameter: clean here, its callers are checked at this position */
            F[D[d].func].keyparam[D[d].param] = 1;
            break;
        case D_EXPR:
        case D_ELEM:
            if (!clean_expr(D[d].a, D[d].b, depth + 1))
                return 0;
            break;
        default:
            why = "not a KEYS[...] expression";
            return 0;
        }
    }
    if (!found) {
        if (strcmp(name, "KEYS") == 0)
            return 1;
        why = "not a KEYS[...] expression";
        return 0;
    }
    return 1;
}

static int contains(int a, int b, const char *s)
{
    for (int i = a; i < b; i++)
        if (is(i, s))
            return 1;
    return 0;
}

static int clean_expr(int a, int b, int depth)
{
    while (b - a >= 2 && is(a, "(") && close_of(a) == b - 1) {
        a++;
        b--;
    }
    if (b <= a) {
        why = "empty";
        return 0;
    }
    if (contains(a, b, "ARGV")) {
        why = "built from ARGV";
        return 0;
    }
    /* top-level or / and: cond and KEYS-thing, x or y */
    for (int i = a, dep = 0; i < b; i++) {
        if (is(i, "(") || is(i, "{") || is(i, "["))
            dep++;
        else if (is(i, ")") || is(i, "}") || is(i, "]"))
            dep--;
        else if (dep == 0 && is(i, "or"))
            return clean_expr(a, i, depth) && clean_expr(i + 1, b, depth);
    }
    for (int i = b - 1, dep = 0; i >= a; i--) {
        if (is(i, ")") || is(i, "}") || is(i, "]"))
            dep++;
        else if (is(i, "(") || is(i, "{") || is(i, "["))
            dep--;
        else if (dep == 0 && is(i, "and"))
            return clean_expr(i + 1, b, depth); /* the condition is not a key */
    }
    if (b - a == 1 && (is(a, "nil") || is(a, "false")))
        return 1;
    if (contains(a, b, "..")) {
        why = "built by concatenation";
        return 0;
    }
    if (b - a == 1 && T[a].type == T_NAME)
        return clean_name(T[a].s, T[a].func, depth);
    if (is(a, "KEYS") && is(a + 1, "[") && close_of(a + 1) == b - 1)
        return 1;
    if (is(a, "{") && close_of(a) == b - 1) {
        for (int i = a + 1; i < b - 1;) {
            int e = expr_end(i);
            if (e == i || !clean_expr(i, e, depth))
                return 0;
            i = is(e, ",") ? e + 1 : e;
        }
        return 1;
    }
    why = "not a KEYS[...] expression";
    return 0;
}

/* The arguments of the call whose '(' is at i: their [start, end) in s/e; their count. */
static int call_args(int i, int *s, int *e, int max)
{
    int close = close_of(i), n = 0;
    for (int j = i + 1; j < close && n < max;) {
        int k = expr_end(j);
        if (k == j)
            k = j + 1;
        s[n] = j;
        e[n++] = k;
        j = is(k, ",") ? k + 1 : k;
        if (k > close)
            break;
    }
    return n;
}

/* One pass over every key site; report: print failures. The number of failures. */
static int check_sites(const char *file, int report)
{
    int bad = 0;
    for (int i = 0; i + 3 < nt; i++) {
        int s[32], e[32], n, key = -1;
        if (is(i, "redis") && is(i + 1, ".") && (is(i + 2, "call") || is(i + 2, "pcall")) &&
            is(i + 3, "(")) {
            n = call_args(i + 3, s, e, 32);
            if (n >= 2)
                key = 1;
            if (key >= 0 && !clean_expr(s[key], e[key], 0)) {
                bad++;
                if (report) {
                    where(file, T[i].line);
                    fprintf(stderr, ": key argument of redis.%s %s:", T[i + 2].s, why);
                    for (int k = s[key]; k < e[key]; k++)
                        fprintf(stderr, " %s", T[k].s);
                    fprintf(stderr, "\n");
                }
            }
            continue;
        }
        if (T[i].type == T_NAME && is(i + 1, "(") && !is(i - 1, "function") &&
            !is(i - 1, ".") && !is(i - 1, ":")) {
            int f = find_func(T[i].s);
            if (f < 0)
                continue;
            n = call_args(i + 1, s, e, 32);
            for (int p = 0; p < n && p < F[f].nparams; p++)
                if (F[f].keyparam[p] && !clean_expr(s[p], e[p], 0)) {
                    bad++;
                    if (report) {
                        where(file, T[i].line);
                        fprintf(stderr, ": argument %d of %s() (a key there) %s:", p + 1,
                                T[i].s, why);
                        for (int k = s[p]; k < e[p]; k++)
                            fprintf(stderr, " %s", T[k].s);
                        fprintf(stderr, "\n");
                    }
                }
        }
    }
    return bad;
}

static int check(const char *file, const char *script, size_t len)
{
    nt = nf = nd = 0;
    tokenize(script, len);
    scan();
    /* key parameters only grow: repeat until they stop, then report */
    for (int round = 0; round < 16; round++) {
        int before = 0, after = 0;
        for (int f = 0; f < nf; f++)
            for (int p = 0; p < F[f].nparams; p++)
                before += F[f].keyparam[p];
        (void)check_sites(file, 0);
        for (int f = 0; f < nf; f++)
            for (int p = 0; p < F[f].nparams; p++)
                after += F[f].keyparam[p];
        if (after == before)
            break;
    }
    int sites = 0;
    for (int i = 0; i + 3 < nt; i++)
        sites += is(i, "redis") && is(i + 1, ".") && (is(i + 2, "call") || is(i + 2, "pcall"));
    if (sites == 0) {
        fprintf(stderr, "%s: no redis.call found: is this a script?\n", file);
        return 1;
    }
    return check_sites(file, 1) > 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: check-lua-keys PRELUDE.lua SCRIPT.lua...\n");
        return 2;
    }
    size_t plen, header_len;
    char *prelude = slurp(argv[1], &plen);
    block blocks[64];
    size_t nblocks = split_prelude(prelude, plen, &header_len, blocks, 64);
    int failed = 0;
    for (int i = 2; i < argc; i++) {
        size_t blen;
        char *body = slurp(argv[i], &blen);
        text t = {NULL, 0, 0};
        assemble(&t, prelude, header_len, blocks, nblocks, body, blen);
        body_line = 1;
        for (size_t k = 0; k < t.len - blen; k++)
            body_line += t.p[k] == '\n';
        if (check(argv[i], t.p, t.len))
            failed++;
        else
            printf("ok %s\n", argv[i]);
        free(t.p);
        free(body);
    }
    free(prelude);
    free(T);
    return failed ? 1 : 0;
}
