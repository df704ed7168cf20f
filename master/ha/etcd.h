/*
 * etcd.h - a small client of etcd v3's JSON gateway (etcd 3.4: /v3/...),
 * over libcurl and cJSON: what the master's leader election needs and no
 * more.  Linked by moonlet-master only (the client library never talks to
 * etcd).
 *
 * It owns one curl handle, the endpoint list and the index of the endpoint
 * that answered last.  Every call tries that endpoint first and, on a
 * transport failure (connect refused, timeout, HTTP 5xx), the next ones in
 * turn, each at most once, each bounded by the handle's timeout; a reply
 * that etcd gave (even an error) is not retried elsewhere.
 *
 * Wire conventions of the gateway (grpc-gateway's JSON mapping of the
 * protobufs): keys and values are base64 (libsodium's original variant);
 * 64-bit integers travel as JSON strings; fields equal to their default
 * (0, false, empty) are omitted, so an absent field reads as 0.
 *
 * Watch: not used.  Over the gateway a watch is a long-lived streamed HTTP
 * response; a standby reads the leader key instead, every TTL/20 (100 ms
 * at a 2 s TTL: moonlet_election_poll_ms), one small read per poll.
 *
 * Threads and locks: one mutex per handle serialises calls (libcurl easy
 * handles are single-threaded); it is a leaf, held for the whole HTTP round
 * trip, never while calling out.
 *
 * Errors: MOONLET_OK; MOONLET_ERR_RPC_FAIL when no endpoint answered (or
 * answered what is not the gateway's JSON); MOONLET_ERR_RPC_TIMEOUT when the
 * last endpoint tried timed out; MOONLET_ERR_INVALID_PARAMS for bad
 * arguments; MOONLET_ERR_INTERNAL_ERROR when out of memory.
 */
#ifndef MOONLET_ETCD_H
#define MOONLET_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct moonlet_etcd moonlet_etcd;

/* etcd over TLS (the master's --etcd-ca, --etcd-cert, --etcd-key): the CA
 * that signed etcd's certificate and, for etcd's --client-cert-auth, this
 * master's client certificate and key (PEM files, NULL: none).  Handles
 * created afterwards use them (libcurl reads the files at each new
 * connection, so a renewed certificate is taken without a restart); a
 * missing scheme then means https://.  Call once, before the first
 * moonlet_etcd_create (a process setting: every handle of the master talks
 * to the same etcd).  INVALID_PARAMS for a cert without a key. */
int moonlet_etcd_set_tls(const char *ca, const char *cert, const char *key);

/* endpoints: "http://host:port[,http://host:port...]" (a missing scheme
 * means http://, or https:// after moonlet_etcd_set_tls).  timeout_ms
 * bounds each HTTP request (connect included). */
int moonlet_etcd_create(const char *endpoints, int timeout_ms, moonlet_etcd **out);
void moonlet_etcd_destroy(moonlet_etcd *e);
/* The endpoint that answered last (for logs). */
const char *moonlet_etcd_endpoint(moonlet_etcd *e);

/* Grants a lease of ttl_s seconds: *id gets its id, *granted_ttl_s (may be
 * NULL) the TTL etcd granted. */
int moonlet_etcd_lease_grant(moonlet_etcd *e, int64_t ttl_s, int64_t *id, int64_t *granted_ttl_s);
/* Renews the lease once.  *ttl_s gets the TTL it now has from etcd's point of
 * view of this request; 0 means the lease no longer exists (expired or
 * revoked): it cannot be renewed. */
int moonlet_etcd_lease_keepalive(moonlet_etcd *e, int64_t id, int64_t *ttl_s);
/* Revokes the lease (and deletes every key bound to it). */
int moonlet_etcd_lease_revoke(moonlet_etcd *e, int64_t id);

/* One key's state.  found false: the key does not exist (then the rest is 0/NULL). */
typedef struct moonlet_etcd_kv {
    bool found;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t version;
    int64_t lease;
    char *value; /* NUL-terminated copy (the value may hold NULs: use value_len) */
    size_t value_len;
} moonlet_etcd_kv;
void moonlet_etcd_kv_free(moonlet_etcd_kv *kv);

/* Reads key.  *rev (may be NULL) gets the store's revision of the read. */
int moonlet_etcd_get(moonlet_etcd *e, const char *key, moonlet_etcd_kv *out, int64_t *rev);
/* Puts key = value (bound to lease, 0: none).  *rev (may be NULL): the new revision. */
int moonlet_etcd_put(moonlet_etcd *e, const char *key, const void *value, size_t len,
                     int64_t lease, int64_t *rev);
/* Deletes key; *deleted (may be NULL) gets how many keys went (0 or 1). */
int moonlet_etcd_delete(moonlet_etcd *e, const char *key, int64_t *deleted);

/* What a transaction compares key's revision on. */
typedef enum { MOONLET_ETCD_CREATE_REVISION, MOONLET_ETCD_MOD_REVISION } moonlet_etcd_target;

/*
 * Transaction: if key's `target` revision equals `expect`, put key = value
 * bound to `lease` (0: none); else read the key.  *succeeded says which ran;
 * *rev (may be NULL) the revision after the transaction (on success: the
 * put's revision, so a key created here has create_revision == *rev);
 * current (may be NULL) gets the key as read by the failure branch (found
 * false on success).  Create-if-absent: target CREATE_REVISION, expect 0.
 */
int moonlet_etcd_txn_put(moonlet_etcd *e, const char *key, moonlet_etcd_target target,
                         int64_t expect, const void *value, size_t len, int64_t lease,
                         bool *succeeded, int64_t *rev, moonlet_etcd_kv *current);
/* Transaction: if key's `target` revision equals `expect`, delete it.
 * *succeeded says whether the comparison held. */
int moonlet_etcd_txn_delete(moonlet_etcd *e, const char *key, moonlet_etcd_target target,
                            int64_t expect, bool *succeeded);

/* Transaction fenced on another key: if fence_key's create revision equals
 * fence_create_rev (a leader's epoch), put key = value (value NULL: delete
 * key).  *succeeded false: the fence failed (that leader is gone). */
int moonlet_etcd_txn_fenced(moonlet_etcd *e, const char *fence_key, int64_t fence_create_rev,
                            const char *key, const void *value, size_t len, bool *succeeded);

#endif
