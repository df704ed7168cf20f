/*
 * capture.h - what a piece of test code logs: runs it with this process's
 * stderr sent to a temporary file (unlinked at once) and hands back the
 * text.  Used by the tests that check log lines (auth refusals, transport
 * choice).
 */
#ifndef MOONLET_TEST_CAPTURE_H
#define MOONLET_TEST_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Runs fn(arg) with stderr captured; returns what it wrote (free() it).
 * Include after cmocka.h. */
static inline char *capture_stderr(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/moonlet-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    dup2(fd, STDERR_FILENO);
    fn(arg);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    off_t len = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(pread(fd, text, (size_t)len, 0), len);
    close(fd);
    return text;
}

#endif
