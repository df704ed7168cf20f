"""Child processes of the build tree for the pytest suites.

A Daemon runs one binary (moonlet-master, moonlet-store, ...) and waits,
bounded, until it has printed the lines that say it is ready ("listening on
HOST:PORT", ...).  It is stopped by its own PID: SIGTERM, then SIGKILL after a
bounded wait.  start_master() and start_store() are the suites' one way to
run the two daemons on loopback and ephemeral ports.  Standard library only:
test_inspect_cli.py uses it without the moonlet package on the path.
"""
import os
import re
import select
import signal
import subprocess
import tempfile
import time


def build_root():
    root = os.environ.get("MOONLET_BUILD_ROOT")
    if not root:
        raise RuntimeError("MOONLET_BUILD_ROOT is not set: run through `meson test`")
    return root


def direct_io_dir(prefix):
    """A new directory for files opened with O_DIRECT (a disk tier): under
    the build tree, or under /var/tmp when the build tree's file system
    refuses O_DIRECT (tmpfs: a clone under a tmpfs /tmp).  The caller
    removes it (shutil.rmtree)."""
    import shutil
    for base in (build_root(), "/var/tmp"):
        d = tempfile.mkdtemp(prefix=prefix, dir=base)
        try:
            fd = os.open(os.path.join(d, "probe"), os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
            os.close(fd)
            os.unlink(os.path.join(d, "probe"))
            return d
        except OSError:
            shutil.rmtree(d, ignore_errors=True)
    raise RuntimeError("neither the build tree nor /var/tmp takes O_DIRECT")


def terminate(proc, timeout=10):
    """SIGTERM to a child still running, SIGKILL if it has not ended within
    timeout seconds; waits for it either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


def child_env(**extra):
    """The environment of a daemon: this one without LD_PRELOAD (under
    AddressSanitizer the test interpreter preloads the runtime for the
    extension; the daemons link their own), with a small ASan quarantine
    (freed memory waiting for reuse would look like growth in RSS checks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "COLUMNS")}
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":quarantine_size_mb=4").lstrip(":")
    env.update(extra)
    return env


class Daemon:
    """A child process that announces itself on stdout.

    ready: one regular expression, or several, each of which some stdout
    line must match (in any order) within `timeout` seconds.  self.match is
    the match of the first; self.matches maps every pattern to its match.
    """

    def __init__(self, argv, ready, timeout=15.0, env=None):
        self.argv = argv
        patterns = [ready] if isinstance(ready, str) else list(ready)
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr,
                                     stdin=subprocess.DEVNULL,
                                     env=env if env is not None else child_env())
        self._buf = b""
        self.lines = []
        self.matches = {}
        deadline = time.monotonic() + timeout
        while len(self.matches) < len(patterns):
            line = self._line(deadline)
            if line is None:
                err = self.err()
                self.stop()
                raise RuntimeError(f"{os.path.basename(argv[0])} did not start: {err}")
            self.lines.append(line)
            for p in patterns:
                m = re.match(p, line)
                if m and p not in self.matches:
                    self.matches[p] = m
        self.match = self.matches[patterns[0]]

    @property
    def pid(self):
        return self.proc.pid

    def _line(self, deadline):
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def wait_line(self, pattern, timeout=10.0):
        """Reads stdout lines (bounded) until one matches; returns the match,
        or None after timeout or at EOF.  Lines read are kept in self.lines."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._line(deadline)
            if line is None:
                return None
            self.lines.append(line)
            m = re.match(pattern, line)
            if m:
                return m

    def err(self):
        """The end of what it wrote on stderr so far."""
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self):
        terminate(self.proc)
        self.proc.stdout.close()
        self.stderr.close()


LISTENING = r"listening on (\S+:\d+)$"


def tool(name):
    """The path of tools/<name> in the build tree."""
    return os.path.join(build_root(), "tools", name)


def freeze(pid, timeout=10.0):
    """SIGSTOP pid, then wait (bounded) until every thread of it is stopped.
    kill() returns once the signal is queued; each thread stops only when
    it next runs in the kernel, so on a busy host the process can go on for
    milliseconds (a standby acknowledging records it was meant to miss)."""
    os.kill(pid, signal.SIGSTOP)
    task = f"/proc/{pid}/task"
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for tid in os.listdir(task):
            try:
                with open(os.path.join(task, tid, "stat")) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                pass
        if states and all(s in ("T", "t") for s in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} not stopped within {timeout} s: {states}")
        time.sleep(0.001)


def child_pids(pid, *pgrep_args):
    """pid's children as `pgrep -P pid` lists them (bytes), narrowed by
    pgrep_args (e.g. "-f", "redis-server")."""
    out = subprocess.run(["pgrep", "-P", str(pid), *pgrep_args], capture_output=True)
    return out.stdout.split()


def run_bench(*args, timeout):
    """Runs the build tree's moonlet-bench with `args` to its end, bounded: it
    is killed (and TimeoutExpired raised) after `timeout` seconds.  Returns
    the ended Popen (.returncode, .pid), its stdout and its stderr (bytes)."""
    p = subprocess.Popen([tool("moonlet-bench"), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    return p, out, err


def start_master(*extra, ready=LISTENING, prefix=(), timeout=15.0):
    """moonlet-master on an ephemeral port (--rpc-port 0), quiet, plus
    `extra` flags (a later flag overrides an earlier one); `prefix` runs it
    under another command (prlimit, unshare).  .addr is its HOST:PORT."""
    d = Daemon([*prefix, tool("moonlet-master"), "--rpc-port", "0", "--log-level", "warn",
                *extra], ready, timeout=timeout)
    d.addr = d.match.group(1)
    return d


def start_store(master_addr, size, *extra, ready=LISTENING, listen="127.0.0.1:0", prefix=(),
                timeout=15.0):
    """moonlet-store serving a TCP segment of `size` on `listen`, quiet, plus
    `extra` flags.  .addr is the first group of `ready` (by default its data
    endpoint)."""
    d = Daemon([*prefix, tool("moonlet-store"), "--master", master_addr, "--segment-size",
                str(size), "--protocol", "tcp", "--listen", listen, "--log-level", "warn",
                *extra], ready, timeout=timeout)
    d.addr = d.match.group(1)
    return d


def free_port():
    """A loopback port free now (it may be taken before the caller binds it)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ETCD = "/usr/bin/etcd"


class Etcd:
    """One etcd member on loopback, started and stopped by the test.  With
    `certs` (tests/python/tlscerts.py, holding etcd.pem and master.pem) it
    serves clients over https with --client-cert-auth."""

    def __init__(self, certs=None):
        import shutil as _shutil
        self.bin = _shutil.which("etcd") or ETCD
        self.certs = certs
        self.dir = tempfile.mkdtemp(prefix="moonlet-etcd-")
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        # A port free_port() picked may be taken before etcd binds it (by a
        # daemon of this or another test): etcd then exits, or the probe
        # reaches that other server; then again on other ports, at most 3 times.
        for attempt in range(3):
            if self._start(attempt):
                return
            terminate(self.proc)
        self.stop()
        raise RuntimeError("etcd did not come up")

    def _start(self, attempt):
        import http.client
        import json
        import ssl
        import urllib.request
        cport, pport = free_port(), free_port()
        c = self.certs
        self.url = f"{'https' if c else 'http'}://127.0.0.1:{cport}"
        peer = f"http://127.0.0.1:{pport}"
        tls = ["--cert-file", c.path("etcd.pem"), "--key-file", c.path("etcd.key"),
               "--trusted-ca-file", c.path("ca.pem"), "--client-cert-auth"] if c else []
        self.proc = subprocess.Popen(
            [self.bin, "--name", "ha", "--data-dir", os.path.join(self.dir, f"data{attempt}"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"ha={peer}", *tls],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=child_env())
        ctx = None
        if c:
            ctx = ssl.create_default_context(cafile=c.path("ca.pem"))
            ctx.load_cert_chain(c.path("master.pem"), c.path("master.key"))
        deadline = time.monotonic() + 20
        while True:  # etcd announces readiness on no channel we can wait on: bounded poll
            try:
                req = urllib.request.Request(self.url + "/v3/kv/range", data=b'{"key":"eA=="}')
                if "header" in json.loads(urllib.request.urlopen(req, timeout=1,
                                                                 context=ctx).read()):
                    return True  # etcd's own answer
            except (OSError, http.client.HTTPException, ValueError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return False
            time.sleep(0.05)

    def stop(self):
        import shutil as _shutil
        terminate(self.proc)
        self.log.close()
        _shutil.rmtree(self.dir, ignore_errors=True)
