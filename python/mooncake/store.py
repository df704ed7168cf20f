"""mooncake.store on moonlet: Mooncake Store's Python classes, backed by a
moonlet cluster.  See moonlet.mooncake and docs/python.md."""
from moonlet.mooncake import *  # noqa: F401,F403
from moonlet.mooncake import __all__  # noqa: F401
