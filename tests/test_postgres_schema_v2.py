"""PostgresStore's schema version 2: the holder's address with its claim, the store's
shared secret, and the migration of a version-1 store.

Runs against a real server (see tests/postgres_server.py); each test has a schema
of its own. A version-1 store is made with the DDL of that release, kept here.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from bounds import BOUND, INTERPRETER_BOUND, wait_until

if TYPE_CHECKING:
    from postgres_server import Server

# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.core.codec import encode_data  # noqa: E402
from nous_actor.core.event import Event  # noqa: E402
from nous_actor.errors import ConflictError, StoreError  # noqa: E402
from nous_actor.store.postgres import SCHEMA_VERSION, PostgresStore  # noqa: E402
from nous_actor.store.postgres import schema as pg_schema  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

# The tables of schema version 1, as that release made them (its `_DDL`).
V1_DDL = (
    """CREATE TABLE {events} (
    session_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL CHECK (seq >= 0),
    epoch bigint NOT NULL,
    type text NOT NULL,
    time timestamptz NOT NULL,
    data text NOT NULL,
    PRIMARY KEY (session_id, seq)
)""",
    """CREATE TABLE {claims} (
    session_id text COLLATE "C" PRIMARY KEY,
    epoch bigint NOT NULL,
    token text NOT NULL,
    holder text NOT NULL,
    claimed_at timestamptz NOT NULL,
    lease_until timestamptz NOT NULL,
    locked boolean NOT NULL
)""",
    "CREATE SEQUENCE {epochs} AS bigint MINVALUE 1",
    "CREATE TABLE {meta} (key text PRIMARY KEY, value text NOT NULL)",
)

# Statements of the version-1 release's writes (its claim insert, takeover, renewal and
# event insert), as it sends them.
V1_CLAIM = (
    "INSERT INTO {claims} (session_id, epoch, token, holder, claimed_at, lease_until, "
    "locked) VALUES (%s, nextval(%s::regclass), %s, %s, clock_timestamp(), "
    "clock_timestamp() + make_interval(secs => 60.0), false) "
    "ON CONFLICT (session_id) DO NOTHING RETURNING epoch"
)
V1_RENEW = (
    "UPDATE {claims} SET lease_until = clock_timestamp() + make_interval(secs => 60.0) "
    "WHERE session_id = %s"
)
V1_TAKEOVER = (
    "UPDATE {claims} SET epoch = nextval('{epochs}'::regclass), token = %s, holder = %s, "
    "claimed_at = clock_timestamp(), lease_until = clock_timestamp() + "
    "make_interval(secs => 60.0), locked = false WHERE session_id = %s RETURNING epoch"
)
V1_INSERT = (
    "INSERT INTO {events} (session_id, seq, epoch, type, time, data) "
    "VALUES (%s, %s, %s, %s, %s, %s)"
)


def ev(seq: int, content: str | None = None) -> Event:
    return Event(seq, "user_message", T0, {"content": content or f"event {seq}"})


CALLS_COLUMNS: Final = [("calls", c) for c in ("at", "call", "first", "last", "session_id")]
"""The columns of version 3's table of forwarded calls' records."""


def make_v2(server: Server, schema: str) -> None:
    """Take the version-1 store in ``schema`` to version 2, as that release did."""
    with server.connect() as conn, conn.transaction():
        q = {**names(schema), "guard": f'"{schema}".{pg_schema._GUARD}'}
        for statement in pg_schema._UPGRADES[1]:
            conn.execute(statement.format(**q))


def names(schema: str) -> dict[str, str]:
    return {t: f'"{schema}".{t}' for t in ("events", "claims", "epochs", "meta")}


def make_v1_store(server: Server, schema: str) -> None:
    """A store of schema version 1 in ``schema``, made as that release made it, holding
    events of two sessions, a live claim of another store object (another process),
    and an expired claim."""
    n = names(schema)
    with server.connect() as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
        for statement in V1_DDL:
            conn.execute(statement.format(**n))
        conn.execute(
            f"INSERT INTO {n['meta']} (key, value) VALUES ('application', 'nous_actor'), "
            "('schema_version', '1')"
        )
        for sid, count in (("held", 3), ("free", 2)):
            for seq in range(count):
                e = ev(seq, f"{sid} {seq} ✓")
                conn.execute(
                    V1_INSERT.format(**n),
                    (sid, seq, 1, e.type.value, e.time, encode_data(e)),
                )
        conn.execute(
            V1_CLAIM.format(**n), ("held", f'"{schema}".epochs', "a" * 32, "old-host pid 7")
        )
        conn.execute(
            f"INSERT INTO {n['claims']} (session_id, epoch, token, holder, claimed_at, "
            "lease_until, locked) VALUES ('free', nextval(%s::regclass), %s, 'gone pid 9', "
            "now() - interval '2 hours', now() - interval '1 hour', true)",
            (f'"{schema}".epochs', "b" * 32),
        )


def snapshot(server: Server, schema: str) -> dict[str, Any]:
    """Everything a store keeps in ``schema``: its rows, its columns, its functions and
    triggers (to see that a refused or rolled-back opening changed nothing)."""
    n = names(schema)
    return {
        "meta": server.sql(f"SELECT key, value FROM {n['meta']} ORDER BY key"),
        "events": server.sql(f"SELECT * FROM {n['events']} ORDER BY session_id, seq"),
        "claims": server.sql(
            f"SELECT session_id, epoch, token, holder, claimed_at, lease_until, locked "
            f"FROM {n['claims']} ORDER BY session_id"
        ),
        "columns": server.sql(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s ORDER BY table_name, column_name",
            (schema,),
        ),
        "functions": server.sql(
            "SELECT proname FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace "
            "WHERE nspname = %s ORDER BY 1",
            (schema,),
        ),
        "triggers": server.sql(
            "SELECT tgname, relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace s ON s.oid = c.relnamespace WHERE nspname = %s ORDER BY 1, 2",
            (schema,),
        ),
    }


def version_of(server: Server, schema: str) -> str:
    rows = server.sql(f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema_version'")
    return str(rows[0][0])


@pytest.fixture
def stores(pg_server: Server, schema: str) -> Iterator[list[PostgresStore]]:
    """The stores a test opens (closed afterwards)."""
    made: list[PostgresStore] = []
    yield made
    for store in made:
        store.close()


def opened(made: list[PostgresStore], server: Server, schema: str, **kw: Any) -> PostgresStore:
    store = PostgresStore(server.dsn, schema=schema, **kw)
    made.append(store)
    return store


def child(script: str, *args: str) -> subprocess.Popen[str]:
    """A Python process running ``script`` (``sys.argv[1:]`` are ``args``)."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The next line ``proc`` writes (fails after ``timeout`` s, or if it exits)."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        raise AssertionError(f"process {proc.pid} said nothing within {timeout} s")
    line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=timeout)
        raise AssertionError(f"process {proc.pid} exited: {err[-3000:]}")
    return line.strip()


# -- a new store, and one newer than this release --------------------------------------------


def test_a_new_store_is_made_at_version_3_with_the_address_column_and_the_calls(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A missing schema becomes a store of version 3: the claims have an address, the
    calls' records have their table, the guard of version 3 is in place."""
    opened(stores, pg_server, schema)
    assert SCHEMA_VERSION == 3
    assert version_of(pg_server, schema) == "3"
    shot = snapshot(pg_server, schema)
    assert ("claims", "address") in shot["columns"]
    assert set(CALLS_COLUMNS) <= set(shot["columns"])
    assert shot["functions"] == [("refuse_other_version",)]
    assert shot["triggers"] == [("version_guard", "claims"), ("version_guard", "events")]


@pytest.mark.parametrize("create", [True, False])
def test_a_store_of_version_4_is_refused_unchanged(
    pg_server: Server, schema: str, stores: list[PostgresStore], create: bool
) -> None:
    """A store newer than this release is refused (upgrade) and left as it was."""
    opened(stores, pg_server, schema).write({"s": [ev(0)]})
    pg_server.sql(f"UPDATE \"{schema}\".meta SET value = '4' WHERE key = 'schema_version'")
    before = snapshot(pg_server, schema)
    with pytest.raises(StoreError, match=r"schema version 4.*upgrade nous_actor"):
        PostgresStore(pg_server.dsn, schema=schema, create=create)
    assert snapshot(pg_server, schema) == before


# -- migrating a store of version 1 ----------------------------------------------------------


@pytest.mark.parametrize("create", [True, False])
def test_a_v1_store_is_migrated_and_reads_back_the_same(
    pg_server: Server, schema: str, stores: list[PostgresStore], create: bool
) -> None:
    """A store made by the version-1 release, with events and a live claim of another
    process, opens as version 3: every row reads back the same, the old claims have
    no address, the live one is still refused to others, the expired one is taken."""
    make_v1_store(pg_server, schema)
    before = snapshot(pg_server, schema)
    store = opened(stores, pg_server, schema, create=create)
    after = snapshot(pg_server, schema)
    assert version_of(pg_server, schema) == "3"
    assert after["events"] == before["events"]
    assert after["claims"] == before["claims"]
    assert set(after["columns"]) == {*before["columns"], ("claims", "address"), *CALLS_COLUMNS}
    assert pg_server.sql(f'SELECT count(*) FROM "{schema}".claims WHERE address IS NULL') == [(2,)]
    # The events load back as they were written, through the store.
    assert store.load("held") == [ev(s, f"held {s} ✓") for s in range(3)]
    assert store.load("free") == [ev(s, f"free {s} ✓") for s in range(2)]
    assert store.sessions() == ["free", "held"]
    # The live claim of a version-1 process: held, without an address, not taken over.
    assert store.held_by("held") == "old-host pid 7"
    assert store.holder_address("held") == ("old-host pid 7", None)
    with pytest.raises(ConflictError, match="old-host pid 7"):
        store.claim("held")
    # The expired claim is nobody's: claimed anew, with a higher epoch than before.
    assert store.holder_address("free") is None
    store.advertise("/run/worker.sock")
    store.claim("free")
    assert store.holder_address("free") == (store.holder, "/run/worker.sock")
    epochs = dict(pg_server.sql(f'SELECT session_id, epoch FROM "{schema}".claims'))
    assert epochs["free"] > epochs["held"]
    assert store.write({"free": [ev(2)]}) == {}
    # It opens again as it is (nothing more to migrate).
    again = opened(stores, pg_server, schema, create=False)
    assert again.holder_address("free") == (store.holder, "/run/worker.sock")


def test_two_openings_of_a_v1_store_at_once_migrate_it_once(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """Two store objects opening a version-1 store at the same moment (both waiting on
    the schema's lock, released together): one migrates it, the other opens version 3."""
    make_v1_store(pg_server, schema)
    key = f"nous_actor schema {schema}"
    results: list[object] = []
    with pg_server.connect() as blocker:
        blocker.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))

        def open_one() -> None:
            try:
                results.append(opened(stores, pg_server, schema, timeout=BOUND))
            except BaseException as exc:
                results.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(2)]
        for t in threads:
            t.start()
        wait_until(
            lambda: (
                pg_server.sql(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )[0][0]
                >= 2
            ),
            BOUND,
            "both openings wait for the schema's lock",
        )
        blocker.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))
        for t in threads:
            t.join(BOUND)
    assert all(isinstance(r, PostgresStore) for r in results), results
    assert len(results) == 2
    assert version_of(pg_server, schema) == "3"
    assert ("claims", "address") in snapshot(pg_server, schema)["columns"]


# The child migrates the store, stopping after the migration's statement number `step`
# (inside the migration's transaction): it says so, then waits to be killed.
MIGRATE_AND_STOP = """
import sys
import psycopg
from nous_actor.store.postgres import PostgresStore, schema

dsn, name, start, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
first = schema._UPGRADES[start][0].split("{")[0]
seen = []
real = psycopg.Connection.execute

def execute(self, query, *args, **kwargs):
    cur = real(self, query, *args, **kwargs)
    if isinstance(query, str) and (seen or query.startswith(first)):
        seen.append(query)
        if len(seen) == step + 1:
            print("stopped", self.info.backend_pid, flush=True)
            sys.stdin.readline()  # killed here
    return cur

psycopg.Connection.execute = execute
PostgresStore(dsn, schema=name)
print("finished", flush=True)
"""


_STEPS: Final = [
    (start, step)
    for start in (1, 2)
    for step in range(sum(len(pg_schema._UPGRADES[v]) for v in range(start, SCHEMA_VERSION)))
]
"""Where a migration is killed: from version 1 (through 2 to 3, one transaction) or 2,
after each of its statements in turn."""


@pytest.mark.parametrize(("start", "step"), _STEPS)
def test_a_process_killed_mid_migration_leaves_the_store_as_it_was_and_it_opens_again(
    pg_server: Server, schema: str, stores: list[PostgresStore], start: int, step: int
) -> None:
    """SIGKILL a process inside its migration (after each of its statements in turn):
    the store is wholly of its old version as it was, and the next opening migrates it."""
    make_v1_store(pg_server, schema)
    if start == 2:
        make_v2(pg_server, schema)
    before = snapshot(pg_server, schema)
    proc = child(MIGRATE_AND_STOP, pg_server.dsn, schema, str(start), str(step))
    try:
        said = read_line(proc, INTERPRETER_BOUND).split()
        assert said[0] == "stopped", said
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(BOUND)
    finally:
        proc.kill()
        proc.communicate(timeout=BOUND)
    # The server ends the killed process's session and rolls its transaction back.
    backend = int(said[1])
    wait_until(
        lambda: not pg_server.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)),
        BOUND,
        "the killed process's session ends",
    )
    assert snapshot(pg_server, schema) == before
    assert version_of(pg_server, schema) == str(start)
    store = opened(stores, pg_server, schema)
    assert version_of(pg_server, schema) == "3"
    assert store.load("held") == [ev(s, f"held {s} ✓") for s in range(3)]
    assert store.holder_address("held") == ("old-host pid 7", None)


# -- migrating a store of version 2 ----------------------------------------------------------


def test_a_v2_store_is_migrated_and_a_v2_writer_is_refused(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A store of version 2 opens as version 3: rows unchanged, the calls' table made,
    the guard of version 3 in place, so a process of the version-2 release (which says
    its commits where this one no longer listens) writes nothing more."""
    make_v1_store(pg_server, schema)
    make_v2(pg_server, schema)
    before = snapshot(pg_server, schema)
    assert version_of(pg_server, schema) == "2"
    store = opened(stores, pg_server, schema)
    after = snapshot(pg_server, schema)
    assert version_of(pg_server, schema) == "3"
    assert after["events"] == before["events"]
    assert after["claims"] == before["claims"]
    assert set(after["columns"]) == {*before["columns"], *CALLS_COLUMNS}
    assert after["triggers"] == before["triggers"]
    assert store.load("held") == [ev(s, f"held {s} ✓") for s in range(3)]
    n = names(schema)
    with pg_server.connect() as old, old.transaction():
        old.execute("SET LOCAL nous_actor.schema_version = '2'")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="as version 2"):
            old.execute(V1_INSERT.format(**n), ("mine", 0, 1, "user_message", T0, "{}"))
    assert store.write({"free": [ev(2)]}, calls={"free": [("k-1", 2, 2)]}) == {}
    assert store.applied_call("free", "k-1") == (2, 2)


# -- commits are heard only by stores that watch ------------------------------------------


def test_a_store_that_watches_nothing_hears_no_commit_and_one_that_watches_does(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """Another store's commits do not wake a store that watches nothing (its change
    counter stays; a process holding sessions is not woken by every commit of every
    other process), while hand-off requests still do; once it watches a session, that
    session's commits reach the watch, and after the watch closes they stop again."""
    idle = opened(stores, pg_server, schema)
    writer = opened(stores, pg_server, schema)
    version = _settled(idle)  # its listener runs from here
    for k in range(5):
        assert writer.write({f"other-{k}": [ev(0)]}) == {}
    assert idle.wait_changed(version, 0.5) == version  # heard nothing
    writer.ask_handoff("anything", 5.0)
    version = idle.wait_changed(version, BOUND)  # a request is heard
    with idle.watch("chat", 0) as watch:
        assert writer.write({"chat": [ev(0), ev(1)]}) == {}
        assert [watch.get(timeout=BOUND).seq for _ in range(2)] == [0, 1]
        assert writer.write({"chat": [ev(2)]}) == {}
        assert watch.get(timeout=BOUND).seq == 2
    wait_until(
        lambda: _a_commit_goes_unheard(writer, idle),
        BOUND,
        "commits stop waking the store once its last watch closed",
    )


def _settled(store: PostgresStore) -> int:
    """``store``'s change counter once it has not moved for 0.3 s (its listener has
    connected and heard what was said before)."""
    seen: list[int] = [store.wait_changed(-1, 0.0)]

    def still() -> bool:
        now = store.wait_changed(seen[-1], 0.3)
        seen.append(now)
        return now == seen[-2]

    wait_until(still, BOUND, "the store's listener settles")
    return seen[-1]


def _a_commit_goes_unheard(writer: PostgresStore, idle: PostgresStore) -> bool:
    """Commit once more to ``chat``: whether ``idle``'s change counter stayed."""
    before = idle.wait_changed(-1, 0.0)
    top = writer.load("chat")[-1].seq + 1
    assert writer.write({"chat": [ev(top)]}) == {}
    return idle.wait_changed(before, 0.3) == before


# -- every process agrees on the version ---------------------------------------------------


def test_a_v1_writer_open_before_the_migration_is_refused_and_writes_nothing(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A process of the version-1 release, open before another process migrated the
    store, is refused at its next claim, takeover or write (saying to upgrade), and
    stores nothing; its renewals and releases go through (its claims end with it)."""
    make_v1_store(pg_server, schema)
    n = names(schema)
    with pg_server.connect() as old:  # the version-1 process's connection
        old.execute(V1_CLAIM.format(**n), ("mine", n["epochs"], "c" * 32, "v1 pid 3"))
        opened(stores, pg_server, schema)  # another process migrates the store
        before = snapshot(pg_server, schema)
        refused = r"schema version 3, and this process writes as version 1.*upgrade nous_actor"
        for statement, params in (
            (V1_TAKEOVER, ("e" * 32, "v1 pid 3", "free")),
            (V1_CLAIM, ("other", n["epochs"], "d" * 32, "v1 pid 3")),
            (V1_INSERT, ("mine", 0, 1, "user_message", T0, '{"content": "x"}')),
        ):
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=refused):
                old.execute(statement.format(**n), params)
        # A transaction that says it writes another version is refused the same way.
        with old.transaction():
            old.execute("SET LOCAL nous_actor.schema_version = '4'")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="as version 4"):
                old.execute(V1_INSERT.format(**n), ("mine", 0, 1, "user_message", T0, "{}"))
        assert snapshot(pg_server, schema) == before
        # Its renewal and its release go through: the claims it holds end with it.
        old.execute(V1_RENEW.format(**n), ("mine",))
        old.execute(f"DELETE FROM {n['claims']} WHERE token = %s", ("c" * 32,))
    assert pg_server.sql(f"SELECT session_id FROM {n['claims']} ORDER BY 1") == [
        ("free",),
        ("held",),
    ]


def test_this_release_writes_claims_and_events_under_the_guard(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """Every write of this release says its version: a claim, its renewal, a takeover, a
    group write, a conflicting one (the one-by-one path), an advertisement and a
    delete all pass the guard."""
    a = opened(stores, pg_server, schema, lease=0.3)
    b = opened(stores, pg_server, schema)
    a.claim("s")
    assert a.write({"s": [ev(0), ev(1)], "t": [ev(0)]}) == {}
    refused = a.write({"s": [ev(1)], "u": [ev(0)]})
    assert isinstance(refused["s"], ConflictError)
    assert "u" not in refused
    renewals = a._leases.renewals
    wait_until(lambda: a._leases.renewals > renewals, BOUND, "a renewal")
    a.advertise("a")
    pg_server.sql(f"UPDATE \"{schema}\".claims SET lease_until = now() - interval '1 second'")
    b.claim("s")  # a takeover
    b.delete("t")
    assert b.load("s") == [ev(0), ev(1)]
    assert b.load("u") == [ev(0)]


# -- advertise and holder_address ------------------------------------------------------------


def test_an_advertised_address_is_read_by_another_store_object(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """advertise writes the address into the claims held now and every later claim;
    another store object reads it with holder_address; None takes it back."""
    a = opened(stores, pg_server, schema, holder="worker-a")
    b = opened(stores, pg_server, schema, holder="worker-b")
    a.claim("before")
    assert b.holder_address("before") == ("worker-a", None)
    a.advertise("/run/a.sock")
    assert b.holder_address("before") == ("worker-a", "/run/a.sock")
    a.claim("after")
    assert b.holder_address("after") == ("worker-a", "/run/a.sock")
    assert a.holder_address("after") == ("worker-a", "/run/a.sock")
    b.claim("theirs")
    assert a.holder_address("theirs") == ("worker-b", None)
    a.advertise(None)
    assert b.holder_address("before") == ("worker-a", None)
    assert b.holder_address("after") == ("worker-a", None)
    assert b.holder_address("nobody") is None


HOLDER_ADDRESS = """
import sys
from nous_actor.store.postgres import PostgresStore

store = PostgresStore(sys.argv[1], schema=sys.argv[2])
print(repr(store.holder_address(sys.argv[3])), flush=True)
store.close()
"""


def test_an_advertised_address_is_read_by_another_process(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """Another process reads the holder's name and its address."""
    a = opened(stores, pg_server, schema, holder="worker-a")
    a.claim("s")
    a.advertise("host-a:7000")
    proc = child(HOLDER_ADDRESS, pg_server.dsn, schema, "s")
    out, err = proc.communicate(timeout=INTERPRETER_BOUND)
    assert proc.returncode == 0, err
    assert out.strip() == repr(("worker-a", "host-a:7000"))


def test_advertise_does_not_touch_a_claim_taken_over_meanwhile(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A store that still counts a claim it lost (its lease expired, another store took
    the session) does not write its address into the new holder's row."""
    a = opened(stores, pg_server, schema, holder="worker-a")
    b = opened(stores, pg_server, schema, holder="worker-b")
    a.claim("s")
    b.advertise("b-addr")
    pg_server.sql(f"UPDATE \"{schema}\".claims SET lease_until = now() - interval '1 second'")
    b.claim("s")
    a.advertise("a-addr")
    assert a.holder_address("s") == ("worker-b", "b-addr")


def test_an_expired_lease_has_no_holder_address(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A claim whose lease ran out (by the database's clock) is nobody's: no address."""
    a = opened(stores, pg_server, schema, holder="worker-a")
    b = opened(stores, pg_server, schema)
    a.advertise("/run/a.sock")
    a.claim("s")
    assert b.holder_address("s") == ("worker-a", "/run/a.sock")
    pg_server.sql(f"UPDATE \"{schema}\".claims SET lease_until = now() - interval '1 second'")
    assert b.holder_address("s") is None
    assert a.holder_address("s") is None
    assert b.held_by("s") is None


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (7, TypeError, "address must be None or a str"),
        (b"/run/a.sock", TypeError, "address must be None or a str"),
        ("x" * 1025, ValueError, "at most 1024 characters"),
        ("a\x00b", ValueError, "NUL"),
        ("a\udc80", ValueError, "UTF-8"),
    ],
)
def test_a_bad_address_is_refused_and_changes_nothing(
    pg_server: Server,
    schema: str,
    stores: list[PostgresStore],
    bad: object,
    error: type[Exception],
    match: str,
) -> None:
    """advertise refuses what is not an address with a typed error; the address
    advertised before stays, in the rows and for later claims."""
    a = opened(stores, pg_server, schema, holder="worker-a")
    a.advertise("x" * 1024)
    a.claim("s")
    with pytest.raises(error, match=match):
        a.advertise(bad)  # type: ignore[arg-type]
    a.claim("t")
    assert a.holder_address("s") == ("worker-a", "x" * 1024)
    assert a.holder_address("t") == ("worker-a", "x" * 1024)


def test_holder_address_refuses_a_bad_id_and_a_closed_store(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """An invalid session id is a StoreError; so is every call on a closed store."""
    a = opened(stores, pg_server, schema)
    with pytest.raises(StoreError):
        a.holder_address("")
    a.close()
    for call in (
        lambda: a.holder_address("s"),
        lambda: a.advertise("x"),
        a.forwarding_key,
    ):
        with pytest.raises(StoreError, match="closed"):
            call()


# -- the store's secret -------------------------------------------------------------------------


FORWARDING_KEY = """
import sys
from nous_actor.store.postgres import PostgresStore

store = PostgresStore(sys.argv[1], schema=sys.argv[2], timeout=30)
print("ready", flush=True)
print(store.forwarding_key().hex(), flush=True)
store.close()
"""


def test_two_processes_asking_for_the_forwarding_key_at_once_get_the_same_bytes(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """Two processes make the store's key at the same moment (both held at their insert
    until released together): both get the one key that was stored, 32 bytes, and so
    does every store object opened later."""
    opened(stores, pg_server, schema).close()
    meta = f'"{schema}".meta'
    procs: list[subprocess.Popen[str]] = []
    try:
        with pg_server.connect() as blocker, blocker.transaction():
            blocker.execute(f"LOCK TABLE {meta} IN SHARE ROW EXCLUSIVE MODE")
            for _ in range(2):
                procs.append(child(FORWARDING_KEY, pg_server.dsn, schema))
            for proc in procs:
                assert read_line(proc, INTERPRETER_BOUND) == "ready"
            wait_until(
                lambda: (
                    pg_server.sql(
                        "SELECT count(*) FROM pg_locks WHERE relation = %s::regclass "
                        "AND NOT granted",
                        (meta,),
                    )[0][0]
                    == 2
                ),
                BOUND,
                "both processes wait to insert the key",
            )
        keys = [read_line(proc, BOUND) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate(timeout=BOUND)
    assert keys[0] == keys[1]
    key = bytes.fromhex(keys[0])
    assert len(key) == 32
    assert opened(stores, pg_server, schema).forwarding_key() == key
    assert pg_server.sql(f"SELECT value FROM {meta} WHERE key = 'forwarding_key'") == [(keys[0],)]


def test_a_damaged_forwarding_key_is_a_store_error(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A key row that is not 64 hex digits is refused, saying how to make a new one."""
    store = opened(stores, pg_server, schema)
    pg_server.sql(f"INSERT INTO \"{schema}\".meta VALUES ('forwarding_key', 'abc')")
    with pytest.raises(StoreError, match=r"forwarding key .* is damaged.*delete the row"):
        store.forwarding_key()


def test_a_role_that_does_not_own_the_tables_may_not_migrate_them(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A role with the rights to use a version-1 store but not to alter its tables is
    refused, saying to open it once as their owner, and nothing changes; once the owner
    opened it, that role opens and writes version 2."""
    make_v1_store(pg_server, schema)
    role = f"r_{schema}"
    pg_server.sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        pg_server.sql(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        pg_server.sql(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'
        )
        pg_server.sql(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
        params = psycopg.conninfo.conninfo_to_dict(pg_server.dsn)
        params["user"] = role
        dsn = psycopg.conninfo.make_conninfo(**params)
        before = snapshot(pg_server, schema)
        with pytest.raises(StoreError, match=r"schema version 1.*may not migrate.*owner"):
            PostgresStore(dsn, schema=schema)
        assert snapshot(pg_server, schema) == before
        opened(stores, pg_server, schema)  # the owner migrates it
        user = PostgresStore(dsn, schema=schema, holder="the role")
        try:
            user.advertise("r:1")
            user.claim("new")
            assert user.write({"new": [ev(0)]}) == {}
            assert user.holder_address("new") == ("the role", "r:1")
        finally:
            user.close()
    finally:
        pg_server.sql(f'DROP OWNED BY "{role}"')
        pg_server.sql(f'DROP ROLE "{role}"')


def test_advertise_reaches_a_claim_committed_but_not_yet_recorded(
    pg_server: Server, schema: str, stores: list[PostgresStore]
) -> None:
    """A claim whose transaction committed (with the old address) while the store has
    not yet recorded it gets the address advertised meanwhile: advertise updates the
    claims being taken too."""
    a = opened(stores, pg_server, schema, holder="worker-a")
    leases = a._leases
    committed, go_on = threading.Event(), threading.Event()
    real = leases._call

    def call_then_wait(*args: Any) -> Any:
        result = real(*args)
        committed.set()
        assert go_on.wait(BOUND)
        return result

    leases._call = call_then_wait  # type: ignore[method-assign]
    claimer = threading.Thread(target=a.claim, args=("s",))
    claimer.start()
    try:
        assert committed.wait(BOUND)
        assert a.holder_address("s") == ("worker-a", None)
        assert "s" not in leases.claims
        leases._call = real  # type: ignore[method-assign]
        a.advertise("/run/a.sock")
    finally:
        go_on.set()
        claimer.join(BOUND)
    assert a.holder_address("s") == ("worker-a", "/run/a.sock")
    assert "s" in leases.claims
