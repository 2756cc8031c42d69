"""Forwarding: a call made where a session is not held goes to the process that holds it.

A registry keeps a `Route` per session (`route`): the session's actor here, or a
link to its holder (`links`), with the calls held while the session moves. Each
process answers calls for the sessions it holds on a store at its `Endpoint`
(`endpoint`), whose address the store keeps with every claim it takes.
"""

from nous_actor.sessions.forwarding.endpoint import (
    ENDING,
    LOCAL,
    Endpoint,
    endpoint_for,
    let_go,
    local_endpoint,
)
from nous_actor.sessions.forwarding.links import LocalLink, SocketLink, link_to, socket_path
from nous_actor.sessions.forwarding.route import REGISTRY_CLOSED, Call, Link, Route

__all__ = [
    "ENDING",
    "LOCAL",
    "REGISTRY_CLOSED",
    "Call",
    "Endpoint",
    "Link",
    "LocalLink",
    "Route",
    "SocketLink",
    "endpoint_for",
    "let_go",
    "link_to",
    "local_endpoint",
    "socket_path",
]
