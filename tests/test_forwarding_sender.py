"""The writer of a forwarding connection (`links.Sender`): frames go out whole, in the
order put, exactly once; a put never waits for the socket; a broken connection gives
back what it did not write.

A put on an idle connection writes its frame at once in the putting thread without
waiting for the socket; what the socket does not take (a full buffer: the reader is
slow) goes to the writer thread, the rest of a cut frame first. These tests fill the
socket's buffer on purpose (big items, a reader that starts late) so that every path
runs: a write in the putting thread, a cut frame, a queue behind a write.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, Pipe
from typing import Any

import pytest
from bounds import BOUND
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor.sessions.forwarding import links


@pytest.fixture
def pipe() -> Iterator[tuple[Connection, Connection]]:
    a, b = Pipe(duplex=True)  # a socket pair, as a forwarding link's connection
    yield a, b
    a.close()
    b.close()


def _read_all(conn: Connection, expected: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < expected:
        assert conn.poll(BOUND), f"only {len(got)} of {expected} items came"
        got.extend(pickle.loads(conn.recv_bytes()))
    return got


def _put_from_threads(
    sender: links.Sender, threads: int, per_thread: int, size: int
) -> tuple[list[bool], float]:
    results: list[bool] = []
    lock = threading.Lock()

    def put(t: int) -> None:
        for i in range(per_thread):
            ok = sender.put((t, i, b"x" * size))
            with lock:
                results.append(ok)

    started = time.monotonic()
    workers = [threading.Thread(target=put, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(BOUND)
        assert not w.is_alive(), "a put waited for the socket"
    return results, time.monotonic() - started


@settings(max_examples=12, deadline=None)
@given(
    threads=st.integers(1, 6),
    per_thread=st.integers(1, 40),
    size=st.sampled_from([0, 100, 20_000, 300_000]),
)
def test_frames_come_whole_in_the_order_put_exactly_once(
    threads: int, per_thread: int, size: int
) -> None:
    """Threads put at once while nobody reads (the socket's buffer fills: frames are cut
    and queued); then the reader gets every item once, each thread's in its order."""
    a, b = Pipe(duplex=True)
    sender = links.Sender(a, "test-writer")
    try:
        results, _ = _put_from_threads(sender, threads, per_thread, size)
        assert all(results)
        got = _read_all(b, threads * per_thread)
        assert sorted((t, i) for t, i, _ in got) == [
            (t, i) for t in range(threads) for i in range(per_thread)
        ]
        for t in range(threads):
            assert [i for u, i, _ in got if u == t] == list(range(per_thread))
        assert all(len(x) == size for _, _, x in got)
    finally:
        sender.close()
        a.close()
        b.close()


def test_a_put_never_waits_for_a_reader_that_does_not_read(
    pipe: tuple[Connection, Connection],
) -> None:
    """20 MB put while nobody reads: every put returns (the socket holds a small part);
    all of it comes once the reader reads."""
    a, b = pipe
    sender = links.Sender(a, "test-writer")
    try:
        results, took = _put_from_threads(sender, 2, 40, 250_000)
        assert all(results)
        assert took < BOUND
        got = _read_all(b, 80)
        assert [(t, i) for t, i, _ in got if t == 0] == [(0, i) for i in range(40)]
    finally:
        sender.close()


def test_a_broken_connection_gives_back_what_it_did_not_write(
    pipe: tuple[Connection, Connection],
) -> None:
    """The reader goes away with the buffer full: the items not written whole (a cut
    frame's included) are handed to ``on_lost``, and later puts say the link is broken."""
    a, b = pipe
    lost: list[Any] = []
    done = threading.Event()

    def on_lost(items: list[Any]) -> None:
        lost.extend(items)
        done.set()

    sender = links.Sender(a, "test-writer", on_lost)
    try:
        results, _ = _put_from_threads(sender, 1, 60, 200_000)
        assert all(results)
        b.close()
        assert done.wait(BOUND), "the writer never saw the broken connection"
        assert lost, "nothing was given back, though the reader read nothing"
        assert [i for _, i, _ in lost] == sorted(i for _, i, _ in lost)
        assert sender.broken is not None
        assert sender.put((0, 99, b"")) is False
    finally:
        sender.close()


def test_an_idle_connection_writes_in_the_putting_thread(
    pipe: tuple[Connection, Connection],
) -> None:
    """With nothing queued and nobody writing, a put's frame is in the socket when the
    put returns: written by the putting thread, no other thread woken for it."""
    a, b = pipe
    sender = links.Sender(a, "test-writer")
    try:
        for i in range(50):
            assert sender.put(("call", i))
            assert b.poll(0), "the frame was not written by the put"
            assert pickle.loads(b.recv_bytes()) == [("call", i)]
        assert sender._pending == []
        assert sender._cut is None
    finally:
        sender.close()


def test_a_connection_that_is_no_socket_is_written_by_the_writer_thread() -> None:
    """Over a pipe (no socket to write without waiting on) every item still comes, in
    order, and no descriptor is left behind."""
    import os

    a, b = Pipe(duplex=False)  # (reader, writer): an os.pipe, not a socket
    before = _pipes() if os.path.isdir("/proc/self/fd") else None
    sender = links.Sender(b, "test-writer")
    try:
        assert sender._sock is None
        for i in range(20):
            assert sender.put(("call", i))
        assert _read_all(a, 20) == [("call", i) for i in range(20)]
    finally:
        sender.close()
        sender._thread.join(BOUND)
        if before is not None:  # (another thread's files may come and go meanwhile)
            assert _pipes() - before == set(), "the sender left a pipe open"
        a.close()
        b.close()


def _pipes() -> set[str]:
    """The pipes this process has open, as ``/proc`` names them (``pipe:[inode]``)."""
    import os

    names = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("pipe:"):
            names.add(f"{fd}:{target}")
    return names


# -- a link is made once -------------------------------------------------------------------


@pytest.fixture
def holder(tmp_path: Any) -> Iterator[tuple[str, bytes]]:
    """A registry holding a session on a SQLite file: its endpoint's address and key."""
    from nous_actor import Sessions, SQLiteStore
    from nous_actor.store import shared

    store = SQLiteStore(tmp_path / "s.db")
    sessions = Sessions(store, timeout=BOUND)
    sessions.open("held").append("user_message", {"content": "x"}).get()
    endpoint = sessions._endpoint
    assert endpoint is not None
    key = shared.forwarding_key(store)
    assert key is not None
    yield endpoint.address, key
    sessions.close(timeout=BOUND)
    store.close()


@pytest.mark.parametrize("fails", [False, True])
def test_threads_that_want_a_link_at_once_share_the_one_being_made(
    holder: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """Eight threads ask for a link to one holder while the first is still connecting
    (its handshake held until all have asked): one connection is made and all get it.
    If that one fails, each of the others tries for itself."""
    address, key = holder
    real = links._connect
    connects: list[str] = []
    asked = threading.Semaphore(0)
    first = threading.Event()

    def slow(path: str, k: bytes, timeout: float, opening: bytes) -> Connection:
        connects.append(path)
        if len(connects) == 1:
            first.set()
            for _ in range(7):  # every other thread has asked (and waits)
                assert asked.acquire(timeout=BOUND)
            if fails:
                raise ConnectionRefusedError("refused (test)")
        return real(path, k, timeout, opening)

    monkeypatch.setattr(links, "_connect", slow)
    got: list[Any] = []
    errors: list[BaseException] = []

    def want(i: int) -> None:
        if i:
            assert first.wait(BOUND)
            with links._links_lock:
                assert address in links._connecting  # the first one is connecting
            asked.release()
        try:
            got.append(links.link_to(address, key, BOUND))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=want, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert not any(t.is_alive() for t in threads)
    try:
        if fails:
            assert [type(e) for e in errors] == [ConnectionRefusedError]
            assert len(connects) == 8  # the others each tried, after the first failed
            assert len({id(link) for link in got}) == 1  # and kept one link
        else:
            assert errors == []
            assert len(connects) == 1
            assert len(got) == 8
            assert len({id(link) for link in got}) == 1
        assert address not in links._connecting
    finally:
        for link in {id(x): x for x in got}.values():
            link.close()
