"""pytest glue for the ha suite: when every test was skipped (no etcd
binary, or no privilege to create network namespaces), exit 77 so `meson
test` reports SKIP rather than OK (tests/cluster/skip77.py's hook, shared
with the cluster suite)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))

from skip77 import pytest_sessionfinish  # noqa: E402,F401  (a hook pytest finds here)
