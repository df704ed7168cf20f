/*
 * moonlet error codes.
 *
 * Every public moonlet call returns 0 (MOONLET_OK) or one of these negative
 * codes.  The numbers are Mooncake Store's ErrorCode values, so an engine that
 * already speaks Mooncake reads them the same way.  moonlet_strerror() names
 * a code; it never returns NULL.
 *
 * Two codes are moonlet's own, outside Mooncake's set: NOT_LEADER (-2000), the
 * answer of a standby master (HA on etcd, docs/reliability.md).  The client
 * library follows it to the leader by itself; a caller sees it only when no
 * leader could be reached within the call's deadline.  PERMISSION_DENIED
 * (-2001): the master knows the caller's credential, but its roles or
 * tenants do not allow this call (docs/deployment.md, roles); the
 * connection stays usable.  A token the master does not know at all is
 * ILLEGAL_CLIENT (-601), as before.
 */
#ifndef MOONLET_ERROR_H
#define MOONLET_ERROR_H

#include "moonlet/api.h"

#ifdef __cplusplus
extern "C" {
#endif

enum moonlet_error {
    MOONLET_OK = 0,
    MOONLET_ERR_INTERNAL_ERROR = -1,
    MOONLET_ERR_BUFFER_OVERFLOW = -10,
    MOONLET_ERR_SEGMENT_NOT_FOUND = -101,
    MOONLET_ERR_SEGMENT_ALREADY_EXISTS = -102,
    MOONLET_ERR_CLIENT_NOT_FOUND = -103,
    MOONLET_ERR_NO_AVAILABLE_HANDLE = -200,
    MOONLET_ERR_INVALID_VERSION = -300,
    MOONLET_ERR_INVALID_KEY = -400,
    MOONLET_ERR_WRITE_FAIL = -500,
    MOONLET_ERR_INVALID_PARAMS = -600,
    MOONLET_ERR_ILLEGAL_CLIENT = -601,
    MOONLET_ERR_INVALID_WRITE = -700,
    MOONLET_ERR_INVALID_READ = -701,
    MOONLET_ERR_INVALID_REPLICA = -702,
    MOONLET_ERR_REPLICA_IS_NOT_READY = -703,
    MOONLET_ERR_OBJECT_NOT_FOUND = -704,
    MOONLET_ERR_OBJECT_ALREADY_EXISTS = -705,
    MOONLET_ERR_OBJECT_HAS_LEASE = -706,
    MOONLET_ERR_LEASE_EXPIRED = -707,
    MOONLET_ERR_TRANSFER_FAIL = -800,
    MOONLET_ERR_RPC_FAIL = -900,
    MOONLET_ERR_RPC_TIMEOUT = -901,
    MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS = -1010,
    MOONLET_ERR_NOT_LEADER = -2000, /* moonlet's own: this master is not the leader */
    MOONLET_ERR_PERMISSION_DENIED = -2001, /* moonlet's own: the credential may not do this */
};

/* Name of an error code ("OBJECT_NOT_FOUND"); "UNKNOWN_ERROR" for others. */
MOONLET_API const char *moonlet_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
