"""client_py.py - the Python half of `moonlet-bench client`.

Run by moonlet-bench with Debian's /usr/bin/python3 and the moonlet package
on PYTHONPATH:

    client_py.py MASTER_ADDR REALCLIENT_SOCKET CANDIDATES RANKS

It opens a direct moonlet.Store and one through the RealClient (a
DummyClient), checks that batch_probe_key gives the expected mask on each,
prints "ready", then serves commands from stdin, one per line:

    direct N G  time N calls of batch_probe_key on the direct Store,
                pausing G microseconds after each
    dummy N G   the same through the DummyClient

    mb PATH KIND N  Mooncake's zero-copy batches (moonlet.mooncake) on PATH
                ("direct" / "dummy"): N calls of KIND, one of
                put_single  batch_put_from, each key's object from one buffer
                put_multi   batch_put_from_multi_buffers, from MB_LAYERS buffers
                get_single  batch_get_into, into one buffer per key
                get_multi   batch_get_into_multi_buffers, scattered over
                            MB_LAYERS buffers per key
                (MB_KEYS keys of MB_LAYERS x MB_LAYER_BYTES bytes per call;
                the puts' keys are removed, untimed, after each call), answered
                with the per-key cost of each call (its latency / MB_KEYS)

answering each with one line of N per-call latencies in microseconds (each
call timed alone with time.perf_counter_ns, so the figure includes all the
binding's work: key conversion, the GIL release, the result list).  The
driver interleaves these rounds with its own C calls, so machine noise hits
every path alike.  An empty line or EOF ends it.
"""
import ctypes
import sys
import time

import moonlet
from moonlet.mooncake import MooncakeDistributedStore

MB_KEYS, MB_LAYERS, MB_LAYER_BYTES = 32, 8, 4096  # the same figures as tools/bench/client.c


class MultiBuffer:
    """The buffers and keys of the mb commands on one MooncakeDistributedStore."""

    def __init__(self, store, tag):
        self.store, self.tag, self.calls = store, tag, 0
        obj = MB_LAYERS * MB_LAYER_BYTES
        # one contiguous region per key, and one region per layer (vLLM's layout)
        self.flat = (ctypes.c_ubyte * (MB_KEYS * obj))()
        self.layers = [(ctypes.c_ubyte * (MB_KEYS * MB_LAYER_BYTES))() for _ in range(MB_LAYERS)]
        for region in [self.flat] + self.layers:
            ctypes.memset(region, 0x5A, ctypes.sizeof(region))
            if store.register_buffer(ctypes.addressof(region), ctypes.sizeof(region)) != 0:
                raise RuntimeError("register_buffer failed")
        base = ctypes.addressof(self.flat)
        self.single = ([base + k * obj for k in range(MB_KEYS)], [obj] * MB_KEYS)
        self.multi = ([[ctypes.addressof(t) + k * MB_LAYER_BYTES for t in self.layers]
                       for k in range(MB_KEYS)], [[MB_LAYER_BYTES] * MB_LAYERS] * MB_KEYS)
        self.get_keys = [f"mb/{tag}/get/{k}" for k in range(MB_KEYS)]
        if store.batch_put_from(self.get_keys, *self.single) != [0] * MB_KEYS:
            raise RuntimeError("put of the keys to read failed")

    def run(self, kind, n, clock):
        out = []
        want_get = [MB_LAYERS * MB_LAYER_BYTES] * MB_KEYS
        for _ in range(n):
            self.calls += 1
            keys = [f"mb/{self.tag}/put/{self.calls}/{k}" for k in range(MB_KEYS)]
            t0 = clock()
            if kind == "put_single":
                res = self.store.batch_put_from(keys, *self.single)
            elif kind == "put_multi":
                res = self.store.batch_put_from_multi_buffers(keys, *self.multi)
            elif kind == "get_single":
                res = self.store.batch_get_into(self.get_keys, *self.single)
            else:
                res = self.store.batch_get_into_multi_buffers(self.get_keys, *self.multi)
            out.append((clock() - t0) / MB_KEYS)
            if res != (want_get if kind.startswith("get") else [0] * MB_KEYS):
                raise RuntimeError(f"{kind} returned {res}")
            if kind.startswith("put"):  # untimed: the next call puts fresh keys again
                for k in keys:
                    if self.store.remove(k) != 0:
                        raise RuntimeError(f"remove {k} failed")
        return out


def key_names(candidates, ranks):
    # the same names as tools/bench/client.c
    return [f"kda/ckpt-{(c + 1) * 4:04d}/rank-{r}" for c in range(candidates) for r in range(ranks)]


def main(argv):
    master, sock, candidates, ranks = argv[1], argv[2], int(argv[3]), int(argv[4])
    keys = key_names(candidates, ranks)
    policy = moonlet.GrantLeasePolicy(moonlet.ProbeLeaseMode.LAST_HIT_ONLY, ranks)
    stores = {"direct": moonlet.Store.connect(master, protocol="tcp"),
              "dummy": moonlet.Store.connect_dummy(sock)}
    want = [False] * (len(keys) - ranks) + [True] * ranks
    for name, s in stores.items():
        got = s.batch_probe_key(keys, policy)
        if got != want:
            print(f"error: {name} mask differs from the expected one", flush=True)
            return 1
    mc = {"direct": MooncakeDistributedStore(), "dummy": MooncakeDistributedStore()}
    tenant = f"bench-mb-{time.monotonic_ns()}"
    if (mc["direct"].setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                            "protocol": "tcp", "master_server_address": master,
                            "tenant_id": tenant}) != 0
            or mc["dummy"].setup_dummy(0, "64MB", sock, tenant_id=tenant) != 0):
        print("error: Mooncake class setup failed", flush=True)
        return 1
    mb = {name: MultiBuffer(s, name) for name, s in mc.items()}
    print("ready", flush=True)
    clock = time.perf_counter_ns
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            break
        if parts[0] == "mb":
            out = mb[parts[1]].run(parts[2], int(parts[3]), clock)
            sys.stdout.write(" ".join(f"{ns / 1000:.3f}" for ns in out) + "\n")
            sys.stdout.flush()
            continue
        probe = stores[parts[0]].batch_probe_key
        gap = int(parts[2]) / 1e6
        out = []
        for _ in range(int(parts[1])):
            t0 = clock()
            probe(keys, policy)
            out.append(clock() - t0)
            if gap:
                time.sleep(gap)
        sys.stdout.write(" ".join(f"{ns / 1000:.3f}" for ns in out) + "\n")
        sys.stdout.flush()
    for s in list(stores.values()) + list(mc.values()):
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
