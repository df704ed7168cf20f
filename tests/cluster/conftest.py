"""pytest glue for the cluster suite: when every test was skipped (no
privilege to create network namespaces), exit 77 so `meson test` reports
SKIP rather than OK (the hook is in skip77.py, shared with tests/ha)."""

from skip77 import pytest_sessionfinish  # noqa: F401  (a hook pytest finds here)
