"""The nous-actor command on a PostgreSQL server: a DSN wherever it takes a SQLite file.

Run through the real entry point in a subprocess, like tests/test_cli.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cli_process import run

if TYPE_CHECKING:
    from postgres_server import Server, Stores


# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")

EXPORT = (
    '{"seq":0,"type":"system_message","time":"2026-01-01T00:00:00.000000+00:00",'
    '"data":{"content":"be brief"}}\n'
    '{"seq":1,"type":"user_message","time":"2026-01-01T00:00:01.000000+00:00",'
    '"data":{"content":"hi"}}\n'
    '{"seq":2,"type":"assistant_message","time":"2026-01-01T00:00:02.000000+00:00",'
    '"data":{"content":"hello"}}\n'
)


def _tables(server: Server, schema: str) -> list[tuple[object, ...]]:
    return server.sql(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE nspname = %s ORDER BY relname",
        (schema,),
    )


def test_import_then_every_reading_command_works_on_a_dsn(pg_stores: Stores) -> None:
    """import makes the store in --schema; sessions, show, export, audit read it back."""
    dsn, schema = pg_stores.dsn, pg_stores.schema
    out = run("import", dsn, "chat", "--schema", schema, stdin=EXPORT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "imported 3 events into chat"
    listed = run("sessions", dsn, "--schema", schema, "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["session_id"], row["retained"], row["count"]) == ("chat", 3, 3)
    shown = run("show", dsn, "chat", "--schema", schema)
    assert shown.returncode == 0, shown.stderr
    assert "be brief" in shown.stdout
    assert "hello" in shown.stdout
    exported = run("export", dsn, "chat", "--schema", schema)
    assert exported.stdout == EXPORT
    audit = run("audit", dsn, "chat", "1", "--schema", schema, "--json")
    assert audit.returncode == 0, audit.stderr


def test_fork_and_snapshot_work_on_a_dsn(pg_stores: Stores) -> None:
    """fork and snapshot start a session on the server, claim it, and release it."""
    dsn, schema = pg_stores.dsn, pg_stores.schema
    assert run("import", dsn, "chat", "--schema", schema, stdin=EXPORT).returncode == 0
    forked = run("fork", dsn, "chat", "copy", "--through", "1", "--schema", schema)
    assert forked.returncode == 0, forked.stderr
    snap = run("snapshot", dsn, "copy", "--schema", schema)
    assert snap.returncode == 0, snap.stderr
    copy = pg_stores().load("copy")
    assert [e.seq for e in copy][:2] == [0, 1]
    assert [e.data.get("content") for e in copy][:2] == ["be brief", "hi"]
    assert pg_stores.server.sql(f'SELECT count(*) FROM "{schema}".claims') == [(0,)]


def test_a_command_refuses_a_session_another_process_holds(pg_stores: Stores) -> None:
    """fork of a session whose writer lives elsewhere fails with one line naming it."""
    dsn, schema = pg_stores.dsn, pg_stores.schema
    assert run("import", dsn, "chat", "--schema", schema, stdin=EXPORT).returncode == 0
    holder = pg_stores(holder="worker-7")
    holder.claim("chat")
    out = run("fork", dsn, "chat", "copy", "--through", "1", "--schema", schema)
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert "worker-7" in out.stderr


def test_reading_a_schema_without_a_store_fails_and_creates_nothing(pg_stores: Stores) -> None:
    """sessions on a schema that holds no store is one line, exit 1, and no schema is made."""
    out = run("sessions", pg_stores.dsn, "--schema", pg_stores.schema)
    assert out.returncode == 1
    assert "no nous_actor store in" in out.stderr
    assert "--schema" in out.stderr
    assert (
        pg_stores.server.sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_stores.schema,))
        == []
    )


def test_a_schema_of_another_application_is_refused_by_import(pg_stores: Stores) -> None:
    """import into a schema with someone else's tables fails and leaves them as they were."""
    server, schema = pg_stores.server, pg_stores.schema
    server.sql(f'CREATE SCHEMA "{schema}"')
    server.sql(f'CREATE TABLE "{schema}".invoices (id int)')
    out = run("import", pg_stores.dsn, "chat", "--schema", schema, stdin=EXPORT)
    assert out.returncode == 1
    assert "another application's objects" in out.stderr
    assert _tables(server, schema) == [("invoices",)]


def test_a_dsn_that_reaches_no_server_is_one_line(pg_stores: Stores) -> None:
    """A DSN naming a missing socket folder fails with one line, not a traceback."""
    out = run("sessions", "postgresql:///x?host=/nonexistent-folder&connect_timeout=2")
    assert out.returncode == 1
    assert out.stderr.startswith("nous-actor: StoreError: could not connect")
    assert out.stderr.count("\n") == 1


def test_demo_runs_on_a_server_and_replaces_only_its_own_schema(
    pg_stores: Stores, tmp_path: Path
) -> None:
    """demo --store postgres --dsn runs, verifies every acknowledged event, replaces its own
    schema on a second run, and refuses a schema it did not make."""
    dsn, schema = pg_stores.dsn, pg_stores.schema
    args = ("demo", "--store", "postgres", "--dsn", dsn, "--schema", schema)
    small = ("--agents", "3", "--turns", "4", "--crash-rate", "0.1", "--json")
    first = run(*args, *small, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["ok"] is True
    assert report["verified"] == report["events"] > 0
    assert (tmp_path / f"nous-demo-{schema}.log").is_file()
    second = run(*args, *small, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["sessions_in_store"] == 3
    other = pg_stores.server.fresh_schema()
    pg_stores.server.sql(f'CREATE SCHEMA "{other}"')
    pg_stores.server.sql(f'CREATE TABLE "{other}".keep_me (id int)')
    try:
        refused = run("demo", "--dsn", dsn, "--schema", other, *small, cwd=tmp_path)
        assert refused.returncode == 1
        assert "did not make; it was left unchanged" in refused.stderr
        assert _tables(pg_stores.server, other) == [("keep_me",)]
    finally:
        pg_stores.server.drop_schema(other)


def test_demo_store_choice_and_dsn_must_agree() -> None:
    """--store postgres without a DSN, or --store sqlite with one, is a one-line error."""
    no_dsn = run("demo", "--store", "postgres")
    assert no_dsn.returncode == 1
    assert "--store postgres needs the server" in no_dsn.stderr
    both = run("demo", "--store", "sqlite", "--dsn", "postgresql:///x")
    assert both.returncode == 1
    assert "--store sqlite takes a file" in both.stderr


# -- a libpq key/value DSN is a DSN too ----------------------------------------------------


def _key_value(dsn: str) -> str:
    """The same server as ``dsn``, written as libpq key/value pairs (host=... dbname=...)."""
    return str(psycopg.conninfo.make_conninfo("", **psycopg.conninfo.conninfo_to_dict(dsn)))


def test_every_command_takes_a_key_value_dsn(pg_stores: Stores, tmp_path: Path) -> None:
    """import, sessions, show, export, audit, fork and snapshot take 'host=... dbname=...'
    as PostgresStore does, and make no SQLite file of that name."""
    kv, schema = _key_value(pg_stores.dsn), pg_stores.schema
    assert "=" in kv
    assert not kv.startswith("postgres")
    out = run("import", kv, "chat", "--schema", schema, stdin=EXPORT, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    listed = run("sessions", kv, "--schema", schema, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [row["session_id"] for row in json.loads(listed.stdout)] == ["chat"]
    shown = run("show", kv, "chat", "--schema", schema, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "hello" in shown.stdout
    assert run("export", kv, "chat", "--schema", schema, cwd=tmp_path).stdout == EXPORT
    audit = run("audit", kv, "chat", "1", "--schema", schema, "--json", cwd=tmp_path)
    assert audit.returncode == 0, audit.stderr
    forked = run("fork", kv, "chat", "copy", "--through", "1", "--schema", schema, cwd=tmp_path)
    assert forked.returncode == 0, forked.stderr
    snap = run("snapshot", kv, "copy", "--schema", schema, cwd=tmp_path)
    assert snap.returncode == 0, snap.stderr
    assert sorted(pg_stores().sessions()) == ["chat", "copy"]
    assert list(tmp_path.iterdir()) == []


def test_demo_takes_a_key_value_dsn_as_its_db(pg_stores: Stores, tmp_path: Path) -> None:
    """demo --db 'host=... dbname=...' runs on the server, as --dsn does."""
    kv, schema = _key_value(pg_stores.dsn), pg_stores.schema
    args = ("--agents", "2", "--turns", "2", "--crash-rate", "0", "--json")
    out = run("demo", "--db", kv, "--schema", schema, *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ok"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"nous-demo-{schema}.log"]


def test_a_key_value_dsn_that_reaches_no_server_is_a_connection_error(tmp_path: Path) -> None:
    """A key/value DSN is tried as a server (one line, exit 1), never made a SQLite file."""
    dsn = "host=/nonexistent-folder dbname=x connect_timeout=2"
    for args, stdin in ((("sessions", dsn), None), (("import", dsn, "chat"), EXPORT)):
        out = run(*args, stdin=stdin, cwd=tmp_path)
        assert out.returncode == 1
        assert out.stderr.startswith("nous-actor: StoreError: could not connect"), out.stderr
        assert out.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
