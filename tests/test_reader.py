"""SessionReader: the committed history of a session, read without taking the session."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nous_actor import ConflictError, SessionReader, Sessions, SessionStopped, SQLiteStore
from nous_actor.core.history import shadowed_by
from nous_actor.store import MemoryStore


def test_a_reader_sees_what_the_holder_acknowledged_and_takes_nothing(tmp_path: Path) -> None:
    """Every acknowledged event is in a read, and reading never claims the session: the
    holder keeps writing, and a second writer is still refused."""
    store = SQLiteStore(tmp_path / "r.db")
    with Sessions(store) as sessions:
        chat = sessions.open("chat")
        for i in range(5):
            chat.append("user_message", {"content": f"m{i}"}).get()
        reader = sessions.read("chat")
        assert [m.content for m in reader.derive_messages().get()] == [f"m{i}" for i in range(5)]
        assert reader.count().get() == 5
        assert [e.seq for e in reader.since(3).get()] == [3, 4]
        assert reader.held_by().get() == "this process"
        chat.append("user_message", {"content": "m5"}).get()
        assert reader.count().get() == 6
        with pytest.raises(ConflictError):
            SQLiteStore(tmp_path / "r.db").claim("chat")


def test_a_readers_log_can_be_audited_and_rewound() -> None:
    """``log`` gives a `Log` for audit; ``as_of`` the history right after a seq."""
    with Sessions(MemoryStore()) as sessions:
        chat = sessions.open("chat")
        chat.append("user_message", {"content": "a"}).get()
        chat.append("user_message", {"content": "b"}).get()
        chat.append("system_message", {"content": "sum", "surface_op": ["replace", 0, 1]}).get()
        reader = sessions.read("chat")
        assert shadowed_by(reader.log().get(), 0) == [2]
        assert [m.content for m in reader.as_of(1).get().derive_messages()] == ["a", "b"]
        assert [m.content for m in reader.derive_messages().get()] == ["sum"]


def test_a_reader_subscription_follows_commits() -> None:
    """``subscribe`` gives the stored events, then each new commit, in order."""
    with Sessions(MemoryStore()) as sessions:
        chat = sessions.open("chat")
        chat.append("user_message", {"content": "a"}).get()
        with sessions.read("chat").subscribe() as feed:
            chat.append("user_message", {"content": "b"}).get()
            assert [feed.get(timeout=10).data["content"] for _ in range(2)] == ["a", "b"]


def test_an_event_loop_awaits_reads_without_blocking() -> None:
    """From asyncio, a read is awaited (made off the loop) and gives the same answer."""
    store = MemoryStore()
    with Sessions(store) as sessions:
        sessions.open("chat").append("user_message", {"content": "a"}).get()

        async def main() -> list[str | None]:
            messages = await SessionReader("chat", store).derive_messages()
            return [m.content for m in messages]

        assert asyncio.run(main()) == ["a"]


def test_a_session_with_no_events_reads_empty() -> None:
    """A session nobody wrote reads as empty, count 0."""
    reader = SessionReader("nobody", MemoryStore())
    assert reader.events().get() == []
    assert reader.count().get() == 0


@pytest.mark.parametrize("seq", [-1, "1", True])
def test_bad_seqs_are_refused_at_the_call(seq: object) -> None:
    """``since`` and ``as_of`` take an int >= 0, checked before anything is read."""
    reader = SessionReader("chat", MemoryStore())
    with pytest.raises((TypeError, ValueError), match="seq"):
        reader.since(seq)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match="seq"):
        reader.as_of(seq)  # type: ignore[arg-type]


def test_bad_reader_arguments_are_refused() -> None:
    """A bad id, store or timeout is refused when the reader is made."""
    with pytest.raises(ValueError, match="session"):
        SessionReader("", MemoryStore())
    with pytest.raises(TypeError, match="store"):
        SessionReader("chat", "events.db")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        SessionReader("chat", MemoryStore(), timeout=0)


def test_a_closed_registry_gives_no_reader() -> None:
    """``read`` on a closed registry raises SessionStopped."""
    sessions = Sessions()
    sessions.close()
    with pytest.raises(SessionStopped, match="closed"):
        sessions.read("chat")
