"""How two processes on one store prove to each other that they know its secret, before
either reads anything else the other sends (the forwarding key, `forwarding_key`).

One round trip, the caller speaking first::

    caller  -> holder   HELLO + nonce_c
    holder  -> caller   nonce_h + HMAC(key, "holder" + nonce_c + nonce_h)
    caller  -> holder   HMAC(key, "caller" + nonce_h + nonce_c) + what follows

Both proofs are HMAC-SHA256 over both sides' fresh 32-byte nonces, each side's
labelled, so neither can be replayed, or reflected to the side that made it. The
caller sends its calls right after its proof (the holder checks the proof before it
reads them): a link's first call waits for one round trip. The challenge of
`multiprocessing.connection` (used before) takes three, each waiting for a thread
of a busy holder to run.

A peer that says anything else (another protocol, a wrong proof, too long a
message) or nothing within the bound fails with `AuthenticationError` and is
disconnected; nothing it sent is unpickled.
"""

from __future__ import annotations

import hmac
import os
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from typing import Final

__all__ = ["HANDSHAKE_BOUND", "HELLO", "PROTOCOL", "holder_side", "caller_side"]

PROTOCOL: Final = 6
"""The version of what two processes say to each other over a socket; both check it. A
link opens with ``(PROTOCOL, token)``: a call's id is the link's token and the call's
number on the link (`call_id`), sent with the caller's proof (`auth`). (2: appends are
answered with their seq; 3: calls have ids; 4: an append's events travel flat, `_flat`;
5: a one-round-trip handshake, `auth`; 6: a call carries its caller's bound and the
turn blocks a plain write was made from inside, `links._blocks_of`.)"""

HELLO: Final = f"nous-actor link {PROTOCOL}\n".encode()
"""How a caller's first message begins (the forwarding protocol's version in it: a
peer of another version is told apart at its first message)."""

HANDSHAKE_BOUND: Final = 10.0
"""Seconds a holder waits, at most, for each message of a caller's handshake."""

_NONCE: Final = 32
_MAC: Final = 32  # SHA-256
_MOST_AFTER: Final = 4096
"""The most a caller sends after its proof in its handshake's last message."""


def _mac(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, label + first + second, "sha256").digest()


def _recv(conn: Connection, most: int, bound: float, who: str) -> bytes:
    if not conn.poll(bound):
        raise AuthenticationError(f"{who} said nothing within {bound:g} s")
    try:
        return conn.recv_bytes(most)
    except OSError as exc:  # longer than ``most``
        raise AuthenticationError(f"{who} sent too long a message: {exc}") from None


def caller_side(conn: Connection, key: bytes, after: bytes, bound: float) -> None:
    """Prove to the holder at the other end of ``conn`` that this process knows ``key``,
    and check that it does too; then send ``after`` (the link's opening).

    Raises:
        AuthenticationError: the holder does not know ``key``, speaks another protocol,
            or did not answer within ``bound``.
        OSError, EOFError: the connection broke.
    """
    mine = os.urandom(_NONCE)
    conn.send_bytes(HELLO + mine)
    reply = _recv(conn, _NONCE + _MAC, bound, "the holder")
    if len(reply) != _NONCE + _MAC:
        raise AuthenticationError(
            "the holder speaks another forwarding protocol (another release of nous_actor?)"
        )
    theirs, proof = reply[:_NONCE], reply[_NONCE:]
    if not hmac.compare_digest(proof, _mac(key, b"holder", mine, theirs)):
        raise AuthenticationError("the holder does not know this store's secret")
    conn.send_bytes(_mac(key, b"caller", theirs, mine) + after)


def holder_side(conn: Connection, key: bytes, bound: float = HANDSHAKE_BOUND) -> bytes:
    """Check that the caller at the other end of ``conn`` knows ``key``, proving that this
    process does; what the caller sent after its proof (not read before the proof held).

    Raises:
        AuthenticationError: the caller does not know ``key``, speaks another protocol,
            sent too much, or said nothing within ``bound``.
        OSError, EOFError: the connection broke.
    """
    hello = _recv(conn, len(HELLO) + _NONCE, bound, "the caller")
    if len(hello) != len(HELLO) + _NONCE or not hello.startswith(HELLO):
        raise AuthenticationError(
            "the caller speaks another forwarding protocol (another release of nous_actor?)"
        )
    theirs, mine = hello[len(HELLO) :], os.urandom(_NONCE)
    conn.send_bytes(mine + _mac(key, b"holder", theirs, mine))
    last = _recv(conn, _MAC + _MOST_AFTER, bound, "the caller")
    if not hmac.compare_digest(last[:_MAC], _mac(key, b"caller", mine, theirs)):
        raise AuthenticationError("the caller does not know this store's secret")
    return last[_MAC:]
