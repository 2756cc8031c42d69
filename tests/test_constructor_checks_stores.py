"""Every argument of the stores' constructors is checked when a store is made: a typed
error saying what to pass, raised before any file, connection or thread exists."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from nous_actor.store import MemoryStore, SQLiteStore

# -- SQLiteStore ---------------------------------------------------------------------------


class _BytesPath:
    """An os.PathLike whose path is bytes (SQLiteStore takes str paths only)."""

    def __fspath__(self) -> bytes:
        return b"store.db"


SQLITE_BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("path-int", {"path": 123}, TypeError, r"path must be a str or an os\.PathLike"),
    ("path-none", {"path": None}, TypeError, r"path must be a str or an os\.PathLike"),
    ("path-bytes", {"path": b"store.db"}, TypeError, r"path must be a str or an os\.PathLike"),
    ("path-pathlike-bytes", {"path": _BytesPath()}, TypeError, r"not bytes"),
    ("path-empty", {"path": ""}, ValueError, r"path must not be empty"),
    ("path-nul", {"path": "a\x00b.db"}, ValueError, r"path must not hold a NUL"),
    ("durability-unknown", {"durability": "fast?"}, ValueError, r"'full' or 'normal'"),
    ("durability-not-str", {"durability": 1}, TypeError, r"durability must be 'full' or"),
    ("timeout-zero", {"timeout": 0}, ValueError, r"timeout must be .* from 0\.001 to"),
    ("timeout-negative", {"timeout": -1.0}, ValueError, r"timeout must be .* from 0\.001"),
    ("timeout-under-1ms", {"timeout": 0.0004}, ValueError, r"timeout must be .* from 0\.001"),
    ("timeout-nan", {"timeout": math.nan}, ValueError, r"timeout must be .* got nan"),
    ("timeout-inf", {"timeout": math.inf}, ValueError, r"timeout must be .* got inf"),
    ("timeout-too-big", {"timeout": 3e6}, ValueError, r"to 2147483"),
    ("timeout-str", {"timeout": "5"}, TypeError, r"timeout must be a number of seconds"),
    ("timeout-bool", {"timeout": True}, TypeError, r"timeout must be a number .* got bool"),
    ("create-str", {"create": "no"}, TypeError, r"create must be True or False, got str"),
    ("create-int", {"create": 0}, TypeError, r"create must be True or False, got int"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [case[1:] for case in SQLITE_BAD],
    ids=[case[0] for case in SQLITE_BAD],
)
def test_sqlite_store_refuses_a_bad_argument_before_making_a_file(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A bad SQLiteStore argument raises a typed error naming what to pass; no file is made
    and no connection opened."""
    args = {"path": tmp_path / "store.db", **kwargs}
    path = args.pop("path")
    before = os.getcwd()
    os.chdir(tmp_path)  # a relative path (the bytes one) would land here
    try:
        with pytest.raises(error, match=match):
            SQLiteStore(path, **args)
    finally:
        os.chdir(before)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"timeout": 0.001},
        {"timeout": 2_147_483},
        {"timeout": 1},
        {"durability": "normal", "create": True},
    ],
    ids=["timeout-1ms", "timeout-largest", "timeout-int", "normal"],
)
def test_sqlite_store_accepts_the_edges_of_each_range(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    """The smallest and largest accepted values open a store."""
    with SQLiteStore(tmp_path / "store.db", **kwargs) as store:
        assert store.sessions() == []


def test_sqlite_store_takes_a_str_path_and_memory(tmp_path: Path) -> None:
    """A plain str path and ":memory:" are accepted."""
    with SQLiteStore(str(tmp_path / "a.db")) as a, SQLiteStore(":memory:") as b:
        assert a.sessions() == b.sessions() == []


@pytest.mark.parametrize("where", ["missing/s.db", "~/s.db"])
def test_a_file_that_cannot_be_opened_says_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A file in a folder that does not exist (or under a '~' that is not expanded) is
    refused with what to fix, and nothing is made."""
    from nous_actor.errors import StoreError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(StoreError, match="folder must exist") as refused:
        SQLiteStore(where)
    assert ("expanduser()" in str(refused.value)) == where.startswith("~")
    assert list(tmp_path.iterdir()) == []


def test_memory_store_takes_no_arguments() -> None:
    """MemoryStore has no settings: any argument is a TypeError."""
    with pytest.raises(TypeError):
        MemoryStore(1)  # type: ignore[call-arg]


# -- PostgresStore -------------------------------------------------------------------------

psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.store.postgres import PostgresStore  # noqa: E402

# A server that is not there: an argument checked after connecting would be a StoreError.
NOWHERE = "host=/nonexistent/nous-actor-test dbname=none connect_timeout=1"

PG_BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("dsn-int", {"dsn": 5}, TypeError, r"dsn must be a str .* got int"),
    ("dsn-bytes", {"dsn": b"dbname=x"}, TypeError, r"dsn must be a str"),
    ("schema-int", {"schema": 5}, TypeError, r"schema must be a str, got int"),
    ("schema-empty", {"schema": ""}, ValueError, r"schema must be 1 to 52"),
    ("schema-space-semicolon", {"schema": "bad name;"}, ValueError, r"letters, digits and _"),
    ("schema-quote", {"schema": 'a"b'}, ValueError, r"letters, digits and _"),
    ("schema-hyphen", {"schema": "my-app"}, ValueError, r"letters, digits and _"),
    ("schema-digit-first", {"schema": "1abc"}, ValueError, r"not starting with a digit"),
    ("schema-nul", {"schema": "a\x00b"}, ValueError, r"letters, digits and _"),
    ("schema-non-ascii", {"schema": "schéma"}, ValueError, r"ASCII"),
    ("schema-reserved", {"schema": "pg_store"}, ValueError, r"pg_ is reserved"),
    ("schema-53-bytes", {"schema": "s" * 53}, ValueError, r"1 to 52 bytes"),
    ("lease-zero", {"lease": 0}, ValueError, r"lease must be .* from 0\.1 to 86400"),
    ("lease-negative", {"lease": -15.0}, ValueError, r"lease must be .* from 0\.1"),
    ("lease-too-short", {"lease": 0.05}, ValueError, r"lease must be .* from 0\.1"),
    ("lease-too-long", {"lease": 86_401}, ValueError, r"lease must be .* to 86400"),
    ("lease-inf", {"lease": math.inf}, ValueError, r"lease must be .* got inf"),
    ("lease-nan", {"lease": math.nan}, ValueError, r"lease must be .* got nan"),
    ("lease-str", {"lease": "15"}, TypeError, r"lease must be a number of seconds"),
    ("lease-bool", {"lease": True}, TypeError, r"lease must be a number .* got bool"),
    ("timeout-zero", {"timeout": 0}, ValueError, r"timeout must be .* from 0\.001"),
    ("timeout-under-1ms", {"timeout": 0.0001}, ValueError, r"timeout must be .* from 0\.001"),
    ("timeout-too-big", {"timeout": 3e6}, ValueError, r"to 2147483"),
    ("timeout-none", {"timeout": None}, TypeError, r"timeout must be a number of seconds"),
    ("create-str", {"create": "yes"}, TypeError, r"create must be True or False"),
    ("holder-int", {"holder": 7}, TypeError, r"holder must be None or a str"),
    ("holder-empty", {"holder": ""}, ValueError, r"holder must not be empty"),
    ("holder-blank", {"holder": "  "}, ValueError, r"holder must not be empty"),
    ("holder-nul", {"holder": "a\x00b"}, ValueError, r"holder must not hold a NUL"),
    ("detect-int", {"detect_dead_holders": 1}, TypeError, r"detect_dead_holders must be True"),
    ("detect-none", {"detect_dead_holders": None}, TypeError, r"detect_dead_holders must be"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [case[1:] for case in PG_BAD],
    ids=[case[0] for case in PG_BAD],
)
def test_postgres_store_refuses_a_bad_argument_before_connecting(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A bad PostgresStore argument raises a typed error naming what to pass, before any
    connection is tried (the DSN names no server) or thread started."""
    args = {"dsn": NOWHERE, **kwargs}
    dsn = args.pop("dsn")
    threads = set(threading.enumerate())
    with pytest.raises(error, match=match):
        PostgresStore(dsn, **args)
    assert set(threading.enumerate()) <= threads


def test_postgres_store_checks_arguments_before_connecting() -> None:
    """Good arguments with no server: the error is the connection's (a StoreError), so the
    table above really was refused before connecting."""
    from nous_actor.errors import StoreError

    with pytest.raises(StoreError, match="could not connect"):
        PostgresStore(NOWHERE, schema="Good_name_1", lease=0.1, timeout=2_147_483)


def test_a_refused_schema_makes_nothing_on_the_server(pg_server: Any) -> None:
    """On a real server a refused schema name creates no schema."""
    before = pg_server.sql("SELECT nspname FROM pg_namespace ORDER BY 1")
    for schema in ("bad name;", "s" * 60, "pg_nous"):
        with pytest.raises(ValueError, match="schema must"):
            PostgresStore(pg_server.dsn, schema=schema)
    assert pg_server.sql("SELECT nspname FROM pg_namespace ORDER BY 1") == before


def test_the_longest_schema_accepted_can_be_written(pg_stores: Any) -> None:
    """A schema of 52 bytes (the longest accepted) opens and takes writes: its NOTIFY
    channel name fits PostgreSQL's 63-byte limit."""
    from datetime import UTC, datetime

    from nous_actor.core.event import Event

    schema = f"t{pg_stores.schema}".ljust(52, "x")
    try:
        store = pg_stores(schema=schema)
        event = Event(0, "user_message", datetime.now(UTC), {"content": "x"})
        assert store.write({"s": [event]}) == {}
        assert [e.seq for e in store.load("s")] == [0]
    finally:
        pg_stores.close()
        pg_stores.server.drop_schema(schema)
