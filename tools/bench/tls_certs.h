/*
 * tls_certs.h - throwaway certificates for benchmarks and tests: a CA and
 * certificates it signs, generated at run time into a directory the caller
 * made (never checked in).  EC P-256 keys, SHA-256 signatures, valid from
 * an hour ago for a week.  Files: NAME.pem (certificate) and NAME.key
 * (private key, mode 0600).  Owns nothing, takes no locks.
 */
#ifndef MOONLET_TLS_CERTS_H
#define MOONLET_TLS_CERTS_H

/* A self-signed CA with common name cn: dir/name.pem, dir/name.key.
 * Returns 0 or -1. */
int tls_certs_ca(const char *dir, const char *name, const char *cn);
/* A certificate for cn signed by the CA dir/ca.pem + dir/ca.key, with
 * subjectAltName sans (OpenSSL's syntax: "IP:127.0.0.1,DNS:localhost";
 * NULL: none, a client certificate): dir/name.pem, dir/name.key.
 * Returns 0 or -1. */
int tls_certs_issue(const char *dir, const char *ca, const char *name, const char *cn,
                    const char *sans);

#endif
