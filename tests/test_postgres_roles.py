"""PostgresStore under a role of an operator's making: the grants it needs (those
docs/persistence.md gives), and what a role's own settings cannot break or must be
told apart from (a read-only default, a short statement_timeout, a connection limit).

Every role is real, made on the test server and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from bounds import BOUND

from nous_actor import Sessions
from nous_actor.errors import StoreError

if TYPE_CHECKING:
    from postgres_server import Server, Stores

# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.store.postgres import PostgresStore  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "persistence.md"
MARK = "tests/test_postgres_roles.py::test_the_documented_grants_let_a_role_use_the_store"


def documented_grants(schema: str, role: str) -> list[str]:
    """The GRANT statements of docs/persistence.md (the ```sql block after the comment
    naming the test below), for ``schema`` and ``role`` (``agents`` and ``app`` there)."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(re.escape(MARK) + r" -->\n```sql\n(.*?)\n```", text, re.DOTALL)
    assert found, f"docs/persistence.md has no ```sql block after a comment naming {MARK}"
    body = re.sub(r"\bagents\b", schema, re.sub(r"\bapp\b", f'"{role}"', found.group(1)))
    return [s.strip() for s in body.split(";") if s.strip()]


@contextlib.contextmanager
def a_role(server: Server, options: str = "", *settings: str) -> Iterator[tuple[str, str]]:
    """A new login role with ``options`` (``CREATE ROLE``) and ``settings`` (``ALTER ROLE
    ... SET``): its name and a DSN connecting as it. Dropped afterwards."""
    name = f"r_{uuid.uuid4().hex[:12]}"
    server.sql(f'CREATE ROLE "{name}" LOGIN {options}')
    try:
        for setting in settings:
            server.sql(f'ALTER ROLE "{name}" SET {setting}')
        params = psycopg.conninfo.conninfo_to_dict(server.dsn)
        params["user"] = name
        yield name, psycopg.conninfo.make_conninfo(**params)
    finally:
        server.sql(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = %s",
            (name,),
        )
        server.sql(f'DROP OWNED BY "{name}"')
        server.sql(f'DROP ROLE "{name}"')


def grant(server: Server, schema: str, role: str) -> None:
    for statement in documented_grants(schema, role):
        server.sql(statement)


# -- the grants --------------------------------------------------------------------------------


def test_the_documented_grants_let_a_role_use_the_store(pg_stores: Stores) -> None:
    """A role granted exactly what docs/persistence.md says, on a store another role made,
    opens sessions, appends, claims and releases, watches, and reads the forwarding key."""
    pg_stores().close()  # the store, made by its owner
    server = pg_stores.server
    with a_role(server) as (role, dsn):
        grant(server, pg_stores.schema, role)
        store = PostgresStore(dsn, schema=pg_stores.schema, timeout=BOUND)
        try:
            with Sessions(store, timeout=BOUND) as sessions:
                first = sessions.open("chat").append("user_message", {"content": "hi"}).get()
            with store.watch("chat") as feed:
                assert feed.get(BOUND) == first
            store.release("other", store.claim("other"))
            assert len(store.forwarding_key()) == 32
            store.delete("chat")
        finally:
            store.close()


def test_a_role_missing_a_grant_is_told_every_grant_the_store_needs(pg_stores: Stores) -> None:
    """A role granted the schema and its tables but not its sequence cannot claim; its
    StoreError gives the grants to run, the sequence's included."""
    pg_stores().close()
    server, schema = pg_stores.server, pg_stores.schema
    with a_role(server) as (role, dsn):
        server.sql(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        server.sql(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"'
        )
        store = PostgresStore(dsn, schema=schema, timeout=BOUND)
        try:
            with pytest.raises(StoreError, match="permission denied for sequence") as refused:
                store.claim("s")
        finally:
            store.close()
    said = str(refused.value)
    for statement in documented_grants(schema, role):
        assert statement.replace(f'"{role}"', role) in said, said


# -- a role's own settings --------------------------------------------------------------------


def test_a_role_whose_transactions_are_read_only_is_not_called_a_standby(
    pg_stores: Stores,
) -> None:
    """default_transaction_read_only = on for the role, on a writable server: the error
    says so, and how to turn it off; it does not send the user looking for a primary."""
    pg_stores().close()
    server = pg_stores.server
    with a_role(server, "", "default_transaction_read_only = on") as (role, dsn):
        grant(server, pg_stores.schema, role)
        store = PostgresStore(dsn, schema=pg_stores.schema, timeout=BOUND)
        try:
            with pytest.raises(StoreError, match="ReadOnlySqlTransaction") as refused:
                store.claim("s")
        finally:
            store.close()
    said = str(refused.value)
    assert "the server is writable" in said, said
    assert f"ALTER ROLE {role} SET default_transaction_read_only = off" in said, said
    assert "standby" not in said, said


def test_a_short_statement_timeout_of_the_role_does_not_reach_the_store(
    pg_stores: Stores,
) -> None:
    """A role with statement_timeout = 1ms (and a short idle_session_timeout, which would
    end the lease connection and free its claims' locks): the store's connections run
    with its own bounds, and its work goes through."""
    pg_stores().close()
    server = pg_stores.server
    with a_role(server, "", "statement_timeout = '1ms'", "idle_session_timeout = '100ms'") as (
        role,
        dsn,
    ):
        grant(server, pg_stores.schema, role)
        store = PostgresStore(dsn, schema=pg_stores.schema, timeout=4)
        try:
            with Sessions(store, timeout=BOUND) as sessions:
                for i in range(20):
                    sessions.open(f"s{i}").append("user_message", {"content": "x" * 10_000})
                assert sessions.open("s19").count().get() == 1
            for conn in (store._main.conn, store._leases.link.conn):
                assert conn is not None
                assert conn.execute("SHOW statement_timeout").fetchone() == ("4s",)
                assert conn.execute("SHOW idle_session_timeout").fetchone() == ("0",)
        finally:
            store.close()


def test_a_connection_limit_is_not_called_a_lost_connection(pg_stores: Stores) -> None:
    """The role may keep one connection: the store opens on it, and its claim, which
    needs a second one, fails in its timeout saying that no connection is free (nothing
    was lost, and the server is up); so does a second store."""
    pg_stores().close()
    server = pg_stores.server
    with a_role(server, "CONNECTION LIMIT 1") as (role, dsn):
        grant(server, pg_stores.schema, role)
        store = PostgresStore(dsn, schema=pg_stores.schema, timeout=0.5)
        try:
            with pytest.raises(StoreError, match="no connection free") as refused:
                store.claim("s")
            assert "could not connect" in str(refused.value)
            assert "lost the connection" not in str(refused.value)
            with pytest.raises(StoreError, match=r"could not connect.*no connection free"):
                PostgresStore(dsn, schema=pg_stores.schema, timeout=0.5)
        finally:
            store.close()
