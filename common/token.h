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

/* Compares a presented token with the expected one in time that depends
 * only on the expected token's length (no early exit on the first mismatch). */
bool moonlet_token_equal(const char *got, size_t got_len, const char *want, size_t want_len);

/* Overwrites and frees a token. */
void moonlet_token_free(char *token);

#endif
