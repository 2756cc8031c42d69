"""A SQLite store's guards around what it shares with others: a session another writer
holds is neither deleted nor dropped from under it; one stored row that is not valid
UTF-8 fails its own session alone, as a malformed row; a removed file is never made
again by the store's reads; and the listing's paging takes what `MemoryStore` takes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bounds import INTERPRETER_BOUND, end_child

from nous_actor import (
    ConflictError,
    Event,
    MemoryStore,
    Replace,
    Session,
    SQLiteStore,
    StoreError,
)
from nous_actor.store import list_sessions

T = datetime(2026, 1, 1, tzinfo=UTC)


def _events(sid: str, n: int = 3) -> list[Event]:
    return [Event(q, "user_message", T, {"content": f"{sid}-{q}"}) for q in range(n)]


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "guards.db"


# -- delete and drop of a session another writer holds ------------------------------------

_HOLDER = """
import os, sys
from nous_actor import SQLiteStore
store = SQLiteStore(sys.argv[1])
store.claim("s")
print("held", flush=True)
if sys.argv[2] == "die":
    os._exit(0)  # the claim's row stays: its holder is dead
sys.stdin.readline()
"""


@pytest.fixture
def held_elsewhere(path: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process that holds the claim of session ``s`` (3 events stored) until
    its stdin closes."""
    store = SQLiteStore(path)
    store.write({"s": _events("s")})
    store.close()
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "held\n"  # (EOF at once if the child failed)
        yield child
    finally:
        end_child(child, INTERPRETER_BOUND)


def test_delete_refuses_a_session_another_process_holds(
    path: Path, held_elsewhere: subprocess.Popen[str]
) -> None:
    """delete() of a session whose live holder is another process raises ConflictError
    naming it and changes nothing: its events and its claim stay."""
    store = SQLiteStore(path)
    try:
        with pytest.raises(ConflictError, match="cannot delete a session another writer holds"):
            store.delete("s")
        assert [e.seq for e in store.load("s")] == [0, 1, 2]
        assert store.held_by("s") == f"process {held_elsewhere.pid}"
        with pytest.raises(ConflictError):
            store.claim("s")
    finally:
        store.close()


def test_drop_refuses_a_session_another_process_holds(
    path: Path, held_elsewhere: subprocess.Popen[str]
) -> None:
    """drop() of a session another process holds raises ConflictError and drops nothing."""
    store = SQLiteStore(path)
    try:
        with pytest.raises(ConflictError, match="another writer holds this session's claim"):
            store.drop("s", [0, 1])
        assert [e.seq for e in store.load("s")] == [0, 1, 2]
        assert store.held_by("s") == f"process {held_elsewhere.pid}"
    finally:
        store.close()


def test_delete_and_drop_refuse_a_session_another_store_object_holds(path: Path) -> None:
    """Two store objects on one file in one process: the one that does not hold the
    session's claim can neither delete nor drop it; its holder goes on writing after."""
    a, b = SQLiteStore(path), SQLiteStore(path)
    try:
        session = Session.start("s", store=a, timeout=10)
        try:
            for i in range(3):
                session.append("user_message", {"content": f"a{i}"}).get(timeout=10)
            with pytest.raises(ConflictError, match="this process") as info:
                b.delete("s")
            assert info.value.session_id == "s"
            with pytest.raises(ConflictError, match="this process"):
                b.drop("s", [0])
            assert [e.seq for e in b.load("s")] == [0, 1, 2]
            assert session.append("user_message", {"content": "a3"}).get(timeout=10).seq == 3
        finally:
            session.stop()
        b.delete("s")  # released: deleted
        assert b.load("s") == []
    finally:
        a.close()
        b.close()


def test_the_holder_drops_and_deletes_what_it_holds(path: Path) -> None:
    """The store object that holds a session's claim still drops (a snapshot of a
    session started on it) and deletes it."""
    store = SQLiteStore(path)
    try:
        session = Session.start("s", store=store, timeout=10)
        try:
            for i in range(4):
                session.append("user_message", {"content": f"m{i}"}).get(timeout=10)
            summary = {"content": "summary", "surface_op": Replace(0, 2)}
            session.append("system_message", summary).get(timeout=10)
            assert session.snapshot().get(timeout=10) == 3
            assert [e.seq for e in store.load("s")] == [3, 4]
        finally:
            session.stop()
        token = store.claim("s")
        store.drop("s", [3])
        assert [e.seq for e in store.load("s")] == [4]
        store.delete("s")
        assert store.load("s") == []
        store.claim("s")  # the deleted claim is gone
        store.release("s", token)  # (a no-op: no longer its claim)
    finally:
        store.close()


def test_delete_takes_a_dead_holders_claim_over(path: Path) -> None:
    """A claim whose holder died does not keep a session from delete or drop; delete
    removes it, as a claim would take it over."""
    store = SQLiteStore(path)
    store.write({"s": _events("s")})
    child = subprocess.run(
        [sys.executable, "-c", _HOLDER, str(path), "die"],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
        check=True,
    )
    assert child.stdout == "held\n"
    try:
        assert store.held_by("s") is None  # its holder is dead
        store.drop("s", [0])
        assert [e.seq for e in store.load("s")] == [1, 2]
        store.delete("s")
        assert store.load("s") == []
        store.claim("s")
    finally:
        store.close()


# -- a stored row that is not valid UTF-8 -------------------------------------------------


def _undecodable(path: Path, sid: str, column: str = "data", seq: int = 1) -> None:
    """Set ``column`` of one row of ``sid`` to text that is not valid UTF-8 (as another
    program may have stored it)."""
    value = {
        "data": "X'7B22636F6E74656E74223A2280FF227D'",  # {"content":"\x80\xff"}
        "type": "X'80'",
        "time": "X'C328'",
    }[column]
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            f"UPDATE event_rows SET {column} = CAST({value} AS TEXT) WHERE session = "
            "(SELECT id FROM sessions WHERE session_id = ?) AND seq = ?",
            (sid, seq),
        )
    finally:
        conn.close()


@pytest.fixture
def ids(path: Path) -> list[str]:
    """40 sessions of 3 events in the store at ``path``."""
    names = [f"s{i:02d}" for i in range(40)]
    store = SQLiteStore(path)
    store.write({sid: _events(sid) for sid in names})
    store.close()
    return names


def _malformed(err: object, sid: str) -> None:
    assert isinstance(err, StoreError), err
    assert err.session_id == sid
    assert "stored event is malformed" in str(err)


@pytest.mark.parametrize("column", ["data", "type", "time"])
@pytest.mark.parametrize("batch", [3, 40])
def test_load_many_fails_the_session_with_undecodable_text_alone(
    path: Path, ids: list[str], column: str, batch: int
) -> None:
    """A row whose text is not UTF-8 fails its own session as a malformed row, in a
    small batch (read session by session) and a big one (read in one statement);
    the other sessions of the batch load."""
    _undecodable(path, "s01", column)
    store = SQLiteStore(path)
    try:
        got = store.load_many(ids[:batch])
        _malformed(got.pop("s01"), "s01")
        seqs = {sid: [e.seq for e in evs] for sid, evs in got.items() if isinstance(evs, list)}
        assert seqs == {sid: [0, 1, 2] for sid in ids[:batch] if sid != "s01"}
    finally:
        store.close()


def test_every_read_of_undecodable_text_says_malformed(path: Path, ids: list[str]) -> None:
    """load, and the reads without a claim (load_since, load_surface, a watch), say the
    row is malformed, as for any other corrupt row; the index still lists the session."""
    _undecodable(path, "s01")
    _undecodable(path, "s02", "time")
    store = SQLiteStore(path)
    try:
        for read in (
            lambda: store.load("s01"),
            lambda: store.load_since("s01", 0),
            lambda: store.load_surface("s01"),
        ):
            with pytest.raises(StoreError) as info:
                read()
            _malformed(info.value, "s01")
        with store.watch("s01", timeout=10) as watch, pytest.raises(StoreError) as info:
            watch.get(timeout=10)
        _malformed(info.value, "s01")
        assert [e.seq for e in store.load("s00")] == [0, 1, 2]
        infos = {i.session_id: i for i in list_sessions(store)}
        assert len(infos) == 40
        assert infos["s00"].error is None
        assert "a stored time is malformed" in str(infos["s02"].error)
    finally:
        store.close()


# -- a removed file ---------------------------------------------------------------------


def test_reads_after_the_file_was_removed_make_no_file(path: Path) -> None:
    """Removed with its companions before the store's reads without a claim first
    looked: they say the file was removed or replaced and make no file at its path,
    neither then nor at close."""
    store = SQLiteStore(path)
    store.write({"s": _events("s")})
    for suffix in ("", "-wal", "-shm", "-wlock"):
        if os.path.exists(f"{path}{suffix}"):  # (the companions may not all exist)
            os.remove(f"{path}{suffix}")
    try:
        for read in (
            lambda: store.next_seq("s"),
            lambda: store.held_by("s"),
            lambda: store.load_since("s", 0),
            lambda: store.holder_address("s"),
        ):
            with pytest.raises(StoreError, match="was removed or replaced"):
                read()
            assert not path.exists()
    finally:
        store.close()
    assert sorted(p.name for p in path.parent.iterdir()) == []


# -- list_sessions' paging --------------------------------------------------------------


@pytest.mark.parametrize(
    "page",
    [
        {"limit": 2**63},
        {"limit": 2**64},
        {"after": "\ud800"},
        {"after": "a\udfff"},
        {"after": "\udfffz"},
        {"prefix": "\ud800"},
        {"prefix": "a\ud800"},
    ],
)
def test_list_sessions_pages_as_memory_store_does(path: Path, page: dict[str, object]) -> None:
    """A limit past SQLite's integers, and an ``after`` or ``prefix`` holding a lone
    surrogate (which no stored id holds), list what MemoryStore lists."""
    ids = ["a", "ab", "a\U0001f600", "b", "\ud7ff", "\ue000", "\U0001f600x", "日本"]
    sqlite_store, memory = SQLiteStore(path), MemoryStore()
    try:
        for store in (sqlite_store, memory):
            store.write({sid: _events(sid, 1) for sid in ids})
        want = [i.session_id for i in list_sessions(memory, **page)]  # type: ignore[arg-type]
        got = [i.session_id for i in list_sessions(sqlite_store, **page)]  # type: ignore[arg-type]
        assert got == want
    finally:
        sqlite_store.close()
        memory.close()
