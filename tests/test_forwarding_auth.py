"""The handshake of a forwarding link (`forwarding.auth`): both sides prove they know the
store's secret in one round trip; a peer that does not, that speaks another protocol,
that sends too much or that says nothing is refused with `AuthenticationError`, and
nothing it sent after its hello is read; the endpoint of a registry refuses such a peer
and serves the next one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import threading
from collections.abc import Callable, Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Pipe, answer_challenge
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from nous_actor import Sessions, SQLiteStore
from nous_actor.sessions.forwarding import auth, links
from nous_actor.store import shared

KEY = b"k" * 32


class Counted:
    """A connection that counts the messages sent through it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent = 0

    def send_bytes(self, data: bytes) -> None:
        self.sent += 1
        self.conn.send_bytes(data)

    def recv_bytes(self, most: int | None = None) -> bytes:
        return self.conn.recv_bytes(most)

    def poll(self, timeout: float) -> bool:
        return self.conn.poll(timeout)


@pytest.fixture
def pipe() -> Iterator[tuple[Connection, Connection]]:
    a, b = Pipe(duplex=True)
    yield a, b
    a.close()
    b.close()


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _joined(t: threading.Thread, out: list[Any]) -> Any:
    t.join(BOUND)
    assert not t.is_alive(), "a side of the handshake hung"
    return out[0]


@given(
    key=st.binary(min_size=1, max_size=64),
    opening=st.binary(max_size=auth._MOST_AFTER),
)
def test_both_sides_with_the_key_agree_in_one_round_trip(key: bytes, opening: bytes) -> None:
    """The holder gets exactly what the caller sent after its proof; the caller sends two
    messages (its hello, then its proof with the opening) and the holder one."""
    a, b = Pipe(duplex=True)
    try:
        caller, holder = Counted(a), Counted(b)
        t, out = _in_thread(lambda: auth.holder_side(holder, key, BOUND))  # type: ignore[arg-type]
        auth.caller_side(caller, key, opening, BOUND)  # type: ignore[arg-type]
        assert _joined(t, out) == opening
        assert (caller.sent, holder.sent) == (2, 1)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("wrong", ["caller", "holder"])
def test_a_side_without_the_key_is_refused_by_the_other(
    pipe: tuple[Connection, Connection], wrong: str
) -> None:
    """The caller checks the holder's proof before it sends its own: with different keys
    it refuses the holder, whichever side is wrong, and sends nothing more; the holder,
    left waiting for a proof, sees the connection end. (A caller that sends a wrong
    proof anyway: `test_the_endpoint_refuses_a_peer_without_the_key_and_serves_the_next`.)"""
    a, b = pipe
    caller_key, holder_key = (b"x" * 32, KEY) if wrong == "caller" else (KEY, b"x" * 32)
    t, out = _in_thread(lambda: auth.holder_side(b, holder_key, BOUND))
    with pytest.raises(AuthenticationError, match="the holder does not know this store's secret"):
        auth.caller_side(a, caller_key, pickle.dumps("never read"), BOUND)
    a.close()
    assert isinstance(_joined(t, out), (EOFError, OSError))


def test_a_caller_of_another_protocol_is_refused_not_waited_for(
    pipe: tuple[Connection, Connection],
) -> None:
    """A caller of an older release (it waits for `multiprocessing`'s challenge first)
    says nothing: the holder gives up after its bound; one that sends another hello is
    refused at once."""
    a, b = pipe
    with pytest.raises(AuthenticationError, match="said nothing within"):
        auth.holder_side(b, KEY, 0.05)
    a.send_bytes(b"#CHALLENGE#" + b"\0" * 20)
    with pytest.raises(AuthenticationError, match="another forwarding protocol"):
        auth.holder_side(b, KEY, BOUND)


def test_a_holder_of_another_protocol_fails_the_caller_at_once(
    pipe: tuple[Connection, Connection],
) -> None:
    """A holder of an older release sends `multiprocessing`'s challenge: the caller takes
    it for the holder's answer and refuses it (it does not hang)."""
    a, b = pipe
    t, out = _in_thread(lambda: answer_challenge(b, KEY))  # what it would wait for instead
    b.send_bytes(b"#CHALLENGE#" + b"\0" * 20)
    with pytest.raises(AuthenticationError, match="another forwarding protocol"):
        auth.caller_side(a, KEY, b"", BOUND)
    a.close()
    assert isinstance(_joined(t, out), BaseException)


def test_too_long_a_message_is_refused_unread(pipe: tuple[Connection, Connection]) -> None:
    a, b = pipe
    a.send_bytes(auth.HELLO + b"\0" * 10_000)
    with pytest.raises(AuthenticationError, match="too long"):
        auth.holder_side(b, KEY, BOUND)


def test_the_endpoint_refuses_a_peer_without_the_key_and_serves_the_next(
    tmp_path: Path,
) -> None:
    """A process that connects to a registry's endpoint with a wrong secret is refused
    (logged ``forwarding.peer_refused``) and none of its calls reach the session; a peer
    with the store's secret is served after it."""
    store = SQLiteStore(tmp_path / "s.db")
    sessions = Sessions(store, timeout=BOUND)
    try:
        sessions.open("held").append("user_message", {"content": "x"}).get()
        endpoint = sessions._endpoint
        assert endpoint is not None
        path = links.socket_path(endpoint.address)
        assert path is not None
        with capture_logs() as logs:
            # A caller that does not know the secret, sending its calls after its proof.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            conn = Connection(sock.detach())
            try:
                conn.send_bytes(auth.HELLO + os.urandom(32))
                assert conn.poll(BOUND)
                assert len(conn.recv_bytes()) == 64  # the holder's nonce and proof
                call = (0, pickle.dumps(("held", 0, "h_append", ("user_message", {}))))
                conn.send_bytes(b"\0" * 32 + pickle.dumps((links.PROTOCOL, "t")))
                with contextlib.suppress(OSError):  # (refused already: a broken pipe)
                    conn.send_bytes(pickle.dumps([call]))
                assert conn.poll(BOUND)
                with pytest.raises((EOFError, OSError)):  # disconnected, nothing answered
                    conn.recv_bytes()
            finally:
                conn.close()
            key = shared.forwarding_key(store)
            assert key is not None
            conn = links._connect(path, key, BOUND, pickle.dumps((links.PROTOCOL, "t")))
            try:
                conn.send_bytes(pickle.dumps([(7, pickle.dumps(("held", 0, "__alive__", ())))]))
                assert conn.poll(BOUND)
                [(cid, status, answer)] = pickle.loads(conn.recv_bytes())
                assert (cid, status, pickle.loads(answer)) == (7, links.OK, True)  # served
            finally:
                conn.close()
        refused = [e for e in logs if e["event"] == "forwarding.peer_refused"]
        assert [e["reason"] for e in refused] == ["AuthenticationError"]
        assert "does not know this store's secret" in refused[0]["error"]
        assert sessions.read("held").count().get() == 1  # the refused call never landed
    finally:
        sessions.close(timeout=BOUND)
        store.close()
