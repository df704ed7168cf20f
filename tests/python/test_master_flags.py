"""moonlet-master with the flags of Mooncake's mooncake_master (issue 15).

Each test starts its own master on an ephemeral loopback port and reads what
it says it runs with (its "listening on" line and its start-up INFO line),
or its exit code and message for a bad value.
"""
import os
import re
import shutil
import subprocess

import pytest

from daemons import Daemon, build_root

READY = r"listening on (\S+):(\d+)$"
CONFIG = re.compile(r"master: moonlet-master \S+: \d+ shards, lease TTL (\d+) ms, "
                    r"liveness TTL (\d+) ms$", re.M)


def master_bin():
    return os.path.join(build_root(), "tools", "moonlet-master")


def start(*flags):
    return Daemon([master_bin(), *flags], READY)


def settings(m):
    """(lease TTL ms, liveness TTL ms) of the start-up line on stderr, read
    once the master has exited (it logs the line before it waits)."""
    m.proc.terminate()
    m.proc.wait(timeout=10)
    found = CONFIG.search(m.err())
    m.stop()
    return found.groups()


def test_mooncake_spellings_map_to_moonlets_settings():
    m = start("--rpc_port=0", "--rpc_thread_num=2", "--client_ttl=30s",
              "--default_kv_lease_ttl=2s", "--default_kv_soft_pin_ttl", "30m", "-v", "0")
    host, port = m.match.groups()
    assert host == "127.0.0.1" and int(port) > 0  # loopback unless told otherwise
    assert settings(m) == ("2000", "30000")
    m = start("--port", "0", "--client_ttl", "7", "--default_kv_lease_ttl", "1500")
    assert m.match.group(1) == "127.0.0.1"
    assert settings(m) == ("1500", "7000")  # ms / s without a unit


def test_metrics_port_spelling():
    m = Daemon([master_bin(), "--rpc_port=0", "--metrics_port=0"],
               [READY, r"metrics on (127\.0\.0\.1):(\d+)$"])
    try:
        assert int(m.matches[r"metrics on (127\.0\.0\.1):(\d+)$"].group(2)) > 0
    finally:
        m.stop()


def test_flags_without_meaning_are_named_and_ignored():
    m = start("--rpc-port", "0", "--enable_http_metadata_server=true",
              "--http_metadata_server_port", "8080", "--enable_gc", "--enable_ha",
              "--rpc-address", "127.0.0.1")
    try:
        m.proc.terminate()
        m.proc.wait(timeout=10)
        err = m.err()
        for flag in ("enable_http_metadata_server", "http_metadata_server_port", "enable_gc"):
            assert f"ignoring mooncake_master's --{flag}" in err
        assert "enable_ha" not in err  # HA is on with --etcd_endpoints (tests/ha)
    finally:
        m.stop()


@pytest.mark.parametrize("flags, message", [
    (["--client_ttl", "5x"], "--client_ttl: not a duration"),
    (["--default_kv_lease_ttl=-1s"], "--default_kv_lease_ttl: not a duration"),
    (["--client_ttl", "0s"], "usage"),
    (["-v", "loud"], "-v: not a non-negative integer"),
    (["--no_such_mooncake_flag=1"], "usage"),
    (["--etcd_endpoints", "http://127.0.0.1:2379"], "needs --advertise"),
    (["--etcd-endpoints", "http://127.0.0.1:2379", "--advertise", "h:1", "--cluster_id", ""],
     "non-empty --cluster-id"),
    (["--etcd-lease-ttl", "1500ms"], "--etcd-lease-ttl: whole seconds"),
])
def test_bad_values_exit_2(flags, message):
    r = subprocess.run([master_bin(), "--rpc-port", "0", *flags], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and message in r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root for a network namespace of its own")
def test_a_token_without_an_address_listens_on_every_interface(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-the-test\n")
    token.chmod(0o600)
    # in a network namespace of its own: 0.0.0.0 there reaches nothing outside
    m = Daemon(["unshare", "-n", master_bin(), "--rpc-port", "0", "--auth-token-file",
                str(token)], READY)
    try:
        assert m.match.group(1) == "0.0.0.0"
    finally:
        m.stop()
    m = Daemon([master_bin(), "--rpc-port", "0", "--auth-token-file", str(token),
                "--rpc-address", "127.0.0.1"], READY)
    try:
        assert m.match.group(1) == "127.0.0.1"
    finally:
        m.stop()


def test_threads_are_named():
    """Every thread of a master says what it is (top -H, perf, gdb;
    docs/deployment.md, "Threads"): its RPC acceptor and loops, and the
    background sweeper."""
    m = start("--rpc-port", "0", "--rpc-threads", "2")
    try:
        task = f"/proc/{m.proc.pid}/task"
        names = sorted(open(os.path.join(task, t, "comm")).read().strip()
                       for t in os.listdir(task))
    finally:
        m.stop()
    for want in ("master-accept", "master-loop0", "master-loop1", "master-bg"):
        assert want in names, names
