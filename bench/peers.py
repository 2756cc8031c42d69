"""The peers the durable figures are compared with, each doing our work on its own SQLite file.

* the Python ``eventsourcing`` library's SQLite recorder
  (``SQLiteApplicationRecorder.insert_events([StoredEvent])``, one event per call);
* the OpenAI Agents SDK's ``SQLiteSession`` (``await session.add_items([item])``,
  one item per call: its real, async API).

Both are optional (the ``bench`` extra): nothing here imports them until a
run asks for one, and :data:`AVAILABLE` says which are installed, so a
missing peer makes its rows say "peer not installed" instead of crashing.

Settings: both are used with their defaults (eventsourcing's pool timeout
raised so that 100 writers queueing for its one write connection do not time
out on a slow disk); both put their file in WAL mode themselves and leave
``synchronous`` at SQLite's default, FULL (read back by :func:`pragmas`).
Every run counts its rows in the file afterwards with plain SQL.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any, Final

from bench import harness as h

__all__ = [
    "AVAILABLE",
    "PEERS",
    "agents_asyncio",
    "eventsourcing_asyncio",
    "eventsourcing_threads",
    "pragmas",
]

PEERS: Final = ("eventsourcing", "agents")
AVAILABLE: Final[dict[str, bool]] = {p: h.installed(p) for p in PEERS}
"""Which peer libraries are installed (module name -> importable)."""

_SYNC_NAMES: Final = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _rows(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _states(events: int) -> list[bytes]:
    return [json.dumps({"content": f"short text {j}"}).encode() for j in range(events)]


def _recorder(path: Path) -> tuple[Any, Any]:
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(str(path), pool_timeout=h.JOIN_TIMEOUT)
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    return datastore, recorder


def _check_eventsourcing(path: Path, sessions: int, events: int, label: str) -> None:
    got = _rows(path, "SELECT COUNT(*), COUNT(DISTINCT originator_id) FROM stored_events")
    if got != [(sessions * events, sessions)]:
        raise AssertionError(f"{label}: the file holds {got}")


def eventsourcing_threads(folder: Path, sessions: int, events: int) -> int:
    """Wall ns: one thread per originator, ``insert_events([one StoredEvent])`` per event."""
    from eventsourcing.persistence import StoredEvent

    path = folder / "eventsourcing.db"
    datastore, recorder = _recorder(path)
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"session-{i}") for i in range(sessions)]
    states = _states(events)

    def work(i: int) -> None:
        oid = ids[i]
        for j in range(events):
            recorder.insert_events([StoredEvent(oid, j + 1, "bench:UserMessage", states[j])])

    try:
        ns, _ = h.run_threads(work, sessions, "eventsourcing threads")
    finally:
        datastore.close()
    _check_eventsourcing(path, sessions, events, "eventsourcing threads")
    return ns


def eventsourcing_asyncio(folder: Path, sessions: int, events: int) -> int:
    """Wall ns: one loop, a coroutine per originator, each ``insert_events`` call awaited
    through the loop's default executor (``loop.run_in_executor(None, ...)``)."""
    from eventsourcing.persistence import StoredEvent

    path = folder / "eventsourcing.db"
    datastore, recorder = _recorder(path)
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"session-{i}") for i in range(sessions)]
    states = _states(events)

    async def main() -> int:
        loop = asyncio.get_running_loop()

        async def one(i: int) -> None:
            oid = ids[i]
            for j in range(events):
                ev = StoredEvent(oid, j + 1, "bench:UserMessage", states[j])
                await loop.run_in_executor(None, recorder.insert_events, [ev])

        t0 = time.perf_counter_ns()
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(sessions))), h.JOIN_TIMEOUT)
        return time.perf_counter_ns() - t0

    try:
        ns = asyncio.run(main())
    finally:
        datastore.close()
    _check_eventsourcing(path, sessions, events, "eventsourcing asyncio")
    return ns


def agents_asyncio(folder: Path, sessions: int, events: int) -> int:
    """Wall ns: one loop, a coroutine per session, ``await s.add_items([item])`` per event."""
    from agents import SQLiteSession

    path = folder / "agents.db"
    items: list[Any] = [{"role": "user", "content": f"short text {j}"} for j in range(events)]

    async def main() -> int:
        handles = [SQLiteSession(f"session-{i}", path) for i in range(sessions)]

        async def one(s: SQLiteSession) -> None:
            for item in items:
                await s.add_items([item])

        try:
            t0 = time.perf_counter_ns()
            await asyncio.wait_for(asyncio.gather(*(one(s) for s in handles)), h.JOIN_TIMEOUT)
            return time.perf_counter_ns() - t0
        finally:
            for s in handles:
                s.close()

    ns = asyncio.run(main())
    got = _rows(path, "SELECT COUNT(*), COUNT(DISTINCT session_id) FROM agent_messages")
    if got != [(sessions * events, sessions)]:
        raise AssertionError(f"agents SQLiteSession: the file holds {got}")
    return ns


def pragmas() -> dict[str, str]:
    """``journal_mode`` and ``synchronous`` of each installed peer's file, as written by it."""
    out: dict[str, str] = {}
    with h.scratch("pragmas") as folder:
        if AVAILABLE["eventsourcing"]:
            datastore, _ = _recorder(folder / "es.db")
            try:
                with datastore.transaction(commit=False) as c:
                    c.execute("PRAGMA journal_mode")
                    journal = c.fetchone()[0]
                    c.execute("PRAGMA synchronous")
                    sync = c.fetchone()[0]
            finally:
                datastore.close()
            out["eventsourcing"] = f"journal_mode={journal}, synchronous={_SYNC_NAMES.get(sync)}"
        if AVAILABLE["agents"]:
            from agents import SQLiteSession

            path = folder / "agents.db"
            s = SQLiteSession("probe", path)
            try:
                asyncio.run(s.add_items([{"role": "user", "content": "probe"}]))
            finally:
                s.close()
            conn = sqlite3.connect(path)
            try:
                journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
                sync = conn.execute("PRAGMA synchronous").fetchone()[0]
            finally:
                conn.close()
            out["agents"] = (
                f"journal_mode={journal}, synchronous={_SYNC_NAMES.get(sync)} "
                "(a fresh connection's default: SQLiteSession sets only WAL)"
            )
    return out
