/*
 * cred.h - credentials and roles: who may do what (issue 33).
 *
 * A credential is a secret token with the roles it grants and, optionally,
 * the tenants it is limited to.  The master reads them from a credentials
 * file (moonlet-master --credentials FILE), one per line:
 *
 *   # TOKEN-OR-HASH                     ROLES            [TENANTS]
 *   sha256:5e884898da28047151d0e56f...  client           tenant-a,tenant-b
 *   node-secret-1                       node
 *   sha256:...                          operator,reader
 *   cn:search-engines                   client           search
 *
 * The first field is the token itself or "sha256:" and the 64 hex digits of
 * its SHA-256 (`printf %s "$TOKEN" | sha256sum`), so the file need not hold
 * any secret the master does not have to know.  ROLES is a comma-separated
 * list of client, node, peer, operator, reader (or "all").  TENANTS, when
 * present, limits the credential to those tenants ("default" is the tenant
 * of calls that name none; "*" means any).  "cn:NAME" instead of a token is
 * the TLS client certificate whose common name is NAME, once the server
 * verified it against its CA (a connection over TLS that presents no token
 * acts under it; moonlet_cred_find_cn).  Blank lines and '#' comments are
 * skipped; anything else that does not parse is an error naming the line
 * (never its token).
 *
 * Only hashes are kept in memory: a presented token is hashed and compared,
 * in constant time, with every credential's hash (so the time does not tell
 * which one matched, or how much of it).
 *
 * The data plane (transport/xfer_tcp_server.c, xfer_verbs.c) authenticates
 * by challenge-response keyed with the SHA-256 of the token
 * (moonlet_cred_key), so the same file, hashes included, serves a store node
 * that verifies its clients: see moonlet_cred_mac.
 *
 * No global state; no locks.  A set is built once and then only read: any
 * number of threads may look tokens up in it concurrently.
 */
#ifndef MOONLET_CRED_H
#define MOONLET_CRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The roles, as bits of moonlet_cred.roles and of a method's declaration. */
#define MOONLET_ROLE_CLIENT 0x01u   /* put, get, probe, remove of its own tenants' keys */
#define MOONLET_ROLE_NODE 0x02u     /* mount, ping, unmount of its segments, repair jobs */
#define MOONLET_ROLE_PEER 0x04u     /* the masters' replication and election traffic */
#define MOONLET_ROLE_OPERATOR 0x08u /* inspection, drain, forced removal, tenant-wide calls */
#define MOONLET_ROLE_READER 0x10u   /* read-only inspection and /metrics */
#define MOONLET_ROLE_ALL 0x1fu

#define MOONLET_CRED_HASH_BYTES 32u  /* SHA-256 */
#define MOONLET_CRED_NONCE_BYTES 32u /* data-plane challenge */
#define MOONLET_CRED_MAC_BYTES 32u   /* HMAC-SHA-256 */

typedef struct moonlet_cred {
    uint8_t hash[MOONLET_CRED_HASH_BYTES]; /* SHA-256 of the token (zero for a cn: one) */
    char *cn; /* "cn:NAME" lines: the common name of a TLS client certificate the
               * server verified against its CA; NULL: a token's credential */
    uint32_t roles;                        /* MOONLET_ROLE_* bits */
    unsigned line;                         /* its line in the file (0: added in code) */
    char **tenants;                        /* the tenants it may name; NULL: any */
    size_t ntenants;
} moonlet_cred;

typedef struct moonlet_cred_set {
    moonlet_cred *v;
    size_t n, cap;
} moonlet_cred_set;

/* The credential every call of a server without credentials acts under:
 * every role, every tenant (one shared token, or none: behaviour as before
 * roles existed). */
extern const moonlet_cred moonlet_cred_everything;

/* An empty set (NULL when out of memory). */
moonlet_cred_set *moonlet_cred_set_new(void);
void moonlet_cred_set_free(moonlet_cred_set *s);

/* Reads a credentials file into a new set.  Returns 0, or INVALID_PARAMS
 * (unreadable, empty, a line that does not parse: logged with its number),
 * INTERNAL_ERROR (out of memory).  Warns when group or others may read it. */
int moonlet_cred_load(const char *path, moonlet_cred_set **out);

/* Parses one line (no newline) into s; `line` is its number for messages.
 * A blank or comment line adds nothing.  0 or INVALID_PARAMS (logged). */
int moonlet_cred_parse_line(moonlet_cred_set *s, const char *text, unsigned line);

/* Adds the token `token` (len bytes) with `roles` and no tenant limit.
 * 0 or INTERNAL_ERROR. */
int moonlet_cred_add_token(moonlet_cred_set *s, const void *token, size_t len, uint32_t roles);

/* The credential of a presented token, or NULL.  Compares with every
 * credential, whatever matched, in time that depends on the set's size only. */
const moonlet_cred *moonlet_cred_find(const moonlet_cred_set *s, const void *token, size_t len);

/* The credential of a verified TLS client certificate whose common name is
 * cn (a "cn:NAME" line), or NULL.  Names are not secrets: a plain compare. */
const moonlet_cred *moonlet_cred_find_cn(const moonlet_cred_set *s, const char *cn);

/* Whether credential c may name `tenant` (len bytes; empty means "default"). */
bool moonlet_cred_tenant_ok(const moonlet_cred *c, const char *tenant, size_t len);

/* "client,node" for a role mask (into buf; returns buf). */
const char *moonlet_cred_roles_str(uint32_t roles, char *buf, size_t cap);

/* Parses a comma-separated role list.  0 or INVALID_PARAMS. */
int moonlet_cred_parse_roles(const char *text, size_t len, uint32_t *out);

/* ---- data plane: challenge-response ------------------------------------- */

/* The MAC key of a token: its SHA-256 (the hash a credentials file holds). */
void moonlet_cred_key(const void *token, size_t len, uint8_t key[MOONLET_CRED_HASH_BYTES]);

/* Fills a nonce with random bytes (libsodium's randombytes). */
void moonlet_cred_nonce(uint8_t nonce[MOONLET_CRED_NONCE_BYTES]);

/* The proof a client sends for the server's nonce: HMAC-SHA-256 under key of
 * "moonlet-xfer-auth-v1" | what (a label of the transport: "tcp", "rdma") |
 * server_nonce | client_nonce.  The server draws a fresh nonce per
 * connection, so a proof captured on one connection opens no other. */
void moonlet_cred_mac(const uint8_t key[MOONLET_CRED_HASH_BYTES], const char *what,
                      const uint8_t server_nonce[MOONLET_CRED_NONCE_BYTES],
                      const uint8_t client_nonce[MOONLET_CRED_NONCE_BYTES],
                      uint8_t mac[MOONLET_CRED_MAC_BYTES]);

/* Checks a proof against every key in keys[n] (and `one`, when not NULL),
 * in constant time per key.  True when one of them made it. */
bool moonlet_cred_mac_check(const uint8_t (*keys)[MOONLET_CRED_HASH_BYTES], size_t n,
                            const uint8_t *one, const char *what,
                            const uint8_t server_nonce[MOONLET_CRED_NONCE_BYTES],
                            const uint8_t client_nonce[MOONLET_CRED_NONCE_BYTES],
                            const uint8_t mac[MOONLET_CRED_MAC_BYTES]);

#endif
