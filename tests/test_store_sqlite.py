"""SQLiteStore specifics: pragmas, schema, claims across objects and processes, bad files.

The rules every store keeps are in test_store_contract.py; here is what only
SQLite has. Child processes are plain ``python -c`` scripts; every wait on
them is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from bounds import SLOW_BOUND as BOUND
from structlog.testing import capture_logs

from nous_actor import Event, Log, Replace, Session
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store import SQLiteStore, import_session
from nous_actor.store.sqlite import vacuum as sqlite_vacuum

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def ev(seq: int, content: str = "x") -> Event:
    return Event(seq, "user_message", T0, {"content": content})


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "events.sqlite"


@pytest.fixture
def store(path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(path)
    yield s
    s.close()


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to the file (autocommit), bypassing the store."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def pragma(store: SQLiteStore, name: str) -> object:
    """A setting of the store's own connections (synchronous is a per-connection
    setting): the one that reads and the one that writes agree on it."""
    with store._connection.lock:
        wconn = store._connection.writer()
    read = store._connection.conn.execute(f"PRAGMA {name}").fetchone()[0]
    assert wconn.execute(f"PRAGMA {name}").fetchone()[0] == read
    return read


# -- child processes ------------------------------------------------------------------------


class Child:
    """A ``python -c`` child whose stdout lines are read with a bound."""

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.endswith("\n"):  # not a line cut short by SIGKILL
                self.lines.put(line[:-1])
        self.lines.put(None)

    def expect(self, prefix: str) -> str:
        """The next line, which must start with ``prefix`` (waits at most BOUND)."""
        try:
            line = self.lines.get(timeout=BOUND)
        except queue.Empty:
            raise AssertionError(f"child said nothing within {BOUND} s") from None
        if line is None:
            raise AssertionError(f"child ended, expected {prefix!r}; stderr: {self.stderr()}")
        if not line.startswith(prefix):
            raise AssertionError(f"child said {line!r}, expected {prefix!r}")
        return line

    def rest(self) -> list[str]:
        """Every line still to come, up to the child's end (which must come within BOUND)."""
        out: list[str] = []
        while (line := self.lines.get(timeout=BOUND)) is not None:
            out.append(line)
        return out

    def finish(self) -> int:
        """Close the child's stdin and wait (bounded) for it to exit."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=BOUND)

    def kill(self) -> None:
        """SIGKILL the child and reap it (a zombie's pid still looks alive)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=BOUND)

    def stderr(self) -> str:
        """What the child wrote to stderr, once it has exited (else "")."""
        try:
            self.proc.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            return ""
        return "" if self.proc.stderr is None else self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.close()


CLAIMER = """
import sys
from nous_actor.store import SQLiteStore
path, session_id, on_exit = sys.argv[1:]
store = SQLiteStore(path)
token = store.claim(session_id)
print("claimed", flush=True)
sys.stdin.read()
if on_exit == "release":
    store.release(session_id, token)
store.close()
"""

APPENDER = """
import sys
from nous_actor import Session
from nous_actor.store import SQLiteStore
session = Session.start("crash", store=SQLiteStore(sys.argv[1]), timeout=10)
print("started", flush=True)
n = 0
while True:
    futures = [session.append("user_message", {"content": f"m{n + k}"}) for k in range(7)]
    n += 7
    for f in futures:
        sys.stdout.write(f"acked {f.get().seq}\\n")  # one write: PYTHONUNBUFFERED may be set
        sys.stdout.flush()
"""


# -- pragmas and schema -----------------------------------------------------------------------


def test_a_file_store_runs_in_wal_mode(store: SQLiteStore, path: Path) -> None:
    """A file store uses the WAL journal, and the file stays in WAL for other connections."""
    assert pragma(store, "journal_mode") == "wal"
    with raw(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize(("durability", "level"), [("full", 2), ("normal", 1)])
def test_durability_sets_synchronous(path: Path, durability: str, level: int) -> None:
    """durability="full" is synchronous=FULL (2), "normal" is NORMAL (1)."""
    with SQLiteStore(path, durability=durability) as store:  # type: ignore[arg-type]
        assert store.durability == durability
        assert pragma(store, "synchronous") == level


def test_durability_defaults_to_full(store: SQLiteStore) -> None:
    """Without durability=, every commit is fsynced (synchronous=FULL)."""
    assert store.durability == "full"
    assert pragma(store, "synchronous") == 2


def test_an_unknown_durability_is_a_value_error(path: Path) -> None:
    """durability must be "full" or "normal"; anything else is refused before opening."""
    with pytest.raises(ValueError, match="durability must be 'full' or 'normal'"):
        SQLiteStore(path, durability="fast")  # type: ignore[arg-type]
    assert not path.exists()


def test_the_primary_key_is_session_and_seq(store: SQLiteStore, path: Path) -> None:
    """The events' PRIMARY KEY is (session, seq), in that order: the session's number,
    its id UNIQUE in the sessions table."""
    with raw(path) as conn:
        cols = conn.execute("PRAGMA table_info(event_rows)").fetchall()
        unique = conn.execute(
            "SELECT il.name FROM pragma_index_list('sessions') AS l, "
            'pragma_index_info(l.name) AS il WHERE l."unique"'
        ).fetchall()
    pk = sorted((c[5], c[1]) for c in cols if c[5])
    assert [name for _, name in pk] == ["session", "seq"]
    assert unique == [("session_id",)]


def test_the_database_itself_refuses_a_duplicate_seq(store: SQLiteStore, path: Path) -> None:
    """A raw INSERT of a stored (session_id, seq), bypassing the store, fails in SQLite."""
    store.write({"s": [ev(0)]})
    row = ("s", 0, "user_message", "2026-01-01T00:00:00.000000+00:00", '{"content":"fork"}')
    with raw(path) as conn, pytest.raises(sqlite3.IntegrityError):
        conn.execute(
            "INSERT INTO events (session_id, seq, type, time, data) VALUES (?,?,?,?,?)", row
        )
    assert store.load("s") == [ev(0)]


def test_events_are_stored_in_their_json_form(store: SQLiteStore, path: Path) -> None:
    """A row holds the type's name, the time as ISO-8601 with microseconds, data as JSON."""
    summary = Event(1, "system_message", T0, {"content": "s", "surface_op": Replace(0, 0)})
    store.write({"s": [ev(0), summary]})
    with raw(path) as conn:
        rows = conn.execute("SELECT seq, type, time, data FROM events ORDER BY seq").fetchall()
    assert rows[0][1:3] == ("user_message", "2026-01-01T12:00:00.123456+00:00")
    assert json.loads(rows[1][3]) == {"content": "s", "surface_op": ["replace", 0, 0]}


def test_a_second_writer_object_on_the_same_file_gets_a_conflict(path: Path) -> None:
    """Two store objects on one file: a seq one stored is refused to the other."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        first.write({"s": [ev(0, "first")]})
        refused = second.write({"s": [ev(0, "second")]})
        assert isinstance(refused["s"], ConflictError)
        assert second.load("s") == [ev(0, "first")]


def test_events_survive_closing_and_reopening_the_file(path: Path) -> None:
    """A store reopened on the same file loads what an earlier store object wrote."""
    log = Log().append("user_message", {"content": "a"}, T0)
    log = log.append("system_message", {"content": "b", "surface_op": Replace(0, 0)}, T0)
    with SQLiteStore(path) as store:
        store.write({"s": log.events()})
    with SQLiteStore(path, durability="normal") as store:
        assert store.load("s") == log.events()


# -- claims in one process ---------------------------------------------------------------------


def test_a_second_store_object_cannot_claim_a_claimed_session(path: Path) -> None:
    """A claim made through one store object holds against another on the same file."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        first.claim("s")
        with pytest.raises(ConflictError, match="live writer in this process"):
            second.claim("s")


def test_a_second_store_object_can_claim_after_release(path: Path) -> None:
    """Once the holder releases, another store object on the file can claim."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        token = first.claim("s")
        first.release("s", token)
        second.claim("s")


def test_closing_a_store_object_gives_up_the_claims_it_holds(path: Path) -> None:
    """A closed store object's sessions can write no more: its claims are given up, so
    another object on the file claims them at once (they stayed live until the process
    ended), and what it released is gone from the file's claims."""
    with SQLiteStore(path) as second:
        first = SQLiteStore(path)
        first.claim("a")
        first.claim("b")
        released = first.claim("c")
        first.release("c", released)
        first.close()
        assert second.held_by("a") is None
        assert second.held_by("b") is None
        second.claim("a")
        second.claim("b")
        second.claim("c")


def test_a_release_with_another_sessions_token_frees_nothing(path: Path) -> None:
    """``release(b, token of a)`` leaves ``a`` held (it forgot ``a``'s token as live:
    another store object then took ``a`` over from its live writer)."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        token_a = first.claim("a")
        first.claim("b")
        first.release("b", token_a)
        with pytest.raises(ConflictError, match="live writer in this process"):
            second.claim("a")
        with pytest.raises(ConflictError, match="live writer in this process"):
            second.claim("b")


def test_a_second_session_on_another_store_object_is_refused(path: Path) -> None:
    """Session.start on a second store object of the same file raises ConflictError."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        session = Session.start("s", store=first, timeout=BOUND)
        session.append("user_message", {"content": "a"}).get()
        with pytest.raises(ConflictError):
            Session.start("s", store=second, timeout=BOUND)
        session.append("user_message", {"content": "b"}).get()
        session.stop()
        assert [e.data["content"] for e in second.load("s")] == ["a", "b"]


# -- claims across processes -------------------------------------------------------------------


def test_another_process_cannot_claim_while_the_holder_lives(
    path: Path, store: SQLiteStore, children: list[Child]
) -> None:
    """While a live process holds a claim, a claim from this process raises ConflictError."""
    child = Child(CLAIMER, str(path), "s", "release")
    children.append(child)
    child.expect("claimed")
    with pytest.raises(ConflictError, match=f"live writer in process {child.proc.pid}"):
        store.claim("s")


def test_another_process_can_claim_after_the_holder_exits(
    path: Path, store: SQLiteStore, children: list[Child]
) -> None:
    """After the holding process released and exited, the session can be claimed here."""
    child = Child(CLAIMER, str(path), "s", "release")
    children.append(child)
    child.expect("claimed")
    assert child.finish() == 0
    store.claim("s")


def test_a_stale_claim_of_a_killed_process_is_taken_over(
    path: Path, store: SQLiteStore, children: list[Child]
) -> None:
    """A claim left by a SIGKILLed process (its row still there) is taken over."""
    child = Child(CLAIMER, str(path), "s", "release")
    children.append(child)
    child.expect("claimed")
    child.kill()
    with raw(path) as conn:
        holders = conn.execute("SELECT pid FROM writers WHERE session_id = 's'").fetchall()
    assert holders == [(child.proc.pid,)]
    store.claim("s")
    with pytest.raises(ConflictError, match="this process"):
        store.claim("s")


def _wait_exited_unreaped(pid: int) -> None:
    """Wait (bounded) until child `pid` has exited, leaving it unreaped: a zombie."""
    waiter = threading.Thread(
        target=os.waitid, args=(os.P_PID, pid, os.WEXITED | os.WNOWAIT), daemon=True
    )
    waiter.start()
    waiter.join(BOUND)
    assert not waiter.is_alive(), f"child {pid} did not exit within {BOUND} s"


@pytest.mark.skipif(
    not hasattr(os, "waitid") or not Path("/proc/self/stat").exists(),
    reason="needs waitid(WNOWAIT) and /proc",
)
def test_a_claim_of_a_killed_but_unreaped_process_is_taken_over(
    path: Path, store: SQLiteStore, children: list[Child]
) -> None:
    """A writer SIGKILLed and not yet reaped by its parent (a zombie) does not block a claim."""
    child = Child(CLAIMER, str(path), "s", "release")
    children.append(child)
    child.expect("claimed")
    os.kill(child.proc.pid, signal.SIGKILL)
    _wait_exited_unreaped(child.proc.pid)
    state = Path(f"/proc/{child.proc.pid}/stat").read_bytes().rpartition(b")")[2].split()[0]
    assert state == b"Z", "the child should be a zombie now"
    store.claim("s")  # the zombie's row is stale
    assert child.proc.returncode is None
    assert child.proc.wait(timeout=BOUND) == -signal.SIGKILL  # reap it only now


def test_import_into_a_session_claimed_by_another_live_process_is_refused(
    path: Path, store: SQLiteStore, children: list[Child]
) -> None:
    """import_session takes the claim: a session held in another process is not written."""
    child = Child(CLAIMER, str(path), "chat", "release")
    children.append(child)
    child.expect("claimed")
    text = '{"seq":0,"type":"turn_start","time":"2026-01-01T00:00:00.000000+00:00","data":{}}\n'
    with pytest.raises(ConflictError, match=f"stop that session first.*process {child.proc.pid}"):
        import_session(store, "chat", text)
    assert store.load("chat") == []
    assert child.finish() == 0
    assert import_session(store, "chat", text) == 1


def test_sigkill_during_appends_loses_no_acknowledged_event(
    path: Path, children: list[Child]
) -> None:
    """A writer killed mid-stream leaves a healthy file holding every acknowledged event,
    and a gapless prefix (an unacknowledged append is wholly there or absent)."""
    child = Child(APPENDER, str(path))
    children.append(child)
    child.expect("started")
    acked = [int(child.expect("acked").split()[1]) for _ in range(60)]
    child.kill()
    acked += [int(line.split()[1]) for line in child.rest() if line.startswith("acked")]
    with SQLiteStore(path) as store:
        assert store.integrity_check() == "ok"
        seqs = [e.seq for e in store.load("crash")]
        assert seqs == list(range(len(seqs))), "the stored events have a hole"
        assert max(acked) < len(seqs), "an acknowledged event is missing"
        recovered = Session.start("crash", store=store, timeout=BOUND)
        assert recovered.count().get() == len(seqs)
        assert recovered.append("user_message", {"content": "after"}).get().seq == len(seqs)
        recovered.stop()


# -- files that are not (usable) stores -----------------------------------------------------------

OPEN_UNPRIVILEGED = """
import json, os, sys
from nous_actor.store import SQLiteStore
if os.geteuid() == 0:  # root writes read-only files anyway: drop to nobody
    os.setgid(65534)
    os.setuid(65534)
try:
    SQLiteStore(sys.argv[1]).load("s")
except BaseException as exc:
    print(json.dumps([type(exc).__module__ + "." + type(exc).__name__, str(exc)]))
else:
    print(json.dumps(["opened", ""]))
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged user can enter (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="nous-ro-"))
    folder.chmod(0o755)
    yield folder
    folder.chmod(0o755)
    shutil.rmtree(folder, ignore_errors=True)


def test_a_read_only_file_raises_store_error_with_a_hint(shared_dir: Path) -> None:
    """Opening a store the process may not write raises StoreError saying to fix permissions."""
    db = shared_dir / "events.sqlite"
    with SQLiteStore(db) as store:
        store.write({"s": [ev(0)]})
    db.chmod(0o444)
    shared_dir.chmod(0o555)
    run = subprocess.run(
        [sys.executable, "-c", OPEN_UNPRIVILEGED, str(db)],
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=True,
    )
    kind, message = json.loads(run.stdout)
    assert kind == "nous_actor.errors.StoreError"
    assert "read-only" in message
    assert "fix permissions" in message


def test_a_file_that_is_not_a_database_raises_store_error(path: Path) -> None:
    """A file of other bytes is refused with StoreError naming it, not sqlite3.DatabaseError."""
    path.write_bytes(b"this is a text file, not SQLite\n" * 200)
    with pytest.raises(StoreError, match=r"is not a SQLite database.*left unchanged") as info:
        SQLiteStore(path)
    assert str(path) in str(info.value)
    assert path.read_bytes().startswith(b"this is a text file")


def test_an_unknown_schema_version_raises_store_error(path: Path) -> None:
    """A store written by a newer nous_actor (user_version 99) is refused with an upgrade hint."""
    with raw(path) as conn:
        conn.execute("PRAGMA user_version = 99")
    with pytest.raises(StoreError, match=r"schema version 99.*upgrade nous_actor"):
        SQLiteStore(path)


def test_another_applications_database_is_refused_and_left_unchanged(path: Path) -> None:
    """A SQLite file holding another application's tables is refused and not modified."""
    with raw(path) as conn:
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, payload TEXT)")
        conn.execute("INSERT INTO events (payload) VALUES ('theirs')")
    with pytest.raises(StoreError, match="not a nous_actor store"):
        SQLiteStore(path).close()
    with raw(path) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert tables == [("events",)]
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0


def test_an_empty_sqlite_file_is_accepted_as_a_new_store(path: Path) -> None:
    """A SQLite file with no tables yet (e.g. just created) becomes a store."""
    sqlite3.connect(path).close()
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        assert store.load("s") == [ev(0)]


@pytest.mark.parametrize(
    ("column", "value"),
    [("data", "{not json"), ("type", "no_such_type"), ("time", "yesterday")],
)
def test_a_malformed_stored_row_raises_store_error_on_load(
    store: SQLiteStore, path: Path, column: str, value: str
) -> None:
    """A row damaged outside the store makes load raise StoreError naming the session."""
    store.write({"s": [ev(0)]})
    with raw(path) as conn:
        conn.execute(f"UPDATE events SET {column} = ? WHERE session_id = 's'", (value,))
    with pytest.raises(StoreError, match="stored event is malformed") as info:
        store.load("s")
    assert info.value.session_id == "s"


def test_a_write_lock_held_too_long_raises_store_error_with_a_hint(path: Path) -> None:
    """When another connection holds the write lock past timeout=, write raises StoreError."""
    with SQLiteStore(path, timeout=0.05) as store:
        with raw(path) as holder:
            holder.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreError, match="another process holds the write lock"):
                store.write({"s": [ev(0)]})
        assert store.write({"s": [ev(0)]}) == {}


# -- integrity and life ---------------------------------------------------------------------


def test_integrity_check_is_ok_on_a_healthy_store(store: SQLiteStore) -> None:
    """integrity_check() returns "ok" for a store in use."""
    store.write({"s": [ev(i) for i in range(50)]})
    store.drop("s", list(range(0, 50, 2)))
    assert store.integrity_check() == "ok"


def test_integrity_check_on_a_closed_store_raises_store_error(store: SQLiteStore) -> None:
    """integrity_check() after close() raises StoreError saying to open a new store."""
    store.close()
    with pytest.raises(StoreError, match="closed; open a new one"):
        store.integrity_check()


def test_leaving_the_with_block_closes_the_store(path: Path) -> None:
    """SQLiteStore is a context manager that closes itself on exit."""
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
    with pytest.raises(StoreError):
        store.load("s")


def test_an_in_memory_store_is_not_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLiteStore(":memory:") creates no file and keeps its events in the process."""
    monkeypatch.chdir(tmp_path)
    with SQLiteStore(":memory:") as store:
        store.write({"s": [ev(0)]})
        assert store.load("s") == [ev(0)]
        assert store.path == ":memory:"
    assert list(tmp_path.iterdir()) == []


# -- schema objects we did not make; the schema version in every write (issue 30, item 6) ----

EXTRA_OBJECTS = {
    "trigger": "CREATE TRIGGER rewrite AFTER INSERT ON event_rows BEGIN "
    "UPDATE event_rows SET data = '{}' WHERE session = new.session AND seq = new.seq; END",
    "view": "CREATE VIEW recent AS SELECT * FROM events",
    "index": "CREATE INDEX by_type ON event_rows (type)",
    "table": "CREATE TABLE notes (body TEXT)",
    "events-trigger-on-writers": "CREATE TRIGGER gone AFTER DELETE ON writers BEGIN "
    "DELETE FROM events; END",
}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "made-before-application-id"])
@pytest.mark.parametrize("extra", EXTRA_OBJECTS.values(), ids=EXTRA_OBJECTS.keys())
def test_a_store_file_with_a_schema_object_we_did_not_make_is_refused_unchanged(
    tmp_path: Path, extra: str, marked: bool
) -> None:
    """A file of ours that carries a trigger, view, index or table we never make is
    another application's now: refused as a foreign file, left byte for byte."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(extra)
        if not marked:
            conn.execute("PRAGMA application_id = 0")
        conn.execute("PRAGMA journal_mode = DELETE")  # nothing beside it: all in the file
    before = _files(tmp_path)
    for create in (True, False):
        with pytest.raises(StoreError, match=r"another application's.*left unchanged"):
            SQLiteStore(path, create=create)
    assert _files(tmp_path) == before


def test_the_tables_a_store_makes_later_and_analyze_statistics_are_ours(path: Path) -> None:
    """The hand-off table (made on the first request) and ANALYZE's statistics tables
    are not foreign: the file opens again."""
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        store.ask_handoff("s", 1.0)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("ANALYZE")
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert {"handoffs", "sqlite_stat1"} <= names
    with SQLiteStore(path, create=False) as store:
        assert store.load("s") == [ev(0)]


def test_a_write_after_another_process_bumps_the_schema_version_is_refused(path: Path) -> None:
    """A process never writes a file whose schema version it does not know: once another
    connection changes ``user_version``, the next write raises StoreError saying so,
    stores nothing, and so does every later one."""
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("PRAGMA user_version = 4")
        with pytest.raises(StoreError, match=r"schema version 4.*upgrade nous_actor"):
            store.write({"s": [ev(1)], "t": [ev(0)]})
        with pytest.raises(StoreError, match="schema version 4"):
            store.claim("u")
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            rows = other.execute("SELECT session_id, seq FROM events ORDER BY 1, 2").fetchall()
            assert rows == [("s", 0)]
            assert other.execute("SELECT count(*) FROM writers").fetchone()[0] == 0


def test_a_write_after_another_process_adds_a_trigger_is_refused(path: Path) -> None:
    """A schema object we did not make, added while the store is open, is seen by the
    next write transaction (the schema changed): refused, nothing written."""
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute(EXTRA_OBJECTS["trigger"])
        with pytest.raises(StoreError, match="another application's"):
            store.write({"s": [ev(1)]})
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            assert other.execute("SELECT seq FROM events").fetchall() == [(0,)]


def test_the_schema_version_check_reads_no_schema_while_the_schema_is_unchanged(
    path: Path,
) -> None:
    """Counting work: a write transaction reads the schema table again only when the
    schema changed since the last look (one cookie read otherwise)."""
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        seen: list[str] = []
        writer = store._connection.writer()
        writer.set_trace_callback(seen.append)
        try:
            for i in range(1, 20):
                store.write({"s": [ev(i)]})
        finally:
            writer.set_trace_callback(None)
        assert not [s for s in seen if "sqlite_master" in s]
        # Each write one statement, which looks at the version and the cookie itself.
        # (SQLite traces what a pragma function runs as a comment: not a statement.)
        statements = [s for s in seen if s[:2] != "--"]
        assert len(statements) == 19
        assert all("WHERE (SELECT user_version = 3" in s for s in statements)


def test_a_write_after_another_process_made_a_table_of_ours_goes_on(path: Path) -> None:
    """The schema cookie moves when another process makes a table the store makes on
    first use (the forwarded calls' records): the next write of a known session (one
    statement that holds the cookie it expects) writes nothing and goes through a
    transaction, which looks at the schema, finds it ours and writes; the write after
    is one statement again."""
    with SQLiteStore(path) as store, SQLiteStore(path) as other:
        assert store.write({"s": [ev(0)]}) == {}
        assert other.write({"t": [ev(0)]}, calls={"t": [("call-1", 0, 0)]}) == {}
        seen: list[str] = []
        writer = store._connection.writer()
        writer.set_trace_callback(seen.append)
        try:
            assert store.write({"s": [ev(1)]}) == {}
            first = [s for s in seen if s[:2] != "--"]
            seen.clear()
            assert store.write({"s": [ev(2)]}) == {}
            second = [s for s in seen if s[:2] != "--"]
        finally:
            writer.set_trace_callback(None)
        assert "BEGIN IMMEDIATE" in first
        assert "COMMIT" in first
        assert len(second) == 1
        assert second[0].startswith("INSERT INTO event_rows")
        assert store.load("s") == [ev(0), ev(1), ev(2)]
        assert other.applied_call("t", "call-1") == (0, 0)


def test_a_conflict_met_by_a_write_of_known_sessions_refuses_that_session_alone(
    path: Path,
) -> None:
    """Two store objects on one file, each session already numbered: a write whose one
    statement meets a seq the other stored writes nothing of itself; its transaction
    then refuses the conflicting session alone and stores the other."""
    with SQLiteStore(path) as first, SQLiteStore(path) as second:
        assert first.write({"s": [ev(0)], "t": [ev(0)]}) == {}
        assert second.write({"s": [ev(1, "second")]}) == {}
        refused = first.write({"s": [ev(1, "first")], "t": [ev(1)]})
        assert set(refused) == {"s"}
        assert isinstance(refused["s"], ConflictError)
        assert first.load("s") == [ev(0), ev(1, "second")]
        assert first.load("t") == [ev(0), ev(1)]


# -- snapshots give the file's space back (issue 30, item 9) ------------------------------------


def _fill(store: SQLiteStore, sessions: int, events: int, size: int = 600) -> None:
    """``sessions`` sessions of ``events`` events each, written interleaved (as group
    commits do), whose last event replaces all but the last fifth: a snapshot drops 80%."""
    logs = {}
    for s in range(sessions):
        log = Log()
        for i in range(events - 1):
            log = log.append("user_message", {"content": f"{s}:{i}:" + "x" * size}, T0)
        logs[f"s{s:03d}"] = log.append(
            "system_message",
            {"content": "summary", "surface_op": Replace(0, events * 4 // 5 - 1)},
            T0,
        )
    for lo in range(0, events, 25):
        store.write({sid: log.events()[lo : lo + 25] for sid, log in logs.items()})


def _packed_size(path: Path, tmp_path: Path) -> int:
    copy = tmp_path / "packed.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("VACUUM INTO ?", (str(copy),))
    return copy.stat().st_size


def test_snapshots_that_drop_most_events_leave_the_file_near_a_packed_copy(
    path: Path, tmp_path: Path
) -> None:
    """After snapshots that drop 80% of a file's events (each session its own, through
    the public path), the file is at most 1.2x a VACUUMed copy of it, and every kept
    event is there."""
    with SQLiteStore(path, durability="normal") as store:
        _fill(store, sessions=20, events=100)
        for sid in store.sessions():
            chat = Session.start(sid, store=store, timeout=BOUND)
            try:
                assert chat.snapshot().get(timeout=BOUND) == 80
            finally:
                chat.stop()
        kept = {sid: len(store.load(sid)) for sid in store.sessions()}
    assert kept == {f"s{s:03d}": 20 for s in range(20)}
    size = path.stat().st_size
    assert size <= 1.2 * _packed_size(path, tmp_path), size


def test_snapshots_vacuum_a_bounded_number_of_times(path: Path) -> None:
    """Counting work: 40 snapshots of one file vacuum it a few times, not 40 (a vacuum
    waits until the bytes dropped since the last reach a tenth of the file)."""
    with SQLiteStore(path, durability="normal") as store:
        _fill(store, sessions=40, events=50)
        with capture_logs() as logs:
            for sid in store.sessions():
                store.drop(sid, range(40))
        vacuums = [e for e in logs if e["event"] == "store.vacuumed"]
        assert 1 <= len(vacuums) <= 10, len(vacuums)


def test_a_file_over_the_bound_is_not_vacuumed_by_itself_and_says_so(
    path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past the size a snapshot vacuums by itself, the drop only logs (once) that
    ``vacuum()`` gives the space back; ``vacuum()`` then does."""
    monkeypatch.setattr(sqlite_vacuum, "_AUTO_MAX_BYTES", 64 * 1024)
    with SQLiteStore(path, durability="normal") as store:
        _fill(store, sessions=10, events=100)
        with capture_logs() as logs:
            for sid in store.sessions():
                store.drop(sid, range(80))
        events = [e["event"] for e in logs]
        assert "store.vacuumed" not in events
        assert events.count("store.vacuum_deferred") == 1
        before = sqlite_vacuum.file_bytes(store._connection.conn)
        after = store.vacuum()
        assert path.stat().st_size == after < before / 2
        assert all(len(store.load(sid)) == 20 for sid in store.sessions())
    assert path.stat().st_size <= 1.2 * _packed_size(path, tmp_path)


def test_a_process_killed_while_vacuuming_leaves_every_event(
    path: Path, children: list[Child]
) -> None:
    """SIGKILL during a vacuum (a real kill, in a child that vacuums in a loop): the
    store opens again, healthy, with every event it held."""
    with SQLiteStore(path) as store:
        _fill(store, sessions=10, events=100, size=2000)
        for sid in store.sessions():
            store.drop(sid, range(0, 80, 2))
        want = {sid: store.load(sid) for sid in store.sessions()}
    child = Child(
        "import sys\n"
        "from nous_actor.store import SQLiteStore\n"
        "store = SQLiteStore(sys.argv[1])\n"
        "while True:\n"
        "    print('vacuum', flush=True)\n"
        "    store.vacuum()\n",
        str(path),
    )
    children.append(child)
    for _ in range(3):
        child.expect("vacuum")  # the loop is almost all vacuum: the kill lands in one
    child.kill()
    with SQLiteStore(path, create=False) as store:
        assert store.integrity_check() == "ok"
        assert {sid: store.load(sid) for sid in store.sessions()} == want


def test_the_demos_mark_in_its_store_is_ours(path: Path) -> None:
    """The table ``nous-actor demo`` marks its store with is one the library makes: the
    file opens again and takes writes after it was marked (also while open)."""
    from nous_actor.cli.agents_demo import _mark_as_demo

    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        _mark_as_demo(path, 1, 1, 1)
        store.write({"s": [ev(1)]})
    with SQLiteStore(path, create=False) as store:
        assert [e.seq for e in store.load("s")] == [0, 1]


@pytest.mark.parametrize("rollbacks", [1, 2])
def test_claims_whose_transaction_sqlite_rolled_back_are_made_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rollbacks: int
) -> None:
    """A batch of claims whose transaction SQLite rolled back by itself (its ``COMMIT``
    finds no transaction; nothing of it was written) is made once more, and logged; a
    second such rollback fails the batch with `StoreError`, holding nothing. Its own
    hand-off requests are withdrawn only by the claim that committed."""
    from nous_actor.store.sqlite.connection import _Connection

    store = SQLiteStore(tmp_path / "rolled.db")
    store.ask_handoff("b", 60)  # this process asks for "b": a claim of it withdraws that
    assert "b" in store._asked
    left = [rollbacks]
    check_file = _Connection.check_file

    def roll_back_first(self: _Connection) -> None:  # just before the COMMIT
        if left[0]:
            left[0] -= 1
            self.conn.execute("ROLLBACK")
        check_file(self)

    monkeypatch.setattr(_Connection, "check_file", roll_back_first)
    try:
        with capture_logs() as logs:
            if rollbacks == 1:
                tokens = store.claim_many(["a", "b"])
            else:
                with pytest.raises(StoreError, match="no transaction is active"):
                    store.claim_many(["a", "b"])
        rolled = [e for e in logs if e["event"] == "store.transaction_rolled_back"]
        assert [(e["doing"], e["sessions"]) for e in rolled] == [("claim the sessions", 2)]
        monkeypatch.undo()
        if rollbacks == 1:
            assert all(isinstance(t, str) for t in tokens)
            assert store.held_by("a") == "this process"
            assert "b" not in store._asked
            with pytest.raises(ConflictError):
                store.claim("a")
        else:  # nothing was claimed: both are free, and "b" is still asked for
            assert store.held_by("a") is None
            assert "b" in store._asked
            assert isinstance(store.claim("a"), str)
    finally:
        store.close()
