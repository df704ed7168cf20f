"""mooncake - the import path of Mooncake Store's Python API, served by moonlet.

Installed with moonlet (meson option mooncake_module, see docs/python.md) so
that code written against Mooncake Store runs unchanged on a moonlet
cluster::

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

The class is moonlet.mooncake.MooncakeDistributedStore.

It never hides a real Mooncake by surprise: when another ``mooncake``
package with Mooncake's compiled ``store`` module is also on sys.path, that
package's modules are found first (``mooncake.store`` is Mooncake's), unless
the environment sets MOONLET_MOONCAKE=1.  ``mooncake.BACKEND`` says which
one answered: "moonlet" or "mooncake".
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = "_moonlet_shim"
"""A file of this name sits beside this __init__.py: how meson's configure
check (python/meson.build) tells this package from a real Mooncake."""


def _real_mooncake_dirs():
    """Directories of other `mooncake` packages on sys.path that hold a
    compiled store module (Mooncake's store.cpython-*.so)."""
    found = []
    for entry in sys.path:
        d = os.path.join(entry or os.getcwd(), "mooncake")
        try:
            if os.path.samefile(d, _HERE) or os.path.exists(os.path.join(d, MARKER)):
                continue
            names = os.listdir(d)
        except OSError:
            continue
        if any(n.startswith("store.") and n.endswith((".so", ".pyd")) for n in names):
            found.append(d)
    return found


_real = [] if os.environ.get("MOONLET_MOONCAKE") == "1" else _real_mooncake_dirs()
if _real:
    # A real Mooncake is installed too: its modules win (this directory stays
    # last, for nothing it lacks).
    __path__[:0] = _real
    BACKEND = "mooncake"
else:
    BACKEND = "moonlet"
