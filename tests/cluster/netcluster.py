"""A real moonlet cluster in network namespaces, with faults to inject.

One Cluster is one run: a master host, store hosts and client hosts, each
its own network namespace with one interface (eth0) and an address in a
private /24 that exists only inside these namespaces.  The hosts' veth peers
sit on a bridge inside a separate "switch" namespace, so the root
namespace's networking is never touched and nothing can route off the
machine (no namespace has a default route).  moonlet-master and
moonlet-store run in their hosts with `--protocol tcp` and the hosts' own
addresses; tests/cluster/mlc and moonlet-inspect run in the client and
master hosts.

Faults: SIGKILL/SIGSTOP of a daemon, a partition (the host's switch port
down, or nftables dropping everything on its eth0), a lossy link (nftables
`numgen random mod 100 < N drop` inside the host) and a slow link (relay.py,
a delaying TCP relay in the host, advertised by the store with
--advertise).

Cleanup is not optional.  Names are unique per run (prefix, harness PID and
a random tag), so a stale-cleanup can remove what a killed run of this
harness left (namespaces whose PID is gone, and the processes inside them)
without touching a run in progress.  Every Cluster is torn down by
teardown(), which a test calls in `finally`, which atexit calls, and which
SIGTERM/SIGINT/SIGHUP handlers call before the process dies; children
also get PR_SET_PDEATHSIG(SIGKILL), so a harness killed with SIGKILL takes
its daemons with it and the next run's stale-cleanup removes the namespaces.
Only processes started here are ever signalled, by PID.  Every wait has a
deadline; every loop has a bound.
"""
import atexit
import ctypes
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time

PREFIX = "mlcl-"          # every namespace of this harness starts with it
SUBNET = "10.213.7"       # a /24 that exists only inside the run's namespaces
MASTER_PORT = 50051
DATA_PORT = 7000          # each store serves on HOST:7000
RELAY_PORT = 7100         # a slowed store's relay listens on HOST:7100
IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "ip"
NFT = "/usr/sbin/nft" if os.path.exists("/usr/sbin/nft") else "nft"
PYTHON = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))

_live = set()             # clusters not yet torn down
_handlers_installed = False


class HarnessError(Exception):
    """The harness itself could not do what it was asked (not a test failure of moonlet)."""


# ---- small helpers ----------------------------------------------------------------

def run(argv, timeout=20.0, check=True, input=None):
    """Runs argv to completion (bounded); returns CompletedProcess with text output."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                           stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise HarnessError(f"{' '.join(argv)}: no exit within {timeout} s") from e
    if check and p.returncode != 0:
        raise HarnessError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def wait_for(pred, timeout, interval=0.05):
    """Polls pred() until it returns a true value or timeout seconds pass; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """preexec_fn: the child is SIGKILLed when the harness dies, whatever killed it."""
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def netns_list():
    p = run([IP, "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _pid_is_harness(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"python" in f.read()
    except OSError:
        return False


def cleanup_stale(prefix=PREFIX, log=None):
    """Removes namespaces of this harness whose run is gone (its PID is dead or
    no longer a Python process), after killing the processes inside them.
    Returns the names removed."""
    removed = []
    for name in netns_list():
        if not name.startswith(prefix):
            continue
        m = re.match(re.escape(prefix) + r"(\d+)-", name)
        owner = int(m.group(1)) if m else -1
        if owner == os.getpid() or (owner > 0 and _pid_is_harness(owner)):
            continue  # a run in progress (this one, or another one)
        _kill_netns_pids(name)
        run([IP, "netns", "del", name], check=False)
        removed.append(name)
    if removed and log:
        log(f"stale-cleanup removed {len(removed)} namespaces: {' '.join(removed)}")
    return removed


def _kill_netns_pids(ns):
    """SIGKILLs the processes inside one of this harness's namespaces (only
    processes it started can be there) and waits, bounded, for them to go."""
    p = run([IP, "netns", "pids", ns], check=False)
    pids = [int(x) for x in p.stdout.split() if x.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") and _alive(pid) for pid in pids), 5)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def namespaces_supported():
    """(True, "") when this process can create network namespaces, veth pairs
    and bridges; else (False, why)."""
    if os.geteuid() != 0:
        return False, "needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) to create network namespaces"
    for tool in (IP, NFT):
        if not shutil.which(tool):
            return False, f"{tool} is not installed (iproute2, nftables)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        p = run([IP, "netns", "add", probe], check=False)
        if p.returncode != 0:
            return False, f"cannot create a network namespace: {p.stderr.strip()}"
        p = run([IP, "-n", probe, "link", "add", "br0", "type", "bridge"], check=False)
        if p.returncode != 0:
            return False, f"cannot create a bridge in a namespace: {p.stderr.strip()}"
        p = run([IP, "netns", "exec", probe, NFT, "list", "ruleset"], check=False)
        if p.returncode != 0:
            return False, f"nftables does not work in a namespace: {p.stderr.strip()}"
    finally:
        run([IP, "netns", "del", probe], check=False)
    return True, ""


def teardown_all():
    for c in list(_live):
        c.teardown()


def _on_signal(sig, frame):
    teardown_all()
    if sig == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


def _install_handlers():
    global _handlers_installed
    if _handlers_installed:
        return
    atexit.register(teardown_all)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    _handlers_installed = True


# ---- processes ---------------------------------------------------------------------

class Proc:
    """A child process started in a namespace; stdout and stderr go to files."""

    def __init__(self, name, ns, argv, logdir, env=None):
        self.name = name
        self.ns = ns
        self.argv = argv
        self.out_path = os.path.join(logdir, f"{name}.out")
        self.err_path = os.path.join(logdir, f"{name}.err")
        self._out = open(self.out_path, "ab")
        self._err = open(self.err_path, "ab")
        # `ip netns exec` execs the program, so self.pid is the program's PID.
        self.popen = subprocess.Popen(
            [IP, "netns", "exec", ns, *argv], stdout=self._out, stderr=self._err,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent,
            env=env)
        self.pid = self.popen.pid
        self.started = time.monotonic()

    def alive(self):
        return self.popen.poll() is None

    def send(self, sig):
        if self.alive():
            self.popen.send_signal(sig)

    def wait(self, timeout):
        """Exit code, or None when it did not exit within timeout."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, sig=signal.SIGTERM, timeout=5.0):
        """Sends sig, waits; SIGKILL after timeout.  Returns the exit code."""
        if self.alive():
            self.popen.send_signal(sig)
            if self.wait(timeout) is None:
                self.popen.kill()
                self.wait(5)
        self._close()
        return self.popen.returncode

    def _close(self):
        for f in (self._out, self._err):
            if not f.closed:
                f.close()

    def stdout(self):
        with open(self.out_path, errors="replace") as f:
            return f.read()

    def stderr_tail(self, n=30):
        try:
            with open(self.err_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def wait_line(self, pattern, timeout):
        """The first match of pattern in stdout, waiting up to timeout s."""
        rx = re.compile(pattern, re.M)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.stdout())
            if m:
                return m
            if not self.alive() or time.monotonic() >= deadline:
                raise HarnessError(f"{self.name}: no '{pattern}' within {timeout} s "
                                   f"(alive={self.alive()}): {self.stderr_tail()}")
            time.sleep(0.02)

    def json(self, timeout):
        """Waits for exit (bounded) and parses the last stdout line as JSON."""
        if self.wait(timeout) is None:
            self.stop(signal.SIGTERM, 5)
            raise HarnessError(f"{self.name}: still running after {timeout} s")
        self._close()
        lines = [ln for ln in self.stdout().splitlines() if ln.strip()]
        if self.popen.returncode != 0 or not lines:
            raise HarnessError(f"{self.name}: exit {self.popen.returncode}: {self.stderr_tail()}")
        return json.loads(lines[-1])


# ---- the cluster -------------------------------------------------------------------

class Cluster:
    """Hosts, daemons and faults of one run.  Use as a context manager, or call
    start() and, in a finally, teardown()."""

    def __init__(self, build, logdir, stores=3, clients=2, ttl_sec=2, segment_size="256MiB",
                 relay_stores=(), master_args=(), rpc_timeout_ms=1000, transfer_timeout_ms=800,
                 store_transfer_timeout_ms=2000, log=print, tls=False):
        self.build = build
        self.tag = f"{PREFIX}{os.getpid()}-{random.randrange(16**4):04x}"
        self.logdir = os.path.join(logdir, self.tag)
        os.makedirs(self.logdir, exist_ok=True)
        self.n_stores, self.n_clients = stores, clients
        self.ttl_sec = ttl_sec
        self.segment_size = segment_size
        self.relay_stores = set(relay_stores)
        self.master_args = list(master_args)
        self.rpc_timeout_ms = rpc_timeout_ms
        self.transfer_timeout_ms = transfer_timeout_ms
        self.store_transfer_timeout_ms = store_transfer_timeout_ms
        self.log = log
        self.hosts = {"master": 10}
        self.hosts.update({f"store{i}": 21 + i for i in range(stores)})
        self.hosts.update({f"client{i}": 31 + i for i in range(clients)})
        self.switch = f"{self.tag}-sw"
        self.namespaces = []
        self.procs = []
        self.master = None
        self.stores = [None] * stores
        self.relays = {}
        self._relay_seq = 0  # the last control file written to a relay (set_delay)
        self._nft = {}            # host -> {"loss": ..., "partition": ...}
        self._torn = False
        self.unclean = {}         # process name -> exit code, filled by teardown()
        # tls: TLS everywhere on the control plane (mutual): the master, every
        # store, mlc and moonlet-inspect each with a certificate of a CA made
        # for this run (tests/python/tlscerts.py) in the run's log dir
        self.certs = None
        if tls:
            import sys
            sys.path.insert(0, os.path.join(HERE, "..", "python"))
            import tlscerts
            self.certs = tlscerts.CertDir(os.path.join(self.logdir, "tls"))
            self.certs.ca()
            self.certs.issue("master", "master", [f"IP:{self.ip('master')}"])
            for name in ("store", "client", "operator"):
                self.certs.issue(name, name)

    # -- names and addresses
    def ns(self, host):
        return f"{self.tag}-{host}"

    def ip(self, host):
        return f"{SUBNET}.{self.hosts[host]}"

    @property
    def master_addr(self):
        return f"{self.ip('master')}:{MASTER_PORT}"

    def store_listen(self, i):
        return f"{self.ip(f'store{i}')}:{DATA_PORT}"

    def store_endpoint(self, i):
        """The endpoint the master hands out for store i (the relay when slowed)."""
        port = RELAY_PORT if i in self.relay_stores else DATA_PORT
        return f"{self.ip(f'store{i}')}:{port}"

    def store_of_endpoint(self, endpoint):
        for i in range(self.n_stores):
            if endpoint == self.store_endpoint(i):
                return i
        return None

    def bin(self, rel):
        return os.path.join(self.build, rel)

    # -- lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def start(self):
        _install_handlers()
        _live.add(self)
        cleanup_stale(log=self.log)
        try:
            self._make_network()
            self.start_daemons()
        except BaseException:
            self.teardown()
            raise

    def start_daemons(self):
        """The master, then the stores, until every segment is mounted (a
        subclass with other daemons, e.g. tests/ha/test_ha_net.py, overrides it)."""
        self.start_master()
        for i in range(self.n_stores):
            self.start_store(i)
        if not wait_for(lambda: len(self.segments()) == self.n_stores, 15, 0.1):
            raise HarnessError(f"only {len(self.segments())} of {self.n_stores} segments mounted")

    def _make_network(self):
        t0 = time.monotonic()
        self._add_ns(self.switch)
        sw = [IP, "-n", self.switch]
        run(sw + ["link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        run(sw + ["link", "set", "lo", "up"])
        run(sw + ["link", "set", "br0", "up"])
        for host in self.hosts:
            ns = self.ns(host)
            self._add_ns(ns)
            port = self._port(host)
            # Both ends are created inside namespaces: the root namespace never sees them.
            run(sw + ["link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns])
            run(sw + ["link", "set", port, "master", "br0", "up"])
            h = [IP, "-n", ns]
            run(h + ["addr", "add", f"{self.ip(host)}/24", "dev", "eth0"])
            run(h + ["link", "set", "lo", "up"])
            run(h + ["link", "set", "eth0", "up"])
        self.log(f"network {self.tag}: {len(self.hosts)} hosts on {SUBNET}.0/24 "
                 f"in {time.monotonic() - t0:.2f} s")

    def _port(self, host):
        return "p-" + host  # switch-side veth name (<= 15 bytes)

    def _add_ns(self, name):
        run([IP, "netns", "add", name])
        self.namespaces.append(name)

    def teardown(self):
        """Stops every process (TERM, then KILL), deletes every namespace (and
        with the switch namespace the bridge).  Records in self.unclean every
        process that died on its own with a non-zero status or did not exit 0
        on SIGTERM.  Idempotent; never raises."""
        if self._torn:
            return
        self._torn = True
        _live.discard(self)
        for p in reversed(self.procs):
            try:
                died = None if p.alive() else p.popen.returncode
                rc = p.stop(signal.SIGTERM, 3)
                # A daemon must shut down cleanly on SIGTERM (exit 0; under a
                # sanitizer a leak or error makes it non-zero), and nothing
                # the harness did not kill may have died on its own.
                if died not in (None, 0) or (died is None and rc != 0 and
                                             not p.name.startswith("mlc")):
                    self.unclean[p.name] = died if died is not None else rc
            except Exception as e:  # noqa: BLE001 - teardown goes on
                self.log(f"teardown: stopping {p.name}: {e}")
        for ns in reversed(self.namespaces):
            try:
                _kill_netns_pids(ns)
                run([IP, "netns", "del", ns], check=False)
            except Exception as e:  # noqa: BLE001
                self.log(f"teardown: deleting {ns}: {e}")
        left = [n for n in netns_list() if n.startswith(self.tag)]
        if left:
            self.log(f"teardown: namespaces left behind: {left}")

    # -- processes
    def spawn(self, host, name, argv):
        p = Proc(name, self.ns(host), argv, self.logdir)
        self.procs.append(p)
        return p

    def exec(self, host, argv, timeout=30.0, check=True, input=None):
        return run([IP, "netns", "exec", self.ns(host), *argv], timeout=timeout, check=check,
                   input=input)

    def start_master(self):
        argv = [self.bin("tools/moonlet-master"), "--rpc-address", self.ip("master"),
                "--rpc-port", str(MASTER_PORT), "--client_live_ttl_sec", str(self.ttl_sec),
                "--shards", "64", "--log-level", "info", *self.master_args,
                *(self.certs.flags("master") if self.certs else [])]
        self.master = self.spawn("master", "master", argv)
        self.master.wait_line(r"^listening on ", 10)
        return self.master

    def stop_master(self, sig=signal.SIGTERM):
        rc = self.master.stop(sig, 5)
        self.procs.remove(self.master)
        return rc

    def start_store(self, i, extra=()):
        host = f"store{i}"
        argv = [self.bin("tools/moonlet-store"), "--master", self.master_addr, "--protocol", "tcp",
                "--listen", self.store_listen(i), "--segment-size", self.segment_size,
                "--client-id", f"store-{i}", "--ping-interval-ms", "200",
                "--rpc-timeout-ms", "400",
                "--transfer-timeout-ms", str(self.store_transfer_timeout_ms),
                "--log-level", "info", *extra,
                *(self.certs.flags("store") if self.certs else [])]
        if i in self.relay_stores:
            self._start_relay(i)
            argv += ["--advertise", self.store_endpoint(i)]
        p = self.spawn(host, f"store{i}", argv)
        p.wait_line(r"^listening on ", 20)
        self.stores[i] = p
        return p

    def kill_store(self, i, sig=signal.SIGKILL):
        p = self.stores[i]
        rc = p.stop(sig, 5)
        self.procs.remove(p)
        self.stores[i] = None
        return rc

    # -- questions to the master
    def inspect(self, *args, timeout=30.0, check=True):
        tls = self.certs.flags("operator") if self.certs else []
        p = self.exec("master", [self.bin("tools/moonlet-inspect"), "--master", self.master_addr,
                                 *tls, "--json", *args], timeout=timeout, check=False)
        if check and p.returncode not in (0, 1):
            raise HarnessError(f"moonlet-inspect {' '.join(args[:3])}: exit {p.returncode}: "
                               f"{p.stderr.strip()}")
        if not p.stdout.strip():
            if check:
                raise HarnessError(f"moonlet-inspect {' '.join(args[:3])}: no output: "
                                   f"{p.stderr.strip()}")
            return None
        return json.loads(p.stdout)

    def segments(self):
        try:
            d = self.inspect("segments", check=False)
        except (HarnessError, ValueError):
            return []
        return d["segments"] if d else []

    def segment_of_store(self, i):
        """The segment mounted for store i's endpoint, or None."""
        for s in self.segments():
            if s["endpoint"] == self.store_endpoint(i):
                return s
        return None

    def replicas(self, keys, tenant=None):
        """{key: [store index of each replica, in the master's order]} for the
        keys that exist (absent keys are left out)."""
        out = {}
        keys = list(keys)
        for k in range(0, len(keys), 500):
            args = (["--tenant", tenant] if tenant else []) + ["key", *keys[k:k + 500]]
            d = self.inspect(*args, timeout=60)
            for e in d["keys"]:
                if e.get("found"):
                    out[e["key"]] = [self.store_of_endpoint(r["endpoint"]) for r in e["replicas"]]
        return out

    def key_info(self, keys, tenant=None):
        args = (["--tenant", tenant] if tenant else []) + ["key", *keys]
        return {e["key"]: e for e in self.inspect(*args)["keys"]}

    def master_rss_kib(self):
        with open(f"/proc/{self.master.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return None

    # -- clients
    def mlc_argv(self, *args):
        return [self.bin("tests/cluster/mlc"), "--master", self.master_addr,
                *(self.certs.flags("client") if self.certs else []),
                "--rpc-timeout-ms", str(self.rpc_timeout_ms),
                "--transfer-timeout-ms", str(self.transfer_timeout_ms), *map(str, args)]

    def mlc(self, client, *args, timeout=120.0):
        """Runs mlc in client host `client` and returns its JSON report."""
        p = self.mlc_bg(client, *args)
        return p.json(timeout)

    def mlc_bg(self, client, *args):
        name = f"mlc{client}-{len(self.procs)}-{args[0]}"
        return self.spawn(f"client{client}", name, self.mlc_argv(*args))

    # -- faults
    def partition(self, i, how="link"):
        """Cuts store i off the network: its switch port down ("link"), or
        nftables dropping everything on its eth0 ("nft")."""
        host = f"store{i}"
        if how == "link":
            run([IP, "-n", self.switch, "link", "set", self._port(host), "down"])
        else:
            self._set_nft(host, "partition",
                          'iifname "eth0" drop', 'oifname "eth0" drop')

    def heal(self, i, how="link"):
        host = f"store{i}"
        if how == "link":
            run([IP, "-n", self.switch, "link", "set", self._port(host), "up"])
        else:
            self._set_nft(host, "partition", None, None)

    def set_loss(self, i, percent):
        """Drops percent% of the packets of store i's data traffic on its link,
        both directions (the advertised port: the relay's when it has one)."""
        port = self.store_endpoint(i).rsplit(":", 1)[1]
        if percent <= 0:
            self._set_nft(f"store{i}", "loss", None, None)
        else:
            self._set_nft(f"store{i}", "loss",
                          f'iifname "eth0" tcp dport {port} numgen random mod 100 < {percent} '
                          'counter drop',
                          f'oifname "eth0" tcp sport {port} numgen random mod 100 < {percent} '
                          'counter drop')

    def loss_drops(self, i):
        """Packets store i's loss rules (set_loss) dropped since they were set."""
        out = self.exec(f"store{i}", [NFT, "list", "table", "inet", "moonlet_fault"],
                        timeout=10).stdout
        return sum(int(n) for n in re.findall(r"counter packets (\d+)", out))

    def _set_nft(self, host, what, rule_in, rule_out):
        rules = self._nft.setdefault(host, {})
        if rule_in is None:
            rules.pop(what, None)
        else:
            rules[what] = (rule_in, rule_out)
        ins = "\n".join(f"    {r[0]}" for r in rules.values())
        outs = "\n".join(f"    {r[1]}" for r in rules.values())
        text = ("table inet moonlet_fault\ndelete table inet moonlet_fault\n"
                "table inet moonlet_fault {\n"
                "  chain in { type filter hook input priority 0; policy accept;\n" + ins + "\n  }\n"
                "  chain out { type filter hook output priority 0; policy accept;\n" + outs + "\n  }\n"
                "}\n")
        self.exec(host, [NFT, "-f", "-"], timeout=10, input=text)

    def _start_relay(self, i):
        control = os.path.join(self.logdir, f"relay{i}.json")
        with open(control, "w") as f:
            json.dump({"delay_ms": 0}, f)
        argv = [PYTHON, os.path.join(HERE, "relay.py"), "--listen", self.store_endpoint(i),
                "--target", self.store_listen(i), "--control", control]
        p = self.spawn(f"store{i}", f"relay{i}", argv)
        p.wait_line(r"^listening on ", 10)
        self.relays[i] = (p, control)

    def set_delay(self, i, ms):
        """One-way delay of store i's relay, each direction (changes apply to
        bytes arriving from now on)."""
        p, control = self.relays[i]
        self._relay_seq += 1
        seq = self._relay_seq
        tmp = control + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"delay_ms": ms, "seq": seq}, f)
        os.replace(tmp, control)
        p.wait_line(rf"^applied seq {seq}$", 10)  # the relay took it


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="moonlet cluster harness utilities")
    ap.add_argument("--cleanup", action="store_true",
                    help=f"remove namespaces ({PREFIX}*) left by dead runs of this harness")
    a = ap.parse_args()
    if a.cleanup:
        gone = cleanup_stale()
        print(f"removed {len(gone)} stale namespaces")
