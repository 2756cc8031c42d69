"""A store's feed of a session never stalls behind its buffer.

A watch reads ahead at most ``buffer`` events; the rest wait in the store. A read that
filled the room it had left the watch unmarked, so the reader was never asked for the
rest: a watch ``buffer`` events or more behind delivered one buffer and then nothing
(no lag, no end) until some later commit woke its reader.
"""

from __future__ import annotations

from pathlib import Path

from bounds import BOUND

from nous_actor import Session, Sessions, SQLiteStore, Subscription


def _drain(sub: Subscription, n: int) -> list[int]:
    return [sub.get(timeout=BOUND).seq for _ in range(n)]


def test_a_watch_more_than_its_buffer_behind_delivers_every_committed_event(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "w.db")
    s = Session.start("s", store=store, timeout=BOUND)
    try:
        futures = [s.append("user_message", {"content": str(i)}) for i in range(40)]
        assert futures[-1].get(timeout=BOUND).seq == 39
        for buffer in (1, 5, 40):
            with store.watch("s", buffer=buffer) as w:
                assert _drain(w, 40) == list(range(40)), buffer
    finally:
        s.stop()
        store.close()


def test_a_readers_subscription_more_than_its_buffer_behind_catches_up(tmp_path: Path) -> None:
    """The same through `Sessions.read` in a registry that does not hold the session (a
    dashboard in another worker)."""
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    s = Session.start("s", store=store, timeout=BOUND)
    other = Sessions(SQLiteStore(path), timeout=BOUND)
    try:
        s.append("user_message", {"content": "x"}).get(timeout=BOUND)
        futures = [s.append("user_message", {"content": "x"}) for _ in range(29)]
        futures[-1].get(timeout=BOUND)
        with other.read("s").subscribe(buffer=4) as sub:
            assert _drain(sub, 30) == list(range(30))
            s.append("user_message", {"content": "later"}).get(timeout=BOUND)
            assert _drain(sub, 1) == [30]
    finally:
        other.close(timeout=BOUND)
        s.stop()
        store.close()
