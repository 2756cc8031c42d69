"""Reaching the cluster: read a Ray address, check that a Ray cluster answers there
(never a hang), and connect this process to it."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Final

import ray
import ray.exceptions

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


def _ask_gcs(address: str, deadline: float, timeout: float) -> None:
    """Check, by ``deadline`` (`time.monotonic`; ``timeout`` seconds after the check of
    ``address`` began), that what listens at ``address`` (a gRPC server,
    `_probe` found) is a Ray cluster's GCS: it answers Ray's first request, the cluster's
    id. (``ray.init`` repeats that request for 20 s, or waits 30 s for each answer.)

    The request runs in a thread of its own, left to end by itself when it is late.

    Raises:
        ClusterError: it does not serve Ray's GCS, refused this process, or did not
            answer in time.
    """
    fix = (
        "give the address of the head node that `ray start --head` printed "
        "(its GCS, port 6379 by default)"
    )
    outcome: list[BaseException | None] = []
    done = threading.Event()

    client: Any = ray._raylet.GcsClient  # type: ignore[attr-defined]

    def ask() -> None:
        try:
            client(address=address).cluster_id  # noqa: B018 (the request)
        except BaseException as exc:  # told to the caller
            outcome.append(exc)
        else:
            outcome.append(None)
        done.set()

    threading.Thread(target=ask, name="nous_actor-ray-probe", daemon=True).start()
    if not done.wait(max(deadline - time.monotonic(), 0.001)):
        raise ClusterError(
            f"what listens at {address!r} speaks gRPC but did not answer Ray's first request "
            f"within {timeout:g} s, so it is not a Ray cluster that works: {fix}, and check "
            "that the head node runs (`ray status`)"
        )
    error: Any = outcome[0]
    if error is None:
        return
    if isinstance(error, ray.exceptions.AuthenticationError):
        raise ClusterError(
            f"the Ray cluster at {address!r} refused this process: {error}; give it the "
            "cluster's token (RAY_AUTH_MODE=token, and RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
        )
    raise ClusterError(
        f"what listens at {address!r} speaks gRPC but is not a Ray cluster: it does not serve "
        f"Ray's GCS ({type(error).__name__}: {error}); {fix}"
    )


def _connected_gcs() -> str | None:
    """The address of the GCS this process is connected to (``None`` when it cannot be
    told, as through a Ray Client connection)."""
    try:
        address = ray.get_runtime_context().gcs_address
        if not isinstance(address, str) or _where(address) is None:
            return None
    except Exception:
        return None
    return address


def _check_connected(timeout: float) -> None:
    """Check, within about ``timeout`` seconds, that the cluster this process is connected
    to still answers. (Ray waits 60 s for a control store that is gone, then ends the
    process.)

    Raises:
        ClusterError: its GCS does not answer.
    """
    address = _connected_gcs()
    if address is None:
        return
    where = _where(address)
    assert where is not None
    deadline = time.monotonic() + timeout
    try:
        _dial(address, *where, timeout).close()
        _ask_gcs(address, deadline, timeout)
    except ClusterError as exc:
        raise ClusterError(
            f"this process is connected to the Ray cluster at {address!r}, which does not "
            f"answer now (its head node is down or unreachable): {exc}. Once it runs again, "
            "call ray.shutdown() and make the RaySessions again"
        ) from None


def _connect(address: str | None, timeout: float) -> None:
    """Connect this process to Ray unless it is already: a `ClusterError` within about
    ``timeout`` seconds, never a hang, for an address (``address``, or ``RAY_ADDRESS``
    when it is ``None``) where no Ray cluster listens."""
    if ray.is_initialized():
        _check_connected(timeout)
        return
    target = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    where = _where(target)
    if where is not None and target is not None:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            # TLS comes first there: an HTTP/2 preface in clear proves nothing.
            _dial(target, *where, timeout).close()
        else:
            deadline = time.monotonic() + timeout
            _probe(target, *where, timeout)
            if not target.startswith("ray://"):  # a Ray Client server is not a GCS
                _ask_gcs(target, deadline, timeout)
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"could not connect to Ray at {address!r}: {exc}") from None
