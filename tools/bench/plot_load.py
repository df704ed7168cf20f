#!/usr/bin/python3
"""Draws `moonlet-bench load`: throughput and p99 against the client count.

Usage: plot_load.py LOAD.json OUT.png

LOAD.json is the bench's JSON document (by_clients: per client count the
phases moonlet_exist, redis_exists, moonlet_putget, redis_setget).  Left:
BatchExistKey / EXISTS keys per second and put+get / SET+GET operations per
second; right: the p99 of each call.  Run with Debian's /usr/bin/python3
(python3-matplotlib); writes OUT.png.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [
    ("moonlet_exist", "keys_per_s", "moonlet BatchExistKey(640), keys/s", "tab:blue", "-"),
    ("redis_exists", "keys_per_s", "Redis EXISTS(640), keys/s", "tab:red", "-"),
    ("moonlet_putget", "ops_per_s", "moonlet 4 KiB put+get, ops/s", "tab:blue", "--"),
    ("redis_setget", "ops_per_s", "Redis 4 KiB SET+GET, ops/s", "tab:red", "--"),
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    rows = doc["by_clients"]
    clients = [r["clients"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for phase, key, label, color, style in SERIES:
        a.plot(clients, [r[phase][key] for r in rows], style, color=color, marker="o", label=label)
        b.plot(clients, [r[phase]["p99_us"] for r in rows], style, color=color, marker="o",
               label=label.split(",")[0] + " p99")
    for ax, title, unit in ((a, "throughput", "per second"), (b, "p99 latency", "us")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients)
        ax.set_xticklabels([str(c) for c in clients])
        ax.set_yscale("log")
        ax.set_xlabel("clients")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=100)


if __name__ == "__main__":
    main()
