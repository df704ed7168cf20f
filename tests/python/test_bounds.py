"""Resources a peer can take (issue 13, section 2), against real daemons.

Each test starts its own moonlet-master or moonlet-store on loopback with an
ephemeral port (daemons.Daemon: stopped by its own PID), talks to it over raw
sockets the way a hostile or careless peer would, and checks that the daemon
keeps serving others, answers with a clear error and does not pin memory
(VmRSS of the daemon, read from /proc).  Standard library only: the frames are
packed by hand (docs/protocol.md, transport/xfer_tcp.h).  Every wait is
bounded.
"""
import contextlib
import os
import re
import select
import socket
import struct
import tempfile
import threading
import time

import pytest

from daemons import LISTENING, start_master, start_store

MIB = 1 << 20
ILLEGAL_CLIENT = -601
INVALID_PARAMS = -600
M_AUTH, M_ECHO, M_EXIST, M_BATCH_EXIST = 1, 2, 10, 11


# ---- msgpack, as much as the control protocol needs ------------------------

def p_uint(n):
    if n < 0x80:
        return bytes([n])
    if n < 1 << 8:
        return b"\xcc" + bytes([n])
    if n < 1 << 16:
        return b"\xcd" + struct.pack(">H", n)
    return b"\xce" + struct.pack(">I", n)


def p_str(b):
    if isinstance(b, str):
        b = b.encode()
    n = len(b)
    if n < 32:
        return bytes([0xa0 | n]) + b
    if n < 256:
        return b"\xd9" + bytes([n]) + b
    if n < 1 << 16:
        return b"\xda" + struct.pack(">H", n) + b
    return b"\xdb" + struct.pack(">I", n) + b


def p_array(n):
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def request(rid, method, *args):
    body = p_array(3) + p_uint(rid) + p_uint(method) + p_array(len(args)) + b"".join(args)
    return struct.pack(">I", len(body)) + body


def batch_exist_empty_keys(rid, n):
    """BatchExistKey("", [""] * n), packed without building a list."""
    body = p_array(3) + p_uint(rid) + p_uint(M_BATCH_EXIST) + p_array(2) + p_str("") + \
        p_array(n) + b"\xa0" * n
    return struct.pack(">I", len(body)) + body


def unpack(b, i=0):
    t = b[i]
    if t <= 0x7f:
        return t, i + 1
    if t >= 0xe0:
        return t - 0x100, i + 1
    if 0xa0 <= t <= 0xbf:
        n = t & 0x1f
        return b[i + 1:i + 1 + n].decode(), i + 1 + n
    if 0x90 <= t <= 0x9f:
        return unpack_seq(b, i + 1, t & 0x0f)
    if 0x80 <= t <= 0x8f:
        items, j = unpack_seq(b, i + 1, 2 * (t & 0x0f))
        return dict(zip(items[::2], items[1::2])), j
    if t == 0xc0:
        return None, i + 1
    if t in (0xc2, 0xc3):
        return t == 0xc3, i + 1
    fixed = {0xcc: ">B", 0xcd: ">H", 0xce: ">I", 0xcf: ">Q",
             0xd0: ">b", 0xd1: ">h", 0xd2: ">i", 0xd3: ">q"}
    if t in fixed:
        f = fixed[t]
        return struct.unpack_from(f, b, i + 1)[0], i + 1 + struct.calcsize(f)
    if t in (0xd9, 0xda, 0xdb):
        f = {0xd9: ">B", 0xda: ">H", 0xdb: ">I"}[t]
        n = struct.unpack_from(f, b, i + 1)[0]
        j = i + 1 + struct.calcsize(f)
        return b[j:j + n].decode(), j + n
    if t in (0xdc, 0xdd):
        f = ">H" if t == 0xdc else ">I"
        n = struct.unpack_from(f, b, i + 1)[0]
        return unpack_seq(b, i + 1 + struct.calcsize(f), n)
    raise ValueError(f"msgpack type {t:#x} not handled")


def unpack_seq(b, i, n):
    out = []
    for _ in range(n):
        v, i = unpack(b, i)
        out.append(v)
    return out, i


def read_exact(s, n, timeout):
    deadline = time.monotonic() + timeout
    buf = b""
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(buf)} of {n} bytes after {timeout} s")
        r, _, _ = select.select([s], [], [], left)
        if not r:
            continue
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    return buf


def read_reply(s, timeout=5.0):
    """(id, code, result) of the next reply frame."""
    (n,) = struct.unpack(">I", read_exact(s, 4, timeout))
    (rid, code, result), _ = unpack(read_exact(s, n, timeout))
    return rid, code, result


def assert_echoes(s, rid):
    """The connection is still in step: an Echo with id rid is answered OK."""
    s.sendall(request(rid, M_ECHO))
    assert read_reply(s)[:2] == (rid, 0)


def closed_by_server(s, timeout):
    """True when the server closes the connection within `timeout` (whatever
    it sends first is read and dropped)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([s], [], [], left)
        if r:
            try:
                if not s.recv(65536):
                    return True
            except ConnectionError:
                return True


def connect(addr, timeout=5.0, source=None):
    """A connection to addr ("HOST:PORT"), from address `source` if given."""
    host, port = addr.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout,
                                    source_address=(source, 0) if source else None)


@contextlib.contextmanager
def connections(addr, sources, timeout=2.0):
    """One connection to addr from each address of `sources` (None: the
    default), all closed on leaving."""
    socks = []
    try:
        for source in sources:
            socks.append(connect(addr, timeout, source))
        yield socks
    finally:
        for s in socks:
            s.close()


def echo_rtt(addr, timeout=5.0):
    """Seconds for one fresh connection's Echo round trip."""
    t0 = time.monotonic()
    with connect(addr, timeout) as s:
        s.sendall(request(7, M_ECHO))
        rid, code, _ = read_reply(s, timeout)
        assert (rid, code) == (7, 0)
    return time.monotonic() - t0


# ---- daemons ------------------------------------------------------------------

def prlimit(nofile):
    return () if nofile is None else ("prlimit", f"--nofile={nofile}", "--")


def master(*extra, nofile=None, token=None, ready=LISTENING):
    flags = ["--shards", "16", "--rpc-threads", "1", *extra]
    if token is not None:
        flags += ["--auth-token-file", token, "--rpc-address", "127.0.0.1"]  # stay on loopback
    return start_master(*flags, ready=ready, prefix=prlimit(nofile), timeout=15.0)


@pytest.fixture
def token_file():
    with tempfile.TemporaryDirectory(prefix="moonlet-bounds-") as d:
        path = os.path.join(d, "token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"bounds-token-0123456789\n")
        os.close(fd)
        yield path


def rss_settled(d, rounds=20):
    """The daemon's RSS once two readings 50 ms apart agree (bounded)."""
    last = d.rss_kib()
    for _ in range(rounds):
        time.sleep(0.05)
        now = d.rss_kib()
        if abs(now - last) < 256:
            return now
        last = now
    return last


# ---- before authentication ------------------------------------------------------

def test_unauthenticated_big_frames_pin_no_memory(token_file):
    """Eight unauthenticated connections each announce a 60 MiB first frame
    and send 16 MiB of it.  The master refuses each at its length with
    ILLEGAL_CLIENT and closes it, so its RSS stays within 24 MiB of where it
    was (before the fix it buffered every byte: 128 MiB and more)."""
    d = master(token=token_file)
    try:
        addr = d.match.group(1)
        base = rss_settled(d)
        socks, codes = [], []
        chunk = b"\x00" * MIB
        for _ in range(8):
            s = connect(addr)
            s.sendall(struct.pack(">I", 60 * MIB))
            try:
                for _ in range(16):
                    s.sendall(chunk)
            except OSError:
                pass  # refused and closed: what the fix does
            socks.append(s)
        for s in socks:
            try:
                rid, code, msg = read_reply(s, 3.0)
                codes.append(code)
            except (OSError, TimeoutError, ConnectionError):
                codes.append(None)
        grown = rss_settled(d) - base
        for s in socks:
            s.close()
        print(f"RESULT pre_auth rss_growth_kib={grown} codes={codes}")
        assert grown < 24 * 1024, f"RSS grew by {grown} KiB"
        assert codes.count(ILLEGAL_CLIENT) >= 1, codes
        assert echo_rtt_auth(addr) < 2.0
    finally:
        d.stop()


def echo_rtt_auth(addr):
    t0 = time.monotonic()
    with connect(addr) as s:
        s.sendall(request(1, M_AUTH, p_str("bounds-token-0123456789")) + request(2, M_ECHO))
        assert read_reply(s)[:2] == (1, 0)
        assert read_reply(s)[:2] == (2, 0)
    return time.monotonic() - t0


def test_unauthenticated_connections_time_out(token_file):
    """A connection that never authenticates is closed after --auth-timeout-ms;
    an authenticated one that stays idle is kept."""
    d = master("--auth-timeout-ms", "300", token=token_file)
    try:
        addr = d.match.group(1)
        with connect(addr) as silent, connect(addr) as good:
            good.sendall(request(1, M_AUTH, p_str("bounds-token-0123456789")))
            assert read_reply(good)[:2] == (1, 0)
            t0 = time.monotonic()
            assert closed_by_server(silent, 3.0)
            assert time.monotonic() - t0 >= 0.2
            assert_echoes(good, 2)
    finally:
        d.stop()


# ---- batches -------------------------------------------------------------------

def rss_after_batch(d, keys):
    """One BatchExistKey of `keys` empty keys (id 1) on a new connection to
    master d, then an Echo (id 2) that must be answered.  Returns the batch's
    (id, code, results or message) and d's RSS growth in KiB since before
    the batch, settled after the Echo."""
    base = rss_settled(d)
    with connect(d.match.group(1)) as s:
        s.sendall(batch_exist_empty_keys(1, keys))
        rid, code, res = read_reply(s, 60.0)
        assert_echoes(s, 2)
        grown = rss_settled(d) - base
    return rid, code, res, grown


def test_huge_batch_pins_no_memory():
    """A BatchExistKey of 8 M empty keys (an 8 MiB frame, legal before the
    fix) is refused with INVALID_PARAMS before it is decoded, the connection
    stays usable, and the master's RSS stays within 24 MiB of where it was
    (before the fix it answered and kept 160 MiB of scratch on the RPC thread
    for good)."""
    d = master()
    try:
        rid, code, _, grown = rss_after_batch(d, 8 << 20)
        print(f"RESULT huge_batch rss_growth_kib={grown} code={code}")
        assert grown < 24 * 1024, f"RSS grew by {grown} KiB"
        assert (rid, code) == (1, INVALID_PARAMS), (rid, code)
    finally:
        d.stop()


def test_batch_key_cap_message():
    """Above --max-batch-keys: INVALID_PARAMS naming the flag, connection kept."""
    d = master("--max-batch-keys", "1000")
    try:
        with connect(d.match.group(1)) as s:
            s.sendall(batch_exist_empty_keys(1, 1000))
            rid, code, res = read_reply(s)
            assert (rid, code) == (1, 0) and len(res) == 1000  # INVALID_KEY each
            s.sendall(batch_exist_empty_keys(2, 1001))
            rid, code, msg = read_reply(s)
            assert (rid, code) == (2, INVALID_PARAMS) and "max-batch-keys" in msg, msg
            assert_echoes(s, 3)
    finally:
        d.stop()


def test_scratch_given_back_after_a_large_batch():
    """With a high cap, one legal batch of 4 M keys is served and its scratch
    (80 MiB) is given back afterwards."""
    d = master("--max-batch-keys", str(4 << 20))
    try:
        rid, code, res, grown = rss_after_batch(d, 4 << 20)
        assert (rid, code) == (1, 0) and len(res) == 4 << 20
        print(f"RESULT scratch_4M rss_growth_kib={grown}")
        assert grown < 24 * 1024, f"RSS grew by {grown} KiB"
    finally:
        d.stop()


def test_heavy_request_does_not_stall_the_loop():
    """With one RPC loop thread, a client sending a 16 M-key BatchExistKey
    (a 16 MiB frame) must not stall another client's Echo on the same loop
    for long: it is refused before decoding.  A batch at the cap is served
    meanwhile.  Before the fix the Echo waited seconds."""
    d = master()
    try:
        addr = d.match.group(1)
        heavy = batch_exist_empty_keys(1, 16 << 20)
        done = {}

        def run_heavy():
            with connect(addr, 60.0) as s:
                s.sendall(heavy)
                done["reply"] = read_reply(s, 60.0)[:2]
                s.sendall(batch_exist_empty_keys(2, 65536))
                done["cap"] = read_reply(s, 60.0)[:2]

        t = threading.Thread(target=run_heavy)
        t.start()
        worst = 0.0
        t_end = time.monotonic() + 20.0
        while t.is_alive() and time.monotonic() < t_end:
            worst = max(worst, echo_rtt(addr, 30.0))
        t.join(60.0)
        print(f"RESULT head_of_line worst_echo_s={worst:.4f} {done}")
        assert done.get("reply") == (1, INVALID_PARAMS), done
        assert done.get("cap") == (2, 0), done
        assert worst < 0.5, f"an Echo waited {worst:.3f} s behind the heavy request"
    finally:
        d.stop()


# ---- descriptors --------------------------------------------------------------

def test_fd_limit_raised_for_idle_connections():
    """Started with a soft descriptor limit of 256 (hard 4096), the master
    raises it, so 600 idle connections do not lock out a new client (before
    the fix: accept failed with EMFILE and the new client hung)."""
    d = master(nofile="256:4096")
    try:
        addr = d.match.group(1)
        idle = [connect(addr) for _ in range(600)]
        try:
            assert echo_rtt(addr, 3.0) < 2.0
        finally:
            for s in idle:
                s.close()
    finally:
        d.stop()


def test_fd_exhaustion_backs_off_and_idle_connections_close():
    """With a hard limit of 256 the connection cap is lowered to fit; 400
    idle connections do not make the master spin or flood its log (at most a
    few rate-limited lines), and once --idle-timeout-ms closes them a new
    client is served again."""
    d = master("--idle-timeout-ms", "1500", "--log-level", "warn", nofile="256:256")
    try:
        addr = d.match.group(1)
        idle = []
        for _ in range(400):
            try:
                idle.append(connect(addr, 1.0))
            except OSError:
                break
        assert_calm_at_fd_limit("master", d.pid, idle, lambda: echo_rtt(addr, 1.0), d.err,
                                "new client")
    finally:
        d.stop()


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def assert_calm_at_fd_limit(name, pid, idle, round_trip, err, who):
    """Daemon `name` (process pid) at its fd limit, holding the `idle`
    connections: it uses under 0.3 s of CPU in 1 s; once its idle timeout
    has closed them, round_trip() (seconds) is under 1 s within 6 s; and its
    log (err()) has at most 4 "accept failed" / "cap of" lines."""
    time.sleep(1.0)
    cpu0 = cpu_seconds(pid)
    time.sleep(1.0)
    busy = cpu_seconds(pid) - cpu0
    deadline = time.monotonic() + 6.0
    ok = False
    while time.monotonic() < deadline and not ok:
        try:
            ok = round_trip() < 1.0
        except (OSError, TimeoutError, ConnectionError, AssertionError):
            time.sleep(0.1)
    for s in idle:
        s.close()
    lines = [l for l in err().splitlines() if "accept failed" in l or "cap of" in l]
    print(f"RESULT {name}_fd_limit cpu_s_per_s={busy:.3f} log_lines={len(lines)} served={ok}")
    assert ok, f"no {who} served after the idle timeout"
    assert busy < 0.3, f"{name} used {busy:.2f} s CPU in 1 s at the limit"
    assert len(lines) <= 4, lines



# ---- the store node's data plane (transport/xfer_tcp.h) ---------------------------

M_LIST_SEGMENTS = 16
XF_MAGIC, XF_READ, XF_WRITE, XF_REPLY = 0x4d4c5846, 2, 3, 0x80


def xf_header(op, req_id, segment, offset, length):
    return struct.pack(">IBBHiIQQQQ", XF_MAGIC, 1, op, 0, 0, 0, req_id, segment, offset, length)


def xf_read(addr, segment, length=4096, timeout=3.0, source="127.0.0.1"):
    """Seconds for one fresh connection's READ of `length` bytes at offset 0."""
    host, port = addr.rsplit(":", 1)
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout,
                                  source_address=(source, 0)) as s:
        s.sendall(xf_header(XF_READ, 1, segment, 0, length))
        hdr = read_exact(s, 48, timeout)
        _, _, op, _, status, _, rid, _, _, n = struct.unpack(">IBBHiIQQQQ", hdr)
        assert (op, status, rid, n) == (XF_READ | XF_REPLY, 0, 1, length)
        read_exact(s, length, timeout)
    return time.monotonic() - t0


class Node:
    """A master and one TCP store node; `segment` is the node's segment id
    as the data plane names it, `data` its endpoint."""

    def __init__(self, *store_flags, nofile=None):
        self.master = master()
        self.store = None
        try:
            self.store = start_store(self.master.addr, "64MiB", *store_flags,
                                     prefix=prlimit(nofile))
            self.data = self.store.addr
            with connect(self.master.match.group(1)) as s:
                s.sendall(request(1, M_LIST_SEGMENTS))
                _, code, segs = read_reply(s)
                assert code == 0 and len(segs) == 1, segs
                self.segment = int(segs[0]["segment_id"], 16)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        if self.store is not None:
            self.store.stop()
        self.master.stop()


class Trickler:
    """Connections that each send a few bytes, then one byte every `period`
    seconds, until stopped: a slowloris on headers (`prefix` = b"") or on a
    WRITE payload (`prefix` = a complete header)."""

    def __init__(self, addr, n, prefix=b"", period=0.3, source="127.0.0.1"):
        host, port = addr.rsplit(":", 1)
        self.socks = [socket.create_connection((host, int(port)), timeout=2.0,
                                               source_address=(source, 0)) for _ in range(n)]
        self.closed = [False] * n
        for s in self.socks:
            s.sendall(prefix + b"\x4d")
        self.period = period
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        while not self.stopping.wait(self.period):
            for i, s in enumerate(self.socks):
                if self.closed[i]:
                    continue
                try:
                    s.send(b"\x00")
                except OSError:
                    self.closed[i] = True

    def stop(self):
        self.stopping.set()
        self.thread.join(5.0)
        for s in self.socks:
            s.close()


def test_slowloris_does_not_starve_the_data_plane():
    """Eight connections trickling a header and four trickling a WRITE
    payload, one byte each 0.3 s, against a node with 4 serving threads and
    --transfer-timeout-ms 1000: reads from another client are served at once
    throughout (before the fix every worker sat in a blocking read whose
    timeout restarted on each byte, and the reads got nothing), and the
    trickling connections are closed by their request deadline."""
    n = Node("--transfer-timeout-ms", "1000")
    tr = []
    try:
        tr.append(Trickler(n.data, 8))
        tr.append(Trickler(n.data, 4, prefix=xf_header(XF_WRITE, 1, n.segment, 0, 1 << 20)))
        time.sleep(0.2)
        worst = max(xf_read(n.data, n.segment) for _ in range(10))
        print(f"RESULT slowloris worst_read_s={worst:.4f}")
        assert worst < 0.5, f"a read took {worst:.3f} s"
        t_end = time.monotonic() + 4.0
        while time.monotonic() < t_end and not all(all(t.closed) for t in tr):
            time.sleep(0.1)
        assert all(all(t.closed) for t in tr), [t.closed for t in tr]
        assert xf_read(n.data, n.segment) < 0.5
    finally:
        for t in tr:
            t.stop()
        n.stop()


def test_stalled_write_is_closed_by_its_deadline():
    """A WRITE whose payload stops after 10 bytes is closed within the
    request deadline (--transfer-timeout-ms plus 1 ms per 16 KiB: 1064 ms for
    1 MiB), not later."""
    n = Node("--transfer-timeout-ms", "1000")
    try:
        host, port = n.data.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5.0) as s:
            s.sendall(xf_header(XF_WRITE, 1, n.segment, 0, 1 << 20) + b"x" * 10)
            t0 = time.monotonic()
            assert closed_by_server(s, 4.0)
            took = time.monotonic() - t0
        print(f"RESULT stalled_write closed_after_s={took:.3f}")
        assert 0.9 < took < 1.6, f"closed after {took:.2f} s"
    finally:
        n.stop()


def test_connections_per_peer_capped():
    """--max-connections-per-peer 8: a ninth connection from the same address
    is closed at once; another address is still served."""
    n = Node("--max-connections-per-peer", "8")
    try:
        with connections(n.data, ["127.0.0.2"] * 8):
            with connect(n.data, 2.0, "127.0.0.2") as extra:
                assert closed_by_server(extra, 2.0)
            assert xf_read(n.data, n.segment) < 0.5
    finally:
        n.stop()


def test_store_fd_limit_raised():
    """Started with a soft descriptor limit of 256 (hard 4096), the node
    raises it: 600 idle connections from three other addresses do not lock
    out a reader (before the fix the acceptor spun on EMFILE and the reader
    was never served)."""
    n = Node(nofile="256:4096")
    try:
        with connections(n.data, [f"127.0.0.{2 + i % 3}" for i in range(600)]):
            assert xf_read(n.data, n.segment) < 1.0
    finally:
        n.stop()


def test_store_at_fd_limit_backs_off_and_closes_idle():
    """With a hard limit of 256, 400 idle connections make the acceptor
    neither spin nor flood the log, and once --idle-timeout-ms has closed
    them a reader is served again."""
    n = Node("--idle-timeout-ms", "1500", nofile="256:256")
    try:
        host, port = n.data.rsplit(":", 1)
        idle = []
        for i in range(400):
            try:
                idle.append(socket.create_connection((host, int(port)), timeout=1.0,
                                                     source_address=(f"127.0.0.{2 + i % 3}", 0)))
            except OSError:
                break
        assert_calm_at_fd_limit("store", n.store.pid, idle,
                                lambda: xf_read(n.data, n.segment, timeout=1.0), n.store.err,
                                "reader")
    finally:
        n.stop()


# ---- the master's /metrics ---------------------------------------------------------

def http_get_metrics(addr, timeout=2.0):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def test_metrics_not_starved_by_idle_connections():
    """100 idle connections to the metrics port do not keep a scrape out
    (before the fix libmicrohttpd took 64 connections and refused the rest)."""
    d = master("--metrics-port", "0", ready=[r"listening on (\S+:\d+)$", r"metrics on (\S+:\d+)$"])
    try:
        maddr = d.matches[r"metrics on (\S+:\d+)$"].group(1)
        with connections(maddr, [None] * 100):
            body = http_get_metrics(maddr)
            assert body.startswith(b"HTTP/1.1 200") and b"moonlet_" in body, body[:200]
    finally:
        d.stop()
