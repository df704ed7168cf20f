/*
 * moonlet_str.h - a length-delimited string, as strings are on the wire.
 *
 * The one definition of moonlet_str, shared by the RPC argument decoder
 * (transport/rpc_args.h) and the master's API (master/master.h).
 *
 * Owns nothing, takes no locks.
 */
#ifndef MOONLET_STR_H
#define MOONLET_STR_H

#include <stdint.h>

/* A string that is not NUL-terminated (as on the wire). */
typedef struct moonlet_str {
    const char *ptr;
    uint32_t len;
} moonlet_str;

#endif
