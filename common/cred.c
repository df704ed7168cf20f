/* cred.c - credentials, roles and the data plane's challenge-response; see cred.h. */
#include "cred.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "moonlet/error.h"

#define MOD "auth"
#define LINE_MAX_BYTES 8192

const moonlet_cred moonlet_cred_everything = {.roles = MOONLET_ROLE_ALL};

static const struct {
    const char *name;
    uint32_t bit;
} g_roles[] = {
    {"client", MOONLET_ROLE_CLIENT}, {"node", MOONLET_ROLE_NODE},
    {"peer", MOONLET_ROLE_PEER},     {"operator", MOONLET_ROLE_OPERATOR},
    {"reader", MOONLET_ROLE_READER}, {"all", MOONLET_ROLE_ALL},
};

moonlet_cred_set *moonlet_cred_set_new(void)
{
    return calloc(1, sizeof(moonlet_cred_set));
}

void moonlet_cred_set_free(moonlet_cred_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        for (size_t t = 0; t < s->v[i].ntenants; t++)
            free(s->v[i].tenants[t]);
        free(s->v[i].tenants);
        free(s->v[i].cn);
        sodium_memzero(s->v[i].hash, sizeof(s->v[i].hash));
    }
    free(s->v);
    free(s);
}

static moonlet_cred *cred_append(moonlet_cred_set *s)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        moonlet_cred *v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        s->v = v;
        s->cap = cap;
    }
    moonlet_cred *c = &s->v[s->n++];
    memset(c, 0, sizeof(*c));
    return c;
}

void moonlet_cred_key(const void *token, size_t len, uint8_t key[MOONLET_CRED_HASH_BYTES])
{
    crypto_hash_sha256(key, token, len);
}

int moonlet_cred_add_token(moonlet_cred_set *s, const void *token, size_t len, uint32_t roles)
{
    moonlet_cred *c = cred_append(s);
    if (!c)
        return MOONLET_ERR_INTERNAL_ERROR;
    moonlet_cred_key(token, len, c->hash);
    c->roles = roles;
    return MOONLET_OK;
}

int moonlet_cred_parse_roles(const char *text, size_t len, uint32_t *out)
{
    uint32_t roles = 0;
    for (size_t i = 0, j;; i = j + 1) {
        j = i;
        while (j < len && text[j] != ',')
            j++;
        if (j == i)
            return MOONLET_ERR_INVALID_PARAMS; /* an empty item */
        bool known = false;
        for (size_t r = 0; r < sizeof(g_roles) / sizeof(g_roles[0]); r++)
            if (strlen(g_roles[r].name) == j - i && memcmp(g_roles[r].name, text + i, j - i) == 0) {
                roles |= g_roles[r].bit;
                known = true;
            }
        if (!known)
            return MOONLET_ERR_INVALID_PARAMS;
        if (j == len)
            break;
    }
    if (!roles)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = roles;
    return MOONLET_OK;
}

const char *moonlet_cred_roles_str(uint32_t roles, char *buf, size_t cap)
{
    size_t off = 0;
    if (cap)
        buf[0] = '\0';
    for (size_t r = 0; r + 1 < sizeof(g_roles) / sizeof(g_roles[0]); r++)
        if (roles & g_roles[r].bit) {
            int n = snprintf(buf + off, cap > off ? cap - off : 0, "%s%s", off ? "," : "",
                             g_roles[r].name);
            if (n > 0)
                off += (size_t)n;
        }
    return buf;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Splits the next whitespace-separated field of *p: its start and length (0: none). */
static size_t next_field(const char **p, const char **start)
{
    const char *q = *p;
    while (*q == ' ' || *q == '\t')
        q++;
    *start = q;
    while (*q && *q != ' ' && *q != '\t')
        q++;
    *p = q;
    return (size_t)(q - *start);
}

static int parse_tenants(moonlet_cred *c, const char *t, size_t len)
{
    if (len == 1 && t[0] == '*')
        return MOONLET_OK; /* any */
    size_t n = 1;
    for (size_t i = 0; i < len; i++)
        n += t[i] == ',';
    if (!(c->tenants = calloc(n, sizeof(char *))))
        return MOONLET_ERR_INTERNAL_ERROR;
    size_t i = 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && t[j] != ',')
            j++;
        if (j == i)
            return MOONLET_ERR_INVALID_PARAMS; /* an empty name */
        if (!(c->tenants[c->ntenants] = strndup(t + i, j - i)))
            return MOONLET_ERR_INTERNAL_ERROR;
        c->ntenants++;
        i = j + 1;
    }
    return MOONLET_OK;
}

int moonlet_cred_parse_line(moonlet_cred_set *s, const char *text, unsigned line)
{
    const char *p = text, *tok, *roles, *tenants, *extra;
    size_t tok_len = next_field(&p, &tok);
    if (tok_len == 0 || tok[0] == '#')
        return MOONLET_OK;
    size_t roles_len = next_field(&p, &roles);
    size_t tenants_len = next_field(&p, &tenants);
    size_t extra_len = next_field(&p, &extra);
    uint32_t mask = 0;
    if (roles_len == 0 || moonlet_cred_parse_roles(roles, roles_len, &mask)) {
        ML_ERR(MOD, "credentials line %u: roles missing or unknown (client, node, peer, operator, "
               "reader, all; comma-separated)", line);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (extra_len && extra[0] != '#') {
        ML_ERR(MOD, "credentials line %u: more than three fields", line);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    moonlet_cred *c = cred_append(s);
    if (!c)
        return MOONLET_ERR_INTERNAL_ERROR;
    c->roles = mask;
    c->line = line;
    if (tok_len > 3 && strncmp(tok, "cn:", 3) == 0) { /* a client certificate's name */
        if (!(c->cn = strndup(tok + 3, tok_len - 3))) {
            s->n--;
            return MOONLET_ERR_INTERNAL_ERROR;
        }
    } else if (tok_len == 7 + 2 * MOONLET_CRED_HASH_BYTES && strncmp(tok, "sha256:", 7) == 0) {
        for (size_t i = 0; i < MOONLET_CRED_HASH_BYTES; i++) {
            int hi = hexval(tok[7 + 2 * i]), lo = hexval(tok[8 + 2 * i]);
            if (hi < 0 || lo < 0) {
                ML_ERR(MOD, "credentials line %u: sha256: takes 64 hex digits", line);
                s->n--;
                return MOONLET_ERR_INVALID_PARAMS;
            }
            c->hash[i] = (uint8_t)(hi << 4 | lo);
        }
    } else {
        if (strncmp(tok, "sha256:", 7) == 0) {
            ML_ERR(MOD, "credentials line %u: sha256: takes 64 hex digits", line);
            s->n--;
            return MOONLET_ERR_INVALID_PARAMS;
        }
        moonlet_cred_key(tok, tok_len, c->hash);
    }
    int rc = tenants_len && tenants[0] != '#' ? parse_tenants(c, tenants, tenants_len) : 0;
    if (rc) {
        ML_ERR(MOD, "credentials line %u: bad tenant list (comma-separated names, or *)", line);
        for (size_t t = 0; t < c->ntenants; t++)
            free(c->tenants[t]);
        free(c->tenants);
        s->n--;
        return rc;
    }
    return MOONLET_OK;
}

int moonlet_cred_load(const char *path, moonlet_cred_set **out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ML_ERR(MOD, "cannot open credentials file %s: %s", path, strerror(errno));
        return MOONLET_ERR_INVALID_PARAMS;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        ML_WARN(MOD, "credentials file %s is readable by group or others (mode %03o)", path,
                (unsigned)(st.st_mode & 0777));
    moonlet_cred_set *s = moonlet_cred_set_new();
    int rc = s ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    char *buf = malloc(LINE_MAX_BYTES);
    if (!buf)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    unsigned line = 0;
    while (rc == MOONLET_OK && fgets(buf, LINE_MAX_BYTES, f)) {
        line++;
        size_t n = strlen(buf);
        if (n == LINE_MAX_BYTES - 1 && buf[n - 1] != '\n') {
            ML_ERR(MOD, "credentials line %u: longer than %d bytes", line, LINE_MAX_BYTES - 2);
            rc = MOONLET_ERR_INVALID_PARAMS;
            break;
        }
        while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
                     buf[n - 1] == '\t'))
            buf[--n] = '\0';
        rc = moonlet_cred_parse_line(s, buf, line);
    }
    if (buf) {
        sodium_memzero(buf, LINE_MAX_BYTES);
        free(buf);
    }
    fclose(f);
    if (rc == MOONLET_OK && s->n == 0) {
        ML_ERR(MOD, "credentials file %s holds no credential", path);
        rc = MOONLET_ERR_INVALID_PARAMS;
    }
    if (rc) {
        moonlet_cred_set_free(s);
        return rc;
    }
    *out = s;
    return MOONLET_OK;
}

const moonlet_cred *moonlet_cred_find(const moonlet_cred_set *s, const void *token, size_t len)
{
    if (!s)
        return NULL;
    uint8_t h[MOONLET_CRED_HASH_BYTES];
    moonlet_cred_key(token, len, h);
    const moonlet_cred *found = NULL;
    for (size_t i = 0; i < s->n; i++) { /* every one, whatever matched */
        bool eq = sodium_memcmp(h, s->v[i].hash, sizeof(h)) == 0;
        if (eq && !found && !s->v[i].cn)
            found = &s->v[i];
    }
    sodium_memzero(h, sizeof(h));
    return found;
}

const moonlet_cred *moonlet_cred_find_cn(const moonlet_cred_set *s, const char *cn)
{
    if (!s || !cn || !*cn)
        return NULL;
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].cn && strcmp(s->v[i].cn, cn) == 0)
            return &s->v[i];
    return NULL;
}

bool moonlet_cred_tenant_ok(const moonlet_cred *c, const char *tenant, size_t len)
{
    if (!c->tenants)
        return true;
    if (len == 0) {
        tenant = "default";
        len = 7;
    }
    for (size_t i = 0; i < c->ntenants; i++)
        if (strlen(c->tenants[i]) == len && memcmp(c->tenants[i], tenant, len) == 0)
            return true;
    return false;
}

void moonlet_cred_nonce(uint8_t nonce[MOONLET_CRED_NONCE_BYTES])
{
    if (sodium_init() < 0)
        abort(); /* no randomness: nothing here may go on */
    randombytes_buf(nonce, MOONLET_CRED_NONCE_BYTES);
}

void moonlet_cred_mac(const uint8_t key[MOONLET_CRED_HASH_BYTES], const char *what,
                      const uint8_t server_nonce[MOONLET_CRED_NONCE_BYTES],
                      const uint8_t client_nonce[MOONLET_CRED_NONCE_BYTES],
                      uint8_t mac[MOONLET_CRED_MAC_BYTES])
{
    static const char label[] = "moonlet-xfer-auth-v1";
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, key, MOONLET_CRED_HASH_BYTES);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, sizeof(label));
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)what, strlen(what) + 1);
    crypto_auth_hmacsha256_update(&st, server_nonce, MOONLET_CRED_NONCE_BYTES);
    crypto_auth_hmacsha256_update(&st, client_nonce, MOONLET_CRED_NONCE_BYTES);
    crypto_auth_hmacsha256_final(&st, mac);
    sodium_memzero(&st, sizeof(st));
}

bool moonlet_cred_mac_check(const uint8_t (*keys)[MOONLET_CRED_HASH_BYTES], size_t n,
                            const uint8_t *one, const char *what,
                            const uint8_t server_nonce[MOONLET_CRED_NONCE_BYTES],
                            const uint8_t client_nonce[MOONLET_CRED_NONCE_BYTES],
                            const uint8_t mac[MOONLET_CRED_MAC_BYTES])
{
    uint8_t want[MOONLET_CRED_MAC_BYTES];
    bool ok = false;
    for (size_t i = 0; i <= n; i++) {
        const uint8_t *k = i < n ? keys[i] : one;
        if (!k)
            continue;
        moonlet_cred_mac(k, what, server_nonce, client_nonce, want);
        ok |= sodium_memcmp(want, mac, sizeof(want)) == 0;
    }
    sodium_memzero(want, sizeof(want));
    return ok;
}
