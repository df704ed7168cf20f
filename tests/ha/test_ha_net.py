"""Master HA on etcd in network namespaces (issue 14): the `ha` suite's
scenarios that need a real network layout.

Each test builds a fresh cluster with tests/cluster/netcluster.py: three
etcd hosts (one member each), two master hosts (moonlet-master on etcd,
2 s lease), three store hosts and two client hosts, every one its own
network namespace on one bridge.  Under a continuous load - client0 runs a
paced put stream (`mlc put --rate`, every key's start and outcome recorded),
client1 a mixed put/get/probe/remove load - it injects one fault:

  (3) leader_etcd_cut    nftables in the leader's host drop etcd's traffic
                         only: it keeps serving its clients until its
                         fencing deadline, then the standby takes over;
  (4) leader_partition   the leader host's switch port down (cut off from
                         etcd, the other master, the stores and the
                         clients), then up again;
  (6) etcd_leader_kill   SIGKILL the etcd member that is etcd's raft
                         leader: no master failover (same leader, same
                         epoch, its serving interval never ends);
  (7) etcd_quorum_loss   SIGKILL two of the three members: the leader master
                         stops serving (it cannot keep its lease) and nobody
                         serves until a member is restarted; then a leader
                         serves again.

Each checks: 0 wrong-byte reads (mixed load, and a byte-checked read-back
of the whole put stream from the other client host); the two masters'
serving intervals (their `ha: serving begin|end epoch=E mono_ms=T` log
lines; CLOCK_MONOTONIC is one clock for every namespace of the host) never
overlap; the acknowledged puts (check_acked_puts: every one reads back its
bytes across a failover to the in-sync standby; OBJECT_NOT_FOUND only where
the same master, restarted empty, wins again); and prints one "RESULT ha_<scenario> {...}" line with the outage.

Needs root (network namespaces) and the etcd binary; skips otherwise
(meson: SKIP).  Daemon and etcd logs stay in build/meson-logs/ha-net/.
"""
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import pytest

BUILD = os.environ.get("MOONLET_BUILD_ROOT")
if not BUILD:
    raise RuntimeError("MOONLET_BUILD_ROOT is not set: run through `meson test`")
sys.path.insert(0, os.path.join(os.environ.get("MOONLET_SOURCE_ROOT", "."), "tests", "cluster"))
sys.path.insert(0, os.path.join(os.environ.get("MOONLET_SOURCE_ROOT", "."), "tests", "python"))
import daemons  # noqa: E402
import netcluster as nc  # noqa: E402

LOGDIR = os.path.join(BUILD, "meson-logs", "ha-net")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
TTL_S = 2                 # the masters' etcd lease TTL
MARGIN_MS = TTL_S * 1000 // 4   # the masters' fencing margin (election.c: TTL / 4)
RPC_MS = 1000
XFER_MS = 800
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
# etcd's raft timing: a new etcd leader 250-500 ms (plus detection) after
# losing one, inside the about TTL/2 that the masters' keepalives leave in
# the worst phase (docs/deployment.md: the rule for production settings).
# At 500 ms one keepalive failed in each run and the next got through.
ETCD_HEARTBEAT_MS = 25
ETCD_ELECTION_MS = 250

# A standby promoted in sync keeps every acknowledged put (the replication
# stream): across a failover to it every put that returned OK must read
# back its bytes.  (It was False for a while: some partition runs lost every
# put acknowledged before the failover - the new leader's own etcd lease
# expired while its promotion waited about 2 s for the follower thread's
# call to the unreachable old leader, so it was deposed and restarted
# empty; docs/reliability.md.)  A master that lost its own leadership
# restarts empty, so where the same master wins again (etcd quorum loss)
# OBJECT_NOT_FOUND is expected in any case (check_acked_puts' `keeps`).
FAILOVER_KEEPS_ACKED_PUTS = True

# What a client may see during these faults; anything else (and any wrong
# byte) fails.  NOT_LEADER, RPC_*: no master serves for a while;
# OBJECT_NOT_FOUND: the new leader starts empty (and a put started on the old
# one fails at PutEnd); SEGMENT_NOT_FOUND, NO_AVAILABLE_HANDLE: before the
# stores re-mounted; OBJECT_HAS_LEASE, REPLICA_IS_NOT_READY, TRANSFER_FAIL:
# as in the cluster suite's mixed load; LEASE_EXPIRED: a get whose read lease
# ran out while it waited out the failover (the reader's own lease check
# refuses what it read: the object outlived the failover, the lease did not);
# UNAVAILABLE_IN_CURRENT_STATUS: a write the leader could not acknowledge -
# its standby stopped acking (it is taking over) and etcd, which must first
# record it out of sync, is cut off (master/ha/repl_stream.c).
FAULT_CODES = {"NOT_LEADER", "RPC_FAIL", "RPC_TIMEOUT", "OBJECT_NOT_FOUND", "SEGMENT_NOT_FOUND",
               "NO_AVAILABLE_HANDLE", "OBJECT_HAS_LEASE", "REPLICA_IS_NOT_READY", "TRANSFER_FAIL",
               "LEASE_EXPIRED", "UNAVAILABLE_IN_CURRENT_STATUS"}
# The longest any client operation may take.  Not one RPC timeout: a
# client's master calls share one connection and queue behind each other
# (store/master_client.c holds its lock for a whole call), and reconnecting
# to a leader that is cut off waits for its connect and Hello (up to 2 s)
# under that lock - observed up to 5.8 s with 4 threads and a 1 s timeout
# while the leader's host was partitioned.
OP_BOUND_MS = 10000
SIZES = ["--min-size", "1KiB", "--max-size", "16KiB"]
PUT_RATE = 40             # paced put stream, keys a second


def result(scenario, **figures):
    print(f"RESULT ha_{scenario} {json.dumps(figures, sort_keys=True)}", flush=True)


def mono_ms():
    return time.monotonic() * 1000.0  # CLOCK_MONOTONIC, as the masters' log lines


# ---- the cluster ---------------------------------------------------------------------

class HaCluster(nc.Cluster):
    """netcluster's cluster with three etcd hosts and two master hosts on
    etcd instead of one lone master."""

    MASTERS = ("master0", "master1")
    ETCDS = ("etcd0", "etcd1", "etcd2")

    def __init__(self, build, logdir, ttl_s=TTL_S, **kw):
        super().__init__(build, logdir, **kw)
        self.hosts = {"master0": 10, "master1": 11}
        self.hosts.update({h: 41 + i for i, h in enumerate(self.ETCDS)})
        self.hosts.update({f"store{i}": 21 + i for i in range(self.n_stores)})
        self.hosts.update({f"client{i}": 31 + i for i in range(self.n_clients)})
        self.lease_ttl_s = ttl_s
        self.masters = {}   # host -> Proc
        self.etcds = {}     # host -> Proc (alive ones)
        self._etcd_gone = []
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None  # etcd fsyncs: keep it in RAM
        self.etcd_dir = tempfile.mkdtemp(prefix=f"{self.tag}-etcd-", dir=base)

    # -- names and addresses
    def maddr(self, host):
        return f"{self.ip(host)}:{nc.MASTER_PORT}"

    def master_host(self, addr):
        return next(h for h in self.MASTERS if self.maddr(h) == addr)

    @property
    def master_addr(self):
        return ",".join(self.maddr(h) for h in self.MASTERS)

    def etcd_url(self, host):
        return f"http://{self.ip(host)}:{ETCD_CLIENT_PORT}"

    # -- lifecycle
    def start_daemons(self):
        for h in self.ETCDS:
            self.start_etcd(h)
        if not nc.wait_for(lambda: self.etcd_leader() is not None, 20, 0.1):
            raise nc.HarnessError("etcd elected no leader within 20 s")
        for h in self.MASTERS:
            self.start_master(h)
        self.wait_leader(self.MASTERS, 4 * self.lease_ttl_s + 8)
        for i in range(self.n_stores):
            self.start_store(i)
        if not nc.wait_for(lambda: len(self.segments()) == self.n_stores, 15, 0.1):
            raise nc.HarnessError(f"only {len(self.segments())} of {self.n_stores} segments "
                                  "mounted")

    def start_etcd(self, host):
        """Starts (or restarts, on its data dir) the member on host."""
        peers = ",".join(f"{h}=http://{self.ip(h)}:{ETCD_PEER_PORT}" for h in self.ETCDS)
        peer = f"http://{self.ip(host)}:{ETCD_PEER_PORT}"
        argv = [ETCD, "--name", host, "--data-dir", os.path.join(self.etcd_dir, host),
                "--listen-client-urls", self.etcd_url(host),
                "--advertise-client-urls", self.etcd_url(host),
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", self.tag,
                "--heartbeat-interval", str(ETCD_HEARTBEAT_MS),
                "--election-timeout", str(ETCD_ELECTION_MS),
                "--logger", "zap", "--log-outputs", "stderr"]
        # etcd is no sanitized program: no LD_PRELOAD (the ASan runtime) for it
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        p = nc.Proc(host, self.ns(host), argv, self.logdir, env=env)
        self.procs.append(p)
        self.etcds[host] = p
        return p

    def kill_etcd(self, host):
        p = self.etcds.pop(host)
        p.stop(signal.SIGKILL, 5)
        self.procs.remove(p)
        self._etcd_gone.append(p)

    def start_master(self, host=None):
        argv = [self.bin("tools/moonlet-master"), "--rpc-address", self.ip(host),
                "--rpc-port", str(nc.MASTER_PORT), "--client_live_ttl_sec", str(self.ttl_sec),
                "--shards", "64", "--log-level", "info",
                "--etcd-endpoints", ",".join(self.etcd_url(h) for h in self.ETCDS),
                "--cluster-id", self.tag, "--advertise", self.maddr(host),
                "--etcd-lease-ttl", str(self.lease_ttl_s), *self.master_args]
        p = self.spawn(host, host, argv)
        p.wait_line(r"^listening on ", 10)
        self.masters[host] = p
        return p

    def teardown(self):
        if self._torn:
            return
        # a member that died on its own is a failure; the rest go with their
        # namespaces (SIGKILL) after the masters stopped (SIGTERM, exit 0)
        for h, p in list(self.etcds.items()):
            if not p.alive():
                self.unclean[p.name] = p.popen.returncode
            self.procs.remove(p)
        super().teardown()
        for p in list(self.etcds.values()) + self._etcd_gone:
            p.stop(signal.SIGKILL, 5)
        shutil.rmtree(self.etcd_dir, ignore_errors=True)

    # -- questions
    def inspect(self, *args, timeout=30.0, check=True):
        p = self.exec("client0", [self.bin("tools/moonlet-inspect"), "--master", self.master_addr,
                                  "--json", *args], timeout=timeout, check=False)
        if check and p.returncode not in (0, 1):
            raise nc.HarnessError(f"moonlet-inspect {' '.join(args[:3])}: exit {p.returncode}: "
                                  f"{p.stderr.strip()}")
        if not p.stdout.strip():
            if check:
                raise nc.HarnessError(f"moonlet-inspect {' '.join(args[:3])}: no output")
            return None
        return json.loads(p.stdout)

    def status(self, hosts):
        """{host: its Hello (role, serving, epoch, leader) or {} when unreachable}."""
        p = self.exec("client0", [self.bin("tools/moonlet-inspect"), "--master",
                                  ",".join(self.maddr(h) for h in hosts), "--json", "status"],
                      timeout=30, check=False)
        d = json.loads(p.stdout) if p.stdout.strip() else {"masters": []}
        out = {h: {} for h in hosts}
        for m in d["masters"]:
            if "role" in m:
                out[self.master_host(m["master"])] = m
        return out

    def serving(self, hosts):
        return [h for h, m in self.status(hosts).items()
                if m.get("role") == "leader" and m.get("serving")]

    def wait_leader(self, hosts, timeout):
        """The host of the serving leader among hosts (bounded wait)."""
        got = nc.wait_for(lambda: self.serving(hosts), timeout, 0.1)
        if not got:
            raise AssertionError(f"no serving leader among {hosts} within {timeout} s")
        return got[0]

    def etcd_status(self, host):
        """The member's /v3/maintenance/status (asked from its own host), or None."""
        code = ("import sys, urllib.request as u; print(u.urlopen(u.Request(sys.argv[1] + "
                "'/v3/maintenance/status', data=b'{}'), timeout=1).read().decode())")
        p = self.exec(host, [nc.PYTHON, "-c", code, self.etcd_url(host)], timeout=10, check=False)
        try:
            return json.loads(p.stdout) if p.returncode == 0 else None
        except ValueError:
            return None

    def etcd_leader(self, among=None):
        """The host of etcd's raft leader, as every live member in `among` sees it; or None."""
        st = {h: self.etcd_status(h) for h in (among or list(self.etcds))}
        if any(s is None for s in st.values()):
            return None
        ids = {s["header"]["member_id"]: h for h, s in st.items()}
        leaders = {s.get("leader") for s in st.values()}
        if len(leaders) != 1:
            return None
        return ids.get(leaders.pop())

    def wait_log(self, host, pattern, timeout):
        """Waits (bounded) for a line of the master's log (stderr) to match."""
        rx = re.compile(pattern, re.M)

        def seen():
            with open(self.masters[host].err_path, errors="replace") as f:
                return rx.search(f.read())
        if not nc.wait_for(seen, timeout, 0.02):
            raise AssertionError(f"{host}: no '{pattern}' in its log within {timeout} s")

    def intervals(self, host):
        """[(epoch, begin_ms, end_ms or None)] from the master's serving log lines."""
        with open(self.masters[host].err_path, errors="replace") as f:
            text = f.read()
        out, open_ = [], {}
        for m in re.finditer(r"ha: serving (begin|end) epoch=(\d+) mono_ms=(\d+)", text):
            kind, ep, t = m.group(1), int(m.group(2)), int(m.group(3))
            if kind == "begin":
                open_[ep] = t
            else:
                out.append((ep, open_.pop(ep), t))
        return sorted(out + [(ep, b, None) for ep, b in open_.items()], key=lambda iv: iv[1])

    # -- faults
    def isolate(self, host):
        """The host's switch port down: it reaches nobody, nobody reaches it."""
        nc.run([nc.IP, "-n", self.switch, "link", "set", self._port(host), "down"])

    def rejoin(self, host):
        nc.run([nc.IP, "-n", self.switch, "link", "set", self._port(host), "up"])

    def cut_etcd(self, host, cut=True):
        """nftables in host: drop everything to and from the etcd hosts (only)."""
        ips = ", ".join(self.ip(h) for h in self.ETCDS)
        if cut:
            self._set_nft(host, "etcd", f'iifname "eth0" ip saddr {{ {ips} }} drop',
                          f'oifname "eth0" ip daddr {{ {ips} }} drop')
        else:
            self._set_nft(host, "etcd", None, None)


# ---- checks ----------------------------------------------------------------------------

def assert_no_overlap(cl):
    """The masters' serving intervals never overlap; returns them by host."""
    ivs = {h: cl.intervals(h) for h in cl.MASTERS}
    flat = [(h, iv) for h, l in ivs.items() for iv in l]
    for i, (a, (ea, ba, xa)) in enumerate(flat):
        for b, (eb, bb, xb) in flat[i + 1:]:
            xa_ = float("inf") if xa is None else xa
            xb_ = float("inf") if xb is None else xb
            assert xa_ <= bb or xb_ <= ba, \
                f"serving intervals overlap: {a} {ea}:[{ba},{xa}) and {b} {eb}:[{bb},{xb})"
    return ivs


def put_ops(rep):
    """[(start_ms, end_ms, result, key)] of a paced put stream, CLOCK_MONOTONIC."""
    t0 = rep["t0_mono_ms"]
    return sorted((t0 + e["at_ms"], t0 + e["at_ms"] + e["ms"], e["result"], e["key"])
                  for e in rep["per_key"])


def first_ok_from(ops, t_ms):
    """The completion of the first successful put started at or after t_ms."""
    done = [end for start, end, r, _ in ops if r == "OK" and start >= t_ms]
    assert done, f"no put started after {t_ms:.0f} ms succeeded"
    return min(done)


def outage_ms(ops):
    """The longest time between two successive successful puts' completions."""
    done = sorted(end for _, end, r, _ in ops if r == "OK")
    return max((b - a for a, b in zip(done, done[1:])), default=float("inf"))


def check_acked_puts(cl, rep, failover_ms, client=1, keeps=FAILOVER_KEEPS_ACKED_PUTS):
    """Reads the whole put stream back from another client host, byte-checked.

    Every put that returned OK must read back its bytes - with one exception
    when `keeps` is False: a put started before
    failover_ms (the new leader's serving begin; None: no failover) may read
    OBJECT_NOT_FOUND instead.  Never other bytes, for any key.  Returns
    (acknowledged, read back, lost)."""
    g = cl.mlc(client, "get", "--prefix", rep["prefix"], "--count", rep["keys"], "--verify",
               "--per-key", "--threads", 4, *SIZES, timeout=120)
    assert g["wrong_bytes"] == 0, g["errors"]
    got = {e["key"]: e["result"] for e in g["per_key"]}
    acked = [(start, key) for start, _, r, key in put_ops(rep) if r == "OK"]
    found = sum(1 for _, k in acked if got[k] == "OK")
    lost = []
    for start, key in acked:
        if got[key] == "OK":
            continue
        may_be_lost = failover_ms is not None and not keeps and start < failover_ms
        assert may_be_lost and got[key] == "OBJECT_NOT_FOUND", \
            f"acknowledged put {key} (started at {start:.0f} ms, failover at {failover_ms}) " \
            f"reads {got[key]}"
        lost.append(key)
    return len(acked), found, len(lost)


def acked_summary(cl, rep, mixed, failover_ms, **kw):
    """check_acked_puts and the loads' summary, as fields of result()."""
    acked, found, lost = check_acked_puts(cl, rep, failover_ms, **kw)
    return {"acked_puts": acked, "acked_read_back": found, "acked_lost": lost,
            **summary(rep, mixed)}


def assert_handover(cl, old, new, t_cut, t_cut_done, served_after_cut=False):
    """The serving intervals never overlap; the old leader's last one ended by
    its fencing deadline after the cut (begun at t_cut, in place at
    t_cut_done: a keepalive sent in between may still have got through) and,
    with served_after_cut, after the cut began; the new one's, still open,
    began no earlier.  Returns (intervals, old_end, new_begin)."""
    ivs = assert_no_overlap(cl)
    old_end = ivs[old][-1][2]
    earliest = t_cut if served_after_cut else float("-inf")
    assert old_end is not None and \
        earliest < old_end <= t_cut_done + TTL_S * 1000 - MARGIN_MS + 5, (ivs, t_cut, t_cut_done)
    new_begin = ivs[new][-1][1]
    assert ivs[new][-1][2] is None and new_begin >= old_end, ivs
    return ivs, old_end, new_begin


def assert_unserved_between(ops, old_end, new_begin, ivs):
    """No put succeeded between the old leader's end and the new one's begin."""
    assert not [o for o in ops if o[2] == "OK" and old_end <= o[0] and o[1] < new_begin], ivs


def wait_standby_of(cl, old, new):
    """Healed, the old leader becomes a standby naming the new one."""
    assert nc.wait_for(lambda: cl.status([old])[old].get("leader") == cl.maddr(new) and
                       cl.status([old])[old].get("role") == "standby", 15, 0.2), \
        cl.status([old])


def assert_clean_mixed(r):
    assert r["wrong_bytes"] == 0, r
    assert r["probe_wrong"] == 0, r
    assert set(r["errors"]) <= FAULT_CODES, r["errors"]
    for kind, o in r["ops"].items():
        assert o["max_ms"] < OP_BOUND_MS, (kind, o)
    assert r["ops"]["put"]["ok"] > 0 and r["ops"]["get"]["ok"] > 0, r["ops"]


class Load:
    """client0: a paced put stream of `seconds`; client1: a mixed load as long."""

    def __init__(self, cl, name, seconds):
        self.cl = cl
        self.prefix = f"{name}/p/"
        self.count = PUT_RATE * seconds
        self.put = cl.mlc_bg(0, "put", "--prefix", self.prefix, "--count", self.count,
                             "--rate", PUT_RATE, "--threads", 4, "--per-key", *SIZES)
        self.mixed = cl.mlc_bg(1, "mixed", "--seconds", seconds, "--rate", 100, "--threads", 4,
                               "--live-max", 300, "--prefix", f"{name}/m/", *SIZES)

    def finish(self, timeout=90):
        rep = self.put.json(timeout)
        rep["prefix"] = self.prefix
        assert rep["keys"] == self.count
        mixed = self.mixed.json(timeout)
        assert_clean_mixed(mixed)
        assert set(rep["errors"]) <= FAULT_CODES, rep["errors"]
        return rep, mixed


def summary(rep, mixed):
    return {"puts": rep["keys"], "puts_ok": rep["ok"], "put_errors": rep["errors"],
            "mixed_ops": mixed["total_ops"], "mixed_errors": mixed["errors"],
            "mixed_timeline_ok": [ok for ok, _ in mixed["timeline"]]}


# ---- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def privileged():
    ok, why = nc.namespaces_supported()
    if not ok:
        pytest.skip(why)
    if not os.access(ETCD, os.X_OK):
        pytest.skip("no etcd binary (scripts/setup.sh installs etcd-server)")


@pytest.fixture
def cluster(privileged):
    c = HaCluster(BUILD, LOGDIR, ttl_sec=TTL_S, rpc_timeout_ms=RPC_MS, transfer_timeout_ms=XFER_MS,
                  segment_size="64MiB")  # a 256 MiB segment takes 3 s to lock here
    try:
        c.start()
        yield c
    finally:
        c.teardown()
    assert not c.unclean, f"processes that did not end cleanly: {c.unclean} (logs: {c.logdir})"


def the_other(cl, host):
    return next(h for h in cl.MASTERS if h != host)


def leader_under_load(cl, tag, clients):
    """(leader, the other master, load): the Load of `clients` clients
    (keys tagged `tag`) has run for 3 s, ready for a fault."""
    old = cl.wait_leader(cl.MASTERS, 5)
    new = the_other(cl, old)
    load = Load(cl, tag, clients)
    time.sleep(3)
    return old, new, load


def handover_figures(ops, t_cut, old_end, new_begin):
    """result() fields of a leader's handover after a fault begun at t_cut:
    the longest gap between puts, and from the cut to the old leader's
    fencing, the new one's serving and its first put's completion (s)."""
    first_new = first_ok_from(ops, new_begin)
    return {"outage_s": round(outage_ms(ops) / 1000, 2),
            "cut_to_old_fenced_s": round((old_end - t_cut) / 1000, 2),
            "cut_to_new_serving_s": round((new_begin - t_cut) / 1000, 2),
            "cut_to_first_put_on_new_s": round((first_new - t_cut) / 1000, 2)}


# ---- (4) full partition of the leader --------------------------------------------------------

def test_leader_partition(cluster):
    """The leader host's switch port goes down: it reaches neither etcd nor
    the other master nor the stores nor the clients.  It stops serving at its
    fencing deadline; the other master is elected and serves after its
    grace; stores re-mount and clients follow.  Healed, the old leader is a
    standby naming the new one."""
    cl = cluster
    old, new, load = leader_under_load(cl, "part", 16)
    t_cut = mono_ms()
    cl.isolate(old)
    t_cut_done = mono_ms()  # a keepalive sent before this may still have got through
    assert cl.wait_leader([new], 3 * TTL_S + 6) == new
    t_elected = mono_ms()
    time.sleep(2)  # the new leader serves under load while the old one is still cut off
    cl.rejoin(old)
    t_heal = mono_ms()
    wait_standby_of(cl, old, new)
    rep, mixed = load.finish()

    ivs, old_end, new_begin = assert_handover(cl, old, new, t_cut, t_cut_done)
    ops = put_ops(rep)
    assert_unserved_between(ops, old_end, new_begin, ivs)
    acked = acked_summary(cl, rep, mixed, new_begin)
    result("leader_partition", **handover_figures(ops, t_cut, old_end, new_begin),
           cut_to_elected_seen_s=round((t_elected - t_cut) / 1000, 2),
           partition_s=round((t_heal - t_cut) / 1000, 2),
           **acked)


# ---- (3) the leader cut off from etcd only -------------------------------------------------

def test_leader_etcd_cut(cluster):
    """nftables in the leader's host drop its etcd traffic only: it keeps
    serving its clients until its fencing deadline (puts succeed after the
    cut), then refuses; the standby takes over; the serving intervals never
    overlap; healed, the old leader is a standby."""
    cl = cluster
    old, new, load = leader_under_load(cl, "cut", 14)
    t_cut = mono_ms()
    cl.cut_etcd(old)
    # nft runs as a command: a keepalive sent before it returned may still
    # have got through (one run: fenced 1520 ms after t_cut)
    t_cut_done = mono_ms()
    assert cl.wait_leader([new], 3 * TTL_S + 6) == new
    time.sleep(1)
    cl.cut_etcd(old, cut=False)
    t_heal = mono_ms()
    wait_standby_of(cl, old, new)
    rep, mixed = load.finish()

    ivs, old_end, new_begin = assert_handover(cl, old, new, t_cut, t_cut_done, served_after_cut=True)
    ops = put_ops(rep)
    # it kept serving its clients after the cut, until fenced
    served_after_cut = [o for o in ops if o[2] == "OK" and o[0] >= t_cut_done and o[1] <= old_end]
    assert served_after_cut, (t_cut_done, old_end)
    assert_unserved_between(ops, old_end, new_begin, ivs)
    acked = acked_summary(cl, rep, mixed, new_begin)
    result("leader_etcd_cut", **handover_figures(ops, t_cut, old_end, new_begin),
           puts_served_after_cut=len(served_after_cut), cut_s=round((t_heal - t_cut) / 1000, 2),
           **acked)


# ---- (6) the etcd leader member killed ------------------------------------------------------

def test_etcd_leader_kill(cluster):
    """SIGKILL etcd's raft leader member: the other two elect a leader and
    the master's keepalives go on through them - no master failover (same
    leader, same epoch, its serving interval never ends), and every
    acknowledged put reads back its bytes."""
    cl = cluster
    leader = cl.wait_leader(cl.MASTERS, 5)
    epoch = cl.status([leader])[leader]["epoch"]
    victim = cl.etcd_leader()
    assert victim is not None
    load = Load(cl, "ekill", 12)
    time.sleep(3)
    t_kill = mono_ms()
    cl.kill_etcd(victim)
    rest = [h for h in cl.ETCDS if h != victim]
    assert nc.wait_for(lambda: cl.etcd_leader(rest) is not None, 10, 0.05)
    t_etcd = mono_ms()
    new_etcd = cl.etcd_leader(rest)
    rep, mixed = load.finish()

    st = cl.status(cl.MASTERS)
    assert st[leader]["role"] == "leader" and st[leader]["serving"], st
    assert st[leader]["epoch"] == epoch, (epoch, st)
    assert st[the_other(cl, leader)]["role"] == "standby", st
    ivs = assert_no_overlap(cl)
    assert len(ivs[leader]) == 1 and ivs[leader][0][2] is None, ivs  # one term, never ended
    assert not ivs[the_other(cl, leader)], ivs
    ops = put_ops(rep)
    acked = acked_summary(cl, rep, mixed, None)
    assert acked["acked_lost"] == 0
    gap = outage_ms(ops)
    # a put pauses at most for etcd's election, never for a master failover
    assert gap < TTL_S * 1000, gap
    assert "NOT_LEADER" not in rep["errors"] and "NOT_LEADER" not in mixed["errors"], \
        (rep["errors"], mixed["errors"])
    result("etcd_leader_kill", longest_put_gap_s=round(gap / 1000, 2),
           etcd_new_leader_seen_s=round((t_etcd - t_kill) / 1000, 2),
           etcd_leader=f"{victim} -> {new_etcd}", master_epoch=epoch,
           **acked)


# ---- (7) two of three etcd members killed -----------------------------------------------------

def test_etcd_quorum_loss(cluster):
    """SIGKILL two of the three etcd members: the leader master cannot keep
    its lease and stops serving at its fencing deadline; no master serves
    (and no put succeeds) while etcd has no quorum; one member restarted, a
    leader is elected and serves again.  The old leader is held stopped
    (SIGSTOP) until then, so that the election always goes to the in-sync
    standby: the branch where every acknowledged put must survive (a
    deposed leader restarts empty, and which master won used to be a coin
    toss); resumed, the old leader serves no more."""
    cl = cluster
    leader = cl.wait_leader(cl.MASTERS, 5)
    etcd_leader = cl.etcd_leader()
    victims = [etcd_leader] + [h for h in cl.ETCDS if h != etcd_leader][:1]
    load = Load(cl, "quorum", 20)
    time.sleep(3)
    t_kill = mono_ms()
    for h in victims:
        cl.kill_etcd(h)
    t_killed = mono_ms()  # quorum is gone only with the second kill
    cl.wait_log(leader, r"ha: serving end epoch=", 3 * TTL_S)
    t_fenced_seen = mono_ms()
    time.sleep(3)  # without quorum for a while: nobody may serve
    assert not cl.serving(cl.MASTERS)
    standby = the_other(cl, leader)
    daemons.freeze(cl.masters[leader].pid)
    try:
        t_back = mono_ms()
        cl.start_etcd(victims[1])
        now_leader = cl.wait_leader(cl.MASTERS, 4 * TTL_S + 15)
        t_serving_seen = mono_ms()
    finally:
        cl.masters[leader].send(signal.SIGCONT)
    assert now_leader == standby, (now_leader, standby)
    rep, mixed = load.finish()

    ivs = assert_no_overlap(cl)
    old_end = ivs[leader][0][2]
    assert old_end is not None and old_end <= t_killed + TTL_S * 1000 - MARGIN_MS + 5, \
        (ivs, t_kill, t_killed)
    later = sorted(iv[1] for h in cl.MASTERS for iv in ivs[h] if iv[1] > old_end)
    assert later and later[0] >= t_back, (ivs, t_back)  # nobody served without quorum
    new_begin = ivs[now_leader][-1][1]
    ops = put_ops(rep)
    assert_unserved_between(ops, old_end, new_begin, ivs)
    # the standby, in sync when quorum went, keeps every acknowledged object
    acked = acked_summary(cl, rep, mixed, new_begin, keeps=True)
    first_new = first_ok_from(ops, new_begin)
    result("etcd_quorum_loss", outage_s=round(outage_ms(ops) / 1000, 2),
           kill_to_fenced_s=round((old_end - t_kill) / 1000, 2),
           fenced_seen_s=round((t_fenced_seen - t_kill) / 1000, 2),
           without_quorum_s=round((t_back - t_kill) / 1000, 2),
           quorum_back_to_serving_s=round((new_begin - t_back) / 1000, 2),
           quorum_back_to_first_put_s=round((first_new - t_back) / 1000, 2),
           quorum_back_to_serving_seen_s=round((t_serving_seen - t_back) / 1000, 2),
           **acked)
