#!/usr/bin/python3
"""Draws `moonlet-bench trace`'s runs side by side (three, and a fourth with
--disk-fraction: the one-call lookup with a disk tier).

Usage: plot_trace.py SERIES.csv OUT.png

SERIES.csv is the per-request time series the C bench writes (mode, t_s,
requests, blocks, kv_hit_blocks, kda_hit_blocks, kda_keys_leased,
kda_bytes_leased; the counters are cumulative).  Left panel: KV and KDA hit
ratio over trace time, per window of trace time (blocks reused / blocks
requested in that window).  Right panel: cumulative KDA bytes leased.
Run with Debian's /usr/bin/python3 (python3-matplotlib); writes OUT.png.
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

WINDOWS = 30  # hit-ratio windows across the trace
STYLE = {"lease_all": ("tab:red", "lease-all"), "selective": ("tab:blue", "selective, two calls"),
         "k3_one_rtt": ("tab:green", "selective, one call (ProbeResume)"),
         "k3_one_rtt_disk": ("tab:purple", "one call, with a disk tier")}


def load(path):
    runs = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = runs.setdefault(row["mode"], {k: [] for k in row if k != "mode"})
            for k, v in row.items():
                if k != "mode":
                    r[k].append(float(v))
    return runs


def windowed(r, key, span):
    """(window centre, reuse ratio) per window of trace time."""
    edges = [span * i / WINDOWS for i in range(WINDOWS + 1)]
    out_t, out_v = [], []
    i, prev_b, prev_h = 0, 0.0, 0.0
    n = len(r["t_s"])
    for w in range(WINDOWS):
        while i < n and r["t_s"][i] <= edges[w + 1]:
            i += 1
        if i == 0:
            continue
        b, h = r["blocks"][i - 1], r[key][i - 1]
        if b > prev_b:
            out_t.append((edges[w] + edges[w + 1]) / 2 / 60)
            out_v.append(100 * (h - prev_h) / (b - prev_b))
        prev_b, prev_h = b, h
    return out_t, out_v


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    runs = load(argv[1])
    if not runs:
        print("plot_trace.py: empty series", file=sys.stderr)
        return 1
    span = max(max(r["t_s"]) for r in runs.values()) or 1.0
    fig, (ax_hit, ax_bytes) = plt.subplots(1, 2, figsize=(10, 3.6), dpi=80)
    for mode, r in runs.items():
        color, label = STYLE.get(mode, ("tab:gray", mode))
        t, v = windowed(r, "kda_hit_blocks", span)
        ax_hit.plot(t, v, color=color, label=f"{label}: KDA (resume)")
        t, v = windowed(r, "kv_hit_blocks", span)
        ax_hit.plot(t, v, color=color, linestyle=":", label=f"{label}: KV")
        ax_bytes.plot([x / 60 for x in r["t_s"]], [b / 2**20 for b in r["kda_bytes_leased"]],
                      color=color, label=label)
    ax_hit.set_title("hit ratio (blocks reused / requested)")
    ax_hit.set_xlabel("trace time (min)")
    ax_hit.set_ylabel("%")
    ax_hit.set_ylim(bottom=0)
    ax_hit.legend(fontsize=7)
    ax_bytes.set_title("cumulative KDA bytes leased")
    ax_bytes.set_xlabel("trace time (min)")
    ax_bytes.set_ylabel("MiB")
    ax_bytes.legend(fontsize=8)
    for ax in (ax_hit, ax_bytes):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
