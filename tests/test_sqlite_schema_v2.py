"""SQLiteStore schema version 2: the address a claim's holder advertised, the store's
forwarding key, and the migration of a version-1 store (now to version 3, through
version 2's statements: tests/test_sqlite_schema_v3.py has version 3's own).

A version-1 store is made here with the DDL of the releases before version 2
(`V1_SCHEMA`, copied: it is their layout, kept as it was) and filled with events,
claims and hand-off requests as they wrote them. Child processes are plain
``python -c`` scripts; every wait on them is bounded.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND, INTERPRETER_BOUND, SLOW_BOUND
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_actor import Event
from nous_actor.core.codec import encode_data, format_time
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store import SQLiteStore
from nous_actor.store.sqlite import APPLICATION_ID, SCHEMA_VERSION
from nous_actor.viewer import read_only_sqlite

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
ROOT = Path(__file__).resolve().parent.parent

V1_SCHEMA = (
    # The tables of schema version 1, exactly as its releases made them (their _SCHEMA).
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
    since TEXT NOT NULL
)""",
)
V1_HANDOFFS = """CREATE TABLE IF NOT EXISTS handoffs (
    session_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    until TEXT NOT NULL,
    PRIMARY KEY (session_id, pid)
)"""
"""The hand-off requests' table, as version 1 made it on the first request."""

V1_RELEASE = "40de067"
"""A commit of the last release that wrote schema version 1 (for the real old process)."""


def ev(seq: int, content: str = "x") -> Event:
    return Event(seq, "user_message", T0, {"content": content})


def later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


@contextlib.contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection to the file (autocommit), bypassing the store."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


Claim = tuple[str, int, str]  # session id, pid, token
Request = tuple[str, int, str]  # session id, asker's pid, until


def make_v1_store(
    path: Path,
    sessions: dict[str, list[Event]],
    claims: Sequence[Claim] = (),
    requests: Sequence[Request] = (),
) -> None:
    """A store as a version-1 release left it: its tables, marks and WAL journal, and
    rows as it wrote them (events through the codec, claims, hand-off requests)."""
    with raw(path) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        for statement in V1_SCHEMA:
            conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("PRAGMA user_version = 1")
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
            "INSERT INTO writers (session_id, pid, token, since) VALUES (?, ?, ?, ?)",
            [(sid, pid, token, T0.isoformat()) for sid, pid, token in claims],
        )
        if requests:
            conn.execute(V1_HANDOFFS)
            conn.executemany(
                "INSERT INTO handoffs (session_id, pid, until) VALUES (?, ?, ?)", requests
            )


def dump(path: Path) -> dict[str, Any]:
    """Everything the file holds, read with a plain connection."""
    with raw(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        out: dict[str, Any] = {
            "version": conn.execute("PRAGMA user_version").fetchone()[0],
            "app": conn.execute("PRAGMA application_id").fetchone()[0],
            "objects": set(conn.execute("SELECT type, name, sql FROM sqlite_master")),
        }
        for table in sorted(tables):
            out[table] = sorted(conn.execute(f"SELECT * FROM {table}"), key=repr)
    return out


def migrated(before: dict[str, Any]) -> dict[str, Any]:
    """What a version-1 file's dump becomes once migrated to version 3 (objects aside):
    the claims without an address, the sessions numbered in the order of their ids, each
    event row under its session's number."""
    after = dict(before, version=SCHEMA_VERSION, keys=[])
    after["writers"] = [(*row, None) for row in before["writers"]]
    numbers = {sid: n for n, sid in enumerate(sorted({r[0] for r in before["events"]}), 1)}
    after["sessions"] = sorted(((n, sid) for sid, n in numbers.items()), key=repr)
    after["event_rows"] = sorted(((numbers[r[0]], *r[1:]) for r in before["events"]), key=repr)
    del after["objects"], after["events"]
    return after


def columns(path: Path, table: str) -> list[str]:
    with raw(path) as conn:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- child processes ------------------------------------------------------------------------


class Child:
    """A ``python -c`` child whose stdout lines are read with a bound."""

    def __init__(
        self, script: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
        )
        self.pid = self.proc.pid
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
        """The next line, which must start with ``prefix`` (waits at most INTERPRETER_BOUND:
        the first line comes after the child has imported the package)."""
        try:
            line = self.lines.get(timeout=INTERPRETER_BOUND)
        except queue.Empty:
            raise AssertionError(f"child said nothing within {INTERPRETER_BOUND} s") from None
        if line is None:
            raise AssertionError(f"child ended, expected {prefix!r}; stderr: {self.stderr()}")
        if not line.startswith(prefix):
            raise AssertionError(f"child said {line!r}, expected {prefix!r}")
        return line

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def ask(self, line: str, prefix: str = "ok") -> str:
        self.send(line)
        return self.expect(prefix)

    def kill(self) -> None:
        """SIGKILL the child and reap it (a zombie's pid still looks alive)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=SLOW_BOUND)

    def stderr(self) -> str:
        try:
            self.proc.wait(timeout=SLOW_BOUND)
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
    made: list[Child] = []
    yield made
    for child in made:
        child.close()


@pytest.fixture(scope="module")
def live_pid() -> Iterator[int]:
    """The pid of another process that runs for the whole module (it waits on stdin)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    yield proc.pid
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=SLOW_BOUND)


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=INTERPRETER_BOUND)
    return proc.pid


HOLDER = """
import sys
from nous_actor.store import SQLiteStore
store = SQLiteStore(sys.argv[1])
tokens = {}
print("ready", flush=True)
for line in sys.stdin:
    verb, _, arg = line.rstrip("\\n").partition(" ")
    if verb == "claim":
        tokens[arg] = store.claim(arg)
    elif verb == "release":
        store.release(arg, tokens.pop(arg))
    elif verb == "advertise":
        store.advertise(arg or None)
    elif verb == "key":
        print("key", store.forwarding_key().hex(), flush=True)
        continue
    print("ok", flush=True)
"""


# -- a new store ------------------------------------------------------------------------------


def test_a_new_store_is_made_with_version_2s_columns(tmp_path: Path) -> None:
    """A new store is made at the current version directly, with what version 2 added:
    the address column, the keys table."""
    path = tmp_path / "new.db"
    SQLiteStore(path).close()
    assert SCHEMA_VERSION == 3
    assert dump(path)["version"] == 3
    assert columns(path, "writers") == ["session_id", "pid", "token", "since", "address"]
    assert columns(path, "keys") == ["name", "value"]
    assert dump(path)["keys"] == []  # the key is made by the first process that asks


# -- the migration of a version-1 store --------------------------------------------------------

session_ids = st.sampled_from(["a", "b", "chat-1", "dup:2", "é"])
claim_kinds = st.sampled_from(["none", "live", "dead", "stale-own"])


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sessions=st.dictionaries(
        session_ids, st.lists(st.text(max_size=30), min_size=1, max_size=4), max_size=4
    ),
    claimed=st.dictionaries(session_ids, claim_kinds, max_size=5),
    asked=st.dictionaries(session_ids, st.sampled_from(["live", "dead", "expired"]), max_size=3),
)
def test_a_v1_store_is_migrated_and_reads_back_the_same(
    live_pid: int,
    dead_pid: int,
    sessions: dict[str, list[str]],
    claimed: dict[str, str],
    asked: dict[str, str],
) -> None:
    """A store of version 1 holding events, claims (a live claim of another process, a
    dead one, a stale one of this process) and hand-off requests is migrated when opened:
    every row reads back the same, its claims have no address, and its requests stand."""
    pids = {"live": live_pid, "dead": dead_pid, "stale-own": os.getpid()}
    events = {sid: [ev(i, c) for i, c in enumerate(texts)] for sid, texts in sessions.items()}
    claims = [(sid, pids[k], uuid.uuid4().hex) for sid, k in claimed.items() if k != "none"]
    requests = [
        (sid, dead_pid if how == "dead" else live_pid, later(-60 if how == "expired" else 600))
        for sid, how in asked.items()
    ]
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        path = folder / "v1.db"
        make_v1_store(path, events, claims, requests)
        before = dump(path)
        store = stack.enter_context(SQLiteStore(path, create=False))
        after = dump(path)
        assert {k: v for k, v in after.items() if k != "objects"} == migrated(before)
        assert store.integrity_check() == "ok"
        assert store.sessions() == sorted(events)
        for sid, evs in events.items():
            assert store.load(sid) == evs
        mine = set()
        for sid in sessions.keys() | claimed.keys() | asked.keys():
            if claimed.get(sid) == "live":
                assert store.held_by(sid) == f"process {live_pid}"
                assert store.holder_address(sid) == (f"process {live_pid}", None)
                with pytest.raises(ConflictError):
                    store.claim(sid)
            else:  # no claim, or one whose holder has ended: none is live
                assert store.held_by(sid) is None
                assert store.holder_address(sid) is None
                store.claim(sid)
                mine.add(sid)
        # A request of a live asker, still standing, for a session this process now holds.
        live_asks = {sid for sid, how in asked.items() if how == "live"}
        assert store.handoff_requests() == sorted(live_asks & mine)


def test_a_v1_store_without_application_id_is_migrated(tmp_path: Path) -> None:
    """A version-1 store of a release before the application id is ours and migrated too."""
    path = tmp_path / "old.db"
    make_v1_store(path, {"s": [ev(0)]})
    with raw(path) as conn:
        conn.execute("PRAGMA application_id = 0")
    with SQLiteStore(path) as store:
        assert store.load("s") == [ev(0)]
        store.claim("s")
    assert (dump(path)["version"], dump(path)["app"]) == (3, APPLICATION_ID)


def test_a_migrated_store_reopens_as_it_is(tmp_path: Path) -> None:
    """Opening a migrated store writes nothing: it is a whole store of version 3, and its
    layout (the writers table's SQL as ALTER TABLE left it) is ours."""
    path = tmp_path / "v1.db"
    make_v1_store(path, {"s": [ev(0)]})
    SQLiteStore(path).close()
    before = dump(path)
    with SQLiteStore(path) as store:
        store.claim("s")
        store.advertise("there")
        assert store.holder_address("s") == ("this process", "there")
        assert dump(path)["objects"] == before["objects"]


MIGRATOR = """
import sys
from nous_actor.store.sqlite.connection import _Connection
from nous_actor.store import SQLiteStore

path, stop_at = sys.argv[1], sys.argv[2]
connect = _Connection.connect
begun = False

def trace(sql):
    global begun
    if sql.startswith("BEGIN IMMEDIATE"):
        begun = True
    elif begun and sql.startswith(stop_at):
        print("stopped", flush=True)
        sys.stdin.readline()  # killed here by the parent

def traced(self, target, timeout, uri):
    conn = connect(self, target, timeout, uri)
    conn.set_trace_callback(trace)
    return conn

_Connection.connect = traced
SQLiteStore(path).close()
print("opened", flush=True)
"""

KILL_POINTS = {
    # Each statement of the migration's transaction, killed before it runs; the last,
    # the first statement after its COMMIT.
    "before-alter": ("ALTER TABLE writers ADD COLUMN address", 1),
    "after-alter": ("CREATE TABLE IF NOT EXISTS keys", 1),
    "after-keys": ("CREATE TABLE IF NOT EXISTS sessions", 1),
    "before-copy": ("INSERT INTO event_rows", 1),
    "before-drop": ("DROP TABLE events", 1),
    "before-marks": ("PRAGMA application_id = ", 1),
    "before-version": ("PRAGMA user_version = 3", 1),
    "before-commit": ("COMMIT", 1),
    "after-commit": ("PRAGMA journal_mode", 2),
}


@pytest.mark.parametrize("point", KILL_POINTS, ids=KILL_POINTS.keys())
def test_sigkill_mid_migration_leaves_a_whole_v1_or_v3_store(
    tmp_path: Path, children: list[Child], live_pid: int, point: str
) -> None:
    """A process SIGKILLed inside the migration's transaction leaves the file wholly at
    version 1 (killed after COMMIT: wholly at version 3), and it opens again, migrated,
    with every row as it was."""
    stop_at, expected = KILL_POINTS[point]
    path = tmp_path / "v1.db"
    make_v1_store(
        path,
        {"s": [ev(0), ev(1, "y")], "t": [ev(0)]},
        [("s", live_pid, "tok")],
        [("t", live_pid, later(600))],
    )
    before = dump(path)
    child = Child(MIGRATOR, str(path), stop_at)
    children.append(child)
    child.expect("stopped")
    child.kill()
    left = dump(path)
    if expected == 1:
        assert left == before
    else:
        assert {k: v for k, v in left.items() if k != "objects"} == migrated(before)
    with raw(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with SQLiteStore(path) as store:
        assert store.load("s") == [ev(0), ev(1, "y")]
        assert store.holder_address("s") == (f"process {live_pid}", None)
    assert {k: v for k, v in dump(path).items() if k != "objects"} == migrated(before)


# -- a newer version ---------------------------------------------------------------------------


@pytest.mark.parametrize("with_table", [False, True], ids=["same-tables", "a-new-table"])
@pytest.mark.parametrize("how", ["create", "existing", "read-only"])
def test_a_version_4_store_is_refused_unchanged(
    tmp_path: Path, with_table: bool, how: str
) -> None:
    """A store of ours at version 4 (a newer release's, with a table of its own or not) is
    refused with an upgrade hint, and left byte for byte as it was (opened read-only: the
    database file byte for byte)."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "v4.db"
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        store.claim("s")
    with raw(path) as conn:
        if with_table:
            conn.execute("CREATE TABLE later_things (body TEXT)")
        conn.execute("PRAGMA user_version = 4")
    before = files(folder)

    def open_it() -> None:
        if how == "read-only":
            read_only_sqlite(path).close()
        else:
            SQLiteStore(path, create=how == "create").close()

    with pytest.raises(StoreError, match=r"schema version 4.*upgrade nous_actor"):
        open_it()
    after = files(folder)
    if how == "read-only":  # a read-only connection leaves SQLite's empty WAL and its index
        assert after.pop("v4.db-wal", b"") == b""
        after.pop("v4.db-shm", None)
    assert after == before


# -- the forwarding key ------------------------------------------------------------------------


KEY_ASKER = """
import sys
from nous_actor.store import SQLiteStore
store = SQLiteStore(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
print("key", store.forwarding_key().hex(), flush=True)
"""


@pytest.mark.parametrize("round_no", range(3))
def test_two_processes_asking_for_the_forwarding_key_at_once_get_the_same_bytes(
    tmp_path: Path, children: list[Child], round_no: int
) -> None:
    """Two processes (and this one) that ask a new store for its key at once all get the
    same 32 bytes: the first makes it, the others read it."""
    path = tmp_path / f"keys-{round_no}.db"
    with SQLiteStore(path) as store:
        askers = [Child(KEY_ASKER, str(path)) for _ in range(2)]
        children.extend(askers)
        for child in askers:
            child.expect("ready")
        for child in askers:
            child.send("go")
        mine = store.forwarding_key()
        theirs = [bytes.fromhex(child.expect("key ").split()[1]) for child in askers]
    assert len(mine) == 32
    assert theirs == [mine, mine]
    assert dump(path)["keys"] == [("forwarding", mine)]


def test_the_forwarding_key_is_kept_in_the_store(tmp_path: Path) -> None:
    """The key is made once and kept: the same bytes after a reopen and from a read-only
    opening, other bytes in another store, and one in a store in memory."""
    with SQLiteStore(tmp_path / "a.db") as store:
        key = store.forwarding_key()
        assert store.forwarding_key() == key
    with SQLiteStore(tmp_path / "a.db") as store:
        assert store.forwarding_key() == key
    viewer = read_only_sqlite(tmp_path / "a.db")
    try:
        assert viewer.inner.forwarding_key() == key  # type: ignore[attr-defined]
    finally:
        viewer.close()
    with SQLiteStore(tmp_path / "b.db") as other:
        assert other.forwarding_key() != key
    with SQLiteStore(":memory:") as memory:
        assert len(memory.forwarding_key()) == 32


def test_the_forwarding_key_is_read_from_the_file_once(tmp_path: Path) -> None:
    """A process asks for the key whenever it locates a session held elsewhere: the
    store reads it once, and after that never waits for its connection (which a commit
    holds) to answer."""
    with SQLiteStore(tmp_path / "a.db") as store:
        key = store.forwarding_key()
        with store._connection.locked(None, "a commit under way"):
            got: list[bytes] = []
            asker = threading.Thread(target=lambda: got.append(store.forwarding_key()))
            asker.start()
            asker.join(BOUND)
            assert got == [key]


def test_a_malformed_forwarding_key_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """A stored key that is not 32 bytes raises StoreError saying how to make a new one."""
    path = tmp_path / "a.db"
    SQLiteStore(path).close()
    with raw(path) as conn:
        conn.execute("INSERT INTO keys (name, value) VALUES ('forwarding', x'0102')")
    with SQLiteStore(path) as store, pytest.raises(StoreError, match=r"2 bytes.*DELETE FROM keys"):
        store.forwarding_key()


# -- advertise and holder_address ----------------------------------------------------------------


def test_advertise_then_holder_address_from_another_process(
    tmp_path: Path, children: list[Child]
) -> None:
    """Another process's claims carry the address it advertised (the claims it held then,
    and those it takes after); once it is killed, its claims give no address."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        child = Child(HOLDER, str(path))
        children.append(child)
        child.expect("ready")
        holder = f"process {child.pid}"
        child.ask("claim s")
        assert store.holder_address("s") == (holder, None)
        child.ask("advertise unix:/run/one.sock")
        assert store.holder_address("s") == (holder, "unix:/run/one.sock")
        child.ask("claim t")
        assert store.holder_address("t") == (holder, "unix:/run/one.sock")
        child.ask("release t")
        assert store.holder_address("t") is None
        child.ask("advertise ")  # None: it answers none
        assert store.holder_address("s") == (holder, None)
        child.ask("advertise unix:/run/two.sock")
        assert store.holder_address("s") == (holder, "unix:/run/two.sock")
        child.kill()
        assert store.held_by("s") is None
        assert store.holder_address("s") is None  # a dead holder's address is not given
        assert store.claim("s")


def test_a_claim_of_this_process_names_this_process(tmp_path: Path) -> None:
    """A claim of this process is held by "this process", as held_by says; another store
    object's advertise changes only its own claims' rows."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as a, SQLiteStore(path) as b:
        a.advertise("a-addr")
        ta = a.claim("s")
        b.claim("t")
        b.advertise("b-addr")
        assert a.holder_address("s") == b.holder_address("s") == ("this process", "a-addr")
        assert a.holder_address("t") == ("this process", "b-addr")
        a.advertise(None)
        assert b.holder_address("s") == ("this process", None)
        assert b.holder_address("t") == ("this process", "b-addr")
        a.release("s", ta)
        assert b.holder_address("s") is None
        assert a.holder_address("never") is None


Op = tuple[str, int, Any]
addresses = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.just("\x00abstract"),
    st.just("é" * 1024),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(0, 1), st.sampled_from("xyz")),
        st.tuples(st.just("release"), st.integers(0, 1), st.sampled_from("xyz")),
        st.tuples(st.just("advertise"), st.integers(0, 1), addresses),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(ops=ops)
def test_holder_address_follows_claims_releases_and_advertises(ops: list[Op]) -> None:
    """Over any sequence of claims, releases and advertises by two store objects on one
    file, every session's holder_address is the address its holder's store object
    advertised last before or since it took the claim (a plain model)."""
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        stores = [stack.enter_context(SQLiteStore(folder / "s.db")) for _ in range(2)]
        advertised: list[str | None] = [None, None]
        held: dict[str, tuple[int, str, str | None]] = {}  # sid: (object, token, address)
        for verb, who, arg in ops:
            store = stores[who]
            if verb == "claim":
                if arg in held:
                    with pytest.raises(ConflictError):
                        store.claim(arg)
                else:
                    held[arg] = (who, store.claim(arg), advertised[who])
            elif verb == "release":
                if arg in held and held[arg][0] == who:
                    store.release(arg, held.pop(arg)[1])
            else:
                store.advertise(arg)
                advertised[who] = arg
                held.update({s: (w, t, arg) for s, (w, t, _) in held.items() if w == who})
            for sid in "xyz":
                want = ("this process", held[sid][2]) if sid in held else None
                assert stores[0].holder_address(sid) == stores[1].holder_address(sid) == want


@pytest.mark.parametrize(
    ("address", "error", "match"),
    [
        (42, TypeError, "address must be a str"),
        (b"unix:/x", TypeError, "address must be a str"),
        ("x" * 1025, ValueError, "at most 1024 characters"),
        ("bad\ud800", ValueError, "valid Unicode"),
    ],
    ids=["int", "bytes", "too-long", "lone-surrogate"],
)
def test_a_bad_address_is_refused_and_changes_nothing(
    tmp_path: Path, address: object, error: type[Exception], match: str
) -> None:
    """advertise refuses what is not an address with a typed error, and the address the
    store object advertised before stays, in its rows and for its next claims."""
    with SQLiteStore(tmp_path / "s.db") as store:
        store.advertise("good")
        store.claim("s")
        with pytest.raises(error, match=match):
            store.advertise(address)  # type: ignore[arg-type]
        store.claim("t")
        assert store.holder_address("s") == store.holder_address("t") == ("this process", "good")


def test_a_closed_store_refuses_the_three_methods(tmp_path: Path) -> None:
    """advertise, holder_address and forwarding_key raise StoreError on a closed store, and
    holder_address on an id that is not valid."""
    store = SQLiteStore(tmp_path / "s.db")
    with pytest.raises(StoreError):
        store.holder_address("")
    store.close()
    for call in (
        lambda: store.advertise("a"),
        lambda: store.holder_address("s"),
        store.forwarding_key,
    ):
        with pytest.raises(StoreError, match="closed"):
            call()


# -- a process that opened the store at version 1 ------------------------------------------------


def test_a_read_only_opening_of_a_v1_store_writes_nothing_and_reads_on_after_migration(
    tmp_path: Path, children: list[Child], live_pid: int
) -> None:
    """A read-only opening (the viewer's) of a version-1 store reads it as it is, writes
    nothing and refuses a write without failing; once another process has migrated the
    file under it, it reads version 3 (the address advertised with a claim)."""
    folder = tmp_path / "db"
    folder.mkdir()
    path = folder / "v1.db"
    make_v1_store(path, {"s": [ev(0)]}, [("s", live_pid, "tok")])
    main_file = path.read_bytes()
    viewer = read_only_sqlite(path)
    inner: SQLiteStore = viewer.inner  # type: ignore[assignment]
    with contextlib.closing(viewer):
        assert viewer.load("s") == [ev(0)]
        assert inner.holder_address("s") == (f"process {live_pid}", None)
        with pytest.raises(StoreError, match="opened it read-only, without migrating it"):
            inner.forwarding_key()
        assert viewer.load("s") == [ev(0)]  # refused, not failed
    # (The file is read only with no connection open: closing a descriptor of it would
    # drop the locks of the process's connections.)
    assert path.read_bytes() == main_file

    viewer = read_only_sqlite(path)
    inner = viewer.inner  # type: ignore[assignment]
    with contextlib.closing(viewer):
        assert inner.holder_address("s") == (f"process {live_pid}", None)
        child = Child(HOLDER, str(path))  # a process that can write: it migrates the file
        children.append(child)
        child.expect("ready")
        child.ask("advertise unix:/run/w.sock")
        child.ask("claim t")
        assert inner.holder_address("t") == (f"process {child.pid}", "unix:/run/w.sock")
        assert inner.holder_address("s") == (f"process {live_pid}", None)
        assert viewer.load("s") == [ev(0)]
        key = bytes.fromhex(child.ask("key", "key ").split()[1])
        assert inner.forwarding_key() == key
    assert dump(path)["version"] == 3


V1_PROCESS = """
import sys
from datetime import UTC, datetime
from nous_actor import Event
from nous_actor.store import SQLiteStore
from nous_actor.errors import StoreError
store = SQLiteStore(sys.argv[1])
store.claim("s")
print("ready", flush=True)
sys.stdin.readline()
try:
    store.write({"s": [Event(5, "user_message", datetime.now(UTC), {"content": "late"})]})
except StoreError as exc:
    print("refused", exc, flush=True)
else:
    print("written", flush=True)
print("held_by", store.held_by("s"), flush=True)
"""


@pytest.fixture(scope="module")
def v1_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as the last release of schema version 1 had it, from the history."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and the repository's history (the version-1 release)")
    folder = tmp_path_factory.mktemp("v1-release")
    archive = subprocess.run(
        [git, "archive", V1_RELEASE, "nous_actor"],
        cwd=ROOT,
        capture_output=True,
        timeout=SLOW_BOUND,
        check=False,
    )
    if archive.returncode != 0:
        pytest.skip(f"the version-1 release {V1_RELEASE} is not in this repository's history")
    subprocess.run(
        ["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True, timeout=SLOW_BOUND
    )
    return folder


def test_a_v1_release_process_refuses_to_write_once_another_migrated_the_store(
    tmp_path: Path, children: list[Child], v1_release: Path
) -> None:
    """A process of the version-1 release, holding a claim on the store when a process of
    this release migrates it, keeps its claim (seen with no address) and refuses its next
    write, naming the new version: it never writes on as version 1."""
    path = tmp_path / "s.db"
    make_v1_store(path, {"s": [ev(0)]})
    env = dict(os.environ, PYTHONPATH=str(v1_release))
    old = Child(V1_PROCESS, str(path), env=env, cwd=v1_release)  # (cwd comes first)
    children.append(old)
    old.expect("ready")
    with SQLiteStore(path) as store:
        assert dump(path)["version"] == 3
        assert store.holder_address("s") == (f"process {old.pid}", None)
        old.send("write")
        refused = old.expect("refused ")
        assert "now has schema version 3" in refused
        assert "upgrade nous_actor" in refused
        assert old.expect("held_by ") == "held_by this process"
        assert store.load("s") == [ev(0)]


# -- opening a file this process holds open --------------------------------------------------

SEQS = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
print(" ".join(str(r[0]) for r in conn.execute("SELECT seq FROM events ORDER BY seq")))
conn.close()
"""


def seqs_seen_by_another_process(path: Path) -> str:
    """The seqs another process reads in the file (it opens and closes a connection)."""
    done = subprocess.run(
        [sys.executable, "-c", SEQS, str(path)],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
        check=True,
    )
    return done.stdout.strip()


@pytest.mark.parametrize("second", ["store", "read-only"])
def test_a_second_opening_in_this_process_loses_none_of_the_first_stores_commits(
    tmp_path: Path, second: str
) -> None:
    """Opening the file of a store this process holds (a second store object, the viewer)
    drops none of the first store's locks: another process that opens and closes the file
    leaves its WAL alone, and the first store's next acknowledged commit is in the file.
    (The opening read the file's header with a descriptor it then closed, which drops every
    POSIX lock the process holds on the file: that process took the file for unused and
    deleted its WAL, and the first store's next commits went into the deleted WAL.)"""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as first:
        first.write({"s": [ev(0)]})
        other = SQLiteStore(path) if second == "store" else read_only_sqlite(path)
        try:
            assert seqs_seen_by_another_process(path) == "0"
            first.write({"s": [ev(1)]})
            assert seqs_seen_by_another_process(path) == "0 1"
        finally:
            other.close()
