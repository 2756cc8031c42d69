"""Serving the viewer: uvicorn, bound to loopback unless told otherwise."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Final

import uvicorn

from nous_actor.store import Store
from nous_actor.viewer.app import create_app

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "bind_host", "is_loopback", "make_server", "serve"]

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


def bind_host(host: str) -> str:
    """The address to bind for ``host``: without brackets (``[::1]`` is ``::1``), and an
    IPv4-mapped IPv6 address as its IPv4 address (``::ffff:127.0.0.1`` is
    ``127.0.0.1``): uvicorn's listening socket (asyncio's) accepts IPv6 only, which
    cannot bind a mapped address (EINVAL); the IPv4 socket reaches the same clients."""
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name  # a name, or an address with a zone
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return name if mapped is None else str(mapped)


class _Server(uvicorn.Server):
    """A uvicorn server that says when it listens (``on_listening``, called once)."""

    on_listening: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit and self.on_listening is not None:
            self.on_listening()


def make_server(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    where: str | None = None,
    on_listening: Callable[[], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server of the viewer of ``store`` (not started: ``run()`` it, or
    set ``should_exit`` to stop it). Port 0 picks a free port. ``store`` is read
    through a `ReadOnlyStore` (see `create_app`). Bound to loopback (`is_loopback`),
    it answers only requests addressed to a loopback name or address, whatever DNS
    says. The address is bound as `bind_host` gives it; ``on_listening`` is called
    once the server listens."""
    loopback = is_loopback(host)
    host = bind_host(host)
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
    server = _Server(config)
    server.on_listening = on_listening
    # Live feeds end themselves once the server is told to stop, before its grace runs out.
    app.state.stopping = lambda: server.should_exit
    return server


def serve(
    store: Store,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    where: str | None = None,
    on_listening: Callable[[], None] | None = None,
) -> bool:
    """Serve the viewer of ``store`` until interrupted (Ctrl-C); the store is closed after.
    ``on_listening`` is called once the server listens (e.g. to say where).

    Returns ``False`` if the server could not start (e.g. the port is taken:
    uvicorn logs why), ``True`` after a clean stop.
    """
    server = make_server(store, host=host, port=port, where=where, on_listening=on_listening)
    try:
        server.run()
    except SystemExit:  # uvicorn's way of saying it could not bind
        return False
    finally:
        store.close()
    return server.started
