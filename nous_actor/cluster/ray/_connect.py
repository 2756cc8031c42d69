"""Reaching the cluster: read a Ray address, check that a Ray cluster answers there
(never a hang), and connect this process to it."""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Final

import ray

from nous_actor.errors import ClusterError

_H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""What an HTTP/2 client sends first: the connection preface, then empty SETTINGS."""


def _where(address: str | None) -> tuple[str, int] | None:
    """The host and port of a Ray ``address`` (``None`` for ``auto``, ``local`` or none).

    Raises:
        ClusterError: the address cannot be read.
    """
    if address is None or address in ("auto", "local"):
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(
            f"cannot read the Ray address {address!r}: give 'host:port' (the head "
            "node's address that `ray start --head` printed), 'ray://host:port' or 'auto'"
        )
    return host.strip("[]"), int(port)


def _dial(address: str, host: str, port: int, timeout: float) -> socket.socket:
    """A connection to what listens at ``address`` (``host``, ``port``), made within
    ``timeout`` seconds.

    Raises:
        ClusterError: nothing listens there.
    """
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ClusterError(
            f"no Ray cluster answers at {address!r} ({exc.strerror or exc}); start one "
            "with `ray start --head`, or pass the address it printed"
        ) from None


def _probe(address: str, host: str, port: int, timeout: float) -> None:
    """Check, within ``timeout`` seconds, that what listens at ``address`` speaks gRPC as
    Ray's GCS and Ray Client server do: it answers an HTTP/2 preface with its SETTINGS.
    (``ray.init`` waits without bound on a listener that never answers.)

    Raises:
        ClusterError: nothing listens there, or what listens is not a Ray cluster.
    """
    fix = (
        "give the address of the head node that `ray start --head` printed "
        "(its GCS, port 6379 by default), or 'ray://host:port' for a Ray Client server"
    )
    deadline = time.monotonic() + timeout
    conn = _dial(address, host, port, timeout)
    head = b""
    with conn:
        try:
            conn.sendall(_H2_PREFACE)
            while len(head) < 9:
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
        except TimeoutError:
            raise ClusterError(
                f"something at {address!r} accepts connections but did not answer within "
                f"{timeout:g} s, so it is not a Ray cluster (its GCS answers at once): {fix}"
            ) from None
        except OSError:
            pass  # it closed the connection: judged by what it said before
    if len(head) == 9 and head[3] == 4 and not head[4] & 1 and not any(head[5:9]):
        return  # an HTTP/2 SETTINGS frame on stream 0: a gRPC server
    if head.startswith(b"HTTP/") or head.lstrip().startswith(b"<"):
        what = f"it answered {head.decode('ascii', 'replace')!r}..., like an HTTP/1 server"
    elif head:
        what = "it does not speak gRPC (HTTP/2)"
    else:
        what = "it closed the connection without answering"
    raise ClusterError(f"what listens at {address!r} is not a Ray cluster: {what}; {fix}")


def _connect(address: str | None, timeout: float) -> None:
    """Connect this process to Ray unless it is already: a `ClusterError` within about
    ``timeout`` seconds, never a hang, for an address (``address``, or ``RAY_ADDRESS``
    when it is ``None``) where no Ray cluster listens."""
    if ray.is_initialized():
        return
    target = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    where = _where(target)
    if where is not None and target is not None:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            # TLS comes first there: an HTTP/2 preface in clear proves nothing.
            _dial(target, *where, timeout).close()
        else:
            _probe(target, *where, timeout)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"could not connect to Ray at {address!r}: {exc}") from None
