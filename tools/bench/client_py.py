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

answering each with one line of N per-call latencies in microseconds (each
call timed alone with time.perf_counter_ns, so the figure includes all the
binding's work: key conversion, the GIL release, the result list).  The
driver interleaves these rounds with its own C calls, so machine noise hits
every path alike.  An empty line or EOF ends it.
"""
import sys
import time

import moonlet


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
    print("ready", flush=True)
    clock = time.perf_counter_ns
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            break
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
    for s in stores.values():
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
