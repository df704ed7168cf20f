"""pytest glue for the ha suite: when every test was skipped (no etcd
binary, or no privilege to create network namespaces), exit 77 so `meson
test` reports SKIP rather than OK (as tests/cluster/conftest.py)."""


def pytest_sessionfinish(session, exitstatus):
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is None or exitstatus != 0:
        return
    if tr.stats.get("skipped") and not tr.stats.get("passed"):
        session.exitstatus = 77
