"""Serving the viewer: uvicorn, bound to loopback unless told otherwise."""

from __future__ import annotations

import ipaddress
from typing import Final

import uvicorn

from nous_actor.store import Store
from nous_actor.viewer.app import create_app

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "is_loopback", "make_server", "serve"]

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8470


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name, or an address, bracketed or not) is this machine's
    loopback: ``localhost``, or an address for which `ipaddress` says so, an
    IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) included. A server bound there
    answers only requests addressed to loopback; the command warns about any other."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])  # an IPv6 zone is no part
    except ValueError:
        return False
    if address.is_loopback:
        return True
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped is not None and mapped.is_loopback


def make_server(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    where: str | None = None,
) -> uvicorn.Server:
    """A uvicorn server of the viewer of ``store`` (not started: ``run()`` it, or
    set ``should_exit`` to stop it). Port 0 picks a free port. ``store`` is read
    through a `ReadOnlyStore` (see `create_app`). Bound to loopback (`is_loopback`),
    it answers only requests addressed to a loopback name or address, whatever DNS
    says."""
    loopback = is_loopback(host)
    if loopback and host.startswith("["):
        host = host[1:-1]  # uvicorn binds the bare address
    app = create_app(store, where=where, allowed_hosts=is_loopback if loopback else None)
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
