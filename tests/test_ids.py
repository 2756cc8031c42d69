"""The one session-id rule (nous_actor.core.ids.check_session_id), and the ids the
runtime makes (unique_hex)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND

from nous_actor import MemoryStore, Sessions, SQLiteStore
from nous_actor.core.ids import MAX_SESSION_ID_LENGTH, check_session_id
from nous_actor.runtime.unique import unique_hex


@pytest.mark.parametrize(
    "session_id",
    [
        "s",
        "chat-42",
        "chat 42",  # inner spaces are fine
        "ünïcødé-日本",
        "team/agent:7",
        "a\u00a0b",  # a no-break space inside
        "x" * MAX_SESSION_ID_LENGTH,
        "'; DROP TABLE events; --",
    ],
)
def test_a_valid_id_is_returned_as_it_is(session_id: str) -> None:
    """A valid id comes back unchanged."""
    assert check_session_id(session_id) == session_id


@pytest.mark.parametrize(
    ("session_id", "reason"),
    [
        ("", "it is empty"),
        (" ", "leading or trailing whitespace"),
        (" chat", "leading or trailing whitespace"),
        ("chat\n", "leading or trailing whitespace"),
        ("\u3000chat", "leading or trailing whitespace"),
        ("a\nb", r"a control character \(U\+000A\)"),
        ("a\tb", r"a control character \(U\+0009\)"),
        ("nul\x00inside", r"a control character \(U\+0000\)"),
        ("del\x7f", r"a control character \(U\+007F\)"),
        ("zero\u200bwidth", r"a format character \(U\+200B\)"),
        ("bom\ufeff-x", r"a format character \(U\+FEFF\)"),
        ("line\u2028sep", r"a line separator \(U\+2028\)"),
        ("para\u2029sep", r"a paragraph separator \(U\+2029\)"),
        ("lone-\udc80", r"a surrogate \(U\+DC80\)"),
        ("x" * (MAX_SESSION_ID_LENGTH + 1), "it is 257 characters long"),
        ("x" * 100_000, "it is 100000 characters long"),
    ],
)
def test_an_invalid_id_is_a_value_error_saying_why_and_what_is_valid(
    session_id: str, reason: str
) -> None:
    """Each broken part of the rule is named, followed by the whole rule."""
    with pytest.raises(ValueError, match=reason) as info:
        check_session_id(session_id)
    assert "a session id is 1 to 256 characters" in str(info.value)


@pytest.mark.parametrize("value", [None, 42, b"chat", ["chat"]])
def test_a_non_str_is_a_type_error(value: object) -> None:
    """Only a str can be a session id."""
    with pytest.raises(TypeError, match=f"session_id must be a str, got {type(value).__name__}"):
        check_session_id(value)


def test_the_message_names_the_argument() -> None:
    """`what` names the argument in the message."""
    with pytest.raises(ValueError, match=r"^new_id '' is not a valid session id"):
        check_session_id("", "new_id")
    with pytest.raises(TypeError, match=r"^new_id must be a str"):
        check_session_id(1, what="new_id")


def test_a_huge_id_is_shown_cut_short() -> None:
    """A 100,000-character id is not copied whole into the message."""
    with pytest.raises(ValueError, match=r"\.\.\. \(100000 characters\)") as info:
        check_session_id("y" * 100_000)
    assert len(str(info.value)) < 400


def test_unique_hex_never_repeats_and_shares_the_process_prefix() -> None:
    made = [unique_hex() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert all(len(h) == 32 and int(h, 16) >= 0 for h in made)
    assert {h[:16] for h in made} == {made[0][:16]}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_draws_a_prefix_of_its_own() -> None:
    """A child forked from a process has the parent's counter state: without a prefix
    of its own, its next id would be the parent's next."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one id and leave at once
        try:
            os.write(write, unique_hex().encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    mine = unique_hex()
    assert len(child) == 32
    assert child[:16] != mine[:16]


def _urandom_draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    draws: list[int] = []
    real = os.urandom

    def counted(n: int) -> bytes:
        draws.append(n)
        return real(n)

    monkeypatch.setattr(os, "urandom", counted)
    return draws


@pytest.mark.parametrize("store_kind", ["memory", "sqlite"])
def test_opening_sessions_and_turns_draw_nothing_from_urandom(
    store_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each draw from ``os.urandom`` (``uuid.uuid4``) lets go of the GIL, and with other
    threads busy the caller then waits for it back: an actor's name, a claim's token and
    a turn's id are made without one. Counted over 40 opens, appends and turns."""
    store = MemoryStore() if store_kind == "memory" else SQLiteStore(tmp_path / "s.db")
    sessions = Sessions(store)
    try:
        sessions.open("warm").append("user_message", {"content": "x"}).get(timeout=BOUND)
        draws = _urandom_draws(monkeypatch)
        handles = [sessions.open(f"s-{i}") for i in range(20)]

        async def batch() -> list[Any]:
            return await asyncio.gather(*(sessions.aopen(f"m-{i}") for i in range(20)))

        handles += asyncio.run(batch())
        for h in handles:
            h.append("user_message", {"content": "hi"}).get(timeout=BOUND)
        with handles[0].turn() as turn:
            turn.append("assistant_message", {"content": "ok"}).get(timeout=BOUND)
        assert handles[0].count().get(timeout=BOUND) == 4  # with the turn's start and end
        assert draws == []
    finally:
        sessions.close(timeout=BOUND)
        store.close()
