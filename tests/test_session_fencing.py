"""A fence is not a crash, and a refused open is not an error of this process (DESIGN.md 5).

A session whose write is fenced (another writer took it over) stops once,
says so (``session.fenced``), costs nothing of its restart intensity, and the
next call reopens it if the store allows. An ``open`` refused because another
live writer holds the session raises ``ConflictError`` to the caller, logged
at info level only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from bounds import BOUND
from structlog.testing import capture_logs

from nous_actor import (
    ConflictError,
    FencedError,
    MemoryStore,
    Session,
    Sessions,
    SessionStopped,
    SQLiteStore,
    StoreError,
)
from nous_actor.core.event import Event
from nous_actor.testing import DelegatingStore


class Fencing(DelegatingStore):
    """A store whose writes are fenced while ``fenced`` is set (a newer writer holds it)."""

    fenced = False

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        if self.fenced:
            return {sid: FencedError("a newer writer holds it", session_id=sid) for sid in appends}
        return super().write(appends)


def _reopened(chat: Session) -> int:
    """The next calls reach a reopened session (one queued as it stopped fails, unapplied)."""
    for _ in range(3):
        try:
            return chat.count().get()
        except SessionStopped:
            continue
    raise AssertionError("the session was not reopened by the calls after its fence")


def test_a_fenced_session_stops_once_and_the_next_call_reopens_it() -> None:
    """Fenced: the append fails with FencedError, no restart is counted, later calls work."""
    store = Fencing(MemoryStore())
    with capture_logs() as logs, Sessions(store, max_restarts=1, timeout=BOUND) as sessions:
        chat = sessions.open("chat")
        chat.append("user_message", {"content": "one"}).get()
        store.fenced = True
        for _ in range(3):  # more fences than the intensity allows crashes
            with pytest.raises(FencedError):
                chat.append("user_message", {"content": "lost"}).get()
            _reopened(chat)
        store.fenced = False
        assert chat.append("user_message", {"content": "two"}).get().seq == 1
        assert sessions.restart_count("chat") == 0
    events = [e["event"] for e in logs]
    assert events.count("session.fenced") == 3
    assert "session.crashed" not in events
    assert "session.restart" not in events
    assert "session.gave_up" not in events


def test_a_refused_open_is_raised_to_the_caller_and_not_logged_as_an_error(
    tmp_path: Path,
) -> None:
    """Another writer that cannot be called (a standalone session: it answers at no
    address) holds the session: ConflictError, and no error-level log; one a registry
    holds is called through it, with no error-level log either."""
    db = tmp_path / "s.db"
    with (
        Sessions(SQLiteStore(db), timeout=BOUND) as first,
        capture_logs() as logs,
        Sessions(SQLiteStore(db), timeout=BOUND) as second,
    ):
        first.open("chat")
        forwarded = second.open("chat")
        assert forwarded.append("user_message", {"content": "hi"}).get(timeout=BOUND).seq == 0
        assert second.live() == []
        standalone = Session.start("alone", store=SQLiteStore(db), timeout=BOUND)
        try:
            with pytest.raises(ConflictError):
                second.open("alone")
        finally:
            standalone.stop()
    assert [e["event"] for e in logs if e["log_level"] == "error"] == []
    assert "session.start_refused" in [e["event"] for e in logs]
