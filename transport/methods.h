/*
 * methods.h - method ids and argument lists of the master's control RPC.
 *
 * The ids are part of the wire protocol: never renumber, only append.
 * Arguments are positional (the `args` array of a request); results are
 * described per method.  `tenant` is a string ("" means "default").
 * A per-key batch result element is `true`/`false`, or a negative int error.
 *
 * Replica descriptor (array): [segment_id str, endpoint str, protocol str,
 *                              base u64, offset u64, size u64, status u8]
 */
#ifndef MOONLET_METHODS_H
#define MOONLET_METHODS_H

enum moonlet_method {
    MOONLET_M_AUTH = 1,            /* [token]                          -> nil (handled by the server) */
    MOONLET_M_ECHO = 2,            /* [any...]                         -> nil (no work; for benchmarks) */
    MOONLET_M_PING = 3,            /* [client_id]                      -> {segments: n mounted for it} */
    MOONLET_M_MOUNT_SEGMENT = 4,   /* [client_id, segment_id, name, base, size, endpoint, protocol] -> nil */
    MOONLET_M_UNMOUNT_SEGMENT = 5, /* [client_id, segment_id]          -> nil */
    MOONLET_M_PUT_START = 6,       /* [tenant, key, size, replica_num, soft_pin] -> [replica...] */
    MOONLET_M_PUT_END = 7,         /* [tenant, key]                    -> nil */
    MOONLET_M_PUT_REVOKE = 8,      /* [tenant, key]                    -> nil */
    MOONLET_M_GET_REPLICA_LIST = 9,/* [tenant, key]                    -> [size, lease_ttl_ms, [replica...]] */
    MOONLET_M_EXIST_KEY = 10,      /* [tenant, key]                    -> bool (leases a hit) */
    MOONLET_M_BATCH_EXIST_KEY = 11,/* [tenant, [key...]]               -> [bool|code ...] (leases hits) */
    MOONLET_M_PROBE_KEY = 12,      /* [tenant, key]                    -> bool (never leases) */
    MOONLET_M_BATCH_PROBE_KEY = 13,/* [tenant, lease_mode, candidate_size, [key...]] -> [bool|code ...] */
    MOONLET_M_REMOVE = 14,         /* [tenant, key]                    -> nil */
    MOONLET_M_REMOVE_ALL = 15,     /* [tenant]                         -> removed count */
    MOONLET_M_LIST_SEGMENTS = 16,  /* []                               -> [{segment map}...] */
    MOONLET_M_LIST_KEYS = 17,      /* [tenant, prefix, cursor, limit]  -> {keys: [...], next_cursor} */
    MOONLET_M_INSPECT_KEY = 18,    /* [tenant, key]                    -> {key map} */
    MOONLET_M_STATS = 19,          /* []                               -> {stats map} */
    MOONLET_M_BIND_CLIENT = 20,    /* [client_id, secret str (1..64 bytes)] -> nil: this connection
                                    * now holds client_id (Ping/Mount/Unmount for it) */
    MOONLET_M__COUNT
};

#endif
