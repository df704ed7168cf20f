/*
 * node_disk.c - a store node's disk tier in the cluster (node_disk.h):
 * reader segments, disk segment mounts and announces, demotions, trims.
 */
#include "node_disk.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "disk_tier.h"
#include "grow.h"
#include "log.h"
#include "node_disk_fields.h"
#include "thread.h"
#include "moonlet/error.h"
#include "moonlet/types.h"

#define MOD "store-disk"
#define ANNOUNCE_BATCH 256u
#define TRIM_BATCH 256u
/* A demotion batch's bytes in memory at once (its jobs' objects). */
#define DEMOTE_BATCH_BYTES (64u << 20)

/* One path: its reader segment and its mount. */
typedef struct disk_seg {
    moonlet_node_disk *nd;
    uint32_t path;
    moonlet_xfer_segment_info info; /* the reader segment (mu: its id while mounted) */
    bool registered, mounted;
    uint64_t mount_gen;             /* mu: +1 per mount (a new segment: new trims) */
    uint64_t *done;                 /* trimmed, not yet reported (the repair thread's) */
    uint32_t ndone, done_cap;
    uint64_t done_gen;              /* the mount the done offsets belong to (repair thread) */
} disk_seg;

struct moonlet_node_disk {
    pthread_mutex_t mu;
    moonlet_disk *disk;
    moonlet_xfer *tcp;
    bool own_tcp;
    disk_seg seg[MOONLET_DISK_MAX_PATHS];
    uint32_t npaths;
    _Atomic uint64_t demoted, demote_failed, reads, read_errors, trimmed, announced,
        announce_dropped;
};

/* ---- reads ------------------------------------------------------------------ */

/* A READ of a path's reader segment: exactly one object's extent and size. */
static int disk_serve_read(void *arg, uint64_t offset, uint64_t len, void **buf)
{
    disk_seg *ps = arg;
    moonlet_node_disk *nd = ps->nd;
    uint64_t size = 0;
    if (moonlet_disk_object_size(nd->disk, ps->path, offset, &size) != MOONLET_OK ||
        size != len) {
        atomic_fetch_add(&nd->read_errors, 1);
        return MOONLET_ERR_INVALID_PARAMS; /* not an object's extent and size: nothing sent */
    }
    void *b = NULL;
    if (posix_memalign(&b, MOONLET_DISK_BLOCK, len ? len : 1))
        return MOONLET_ERR_INTERNAL_ERROR;
    moonlet_disk_loc loc = {.path = ps->path, .offset = offset, .size = len};
    size_t got = 0;
    int rc = moonlet_disk_read(nd->disk, &loc, 0, NULL, 0, b, len, &got);
    if (rc == MOONLET_OK && got != len)
        rc = MOONLET_ERR_INVALID_READ;
    if (rc) {
        free(b);
        atomic_fetch_add(&nd->read_errors, 1);
        return rc;
    }
    atomic_fetch_add(&nd->reads, 1);
    *buf = b;
    return MOONLET_OK;
}

/* ---- open / close --------------------------------------------------------------- */

int moonlet_node_disk_open(const moonlet_node_disk_config *cfg, moonlet_node_disk **out)
{
    if (!cfg || !out || !cfg->paths || cfg->npaths == 0 || cfg->npaths > MOONLET_DISK_MAX_PATHS)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_node_disk *nd = calloc(1, sizeof(*nd));
    if (!nd)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&nd->mu, NULL);
    moonlet_disk_opts o = {.paths = cfg->paths, .npaths = cfg->npaths, .size = cfg->size,
                           .queue_depth = cfg->queue_depth};
    int rc = moonlet_disk_open(&o, &nd->disk);
    if (rc) {
        ML_ERR(MOD, "cannot open the disk tier: %s", moonlet_strerror(rc));
        goto fail;
    }
    nd->tcp = cfg->tcp;
    if (!nd->tcp) { /* RDMA only: a TCP instance of our own serves the disk's reads */
        if (!cfg->listen_host || !cfg->xfer_opts) {
            rc = MOONLET_ERR_INVALID_PARAMS;
            goto fail;
        }
        char addr[MOONLET_MAX_ENDPOINT_BYTES + 1];
        snprintf(addr, sizeof(addr), "%s:0", cfg->listen_host);
        moonlet_xfer_opts xo = *cfg->xfer_opts;
        xo.protocol = MOONLET_XFER_TCP;
        xo.listen_addr = addr;
        xo.device = NULL;
        rc = moonlet_xfer_create(&xo, &nd->tcp);
        if (rc) {
            ML_ERR(MOD, "cannot serve the disk tier over TCP on %s: %s", addr,
                   moonlet_strerror(rc));
            goto fail;
        }
        nd->own_tcp = true;
    }
    nd->npaths = moonlet_disk_npaths(nd->disk);
    for (uint32_t p = 0; p < nd->npaths; p++) {
        nd->seg[p] = (disk_seg){.nd = nd, .path = p};
        rc = moonlet_xfer_register_reader(nd->tcp, moonlet_disk_path_capacity(nd->disk, p),
                                          disk_serve_read, &nd->seg[p], &nd->seg[p].info);
        if (rc) {
            ML_ERR(MOD, "cannot serve disk path %u: %s", p, moonlet_strerror(rc));
            goto fail;
        }
        nd->seg[p].registered = true;
    }
    moonlet_disk_stats st;
    moonlet_disk_get_stats(nd->disk, &st);
    ML_INFO(MOD, "disk tier: %u path(s), %" PRIu64 " bytes, %" PRIu64 " objects found (%" PRIu64
            " dropped)", nd->npaths, st.capacity, st.objects, st.scan_dropped);
    *out = nd;
    return MOONLET_OK;
fail:
    moonlet_node_disk_close(nd);
    return rc;
}

void moonlet_node_disk_close(moonlet_node_disk *nd)
{
    if (!nd)
        return;
    for (uint32_t p = 0; p < nd->npaths; p++) {
        if (nd->seg[p].registered)
            moonlet_xfer_unregister_segment(nd->tcp, nd->seg[p].info.segment_id);
        free(nd->seg[p].done);
    }
    if (nd->own_tcp)
        moonlet_xfer_destroy(nd->tcp);
    moonlet_disk_close(nd->disk);
    pthread_mutex_destroy(&nd->mu);
    free(nd);
}

/* ---- mount and announce -------------------------------------------------------------- */

struct found {
    uint32_t path;
    char *key;    /* tenant NUL key, NUL-terminated */
    uint32_t key_len;
    moonlet_disk_loc loc;
    uint64_t checksum;
};

struct founds {
    struct found *v;
    uint32_t n, cap;
    bool oom;
};

static void found_visit(void *arg, uint32_t tenant, const char *key, uint32_t key_len,
                        const moonlet_disk_loc *loc, uint64_t checksum)
{
    (void)tenant;
    struct founds *f = arg;
    struct found *v = moonlet_grow(f->v, f->n, &f->cap, 256, sizeof(*v));
    char *k = malloc(key_len + 1u);
    if (!v || !k) {
        free(k);
        f->oom = true;
        return;
    }
    f->v = v;
    memcpy(k, key, key_len);
    k[key_len] = 0;
    f->v[f->n++] = (struct found){.path = loc->path, .key = k, .key_len = key_len,
                                  .loc = *loc, .checksum = checksum};
}

/* A disk key's tenant and key (tenant NUL key); false when it is not one. */
static bool split_key(const struct found *f, const char **tenant, const char **key)
{
    size_t tl = strlen(f->key);
    if (tl >= f->key_len || tl + 1 == f->key_len)
        return false;
    *tenant = f->key;
    *key = f->key + tl + 1;
    return strlen(*key) == f->key_len - tl - 1; /* no NUL inside the key */
}

static void drop_found(moonlet_node_disk *nd, const struct found *f)
{
    uint32_t gone = 0;
    moonlet_disk_remove_range(nd->disk, f->path, f->loc.offset, 1, false, &gone);
    atomic_fetch_add(&nd->announce_dropped, 1);
}

/* DiskAnnounce of what path p holds, ANNOUNCE_BATCH objects a call. */
static int announce(moonlet_node_disk *nd, moonlet_master_client *mc, const char *client_id,
                    uint32_t p, const char *seg_id, struct founds *f)
{
    const char *tenants[ANNOUNCE_BATCH], *keys[ANNOUNCE_BATCH];
    uint64_t sizes[ANNOUNCE_BATCH], sums[ANNOUNCE_BATCH], offs[ANNOUNCE_BATCH];
    const struct found *which[ANNOUNCE_BATCH];
    int32_t codes[ANNOUNCE_BATCH];
    uint32_t m = 0;
    int rc = MOONLET_OK;
    for (uint32_t i = 0; i <= f->n && rc == MOONLET_OK; i++) {
        if (m == ANNOUNCE_BATCH || (i == f->n && m > 0)) {
            rc = moonlet_mc_disk_announce(mc, client_id, seg_id, tenants, keys, sizes, sums, offs,
                                          m, codes);
            for (uint32_t k = 0; rc == MOONLET_OK && k < m; k++) {
                if (codes[k] == MOONLET_OK) {
                    atomic_fetch_add(&nd->announced, 1);
                    continue;
                }
                ML_INFO(MOD, "disk object %s of tenant %s at %" PRIu64 " not taken back (%s): "
                        "removed", keys[k], tenants[k], offs[k], moonlet_strerror(codes[k]));
                drop_found(nd, which[k]);
            }
            m = 0;
        }
        if (i == f->n || f->v[i].path != p)
            continue;
        const char *t, *k;
        if (!split_key(&f->v[i], &t, &k)) {
            drop_found(nd, &f->v[i]); /* not a moonlet object's key */
            continue;
        }
        tenants[m] = t;
        keys[m] = k;
        sizes[m] = f->v[i].loc.size;
        sums[m] = f->v[i].checksum;
        offs[m] = f->v[i].loc.offset;
        which[m++] = &f->v[i];
    }
    return rc;
}

int moonlet_node_disk_mount(moonlet_node_disk *nd, moonlet_master_client *mc,
                            const char *client_id, const uint8_t *write_key)
{
    int rc = MOONLET_OK;
    for (uint32_t p = 0; p < nd->npaths && rc == MOONLET_OK; p++) {
        disk_seg *ps = &nd->seg[p];
        /* A fresh id for every mount: a reader holding the old one is refused. */
        moonlet_xfer_segment_info info;
        rc = moonlet_xfer_register_reader(nd->tcp, moonlet_disk_path_capacity(nd->disk, p),
                                          disk_serve_read, ps, &info);
        if (rc)
            break;
        if (ps->registered)
            moonlet_xfer_unregister_segment(nd->tcp, ps->info.segment_id);
        pthread_mutex_lock(&nd->mu);
        ps->info = info;
        ps->registered = true;
        ps->mounted = false;
        ps->mount_gen++; /* a new segment: the master forgot the old one's trims */
        pthread_mutex_unlock(&nd->mu);
        char name[MOONLET_MAX_ID_BYTES + 1];
        snprintf(name, sizeof(name), "%.200s/disk%u", client_id, p);
        moonlet_segment_desc d = {.client_id = client_id, .segment_id = info.segment_id,
                                  .name = name, .base = 0, .size = info.size,
                                  .endpoint = info.endpoint, .protocol = info.protocol,
                                  .write_key = write_key, .node_clock_ms = moonlet_xfer_now_ms(),
                                  .disk = true};
        rc = moonlet_mc_mount_segment(mc, &d);
        if (rc == MOONLET_ERR_SEGMENT_ALREADY_EXISTS)
            rc = MOONLET_OK;
        if (rc) {
            ML_ERR(MOD, "mounting disk path %u failed: %s", p, moonlet_strerror(rc));
            break;
        }
        pthread_mutex_lock(&nd->mu);
        ps->mounted = true;
        pthread_mutex_unlock(&nd->mu);
    }
    if (rc)
        return rc;
    struct founds f = {0};
    moonlet_disk_scan(nd->disk, found_visit, &f);
    if (f.oom)
        ML_ERR(MOD, "out of memory listing the disk: some objects are not announced");
    for (uint32_t p = 0; p < nd->npaths && rc == MOONLET_OK; p++)
        rc = announce(nd, mc, client_id, p, nd->seg[p].info.segment_id, &f);
    for (uint32_t i = 0; i < f.n; i++)
        free(f.v[i].key);
    free(f.v);
    if (rc)
        ML_WARN(MOD, "announcing the disk's objects failed (%s); the rest come back at the next "
                "mount", moonlet_strerror(rc));
    else
        ML_INFO(MOD, "disk tier mounted: %" PRIu64 " objects announced so far",
                atomic_load(&nd->announced));
    return MOONLET_OK;
}

void moonlet_node_disk_unmount(moonlet_node_disk *nd, moonlet_master_client *mc,
                               const char *client_id)
{
    for (uint32_t p = 0; nd && p < nd->npaths; p++) {
        pthread_mutex_lock(&nd->mu);
        bool was = nd->seg[p].mounted;
        nd->seg[p].mounted = false;
        pthread_mutex_unlock(&nd->mu);
        if (was)
            moonlet_mc_unmount_segment(mc, client_id, nd->seg[p].info.segment_id);
    }
}

/* ---- demotions ----------------------------------------------------------------- */

/* The path whose mounted segment is segment_id, or UINT32_MAX. */
static uint32_t path_of(moonlet_node_disk *nd, const char *segment_id)
{
    uint32_t p = UINT32_MAX;
    pthread_mutex_lock(&nd->mu);
    for (uint32_t i = 0; i < nd->npaths && p == UINT32_MAX; i++)
        if (nd->seg[i].mounted && strcmp(nd->seg[i].info.segment_id, segment_id) == 0)
            p = i;
    pthread_mutex_unlock(&nd->mu);
    return p;
}

struct demote {
    uint32_t job;      /* index in jobs[] */
    void *buf;
    char *key;         /* tenant NUL key */
    uint32_t key_len;
    uint64_t checksum;
    moonlet_disk_loc loc;
    struct iovec iov;
    int rc;
};

/* Reads job d's bytes and readies its disk write; d->rc on failure. */
static void demote_prepare(moonlet_node_disk *nd, const moonlet_mc_repair_job *j, struct demote *d,
                           moonlet_node_disk_source read, void *arg)
{
    const moonlet_replica_desc *t = j->target.count == 1 ? &j->target.replicas[0] : NULL;
    uint32_t p = t && t->disk ? path_of(nd, t->segment_id) : UINT32_MAX;
    if (p == UINT32_MAX) {
        d->rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
        return;
    }
    size_t tl = strlen(j->tenant), kl = strlen(j->key);
    d->key_len = (uint32_t)(tl + 1 + kl);
    d->key = malloc(d->key_len + 1u);
    if (!d->key || posix_memalign(&d->buf, MOONLET_DISK_BLOCK, j->size ? j->size : 1)) {
        d->rc = MOONLET_ERR_INTERNAL_ERROR;
        return;
    }
    memcpy(d->key, j->tenant, tl + 1);
    memcpy(d->key + tl + 1, j->key, kl + 1);
    d->rc = read(arg, j, d->buf);
    if (d->rc)
        return;
    /* Without a recorded checksum (a put that skipped it), the disk keeps
     * its own of these bytes. */
    d->checksum = j->has_checksum ? j->checksum : XXH3_64bits(d->buf, j->size);
    d->loc = (moonlet_disk_loc){.path = p, .offset = t->offset, .size = j->size};
    d->iov = (struct iovec){d->buf, j->size};
}

/* Writes the prepared demotions of one batch (one sync); an extent the tier
 * finds taken by objects the master no longer knows is cleared and written
 * again, alone. */
static void demote_write(moonlet_node_disk *nd, struct demote *d, uint32_t n)
{
    moonlet_disk_wreq *reqs = calloc(n ? n : 1, sizeof(*reqs));
    int *res = calloc(n ? n : 1, sizeof(*res));
    uint32_t *which = calloc(n ? n : 1, sizeof(*which));
    uint32_t m = 0;
    if (!reqs || !res || !which) {
        for (uint32_t i = 0; i < n; i++)
            if (!d[i].rc)
                d[i].rc = MOONLET_ERR_INTERNAL_ERROR;
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (d[i].rc)
            continue;
        reqs[m] = (moonlet_disk_wreq){.loc = &d[i].loc, .placed = true, .key = d[i].key,
                                      .key_len = d[i].key_len, .iov = &d[i].iov, .iovcnt = 1,
                                      .checksum = d[i].checksum};
        which[m++] = i;
    }
    int rc = m ? moonlet_disk_write_batch(nd->disk, reqs, m, res) : MOONLET_OK;
    for (uint32_t k = 0; k < m; k++) {
        struct demote *e = &d[which[k]];
        e->rc = rc ? rc : res[k];
        if (e->rc != MOONLET_ERR_INVALID_PARAMS)
            continue;
        uint32_t gone = 0;
        uint64_t len = moonlet_disk_footprint(e->key_len, e->loc.size);
        if (moonlet_disk_remove_range(nd->disk, e->loc.path, e->loc.offset, len, true, &gone) ==
                MOONLET_OK && gone > 0) {
            ML_WARN(MOD, "disk path %u: %u object(s) the master does not know lay where it "
                    "placed a demotion: removed", e->loc.path, gone);
            e->rc = moonlet_disk_write_at(nd->disk, &e->loc, 0, e->key, e->key_len, &e->iov, 1,
                                          e->checksum);
        }
    }
out:
    free(reqs);
    free(res);
    free(which);
}

/* One call's demotions, shared by its streams: each takes the next batch
 * of jobs (under mu), prepares, writes and reports it. */
typedef struct demote_run {
    moonlet_node_disk *nd;
    moonlet_master_client *mc;
    const char *client_id;
    const moonlet_mc_repair_job *jobs;
    uint32_t n;
    moonlet_node_disk_source read;
    void *arg;
    int *results;
    pthread_mutex_t mu;
    uint32_t next;          /* mu: the first job no stream has taken */
    _Atomic uint32_t total; /* demotions reported */
} demote_run;

/* The next batch: [*first, *end) of the jobs, demotions of up to
 * DEMOTE_BATCH_BYTES of objects (at least one); false when none is left. */
static bool demote_take(demote_run *u, uint32_t *first, uint32_t *end)
{
    pthread_mutex_lock(&u->mu);
    uint32_t i = u->next, m = 0;
    uint64_t bytes = 0;
    while (i < u->n && !u->jobs[i].demote)
        i++;
    *first = i;
    for (; i < u->n && (m == 0 || bytes + u->jobs[i].size <= DEMOTE_BATCH_BYTES); i++)
        if (u->jobs[i].demote) {
            bytes += u->jobs[i].size;
            m++;
        }
    *end = u->next = i;
    pthread_mutex_unlock(&u->mu);
    return m > 0;
}

/* A stream: batches until none is left. */
static void *demote_stream(void *arg)
{
    demote_run *u = arg;
    moonlet_node_disk *nd = u->nd;
    uint32_t first, end;
    while (demote_take(u, &first, &end)) {
        struct demote *d = calloc(end - first, sizeof(*d));
        uint32_t m = 0;
        for (uint32_t i = first; i < end; i++) {
            if (!u->jobs[i].demote)
                continue;
            if (!d) {
                u->results[i] = MOONLET_ERR_INTERNAL_ERROR;
                continue;
            }
            d[m] = (struct demote){.job = i};
            demote_prepare(nd, &u->jobs[i], &d[m], u->read, u->arg);
            m++;
        }
        if (!d)
            continue;
        demote_write(nd, d, m);
        for (uint32_t k = 0; k < m; k++) {
            const moonlet_mc_repair_job *j = &u->jobs[d[k].job];
            int drc = moonlet_mc_repair_done(u->mc, u->client_id, j->job_id, d[k].rc,
                                             d[k].rc ? 0 : j->size);
            if (d[k].rc == MOONLET_OK && drc != MOONLET_OK) {
                /* the master does not want it (the object went, the job timed
                 * out): the extent is not the object's, so the copy goes */
                uint32_t gone = 0;
                moonlet_disk_remove_range(nd->disk, d[k].loc.path, d[k].loc.offset, 1, false,
                                          &gone);
            }
            if (d[k].rc)
                ML_WARN(MOD, "demotion job %" PRIu64 " failed: %s", j->job_id,
                        moonlet_strerror(d[k].rc));
            u->results[d[k].job] = d[k].rc ? d[k].rc : drc;
            atomic_fetch_add(u->results[d[k].job] ? &nd->demote_failed : &nd->demoted, 1);
            free(d[k].buf);
            free(d[k].key);
            atomic_fetch_add(&u->total, 1);
        }
        free(d);
    }
    return NULL;
}

uint32_t moonlet_node_disk_demote(moonlet_node_disk *nd, moonlet_master_client *mc,
                                  const char *client_id, const moonlet_mc_repair_job *jobs,
                                  uint32_t n, moonlet_node_disk_source read, void *arg,
                                  int *results)
{
    demote_run u = {.nd = nd, .mc = mc, .client_id = client_id, .jobs = jobs, .n = n,
                    .read = read, .arg = arg, .results = results};
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
        bytes += jobs[i].demote ? jobs[i].size : 0;
    pthread_mutex_init(&u.mu, NULL);
    /* more than one batch: a second stream, so that one batch's data sync
     * overlaps the other's writes (the tier gives each its own lane) */
    pthread_t th;
    bool second = bytes > DEMOTE_BATCH_BYTES &&
                  moonlet_thread_create(&th, demote_stream, &u, "ml-demote") == 0;
    demote_stream(&u);
    if (second)
        pthread_join(th, NULL);
    pthread_mutex_destroy(&u.mu);
    return atomic_load(&u.total);
}

/* ---- trims ----------------------------------------------------------------------- */

int moonlet_node_disk_trim(moonlet_node_disk *nd, moonlet_master_client *mc,
                           const char *client_id)
{
    int rc = MOONLET_OK;
    for (uint32_t p = 0; p < nd->npaths && rc == MOONLET_OK; p++) {
        disk_seg *ps = &nd->seg[p];
        char seg_id[MOONLET_MAX_ID_BYTES + 1];
        pthread_mutex_lock(&nd->mu);
        bool mounted = ps->mounted;
        uint64_t gen = ps->mount_gen;
        snprintf(seg_id, sizeof(seg_id), "%s", ps->info.segment_id);
        pthread_mutex_unlock(&nd->mu);
        if (!mounted)
            continue;
        if (gen != ps->done_gen) { /* another segment than the offsets were the trims of */
            ps->ndone = 0;
            ps->done_gen = gen;
        }
        uint64_t offs[TRIM_BATCH], lens[TRIM_BATCH];
        uint32_t got = 0;
        rc = moonlet_mc_disk_trim(mc, client_id, seg_id, ps->done, ps->ndone, offs, lens,
                                  TRIM_BATCH, &got);
        if (rc)
            break;
        ps->ndone = 0;
        for (uint32_t k = 0; k < got; k++) {
            uint32_t gone = 0;
            int r = moonlet_disk_remove_range(nd->disk, p, offs[k], lens[k], false, &gone);
            if (r != MOONLET_OK) { /* reported again next round */
                ML_WARN(MOD, "disk path %u: invalidating [%" PRIu64 ", +%" PRIu64 ") failed: %s",
                        p, offs[k], lens[k], moonlet_strerror(r));
                continue;
            }
            uint64_t *v = moonlet_grow(ps->done, ps->ndone, &ps->done_cap, 64, sizeof(*v));
            if (!v)
                break;
            ps->done = v;
            ps->done[ps->ndone++] = offs[k];
            atomic_fetch_add(&nd->trimmed, 1);
        }
    }
    return rc;
}

void moonlet_node_disk_get_stats(moonlet_node_disk *nd, moonlet_node_disk_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!nd)
        return;
    out->demoted = atomic_load(&nd->demoted);
    out->demote_failed = atomic_load(&nd->demote_failed);
    out->reads = atomic_load(&nd->reads);
    out->read_errors = atomic_load(&nd->read_errors);
    out->trimmed = atomic_load(&nd->trimmed);
    out->announced = atomic_load(&nd->announced);
    out->announce_dropped = atomic_load(&nd->announce_dropped);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(nd->disk, &st);
    out->capacity = st.capacity;
    out->used = st.used;
    out->objects = st.objects;
    out->io_errors = st.io_errors;
    out->checksum_errors = st.checksum_errors;
    out->inflight = st.inflight;
    out->queue_depth = st.queue_depth;
}

void moonlet_node_disk_figures(moonlet_node_disk *nd, uint64_t *out)
{
    moonlet_node_disk_stats s;
    moonlet_node_disk_get_stats(nd, &s);
    out[MOONLET_NODE_DISK_READS] = s.reads;
    out[MOONLET_NODE_DISK_READ_ERRORS] = s.read_errors;
    out[MOONLET_NODE_DISK_IO_ERRORS] = s.io_errors;
    out[MOONLET_NODE_DISK_CHECKSUM_ERRORS] = s.checksum_errors;
    out[MOONLET_NODE_DISK_INFLIGHT] = s.inflight;
    out[MOONLET_NODE_DISK_QUEUE_DEPTH] = s.queue_depth;
    out[MOONLET_NODE_DISK_DEMOTED] = s.demoted;
    out[MOONLET_NODE_DISK_DEMOTE_FAILED] = s.demote_failed;
}
