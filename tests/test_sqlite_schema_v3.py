"""SQLiteStore schema version 3: sessions numbered in a table of their own, events clustered
on (number, seq), the view ``events`` that reads as the older table; and the migration
of a version-2 store (files made here with version 2's DDL, and by the version-2
release itself, run from the repository's history).

Child processes are plain ``python -c`` scripts; every wait on them is bounded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from bounds import SLOW_BOUND
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sqlite_schema_v2 import (
    ROOT,
    Child,
    Claim,
    Request,
    children,
    dead_pid,
    dump,
    ev,
    later,
    live_pid,
    raw,
)

from nous_actor.core.codec import encode_data, format_time
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store import SQLiteStore
from nous_actor.store.sqlite import APPLICATION_ID, SCHEMA_VERSION
from nous_actor.viewer import read_only_sqlite

__all__ = ["children", "dead_pid", "live_pid"]  # fixtures, shared with the version-2 tests

V2_SCHEMA = (
    # The tables of schema version 2, exactly as its release made them (its _SCHEMA).
    """CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS writers (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    since TEXT NOT NULL,
    address TEXT
)""",
    """CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
)""",
)
HANDOFFS = """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)"""

V2_RELEASE = "9237715"
"""A commit of the last release that wrote schema version 2 (for the real old process)."""


def make_v2_store(
    path: Path,
    sessions: dict[str, list[Any]],
    claims: Sequence[Claim] = (),
    requests: Sequence[Request] = (),
    key: bytes | None = None,
) -> None:
    """A store as the version-2 release left it: its tables, marks and WAL journal, and
    rows as it wrote them (events through the codec, claims with an address, hand-off
    requests, the forwarding key)."""
    with raw(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in V2_SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 2")
        conn.execute("COMMIT")
        conn.executemany(
            "INSERT INTO events (session_id, seq, type, time, data) VALUES (?, ?, ?, ?, ?)",
            [
                (sid, e.seq, e.type.value, format_time(e.time), encode_data(e))
                for sid, events in sessions.items()
                for e in events
            ],
        )
        conn.executemany(
            "INSERT INTO writers (session_id, pid, token, since, address) VALUES (?, ?, ?, ?, ?)",
            [(sid, pid, token, later(0), f"unix:/run/{pid}") for sid, pid, token in claims],
        )
        if requests:
            conn.execute(HANDOFFS)
            conn.executemany(
                "INSERT INTO handoffs (session_id, pid, until) VALUES (?, ?, ?)", requests
            )
        if key is not None:
            conn.execute("INSERT INTO keys (name, value) VALUES ('forwarding', ?)", (key,))


def migrated(before: dict[str, Any]) -> dict[str, Any]:
    """What a version-2 file's dump becomes once migrated (objects aside): the sessions
    numbered in the order of their ids, each event row under its session's number,
    everything else as it was."""
    numbers = {sid: n for n, sid in enumerate(sorted({r[0] for r in before["events"]}), 1)}
    after = dict(before, version=SCHEMA_VERSION)
    after["sessions"] = sorted(((n, sid) for sid, n in numbers.items()), key=repr)
    after["event_rows"] = sorted(((numbers[r[0]], *r[1:]) for r in before["events"]), key=repr)
    del after["objects"], after["events"]
    return after


def objects(path: Path) -> set[tuple[str, str, str | None]]:
    with raw(path) as conn:
        return set(conn.execute("SELECT type, name, sql FROM sqlite_master"))


def new_store_objects(folder: Path, handoffs: bool) -> set[tuple[str, str, str | None]]:
    """The schema objects of a store made new by this release (with its hand-off table)."""
    path = folder / f"fresh-{uuid.uuid4().hex}.db"
    with SQLiteStore(path) as store:
        if handoffs:
            store.ask_handoff("anyone", 1.0)
    return objects(path)


# -- a new store ------------------------------------------------------------------------------


def test_a_new_store_is_made_at_version_3(tmp_path: Path) -> None:
    """A new store is made at version 3: sessions numbered, events clustered on (number,
    seq) without a rowid, the view ``events`` with the columns of the older table."""
    path = tmp_path / "new.db"
    with SQLiteStore(path) as store:
        store.write({"b": [ev(0), ev(1)], "a": [ev(0)]})
    assert SCHEMA_VERSION == 3
    with raw(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
        kinds = dict(
            conn.execute("SELECT name, type FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
        )
        assert conn.execute("SELECT id, session_id FROM sessions").fetchall() == [
            (1, "b"),
            (2, "a"),
        ]
        assert conn.execute("SELECT session, seq FROM event_rows").fetchall() == [
            (1, 0), (1, 1), (2, 0)
        ]  # fmt: skip
        assert [r[1] for r in conn.execute("PRAGMA table_info(events)")] == [
            "session_id", "seq", "type", "time", "data"
        ]  # fmt: skip
        without_rowid = conn.execute(
            "SELECT sql LIKE '%WITHOUT ROWID' FROM sqlite_master WHERE name = 'event_rows'"
        ).fetchone()[0]
    assert without_rowid == 1
    assert kinds == {
        "sessions": "table",
        "event_rows": "table",
        "events": "view",
        "events_insert": "trigger",
        "events_update": "trigger",
        "events_delete": "trigger",
        "writers": "table",
        "keys": "table",
    }


def test_a_session_keeps_its_number_when_deleted_and_written_again(tmp_path: Path) -> None:
    """A number is never given to another id: a deleted session keeps its number, and a
    store object that remembered it writes the session again under it (another store
    object deleted it meanwhile); new sessions get the next numbers."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as a, SQLiteStore(path) as b:
        a.write({"x": [ev(0)], "y": [ev(0)]})
        b.delete("x")
        assert a.sessions() == ["y"]
        a.write({"x": [ev(0, "again")]})
        b.write({"z": [ev(0)]})
        assert b.load("x") == [ev(0, "again")]
        assert a.load("z") == [ev(0)]
        with raw(path) as conn:
            assert conn.execute("SELECT session_id FROM sessions ORDER BY id").fetchall() == [
                ("x",), ("y",), ("z",)
            ]  # fmt: skip


def test_plain_sql_on_the_events_view_writes_the_rows_behind_it(tmp_path: Path) -> None:
    """Plain SQL that inserts, updates or deletes through ``events`` writes the rows
    behind it, and an insert of a stored (session_id, seq) fails in SQLite."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        row = ("s", 0, "user_message", format_time(ev(0).time), '{"content":"fork"}')
        with raw(path) as conn:
            with pytest.raises(sqlite3.IntegrityError):
                conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", row)
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?)", ("new", *row[1:]))
            conn.execute("UPDATE events SET data = '{\"content\":\"y\"}' WHERE session_id = 's'")
        assert store.load("new") == [ev(0, "fork")]
        assert store.load("s") == [ev(0, "y")]
        with raw(path) as conn:
            conn.execute("DELETE FROM events WHERE session_id = 'new'")
        assert store.sessions() == ["s"]
        store.write({"s": [ev(1)]})
        assert store.load("s") == [ev(0, "y"), ev(1)]


# -- the migration of a version-2 store ---------------------------------------------------------

session_ids = st.sampled_from(["a", "b", "chat-1", "dup:2", "é", "Z"])


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sessions=st.dictionaries(
        session_ids, st.lists(st.text(max_size=20), min_size=1, max_size=4), max_size=4
    ),
    claimed=st.dictionaries(session_ids, st.sampled_from(["live", "dead"]), max_size=3),
    asked=st.sets(session_ids, max_size=2),
    keyed=st.booleans(),
)
def test_a_v2_store_is_migrated_and_reads_back_the_same(
    live_pid: int,
    dead_pid: int,
    sessions: dict[str, list[str]],
    claimed: dict[str, str],
    asked: set[str],
    keyed: bool,
) -> None:
    """A store of version 2 holding events, claims with addresses, hand-off requests and
    a forwarding key is migrated when opened: every row reads back the same, the sessions
    are numbered in the order of their ids, the file holds what a new store holds."""
    pids = {"live": live_pid, "dead": dead_pid}
    events = {sid: [ev(i, c) for i, c in enumerate(texts)] for sid, texts in sessions.items()}
    claims = [(sid, pids[k], uuid.uuid4().hex) for sid, k in claimed.items()]
    requests = [(sid, live_pid, later(600)) for sid in sorted(asked)]
    key = os.urandom(32) if keyed else None
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        path = folder / "v2.db"
        make_v2_store(path, events, claims, requests, key)
        before = dump(path)
        store = stack.enter_context(SQLiteStore(path, create=False))
        after = dump(path)
        assert {k: v for k, v in after.items() if k != "objects"} == migrated(before)
        assert after["objects"] == new_store_objects(folder, handoffs=bool(requests))
        assert store.integrity_check() == "ok"
        assert store.sessions() == sorted(events)
        assert store.load_many(list(events)) == events
        for sid, evs in events.items():
            assert store.load(sid) == evs
            assert store.next_seq(sid) == len(evs)
        for sid, kind in claimed.items():
            if kind == "live":
                assert store.holder_address(sid) == (
                    f"process {live_pid}",
                    f"unix:/run/{live_pid}",
                )
            else:
                assert store.holder_address(sid) is None
        if key is not None:
            assert store.forwarding_key() == key
        store.write({sid: [ev(len(evs))] for sid, evs in events.items()} | {"new": [ev(0)]})
        with raw(path) as conn:
            assert conn.execute("SELECT id FROM sessions WHERE session_id = 'new'").fetchone() == (
                len(events) + 1,
            )


def test_a_migrated_store_reopens_as_it_is(tmp_path: Path) -> None:
    """Opening a migrated store writes nothing: it is a whole store of version 3."""
    path = tmp_path / "v2.db"
    make_v2_store(path, {"s": [ev(0)]})
    SQLiteStore(path).close()
    before = dump(path)
    with SQLiteStore(path) as store:
        assert store.load("s") == [ev(0)]
    assert dump(path) == before


MIGRATOR = """
import os, sys
from nous_actor.store.sqlite.connection import _Connection
from nous_actor.store import SQLiteStore

path, stop_at, inside = sys.argv[1], sys.argv[2], int(sys.argv[3])
connect = _Connection.connect
begun = False
running = ""
steps = 0

def stop():
    wal = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
    print("stopped", wal, flush=True)
    sys.stdin.readline()  # killed here by the parent

def trace(sql):
    global begun, running
    if sql.startswith("BEGIN IMMEDIATE"):
        begun = True
    elif begun:
        running = sql
        if not inside and sql.startswith(stop_at):
            stop()

def progress():
    global steps
    if inside and begun and running.startswith(stop_at):
        steps += 1
        if steps == inside:
            stop()
    return 0

def traced(self, target, timeout, uri):
    conn = connect(self, target, timeout, uri)
    conn.execute("PRAGMA cache_size = 8")  # a small cache: the copy spills into the WAL
    conn.set_trace_callback(trace)
    conn.set_progress_handler(progress, 1000)
    return conn

_Connection.connect = traced
SQLiteStore(path).close()
print("opened", flush=True)
"""

KILL_POINTS = {
    # (statement, progress steps into it: 0 = before it runs, expected version)
    "before-sessions": ("CREATE TABLE IF NOT EXISTS sessions", 0, 2),
    "numbering": ("INSERT INTO sessions", 5, 2),
    "before-copy": ("INSERT INTO event_rows", 0, 2),
    "mid-copy": ("INSERT INTO event_rows", 150, 2),  # of about 330 steps
    "before-drop": ("DROP TABLE events", 0, 2),
    "before-view": ("CREATE VIEW IF NOT EXISTS events", 0, 2),
    "before-triggers": ("CREATE TRIGGER IF NOT EXISTS events_insert", 0, 2),
    "before-version": ("PRAGMA user_version = 3", 0, 2),
    "before-commit": ("COMMIT", 0, 2),
    "after-commit": ("PRAGMA journal_mode", 0, 3),
}


@pytest.fixture(scope="module")
def big_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A version-2 store of 300 sessions x 40 events (written interleaved), a live claim."""
    path = tmp_path_factory.mktemp("big") / "v2.db"
    sessions = {
        f"session-{i:03d}": [ev(j, f"text {i} {j}") for j in range(40)] for i in range(300)
    }
    make_v2_store(path, sessions, [("session-007", os.getpid(), "tok")], key=b"k" * 32)
    return path


@pytest.mark.parametrize("point", KILL_POINTS, ids=KILL_POINTS.keys())
def test_sigkill_mid_migration_leaves_a_whole_v2_or_v3_store(
    tmp_path: Path, children: list[Child], big_v2: Path, point: str
) -> None:
    """A process SIGKILLed anywhere in the migration's transaction (before each statement,
    inside the numbering and the copy, with pages of the copy already in the WAL) leaves
    the file wholly at version 2, every row as it was (killed after COMMIT: wholly at
    version 3); it opens again, migrated, with every row."""
    stop_at, inside, expected = KILL_POINTS[point]
    path = tmp_path / "v2.db"
    shutil.copyfile(big_v2, path)
    before = dump(path)
    child = Child(MIGRATOR, str(path), stop_at, str(inside))
    children.append(child)
    wal = int(child.expect("stopped").split()[1])
    if point == "mid-copy":
        assert wal > 0  # the copy has written pages of the uncommitted transaction
    child.kill()
    left = dump(path)
    if expected == 2:
        assert left == before
    else:
        assert {k: v for k, v in left.items() if k != "objects"} == migrated(before)
    with raw(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with SQLiteStore(path) as store:
        assert store.load("session-299") == [ev(j, f"text 299 {j}") for j in range(40)]
        assert len(store.sessions()) == 300
    assert {k: v for k, v in dump(path).items() if k != "objects"} == migrated(before)


def test_a_read_only_opening_of_a_v2_store_reads_it_and_reads_on_after_migration(
    tmp_path: Path,
) -> None:
    """A read-only opening (the viewer's) of a version-2 store reads it as it is and
    refuses a write without failing; once another store has migrated the file under it,
    it reads on (the view): the rows written since, the key made since."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "v2.db"
    make_v2_store(path, {"s": [ev(0)], "t": [ev(0), ev(1)]})
    viewer = read_only_sqlite(path)
    inner: SQLiteStore = viewer.inner  # type: ignore[assignment]
    with contextlib.closing(viewer):
        assert viewer.load("t") == [ev(0), ev(1)]
        with pytest.raises(StoreError, match="opened it read-only, without migrating it"):
            inner.forwarding_key()
        with SQLiteStore(path) as writer:  # a process that can write: it migrates the file
            assert dump(path)["version"] == 3
            key = writer.forwarding_key()
            writer.write({"s": [ev(1)]})
        assert viewer.load("t") == [ev(0), ev(1)]
        assert viewer.load("s") == [ev(0), ev(1)]
        assert inner.sessions() == ["s", "t"]
        assert inner.forwarding_key() == key


# -- a process of the version-2 release ---------------------------------------------------------

V2_PROCESS = """
import sys
from datetime import UTC, datetime
from nous_actor import Event
from nous_actor.store import SQLiteStore
from nous_actor.errors import StoreError
T = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
store = SQLiteStore(sys.argv[1])
store.advertise("unix:/run/old.sock")
store.write({
    "s": [Event(i, "user_message", T, {"content": f"s{i}"}) for i in range(5)],
    "t": [Event(0, "user_message", T, {"content": "t0"})],
    "u": [Event(i, "user_message", T, {"n": i, "deep": [1, {"x": None}]}) for i in range(3)],
})
store.drop("s", [1, 2])
store.claim("s")
store.forwarding_key()
print("ready", flush=True)
sys.stdin.readline()
print("read", [e.seq for e in store.load("s")], flush=True)
sys.stdin.readline()
try:
    store.write({"s": [Event(5, "user_message", T, {"content": "late"})]})
except StoreError as exc:
    print("refused", exc, flush=True)
else:
    print("written", flush=True)
"""


@pytest.fixture(scope="module")
def v2_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as the last release of schema version 2 had it, from the history."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and the repository's history (the version-2 release)")
    folder = tmp_path_factory.mktemp("v2-release")
    archive = subprocess.run(
        [git, "archive", V2_RELEASE, "nous_actor"],
        cwd=ROOT,
        capture_output=True,
        timeout=SLOW_BOUND,
        check=False,
    )
    if archive.returncode != 0:
        pytest.skip(f"the version-2 release {V2_RELEASE} is not in this repository's history")
    subprocess.run(
        ["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True, timeout=SLOW_BOUND
    )
    return folder


def test_a_file_of_the_v2_release_is_migrated_and_its_process_writes_no_more(
    tmp_path: Path, children: list[Child], v2_release: Path
) -> None:
    """A file made and written by the version-2 release (events, a snapshot's drop, a
    claim with an address, the forwarding key) is migrated by this release with every row;
    the old process, still holding its claim, reads its session on (through the view)
    and refuses its next write, naming the new version."""
    path = tmp_path / "s.db"
    env = dict(os.environ, PYTHONPATH=str(v2_release))
    old = Child(V2_PROCESS, str(path), env=env, cwd=v2_release)  # (cwd comes first)
    children.append(old)
    old.expect("ready")
    before = dump(path)
    assert before["version"] == 2
    with SQLiteStore(path) as store:
        assert {k: v for k, v in dump(path).items() if k != "objects"} == migrated(before)
        assert store.holder_address("s") == (f"process {old.pid}", "unix:/run/old.sock")
        assert [e.seq for e in store.load("s")] == [0, 3, 4]
        assert store.load("u")[2].data == {"n": 2, "deep": [1, {"x": None}]}
        with pytest.raises(ConflictError):
            store.claim("s")
        assert old.ask("read", "read ") == "read [0, 3, 4]"  # through the view
        refused = old.ask("write", "refused ")
        assert "now has schema version 3" in refused
        assert "upgrade nous_actor" in refused
        assert [e.seq for e in store.load("s")] == [0, 3, 4]


def test_a_store_remembers_a_bounded_number_of_session_numbers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past `NUMBERS_KEPT` session numbers a store object forgets them and reads them again
    as its writes need them: its memory stays bounded, and every write lands under its
    own session."""
    from datetime import UTC, datetime

    from nous_actor import Event
    from nous_actor.store.sqlite import store as store_module

    monkeypatch.setattr(store_module, "NUMBERS_KEPT", 3)
    t = datetime.now(UTC)
    store = SQLiteStore(tmp_path / "s.db")
    try:
        for round_ in range(2):
            for i in range(5):
                ev = Event(round_, "user_message", t, {"content": f"s{i} r{round_}"})
                assert store.write({f"s{i}": [ev]}) == {}
                assert len(store._numbers) <= 3
        for i in range(5):
            assert [e.data["content"] for e in store.load(f"s{i}")] == [f"s{i} r0", f"s{i} r1"]
    finally:
        store.close()
