/*
 * token.h - the cluster's shared authentication token, read from a file.
 *
 * The file holds the token on its first line (trailing newline and spaces are
 * stripped).  A file that is readable by group or others is accepted with a
 * warning.  The token itself is never logged.
 */
#ifndef MOONLET_TOKEN_H
#define MOONLET_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

/* Reads the token; *out is malloc'd.  Returns 0 or MOONLET_ERR_INVALID_PARAMS
 * (missing, unreadable or empty file; the reason is logged). */
int moonlet_token_read(const char *path, char **out);

/* Compares a presented secret (a token, a digest) with the expected one in
 * time that depends only on the expected one's length (no early exit on the
 * first mismatch; a wrong length reads the same bytes).  The one constant-time
 * comparison in moonlet: the RPC AUTH, the data plane's AUTH and its RDMA
 * digest, the metrics endpoint. */
bool moonlet_token_equal(const void *got, size_t got_len, const void *want, size_t want_len);

/* Overwrites and frees a token. */
void moonlet_token_free(char *token);

#endif
