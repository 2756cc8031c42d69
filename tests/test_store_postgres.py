"""PostgresStore: the shipped Store contract, then what only a shared store does.

Runs against a real server (see tests/postgres_server.py); each test has a schema
of its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from bounds import BOUND, wait_until
from hypothesis import HealthCheck, settings

from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, FencedError, StoreError
from nous_actor.store import Store, list_sessions
from nous_actor.testing.store_contract import StoreContract, assert_same_events

if TYPE_CHECKING:
    from postgres_server import Server, Stores


# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.store.postgres import PostgresStore, PostgresWatch, _Write  # noqa: E402
from nous_actor.store.postgres.schema import BEGIN_WRITE  # noqa: E402

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)


def ev(seq: int, content: str | None = None) -> Event:
    return Event(seq, "user_message", T0, {"content": content or f"event {seq}"})


# -- the contract --------------------------------------------------------------------------


class TestPostgresStore(StoreContract):
    """PostgresStore keeps every rule of the Store contract (a fresh schema per store)."""

    server: Server

    @pytest.fixture(autouse=True)
    def _pg(self, pg_server: Server) -> Iterator[None]:
        self.server = pg_server
        self.schemas: dict[int, str] = {}
        yield
        for schema in self.schemas.values():
            pg_server.drop_schema(schema)

    def make_store(self) -> Store:
        schema = self.server.fresh_schema()
        store = PostgresStore(self.server.dsn, schema=schema)
        self.schemas[id(store)] = schema
        return store

    def close_store(self, store: Store) -> None:
        store.close()
        schema = self.schemas.pop(id(store), None)
        if schema is not None:
            self.server.drop_schema(schema)

    def machine_settings(self) -> settings:
        return settings(
            max_examples=min(settings().max_examples, 15),
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )


# -- opening: bad input is refused and changes nothing ----------------------------------------


def test_a_new_schema_is_created_with_every_table(pg_stores: Stores) -> None:
    """A missing schema becomes a store: its tables exist and it is marked as ours."""
    pg_stores()
    rows = pg_stores.server.sql(
        "SELECT key, value FROM " + f'"{pg_stores.schema}".meta ORDER BY key'
    )
    assert rows == [("application", "nous_actor"), ("schema_version", "3")]


def test_an_existing_store_opens_again_with_its_events(pg_stores: Stores) -> None:
    """A second store object on the same schema sees what the first wrote."""
    pg_stores().write({"s": [ev(0), ev(1)]})
    assert [e.seq for e in pg_stores().load("s")] == [0, 1]


def test_a_schema_of_another_application_is_refused_unchanged(pg_stores: Stores) -> None:
    """A schema with someone else's tables is refused, naming them; nothing is written."""
    server, schema = pg_stores.server, pg_stores.schema
    server.sql(f'CREATE SCHEMA "{schema}"')
    server.sql(f'CREATE TABLE "{schema}".orders (id int PRIMARY KEY, total numeric)')
    server.sql(f'CREATE TABLE "{schema}".events (x int)')
    before = server.sql(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE nspname = %s ORDER BY relname",
        (schema,),
    )
    with pytest.raises(StoreError, match=r"another application's objects.*orders.*unchanged"):
        pg_stores()
    after = server.sql(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE nspname = %s ORDER BY relname",
        (schema,),
    )
    assert after == before


def test_an_empty_schema_becomes_a_store(pg_stores: Stores) -> None:
    """A schema that exists but holds nothing (made by an administrator) is filled."""
    pg_stores.server.sql(f'CREATE SCHEMA "{pg_stores.schema}"')
    store = pg_stores()
    assert store.write({"s": [ev(0)]}) == {}


def test_a_store_of_a_newer_version_is_refused(pg_stores: Stores) -> None:
    """A schema version this release does not know is refused: upgrade, nothing changed."""
    pg_stores().close()
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".meta SET value = '99' WHERE key = 'schema_version'"
    )
    with pytest.raises(StoreError, match=r"schema version 99.*upgrade nous_actor"):
        pg_stores()


def test_create_false_refuses_a_missing_store_and_makes_nothing(pg_stores: Stores) -> None:
    """With create=False a schema without a store is refused and no schema is made."""
    with pytest.raises(StoreError, match=r"there is no nous_actor store.*create=True"):
        pg_stores(create=False)
    assert (
        pg_stores.server.sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_stores.schema,))
        == []
    )


def test_a_wrong_dsn_is_a_clear_store_error(pg_stores: Stores) -> None:
    """A DSN that is not a connection string, or names no database, is one StoreError."""
    with pytest.raises(StoreError, match="not a valid PostgreSQL connection string"):
        PostgresStore("postgresql://[broken")
    params = psycopg.conninfo.conninfo_to_dict(pg_stores.dsn)
    params["dbname"] = "no_such_database_here"
    with pytest.raises(StoreError, match=r"could not connect.*no_such_database_here"):
        PostgresStore(psycopg.conninfo.make_conninfo(**params))


def test_a_password_never_appears_in_messages(pg_stores: Stores) -> None:
    """The store names its server without the DSN's password."""
    params = psycopg.conninfo.conninfo_to_dict(pg_stores.dsn)
    params["password"] = "hunter2-secret"
    store = pg_stores()
    assert "hunter2" not in PostgresStore.__repr__(store)
    dsn = psycopg.conninfo.make_conninfo(**params)
    try:
        other = PostgresStore(dsn, schema=pg_stores.schema)
    except StoreError as exc:  # a server asking for passwords refuses it: still not shown
        assert "hunter2" not in str(exc)
    else:
        assert "hunter2" not in repr(other)
        assert "hunter2" not in other.location
        other.close()


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://agent:hunter2SECRET@[::1:5432/agents",  # libpq quotes the whole URI
        "postgresql://agent:hunter2%zzSECRET@db.internal/agents",  # ... or the bad token
        "postgresql://agent:hunter2%41SECRET@[::1/agents",  # percent-encoded in the quote
        "host=x password='hunter2 SECRET' port",
    ],
)
def test_a_password_never_appears_in_the_refusal_of_a_malformed_dsn(dsn: str) -> None:
    """libpq's words about a string it cannot parse may quote it: the password is
    redacted (no server is asked)."""
    with pytest.raises(StoreError, match="not a valid PostgreSQL connection string") as err:
        PostgresStore(dsn, timeout=1.0)
    assert "hunter2" not in str(err.value)
    assert "SECRET" not in str(err.value)


def test_a_role_without_schema_rights_is_refused_unchanged(pg_stores: Stores) -> None:
    """A role that may not create the schema gets a StoreError saying what to grant."""
    server = pg_stores.server
    role = f"r_{pg_stores.schema}"
    server.sql(f'CREATE ROLE "{role}" LOGIN')
    try:
        server.sql(f'REVOKE CREATE ON DATABASE "{_dbname(server)}" FROM PUBLIC')
        params = psycopg.conninfo.conninfo_to_dict(server.dsn)
        params["user"] = role
        dsn = psycopg.conninfo.make_conninfo(**params)
        with pytest.raises(StoreError, match=r"InsufficientPrivilege.*grant it"):
            PostgresStore(dsn, schema=pg_stores.schema)
        assert (
            server.sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_stores.schema,)) == []
        )
    finally:
        server.sql(f'DROP ROLE "{role}"')


def _dbname(server: Server) -> str:
    return str(server.sql("SELECT current_database()")[0][0])


def test_bad_arguments_are_value_errors() -> None:
    """A schema name too long for its channel, or a lease of 0, is refused before connecting."""
    with pytest.raises(ValueError, match="1 to 52 bytes"):
        PostgresStore("dbname=x", schema="s" * 64)
    with pytest.raises(ValueError, match="lease"):
        PostgresStore("dbname=x", lease=0)


# -- data -------------------------------------------------------------------------------------


def test_data_is_stored_as_json_text(pg_stores: Stores) -> None:
    """The data column is the codec's JSON text, so every JSON type loads back as written."""
    store = pg_stores()
    store.write({"s": [Event(0, "turn_start", T0, {"x": -0.0, "y": 1e308, "z": "\x00"})]})
    (data,) = pg_stores.server.sql(f'SELECT data FROM "{pg_stores.schema}".events')[0]
    assert data == '{"x":-0.0,"y":1e308,"z":"\\u0000"}'
    assert_same_events(
        store.load("s"), [Event(0, "turn_start", T0, {"x": -0.0, "y": 1e308, "z": "\x00"})]
    )


def test_list_sessions_uses_the_index(pg_stores: Stores) -> None:
    """list_sessions reads sizes, next seqs and times in one query."""
    store = pg_stores()
    store.write({"a": [ev(0), ev(1)], "b": [Event(3, "turn_end", T0 + timedelta(days=1), {})]})
    infos = list_sessions(store)
    assert [(i.session_id, i.events, i.next_seq, i.last_time) for i in infos] == [
        ("a", 2, 2, T0),
        ("b", 1, 4, T0 + timedelta(days=1)),
    ]


def test_a_readers_count_decodes_no_event(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SessionReader.count()`` (what a web worker asks at each request) is one read of
    the index: no row is decoded, however long the session (it loaded them all)."""
    from nous_actor import SessionReader
    from nous_actor.store.postgres import store as store_module

    store = pg_stores()
    store.write({"a": [ev(s) for s in range(50)], "b": [ev(7)]})
    decoded: list[int] = []
    real = store_module.event_from_row

    def counting(*row: Any) -> Event:
        decoded.append(row[0])
        return real(*row)

    monkeypatch.setattr(store_module, "event_from_row", counting)
    assert [SessionReader(sid, store).count().get(timeout=30) for sid in "abc"] == [50, 8, 0]
    assert store.next_seq("a") == 50
    assert decoded == []
    assert len(SessionReader("a", store).events().get(timeout=30)) == 50  # reads still do
    assert len(decoded) == 50


# -- claims, leases and fencing across store objects ------------------------------------------


def test_a_claim_is_refused_naming_the_holder(pg_stores: Stores) -> None:
    """A second store's claim fails with a ConflictError naming the holder and its lease."""
    a = pg_stores(holder="worker-a:8080")
    b = pg_stores(holder="worker-b:8080")
    a.claim("s")
    with pytest.raises(ConflictError, match="worker-a:8080 holds its lease until") as info:
        b.claim("s")
    assert info.value.holder == "worker-a:8080"
    assert info.value.lease_until is not None
    assert info.value.lease_until > datetime.now(UTC)
    assert b.holder_of("s") == ("worker-a:8080", info.value.lease_until)


def test_an_unclaimed_write_is_refused_while_another_writer_holds_the_lease(
    pg_stores: Stores,
) -> None:
    """Writing a session that another store holds is a ConflictError; nothing is stored."""
    a, b = pg_stores(), pg_stores()
    a.claim("s")
    refused = b.write({"s": [ev(0)], "t": [ev(0)]})
    assert set(refused) == {"s"}
    assert type(refused["s"]) is ConflictError
    assert b.load("s") == []
    assert len(b.load("t")) == 1


def test_a_takeover_after_the_lease_expired_fences_the_old_writer(pg_stores: Stores) -> None:
    """Once its lease expired and another store claimed, the old writer stores nothing."""
    a, b = pg_stores(), pg_stores()
    a.claim("s")
    assert a.write({"s": [ev(0)]}) == {}
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".claims SET lease_until = now() - interval '1 second'"
    )
    b.claim("s")
    refused = a.write({"s": [ev(1, "old writer")]})
    assert isinstance(refused["s"], FencedError)
    assert "took it over" in str(refused["s"])
    assert "nothing of this write was stored" in str(refused["s"])
    assert b.write({"s": [ev(1, "new writer")]}) == {}
    assert [e.data["content"] for e in b.load("s")] == ["event 0", "new writer"]
    again = a.write({"s": [ev(2)]})
    assert isinstance(again["s"], FencedError)


def _statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement a connection sends from now on (each one a round trip)."""
    import psycopg

    sent: list[str] = []
    real = psycopg.Connection.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(" ".join(str(query).split())[:40])
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counting)
    return sent


def test_a_write_that_the_fence_lets_through_is_three_round_trips(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Begin, one statement (fence, rows, call records, wake-ups), commit: however many
    sessions, claimed or not, and with forwarded calls recorded."""
    a = pg_stores()
    a.claim("s")
    a.claim("t")
    sent = _statements(monkeypatch)
    assert a.write({"s": [ev(0), ev(1)], "t": [ev(0)], "u": [ev(0)]}) == {}
    assert len(sent) == 3, sent
    sent.clear()
    assert a.write({"s": [ev(2)]}, calls={"s": [("call-1", 2, 2)]}) == {}
    assert len(sent) == 3, sent
    assert a.applied_call("s", "call-1") == (2, 2)
    assert [e.seq for e in a.load("s")] == [0, 1, 2]
    assert [len(a.load(sid)) for sid in "tu"] == [1, 1]


def test_a_write_with_a_refused_session_keeps_nothing_of_its_first_try(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement try inserts every session's rows; when the fence refuses one,
    that try is rolled back whole and the write goes step by step: the refused
    session stores nothing (nor its call records), the others everything, once."""
    a, b = pg_stores(), pg_stores()
    b.claim("held")
    sent = _statements(monkeypatch)
    refused = a.write(
        {"held": [ev(0, "not mine")], "free": [ev(0)]},
        calls={"held": [("c-held", 0, 0)], "free": [("c-free", 0, 0)]},
    )
    assert set(refused) == {"held"}
    assert type(refused["held"]) is ConflictError
    assert len(sent) > 3  # tried at once, then step by step
    assert b.load("held") == []
    assert [e.seq for e in b.load("free")] == [0]
    assert a.applied_call("held", "c-held") is None
    assert a.applied_call("free", "c-free") == (0, 0)


@contextlib.contextmanager
def _behind_a_takeover(stores: Stores, sid: str, work: Callable[[], Any]) -> Iterator[list[Any]]:
    """``work()`` in a thread while another transaction holds ``sid``'s claim row ``FOR
    UPDATE``, as a takeover does; the block runs once ``work`` waits for that row, and
    ``work``'s result is in the list yielded once the takeover has rolled back."""
    server, schema = stores.server, stores.schema
    takeover = server.connect()
    takeover.autocommit = False
    takeover.execute(f'SELECT 1 FROM "{schema}".claims WHERE session_id = %s FOR UPDATE', (sid,))
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(work()))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.sql(
            "SELECT 1 FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
        ):  # work waits for the takeover's transaction
            assert time.monotonic() < deadline, "the work never waited for the claim row"
            assert thread.is_alive()
            time.sleep(0.005)
        yield done
    finally:
        takeover.rollback()
        takeover.close()
        thread.join(30)
    assert not thread.is_alive()


def _locked(stores: Stores, sid: str) -> bool:
    """Whether another transaction holds a lock on ``sid``'s claim row now."""
    import psycopg

    with stores.server.connect() as conn:
        try:
            conn.execute(
                f'SELECT 1 FROM "{stores.schema}".claims WHERE session_id = %s FOR UPDATE NOWAIT',
                (sid,),
            )
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_a_write_locks_its_claim_rows_before_it_inserts_a_row(pg_stores: Stores) -> None:
    """The one-statement write takes its claim rows' locks before inserting anything, as
    the step-by-step write does: while a takeover holds one session's claim row, the
    write waits holding no row of any session. (Rows inserted before that lock would let
    the new holder's write and this one each wait for a row of the other: a deadlock.)"""
    a = pg_stores()
    a.claim("s0")
    a.claim("s1")

    def write() -> dict[str, StoreError]:
        return a.write({"s0": [ev(0)], "s1": [ev(0)]})

    with _behind_a_takeover(pg_stores, "s1", write) as done, pg_stores.server.connect() as other:
        other.execute("SET lock_timeout = '2s'")
        other.execute(BEGIN_WRITE)
        other.execute(  # the row the write would insert: nothing holds it
            f'INSERT INTO "{pg_stores.schema}".events (session_id, seq, epoch, type, time, '
            "data) VALUES ('s0', 0, 0, 'user_message', now(), '{}')"
        )
        other.execute("COMMIT")
    assert set(done[0]) == {"s0"}  # its row was taken meanwhile: a conflict, s0 alone
    assert type(done[0]["s0"]) is ConflictError
    assert [e.seq for e in a.load("s1")] == [0]


def test_a_write_locks_its_claim_rows_in_session_id_order(pg_stores: Stores) -> None:
    """The fence locks the claim rows in session id order, the order a batch of claims
    locks them: blocked at "s1" by a takeover, a write of "s1" and "s0" (claimed in
    that order, so stored in it) already holds "s0". In the rows' stored order it would
    hold nothing, and a batch of claims holding "s0" and waiting for "s1" would wait
    for it as it waits for "s1": a deadlock the server ends by failing one of them."""
    a = pg_stores()
    a.claim("s1")
    a.claim("s0")

    def write() -> dict[str, StoreError]:
        return a.write({"s1": [ev(0)], "s0": [ev(0)]})

    with _behind_a_takeover(pg_stores, "s1", write) as done:
        assert _locked(pg_stores, "s0")
    assert done == [{}]
    assert [len(a.load(sid)) for sid in ("s0", "s1")] == [1, 1]


def test_a_lease_renewal_locks_its_claim_rows_in_session_id_order(pg_stores: Stores) -> None:
    """A renewal locks its claim rows in session id order, as a batch of claims and a
    write do: blocked at "s1", a renewal of "s1" and "s0" (claimed in that order)
    already holds "s0"."""
    a = pg_stores()
    a.claim("s1")
    a.claim("s0")
    items = sorted(a._leases.claims.items(), reverse=True)  # ("s1", ...), ("s0", ...)
    with _behind_a_takeover(pg_stores, "s1", lambda: a._leases._renew(items)[0]) as done:
        assert _locked(pg_stores, "s0")
    assert done == [{"s0", "s1"}]


def test_advertising_an_address_locks_the_claim_rows_in_session_id_order(
    pg_stores: Stores,
) -> None:
    """Writing the store's address into its claim rows locks them in session id order:
    blocked at "s1", an address written into "s1" and "s0" (claimed in that order)
    already holds "s0"; then both rows carry it."""
    a = pg_stores()
    a.claim("s1")
    a.claim("s0")
    with _behind_a_takeover(pg_stores, "s1", lambda: a._leases.advertise("there")) as done:
        assert _locked(pg_stores, "s0")
    assert done == [None]
    rows = pg_stores.server.sql(
        f'SELECT session_id, address FROM "{pg_stores.schema}".claims ORDER BY session_id'
    )
    assert [tuple(r) for r in rows] == [("s0", "there"), ("s1", "there")]


def test_giving_every_claim_up_locks_the_claim_rows_in_session_id_order(
    pg_stores: Stores,
) -> None:
    """A closing store gives up its claims in one statement that locks their rows in
    session id order: blocked at "s1", it already holds "s0"; then both rows are gone
    and another store claims both at once."""
    a, b = pg_stores(), pg_stores()
    a.claim("s1")
    a.claim("s0")
    with _behind_a_takeover(pg_stores, "s1", a._leases.release_all) as done:
        assert _locked(pg_stores, "s0")
    assert done == [None]
    assert pg_stores.server.sql(f'SELECT session_id FROM "{pg_stores.schema}".claims') == []
    assert all(type(t) is str for t in b.claim_many(["s0", "s1"]))


# -- many claims in one transaction (the opens of many sessions at once) -----------------------


def test_claim_many_answers_each_id_in_order_as_claim_would(pg_stores: Stores) -> None:
    """One batch holding a new id, an expired lease, a dead holder's live lease, a live
    holder's, one held here and an id given twice: each gets what claim gives it, the
    claims taken fence their old writers, and the refused ones change nothing."""
    a = pg_stores(lease=30, holder="live-one")
    doomed = pg_stores(lease=30, holder="doomed")
    b = pg_stores(lease=30)
    a.claim("live")
    a.claim("expired")
    doomed.claim("dead")
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".claims SET lease_until = now() - interval '1 second' "
        "WHERE session_id = 'expired'"
    )
    _dies(pg_stores, doomed)
    mine = b.claim("mine")
    epochs_before = dict(
        pg_stores.server.sql(f'SELECT session_id, epoch FROM "{pg_stores.schema}".claims')
    )
    got = b.claim_many(["new", "live", "expired", "mine", "dead", "new"])
    assert [type(g).__name__ for g in got] == [
        "str", "ConflictError", "str", "ConflictError", "str", "ConflictError"
    ]  # fmt: skip
    assert "live-one holds its lease until" in str(got[1])
    assert got[1].session_id == "live"  # type: ignore[union-attr]
    assert "through this store object" in str(got[3])
    rows = dict(pg_stores.server.sql(f'SELECT session_id, token FROM "{pg_stores.schema}".claims'))
    assert rows["new"] == got[0]
    assert rows["expired"] == got[2]
    assert rows["dead"] == got[4]
    assert rows["mine"] == mine
    epochs = dict(
        pg_stores.server.sql(f'SELECT session_id, epoch FROM "{pg_stores.schema}".claims')
    )
    assert epochs["live"] == epochs_before["live"]  # refused: untouched
    assert epochs["expired"] > max(epochs_before.values())
    assert isinstance(a.write({"expired": [ev(0)]})["expired"], FencedError)
    assert isinstance(doomed.write({"dead": [ev(0)]})["dead"], FencedError)
    assert b.write({sid: [ev(0)] for sid in ("new", "expired", "dead", "mine")}) == {}
    assert a.write({"live": [ev(0)]}) == {}
    # The new claims hold their locks: when b dies, each is taken at once.
    _dies(pg_stores, b)
    c = pg_stores(lease=30)
    assert all(isinstance(t, str) for t in c.claim_many(["new", "expired", "dead"]))
    assert b.claim_many([]) == []
    with pytest.raises(StoreError, match="session id"):
        c.claim_many(["fine", ""])  # nothing is claimed
    for bad in ("fine", 5):
        with pytest.raises(StoreError, match="expected a list of session ids"):
            c.claim_many(bad)  # type: ignore[arg-type]
        with pytest.raises(StoreError, match="expected a list of session ids"):
            c.load_many(bad)  # type: ignore[arg-type]
    c.claim("fine")


def test_claim_many_reads_a_claim_of_its_own_whose_answer_was_lost_as_its_own(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run again after a lost connection, the batch finds rows holding its own tokens
    (its commit had landed): those are its claims, not another writer's."""
    import nous_actor.store.postgres.leases as leases_module

    store = pg_stores(lease=30)
    real = leases_module._Leases._take_many
    cut: list[int] = []
    epochs: dict[str, int] = {}
    schema = pg_stores.schema

    def lossy(self: Any, conn: Any, todo: dict[str, str]) -> Any:
        if not cut:  # the first attempt commits, and its answer never arrives
            cut.append(1)
            real(self, conn, todo)
            epochs.update(pg_stores.server.sql(f'SELECT session_id, epoch FROM "{schema}".claims'))
            pg_stores.server.terminate(pid=conn.info.backend_pid)
            raise psycopg.OperationalError("the connection was lost (test)")
        return real(self, conn, todo)

    monkeypatch.setattr(leases_module._Leases, "_take_many", lossy)
    got = store.claim_many(["x", "y"])
    assert cut
    assert all(isinstance(t, str) for t in got)
    rows = dict(pg_stores.server.sql(f'SELECT session_id, token FROM "{pg_stores.schema}".claims'))
    assert [rows["x"], rows["y"]] == got
    # Its own claims, as they committed: not taken over again under a new epoch.
    assert dict(pg_stores.server.sql(f'SELECT session_id, epoch FROM "{schema}".claims')) == epochs
    assert store.write({"x": [ev(0)], "y": [ev(0)]}) == {}


def test_a_batch_that_meets_a_lock_wait_claims_each_id_alone(pg_stores: Stores) -> None:
    """A claim row locked by another transaction past the claim's wait fails the batch's
    transaction: every other id is still claimed, and only that one is refused."""
    a, b = pg_stores(lease=30), pg_stores(lease=30)
    a.claim("locked")
    _expire_all(pg_stores)
    b._leases.claim_wait_ms = 200
    with pg_stores.server.connect() as blocker:
        blocker.execute("BEGIN")
        blocker.execute(
            f'SELECT 1 FROM "{pg_stores.schema}".claims WHERE session_id = %s FOR UPDATE',
            ("locked",),
        )
        got = b.claim_many(["one", "locked", "two"])
        blocker.execute("ROLLBACK")
    assert isinstance(got[0], str)
    assert isinstance(got[2], str)
    assert type(got[1]) is StoreError
    assert b.write({"one": [ev(0)], "two": [ev(0)]}) == {}
    assert isinstance(b.claim("locked"), str)  # once the lock is gone


def test_concurrent_batches_claim_each_id_once(pg_stores: Stores) -> None:
    """Four stores claim overlapping batches at once: each id is claimed by exactly one,
    the others are refused with ConflictError (no deadlock, no other error)."""
    stores = [pg_stores(lease=30) for _ in range(4)]
    ids = [f"s{i}" for i in range(40)]
    results: dict[int, list[Any]] = {}
    barrier = threading.Barrier(len(stores))

    def claim(k: int) -> None:
        batch = ids[k * 5 :] + ids[: k * 5]  # each in its own order
        barrier.wait(timeout=10)
        results[k] = list(zip(batch, stores[k].claim_many(batch), strict=True))

    threads = [threading.Thread(target=claim, args=(k,)) for k in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == len(stores)
    winners: dict[str, int] = {}
    for k, pairs in results.items():
        for sid, got in pairs:
            if isinstance(got, str):
                assert sid not in winners
                winners[sid] = k
            else:
                assert type(got) is ConflictError, got
    assert sorted(winners) == sorted(ids)
    for sid, k in winners.items():
        assert stores[k].write({sid: [ev(0)]}) == {}


def test_load_many_equals_load_for_each_session(pg_stores: Stores) -> None:
    """load_many gives each id what load gives it (an unknown id: no events); a malformed
    row fails its own session alone."""
    store = pg_stores()
    ids = [f"s{i}" for i in range(5)]
    assert store.write({sid: [ev(k, f"{sid} {k}") for k in range(4)] for sid in ids}) == {}
    got = store.load_many([*ids, "nobody", ids[0]])
    assert set(got) == {*ids, "nobody"}
    for sid in ids:
        assert got[sid] == store.load(sid)
    assert got["nobody"] == []
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".events SET type = 'no_such_type' "
        "WHERE session_id = 's2' AND seq = 1"
    )
    again = store.load_many(ids)
    assert isinstance(again["s2"], StoreError)
    assert "malformed" in str(again["s2"])
    assert [again[sid] == got[sid] for sid in ids] == [True, True, False, True, True]


def test_epochs_only_grow(pg_stores: Stores) -> None:
    """Each claim of a session gets a higher epoch than any before, also after a delete."""
    store = pg_stores()
    seen = []
    for _ in range(3):
        token = store.claim("s")
        seen.append(store._leases.epoch_of("s"))
        store.release("s", token)
    store.claim("s")
    store.delete("s")
    store.claim("s")
    seen.append(store._leases.epoch_of("s"))
    assert seen == sorted(set(seen))


def test_a_dead_holders_claim_is_taken_over_at_once(pg_stores: Stores) -> None:
    """When the holder's lease connection is gone (its process died), a claim takes over
    at once instead of waiting for the lease."""
    a = pg_stores(lease=30, holder="doomed")
    b = pg_stores(lease=30)
    a.claim("s")
    with pytest.raises(ConflictError):
        b.claim("s")
    _dies(pg_stores, a)
    b.claim("s")
    assert isinstance(a.write({"s": [ev(0)]})["s"], FencedError)


def test_a_writer_that_took_over_from_a_live_lock_holder_is_not_taken_for_dead(
    pg_stores: Stores,
) -> None:
    """B takes over A's expired lease while A's connection still holds the session's lock;
    once A lets go, a third claimer must not read the free lock as B's death."""
    a, b, c = pg_stores(lease=30), pg_stores(lease=30), pg_stores(lease=30)
    token = a.claim("s")
    _expire_all(pg_stores)
    b.claim("s")
    a.release("s", token)  # A's lock goes; B never had it
    with pytest.raises(ConflictError):
        c.claim("s")


def test_a_writer_that_took_over_from_a_paused_holder_is_taken_over_at_once_when_it_dies(
    pg_stores: Stores,
) -> None:
    """B takes over A's expired lease while A (paused, not dead) still holds its lock; when
    B's process dies before any renewal, a third claim takes B's claim over at once."""
    a, b, c = pg_stores(lease=30), pg_stores(lease=30), pg_stores(lease=30)
    a.claim("s")
    _expire_all(pg_stores)  # A stalls past its lease; its connection and lock live on
    b.claim("s")
    _dies(pg_stores, b)
    c.claim("s")
    assert isinstance(b.write({"s": [ev(0)]})["s"], FencedError)


def _dies(stores: Stores, store: Any) -> None:
    """``store``'s process dies, as far as its claims go: its lease renewer stops, and its
    lease connection closes (the server drops the claims' locks with it; returns once it
    has). The store object stays, as a paused writer coming back would, so that a test
    can show its late writes are fenced. (Terminating the lease backend of a live store
    is no death: its renewer takes its locks back at once.)"""
    leases = store._leases
    ended = threading.Event()
    ended.set()
    leases.closing = ended  # the renewer's alone: the store's calls go on
    wake, thread = leases.wake, leases.thread
    if wake is not None:
        wake[1].send(b"x")
    if thread is not None:
        thread.join(BOUND)
        assert not thread.is_alive()
    with leases.mutex:
        keys = [leases._key(sid, c.token) for sid, c in leases.claims.items()]
    with leases.link.lock:
        leases.link.drop()
    with stores.server.connect() as conn:  # each lock is free once the server saw it close
        conn.execute(f"SET lock_timeout = '{BOUND:g}s'")
        for key in keys:
            conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def _expire_all(stores: Stores) -> None:
    stores.server.sql(
        f"UPDATE \"{stores.schema}\".claims SET lease_until = now() - interval '1 second'"
    )


def test_without_dead_holder_detection_a_live_lease_is_kept(pg_stores: Stores) -> None:
    """With detect_dead_holders=False only the lease's expiry frees a session."""
    a = pg_stores(lease=30)
    b = pg_stores(lease=30, detect_dead_holders=False)
    a.claim("s")
    _dies(pg_stores, a)
    with pytest.raises(ConflictError):
        b.claim("s")


def test_leases_are_renewed_in_the_background(pg_stores: Stores) -> None:
    """A claim outlives its lease length while the store is open: the renewer extends it."""
    a, b = pg_stores(lease=1.0), pg_stores(lease=1.0, detect_dead_holders=False)
    a.claim("s")
    first = a._leases.renewals
    deadline = time.monotonic() + 10
    while a._leases.renewals < first + 4:  # four renewals: longer than one lease
        assert time.monotonic() < deadline, "the lease was not renewed"
        a._closing.wait(0.05)
    with pytest.raises(ConflictError):
        b.claim("s")
    assert a.write({"s": [ev(0)]}) == {}


def test_a_lease_that_cannot_be_renewed_fails_closed(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If renewals fail, writes are refused (StoreError) before the lease runs out, and
    from then on, until a renewal finds the lease unchanged: then they are stored again.
    (Failed closed 2 s after the last renewal began, the lease runs out 1 s later: the
    renewals, retried every 0.25 s, find it live.)"""
    store = pg_stores(lease=3)
    store.claim("s")
    assert store.write({"s": [ev(0)]}) == {}
    failing = threading.Event()

    def broken_renew(*args: Any) -> Any:
        failing.set()
        raise StoreError("renewal is down (test)")

    monkeypatch.setattr(store._leases, "_renew", broken_renew)
    assert failing.wait(10)
    claim = store._leases.get("s")
    assert claim is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < claim.deadline:
        assert time.monotonic() < deadline
        store._closing.wait(0.05)
    (until,) = pg_stores.server.sql(
        f'SELECT lease_until > clock_timestamp() FROM "{pg_stores.schema}".claims'
    )[0]
    assert until, "failed closed only after the lease ran out"
    refused = store.write({"s": [ev(1)]})
    assert type(refused["s"]) is StoreError
    assert "failed closed before the lease ran out" in str(refused["s"])
    assert [e.seq for e in store.load("s")] == [0]
    renewals = store._leases.renewals
    monkeypatch.undo()
    wait_until(lambda: store._leases.renewals > renewals, BOUND, "a renewal")
    assert store.write({"s": [ev(1)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1]


def test_drop_and_delete_are_fenced_too(pg_stores: Stores) -> None:
    """A writer whose claim was taken over cannot drop events; another store cannot
    delete a session someone holds."""
    a, b = pg_stores(), pg_stores()
    a.claim("s")
    a.write({"s": [ev(0), ev(1)]})
    with pytest.raises(ConflictError, match="another writer holds"):
        b.delete("s")
    pg_stores.server.sql(
        f"UPDATE \"{pg_stores.schema}\".claims SET lease_until = now() - interval '1 second'"
    )
    b.claim("s")
    with pytest.raises(FencedError):
        a.drop("s", [0])
    assert [e.seq for e in b.load("s")] == [0, 1]


def test_a_dead_holders_session_can_be_deleted_at_once(pg_stores: Stores) -> None:
    """Delete, like claim, treats a live lease whose holder's connection is gone as free:
    the session and its claim are deleted, and the dead writer is fenced."""
    a = pg_stores(lease=30, holder="doomed")
    b = pg_stores(lease=30)
    a.claim("s")
    assert a.write({"s": [ev(0), ev(1)]}) == {}
    _dies(pg_stores, a)
    b.delete("s")
    assert b.load("s") == []
    assert b.holder_of("s") is None
    assert isinstance(a.write({"s": [ev(2)]})["s"], FencedError)


def test_a_session_whose_holder_process_was_killed_can_be_deleted(
    pg_stores: Stores, pg_workers: Any
) -> None:
    """A holder in another process killed with SIGKILL: delete succeeds once the server
    has dropped its connection, without waiting for the lease."""
    worker = pg_workers(lease=60)
    assert worker.ask(op="claim", sid="s") == {"ok": True}
    assert worker.ask(op="write", sid="s", seqs=[0, 1], tag="w") == {"refused": {}}
    store = pg_stores(lease=60)
    with pytest.raises(ConflictError, match="another writer holds"):
        store.delete("s")
    worker.kill()
    _wait_until_the_session_lock_is_free(pg_stores, store, "s")
    store.delete("s")
    assert store.load("s") == []
    assert store.holder_of("s") is None
    store.claim("s")
    claim = store._leases.get("s")
    assert claim is not None
    assert claim.locked


def _wait_until_the_session_lock_is_free(stores: Stores, store: Any, sid: str) -> None:
    """Block (at most 10 s) until no connection holds the advisory lock of the session's
    claim: the server has seen its holder's connection close."""
    ((token,),) = stores.server.sql(
        f'SELECT token FROM "{stores.schema}".claims WHERE session_id = %s', (sid,)
    )
    key = store._leases._key(sid, token)
    with stores.server.connect() as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (key,))
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def test_without_dead_holder_detection_delete_keeps_a_live_lease(pg_stores: Stores) -> None:
    """With detect_dead_holders=False, delete, like claim, waits for the lease to expire."""
    a = pg_stores(lease=30)
    b = pg_stores(lease=30, detect_dead_holders=False)
    a.claim("s")
    a.write({"s": [ev(0)]})
    _dies(pg_stores, a)
    with pytest.raises(ConflictError, match="another writer holds"):
        b.delete("s")
    assert [e.seq for e in b.load("s")] == [0]


def test_delete_leaves_no_lock_on_the_deleting_connection(pg_stores: Stores) -> None:
    """The lock delete takes to test a holder's death ends with its transaction: a claim
    made afterwards through another store holds the session's lock (so its own death
    would be seen)."""
    a, b, c = pg_stores(lease=30), pg_stores(lease=30), pg_stores(lease=30)
    a.claim("s")
    _dies(pg_stores, a)
    b.delete("s")
    c.claim("s")
    claim = c._leases.get("s")
    assert claim is not None
    assert claim.locked


def test_close_releases_the_stores_claims(pg_stores: Stores) -> None:
    """Closing a store gives its claims up, so another store claims them at once."""
    a = pg_stores(detect_dead_holders=False)
    b = pg_stores(detect_dead_holders=False)
    a.claim("s")
    a.close()
    b.claim("s")


def test_a_forgotten_store_stops_its_threads(pg_stores: Stores) -> None:
    """A store that is garbage-collected without close() ends its renewer and connections."""
    import gc

    store = PostgresStore(pg_stores.dsn, schema=pg_stores.schema)
    store.claim("s")
    thread = store._leases.thread
    assert thread is not None
    assert thread.is_alive()
    watchdog = store._ctx.watchdog
    assert watchdog.running
    del store
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()
    wait_until(lambda: not watchdog.running, 10, "the store's watchdog thread ended")
    pg_stores(detect_dead_holders=True).claim("s")  # its lock went with its connection


# -- lost connections --------------------------------------------------------------------------


def test_a_terminated_connection_is_reopened_and_nothing_is_lost(pg_stores: Stores) -> None:
    """pg_terminate_backend on the store's connection: the next calls reconnect and work."""
    store = pg_stores()
    store.claim("s")
    assert store.write({"s": [ev(0)]}) == {}
    assert pg_stores.server.terminate(application_name="nous_actor") >= 1
    assert store.write({"s": [ev(1)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1]
    assert store._main.reconnects >= 1


def test_a_server_restart_is_survived(pg_stores: Stores) -> None:
    """After the server restarts, reads and writes reconnect; what was acknowledged is there."""
    store = pg_stores()
    store.claim("s")
    assert store.write({"s": [ev(0)]}) == {}
    pg_stores.server.restart()
    assert store.write({"s": [ev(1)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1]


def test_a_write_during_an_outage_lands_once_the_server_is_back(pg_stores: Stores) -> None:
    """A write sent while the server is down waits (reconnecting with backoff) and is
    stored once the server is back within the timeout; nothing acknowledged is lost."""
    store = pg_stores(timeout=30)
    assert store.write({"s": [ev(0)]}) == {}
    pg_stores.server.down()
    results: list[Any] = []
    try:

        def write() -> None:
            try:
                results.append(store.write({"s": [ev(1)]}))
            except BaseException as exc:  # reported below, in the test's thread
                results.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        assert not _done_within(writer, 0.5), "the write gave up while the server was down"
    finally:
        pg_stores.server.up()
    writer.join(30)
    assert results == [{}]
    assert [e.seq for e in store.load("s")] == [0, 1]


def _done_within(thread: threading.Thread, seconds: float) -> bool:
    thread.join(seconds)
    return not thread.is_alive()


def test_an_unreachable_server_is_retried_then_a_store_error_within_the_timeout(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the server does not answer, a call keeps reconnecting with backoff, then
    fails with StoreError once `timeout` has passed; the next call tries again."""
    store = pg_stores(timeout=0.6)
    attempts = []

    def refuse(deadline: float) -> Any:
        attempts.append(time.monotonic())
        raise psycopg.OperationalError("connection refused (test)")

    store._main.drop()
    monkeypatch.setattr(store._main, "_connect", refuse)
    started = time.monotonic()
    with pytest.raises(StoreError, match="could not reconnect in time"):
        store.write({"s": [ev(0)]})
    elapsed = time.monotonic() - started
    assert 0.5 < elapsed < 5
    assert len(attempts) >= 3, "no backoff retries"
    monkeypatch.undo()
    assert store.write({"s": [ev(0)]}) == {}


def _cut_after_commit(conn: Any) -> None:
    """Send COMMIT, then cut the socket before its answer can be read."""
    import socket

    conn.pgconn.send_query(b"COMMIT")
    conn.pgconn.flush()
    sock = socket.socket(fileno=conn.fileno())
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()


def test_a_commit_whose_answer_was_lost_is_read_back(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connection lost during COMMIT: the outcome is read back from the server; an
    acknowledged write is stored exactly once, never reported lost or stored twice."""
    from nous_actor.store import postgres

    store = pg_stores()
    store.claim("s")
    real = _Write._commit
    calls = []

    def lossy(self: _Write, conn: Any, xid: str) -> None:
        calls.append(xid)
        if len(calls) == 1:
            _cut_after_commit(conn)
            raise postgres._Unknown(xid, psycopg.OperationalError("cut (test)"))
        real(self, conn, xid)

    monkeypatch.setattr(_Write, "_commit", lossy)
    assert store.write({"s": [ev(0), ev(1)], "t": [ev(0)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1]
    assert [e.seq for e in store.load("t")] == [0]


def test_a_commit_that_never_reached_the_server_is_retried(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connection lost before the server got COMMIT: read back as not committed, written
    again, stored once."""
    from nous_actor.store import postgres

    store = pg_stores()
    real = _Write._commit
    calls = []

    def lost(self: _Write, conn: Any, xid: str) -> None:
        calls.append(xid)
        if len(calls) == 1:
            pg_stores.server.terminate(pid=conn.info.backend_pid)
            raise postgres._Unknown(xid, psycopg.OperationalError("terminated (test)"))
        real(self, conn, xid)

    monkeypatch.setattr(_Write, "_commit", lost)
    assert store.write({"s": [ev(0)]}) == {}
    assert len(calls) == 2
    assert [e.seq for e in store.load("s")] == [0]


# -- watching -----------------------------------------------------------------------------------


def _take(watch: PostgresWatch, n: int) -> list[int]:
    return [watch.get(10).seq for _ in range(n)]


def test_a_watch_catches_up_then_follows_live(pg_stores: Stores) -> None:
    """A watch gives the stored events from from_seq, then each new commit, in order."""
    writer, reader = pg_stores(), pg_stores()
    writer.write({"s": [ev(i) for i in range(5)]})
    with reader.watch("s", from_seq=2) as watch:
        assert _take(watch, 3) == [2, 3, 4]
        writer.write({"s": [ev(5), ev(6)], "other": [ev(0)]})
        writer.write({"s": [ev(7)]})
        assert _take(watch, 3) == [5, 6, 7]
        assert watch.get_nowait() is None


def test_a_slow_watcher_is_never_cut_off_and_reads_everything_once(pg_stores: Stores) -> None:
    """With a buffer far smaller than the backlog, a watcher still reads every event once."""
    writer, reader = pg_stores(), pg_stores()
    watch = reader.watch("s", buffer=8)
    for start in range(0, 400, 50):
        writer.write({"s": [ev(i) for i in range(start, start + 50)]})
    assert watch.pending() <= 8
    assert _take(watch, 400) == list(range(400))
    watch.close()


def test_a_watch_resumes_after_its_connection_is_terminated(pg_stores: Stores) -> None:
    """Killing the listener's connection loses no event and repeats none."""
    writer, reader = pg_stores(), pg_stores()
    watch = reader.watch("s")
    writer.write({"s": [ev(0)]})
    assert _take(watch, 1) == [0]
    listener = reader._listeners[0]
    conn = listener.link.conn
    assert conn is not None
    pg_stores.server.terminate(pid=conn.info.backend_pid)
    writer.write({"s": [ev(1), ev(2)]})
    writer.write({"s": [ev(3)]})
    assert _take(watch, 3) == [1, 2, 3]
    assert watch.get_nowait() is None


def test_a_watch_ends_with_store_error_when_its_store_closes(pg_stores: Stores) -> None:
    """Closing the store ends its watches: pending events first, then StoreError."""
    writer, reader = pg_stores(), pg_stores()
    writer.write({"s": [ev(0)]})
    watch = reader.watch("s")
    assert _take(watch, 1) == [0]
    reader.close()
    with pytest.raises(StoreError, match="closed"):
        watch.get(5)


def test_a_watch_is_iterable_from_asyncio(pg_stores: Stores) -> None:
    """``async for`` over a watch yields the events without blocking the loop."""
    import asyncio

    writer, reader = pg_stores(), pg_stores()
    writer.write({"s": [ev(0), ev(1)]})
    watch = reader.watch("s")

    async def first_two() -> list[int]:
        seqs = []
        async for e in watch:
            seqs.append(e.seq)
            if len(seqs) == 2:
                break
        return seqs

    assert asyncio.run(asyncio.wait_for(first_two(), 10)) == [0, 1]
    watch.close()


# -- the optional dependency ------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_importing_the_library_does_not_import_psycopg() -> None:
    """nous_actor, its stores and its CLI load without psycopg; PostgresStore loads it."""
    result = _python(
        "import sys, nous_actor, nous_actor.store, nous_actor.cli; "
        "assert 'psycopg' not in sys.modules, 'imported early'; "
        "from nous_actor.store import PostgresStore; "
        "assert 'psycopg' in sys.modules; print(PostgresStore.__module__)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nous_actor.store.postgres"


def test_without_psycopg_the_import_error_says_what_to_install() -> None:
    """With psycopg missing, asking for PostgresStore is an ImportError naming the extra."""
    result = _python(
        "import sys; sys.modules['psycopg'] = None\n"
        "try:\n"
        "    from nous_actor.store import PostgresStore\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'nous-actor[postgres]'" in result.stdout


def test_the_docs_example_runs(pg_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PostgreSQL example of docs/persistence.md runs against the server, asserts holding."""
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "persistence.md"
    text = page.read_text(encoding="utf-8")
    marker = (
        "<!-- runs against PostgreSQL: "
        "tests/test_store_postgres.py::test_the_docs_example_runs -->"
    )
    after = text.split(marker, 1)[1]
    assert after.startswith("\n```text\n")
    code = after.split("\n```text\n", 1)[1].split("\n```\n", 1)[0]
    schema = pg_server.fresh_schema()
    monkeypatch.setenv("NOUS_ACTOR_DSN", pg_server.dsn)
    try:
        exec(compile(code.replace('"agents_docs"', repr(schema)), str(page), "exec"), {})
    finally:
        pg_server.drop_schema(schema)
