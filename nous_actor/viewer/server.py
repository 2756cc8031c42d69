"""Serving the viewer: uvicorn, bound to loopback unless told otherwise."""

from __future__ import annotations

from typing import Final

import uvicorn

from nous_actor.store import Store
from nous_actor.viewer.app import create_app

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "make_server", "serve"]

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8470
LOOPBACK: Final = ("127.0.0.1", "localhost", "::1", "[::1]")
"""The names of loopback: a server bound there answers only requests addressed to them."""


def make_server(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    where: str | None = None,
) -> uvicorn.Server:
    """A uvicorn server of the viewer of ``store`` (not started: ``run()`` it, or
    set ``should_exit`` to stop it). Port 0 picks a free port. ``store`` is read
    through a `ReadOnlyStore` (see `create_app`). Bound to loopback, it answers only
    requests addressed to a loopback name (`LOOPBACK`), whatever DNS says."""
    app = create_app(store, where=where, allowed_hosts=LOOPBACK if host in LOOPBACK else None)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    # Live feeds end themselves once the server is told to stop, before its grace runs out.
    app.state.stopping = lambda: server.should_exit
    return server


def serve(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    where: str | None = None,
) -> bool:
    """Serve the viewer of ``store`` until interrupted (Ctrl-C); the store is closed after.

    Returns ``False`` if the server could not start (e.g. the port is taken:
    uvicorn logs why), ``True`` after a clean stop.
    """
    server = make_server(store, host=host, port=port, where=where)
    try:
        server.run()
    except SystemExit:  # uvicorn's way of saying it could not bind
        return False
    finally:
        store.close()
    return server.started
