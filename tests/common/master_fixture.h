/*
 * master_fixture.h - helpers for tests that drive the master library directly:
 * a master without background thread on a frozen clock, segment mounting,
 * whole puts, and reading a key's lease through the inspection call.
 */
#ifndef MOONLET_TEST_MASTER_FIXTURE_H
#define MOONLET_TEST_MASTER_FIXTURE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "clock.h"
#include "master.h"
#include "moonlet/error.h"
#include "replicate.h"

#define FIX_T0 (1000ull * 1000000000ull) /* the frozen clock starts at 1000 s */

/* The defaults, with `shards` shards (0: the default) and no background
 * thread; a test sets what else it needs and hands it to fix_master_of(). */
static inline moonlet_master_config fix_config(uint32_t shards)
{
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    if (shards)
        cfg.shards = shards;
    cfg.background = false;
    return cfg;
}

/* A master of cfg, the clock frozen at now_ns (0: the real clock). */
static inline moonlet_master *fix_master_of(const moonlet_master_config *cfg, uint64_t now_ns)
{
    moonlet_clock_set_fake(now_ns);
    moonlet_master *m = NULL;
    assert_int_equal(moonlet_master_create(cfg, &m), MOONLET_OK);
    return m;
}

static inline moonlet_master *fix_master(uint32_t shards, uint64_t lease_ttl_ms)
{
    moonlet_master_config cfg = fix_config(shards);
    cfg.lease_ttl_ms = lease_ttl_ms;
    return fix_master_of(&cfg, FIX_T0);
}

static inline void fix_mount(moonlet_master *m, const char *client, const char *seg, uint64_t size)
{
    moonlet_segment_desc d = {.client_id = client, .segment_id = seg, .name = seg, .base = 0,
                              .size = size, .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
}

static inline int fix_put_t(moonlet_master *m, const char *tenant, const char *key, uint64_t size,
                            uint32_t replicas)
{
    moonlet_str t = MOONLET_STR(tenant), k = MOONLET_STR(key);
    int rc = moonlet_master_put_start(m, t, k, size, replicas, false, NULL, NULL);
    if (rc)
        return rc;
    return moonlet_master_put_end(m, t, k, NULL);
}

static inline int fix_put(moonlet_master *m, const char *key, uint64_t size)
{
    return fix_put_t(m, "", key, size, 1);
}

/* fix_master() with one segment mounted: `seg` of `client`, `size` bytes. */
static inline moonlet_master *fix_master_mounted(uint32_t shards, uint64_t lease_ttl_ms,
                                                 const char *client, const char *seg,
                                                 uint64_t size)
{
    moonlet_master *m = fix_master(shards, lease_ttl_ms);
    fix_mount(m, client, seg, size);
    return m;
}

/* Whole puts of keys <prefix><i>, i in [from, to), in the default tenant,
 * `size` bytes and `replicas` replicas each; each must succeed. */
static inline void fix_put_range(moonlet_master *m, const char *prefix, int from, int to,
                                 uint64_t size, uint32_t replicas)
{
    char k[64];
    for (int i = from; i < to; i++) {
        snprintf(k, sizeof(k), "%s%d", prefix, i);
        int rc = fix_put_t(m, "", k, size, replicas);
        if (rc != MOONLET_OK)
            fail_msg("put %s: %d", k, rc);
    }
}

/* Whole puts of the n keys in tenant, 128 bytes and one replica each; each
 * must succeed. */
static inline void fix_put_keys(moonlet_master *m, const char *tenant, const char *const *keys,
                                size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(fix_put_t(m, tenant, keys[i], 128, 1), MOONLET_OK);
}

/* cmocka teardown of a test whose state is the master its setup made (a
 * test that fails mid-way still has it destroyed). */
static inline int fix_teardown(void **state)
{
    moonlet_master_destroy(*state);
    return 0;
}

/* A test table's entry for a test that runs between its file's setup(),
 * which makes the master the test's state, and fix_teardown(). */
#define FIX_TEST(test) cmocka_unit_test_setup_teardown(test, setup, fix_teardown)

/* The master's counters now. */
static inline moonlet_master_stats fix_stats(moonlet_master *m)
{
    moonlet_master_stats st;
    moonlet_master_get_stats(m, &st);
    return st;
}

/* Lease remaining in ms, or -1 when the key does not exist. */
static inline int64_t fix_lease_t(moonlet_master *m, const char *tenant, const char *key)
{
    moonlet_key_view v;
    if (moonlet_master_inspect_key(m, MOONLET_STR(tenant), MOONLET_STR(key), &v, NULL, NULL))
        return -1;
    return (int64_t)v.lease_remaining_ms;
}

static inline int64_t fix_lease(moonlet_master *m, const char *key)
{
    return fix_lease_t(m, "", key);
}

static inline moonlet_str *fix_strs(const char *const *keys, size_t n)
{
    moonlet_str *s = calloc(n ? n : 1, sizeof(*s));
    for (size_t i = 0; i < n; i++)
        s[i] = MOONLET_STR(keys[i]);
    return s;
}

/* A key's replicas as a visit (put start, GetReplicaList, inspection) hands
 * them out, in order; at most FIX_MAX_REPS. */
#define FIX_MAX_REPS 8
struct fix_reps {
    int n;
    char segs[FIX_MAX_REPS][64];
    uint64_t off[FIX_MAX_REPS], ttl[FIX_MAX_REPS];
    uint64_t cap_expiry[FIX_MAX_REPS], cap_len[FIX_MAX_REPS], cap_tag[FIX_MAX_REPS];
    uint8_t status[FIX_MAX_REPS];
    bool has_cap[FIX_MAX_REPS], disk[FIX_MAX_REPS];
};

static inline void fix_reps_visit(void *arg, const moonlet_replica_view *r)
{
    struct fix_reps *c = arg;
    assert_true(c->n < FIX_MAX_REPS);
    snprintf(c->segs[c->n], sizeof(c->segs[0]), "%s", r->segment_id);
    c->off[c->n] = r->offset;
    c->ttl[c->n] = r->put_ttl_ms;
    c->cap_expiry[c->n] = r->cap_expiry_ms;
    c->cap_len[c->n] = r->cap_len;
    c->cap_tag[c->n] = r->cap_tag;
    c->status[c->n] = r->status;
    c->has_cap[c->n] = r->has_cap;
    c->disk[c->n] = r->disk;
    c->n++;
}

/* A whole put of key in the default tenant with the options po, sealed
 * with the checksum *ck (NULL: none); the replicas put start hands out go
 * to *r (cleared first) when r is not NULL.  Both steps must succeed. */
static inline void fix_put_opts(moonlet_master *m, const char *key, uint64_t size,
                                const moonlet_master_put_opts *po, const uint64_t *ck,
                                struct fix_reps *r)
{
    if (r)
        memset(r, 0, sizeof(*r));
    assert_int_equal(moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR(key), size, po,
                                                   r ? fix_reps_visit : NULL, r),
                     MOONLET_OK);
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR(key), ck), MOONLET_OK);
}

/* The repair jobs (re-replications and demotions) RepairFetch hands a
 * node, as a test looks at them: the first FIX_JOB_SOURCES sources only. */
#define FIX_MAX_JOBS 64
#define FIX_JOB_SOURCES 4
struct fix_job {
    uint64_t id, size, checksum;
    bool has_checksum, demote;
    char tenant[32], key[32];
    char target_seg[32], target_ep[64];
    uint64_t target_offset;
    uint8_t target_status;
    bool target_disk;
    uint32_t nsources;
    char source_seg[FIX_JOB_SOURCES][32], source_ep[FIX_JOB_SOURCES][64];
};

struct fix_jobs {
    struct fix_job j[FIX_MAX_JOBS];
    uint32_t n;
};

static inline void fix_jobs_visit(void *arg, const moonlet_repair_job_view *v)
{
    struct fix_jobs *js = arg;
    assert_true(js->n < FIX_MAX_JOBS);
    struct fix_job *j = &js->j[js->n++];
    memset(j, 0, sizeof(*j));
    j->id = v->job_id;
    j->size = v->size;
    j->checksum = v->checksum;
    j->has_checksum = v->has_checksum;
    j->demote = v->demote;
    snprintf(j->tenant, sizeof(j->tenant), "%.*s", (int)v->tenant.len, v->tenant.ptr);
    snprintf(j->key, sizeof(j->key), "%.*s", (int)v->key.len, v->key.ptr);
    snprintf(j->target_seg, sizeof(j->target_seg), "%s", v->target->segment_id);
    snprintf(j->target_ep, sizeof(j->target_ep), "%s", v->target->endpoint);
    j->target_offset = v->target->offset;
    j->target_status = v->target->status;
    j->target_disk = v->target->disk;
    j->nsources = v->nsources;
    for (uint32_t i = 0; i < v->nsources && i < FIX_JOB_SOURCES; i++) {
        snprintf(j->source_seg[i], sizeof(j->source_seg[i]), "%s", v->sources[i].segment_id);
        snprintf(j->source_ep[i], sizeof(j->source_ep[i]), "%s", v->sources[i].endpoint);
    }
}

/* RepairFetch for `client` (session 0): the jobs to *js (cleared first),
 * returns how many.  The call must succeed. */
static inline uint32_t fix_repair_fetch(moonlet_master *m, const char *client,
                                        struct fix_jobs *js)
{
    js->n = 0;
    assert_int_equal(moonlet_master_repair_fetch(m, MOONLET_STR(client), 0, FIX_MAX_JOBS,
                                                 fix_jobs_visit, js),
                     MOONLET_OK);
    return js->n;
}

/* A hot standby's end of the leader's record stream (cfg.repl_emit with
 * cfg.repl_arg a moonlet_repl_state): each record goes through the codec
 * and is applied to the standby's state; every step must succeed. */
static inline void fix_repl_apply(void *standby, const moonlet_repl_rec *rec)
{
    uint8_t buf[MOONLET_REPL_MAX_REC_BYTES];
    size_t len = moonlet_repl_encode(rec, buf, sizeof(buf));
    assert_true(len > 0);
    moonlet_repl_decoded d;
    assert_int_equal(moonlet_repl_decode(buf, len, &d), MOONLET_OK);
    assert_int_equal(moonlet_repl_state_apply(standby, &d.rec), MOONLET_OK);
}

#endif
