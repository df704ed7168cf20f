/*
 * etcd.c - etcd v3 JSON-gateway client (etcd.h): one POST per call, the
 * request and reply as cJSON trees, base64 through libsodium.
 *
 * Locks: e->mu (a leaf) around each call's HTTP round trips.
 */
#include "etcd.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "moonlet/error.h"

#define MOD "etcd"
#define MAX_ENDPOINTS 16
#define MAX_REPLY (4u << 20) /* the gateway's replies here are small; bound what we buffer */

struct moonlet_etcd {
    pthread_mutex_t mu;
    CURL *curl;
    struct curl_slist *headers;
    char *ep[MAX_ENDPOINTS];
    unsigned nep;
    unsigned cur; /* the endpoint that answered last */
    int timeout_ms;
};

/* moonlet_etcd_set_tls: set at startup, before any handle, then read only */
static char *g_tls_ca, *g_tls_cert, *g_tls_key;

int moonlet_etcd_set_tls(const char *ca, const char *cert, const char *key)
{
    if ((cert && *cert) != (key && *key))
        return MOONLET_ERR_INVALID_PARAMS;
    free(g_tls_ca);
    free(g_tls_cert);
    free(g_tls_key);
    g_tls_ca = ca && *ca ? strdup(ca) : NULL;
    g_tls_cert = cert && *cert ? strdup(cert) : NULL;
    g_tls_key = key && *key ? strdup(key) : NULL;
    return MOONLET_OK;
}

static bool tls_set(void) { return g_tls_ca || g_tls_cert; }

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (sodium_init() < 0)
        ML_ERR(MOD, "libsodium failed to initialise");
}

int moonlet_etcd_create(const char *endpoints, int timeout_ms, moonlet_etcd **out)
{
    if (!endpoints || !*endpoints || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_once(&g_curl_once, curl_init_once);
    moonlet_etcd *e = calloc(1, sizeof(*e));
    char *list = strdup(endpoints);
    if (!e || !list) {
        free(e);
        free(list);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    int rc = MOONLET_OK;
    char *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t n = strlen(t);
        while (n && (t[n - 1] == '/' || t[n - 1] == ' '))
            t[--n] = 0;
        if (!n)
            continue;
        if (e->nep == MAX_ENDPOINTS) {
            rc = MOONLET_ERR_INVALID_PARAMS;
            break;
        }
        bool scheme = strstr(t, "://") != NULL;
        size_t cap = n + 8;
        e->ep[e->nep] = malloc(cap);
        if (!e->ep[e->nep]) {
            rc = MOONLET_ERR_INTERNAL_ERROR;
            break;
        }
        snprintf(e->ep[e->nep++], cap, "%s%s", scheme ? "" : tls_set() ? "https://" : "http://",
                 t);
    }
    free(list);
    e->timeout_ms = timeout_ms > 0 ? timeout_ms : 2000;
    e->curl = rc || !e->nep ? NULL : curl_easy_init();
    e->headers = e->curl ? curl_slist_append(NULL, "Content-Type: application/json") : NULL;
    if (!rc && (!e->nep || !e->curl || !e->headers))
        rc = e->nep ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_ERR_INVALID_PARAMS;
    if (rc) {
        moonlet_etcd_destroy(e);
        return rc;
    }
    pthread_mutex_init(&e->mu, NULL);
    *out = e;
    return MOONLET_OK;
}

void moonlet_etcd_destroy(moonlet_etcd *e)
{
    if (!e)
        return;
    if (e->curl) {
        curl_easy_cleanup(e->curl);
        pthread_mutex_destroy(&e->mu);
    }
    curl_slist_free_all(e->headers);
    for (unsigned i = 0; i < e->nep; i++)
        free(e->ep[i]);
    free(e);
}

const char *moonlet_etcd_endpoint(moonlet_etcd *e)
{
    return e->ep[e->cur];
}

/* ---- HTTP ---------------------------------------------------------------- */

struct body {
    char *p;
    size_t len, cap;
    bool overflow;
};

static size_t body_write(char *data, size_t size, size_t nmemb, void *arg)
{
    struct body *b = arg;
    size_t n = size * nmemb;
    if (b->len + n + 1 > MAX_REPLY) {
        b->overflow = true;
        return 0; /* aborts the transfer */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return n;
}

/* POSTs `req` to `path` on the endpoints in turn (the last good one first);
 * *resp gets the parsed reply of the first endpoint that answered 200. */
static int post(moonlet_etcd *e, const char *path, cJSON *req, cJSON **resp)
{
    *resp = NULL;
    char *json = cJSON_PrintUnformatted(req);
    if (!json)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = MOONLET_ERR_RPC_FAIL;
    pthread_mutex_lock(&e->mu);
    for (unsigned k = 0; k < e->nep; k++) {
        unsigned i = (e->cur + k) % e->nep;
        char url[512];
        snprintf(url, sizeof(url), "%s%s", e->ep[i], path);
        struct body b = {0};
        CURL *c = e->curl;
        curl_easy_reset(c);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, e->headers);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        if (g_tls_ca)
            curl_easy_setopt(c, CURLOPT_CAINFO, g_tls_ca);
        if (g_tls_cert) {
            curl_easy_setopt(c, CURLOPT_SSLCERT, g_tls_cert);
            curl_easy_setopt(c, CURLOPT_SSLKEY, g_tls_key);
        }
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, body_write);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        CURLcode cc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (cc != CURLE_OK || status >= 500 || status == 0) {
            rc = cc == CURLE_OPERATION_TIMEDOUT ? MOONLET_ERR_RPC_TIMEOUT : MOONLET_ERR_RPC_FAIL;
            ML_DEBUG(MOD, "%s: %s (HTTP %ld)", url, curl_easy_strerror(cc), status);
            free(b.p);
            continue; /* the next endpoint */
        }
        e->cur = i;
        cJSON *j = b.p ? cJSON_Parse(b.p) : NULL;
        if (status != 200 || !j || !cJSON_IsObject(j)) {
            ML_WARN(MOD, "%s: HTTP %ld: %.200s", url, status, b.p ? b.p : "");
            cJSON_Delete(j);
            rc = MOONLET_ERR_RPC_FAIL;
        } else {
            *resp = j;
            rc = MOONLET_OK;
        }
        free(b.p);
        break; /* etcd answered: no other endpoint would answer differently */
    }
    pthread_mutex_unlock(&e->mu);
    free(json);
    return rc;
}

/* ---- JSON helpers --------------------------------------------------------- */

static int64_t j_i64(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (cJSON_IsString(v))
        return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v))
        return (int64_t)v->valuedouble;
    return 0; /* omitted: the default */
}

static bool j_add_i64(cJSON *o, const char *name, int64_t v)
{
    char s[24];
    snprintf(s, sizeof(s), "%" PRId64, v);
    return cJSON_AddStringToObject(o, name, s) != NULL;
}

static bool j_add_b64(cJSON *o, const char *name, const void *data, size_t len)
{
    size_t cap = sodium_base64_ENCODED_LEN(len, sodium_base64_VARIANT_ORIGINAL);
    char *s = malloc(cap);
    if (!s)
        return false;
    sodium_bin2base64(s, cap, data, len, sodium_base64_VARIANT_ORIGINAL);
    bool ok = cJSON_AddStringToObject(o, name, s) != NULL;
    free(s);
    return ok;
}

/* Decodes the base64 string o[name] into a NUL-terminated copy. */
static int j_b64(const cJSON *o, const char *name, char **out, size_t *len)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (!p)
        return MOONLET_ERR_INTERNAL_ERROR;
    size_t bin = 0;
    if (sodium_base642bin((unsigned char *)p, n + 1, s, n, NULL, &bin, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(p);
        return MOONLET_ERR_RPC_FAIL;
    }
    p[bin] = 0;
    *out = p;
    *len = bin;
    return MOONLET_OK;
}

static int kv_from_json(const cJSON *kv, moonlet_etcd_kv *out)
{
    memset(out, 0, sizeof(*out));
    out->found = true;
    out->create_revision = j_i64(kv, "create_revision");
    out->mod_revision = j_i64(kv, "mod_revision");
    out->version = j_i64(kv, "version");
    out->lease = j_i64(kv, "lease");
    int rc = j_b64(kv, "value", &out->value, &out->value_len);
    if (rc)
        memset(out, 0, sizeof(*out));
    return rc;
}

/* The first kv of a RangeResponse object (found false when none). */
static int kv_from_range(const cJSON *range, moonlet_etcd_kv *out)
{
    memset(out, 0, sizeof(*out));
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(range, "kvs");
    const cJSON *first = cJSON_IsArray(kvs) ? cJSON_GetArrayItem(kvs, 0) : NULL;
    return first ? kv_from_json(first, out) : MOONLET_OK;
}

void moonlet_etcd_kv_free(moonlet_etcd_kv *kv)
{
    if (!kv)
        return;
    free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

static int64_t header_rev(const cJSON *resp)
{
    return j_i64(cJSON_GetObjectItemCaseSensitive(resp, "header"), "revision");
}

/* Builds {key: b64(key)} (the start of most requests). */
static cJSON *req_with_key(const char *key)
{
    cJSON *r = cJSON_CreateObject();
    if (r && !j_add_b64(r, "key", key, strlen(key))) {
        cJSON_Delete(r);
        r = NULL;
    }
    return r;
}

/* ---- leases ---------------------------------------------------------------- */

int moonlet_etcd_lease_grant(moonlet_etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_ttl_s)
{
    if (ttl_s <= 0 || !id)
        return MOONLET_ERR_INVALID_PARAMS;
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    int rc = req && j_add_i64(req, "TTL", ttl_s) ? post(e, "/v3/lease/grant", req, &resp)
                                                 : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc) {
        *id = j_i64(resp, "ID");
        if (granted_ttl_s)
            *granted_ttl_s = j_i64(resp, "TTL");
        if (*id == 0) {
            const cJSON *err = cJSON_GetObjectItemCaseSensitive(resp, "error");
            ML_WARN(MOD, "lease grant refused: %s", cJSON_IsString(err) ? err->valuestring : "?");
            rc = MOONLET_ERR_RPC_FAIL;
        }
    }
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

int moonlet_etcd_lease_keepalive(moonlet_etcd *e, int64_t id, int64_t *ttl_s)
{
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    int rc = req && j_add_i64(req, "ID", id) ? post(e, "/v3/lease/keepalive", req, &resp)
                                             : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc) {
        /* a streamed reply: {"result": LeaseKeepAliveResponse}; TTL omitted = 0 = gone */
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(resp, "result");
        if (!cJSON_IsObject(res))
            rc = MOONLET_ERR_RPC_FAIL;
        else if (ttl_s)
            *ttl_s = j_i64(res, "TTL") > 0 ? j_i64(res, "TTL") : 0;
    }
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

int moonlet_etcd_lease_revoke(moonlet_etcd *e, int64_t id)
{
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    int rc = req && j_add_i64(req, "ID", id) ? post(e, "/v3/lease/revoke", req, &resp)
                                             : MOONLET_ERR_INTERNAL_ERROR;
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

/* ---- keys ------------------------------------------------------------------ */

int moonlet_etcd_get(moonlet_etcd *e, const char *key, moonlet_etcd_kv *out, int64_t *rev)
{
    if (!key || !*key || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    memset(out, 0, sizeof(*out));
    cJSON *req = req_with_key(key), *resp = NULL;
    int rc = req ? post(e, "/v3/kv/range", req, &resp) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc) {
        rc = kv_from_range(resp, out);
        if (rev)
            *rev = header_rev(resp);
    }
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

static bool put_fields(cJSON *o, const char *key, const void *value, size_t len, int64_t lease)
{
    return j_add_b64(o, "key", key, strlen(key)) && j_add_b64(o, "value", value, len) &&
           (!lease || j_add_i64(o, "lease", lease));
}

int moonlet_etcd_put(moonlet_etcd *e, const char *key, const void *value, size_t len,
                     int64_t lease, int64_t *rev)
{
    if (!key || !*key || (!value && len))
        return MOONLET_ERR_INVALID_PARAMS;
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    int rc = req && put_fields(req, key, value ? value : "", len, lease)
                 ? post(e, "/v3/kv/put", req, &resp)
                 : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc && rev)
        *rev = header_rev(resp);
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

int moonlet_etcd_delete(moonlet_etcd *e, const char *key, int64_t *deleted)
{
    if (!key || !*key)
        return MOONLET_ERR_INVALID_PARAMS;
    cJSON *req = req_with_key(key), *resp = NULL;
    int rc = req ? post(e, "/v3/kv/deleterange", req, &resp) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc && deleted)
        *deleted = j_i64(resp, "deleted");
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

/* {compare: [{key, target, result: EQUAL, <target>_revision: expect}]} */
static cJSON *txn_begin(const char *key, moonlet_etcd_target target, int64_t expect)
{
    cJSON *req = cJSON_CreateObject();
    cJSON *cmps = req ? cJSON_AddArrayToObject(req, "compare") : NULL;
    cJSON *cmp = cJSON_CreateObject();
    if (!cmps || !cmp || !cJSON_AddItemToArray(cmps, cmp)) {
        cJSON_Delete(cmp);
        cJSON_Delete(req);
        return NULL;
    }
    bool create = target == MOONLET_ETCD_CREATE_REVISION;
    if (!j_add_b64(cmp, "key", key, strlen(key)) ||
        !cJSON_AddStringToObject(cmp, "target", create ? "CREATE" : "MOD") ||
        !cJSON_AddStringToObject(cmp, "result", "EQUAL") ||
        !j_add_i64(cmp, create ? "create_revision" : "mod_revision", expect)) {
        cJSON_Delete(req);
        return NULL;
    }
    return req;
}

/* Adds branch[] = [{op: {body}}], taking `body`. */
static bool txn_op(cJSON *req, const char *branch, const char *op, cJSON *body)
{
    cJSON *arr = cJSON_AddArrayToObject(req, branch);
    cJSON *item = cJSON_CreateObject();
    if (!arr || !item || !body || !cJSON_AddItemToArray(arr, item)) {
        cJSON_Delete(item);
        cJSON_Delete(body);
        return false;
    }
    if (!cJSON_AddItemToObject(item, op, body)) {
        cJSON_Delete(body);
        return false;
    }
    return true;
}

int moonlet_etcd_txn_put(moonlet_etcd *e, const char *key, moonlet_etcd_target target,
                         int64_t expect, const void *value, size_t len, int64_t lease,
                         bool *succeeded, int64_t *rev, moonlet_etcd_kv *current)
{
    if (!key || !*key || (!value && len) || !succeeded)
        return MOONLET_ERR_INVALID_PARAMS;
    if (current)
        memset(current, 0, sizeof(*current));
    cJSON *req = txn_begin(key, target, expect), *resp = NULL;
    cJSON *put = cJSON_CreateObject();
    bool ok = req && put && put_fields(put, key, value ? value : "", len, lease);
    if (!ok)
        cJSON_Delete(put);
    ok = ok && txn_op(req, "success", "request_put", put) &&
         txn_op(req, "failure", "request_range", req_with_key(key));
    int rc = ok ? post(e, "/v3/kv/txn", req, &resp) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc) {
        *succeeded = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(resp, "succeeded"));
        if (rev)
            *rev = header_rev(resp);
        if (!*succeeded && current) {
            const cJSON *rs = cJSON_GetObjectItemCaseSensitive(resp, "responses");
            const cJSON *r0 = cJSON_IsArray(rs) ? cJSON_GetArrayItem(rs, 0) : NULL;
            rc = kv_from_range(cJSON_GetObjectItemCaseSensitive(r0, "response_range"), current);
        }
    }
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

int moonlet_etcd_txn_delete(moonlet_etcd *e, const char *key, moonlet_etcd_target target,
                            int64_t expect, bool *succeeded)
{
    if (!key || !*key || !succeeded)
        return MOONLET_ERR_INVALID_PARAMS;
    cJSON *req = txn_begin(key, target, expect), *resp = NULL;
    bool ok = req && txn_op(req, "success", "request_delete_range", req_with_key(key));
    int rc = ok ? post(e, "/v3/kv/txn", req, &resp) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        *succeeded = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(resp, "succeeded"));
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}

int moonlet_etcd_txn_fenced(moonlet_etcd *e, const char *fence_key, int64_t fence_create_rev,
                            const char *key, const void *value, size_t len, bool *succeeded)
{
    if (!fence_key || !*fence_key || !key || !*key || !succeeded)
        return MOONLET_ERR_INVALID_PARAMS;
    cJSON *req = txn_begin(fence_key, MOONLET_ETCD_CREATE_REVISION, fence_create_rev), *resp = NULL;
    bool ok = req != NULL;
    if (ok && value) {
        cJSON *put = cJSON_CreateObject();
        ok = put && put_fields(put, key, value, len, 0);
        if (!ok)
            cJSON_Delete(put);
        ok = ok && txn_op(req, "success", "request_put", put);
    } else if (ok) {
        ok = txn_op(req, "success", "request_delete_range", req_with_key(key));
    }
    int rc = ok ? post(e, "/v3/kv/txn", req, &resp) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        *succeeded = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(resp, "succeeded"));
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return rc;
}
