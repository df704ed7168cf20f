/* token.c - reads the shared authentication token; see token.h. */
#include "token.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "moonlet/error.h"

bool moonlet_token_equal(const void *got, size_t got_len, const void *want, size_t want_len)
{
    const volatile unsigned char *g = got, *w = want;
    volatile unsigned char diff = (unsigned char)(got_len != want_len);
    for (size_t i = 0; i < want_len; i++) {
        unsigned char c = i < got_len ? g[i] : 0;
        diff |= (unsigned char)(c ^ w[i]);
    }
    return diff == 0;
}

int moonlet_token_read(const char *path, char **out)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        ML_ERR("auth", "cannot open token file %s: %s", path, strerror(errno));
        return MOONLET_ERR_INVALID_PARAMS;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        ML_WARN("auth", "token file %s is readable by group or others (mode %03o)", path,
                st.st_mode & 0777);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    size_t len = strlen(buf);
    while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t'))
        buf[--len] = 0;
    if (len == 0) {
        ML_ERR("auth", "token file %s is empty", path);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    *out = strdup(buf);
    memset(buf, 0, sizeof(buf));
    return *out ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
}

void moonlet_token_free(char *token)
{
    if (!token)
        return;
    memset(token, 0, strlen(token));
    free(token);
}
