/*
 * verbs_check.c - the operator's self-test of one host's RDMA NIC
 * (verbs_check.h): what the device, port, GID table and host limits say, then
 * one RDMA WRITE and READ through moonlet's own transport (xfer.h) on the
 * NIC's address.  Read-only on the host; everything it creates is freed
 * before it returns.  No lock of its own.
 */
#include "verbs_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <net/if.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "moonlet/error.h"
#include "xfer.h"
#include "monotime.h"

#define CHECK_SEG (4u << 20)
#define CHECK_LEN (1u << 20)

/* First line of a small text file, newline stripped; "" when unreadable. */
static void read_line(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (!fgets(buf, (int)cap, f))
        buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

/* The interface holding IPv4/IPv6 address ip, or "" . */
static void addr_netdev(const char *ip, char *name, size_t cap)
{
    name[0] = '\0';
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs))
        return;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        char a[INET6_ADDRSTRLEN];
        if (!i->ifa_addr)
            continue;
        if (i->ifa_addr->sa_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof(a));
        else if (i->ifa_addr->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, a, sizeof(a));
        else
            continue;
        if (strcmp(a, ip) == 0) {
            snprintf(name, cap, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifs);
}

static const char *link_layer_str(uint8_t ll)
{
    switch (ll) {
    case IBV_LINK_LAYER_ETHERNET: return "Ethernet (RoCE)";
    case IBV_LINK_LAYER_INFINIBAND: return "InfiniBand";
    default: return "unspecified";
    }
}

static int mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

static const char *gid_type_str(unsigned t)
{
    switch (t) {
    case IBV_GID_TYPE_IB: return "IB/RoCE v1";
    case IBV_GID_TYPE_ROCE_V2: return "RoCE v2";
    default: return "unknown type";
    }
}

/* The GID table of the port: every valid entry, the address's marked. */
static void report_gids(struct ibv_context *ctx, uint8_t port, int tbl_len, const char *ip,
                        FILE *out)
{
    struct in6_addr want = {0};
    struct in_addr v4;
    if (inet_pton(AF_INET, ip, &v4) == 1) { /* IPv4-mapped GID */
        want.s6_addr[10] = 0xff;
        want.s6_addr[11] = 0xff;
        memcpy(&want.s6_addr[12], &v4, 4);
    } else {
        inet_pton(AF_INET6, ip, &want);
    }
    bool found = false;
    for (int i = 0; i < tbl_len && i < 256; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0))
            continue; /* an empty entry */
        char g[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, e.gid.raw, g, sizeof(g));
        bool mine = memcmp(e.gid.raw, want.s6_addr, 16) == 0;
        fprintf(out, "%s %d %s (%s)%s\n", mine ? "GID index:  " : "other GID:  ", i, g,
                gid_type_str(e.gid_type), mine && e.gid_type == IBV_GID_TYPE_ROCE_V2
                                              ? ": rdma_cm uses it" : "");
        found |= mine;
    }
    if (!found)
        fprintf(out, "GID index:   none holds %s\n", ip);
}

static void report_host(const char *dev, FILE *out)
{
    char p[256], v[128];
    snprintf(p, sizeof(p), "/sys/class/infiniband/%s/device/numa_node", dev);
    read_line(p, v, sizeof(v));
    fprintf(out, "NUMA node:   %s (run the store there: --numa-node)\n", v[0] ? v : "unknown");
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl))
        fprintf(out, "memlock:     unknown\n");
    else if (rl.rlim_cur == RLIM_INFINITY)
        fprintf(out, "memlock:     unlimited\n");
    else
        fprintf(out, "memlock:     %llu KiB (a store pins its whole segment: needs unlimited "
                "or more; LimitMEMLOCK=infinity)\n", (unsigned long long)rl.rlim_cur >> 10);
    unsigned long total = 0, free_ = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof(line), f)) {
        sscanf(line, "HugePages_Total: %lu", &total);
        sscanf(line, "HugePages_Free: %lu", &free_);
    }
    if (f)
        fclose(f);
    fprintf(out, "huge pages:  %lu free of %lu\n", free_, total);
}

/* One write (or read) of len bytes at offset off of si's segment; *us gets
 * its wall time in microseconds. */
static int timed_xfer(moonlet_xfer *cli, bool write, const moonlet_xfer_segment_info *si,
                      uint64_t off, uint8_t *buf, uint64_t len, uint64_t *us)
{
    uint64_t t0 = moonlet_mono_us();
    int rc = write ? moonlet_xfer_write(cli, si->endpoint, si->segment_id, off, buf, len)
                   : moonlet_xfer_read(cli, si->endpoint, si->segment_id, off, buf, len);
    *us = moonlet_mono_us() - t0;
    return rc;
}

/* A timed 1 MiB write (or read) at offset 4096 of the served segment seg,
 * checked byte for byte against buf; why gets the failure. */
static int checked_xfer(moonlet_xfer *cli, bool write, const moonlet_xfer_segment_info *si,
                        const uint8_t *seg, uint8_t *buf, uint64_t *us, char *why, size_t cap)
{
    int rc = timed_xfer(cli, write, si, 4096, buf, CHECK_LEN, us);
    if (rc == MOONLET_OK && memcmp(seg + 4096, buf, CHECK_LEN) == 0)
        return MOONLET_OK;
    snprintf(why, cap, "RDMA %s of 1 MiB %s %.200s %s", write ? "WRITE" : "READ",
             write ? "to" : "from", si->endpoint,
             rc ? "failed" : write ? "did not land intact" : "returned wrong bytes");
    return rc ? rc : MOONLET_ERR_TRANSFER_FAIL;
}

/* One RDMA WRITE and READ (and a 4 KiB READ) through moonlet's transport,
 * served and issued in this process on the NIC's address.  why gets the
 * failure. */
static int check_transfer(const char *ip, const char *device, FILE *out, char *why, size_t cap)
{
    char listen[128];
    snprintf(listen, sizeof(listen), strchr(ip, ':') ? "[%s]:0" : "%s:0", ip);
    moonlet_xfer_opts so = {.protocol = MOONLET_XFER_RDMA, .device = device,
                            .listen_addr = listen, .timeout_ms = 5000};
    moonlet_xfer_opts co = {.protocol = MOONLET_XFER_RDMA, .device = device, .source_addr = ip,
                            .timeout_ms = 5000, .conns_per_peer = 1};
    moonlet_xfer *srv = NULL, *cli = NULL;
    uint8_t *seg = malloc(CHECK_SEG), *buf = malloc(CHECK_LEN);
    moonlet_xfer_segment_info si;
    int rc = !seg || !buf ? MOONLET_ERR_INTERNAL_ERROR : moonlet_xfer_create(&so, &srv);
    if (rc) {
        snprintf(why, cap, "cannot serve RDMA on %s (error %d; see the log above)", ip, rc);
        goto out;
    }
    memset(seg, 0, CHECK_SEG);
    rc = moonlet_xfer_register_segment(srv, seg, CHECK_SEG, &si);
    if (rc == MOONLET_OK)
        rc = moonlet_xfer_create(&co, &cli);
    if (rc == MOONLET_OK)
        rc = moonlet_xfer_register_buffer(cli, buf, CHECK_LEN);
    if (rc) {
        snprintf(why, cap, "cannot register memory or open a client on %s (error %d; "
                 "memlock?)", ip, rc);
        goto out;
    }
    for (uint32_t i = 0; i < CHECK_LEN; i++)
        buf[i] = (uint8_t)(i * 13 + 5);
    uint64_t us_write, us_read, us_read4k;
    rc = checked_xfer(cli, true, &si, seg, buf, &us_write, why, cap);
    if (rc)
        goto out;
    memset(buf, 0, CHECK_LEN);
    rc = checked_xfer(cli, false, &si, seg, buf, &us_read, why, cap);
    if (rc)
        goto out;
    rc = timed_xfer(cli, false, &si, 0, buf, 4096, &us_read4k);
    if (rc) {
        snprintf(why, cap, "RDMA READ of 4 KiB from %.200s failed", si.endpoint);
        goto out;
    }
    fprintf(out, "transfer:    RDMA WRITE 1 MiB %.0f us, READ 1 MiB %.0f us (bytes checked), "
            "READ 4 KiB %.0f us, through moonlet on %s\n", (double)us_write, (double)us_read,
            (double)us_read4k, si.endpoint);
out:
    moonlet_xfer_destroy(cli);
    moonlet_xfer_destroy(srv);
    free(seg);
    free(buf);
    return rc;
}

int moonlet_verbs_check(const char *ip, const char *device, FILE *out)
{
    char netdev[IF_NAMESIZE + 1], why[256] = "";
    addr_netdev(ip, netdev, sizeof(netdev));
    if (!netdev[0]) {
        fprintf(out, "check: FAIL %s is not an address of this host\n", ip);
        return 1;
    }
    char p[256], v[64];
    snprintf(p, sizeof(p), "/sys/class/net/%s/mtu", netdev);
    read_line(p, v, sizeof(v));
    fprintf(out, "address:     %s on %s (netdev MTU %s)\n", ip, netdev, v[0] ? v : "?");

    /* the device rdma_cm picks for the address: a cm_id bound to it */
    struct sockaddr_storage ss = {0};
    if (inet_pton(AF_INET, ip, &((struct sockaddr_in *)&ss)->sin_addr) == 1)
        ss.ss_family = AF_INET;
    else if (inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1)
        ss.ss_family = AF_INET6;
    struct rdma_cm_id *id = NULL;
    if (!ss.ss_family || rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) {
        fprintf(out, "check: FAIL %s: %s\n", ip,
                ss.ss_family ? strerror(errno) : "not a numeric IP address");
        return 1;
    }
    if (rdma_bind_addr(id, (struct sockaddr *)&ss) || !id->verbs) {
        fprintf(out, "check: FAIL %s is on %s, which has no RDMA device (rdma link show)\n", ip,
                netdev);
        rdma_destroy_id(id);
        return 1;
    }
    struct ibv_context *ctx = id->verbs;
    char dev[64];
    snprintf(dev, sizeof(dev), "%s", ibv_get_device_name(ctx->device));
    uint8_t port = id->port_num ? id->port_num : 1;
    fprintf(out, "device:      %s port %u\n", dev, port);
    int rc = 0;
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, port, &pa)) {
        snprintf(why, sizeof(why), "cannot query %s port %u: %s", dev, port, strerror(errno));
        rc = 1;
    } else {
        fprintf(out, "port state:  %s\n", ibv_port_state_str(pa.state));
        fprintf(out, "link layer:  %s\n", link_layer_str(pa.link_layer));
        fprintf(out, "active MTU:  %d (max %d)\n", mtu_bytes(pa.active_mtu),
                mtu_bytes(pa.max_mtu));
        report_gids(ctx, port, pa.gid_tbl_len, ip, out);
        if (pa.state != IBV_PORT_ACTIVE) {
            snprintf(why, sizeof(why), "port %s/%u is not ACTIVE (%s)", dev, port,
                     ibv_port_state_str(pa.state));
            rc = 1;
        }
    }
    rdma_destroy_id(id);
    report_host(dev, out);
    if (rc == 0 && device && strcmp(device, dev) != 0) {
        snprintf(why, sizeof(why), "%s is on %s, not on --device %s", ip, dev, device);
        rc = 1;
    }
    fflush(out);
    if (rc == 0 && check_transfer(ip, device, out, why, sizeof(why)))
        rc = 1;
    if (rc)
        fprintf(out, "check: FAIL %s\n", why);
    else
        fprintf(out, "check: PASS (%s port %u serves RDMA WRITE and READ through moonlet on %s)\n",
                dev, port, ip);
    return rc;
}
