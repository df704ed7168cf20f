/*
 * types.h - the limits every public call shares (key, id and endpoint
 * lengths) and the default tenant's name.  The replica and segment
 * descriptors of the master RPC are internal (common/replica.h).
 */
#ifndef MOONLET_TYPES_H
#define MOONLET_TYPES_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOONLET_MAX_KEY_BYTES 4096
#define MOONLET_MAX_ID_BYTES 255      /* client ids, segment ids, tenant ids */
#define MOONLET_MAX_ENDPOINT_BYTES 1023
#define MOONLET_DEFAULT_TENANT "default"

#ifdef __cplusplus
}
#endif
#endif
