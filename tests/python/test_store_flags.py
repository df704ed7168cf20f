"""moonlet-store's flag checks: a bad value exits 2 with a message naming the
flag and what it expects, before the node touches the network or memory.

No daemon is started: every case is refused while the flags are parsed; the
one accepted value runs against a master that is not there (exit 1, a
runtime failure, not a usage error).
"""
import os
import subprocess

import pytest

from daemons import build_root


def store_bin():
    return os.path.join(build_root(), "tools", "moonlet-store")


def run(*flags):
    return subprocess.run([store_bin(), "--master", "127.0.0.1:1", "--segment-size", "4MiB",
                           "--protocol", "tcp", *flags],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("value, message", [
    ("0", "--rdma-keepalive-ms: the keepalive cannot be turned off; "
          "expected an integer in [100, 3600000]: '0'"),
    ("99", "--rdma-keepalive-ms: expected an integer in [100, 3600000]: '99'"),
    ("3600001", "--rdma-keepalive-ms: expected an integer in [100, 3600000]: '3600001'"),
    ("-5", "--rdma-keepalive-ms: expected an integer in [100, 3600000]: '-5'"),
    ("5s", "--rdma-keepalive-ms: expected an integer in [100, 3600000]: '5s'"),
    ("", "--rdma-keepalive-ms: expected an integer in [100, 3600000]: ''"),
])
def test_bad_rdma_keepalive_is_refused(value, message):
    r = run("--rdma-keepalive-ms", value)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr


def test_good_rdma_keepalive_is_accepted():
    r = run("--rdma-keepalive-ms", "500")
    assert r.returncode == 1, r.stderr  # parsed; the master at port 1 is not there
    assert "usage:" not in r.stderr, r.stderr


def test_help_names_rdma_keepalive():
    r = subprocess.run([store_bin(), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "--rdma-keepalive-ms N" in r.stdout
