"""A local, read-only web viewer of a session store (the ``serve`` extra).

``nous-actor serve FILE|DSN`` runs it; `create_app` gives the ASGI app
(Starlette) for a store opened read-only (`read_only_sqlite`, or any store
wrapped in `ReadOnlyStore`), and `serve` runs it with uvicorn, bound to
loopback unless told otherwise. Importing ``nous_actor`` never imports this
package.
"""

from nous_actor.runtime.extras import missing_extra

try:
    import starlette  # noqa: F401  (the serve extra: the app)
    import uvicorn  # noqa: F401  (the serve extra: the server)
except ImportError as exc:
    missing_extra("serve", __name__, exc)

from nous_actor.viewer.app import create_app
from nous_actor.viewer.server import DEFAULT_HOST, DEFAULT_PORT, serve
from nous_actor.viewer.source import ReadOnlyStore, read_only_sqlite

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "ReadOnlyStore",
    "create_app",
    "read_only_sqlite",
    "serve",
]
