/* tls_certs.c - throwaway CA and certificates (OpenSSL); see tls_certs.h. */
#include "tls_certs.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

static bool add_ext(X509 *x, X509V3_CTX *v, int nid, const char *value)
{
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, v, nid, value);
    bool ok = e && X509_add_ext(x, e, -1) == 1;
    X509_EXTENSION_free(e);
    return ok;
}

static X509 *make(EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key,
                  const char *sans)
{
    static long serial = 1;
    X509 *x = X509_new();
    if (!x)
        return NULL;
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++ + (long)time(NULL) % 100000 * 1000);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 7 * 24 * 3600);
    X509_set_pubkey(x, key);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : n);
    X509V3_CTX v;
    X509V3_set_ctx_nodb(&v);
    X509V3_set_ctx(&v, issuer ? issuer : x, x, NULL, NULL, 0);
    bool ok = add_ext(x, &v, NID_basic_constraints, issuer ? "CA:FALSE" : "critical,CA:TRUE") &&
              add_ext(x, &v, NID_subject_key_identifier, "hash") &&
              (issuer || add_ext(x, &v, NID_key_usage, "critical,keyCertSign,cRLSign")) &&
              (!sans || add_ext(x, &v, NID_subject_alt_name, sans)) &&
              X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256()) > 0;
    if (!ok) {
        X509_free(x);
        return NULL;
    }
    return x;
}

static int write_pair(const char *dir, const char *name, X509 *x, EVP_PKEY *k)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.pem", dir, name);
    FILE *f = fopen(path, "w");
    bool ok = f && PEM_write_X509(f, x) == 1;
    if (f)
        ok = fclose(f) == 0 && ok;
    snprintf(path, sizeof(path), "%s/%s.key", dir, name);
    f = ok ? fopen(path, "w") : NULL;
    if (f)
        fchmod(fileno(f), 0600);
    ok = f && PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL) == 1;
    if (f)
        ok = fclose(f) == 0 && ok;
    return ok ? 0 : -1;
}

int tls_certs_ca(const char *dir, const char *name, const char *cn)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = k ? make(k, cn, NULL, NULL, NULL) : NULL;
    int rc = x ? write_pair(dir, name, x, k) : -1;
    X509_free(x);
    EVP_PKEY_free(k);
    return rc;
}

int tls_certs_issue(const char *dir, const char *ca, const char *name, const char *cn,
                    const char *sans)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.pem", dir, ca);
    FILE *f = fopen(path, "r");
    X509 *cax = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    snprintf(path, sizeof(path), "%s/%s.key", dir, ca);
    f = fopen(path, "r");
    EVP_PKEY *cak = f ? PEM_read_PrivateKey(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    EVP_PKEY *k = cax && cak ? EVP_EC_gen("P-256") : NULL;
    X509 *x = k ? make(k, cn, cax, cak, sans) : NULL;
    int rc = x ? write_pair(dir, name, x, k) : -1;
    X509_free(x);
    EVP_PKEY_free(k);
    EVP_PKEY_free(cak);
    X509_free(cax);
    return rc;
}
