"""Google ADK's session service: `NousSessionService` beside ADK's `DatabaseSessionService`.

Both on a SQLite file (ours ``durability="full"``; ADK's through SQLAlchemy and
aiosqlite, SQLite's defaults), fed the same ADK events, timed side by side in
one run, GC on.

* ``adk.get_session``: a 10k-event session read back whole and with a
  recent-events config (the last 10 events): ours from a service that has
  read it before (as an app's long-lived service does at each run), from a
  fresh service (its first read: the state folded from the log, only the
  events returned decoded), and ADK's database service.
* ``adk.list_sessions``: the sessions of one user, 10k of them, with their
  state.
* ``adk.appends``: 50 concurrent runs on 50 sessions, each appending the
  events of a run (a user message, a function call, its response, an answer
  with a state delta) one after the other, as a Runner does.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

from bench import harness as h

__all__ = ["BENCHMARKS", "main"]

T = TypeVar("T")
APP: Final = "bench"
USER: Final = "user"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, h.JOIN_TIMEOUT))


def _events(n: int, base: float) -> list[Any]:
    """``n`` events of a conversation: user text, a function call, its response, an answer
    with a state delta, in turn."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    out: list[Any] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            content = types.Content(role="user", parts=[types.Part(text=f"question {i}")])
            out.append(Event(author="user", content=content, timestamp=base + i))
        elif kind == 1:
            call = types.Part.from_function_call(name="lookup", args={"q": f"q{i}", "n": i})
            content = types.Content(role="model", parts=[call])
            out.append(Event(author="agent", content=content, timestamp=base + i))
        elif kind == 2:
            resp = types.Part.from_function_response(name="lookup", response={"hits": [i, i]})
            content = types.Content(role="user", parts=[resp])
            out.append(Event(author="agent", content=content, timestamp=base + i))
        else:
            content = types.Content(role="model", parts=[types.Part(text=f"answer {i} " * 8)])
            actions = EventActions(state_delta={"turns": i, "last": f"answer {i}"})
            out.append(Event(author="agent", content=content, actions=actions, timestamp=base + i))
    return out


class _Ours:
    """A registry on a SQLite file and a service over it."""

    def __init__(self, path: Path, max_sessions: int = 30_000) -> None:
        from nous_actor import Sessions, SQLiteStore
        from nous_actor.integrations.adk import NousSessionService

        self.store = SQLiteStore(path, durability="full")
        self.sessions = Sessions(self.store, max_sessions=max_sessions, timeout=120)
        self.service = NousSessionService(self.sessions)

    def fresh(self) -> Any:
        from nous_actor.integrations.adk import NousSessionService

        return NousSessionService(self.sessions)

    async def aclose(self) -> None:
        await self.sessions.aclose()
        self.store.close()


def _database(path: Path) -> Any:
    from google.adk.sessions.database_session_service import DatabaseSessionService

    return DatabaseSessionService(f"sqlite+aiosqlite:///{path}")


async def _fill(service: Any, session_id: str, events: list[Any]) -> None:
    """Our session fed through append_event, one event after the other, as a Runner does."""
    session = await service.create_session(app_name=APP, user_id=USER, session_id=session_id)
    for ev in events:
        await service.append_event(session, ev.model_copy(deep=True))


async def _fill_db_bulk(db: Any, session_id: str, events: list[Any]) -> None:
    """ADK's database session fed the same events as its append_event stores them
    (``StorageEvent.from_event``), in one transaction: feeding 10k events one append at a
    time takes minutes on SQLite, and only the timed reads matter here."""
    session = await db.create_session(app_name=APP, user_id=USER, session_id=session_id)
    schema = db._get_schema_classes()
    async with db.database_session_factory() as sql:
        for ev in events:
            sql.add(schema.StorageEvent.from_event(session, ev))
        await sql.commit()


async def _timed(work: Awaitable[T]) -> tuple[int, T]:
    """Nanoseconds to await ``work`` (made just before: nothing of it ran yet), its result."""
    import time

    t0 = time.perf_counter_ns()
    result = await work
    return time.perf_counter_ns() - t0, result


def bench_get_session(cfg: h.Config) -> h.Section:
    """A 10k-event session read back whole and recent-10, ours vs ADK's database service."""
    from google.adk.sessions.base_session_service import GetSessionConfig

    sec = h.Section()
    n = cfg.pick(10_000, 400)
    repeats = cfg.pick(5, 2)
    recent = GetSessionConfig(num_recent_events=10)
    events = _events(n, 1_700_000_000.0)
    times: dict[str, list[int]] = {
        k: []
        for k in ("warm_all", "cold_all", "db_all", "warm_recent", "cold_recent", "db_recent")
    }

    async def body(folder: Path) -> None:
        ours = _Ours(folder / "ours.db")
        db = _database(folder / "adk.db")
        try:
            h.progress(f"adk.get_session: feeding {n} events to each service")
            await _fill(ours.service, "long", events)
            await _fill_db_bulk(db, "long", events)
            warm = ours.service
            await warm.get_session(app_name=APP, user_id=USER, session_id="long")
            for k in range(repeats):
                h.progress(f"adk.get_session: repeat {k + 1}/{repeats}")
                for name, config in (("all", None), ("recent", recent)):
                    t, got = await _timed(
                        warm.get_session(
                            app_name=APP, user_id=USER, session_id="long", config=config
                        )
                    )
                    assert got is not None
                    times[f"warm_{name}"].append(t)
                    cold = ours.fresh()
                    t, got = await _timed(
                        cold.get_session(
                            app_name=APP, user_id=USER, session_id="long", config=config
                        )
                    )
                    assert got is not None
                    times[f"cold_{name}"].append(t)
                    t, other = await _timed(
                        db.get_session(
                            app_name=APP, user_id=USER, session_id="long", config=config
                        )
                    )
                    assert other is not None
                    assert len(other.events) == len(got.events)
                    times[f"db_{name}"].append(t)
                    h.settle()
        finally:
            await db.close()
            await ours.aclose()

    with h.scratch("adk-get") as folder:
        _run(body(folder))
    stats = {k: h.Stats.of([float(x) for x in v]) for k, v in times.items()}
    for name, label in (("all", "whole session"), ("recent", "recent 10 events")):
        db = stats[f"db_{name}"]
        for shape in ("warm", "cold"):
            mine = stats[f"{shape}_{name}"]
            q = h.ratios(times[f"db_{name}"], times[f"{shape}_{name}"])
            what = (
                f"ADK get_session, {n}-event session, {label}, "
                f"{'service that read it before' if shape == 'warm' else 'fresh service'}"
            )
            ours_text = h.fmt_time_spread(mine)
            base_text = f"DatabaseSessionService {h.fmt_time_spread(db)}"
            ratio_text = h.fmt_ratio(q.median, q.min, q.max)
            numbers = {"ours_ns": mine.as_dict(), "database_ns": db.as_dict(), "events": n}
            if name == "all" and shape == "warm":
                sec.rows.append(
                    h.goal_row(
                        "G18",
                        what,
                        ours=ours_text,
                        baseline=base_text,
                        ratio=ratio_text,
                        value=q.median,
                        sense=">=",
                        target=10.0,
                        goal=">= 10x DatabaseSessionService",
                        numbers=numbers,
                    )
                )
            elif name == "recent" and shape == "cold":
                sec.rows.append(
                    h.goal_row(
                        "G19",
                        what,
                        ours=ours_text,
                        baseline=base_text,
                        ratio=ratio_text,
                        value=mine.median / 1e6,
                        sense="<=",
                        target=10.0,
                        goal="<= 10 ms",
                        unit="ms",
                        numbers=numbers,
                    )
                )
            else:
                sec.rows.append(h.info_row(what, ours_text, base_text, ratio_text, **numbers))
    sec.notes.append(
        f"adk.get_session: one session of {n} ADK events (text, function calls and "
        "responses, state deltas) on a SQLite file per service, ours fed through "
        "append_event, ADK's database fed in one transaction (StorageEvent rows, as its "
        "append_event writes them; one by one it takes minutes). A fresh NousSessionService "
        "reads a recent-events config from the tail of the log back to the last state "
        "checkpoint, and a whole session by folding the log and decoding every event; one "
        "that read the session before reads only what was appended since. Median [min-max] of "
        f"{repeats} repeats, alternating, GC on."
    )
    return sec


def bench_list_sessions(cfg: h.Config) -> h.Section:
    """list_sessions of one user with 10k sessions."""
    sec = h.Section()
    n = cfg.pick(10_000, 300)
    repeats = cfg.pick(5, 2)
    times: list[int] = []
    fresh_times: list[int] = []

    async def body(folder: Path) -> None:
        maker = _Ours(folder / "list.db", max_sessions=n + 100)
        try:
            h.progress(f"adk.list_sessions: creating {n} sessions")
            for start in range(0, n, 500):
                await asyncio.gather(
                    *(
                        maker.service.create_session(
                            app_name=APP, user_id=USER, session_id=f"s{i}", state={"i": i}
                        )
                        for i in range(start, min(n, start + 500))
                    )
                )
        finally:
            await maker.aclose()
        h.settle()
        ours = _Ours(folder / "list.db")  # the sessions are stored, not running
        try:
            await ours.service.list_sessions(app_name=APP, user_id=USER)
            for k in range(repeats):
                h.progress(f"adk.list_sessions: repeat {k + 1}/{repeats}")
                t, got = await _timed(ours.service.list_sessions(app_name=APP, user_id=USER))
                assert len(got.sessions) == n
                times.append(t)
                fresh = ours.fresh()
                t, got = await _timed(fresh.list_sessions(app_name=APP, user_id=USER))
                assert len(got.sessions) == n
                fresh_times.append(t)
                h.settle()
        finally:
            await ours.aclose()

    with h.scratch("adk-list") as folder:
        _run(body(folder))
    s = h.Stats.of([float(x) for x in times])
    f = h.Stats.of([float(x) for x in fresh_times])
    sec.rows.append(
        h.goal_row(
            "G20",
            f"ADK list_sessions, one user with {n} sessions (with state)",
            ours=h.fmt_time_spread(s),
            baseline="-",
            ratio="-",
            value=s.median / 1e6,
            sense="<=",
            target=200.0,
            goal="<= 200 ms",
            unit="ms",
            numbers={"ours_ns": s.as_dict(), "sessions": n},
        )
    )
    sec.rows.append(
        h.info_row(
            f"ADK list_sessions, one user with {n} sessions, fresh service",
            h.fmt_time_spread(f),
            ours_ns=f.as_dict(),
            sessions=n,
        )
    )
    sec.notes.append(
        f"adk.list_sessions: {n} sessions created by one registry, listed by a new one on the "
        "same file (stored, not running): the store's index (one query, no event decoded) "
        "joined with the user's directory of sessions and their state (a session per user, "
        "folded once per service, then read from where it was left). GC on."
    )
    return sec


async def _runs(service: Any, runs: int, per_run: int, tag: str, serialise: bool = False) -> int:
    """``runs`` concurrent coroutines, each appending ``per_run`` events to its own session;
    returns the nanoseconds of the appends. ``serialise``: one append at a time (an
    asyncio lock around each)."""
    lock = asyncio.Lock()
    sessions = [
        await service.create_session(app_name=APP, user_id=USER, session_id=f"{tag}-{r}")
        for r in range(runs)
    ]
    batches = [_events(per_run, 1_700_000_000.0 + r) for r in range(runs)]

    async def one(session: Any, events: list[Any]) -> None:
        for ev in events:
            if serialise:
                async with lock:
                    await service.append_event(session, ev)
            else:
                await service.append_event(session, ev)

    t, _ = await _timed(
        asyncio.gather(*(one(s, b) for s, b in zip(sessions, batches, strict=True)))
    )
    return t


def bench_appends(cfg: h.Config) -> h.Section:
    """50 concurrent runs on 50 sessions appending their events, ours vs ADK's database."""
    sec = h.Section()
    runs = cfg.pick(50, 10)
    per_run = cfg.pick(20, 4)
    repeats = cfg.pick(3, 2)
    ours_t: list[int] = []
    db_t: list[int] = []

    async def body(folder: Path, k: int) -> None:
        ours = _Ours(folder / f"ours-{k}.db")
        db = _database(folder / f"adk-{k}.db")
        try:
            if k % 2 == 0:
                ours_t.append(await _runs(ours.service, runs, per_run, "o"))
                db_t.append(await _runs(db, runs, per_run, "d", serialise=True))
            else:
                db_t.append(await _runs(db, runs, per_run, "d", serialise=True))
                ours_t.append(await _runs(ours.service, runs, per_run, "o"))
        finally:
            await db.close()
            await ours.aclose()

    with h.scratch("adk-appends") as folder:
        for k in range(repeats):
            h.progress(f"adk.appends: {runs} runs x {per_run} events, repeat {k + 1}/{repeats}")
            _run(body(folder, k))
            h.settle()
    total = runs * per_run
    mine = h.Stats.of([total / (t / 1e9) for t in ours_t])
    base = h.Stats.of([total / (t / 1e9) for t in db_t])
    q = h.ratios(db_t, ours_t)
    sec.rows.append(
        h.goal_row(
            "G21",
            f"ADK append_event from {runs} concurrent runs on {runs} sessions, SQLite",
            ours=h.fmt_rate_spread(mine),
            baseline=f"DatabaseSessionService {h.fmt_rate_spread(base)}",
            ratio=h.fmt_ratio(q.median, q.min, q.max),
            value=q.median,
            sense=">=",
            target=5.0,
            goal=">= 5x DatabaseSessionService",
            numbers={"ours_per_s": mine.as_dict(), "database_per_s": base.as_dict()},
        )
    )
    sec.notes.append(
        f"adk.appends: {runs} coroutines on one loop, each appending the {per_run} events of "
        "a run to its own session one after the other (append_event awaited each time, as "
        "a Runner does), both services on a SQLite file. DatabaseSessionService on SQLite "
        "fails such concurrent appends ('database is locked': two deferred transactions "
        "upgrading to write), so its appends are serialised by an asyncio lock, the least "
        "it needs to run; ours are not. Median [min-max] of "
        f"{repeats} repeats, alternating order, GC on."
    )
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark(
        "adk.get_session",
        "ADK get_session of a 10k-event session: whole and recent, vs DatabaseSessionService",
        bench_get_session,
    ),
    h.Benchmark(
        "adk.list_sessions", "ADK list_sessions of one user with 10k sessions", bench_list_sessions
    ),
    h.Benchmark(
        "adk.appends",
        "ADK append_event from 50 concurrent runs, vs DatabaseSessionService",
        bench_appends,
    ),
)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.adk [--quick]``: run this module alone and print its rows."""
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    sys.exit(main())
