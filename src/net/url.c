/* redsem - connection URLs:
 *   redis://[user[:password]@]host[:port][/db]         (rediss:// the same over TLS)
 *   unix://[user[:password]@]/absolute/path[?db=N]
 *   redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER
 *       [?db=N][&sentinel_user=U&sentinel_password=P]  (rediss+sentinel:// over TLS)
 *   redis+cluster://[user[:password]@]host[:port][,host[:port]...][/]
 *                                                      (rediss+cluster:// over TLS)
 * user, password and path may be percent-encoded. Strict: anything else is EINVAL. */
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "net/net.h"

#define SUN_PATH_MAX 107 /* sizeof(sockaddr_un.sun_path) - 1 on Linux */

static int fail(char *err, size_t errlen, const char *why)
{
    if (err && errlen)
        snprintf(err, errlen, "invalid URL: %s", why);
    return REDSEM_EINVAL;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Percent-decode [s, s+len) into a new string; fails on bad escapes or a decoded NUL. */
static int decode(const char *s, size_t len, char **out)
{
    char *d = redsem__malloc(len + 1);
    if (d == NULL)
        return REDSEM_ENOMEM;
    size_t j = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%') {
            if (len - i < 3) {
                redsem__free(d);
                return REDSEM_EINVAL;
            }
            int h = hexval(s[i + 1]), l = hexval(s[i + 2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0)) {
                redsem__free(d);
                return REDSEM_EINVAL;
            }
            d[j++] = (char)(h * 16 + l);
            i += 2;
        } else {
            d[j++] = s[i];
        }
    }
    d[j] = '\0';
    *out = d;
    return REDSEM_OK;
}

/* Decimal in [lo, hi], whole span, no sign, no leading garbage. */
static bool parse_num(const char *s, size_t len, long lo, long hi, long *out)
{
    if (len == 0 || len > 10)
        return false;
    long long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = (long)v;
    return true;
}

static bool host_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '.' || ch == '_';
}

static bool printable(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x21 || ch > 0x7e)
            return false;
    }
    return true;
}

/* userinfo "user[:password]" (may be empty before '@'). */
static int parse_userinfo(const char *s, size_t len, redsem__endpoint *ep, char *err,
                          size_t errlen)
{
    const char *colon = memchr(s, ':', len);
    size_t ulen = colon ? (size_t)(colon - s) : len;
    int rc;
    if (ulen > 0) {
        rc = decode(s, ulen, &ep->user);
        if (rc != REDSEM_OK)
            return rc == REDSEM_ENOMEM ? rc : fail(err, errlen, "bad %-escape in user");
    }
    if (colon) {
        size_t plen = len - ulen - 1;
        rc = decode(colon + 1, plen, &ep->password);
        if (rc != REDSEM_OK)
            return rc == REDSEM_ENOMEM ? rc : fail(err, errlen, "bad %-escape in password");
        if (ep->password[0] == '\0')
            return fail(err, errlen, "empty password after ':'");
    } else if (ulen > 0) {
        /* "user@" alone: Redis has no user-only AUTH; treat it as a password-less user. */
        return fail(err, errlen, "a user needs a password (user:password@)");
    }
    return REDSEM_OK;
}

/* host[:port] or [v6][:port] in [s, s+len): a new string in *host. */
static int parse_hostport(const char *host, size_t hlen, int default_port, char **out_host,
                          int *out_port, char *err, size_t errlen)
{
    const char *hend = host + hlen;
    const char *portp = NULL;
    size_t name_len;
    const char *name = host;
    if (hlen > 0 && host[0] == '[') {
        const char *rb = memchr(host, ']', hlen);
        if (rb == NULL)
            return fail(err, errlen, "unterminated [IPv6] host");
        name = host + 1;
        name_len = (size_t)(rb - name);
        if (name_len == 0)
            return fail(err, errlen, "empty [IPv6] host");
        for (size_t i = 0; i < name_len; i++) {
            char ch = name[i];
            if (!(hexval(ch) >= 0 || ch == ':' || ch == '.'))
                return fail(err, errlen, "bad character in [IPv6] host");
        }
        if (rb + 1 < hend) {
            if (rb[1] != ':')
                return fail(err, errlen, "garbage after ]");
            portp = rb + 2;
        }
    } else {
        const char *colon = memchr(host, ':', hlen);
        name_len = colon ? (size_t)(colon - host) : hlen;
        if (colon)
            portp = colon + 1;
        for (size_t i = 0; i < name_len; i++)
            if (!host_char(host[i]))
                return fail(err, errlen, "bad character in host");
    }
    if (name_len == 0)
        return fail(err, errlen, "missing host");
    if (name_len > 253)
        return fail(err, errlen, "host name too long");
    long port = default_port;
    if (portp && !parse_num(portp, (size_t)(hend - portp), 1, 65535, &port))
        return fail(err, errlen, "port must be 1..65535");
    *out_host = redsem__memdup0(name, name_len);
    if (*out_host == NULL)
        return REDSEM_ENOMEM;
    *out_port = (int)port;
    return REDSEM_OK;
}

/* The authority "[userinfo@]rest": userinfo into ep; *rest, *rest_len what follows '@'. */
static int split_userinfo(const char *p, size_t alen, redsem__endpoint *ep, const char **rest,
                          size_t *rest_len, char *err, size_t errlen)
{
    const char *at = NULL;
    for (size_t i = 0; i < alen; i++) /* up to the last '@' */
        if (p[i] == '@')
            at = p + i;
    *rest = p;
    if (at) {
        int rc = parse_userinfo(p, (size_t)(at - p), ep, err, errlen);
        if (rc != REDSEM_OK)
            return rc;
        *rest = at + 1;
    }
    *rest_len = alen - (size_t)(*rest - p);
    return REDSEM_OK;
}

static int parse_redis(const char *p, redsem__endpoint *ep, char *err, size_t errlen)
{
    /* authority ends at the first '/' */
    const char *slash = strchr(p, '/');
    size_t alen = slash ? (size_t)(slash - p) : strlen(p);
    if (memchr(p, '?', alen) || memchr(p, '#', alen))
        return fail(err, errlen, "redis:// URLs take no query; use /db");
    const char *host;
    size_t hlen;
    int rc = split_userinfo(p, alen, ep, &host, &hlen, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    int port;
    rc = parse_hostport(host, hlen, 6379, &ep->host, &port, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    long db = 0;
    if (slash && slash[1] != '\0' && !parse_num(slash + 1, strlen(slash + 1), 0, 2147483647, &db))
        return fail(err, errlen, "database must be a number 0..2147483647 after '/'");
    ep->kind = REDSEM__EP_TCP;
    ep->port = port;
    ep->db = db;
    return REDSEM_OK;
}

/* "host[:port][,host[:port]...]" in [list, list+llen) into ep->hosts (at most
 * REDSEM__HOSTS_MAX; what names them in err). */
static int parse_hostlist(const char *list, size_t llen, int default_port, const char *what,
                          redsem__endpoint *ep, char *err, size_t errlen)
{
    size_t n = 1;
    for (size_t i = 0; i < llen; i++)
        n += list[i] == ',';
    if (n > REDSEM__HOSTS_MAX) {
        char why[64];
        snprintf(why, sizeof why, "more than %d %s", REDSEM__HOSTS_MAX, what);
        return fail(err, errlen, why);
    }
    ep->hosts = redsem__calloc(n, sizeof *ep->hosts);
    if (ep->hosts == NULL)
        return REDSEM_ENOMEM;
    const char *s = list, *end = list + llen;
    while (ep->nhosts < n) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *e = comma ? comma : end;
        redsem__hostport *hp = &ep->hosts[ep->nhosts];
        int rc = parse_hostport(s, (size_t)(e - s), default_port, &hp->host, &hp->port, err,
                                errlen);
        if (rc != REDSEM_OK)
            return rc;
        ep->nhosts++;
        s = e + 1;
    }
    return REDSEM_OK;
}

/* redis+cluster://[user[:password]@]host[:port][,host[:port]...][/]: the seed nodes, tried
 * in turn for the slot map; the credentials are every node's. No database (a cluster has
 * only 0), no query. */
static int parse_cluster(const char *p, redsem__endpoint *ep, char *err, size_t errlen)
{
    const char *slash = strchr(p, '/');
    size_t alen = slash ? (size_t)(slash - p) : strlen(p);
    if (slash != NULL && slash[1] != '\0')
        return fail(err, errlen, "a cluster URL has no database or path (a cluster has only "
                                 "database 0)");
    if (memchr(p, '?', alen) || memchr(p, '#', alen))
        return fail(err, errlen, "a cluster URL takes no query");
    const char *list;
    size_t llen;
    int rc = split_userinfo(p, alen, ep, &list, &llen, err, errlen);
    if (rc == REDSEM_OK)
        rc = parse_hostlist(list, llen, 6379, "seed nodes", ep, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    ep->kind = REDSEM__EP_CLUSTER;
    return REDSEM_OK;
}

/* redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[?query]
 * query: db=N, sentinel_user=U, sentinel_password=P (percent-encoded), joined by '&'. */
static int parse_sentinel(const char *p, redsem__endpoint *ep, char *err, size_t errlen)
{
    const char *slash = strchr(p, '/');
    if (slash == NULL)
        return fail(err, errlen, "a Sentinel URL names its primary: .../MASTERNAME");
    size_t alen = (size_t)(slash - p);
    if (memchr(p, '?', alen) || memchr(p, '#', alen))
        return fail(err, errlen, "the query comes after /MASTERNAME");
    const char *list;
    size_t llen;
    int rc = split_userinfo(p, alen, ep, &list, &llen, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    rc = parse_hostlist(list, llen, 26379, "Sentinels", ep, err, errlen);
    if (rc != REDSEM_OK)
        return rc;
    const char *name = slash + 1;
    const char *q = strchr(name, '?');
    size_t nlen = q ? (size_t)(q - name) : strlen(name);
    if (nlen == 0 || nlen > 255)
        return fail(err, errlen, "the primary's name (after '/') must be 1..255 characters");
    for (size_t i = 0; i < nlen; i++)
        if (!host_char(name[i]))
            return fail(err, errlen, "bad character in the primary's name");
    if ((ep->master = redsem__memdup0(name, nlen)) == NULL)
        return REDSEM_ENOMEM;
    bool db_seen = false;
    for (const char *kv = q ? q + 1 : NULL; kv != NULL && *kv != '\0';) {
        const char *amp = strchr(kv, '&');
        size_t kvlen = amp ? (size_t)(amp - kv) : strlen(kv);
        const char *eq = memchr(kv, '=', kvlen);
        if (eq == NULL)
            return fail(err, errlen, "query items are key=value");
        size_t klen = (size_t)(eq - kv), vlen = kvlen - klen - 1;
        const char *v = eq + 1;
        if (klen == 2 && memcmp(kv, "db", 2) == 0 && !db_seen) {
            db_seen = true;
            if (!parse_num(v, vlen, 0, 2147483647, &ep->db))
                return fail(err, errlen, "db must be a number 0..2147483647");
        } else if (klen == 13 && memcmp(kv, "sentinel_user", 13) == 0 && ep->sentinel_user == NULL) {
            rc = decode(v, vlen, &ep->sentinel_user);
            if (rc != REDSEM_OK || ep->sentinel_user[0] == '\0')
                return rc == REDSEM_ENOMEM ? rc : fail(err, errlen, "bad sentinel_user");
        } else if (klen == 17 && memcmp(kv, "sentinel_password", 17) == 0 &&
                   ep->sentinel_password == NULL) {
            rc = decode(v, vlen, &ep->sentinel_password);
            if (rc != REDSEM_OK || ep->sentinel_password[0] == '\0')
                return rc == REDSEM_ENOMEM ? rc : fail(err, errlen, "bad sentinel_password");
        } else {
            return fail(err, errlen, "the query takes db, sentinel_user and sentinel_password, "
                                     "each once");
        }
        kv = amp ? amp + 1 : NULL;
    }
    if (ep->sentinel_user != NULL && ep->sentinel_password == NULL)
        return fail(err, errlen, "sentinel_user needs sentinel_password");
    ep->kind = REDSEM__EP_SENTINEL;
    return REDSEM_OK;
}

static int parse_unix(const char *p, redsem__endpoint *ep, char *err, size_t errlen)
{
    const char *path = p;
    if (p[0] != '/') {
        const char *at = strchr(p, '@');
        if (at == NULL)
            return fail(err, errlen, "unix:// needs an absolute path (unix:///path/to.sock)");
        int rc = parse_userinfo(p, (size_t)(at - p), ep, err, errlen);
        if (rc != REDSEM_OK)
            return rc;
        path = at + 1;
        if (path[0] != '/')
            return fail(err, errlen, "unix:// needs an absolute path after '@'");
    }
    const char *q = strchr(path, '?');
    size_t plen = q ? (size_t)(q - path) : strlen(path);
    if (memchr(path, '#', plen))
        return fail(err, errlen, "fragments are not allowed");
    long db = 0;
    if (q) {
        if (strncmp(q, "?db=", 4) != 0 || !parse_num(q + 4, strlen(q + 4), 0, 2147483647, &db))
            return fail(err, errlen, "the only query is ?db=N, N in 0..2147483647");
    }
    int rc = decode(path, plen, &ep->path);
    if (rc != REDSEM_OK)
        return rc == REDSEM_ENOMEM ? rc : fail(err, errlen, "bad %-escape in path");
    size_t dlen = strlen(ep->path);
    if (dlen < 2)
        return fail(err, errlen, "empty socket path");
    if (dlen > SUN_PATH_MAX)
        return fail(err, errlen, "socket path longer than 107 bytes");
    ep->kind = REDSEM__EP_UNIX;
    ep->db = db;
    return REDSEM_OK;
}

int redsem__url_parse(const char *url, redsem__endpoint *out, char *err, size_t errlen)
{
    if (url == NULL)
        return fail(err, errlen, "NULL");
    size_t len = strnlen(url, REDSEM__URL_MAX + 1);
    if (len > REDSEM__URL_MAX)
        return fail(err, errlen, "longer than 4096 bytes");
    if (!printable(url, len))
        return fail(err, errlen, "spaces or control characters (percent-encode them)");
    redsem__endpoint ep = {0};
    int rc;
    if (strncmp(url, "redis://", 8) == 0)
        rc = parse_redis(url + 8, &ep, err, errlen);
    else if (strncmp(url, "unix://", 7) == 0)
        rc = parse_unix(url + 7, &ep, err, errlen);
    else if (strncmp(url, "rediss://", 9) == 0) {
        rc = parse_redis(url + 9, &ep, err, errlen);
        ep.tls = true;
    } else if (strncmp(url, "redis+sentinel://", 17) == 0)
        rc = parse_sentinel(url + 17, &ep, err, errlen);
    else if (strncmp(url, "rediss+sentinel://", 18) == 0) {
        rc = parse_sentinel(url + 18, &ep, err, errlen);
        ep.tls = true;
    } else if (strncmp(url, "redis+cluster://", 16) == 0)
        rc = parse_cluster(url + 16, &ep, err, errlen);
    else if (strncmp(url, "rediss+cluster://", 17) == 0) {
        rc = parse_cluster(url + 17, &ep, err, errlen);
        ep.tls = true;
    } else
        rc = fail(err, errlen, "scheme must be redis://, rediss:// (TLS), unix://, "
                               "redis+sentinel://, rediss+sentinel://, redis+cluster:// or "
                               "rediss+cluster://");
    if (rc != REDSEM_OK) {
        redsem__endpoint_clear(&ep);
        return rc;
    }
    *out = ep;
    return REDSEM_OK;
}

int redsem__endpoint_copy(redsem__endpoint *dst, const redsem__endpoint *src)
{
    redsem__endpoint ep = *src;
    ep.host = ep.path = ep.user = ep.password = NULL;
    ep.master = ep.sentinel_user = ep.sentinel_password = NULL;
    ep.hosts = NULL;
    ep.nhosts = 0;
    if ((src->host && !(ep.host = redsem__strdup(src->host))) ||
        (src->path && !(ep.path = redsem__strdup(src->path))) ||
        (src->user && !(ep.user = redsem__strdup(src->user))) ||
        (src->password && !(ep.password = redsem__strdup(src->password))) ||
        (src->master && !(ep.master = redsem__strdup(src->master))) ||
        (src->sentinel_user && !(ep.sentinel_user = redsem__strdup(src->sentinel_user))) ||
        (src->sentinel_password &&
         !(ep.sentinel_password = redsem__strdup(src->sentinel_password))) ||
        (src->nhosts &&
         !(ep.hosts = redsem__calloc(src->nhosts, sizeof *ep.hosts)))) {
        redsem__endpoint_clear(&ep);
        return REDSEM_ENOMEM;
    }
    for (size_t i = 0; i < src->nhosts; i++) {
        ep.hosts[i].port = src->hosts[i].port;
        if ((ep.hosts[i].host = redsem__strdup(src->hosts[i].host)) == NULL) {
            ep.nhosts = i;
            redsem__endpoint_clear(&ep);
            return REDSEM_ENOMEM;
        }
        ep.nhosts = i + 1;
    }
    *dst = ep;
    return REDSEM_OK;
}

/* A password's bytes are zeroed before the memory goes back to the allocator (memset before
 * free is a dead store the compiler may drop; sodium_memzero is not). */
static void wipe(char *secret)
{
    if (secret) {
        sodium_memzero(secret, strlen(secret));
        redsem__free(secret);
    }
}

void redsem__endpoint_clear(redsem__endpoint *ep)
{
    redsem__free(ep->host);
    redsem__free(ep->path);
    redsem__free(ep->user);
    wipe(ep->password);
    redsem__free(ep->master);
    redsem__free(ep->sentinel_user);
    wipe(ep->sentinel_password);
    for (size_t i = 0; i < ep->nhosts; i++)
        redsem__free(ep->hosts[i].host);
    redsem__free(ep->hosts);
    memset(ep, 0, sizeof *ep);
}
