/*
 * store_node.c - a store node as a library (store_node.h): the segment, its
 * transport registration, its mount on the master and the heartbeat loop.
 *
 * Built around one loop thread (the caller of run()) that is the only one to
 * talk to the master and to (re)register the segment, so the mount state
 * machine has a single writer:
 *
 *     mounted --Ping says 0 segments--> stale --unregister/register--> fresh
 *        ^                                                               |
 *        +-------------------------- MountSegment ok ------------------+
 *
 * Every registration gets a fresh random write key (common/writecap.h): the
 * transport refuses writes without a capability under it, and MountSegment
 * hands it to the master with this host's clock, so only writes the master
 * granted, and only until their put deadline, land in the segment.  The
 * leader epoch the master's Mount and Ping replies carry goes to the
 * transport (moonlet_xfer_note_epoch): a capability of an older leader is
 * refused from then on, as is a repair target's (issue 31 section 3).
 *
 * A Ping that fails changes nothing: the master may just be slow or
 * restarting, and only its answer tells whether it forgot the node.  Waits
 * happen on a condition variable on CLOCK_MONOTONIC, so stop() wakes the loop
 * at once; every master call is bounded by rpc_timeout_ms, which bounds how
 * long stop() can take.
 *
 * Identity: before anything else the node binds its client id on the master
 * with a random per-run secret (master_client re-sends it on every
 * reconnect), so a second node with the same --client-id is refused while
 * this one lives, and nobody else can ping or unmount for it.  Serving on a
 * non-loopback address without a token is warned about.
 *
 * Both protocols (cfg->tcp_listen_addr): a second, TCP, transport serves the
 * same memory; both registrations get the same write key (TCP checks
 * capabilities, which the master computes over the TCP segment id; RDMA
 * relies on the quarantine), and one MountSegment carries the TCP endpoint
 * and segment id as the segment's second endpoint.  They are registered,
 * re-registered and health-checked together.
 *
 * Re-replication (master/store/repair.c): a second thread, started by run(),
 * asks the master for the repair jobs whose target is this node's segment
 * (RepairFetch, every repair_poll_ms and again at once after a non-empty
 * batch), reads each object from a surviving replica over the data plane
 * (the same transport, bounds and auth as any client read), checks the
 * XXH3-64 PutEnd recorded (a mismatch tries the next source, and with none
 * left fails the job: never wrong bytes), checks the job's write capability
 * under the segment's key (genuine, covering the range, not expired on this
 * clock) and only then copies the bytes into the segment, and reports the
 * outcome (RepairDone).  The master makes the replica readable only then.
 *
 * Locks: n->mu guards `mounted`, `stopping`, `mounts`, the published copy
 * of the segment id and write key; it is never held across an RPC or a
 * transport call, only across a repair's final check and copy into the
 * segment (so a re-registration cannot slip in between).
 */
#include "store_node.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "bytesize.h"
#include "log.h"
#include "master_client.h"
#include "moonlet/error.h"
#include "net.h"
#include "node_disk.h"
#include "node_disk_fields.h"
#include "segment_mem.h"
#include "writecap.h"
#include "monotime.h"
#include "sync.h"
#include "thread.h"

#define MOONLET_STORE_NODE_HA_MOUNT_WAIT_MS 60000u /* a failover at start-up */
#define MOD "store"
#define REPAIR_FETCH_JOBS 64u /* jobs per RepairFetch (the master's most; a demotion batch) */

struct moonlet_store_node {
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* signalled by stop() */
    bool stopping;
    bool mounted;          /* the master holds the current segment id */
    bool stale;            /* the registration must be renewed before mounting */
    bool ping_failing;     /* for logging transitions only (loop thread) */
    uint64_t mounts;
    char seg_id[MOONLET_MAX_ID_BYTES + 1]; /* published copy of info.segment_id */
    char cap_id[MOONLET_MAX_ID_BYTES + 1]; /* published: the id write capabilities name */
    uint8_t pub_key[MOONLET_WRITECAP_KEY_BYTES]; /* published copy of write_key */
    uint32_t repair_poll_ms;
    pthread_t repair_thread;
    bool repair_started;
    _Atomic uint64_t repairs_done, repairs_failed, repair_bytes;

    uint32_t ping_interval_ms;
    char client_id[MOONLET_MAX_ID_BYTES + 1];
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];   /* mounted: advertised, or the listen one */
    char listen_ep[MOONLET_MAX_ENDPOINT_BYTES + 1];  /* where the transport serves */
    bool advertised;                                 /* endpoint came from advertise_addr */
    moonlet_master_client *mc;
    moonlet_xfer *xfer;
    moonlet_xfer *xfer_tcp;         /* both protocols: the TCP one; else NULL */
    char tcp_ep[MOONLET_MAX_ENDPOINT_BYTES + 1];
    bool tcp_registered;
    moonlet_xfer_segment_info tcp_info; /* loop thread only */
    moonlet_segment_mem mem;
    uint8_t write_key[MOONLET_WRITECAP_KEY_BYTES]; /* of the current registration */
    bool registered;
    moonlet_xfer_segment_info info; /* written by the loop thread only */
    moonlet_node_disk *disk;        /* the disk tier, or NULL */
    bool disk_mounted;              /* loop thread only */
};

/* ---- small helpers ---------------------------------------------------------- */

uint32_t moonlet_store_node_backoff_ms(unsigned failures)
{
    uint32_t ms = MOONLET_STORE_NODE_BACKOFF_FIRST_MS;
    for (unsigned i = 1; i < failures && ms < MOONLET_STORE_NODE_BACKOFF_CAP_MS; i++)
        ms *= 2;
    return ms < MOONLET_STORE_NODE_BACKOFF_CAP_MS ? ms : MOONLET_STORE_NODE_BACKOFF_CAP_MS;
}

bool moonlet_store_node_addr_is_loopback(const char *hostport)
{
    return strncmp(hostport, "127.", 4) == 0 || strncmp(hostport, "localhost:", 10) == 0 ||
           strncmp(hostport, "[::1]:", 6) == 0;
}

void moonlet_store_node_config_default(moonlet_store_node_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->protocol = MOONLET_XFER_AUTO;
    cfg->listen_addr = "127.0.0.1:0";
    cfg->numa_node = MOONLET_SEGMENT_MEM_NODE_AUTO;
    cfg->ping_interval_ms = MOONLET_STORE_NODE_PING_MS;
    cfg->rpc_timeout_ms = MOONLET_STORE_NODE_RPC_TIMEOUT_MS;
    cfg->huge_pages = true;
    cfg->lock_memory = true;
    cfg->client_id_wait_ms = MOONLET_STORE_NODE_ID_WAIT_MS;
}

/* Binds the client id to this node's master connection with a random
 * secret; waits (bounded by wait_ms) while another live node holds it. */
/* With HA (several masters, or NOT_LEADER seen): a failure that a failover
 * explains - no leader serving yet, the one asked deposed or gone - which
 * start-up waits out (bounded by MOONLET_STORE_NODE_HA_MOUNT_WAIT_MS).  A
 * lone master's failures stay fatal at start-up, as before. */
static bool ha_transient(moonlet_store_node *n, int rc)
{
    return (rc == MOONLET_ERR_NOT_LEADER || rc == MOONLET_ERR_RPC_FAIL ||
            rc == MOONLET_ERR_RPC_TIMEOUT) && moonlet_mc_is_ha(n->mc);
}

static int node_bind(moonlet_store_node *n, uint32_t wait_ms)
{
    unsigned char raw[24];
    char secret[2 * sizeof(raw) + 1];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        ML_ERR(MOD, "no randomness for the node secret: %s", strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        snprintf(secret + 2 * i, 3, "%02x", raw[i]);
    uint64_t deadline = moonlet_mono_ms() + wait_ms;
    uint64_t ha_until = moonlet_mono_ms() + MOONLET_STORE_NODE_HA_MOUNT_WAIT_MS;
    bool warned = false;
    for (;;) {
        int rc = moonlet_mc_bind_client(n->mc, n->client_id, secret);
        if (ha_transient(n, rc) && moonlet_mono_ms() < ha_until) { /* a failover at start-up */
            poll(NULL, 0, 200);
            continue;
        }
        if (rc != MOONLET_ERR_ILLEGAL_CLIENT || moonlet_mono_ms() >= deadline) {
            if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
                ML_ERR(MOD, "client id %s is held by another live node (two nodes started with "
                       "the same --client-id?): refusing to start", n->client_id);
            else if (rc)
                ML_ERR(MOD, "cannot bind client id %s on the master: %s", n->client_id,
                       moonlet_strerror(rc));
            return rc;
        }
        if (!warned) {
            ML_WARN(MOD, "client id %s is held by another live node, or by this node's previous "
                    "run until the master expires it: waiting up to %u ms", n->client_id, wait_ms);
            warned = true;
        }
        uint64_t left = deadline - moonlet_mono_ms();
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)((left < 250 ? left : 250) * 1000000)};
        nanosleep(&ts, NULL);
    }
}

/* "store-<hostname>-<8 hex>": unique per run, readable in listings. */
static void node_make_client_id(char *buf, size_t cap)
{
    char host[65] = "host";
    uint32_t r = 0;
    if (gethostname(host, sizeof(host)) != 0)
        strcpy(host, "host");
    host[sizeof(host) - 1] = '\0';
    if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
        r = (uint32_t)getpid() ^ (uint32_t)moonlet_mono_ms();
    snprintf(buf, cap, "store-%s-%08x", host, r);
}

static int node_check_config(const moonlet_store_node_config *c)
{
    if (!c->master_addr || !*c->master_addr) {
        ML_ERR(MOD, "no master address");
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (c->segment_size < MOONLET_STORE_NODE_MIN_SEGMENT) {
        ML_ERR(MOD, "segment size %" PRIu64 " is below the minimum of 1 MiB", c->segment_size);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (c->client_id && (!*c->client_id || strlen(c->client_id) > MOONLET_MAX_ID_BYTES)) {
        ML_ERR(MOD, "client id must be 1..%d bytes", MOONLET_MAX_ID_BYTES);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (c->advertise_addr && (!strchr(c->advertise_addr, ':') ||
                              strlen(c->advertise_addr) > MOONLET_MAX_ENDPOINT_BYTES)) {
        ML_ERR(MOD, "advertised address must be HOST:PORT of at most %d bytes",
               MOONLET_MAX_ENDPOINT_BYTES);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    return MOONLET_OK;
}

static bool node_is_mounted(moonlet_store_node *n)
{
    return moonlet_locked_bool(&n->mu, &n->mounted);
}

/* ---- registration and mounting (loop thread, or create/destroy) ------------- */

static int node_register(moonlet_store_node *n)
{
    int rc = moonlet_xfer_register_segment(n->xfer, n->mem.base, n->mem.size, &n->info);
    if (rc) {
        ML_ERR(MOD, "cannot register the segment with the transport: %s", moonlet_strerror(rc));
        return rc;
    }
    n->registered = true;
    if (n->xfer_tcp) {
        rc = moonlet_xfer_register_segment(n->xfer_tcp, n->mem.base, n->mem.size, &n->tcp_info);
        if (rc) {
            ML_ERR(MOD, "cannot register the segment with the TCP transport: %s",
                   moonlet_strerror(rc));
            return rc;
        }
        n->tcp_registered = true;
    }
    rc = moonlet_writecap_new_key(n->write_key);
    if (rc == MOONLET_OK)
        rc = moonlet_xfer_set_segment_key(n->xfer, n->info.segment_id, n->write_key);
    if (rc == MOONLET_OK && n->xfer_tcp)
        rc = moonlet_xfer_set_segment_key(n->xfer_tcp, n->tcp_info.segment_id, n->write_key);
    if (rc) {
        ML_ERR(MOD, "cannot key the segment's writes: %s", moonlet_strerror(rc));
        return rc;
    }
    pthread_mutex_lock(&n->mu);
    snprintf(n->seg_id, sizeof(n->seg_id), "%s", n->info.segment_id);
    /* the master computes capabilities over the TCP registration's id */
    snprintf(n->cap_id, sizeof(n->cap_id), "%s",
             n->xfer_tcp ? n->tcp_info.segment_id : n->info.segment_id);
    memcpy(n->pub_key, n->write_key, sizeof(n->pub_key));
    n->stale = false;
    pthread_mutex_unlock(&n->mu);
    return MOONLET_OK;
}

/* Gives the old id up (waiting for requests being served on it) and takes a
 * fresh one. */
static int node_reregister(moonlet_store_node *n)
{
    if (n->registered) {
        int rc = moonlet_xfer_unregister_segment(n->xfer, n->info.segment_id);
        if (rc && rc != MOONLET_ERR_SEGMENT_NOT_FOUND)
            ML_WARN(MOD, "unregistering segment %s: %s", n->info.segment_id, moonlet_strerror(rc));
        n->registered = false;
    }
    if (n->tcp_registered) {
        int rc = moonlet_xfer_unregister_segment(n->xfer_tcp, n->tcp_info.segment_id);
        if (rc && rc != MOONLET_ERR_SEGMENT_NOT_FOUND)
            ML_WARN(MOD, "unregistering TCP segment %s: %s", n->tcp_info.segment_id,
                    moonlet_strerror(rc));
        n->tcp_registered = false;
    }
    return node_register(n);
}

/* The leader epoch the master's replies carried (Mount, Ping) goes to the
 * data plane: capabilities of older epochs are refused from now on. */
static void node_note_epoch(moonlet_store_node *n)
{
    uint64_t e = moonlet_mc_epoch(n->mc);
    moonlet_xfer_note_epoch(n->xfer, e);
    if (n->xfer_tcp)
        moonlet_xfer_note_epoch(n->xfer_tcp, e);
}

/* The disk tier's segments, after the segment's mount; a failure is
 * retried by the next heartbeat. */
static void node_mount_disk(moonlet_store_node *n)
{
    if (!n->disk || n->disk_mounted)
        return;
    int rc = moonlet_node_disk_mount(n->disk, n->mc, n->client_id, n->write_key);
    if (rc)
        ML_WARN(MOD, "mounting the disk tier failed (%s); retried at the next heartbeat",
                moonlet_strerror(rc));
    n->disk_mounted = rc == MOONLET_OK;
}

static int node_mount(moonlet_store_node *n)
{
    pthread_mutex_lock(&n->mu);
    bool stale = n->stale;
    pthread_mutex_unlock(&n->mu);
    if (stale) {
        int rc = node_reregister(n);
        if (rc)
            return rc;
    }
    moonlet_segment_desc d = {.client_id = n->client_id, .segment_id = n->info.segment_id,
                              .name = n->client_id, .base = n->info.base,
                              .size = n->info.size,
                              .endpoint = n->advertised ? n->endpoint : n->info.endpoint,
                              .protocol = n->info.protocol, .write_key = n->write_key,
                              .node_clock_ms = moonlet_xfer_now_ms()};
    if (n->xfer_tcp) {
        d.alt_endpoint = n->tcp_info.endpoint;
        d.alt_segment_id = n->tcp_info.segment_id;
        d.alt_protocol = n->tcp_info.protocol;
    }
    int rc = moonlet_mc_mount_segment(n->mc, &d);
    if (rc == MOONLET_ERR_SEGMENT_ALREADY_EXISTS)
        rc = MOONLET_OK; /* an earlier attempt landed but its reply was lost */
    if (rc)
        return rc;
    node_note_epoch(n);
    pthread_mutex_lock(&n->mu);
    n->mounted = true;
    n->mounts++;
    pthread_mutex_unlock(&n->mu);
    n->disk_mounted = false; /* the disk segments go with each mount of the segment */
    node_mount_disk(n);
    char sz[32];
    ML_INFO(MOD, "mounted segment %s (%s) of client %s at %s://%s%s%s", d.segment_id,
            moonlet_bytesize_format(d.size, sz, sizeof(sz)), n->client_id, d.protocol,
            d.endpoint, d.alt_endpoint ? " and tcp://" : "", d.alt_endpoint ? d.alt_endpoint : "");
    return MOONLET_OK;
}

static void node_unmount(moonlet_store_node *n)
{
    if (!node_is_mounted(n))
        return;
    if (n->disk)
        moonlet_node_disk_unmount(n->disk, n->mc, n->client_id);
    n->disk_mounted = false;
    int rc = moonlet_mc_unmount_segment(n->mc, n->client_id, n->info.segment_id);
    if (rc == MOONLET_OK || rc == MOONLET_ERR_SEGMENT_NOT_FOUND)
        ML_INFO(MOD, "unmounted segment %s", n->info.segment_id);
    else
        ML_WARN(MOD, "unmount of segment %s failed (%s); the master drops it when the "
                "liveness TTL runs out", n->info.segment_id, moonlet_strerror(rc));
    pthread_mutex_lock(&n->mu);
    n->mounted = false;
    pthread_mutex_unlock(&n->mu);
}

/* Segments the master still lists under our client id belong to an earlier
 * run of this node that did not unmount (killed, or the host died). */
static void node_unmount_leftovers(moonlet_store_node *n)
{
    cJSON *reply = NULL;
    /* Only our own segments (a master older than paging sends them all). */
    if (moonlet_mc_list_segments_page(n->mc, 0, 0, n->client_id, &reply) != MOONLET_OK)
        return;
    const cJSON *segs = cJSON_IsArray(reply) ? reply : cJSON_GetObjectItem(reply, "segments");
    const cJSON *s;
    cJSON_ArrayForEach(s, segs) {
        const char *owner = cJSON_GetStringValue(cJSON_GetObjectItem(s, "client_id"));
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(s, "segment_id"));
        if (!owner || !id || strcmp(owner, n->client_id) != 0)
            continue;
        int rc = moonlet_mc_unmount_segment(n->mc, n->client_id, id);
        ML_WARN(MOD, "segment %s was left mounted by an earlier run of client %s: unmount %s",
                id, n->client_id, moonlet_strerror(rc));
    }
    cJSON_Delete(reply);
}

/* ---- the heartbeat ------------------------------------------------------------ */

static void node_note_ping(moonlet_store_node *n, int rc)
{
    if (rc && !n->ping_failing)
        ML_WARN(MOD, "master call failed (%s); retrying with backoff up to %u ms",
                moonlet_strerror(rc), MOONLET_STORE_NODE_BACKOFF_CAP_MS);
    else if (!rc && n->ping_failing)
        ML_INFO(MOD, "master answers again");
    n->ping_failing = rc != 0;
}

/* One beat: a Ping, or a (re-)mount when the master no longer holds us. */
static int node_heartbeat(moonlet_store_node *n)
{
    if (!node_is_mounted(n)) {
        int rc = node_mount(n);
        node_note_ping(n, rc);
        return rc;
    }
    uint32_t segs = 0;
    uint64_t disk[MOONLET_NODE_DISK_NFIELDS];
    if (n->disk) /* its disk tier's figures, for the master's inspect, Stats and /metrics */
        moonlet_node_disk_figures(n->disk, disk);
    int rc = moonlet_mc_ping_disk(n->mc, n->client_id, n->disk ? disk : NULL,
                                  MOONLET_NODE_DISK_NFIELDS, &segs);
    node_note_ping(n, rc);
    if (!rc)
        node_note_epoch(n);
    if (!rc && segs > 0)
        node_mount_disk(n); /* after a failed attempt */
    if (rc || segs > 0)
        return rc;
    ML_WARN(MOD, "the master holds no segment for client %s (it restarted, or declared this "
            "node dead): registering the segment afresh and mounting it again", n->client_id);
    pthread_mutex_lock(&n->mu);
    n->mounted = false;
    n->stale = true;
    pthread_mutex_unlock(&n->mu);
    return node_mount(n);
}

/* Waits until deadline_ms or stop(); n->mu held. */
static void node_wait_locked(moonlet_store_node *n, uint64_t deadline_ms)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ms / 1000u),
                          .tv_nsec = (long)(deadline_ms % 1000u) * 1000000L};
    while (!n->stopping && moonlet_mono_ms() < deadline_ms)
        if (pthread_cond_timedwait(&n->wake, &n->mu, &ts) == ETIMEDOUT)
            break;
}

/* ---- re-replication ------------------------------------------------------------ */

/* The transport that reaches a replica (ours or our TCP one), and which of
 * its endpoints; NULL when neither protocol matches. */
static moonlet_xfer *repair_source_xfer(moonlet_store_node *n, const moonlet_replica_desc *r,
                                        const char **ep, const char **seg)
{
    const char *mine = moonlet_xfer_protocol_name(n->xfer);
    if (strcmp(r->protocol, mine) == 0) {
        *ep = r->endpoint, *seg = r->segment_id;
        return n->xfer;
    }
    if (r->alt_protocol && strcmp(r->alt_protocol, mine) == 0) {
        *ep = r->alt_endpoint, *seg = r->alt_segment_id;
        return n->xfer;
    }
    if (n->xfer_tcp && strcmp(r->protocol, "tcp") == 0) {
        *ep = r->endpoint, *seg = r->segment_id;
        return n->xfer_tcp;
    }
    if (n->xfer_tcp && r->alt_protocol && strcmp(r->alt_protocol, "tcp") == 0) {
        *ep = r->alt_endpoint, *seg = r->alt_segment_id;
        return n->xfer_tcp;
    }
    return NULL;
}

/* Reads the object from the first source whose bytes match the checksum. */
static int repair_read(moonlet_store_node *n, const moonlet_mc_repair_job *j, void *buf)
{
    int rc = MOONLET_ERR_TRANSFER_FAIL;
    for (uint32_t i = 0; i < j->sources.count; i++) {
        const moonlet_replica_desc *r = &j->sources.replicas[i];
        const char *ep, *seg;
        moonlet_xfer *x = repair_source_xfer(n, r, &ep, &seg);
        if (!x || r->size != j->size)
            continue;
        bool reg = moonlet_xfer_register_buffer(x, buf, j->size) == MOONLET_OK;
        rc = moonlet_xfer_read(x, ep, seg, r->offset, buf, j->size);
        if (reg)
            moonlet_xfer_unregister_buffer(x, buf);
        if (rc == MOONLET_OK && j->has_checksum && XXH3_64bits(buf, j->size) != j->checksum) {
            ML_WARN(MOD, "repair job %" PRIu64 ": the bytes from %s do not match the object's "
                    "checksum; trying the next replica", j->job_id, ep);
            rc = MOONLET_ERR_INVALID_READ;
        }
        if (rc == MOONLET_OK)
            return MOONLET_OK;
    }
    return rc;
}

/* One job: read, verify, check the capability, copy into the segment. */
static int repair_one(moonlet_store_node *n, const moonlet_mc_repair_job *j)
{
    if (j->target.count != 1)
        return MOONLET_ERR_INVALID_PARAMS;
    const moonlet_replica_desc *t = &j->target.replicas[0];
    uint64_t len = j->size ? j->size : 1;
    if (j->size > n->mem.size || t->offset > n->mem.size - j->size || t->cap_tag == 0)
        return MOONLET_ERR_INVALID_WRITE;
    void *buf = malloc(len);
    if (!buf)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = repair_read(n, j, buf);
    if (rc == MOONLET_OK) {
        moonlet_writecap cap = {.offset = t->offset, .len = t->cap_len,
                                .expiry_ms = t->cap_expiry_ms, .tag = t->cap_tag};
        pthread_mutex_lock(&n->mu);
        /* The target still is our current registration, and the master
         * granted this range until a time still ahead on our clock. */
        if (strcmp(t->segment_id, n->seg_id) != 0)
            rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
        else if (!moonlet_writecap_valid(n->pub_key, n->cap_id, &cap, t->offset, j->size,
                                         moonlet_xfer_now_ms()) ||
                 moonlet_writecap_epoch(&cap) < moonlet_xfer_epoch(n->xfer))
            rc = MOONLET_ERR_INVALID_WRITE; /* forged, expired, or of an older leader */
        else
            memcpy((char *)n->mem.base + t->offset, buf, j->size);
        pthread_mutex_unlock(&n->mu);
    }
    free(buf);
    return rc;
}

static bool node_stopping(moonlet_store_node *n)
{
    return moonlet_locked_bool(&n->mu, &n->stopping);
}

/* A demotion's bytes: from this node's own segment in place when a source
 * replica is there (the usual case: the master demotes to the holder's
 * disk), else over the data path.  Either way checked against the checksum
 * the put recorded (a range reused meanwhile does not match). */
static int repair_source(void *arg, const moonlet_mc_repair_job *j, void *buf)
{
    moonlet_store_node *n = arg;
    for (uint32_t i = 0; j->has_checksum && i < j->sources.count; i++) {
        const moonlet_replica_desc *r = &j->sources.replicas[i];
        pthread_mutex_lock(&n->mu);
        bool mine = strcmp(r->segment_id, n->seg_id) == 0;
        pthread_mutex_unlock(&n->mu);
        /* The memory stays mapped for the node's life; a re-registration
         * meanwhile only makes the bytes stale, which the checksum catches. */
        mine = mine && r->size == j->size && r->offset <= n->mem.size &&
               j->size <= n->mem.size - r->offset;
        if (mine)
            memcpy(buf, (char *)n->mem.base + r->offset, j->size);
        if (mine && XXH3_64bits(buf, j->size) == j->checksum)
            return MOONLET_OK;
    }
    return repair_read(n, j, buf);
}

static void *repair_main(void *arg)
{
    moonlet_store_node *n = arg;
    unsigned failures = 0;
    int dres[REPAIR_FETCH_JOBS];
    while (!node_stopping(n)) {
        moonlet_mc_repair_job *jobs = NULL;
        uint32_t nj = 0;
        bool mounted = node_is_mounted(n);
        int rc = mounted ? moonlet_mc_repair_fetch(n->mc, n->client_id, REPAIR_FETCH_JOBS, &jobs,
                                                   &nj)
                         : MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
        if (n->disk && nj > 0) /* demotions: to the disk tier, in batches */
            moonlet_node_disk_demote(n->disk, n->mc, n->client_id, jobs, nj, repair_source, n,
                                     dres);
        if (n->disk && mounted)
            moonlet_node_disk_trim(n->disk, n->mc, n->client_id);
        for (uint32_t i = 0; i < nj && !node_stopping(n); i++) {
            if (jobs[i].demote) {
                if (!n->disk) /* not a node with a disk: say so */
                    moonlet_mc_repair_done(n->mc, n->client_id, jobs[i].job_id,
                                           MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS, 0);
                continue;
            }
            int jrc = repair_one(n, &jobs[i]);
            if (jrc)
                ML_WARN(MOD, "repair job %" PRIu64 " failed: %s", jobs[i].job_id,
                        moonlet_strerror(jrc));
            int drc = moonlet_mc_repair_done(n->mc, n->client_id, jobs[i].job_id, jrc,
                                             jrc ? 0 : jobs[i].size);
            if (jrc == MOONLET_OK && drc == MOONLET_OK) {
                atomic_fetch_add(&n->repairs_done, 1);
                atomic_fetch_add(&n->repair_bytes, jobs[i].size);
            } else {
                atomic_fetch_add(&n->repairs_failed, 1);
            }
        }
        moonlet_mc_repair_jobs_free(jobs, nj);
        failures = rc ? failures + 1 : 0;
        if (rc == MOONLET_OK && nj > 0)
            continue; /* more may be waiting */
        /* idle, or the master cannot serve (an older one does not know
         * RepairFetch: back off up to the cap) */
        uint64_t wait = rc ? moonlet_store_node_backoff_ms(failures) : n->repair_poll_ms;
        if (wait < n->repair_poll_ms)
            wait = n->repair_poll_ms;
        pthread_mutex_lock(&n->mu);
        node_wait_locked(n, moonlet_mono_ms() + wait);
        pthread_mutex_unlock(&n->mu);
    }
    return NULL;
}

int moonlet_store_node_run(moonlet_store_node *n)
{
    unsigned failures = 0;
    if (n->disk && !n->repair_poll_ms) /* demotions and trims run on that thread */
        n->repair_poll_ms = MOONLET_STORE_NODE_REPAIR_POLL_MS;
    if (n->repair_poll_ms &&
        moonlet_thread_create(&n->repair_thread, repair_main, n, "store-repair") == 0)
        n->repair_started = true;
    else if (n->repair_poll_ms)
        ML_WARN(MOD, "cannot start the repair thread: this node takes no repair job");
    uint64_t next = moonlet_mono_ms() + n->ping_interval_ms;
    int res = MOONLET_OK;
    pthread_mutex_lock(&n->mu);
    while (!n->stopping) {
        if (moonlet_mono_ms() < next) {
            node_wait_locked(n, next);
            continue;
        }
        pthread_mutex_unlock(&n->mu);
        if (moonlet_xfer_health(n->xfer) != MOONLET_OK ||
            (n->xfer_tcp && moonlet_xfer_health(n->xfer_tcp) != MOONLET_OK)) {
            ML_ERR(MOD, "the data endpoint cannot serve any more (RDMA device gone): "
                   "unmounting and exiting, for the service manager to restart the store");
            res = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
            moonlet_store_node_stop(n); /* the repair thread ends too */
            pthread_mutex_lock(&n->mu);
            break;
        }
        int rc = node_heartbeat(n);
        failures = rc ? failures + 1 : 0;
        next = moonlet_mono_ms() +
               (rc ? moonlet_store_node_backoff_ms(failures) : n->ping_interval_ms);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    if (n->repair_started) {
        pthread_join(n->repair_thread, NULL);
        n->repair_started = false;
    }
    node_unmount(n);
    return res;
}

void moonlet_store_node_stop(moonlet_store_node *n)
{
    pthread_mutex_lock(&n->mu);
    n->stopping = true;
    pthread_cond_broadcast(&n->wake);
    pthread_mutex_unlock(&n->mu);
}

/* ---- create / destroy ------------------------------------------------------------ */

static int node_alloc(moonlet_store_node *n, const moonlet_store_node_config *c)
{
    moonlet_segment_mem_opts mo = {.size = c->segment_size, .numa_node = c->numa_node,
                                   .device = c->device, .huge_pages = c->huge_pages,
                                   .lock = c->lock_memory, .prefault = true};
    int rc = moonlet_segment_mem_alloc(&mo, &n->mem);
    if (rc) {
        ML_ERR(MOD, "cannot allocate the segment: %s", moonlet_strerror(rc));
        return rc;
    }
    char sz[32], node[32] = "local (first touch)";
    if (n->mem.node >= 0)
        snprintf(node, sizeof(node), "%d", n->mem.node);
    ML_INFO(MOD, "segment of %s: NUMA node %s, %s pages, %s",
            moonlet_bytesize_format(n->mem.size, sz, sizeof(sz)), node,
            n->mem.huge ? "2 MiB" : "4 KiB", n->mem.locked ? "locked" : "not locked");
    return MOONLET_OK;
}

/* Starts serving before the segment exists: a missing device or a taken
 * port then fails in milliseconds, not after locking a large segment. */
static int node_serve(moonlet_store_node *n, const moonlet_store_node_config *c)
{
    moonlet_xfer_opts xo = {.protocol = c->protocol, .device = c->device,
                            .listen_addr = c->listen_addr ? c->listen_addr : "127.0.0.1:0",
                            .auth_token = c->auth_token, .server_threads = c->server_threads,
                            .timeout_ms = c->transfer_timeout_ms,
                            .server_max_conns = c->max_connections,
                            .server_max_conns_per_peer = c->max_connections_per_peer,
                            .server_idle_timeout_ms = c->idle_timeout_ms,
                            .rdma_tos = c->rdma_tos, .keepalive_ms = c->rdma_keepalive_ms,
                            .auth_keys = c->data_keys, .nauth_keys = c->ndata_keys};
    int rc = moonlet_xfer_create(&xo, &n->xfer);
    if (rc) {
        ML_ERR(MOD, "cannot serve on %s: %s", xo.listen_addr, moonlet_strerror(rc));
        return rc;
    }
    rc = moonlet_xfer_local_endpoint(n->xfer, n->listen_ep, sizeof(n->listen_ep));
    if (rc)
        return rc;
    if (!c->auth_token && !moonlet_store_node_addr_is_loopback(xo.listen_addr))
        ML_WARN(MOD, "serving on %s without --auth-token-file: any host that reaches this port "
                "can read and overwrite the segment's bytes", xo.listen_addr);
    if (c->tcp_listen_addr) {
        if (strcmp(moonlet_xfer_protocol_name(n->xfer), "rdma") != 0 || c->advertise_addr) {
            ML_ERR(MOD, "serving both protocols needs RDMA on %s and no advertised address",
                   xo.listen_addr);
            return MOONLET_ERR_INVALID_PARAMS;
        }
        moonlet_xfer_opts to = xo;
        to.protocol = MOONLET_XFER_TCP;
        to.listen_addr = c->tcp_listen_addr;
        to.device = NULL;
        rc = moonlet_xfer_create(&to, &n->xfer_tcp);
        if (rc == MOONLET_OK)
            rc = moonlet_xfer_local_endpoint(n->xfer_tcp, n->tcp_ep, sizeof(n->tcp_ep));
        if (rc) {
            ML_ERR(MOD, "cannot serve TCP on %s: %s", to.listen_addr, moonlet_strerror(rc));
            return rc;
        }
        ML_INFO(MOD, "serving RDMA on %s and TCP on %s", n->listen_ep, n->tcp_ep);
    }
    if (!c->advertise_addr) {
        snprintf(n->endpoint, sizeof(n->endpoint), "%s", n->listen_ep);
        return MOONLET_OK;
    }
    /* rdma_cm connects to the listener itself; nothing can stand in for it. */
    if (strcmp(moonlet_xfer_protocol_name(n->xfer), "tcp") != 0) {
        ML_ERR(MOD, "an advertised address needs the tcp protocol, not %s",
               moonlet_xfer_protocol_name(n->xfer));
        return MOONLET_ERR_INVALID_PARAMS;
    }
    snprintf(n->endpoint, sizeof(n->endpoint), "%s", c->advertise_addr);
    n->advertised = true;
    ML_INFO(MOD, "serving on %s, advertising %s to the master", n->listen_ep, n->endpoint);
    return MOONLET_OK;
}

/* The disk tier, its reads served by the node's TCP transport (or, for a
 * node serving RDMA only, one of the tier's own on the listen host). */
static int node_open_disk(moonlet_store_node *n, const moonlet_store_node_config *c)
{
    moonlet_xfer *tcp = n->xfer_tcp ? n->xfer_tcp
                        : strcmp(moonlet_xfer_protocol_name(n->xfer), "tcp") == 0 ? n->xfer
                                                                                 : NULL;
    char host[MOONLET_MAX_ENDPOINT_BYTES + 1];
    uint16_t port;
    if (moonlet_net_split_hostport(n->listen_ep, host, sizeof(host), &port))
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_xfer_opts xo = {.auth_token = c->auth_token, .server_threads = c->server_threads,
                            .timeout_ms = c->transfer_timeout_ms,
                            .server_max_conns = c->max_connections,
                            .server_max_conns_per_peer = c->max_connections_per_peer,
                            .server_idle_timeout_ms = c->idle_timeout_ms,
                            .auth_keys = c->data_keys, .nauth_keys = c->ndata_keys};
    moonlet_node_disk_config dc = {.paths = c->disk_paths, .npaths = c->ndisk_paths,
                                   .size = c->disk_size, .queue_depth = c->disk_queue_depth,
                                   .tcp = tcp, .listen_host = host, .xfer_opts = &xo};
    return moonlet_node_disk_open(&dc, &n->disk);
}

void moonlet_store_node_disk_stats(moonlet_store_node *n, moonlet_node_disk_stats *out)
{
    moonlet_node_disk_get_stats(n->disk, out);
}

int moonlet_store_node_create(const moonlet_store_node_config *cfg, moonlet_store_node **out)
{
    if (!cfg || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    int rc = node_check_config(cfg);
    if (rc)
        return rc;
    moonlet_store_node *n = calloc(1, sizeof(*n));
    if (!n)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&n->mu, NULL);
    moonlet_cond_init_mono(&n->wake);
    n->ping_interval_ms = cfg->ping_interval_ms ? cfg->ping_interval_ms : MOONLET_STORE_NODE_PING_MS;
    n->repair_poll_ms = cfg->repair_poll_ms == UINT32_MAX ? 0
                        : cfg->repair_poll_ms           ? cfg->repair_poll_ms
                                                        : MOONLET_STORE_NODE_REPAIR_POLL_MS;
    if (cfg->client_id)
        snprintf(n->client_id, sizeof(n->client_id), "%s", cfg->client_id);
    else
        node_make_client_id(n->client_id, sizeof(n->client_id));

    moonlet_master_client_opts mo = {
        .timeout_ms = (int)(cfg->rpc_timeout_ms ? cfg->rpc_timeout_ms
                                                : MOONLET_STORE_NODE_RPC_TIMEOUT_MS),
        .auth_token = cfg->auth_token, .tls = cfg->tls};
    rc = moonlet_mc_create(cfg->master_addr, &mo, &n->mc);
    if (rc)
        ML_ERR(MOD, "cannot reach the master at %s: %s", cfg->master_addr, moonlet_strerror(rc));
    if (!rc)
        rc = node_bind(n, cfg->client_id_wait_ms);
    if (!rc)
        rc = node_serve(n, cfg);
    if (!rc)
        rc = node_alloc(n, cfg);
    if (!rc && cfg->ndisk_paths)
        rc = node_open_disk(n, cfg);
    if (!rc)
        rc = node_register(n);
    if (!rc) {
        node_unmount_leftovers(n);
        rc = node_mount(n);
        /* HA: a failover while starting (no leader serving yet, or the one
         * asked was deposed) is waited out, bounded; a lone master's refusal
         * stays fatal, as before */
        uint64_t until = moonlet_mono_ms() + MOONLET_STORE_NODE_HA_MOUNT_WAIT_MS;
        while (ha_transient(n, rc) && moonlet_mono_ms() < until) {
            ML_WARN(MOD, "mount: %s; waiting for a leader", moonlet_strerror(rc));
            poll(NULL, 0, 200);
            rc = node_mount(n);
        }
        if (rc)
            ML_ERR(MOD, "the master refused the mount: %s", moonlet_strerror(rc));
    }
    if (rc) {
        moonlet_store_node_destroy(n);
        return rc;
    }
    *out = n;
    return MOONLET_OK;
}

void moonlet_store_node_destroy(moonlet_store_node *n)
{
    if (!n)
        return;
    if (n->mc)
        node_unmount(n);
    /* Its reader segments are on one of the transports below. */
    moonlet_node_disk_close(n->disk);
    /* Destroying the transport closes every serving connection first, which
     * ends requests stuck on a slow or silent peer, then releases the
     * segment's registration.  Unregistering first would wait for those
     * requests for up to the transfer timeout, past a prompt SIGTERM exit. */
    moonlet_xfer_destroy(n->xfer);
    moonlet_xfer_destroy(n->xfer_tcp);
    moonlet_segment_mem_free(&n->mem);
    moonlet_mc_destroy(n->mc);
    pthread_cond_destroy(&n->wake);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

/* ---- getters ------------------------------------------------------------------------ */

const char *moonlet_store_node_endpoint(const moonlet_store_node *n)
{
    return n->endpoint;
}

const char *moonlet_store_node_listen_endpoint(const moonlet_store_node *n)
{
    return n->listen_ep;
}

const char *moonlet_store_node_client_id(const moonlet_store_node *n)
{
    return n->client_id;
}

const char *moonlet_store_node_protocol(const moonlet_store_node *n)
{
    return moonlet_xfer_protocol_name(n->xfer);
}

const char *moonlet_store_node_tcp_endpoint(const moonlet_store_node *n)
{
    return n->tcp_ep;
}

void *moonlet_store_node_segment_base(moonlet_store_node *n)
{
    return n->mem.base;
}

int moonlet_store_node_segment_id(moonlet_store_node *n, char *buf, size_t cap)
{
    pthread_mutex_lock(&n->mu);
    size_t len = strlen(n->seg_id);
    int rc = len < cap ? MOONLET_OK : MOONLET_ERR_BUFFER_OVERFLOW;
    if (!rc)
        memcpy(buf, n->seg_id, len + 1);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

uint64_t moonlet_store_node_epoch(moonlet_store_node *n)
{
    return moonlet_xfer_epoch(n->xfer);
}

uint64_t moonlet_store_node_mounts(moonlet_store_node *n)
{
    return moonlet_locked_u64(&n->mu, &n->mounts);
}

void moonlet_store_node_repairs(moonlet_store_node *n, uint64_t *done, uint64_t *failed,
                                uint64_t *bytes)
{
    *done = atomic_load(&n->repairs_done);
    *failed = atomic_load(&n->repairs_failed);
    *bytes = atomic_load(&n->repair_bytes);
}
