"""Store hardening: import under the writer claim, valid ids and non-empty input, files the
store refuses left unchanged, a removed database file, and the session listing.

Claims across processes and SIGKILLs are in test_store_sqlite.py and test_crash_sigkill.py.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from bounds import SLOW_BOUND as BOUND

from nous_actor import Event, InvalidEvent, Log, Session
from nous_actor.core.codec import CodecError, to_jsonl
from nous_actor.errors import ConflictError, SessionStopped, StoreError
from nous_actor.store import (
    MemoryStore,
    SessionInfo,
    SQLiteStore,
    Store,
    export_session,
    import_session,
    list_sessions,
)
from nous_actor.store.committer import Committer
from nous_actor.testing.store_suite._helpers import POISONS, _poisoned
from nous_actor.testing.stores import DelegatingStore

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def ev(seq: int, content: str = "x", time: datetime = T0) -> Event:
    return Event(seq, "user_message", time, {"content": content})


def jsonl(n: int = 2) -> str:
    log = Log()
    for i in range(n):
        log = log.append("user_message", {"content": f"m{i}"}, T0)
    return to_jsonl(log)


# -- import takes the writer claim (item 3) --------------------------------------------------


def test_import_into_a_session_with_a_live_writer_is_refused(store: Store) -> None:
    """A live session that stored nothing yet: import raises ConflictError and stores nothing."""
    chat = Session.start("chat", store=store, timeout=BOUND)
    try:
        with pytest.raises(ConflictError, match="live writer; stop that session first") as info:
            import_session(store, "chat", jsonl())
        assert info.value.session_id == "chat"
        assert "import into a new session id" in str(info.value)
        assert store.load("chat") == []
        assert chat.append("user_message", {"content": "mine"}).get().seq == 0
    finally:
        chat.stop()
    assert [e.data["content"] for e in store.load("chat")] == ["mine"]


def test_an_import_releases_its_claim_whether_it_succeeds_or_fails(store: Store) -> None:
    """After an import (stored, or refused for events already there), the id can be claimed."""
    assert import_session(store, "a", jsonl()) == 2
    store.claim("a")
    with pytest.raises(ConflictError, match="already has events"):
        import_session(store, "b", jsonl()) and import_session(store, "b", jsonl())
    store.claim("b")


class GatedStore(MemoryStore):
    """A MemoryStore whose writes wait at a gate, so a test can act while one is in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = threading.Event()
        self.gate = threading.Event()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.writing.set()
        assert self.gate.wait(BOUND), "the test never opened the gate"
        return super().write(appends)


def test_a_session_started_while_an_import_runs_is_refused() -> None:
    """The import holds the claim while it writes: a session of that id cannot start meanwhile."""
    store = GatedStore()
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(import_session(store, "g", jsonl(3))))
    worker.start()
    try:
        assert store.writing.wait(BOUND)
        with pytest.raises(ConflictError, match="live writer"):
            Session.start("g", store=store, timeout=BOUND)
    finally:
        store.gate.set()
        worker.join(BOUND)
    assert result == [3]
    session = Session.start("g", store=store, timeout=BOUND)  # the claim was released
    assert session.count().get() == 3
    session.stop()


# -- import and export check the session id (item 9) -----------------------------------------


BAD_IDS = ["", " ", " chat", "a\nb", "nul\x00x", "x" * 100_000, "lone-\udc80"]


@pytest.mark.parametrize("session_id", BAD_IDS, ids=repr)
def test_import_refuses_an_invalid_session_id_and_stores_nothing(
    store: Store, session_id: str
) -> None:
    """An id the rule refuses is a ValueError saying what a valid id is; nothing is stored."""
    with pytest.raises(ValueError, match=r"not a valid session id.*1 to 256 characters"):
        import_session(store, session_id, jsonl())
    assert store.sessions() == []


def test_import_and_export_refuse_a_non_str_session_id(store: Store) -> None:
    """A session id that is not a str is a TypeError."""
    with pytest.raises(TypeError, match="session_id must be a str"):
        import_session(store, 7, jsonl())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session_id must be a str"):
        export_session(store, None)  # type: ignore[arg-type]
    assert store.sessions() == []


@pytest.mark.parametrize("session_id", BAD_IDS, ids=repr)
def test_export_refuses_an_invalid_session_id(store: Store, session_id: str) -> None:
    """export_session checks the id by the same rule."""
    with pytest.raises(ValueError, match="not a valid session id"):
        export_session(store, session_id)


@pytest.mark.parametrize("session_id", BAD_IDS, ids=repr)
def test_claim_and_write_refuse_an_invalid_session_id_with_store_error(
    store: Store, session_id: str
) -> None:
    """The stores refuse a bad id as a StoreError (the Store contract), storing nothing."""
    with pytest.raises(StoreError, match="not a valid session id"):
        store.claim(session_id)
    with pytest.raises(StoreError, match="not a valid session id"):
        store.write({"fine": [ev(0)], session_id: [ev(0)]})
    assert store.sessions() == []
    assert store.write({"fine": [ev(0)]}) == {}


# -- import refuses an empty input (item 10) ---------------------------------------------------


@pytest.mark.parametrize("text", ["[]", " [ ] \n", "", "\n\n", "   "], ids=repr)
def test_import_of_an_input_without_events_is_a_codec_error(store: Store, text: str) -> None:
    """An empty v1 list or an empty JSON Lines text imports nothing: CodecError, no session."""
    with pytest.raises(CodecError, match="holds no events"):
        import_session(store, "g10", text)
    assert store.sessions() == []
    store.claim("g10")  # and no claim was left behind


# -- a refused file is left byte for byte unchanged (item 5) -----------------------------------


def _rollback_journal_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('theirs')")
    finally:
        conn.close()


def _wal_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('theirs')")
    finally:
        conn.close()


def _same_table_names_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, payload TEXT)")
        conn.execute("CREATE TABLE writers (who TEXT)")
    finally:
        conn.close()


def _marked_db(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA application_id = 1234")  # no table, but marked as someone else's
    finally:
        conn.close()


FOREIGN: dict[str, Callable[[Path], object]] = {
    "rollback-journal SQLite": _rollback_journal_db,
    "WAL SQLite": _wal_db,
    "SQLite with tables named like ours": _same_table_names_db,
    "SQLite marked by another application": _marked_db,
    "text": lambda p: p.write_text("dear diary,\n" * 300),
    "random bytes": lambda p: p.write_bytes(random.Random(5).randbytes(10_000)),
    "a few bytes": lambda p: p.write_bytes(b"SQL"),
}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("make", FOREIGN.values(), ids=FOREIGN.keys())
@pytest.mark.parametrize("create", [True, False])
def test_a_file_that_is_not_a_store_is_refused_and_left_byte_for_byte_unchanged(
    tmp_path: Path, make: Callable[[Path], object], create: bool
) -> None:
    """Refusing a file writes nothing to it or next to it (no WAL switch, no schema)."""
    path = tmp_path / "theirs.db"
    make(path)
    before = _snapshot(tmp_path)
    with pytest.raises(StoreError, match="left unchanged"):
        SQLiteStore(path, create=create)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("make", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_refused_file_is_left_unchanged_while_its_owner_has_it_open(
    tmp_path: Path, make: Callable[[Path], object]
) -> None:
    """With the owner's connection open (a WAL file has its -wal and -shm), nothing changes."""
    path = tmp_path / "theirs.db"
    make(path)
    owner = sqlite3.connect(path) if path.read_bytes().startswith(b"SQLite format 3") else None
    try:
        if owner is not None:
            owner.execute("SELECT * FROM sqlite_master").fetchall()
        db_before = path.read_bytes()
        with pytest.raises(StoreError, match="left unchanged"):
            SQLiteStore(path)
        assert path.read_bytes() == db_before
    finally:
        if owner is not None:
            owner.close()


CRASHED_WAL_WRITER = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA journal_mode = WAL")
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("CREATE TABLE notes (body TEXT)")
conn.execute("INSERT INTO notes VALUES ('theirs, only in the WAL')")
os._exit(0)  # dies holding it: the WAL keeps frames no checkpoint has copied
"""

CRASHED_ROLLBACK_WRITER = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("CREATE TABLE notes (body TEXT)")
conn.execute("PRAGMA cache_size = 1")
conn.execute("BEGIN")
for _ in range(500):
    conn.execute("INSERT INTO notes VALUES (?)", ("x" * 500,))
os._exit(0)  # dies in its transaction: a hot rollback journal is left next to the file
"""


@pytest.mark.parametrize(
    ("script", "side"),
    [(CRASHED_WAL_WRITER, "-wal"), (CRASHED_ROLLBACK_WRITER, "-journal")],
    ids=["WAL with frames", "hot rollback journal"],
)
def test_a_crashed_applications_database_is_refused_without_recovering_it(
    tmp_path: Path, script: str, side: str
) -> None:
    """Their unfinished state (WAL frames, a hot journal) is theirs to recover: refusing the
    file neither checkpoints nor rolls back, so the file and that side file keep their bytes."""
    path = tmp_path / "theirs.db"
    subprocess.run([sys.executable, "-c", script, str(path)], timeout=BOUND, check=True)
    sidecar = Path(f"{path}{side}")
    assert sidecar.stat().st_size > 0
    db_before, side_before = path.read_bytes(), sidecar.read_bytes()
    with pytest.raises(StoreError, match="another application's SQLite database"):
        SQLiteStore(path)
    assert path.read_bytes() == db_before
    assert sidecar.read_bytes() == side_before


def test_create_false_refuses_a_missing_path_and_makes_no_file(tmp_path: Path) -> None:
    """With create=False a missing path is a StoreError saying how to make a store."""
    path = tmp_path / "nope.db"
    with pytest.raises(StoreError, match=r"no nous_actor store.*does not exist.*create=True"):
        SQLiteStore(path, create=False)
    assert list(tmp_path.iterdir()) == []


def test_create_false_refuses_an_empty_file_and_leaves_it_empty(tmp_path: Path) -> None:
    """With create=False a 0-byte file is no store: refused, and still 0 bytes, alone."""
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(StoreError, match=r"no nous_actor store.*empty file"):
        SQLiteStore(path, create=False)
    assert path.read_bytes() == b""
    assert list(tmp_path.iterdir()) == [path]


def test_create_false_refuses_an_empty_sqlite_database_unchanged(tmp_path: Path) -> None:
    """With create=False a SQLite database with nothing in it is no store either."""
    path = tmp_path / "blank.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("VACUUM")  # a one-page database: no table, no marks
    conn.close()
    before = _snapshot(tmp_path)
    assert path.stat().st_size > 0
    with pytest.raises(StoreError, match=r"no nous_actor store.*empty SQLite database"):
        SQLiteStore(path, create=False)
    assert _snapshot(tmp_path) == before


def test_create_false_opens_an_existing_store(tmp_path: Path) -> None:
    """create=False is only about making stores: an existing one opens as usual."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
    with SQLiteStore(path, create=False) as store:
        assert store.load("s") == [ev(0)]


@pytest.mark.parametrize("kind", ["empty file", "empty SQLite database"])
def test_an_empty_file_becomes_a_store_by_default(tmp_path: Path, kind: str) -> None:
    """A 0-byte file, or a SQLite database with nothing in it, becomes a new store."""
    path = tmp_path / "new.db"
    if kind == "empty file":
        path.touch()
    else:
        conn = sqlite3.connect(path)
        conn.execute("VACUUM")
        conn.close()
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
    with SQLiteStore(path, create=False) as store:
        assert store.load("s") == [ev(0)]


def test_a_directory_is_refused_as_a_directory(tmp_path: Path) -> None:
    """A folder given as the path: StoreError saying it is a directory; nothing made in it."""
    with pytest.raises(StoreError, match="is a directory"):
        SQLiteStore(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_store_half_made_by_an_older_release_is_completed(tmp_path: Path) -> None:
    """A file with only our tables (no version, no application id), as an older release could
    leave when killed while creating it, opens as a store."""
    path = tmp_path / "half.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS events (\n    session_id TEXT NOT NULL,\n"
        "    seq INTEGER NOT NULL CHECK (seq >= 0),\n    type TEXT NOT NULL,\n"
        "    time TEXT NOT NULL,\n    data TEXT NOT NULL,\n"
        "    PRIMARY KEY (session_id, seq)\n) WITHOUT ROWID"
    )
    conn.close()
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
        store.claim("s")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == 0x6E6F7573
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    conn.close()


def test_a_store_made_before_application_id_opens_and_keeps_its_events(tmp_path: Path) -> None:
    """A store of an older release (schema version 1, no application_id) is still ours."""
    path = tmp_path / "old.db"
    with SQLiteStore(path) as store:
        store.write({"s": [ev(0)]})
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA application_id = 0")
    conn.close()
    with SQLiteStore(path, create=False) as store:
        assert store.load("s") == [ev(0)]


# -- a removed or replaced database file (item 8) ---------------------------------------------


def test_a_store_opened_by_a_relative_path_survives_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file check follows the file opened, not the relative path read from a new cwd."""
    monkeypatch.chdir(tmp_path)
    with SQLiteStore("rel.db") as store:
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)
        assert store.write({"s": [ev(0)]}) == {}
        assert store.load("s") == [ev(0)]
    assert list(elsewhere.iterdir()) == []


def test_a_write_after_the_folder_is_removed_raises_store_error(tmp_path: Path) -> None:
    """rm -rf of the store's folder: the next write fails, and so does every call after it."""
    folder = tmp_path / "data"
    folder.mkdir()
    store = SQLiteStore(folder / "events.sqlite")
    try:
        assert store.write({"s": [ev(0)]}) == {}
        shutil.rmtree(folder)
        with pytest.raises(StoreError, match="was removed or replaced") as info:
            store.write({"s": [ev(1)]})
        assert "open a new store" in str(info.value)
        for call in (lambda: store.load("s"), lambda: store.claim("t"), store.sessions):
            with pytest.raises(StoreError, match="was removed or replaced"):
                call()
    finally:
        store.close()


def test_a_first_write_after_the_folder_is_removed_raises_store_error(tmp_path: Path) -> None:
    """The folder removed before the store's first write (its connection that writes is
    made then): that write says the file was removed, and every call after it too."""
    folder = tmp_path / "data"
    folder.mkdir()
    store = SQLiteStore(folder / "events.sqlite")
    try:
        shutil.rmtree(folder)
        with pytest.raises(StoreError, match="was removed or replaced"):
            store.write({"s": [ev(0)]})
        with pytest.raises(StoreError, match="was removed or replaced"):
            store.load("s")
        assert not folder.exists()  # nothing made again at the path
    finally:
        store.close()


def test_an_append_after_the_folder_is_removed_is_not_acknowledged(tmp_path: Path) -> None:
    """Through a session: the append's future fails with StoreError, and the next is refused."""
    folder = tmp_path / "data"
    folder.mkdir()
    store = SQLiteStore(folder / "events.sqlite")
    session = Session.start("s", store=store, timeout=BOUND)
    try:
        session.append("user_message", {"content": "kept"}).get()
        shutil.rmtree(folder)
        with pytest.raises(StoreError, match="was removed or replaced"):
            session.append("user_message", {"content": "lost"}).get()
        with pytest.raises(StoreError):
            session.append("user_message", {"content": "refused"}).get()
        assert [e.data["content"] for e in session.events().get()] == ["kept"]
    finally:
        session.stop()
        store.close()


def test_a_write_after_the_file_is_replaced_raises_store_error(tmp_path: Path) -> None:
    """Another file moved onto the path: the next write fails and commits nothing."""
    path = tmp_path / "events.sqlite"
    other = tmp_path / "other.sqlite"
    with SQLiteStore(other) as s:
        s.write({"theirs": [ev(0)]})
    store = SQLiteStore(path)
    try:
        store.write({"s": [ev(0)]})
        os.replace(other, path)
        with pytest.raises(StoreError, match="was removed or replaced"):
            store.write({"s": [ev(1)]})
        with pytest.raises(StoreError, match="was removed or replaced"):
            store.load("s")
    finally:
        store.close()


def test_release_after_the_file_is_removed_does_not_raise(tmp_path: Path) -> None:
    """A session stopping after its file vanished gives up its claim quietly."""
    folder = tmp_path / "data"
    folder.mkdir()
    store = SQLiteStore(folder / "events.sqlite")
    token = store.claim("s")
    shutil.rmtree(folder)
    with pytest.raises(StoreError):
        store.write({"s": [ev(0)]})
    store.release("s", token)
    store.close()


# -- list_sessions (item 17) -------------------------------------------------------------------


def _fill(store: Store) -> None:
    store.write(
        {
            "b": [ev(0, time=T0), ev(1, time=T0 + timedelta(hours=2)), ev(2, time=T0)],
            "a": [ev(i) for i in range(5)],
            "c": [ev(7, time=T0 - timedelta(days=1))],
        }
    )
    store.drop("a", [0, 1, 4])


WANT = [
    SessionInfo("a", 2, 4, T0, None),
    SessionInfo("b", 3, 3, T0 + timedelta(hours=2), None),
    SessionInfo("c", 1, 8, T0 - timedelta(days=1), None),
]


class PlainStore(DelegatingStore):
    """A Store without `index()`: only the protocol's methods, by delegation."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.broken: set[str] = set()

    def load(self, session_id: str) -> list[Event]:
        if session_id in self.broken:
            raise StoreError("the disk ate it", session_id=session_id)
        return self.inner.load(session_id)


def test_list_sessions_reports_count_next_seq_and_latest_time(store: Store) -> None:
    """Retained events, the next seq (snapshot gaps counted) and the latest time, by id."""
    _fill(store)
    assert list_sessions(store) == WANT


def test_list_sessions_of_a_store_without_index_loads_each_session(store: Store) -> None:
    """A store of the bare protocol gets the same answer, by loading."""
    plain = PlainStore(store)
    assert isinstance(plain, Store)
    assert not hasattr(plain, "index")
    _fill(plain)
    assert list_sessions(plain) == WANT


def test_a_session_that_fails_to_load_is_listed_with_its_error(store: Store) -> None:
    """One unreadable session does not fail the listing: its error is reported instead."""
    plain = PlainStore(store)
    _fill(plain)
    plain.broken.add("b")
    infos = list_sessions(plain)
    assert [i.session_id for i in infos] == ["a", "b", "c"]
    assert infos[1] == SessionInfo("b", 0, 0, None, "StoreError: session 'b': the disk ate it")
    assert infos[0] == WANT[0]
    assert infos[2] == WANT[2]


def test_list_sessions_on_sqlite_decodes_no_event(tmp_path: Path) -> None:
    """SQLite's index answers with one query: a row with corrupt data is still listed, and
    load is never called."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        _fill(store)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE events SET data = '{not json' WHERE session_id = 'b'")
        conn.close()

        def no_load(session_id: str) -> list[Event]:
            raise AssertionError("list_sessions loaded a session")

        store.load = no_load  # type: ignore[method-assign]
        assert list_sessions(store) == WANT


def test_sqlite_index_reports_a_corrupt_time_in_error(tmp_path: Path) -> None:
    """A stored time that does not parse marks that session only."""
    path = tmp_path / "s.db"
    with SQLiteStore(path) as store:
        _fill(store)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE events SET time = 'yesterday' WHERE session_id = 'c'")
        conn.close()
        infos = list_sessions(store)
    assert infos[:2] == WANT[:2]
    assert infos[2].session_id == "c"
    assert infos[2].last_time is None
    assert "time is malformed" in str(infos[2].error)


def test_list_sessions_of_an_empty_or_closed_store(store: Store) -> None:
    """No session: []. A closed store: StoreError (the store failed as a whole)."""
    assert list_sessions(store) == []
    store.close()
    with pytest.raises(StoreError, match="closed"):
        list_sessions(store)


def test_session_info_is_a_frozen_value() -> None:
    """SessionInfo compares by value and cannot be changed."""
    info = SessionInfo("s", 1, 1, T0, None)
    assert info == SessionInfo("s", 1, 1, T0, None)
    with pytest.raises(AttributeError):
        info.events = 2  # type: ignore[misc]
    assert json.dumps(info.session_id) == '"s"'


# -- one session's unstorable value never fails another's commit (issue 30, item 4) ----------


class _Gated(DelegatingStore):
    """A store whose first write waits for ``opened``, so that what is submitted
    meanwhile goes into the committer's next transaction, together (the gate is not
    named ``release``: that is the store's own method, of a claim)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.opened = threading.Event()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        if not self.entered.is_set():
            self.entered.set()
            assert self.opened.wait(BOUND)
        return self.inner.write(appends)


@pytest.mark.parametrize("how", POISONS)
def test_a_poisoned_session_in_a_group_commit_fails_alone(
    store: Store, how: str, tmp_path: Path
) -> None:
    """Through the committer: one transaction holds healthy sessions and one whose event
    the store cannot store; the healthy ones are acknowledged and stored, the poisoned
    one alone fails with StoreError (its items of that transaction), and the committer
    writes on."""
    if isinstance(store, MemoryStore) and how != "seq":
        pytest.skip("a MemoryStore keeps values as they are: only a seq past 2**63 is refused")
    gated = _Gated(store)
    committer = Committer(gated)
    try:
        answers: dict[str, list[StoreError | None]] = {}

        def note(sid: str) -> Callable[[StoreError | None], None]:
            return lambda err: answers.setdefault(sid, []).append(err)

        committer.submit("gate", [ev(0)], note("gate"))
        assert gated.entered.wait(BOUND)
        committer.submit("a", [ev(0), ev(1)], note("a"))
        committer.submit("bad", [ev(0), _poisoned(1, how)], note("bad"))
        committer.submit("bad", [ev(2)], note("bad"))
        committer.submit("b", [ev(0)], note("b"))
        done = threading.Event()
        committer.submit("b", [ev(1)], lambda err: (note("b")(err), done.set()))
        gated.opened.set()
        assert done.wait(BOUND)
        assert answers["gate"] == [None]
        assert answers["a"] == [None]
        assert answers["b"] == [None, None]
        assert len(answers["bad"]) == 2  # both in the one write of the session: both fail
        for err in answers["bad"]:
            assert isinstance(err, StoreError)
            assert err.session_id == "bad"
        assert [e.seq for e in store.load("a")] == [0, 1]
        assert [e.seq for e in store.load("b")] == [0, 1]
        assert store.load("bad") == []
        committer.reset("bad")  # as a restarted session does, having reloaded the store
        again = threading.Event()
        committer.submit("bad", [ev(0)], lambda err: (note("again")(err), again.set()))
        assert again.wait(BOUND)
        assert answers["again"] == [None]
    finally:
        committer.close(BOUND)


def test_sessions_writing_beside_an_unstorable_append_at_all_commit(tmp_path: Path) -> None:
    """Through sessions: appends of other sessions sharing group commits with an
    ``append_at(2**63)`` are all acknowledged and stored, and never raise."""
    store = SQLiteStore(tmp_path / "s.db")
    healthy = [Session.start(f"ok-{i}", store=store, timeout=BOUND) for i in range(4)]
    poisoned = Session.start("poisoned", store=store, timeout=BOUND)
    try:
        futures = []
        for n in range(50):
            for s in healthy:
                futures.append(s.append_or_log("user_message", {"content": f"m{n}"}))
            if n % 10 == 0:
                bad = poisoned.append_at(2**63, "user_message", {"content": "far"})
                with pytest.raises((InvalidEvent, StoreError, SessionStopped)):
                    bad.get(timeout=BOUND)
        got = [f.get(timeout=BOUND) for f in futures]
        assert all(isinstance(e, Event) for e in got)
        for s in healthy:
            assert len(store.load(s.session_id)) == 50
    finally:
        for s in [*healthy, poisoned]:
            s.stop()
        store.close()
