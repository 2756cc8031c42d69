"""The main job of ``make demo``: supervised agent sessions on an embedded SQLite file
(or, with `run_demo_postgres`, on a PostgreSQL server).

N agents talk concurrently, each in its own session under one
`nous_actor.Sessions` registry: user and assistant turns with tool
calls and tool results from a deterministic fake model (no network), some
tool results oversized. A `nous_actor.Compactor` with a deterministic
summariser keeps every surface under budget. Crashes are injected at random
(a ``BaseException`` inside the session's actor), some between an agent's
appends and some amid a pipeline of appends still queued or committing; the
registry restarts the session from the store and the agent carries on
through the same handle, sending again what the crash refused.

At the end it prints a summary table and checks, against the SQLite file,
that every acknowledged event is there, intact (also those acknowledged
after their session had crashed).

The database is marked as the demo's (a table ``nous_actor_demo``), so that
a later run replaces it and nothing else (`check_demo_paths`). On PostgreSQL
the demo's sessions live in a schema of their own, marked the same way; a
later run replaces only a schema so marked (`check_demo_schema`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import sqlite3
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal, TextIO

from nous_actor.core.compaction import Compactor
from nous_actor.core.event import Event
from nous_actor.core.message import Message
from nous_actor.errors import SessionCrashed, SessionStopped
from nous_actor.sessions.faults import crash, crash_amid
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import Store
from nous_actor.store.sqlite import APPLICATION_ID, SQLiteStore
from nous_actor.supervision import Backoff

__all__ = [
    "DEMO_SCHEMA",
    "DEMO_TABLE",
    "DemoReport",
    "check_demo_log",
    "check_demo_paths",
    "check_demo_schema",
    "run_demo",
    "run_demo_postgres",
]

DEMO_TABLE: Final = "nous_actor_demo"  # present in a database the demo made
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_LOG_LINE: Final = re.compile(r"(\w+:[\w.]+:)?timestamp=")  # the first line of a demo log

TOPICS = ["flaky test", "slow query", "memory leak", "broken build", "race condition", "timeout"]
TOOLS = ["grep", "run_tests", "read_file", "profile"]


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def summarise(messages: Sequence[Message]) -> str:
    """A deterministic summariser: what was asked, which tools ran, how it ended."""
    asked = [m.content for m in messages if m.role == "user" and isinstance(m.content, str)]
    tools = sorted({c.get("name", "?") for m in messages for c in m.tool_calls})
    earlier = [m for m in messages if m.role == "system"]
    head = f"(includes {len(earlier)} earlier summaries) " if earlier else ""
    return (
        f"{head}Summary of {len(messages)} messages: the user asked about "
        f"{'; '.join(str(a)[:40] for a in asked[-3:]) or 'nothing'}; tools used: "
        f"{', '.join(tools) or 'none'}."
    )


@dataclass
class _Agent:
    index: int
    session_id: str
    turns_done: int = 0
    events: int = 0
    compactions: int = 0
    crashes: int = 0
    crashes_in_flight: int = 0  # crashes with this agent's appends queued or committing
    acked_after_crash: int = 0  # appends acknowledged after their session had crashed
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    acked: list[tuple[int, str, str]] = field(default_factory=list)  # seq, type, digest
    error: BaseException | None = None


@dataclass
class DemoReport:
    """What a demo run did and what it verified."""

    agents: int
    turns: int
    events: int
    compactions: int
    crashes: int
    crashes_in_flight: int
    acked_after_crash: int
    restarts: int
    retries: int
    seconds: float
    p50_ms: float
    p99_ms: float
    verified: int
    missing: list[str]
    sessions_in_store: int
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.errors and self.verified == self.events

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def _record(agent: _Agent, ev: Event, t0: float) -> None:
    agent.latencies.append(time.perf_counter() - t0)
    agent.acked.append((ev.seq, ev.type.value, _digest(ev.data)))
    agent.events += 1


def _acked(agent: _Agent, make: Callable[[], SessionFuture[Event]], attempts: int = 20) -> Event:
    """Append (retrying a call a crash answered), record latency and the acknowledged event."""
    for _ in range(attempts):
        t0 = time.perf_counter()
        fut = make()
        try:
            ev = fut.get()
        except SessionCrashed:  # this call crashed it: whether it was applied is unknown
            raise
        except SessionStopped:  # the session crashed under this call: it was not applied
            agent.retries += 1
            continue
        _record(agent, ev, t0)
        return ev
    raise RuntimeError(f"{agent.session_id}: gave up after {attempts} attempts")


Step = tuple[str, dict[str, Any]]


def _one_by_one(
    agent: _Agent, handle: Session, steps: Sequence[Step], crash_rate: float, rng: random.Random
) -> None:
    """Append each step and wait for it; a crash may come before any of them."""
    for etype, data in steps:
        if rng.random() < crash_rate:
            try:
                crash(handle).get()
            except SessionCrashed:
                agent.crashes += 1
            except SessionStopped:  # it was down already; the next call reopens it
                pass
        _acked(agent, partial(handle.append, etype, data))


def _send(etype: str, data: dict[str, Any], session: Session) -> SessionFuture[Event]:
    return session.append(etype, data)


def _pipelined(
    agent: _Agent, handle: Session, steps: Sequence[Step], crash_rate: float, rng: random.Random
) -> None:
    """Send every step at once; a crash may land amid them, while earlier ones commit.

    The appends before the crash are acknowledged (the store is the truth);
    the ones after it fail with ``SessionStopped`` and are sent again, in order.
    """
    t0 = time.perf_counter()
    at = next((k for k in range(len(steps)) if rng.random() < crash_rate), None)
    calls = [partial(_send, etype, data) for etype, data in steps]
    if at is None:
        futures = [call(handle) for call in calls]
    else:
        futures, crashed = crash_amid(handle, calls, at)
        try:
            crashed.get()
        except SessionCrashed:
            agent.crashes += 1
            pending = sum(not f.done() for f in futures[:at])
            agent.crashes_in_flight += int(pending > 0)
            agent.acked_after_crash += pending
        except SessionStopped:  # it was down already
            pass
    refused = None
    for k, fut in enumerate(futures):
        try:
            ev = fut.get()
        except SessionCrashed:
            raise
        except SessionStopped:
            refused = k if refused is None else refused
            continue
        if refused is not None:
            raise RuntimeError(
                f"{agent.session_id}: pipelined append {k} was applied after append "
                f"{refused} was refused: the order broke"
            )
        _record(agent, ev, t0)
    for etype, data in steps[len(futures) if refused is None else refused :]:
        agent.retries += 1
        _acked(agent, partial(handle.append, etype, data))


def _agent_main(
    agent: _Agent,
    handle: Session,
    turns: int,
    crash_rate: float,
    seed: int,
    compactor: Compactor,
) -> None:
    rng = random.Random(seed * 1000 + agent.index)
    try:
        if handle.count().get() == 0:
            _acked(
                agent,
                lambda: handle.append(
                    "system_message", {"content": f"You are agent {agent.index}, a debugger."}
                ),
            )
        for turn in range(turns):
            topic = rng.choice(TOPICS)
            tool = rng.choice(TOOLS)
            call_id = f"call-{agent.index}-{turn}"
            big = rng.random() < 0.3
            output = (
                "\n".join(f"{tool}: line {i} about the {topic}" for i in range(400))
                if big
                else f"{tool}: 3 matches for the {topic}"
            )
            steps: list[Step] = [
                ("turn_start", {"turn": turn}),
                ("user_message", {"content": f"Turn {turn}: please look into the {topic}."}),
                (
                    "assistant_message",
                    {
                        "content": None,
                        "tool_calls": [
                            {"id": call_id, "name": tool, "arguments": json.dumps({"q": topic})}
                        ],
                    },
                ),
                ("tool_result", {"content": output, "tool_call_id": call_id, "name": tool}),
                (
                    "assistant_message",
                    {"content": f"The {topic} comes from step {rng.randint(1, 9)}; fixed."},
                ),
                ("turn_end", {"turn": turn}),
            ]
            # Half the turns are recorded as a model's reply usually is: all at once.
            record = _pipelined if rng.random() < 0.5 else _one_by_one
            record(agent, handle, steps, crash_rate, rng)
            if turn % 4 == 3:
                result = handle.compact(compactor).get()
                agent.compactions += int(result.changed)
            agent.turns_done = turn + 1
    except BaseException as exc:  # reported in the summary, never swallowed
        agent.error = exc


def _bar(done: int, total: int, extra: str, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    pct = 100 * done // max(total, 1)
    return f"\r  [{'#' * filled}{'.' * (width - filled)}] {pct:3d}% {done}/{total} turns  {extra}"


DbKind = Literal["missing", "empty", "demo", "store", "foreign"]


def _db_kind(path: Path) -> DbKind:
    """What the file at ``path`` is, found without changing it.

    ``demo``: a nous_actor store this demo made; ``store``: another nous_actor
    store; ``foreign``: anything else (another application's SQLite database,
    a text file, ...). Only a file that starts as a nous_actor store (or one
    whose header is still in its write-ahead log) is opened, read-only.
    """
    if not path.exists():
        return "missing"
    if path.stat().st_size == 0:
        return "empty"
    with path.open("rb") as f:
        head = f.read(100)
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        return "foreign"
    header_id = int.from_bytes(head[68:72], "big")
    if header_id != APPLICATION_ID and not (header_id == 0 and Path(f"{path}-wal").exists()):
        return "foreign"
    try:
        uri = path.resolve().as_uri() + "?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as conn:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            marked = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (DEMO_TABLE,)
            ).fetchone()
    except sqlite3.Error:
        return "foreign"
    if app_id != APPLICATION_ID:
        return "foreign"
    return "demo" if marked else "store"


def check_demo_paths(db: str | Path, *, keep: bool = False) -> str | None:
    """Why the demo must not use ``db`` (and its log ``DB.log``), or None if it may.

    Without ``keep`` the demo replaces ``db``: allowed for a missing or empty
    file and for a database an earlier demo made, nothing else. With
    ``keep`` it adds to ``db``: any nous_actor store will do. The log is
    overwritten: allowed if missing, empty, or a log an earlier demo wrote.
    Nothing is changed by the check.
    """
    path = Path(db)
    kind = _db_kind(path)
    if kind == "foreign":
        return (
            f"{db} is not a nous_actor store (another application's file?); it was left "
            "unchanged: pass a new file with --db"
        )
    if kind == "store" and not keep:
        return (
            f"{db} is a nous_actor store the demo did not make; it was left unchanged: "
            "pass a new file with --db, or add --keep to add the demo's sessions to it"
        )
    return check_demo_log(Path(f"{db}.log"), "pass another file with --db")


def check_demo_log(log: Path, instead: str) -> str | None:
    """Why the demo must not overwrite ``log``, or None if it may (missing, empty, a demo's).

    ``instead`` ends the refusal: what to do instead (e.g. "pass another file with --db").
    """
    if log.exists():
        first = b""
        if log.is_file():
            with log.open("rb") as f:
                first = f.readline(4096)
        if not log.is_file() or (first and not _LOG_LINE.match(first.decode("utf-8", "replace"))):
            return (
                f"{log} (where the demo logs) is not a log of the demo; it was left "
                f"unchanged: move it away or {instead}"
            )
    return None


def _mark_as_demo(db: str | Path, agents: int, turns: int, seed: int) -> None:
    """Record in ``db`` that the demo made it (so that the next run may replace it)."""
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn, conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {DEMO_TABLE} "
            "(made TEXT NOT NULL, agents INTEGER, turns INTEGER, seed INTEGER)"
        )
        conn.execute(
            f"INSERT INTO {DEMO_TABLE} VALUES (?, ?, ?, ?)",
            (datetime.now(UTC).isoformat(), agents, turns, seed),
        )


def run_demo(
    db: str | Path,
    *,
    agents: int = 4,
    turns: int = 12,
    crash_rate: float = 0.02,
    seed: int = 7,
    progress: TextIO | None = sys.stderr,
) -> DemoReport:
    """Run the supervised multi-agent demo on the SQLite file ``db`` and verify it.

    Raises:
        ValueError: a bad count or rate.
    """
    _check_counts(agents, turns, crash_rate)
    fresh = _db_kind(Path(db)) in ("missing", "empty")
    store = SQLiteStore(db)
    if fresh:  # a store someone already had stays theirs, even with demo sessions in it
        _mark_as_demo(db, agents, turns, seed)
    try:
        return _run(store, agents, turns, crash_rate, seed, progress)
    finally:
        store.close()


def _check_counts(agents: int, turns: int, crash_rate: float) -> None:
    if agents < 1 or turns < 1 or not 0 <= crash_rate < 1:
        raise ValueError("agents and turns must be >= 1 and 0 <= crash_rate < 1")


def _run(
    store: Store,
    agents: int,
    turns: int,
    crash_rate: float,
    seed: int,
    progress: TextIO | None,
) -> DemoReport:
    """The demo on ``store``: agents, crashes, restarts, then every acknowledgement checked."""
    compactor = Compactor(budget=600, keep_recent=6, prune_over=200, summarise=summarise)
    crew = [_Agent(i, f"agent-{i}") for i in range(agents)]
    started = time.perf_counter()
    with Sessions(store, backoff=Backoff(0.001, 0.05, 0.1), max_restarts=1000) as registry:
        handles = [registry.open(a.session_id) for a in crew]
        threads = [
            threading.Thread(
                target=_agent_main,
                args=(a, h, turns, crash_rate, seed, compactor),
                name=f"agent-{a.index}",
            )
            for a, h in zip(crew, handles, strict=True)
        ]
        for t in threads:
            t.start()
        finished = threading.Event()
        while not finished.is_set():
            alive = [t for t in threads if t.is_alive()]
            if progress is not None:
                done = sum(a.turns_done for a in crew)
                crashes = sum(a.crashes for a in crew)
                events = sum(a.events for a in crew)
                progress.write(_bar(done, agents * turns, f"{events} events, {crashes} crashes"))
                progress.flush()
            if not alive:
                finished.set()
            else:
                alive[0].join(0.1)
        if progress is not None:
            progress.write("\n")
        seconds = time.perf_counter() - started
        restarts = sum(registry.restart_count(a.session_id) for a in crew)
    missing: list[str] = []
    verified = 0
    for a in crew:
        stored = {ev.seq: ev for ev in store.load(a.session_id)}
        for seq, etype, digest in a.acked:
            ev = stored.get(seq)
            if ev is None or ev.type.value != etype or _digest(ev.data) != digest:
                missing.append(f"{a.session_id}#{seq}")
            else:
                verified += 1
    sessions_in_store = len(store.sessions())
    latencies = sorted(x for a in crew for x in a.latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    return DemoReport(
        agents=agents,
        turns=turns,
        events=sum(a.events for a in crew),
        compactions=sum(a.compactions for a in crew),
        crashes=sum(a.crashes for a in crew),
        crashes_in_flight=sum(a.crashes_in_flight for a in crew),
        acked_after_crash=sum(a.acked_after_crash for a in crew),
        restarts=restarts,
        retries=sum(a.retries for a in crew),
        seconds=seconds,
        p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
        p99_ms=1000 * p99,
        verified=verified,
        missing=missing,
        sessions_in_store=sessions_in_store,
        errors=[f"{a.session_id}: {type(a.error).__name__}: {a.error}" for a in crew if a.error],
    )


DEMO_SCHEMA: Final = "nous_actor_demo"


def check_demo_schema(dsn: str, schema: str = DEMO_SCHEMA, *, keep: bool = False) -> str | None:
    """Why the demo must not use ``schema`` on the server ``dsn``, or None if it may.

    Without ``keep`` the demo replaces ``schema``: allowed if it is missing or
    an earlier demo made it (it holds the ``nous_actor_demo`` table), nothing
    else. With ``keep`` any nous_actor store will do (another application's
    schema is refused when the store opens). Nothing is changed by the check.

    Raises:
        StoreError: the server cannot be reached.
    """
    kind = _schema_kind(dsn, schema)
    if kind == "store" and not keep:
        return (
            f"schema {schema!r} on the server holds something the demo did not make; it was "
            "left unchanged: pass another --schema, or add --keep to add the demo's sessions "
            "to a nous_actor store there"
        )
    return None


def _schema_kind(dsn: str, schema: str) -> Literal["missing", "demo", "store"]:
    import psycopg

    from nous_actor.errors import StoreError

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_namespace n LEFT JOIN pg_class c "
                "ON c.relnamespace = n.oid AND c.relname = %s AND c.relkind = 'r' "
                "WHERE n.nspname = %s",
                (DEMO_TABLE, schema),
            ).fetchall()
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"could not reach the PostgreSQL server: {first}") from exc
    if not found:
        return "missing"
    return "demo" if found[0][1] else "store"


def run_demo_postgres(
    dsn: str,
    *,
    schema: str = DEMO_SCHEMA,
    keep: bool = False,
    agents: int = 4,
    turns: int = 12,
    crash_rate: float = 0.02,
    seed: int = 7,
    progress: TextIO | None = sys.stderr,
) -> DemoReport:
    """Run the demo on a PostgreSQL server (a `PostgresStore` in ``schema``) and verify it.

    Replaces ``schema`` only if an earlier demo made it (see
    `check_demo_schema`); with ``keep`` it adds to it. Needs the ``postgres``
    extra (psycopg 3).

    Raises:
        ValueError: a bad count or rate, or a schema the demo may not replace
            (left unchanged).
        StoreError: the server cannot be reached, or the schema is not a store.
    """
    import psycopg
    from psycopg import sql

    from nous_actor.store.postgres import PostgresStore

    _check_counts(agents, turns, crash_rate)
    refusal = check_demo_schema(dsn, schema, keep=keep)
    if refusal is not None:
        raise ValueError(refusal)
    kind = _schema_kind(dsn, schema)
    if kind == "demo" and not keep:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    store = PostgresStore(dsn, schema=schema)
    try:
        if kind == "missing" or (kind == "demo" and not keep):
            table = sql.Identifier(schema, DEMO_TABLE)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE {} (made timestamptz NOT NULL, agents int, turns int, "
                        "seed int)"
                    ).format(table)
                )
                conn.execute(
                    sql.SQL("INSERT INTO {} VALUES (now(), %s, %s, %s)").format(table),
                    (agents, turns, seed),
                )
        return _run(store, agents, turns, crash_rate, seed, progress)
    finally:
        store.close()


def format_report(r: DemoReport, db: str | Path) -> str:
    """The summary table a person reads at the end of the demo."""
    rows = [
        ("agents x turns", f"{r.agents} x {r.turns}"),
        ("events acknowledged", f"{r.events}"),
        ("compactions", f"{r.compactions}"),
        ("crashes injected", f"{r.crashes}"),
        ("  with appends in flight", f"{r.crashes_in_flight}"),
        ("restarts (from the store)", f"{r.restarts}"),
        ("acknowledged after the crash", f"{r.acked_after_crash}"),
        ("calls retried after a crash", f"{r.retries}"),
        ("events/s", f"{r.events_per_second:,.0f}"),
        ("append latency p50 / p99", f"{r.p50_ms:.2f} ms / {r.p99_ms:.2f} ms"),
        ("sessions in the store", f"{r.sessions_in_store}"),
        (
            "acknowledged events in the store",
            f"{r.verified}/{r.events}" + (" all present" if not r.missing else " MISSING"),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"Supervised agents on {db}", "-" * (width + 24)]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    for err in r.errors:
        lines.append(f"  error: {err}")
    if r.missing:
        lines.append(f"  missing: {', '.join(r.missing[:10])}")
    lines.append("OK: nothing acknowledged was lost." if r.ok else "FAILED: see above.")
    return "\n".join(lines)
