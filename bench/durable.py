"""Benchmarks of the durable path on SQLite: appends acked after commit (G3), the sessions
sweep (G4) and recovery (G8).

``durable.appends``: 100 sessions x 100 events into one SQLite file,
``durability="full"``, each append acknowledged only once committed, in three
caller shapes (pipelined; a thread per session doing ``append().get()``; one
asyncio loop with a coroutine per session ``await``-ing each append), against
the peers of :mod:`bench.peers` doing the same work in the same run, and
against the floor (raw ``sqlite3`` inserting the same pre-encoded rows 100 per
transaction, :mod:`bench.schema`), on fresh files each repeat; the CPU the
pipelined shape spends per append, every thread together (G37).
``durable.sweep``: the asyncio shape with 100, 1,000 and 10,000 live sessions,
the same number of appends in all. ``durable.recovery``: ``Session.start`` of a
100k-event session from its file vs a bare ``SELECT`` + stdlib ``json.loads``
(the library's own JSON decoder beside it).

Every run is checked before its number counts: every acknowledged seq in
order, ``count()`` per session, and the rows in the file counted afterwards
with plain SQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal

from bench import harness as h
from bench import peers, schema
from bench.workload import build, realistic_specs
from nous_actor import Event, Log, Message, Session, SQLiteStore

__all__ = ["BENCHMARKS"]

PEER_GOAL: Final = 10.0
THREADS_RECORDER_GOAL: Final = 5.0
"""DESIGN.md §8: a thread per session >= 5x eventsourcing's recorder (10x the others)."""
FLOOR_GOAL: Final = 0.5
"""DESIGN.md §8: pipelined >= 0.5x raw sqlite3 inserting the same rows (the floor)."""
FLOOR_LAYOUTS: Final = ("numbered", "rowid")
"""The floor's candidate layouts (`bench.schema.LAYOUTS`): the library's events table of
schema version 3 (sessions numbered, rows clustered on (number, seq)), and a rowid table
with a unique (session_id, seq) index; the faster (median) is the floor."""
CPU_GOAL_US: Final = 29.5
"""DESIGN.md §8: CPU per durable append, every thread together, half of the last
profile's ~59 us (G37)."""
CPU_LAST_PROFILE_US: Final = 59.0
SWEEP_GOAL: Final = 0.9
SWEEP_EVENTS: Final = 50_000
"""Events per sweep run, whatever the number of sessions (each appends its share)."""
RECOVERY_GOAL: Final = 1.0
"""DESIGN.md §8: recovery <= 1.0x a bare SELECT + stdlib json.loads of the same rows."""
PIPELINE_THREADS: Final = 4

Shape = Literal["pipelined", "threads", "asyncio"]
SHAPES: Final[tuple[Shape, ...]] = ("pipelined", "threads", "asyncio")
SHAPE_TEXT: Final[dict[Shape, str]] = {
    "pipelined": f"(a) pipelined, {PIPELINE_THREADS} caller threads",
    "threads": "(b) a thread per session, append().get()",
    "asyncio": "(c) one asyncio loop, a coroutine per session, await append()",
}


def _payload(j: int) -> dict[str, Any]:
    return {"content": f"short text {j}"}


def _usage() -> tuple[float, int, int]:
    """CPU seconds (user + system) and context switches (voluntary, involuntary) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_nvcsw, r.ru_nivcsw


_TICK: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds used so far by each live thread of this process, with its role (Linux)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), "?")
        role = re.sub(r"[-_ .\d]+$", "", name) or name
        out[int(tid)] = (role, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def _cpu_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], n: int
) -> dict[str, float]:
    """us of CPU per event by thread role, over the threads alive at the end."""
    by: dict[str, float] = {}
    for tid, (role, cpu) in after.items():
        by[role] = by.get(role, 0.0) + (cpu - before.get(tid, (role, 0.0))[1]) * 1e6 / n
    return {k: round(v, 1) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v > 0}


def _committer_stats(store: SQLiteStore) -> tuple[int, int]:
    """(commits, items) of the store's group committer, (0, 0) if the library hides them."""
    try:
        from nous_actor.store.committer import committer_for

        c = committer_for(store)
        return int(c.commits), int(c.items)
    except Exception:  # internal API, being rewritten: context only
        return 0, 0


def ours(
    folder: Path, shape: Shape, sessions: int, events: int, base: Path | None = None
) -> tuple[int, dict[str, Any]]:
    """One run of ours; wall ns of the appends (session start untimed) and what was counted.
    With ``base``, the run starts from a copy of that file (holding other sessions)."""
    path = folder / "ours.db"
    if base is not None:
        shutil.copyfile(base, path)
    store = SQLiteStore(path, durability="full")
    ids = [f"session-{i}" for i in range(sessions)]
    label = f"durable ours {shape} {sessions}x{events}"
    start_ns, handles = h.timed(
        lambda: [Session.start(sid, store=store, timeout=h.JOIN_TIMEOUT) for sid in ids]
    )
    seqs: list[list[int]] = [[] for _ in ids]
    try:
        u0, c0 = _usage(), _thread_cpu()
        if shape == "pipelined":

            def pipelined(k: int) -> float:
                t0 = time.thread_time()
                mine = range(k, sessions, PIPELINE_THREADS)
                futs = {
                    i: [handles[i].append("user_message", _payload(j)) for j in range(events)]
                    for i in mine
                }
                for i, fs in futs.items():
                    seqs[i] = [f.get(timeout=h.JOIN_TIMEOUT).seq for f in fs]
                return time.thread_time() - t0

            ns, callers = h.run_threads(pipelined, min(PIPELINE_THREADS, sessions), label)
        elif shape == "threads":

            def one_thread(i: int) -> float:
                t0 = time.thread_time()
                s = handles[i]
                seqs[i] = [
                    s.append("user_message", _payload(j)).get(timeout=h.JOIN_TIMEOUT).seq
                    for j in range(events)
                ]
                return time.thread_time() - t0

            ns, callers = h.run_threads(one_thread, sessions, label)
        else:

            async def main() -> int:
                async def one(i: int) -> None:
                    s = handles[i]
                    got = seqs[i]
                    for j in range(events):
                        got.append((await s.append("user_message", _payload(j))).seq)

                t0 = time.perf_counter_ns()
                await asyncio.wait_for(
                    asyncio.gather(*(one(i) for i in range(sessions))), h.JOIN_TIMEOUT
                )
                return time.perf_counter_ns() - t0

            ns = asyncio.run(main())
            callers = []  # the loop runs in this thread, alive at the end: counted there
        u1, c1 = _usage(), _thread_cpu()
        commits, items = _committer_stats(store)
        for i, got in enumerate(seqs):
            if got != list(range(events)):
                raise AssertionError(f"{label}: {ids[i]} acknowledged seqs other than 0..n-1")
        counts = [s.count().get(timeout=h.JOIN_TIMEOUT) for s in handles]
        if counts != [events] * sessions:
            raise AssertionError(f"{label}: a session's count() is not {events}")
    finally:
        for s in handles:
            s.stop(timeout=h.JOIN_TIMEOUT)
        store.close()
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT session_id, COUNT(*), MAX(seq) FROM events "
            "WHERE session_id LIKE 'session-%' GROUP BY session_id"
        ).fetchall()
    finally:
        conn.close()
    if sorted(rows) != sorted((sid, events, events - 1) for sid in ids):
        raise AssertionError(f"{label}: the file does not hold every event ({rows[:3]}...)")
    n = sessions * events
    by_thread = _cpu_by_role(c0, c1, n)
    if callers:  # the caller threads ended before the count: their own clocks
        by_thread[f"{len(callers)} caller threads"] = round(sum(callers) * 1e6 / n, 1)
    return ns, {
        "start_ns": start_ns,
        "commits": commits,
        "items": items,
        "cpu_us_per_event": (u1[0] - u0[0]) * 1e6 / n,
        "switches_per_event": (u1[1] - u0[1] + u1[2] - u0[2]) / n,
        "cpu_us_per_event_by_thread": dict(sorted(by_thread.items(), key=lambda kv: -kv[1])),
    }


# -- G3. 100 sessions x 100 events, three caller shapes, vs the peers and the floor; G37 ---

PeerRun = Callable[[Path, int, int], int]
_PEER_RUNS: Final[dict[str, tuple[str, PeerRun]]] = {
    "eventsourcing threads": ("eventsourcing", peers.eventsourcing_threads),
    "eventsourcing asyncio": ("eventsourcing", peers.eventsourcing_asyncio),
    "agents asyncio": ("agents", peers.agents_asyncio),
}
_PEER_FOR: Final[dict[Shape, dict[str, str]]] = {
    # our shape -> peer library -> which peer run it is compared with
    "pipelined": {"eventsourcing": "eventsourcing threads", "agents": "agents asyncio"},
    "threads": {"eventsourcing": "eventsourcing threads", "agents": "agents asyncio"},
    "asyncio": {"eventsourcing": "eventsourcing asyncio", "agents": "agents asyncio"},
}
_PEER_TEXT: Final = {
    "eventsourcing threads": "eventsourcing (threads)",
    "eventsourcing asyncio": "eventsourcing (coroutines, executor)",
    "agents asyncio": "Agents SQLiteSession (coroutines)",
}
_LETTER: Final[dict[Shape, str]] = {"pipelined": "(a)", "threads": "(b)", "asyncio": "(c)"}


def _peer_goal(shape: Shape, lib: str) -> float:
    """How many times a peer's rate ``shape`` must reach (DESIGN.md §8): a thread per
    session 5x eventsourcing's recorder, else 10x."""
    return THREADS_RECORDER_GOAL if (shape, lib) == ("threads", "eventsourcing") else PEER_GOAL


def floor(
    folder: Path, layout: schema.Layout, sessions: int, events: int
) -> tuple[int, dict[str, Any]]:
    """The floor of G3: raw ``sqlite3`` (WAL, ``synchronous=FULL``) writing the rows ours
    writes (``sessions`` x ``events`` appends, pre-encoded as the store encodes them) into
    a fresh file of ``layout``, `bench.schema.ROWS_PER_COMMIT` rows per transaction; the
    wall ns of the transactions (the statements made before the clock starts)."""
    ids = [f"session-{i}" for i in range(sessions)]
    run = schema.write_rows(layout, folder, schema.append_rows(ids, events))
    if run.rows != sessions * events:
        raise AssertionError(f"durable floor {layout.name}: {run.rows} rows timed")
    return run.ns, {"rows": run.rows}


def _median_split(runs: list[dict[str, Any]]) -> dict[str, float]:
    """us of CPU per event by thread role, the median of each role over ``runs``."""
    roles: dict[str, list[float]] = {}
    for x in runs:
        for role, us in x["cpu_us_per_event_by_thread"].items():
            roles.setdefault(role, []).append(us)
    split = {role: h.Stats.of(v).median for role, v in roles.items()}
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


def bench_appends(cfg: h.Config) -> h.Section:
    """100 sessions x 100 appends acked after commit, three shapes, vs the peers and the
    floor (G3); the CPU per append of the pipelined shape (G37)."""
    sessions, events = cfg.pick((100, 100), (20, 10))
    repeats = cfg.pick(3, 1)
    total = sessions * events
    runs: dict[str, Callable[[Path], tuple[int, dict[str, Any]]]] = {
        "pipelined": partial(ours, shape="pipelined", sessions=sessions, events=events)
    }
    for name in FLOOR_LAYOUTS:  # beside the shape it is the floor of
        runs[f"floor {name}"] = partial(
            floor, layout=schema.layout_named(name), sessions=sessions, events=events
        )
    for shape in SHAPES[1:]:
        runs[shape] = partial(ours, shape=shape, sessions=sessions, events=events)
    for name, (lib, fn) in _PEER_RUNS.items():
        if peers.AVAILABLE[lib]:
            runs[name] = partial(
                lambda folder, fn, s, e: (fn(folder, s, e), {}), fn=fn, s=sessions, e=events
            )
    times: dict[str, list[int]] = {k: [] for k in runs}
    extra: dict[str, list[dict[str, Any]]] = {k: [] for k in runs}
    with h.problems_logged() as logs:
        pragmas = peers.pragmas()
        for k in range(repeats):
            order = list(runs) if k % 2 == 0 else list(reversed(runs))
            for name in order:
                h.progress(
                    f"durable.appends: {name}, {sessions}x{events}, repeat {k + 1}/{repeats}"
                )
                with h.scratch("appends") as folder:
                    ns, info = runs[name](folder)
                times[name].append(ns)
                extra[name].append(info)
                h.settle()
    errors = [e for e in logs if e.get("log_level") in ("error", "critical")]
    if errors:
        raise AssertionError(f"durable.appends: the library logged errors: {errors[:3]}")
    rate = {k: h.Stats.of([total * 1e9 / t for t in v]) for k, v in times.items()}
    sec = h.Section()
    size = f"{sessions}x{events}"
    best = max(FLOOR_LAYOUTS, key=lambda name: rate[f"floor {name}"].median)
    best_run = f"floor {best}"
    for shape in SHAPES:
        runs_info = extra[shape]
        per_commit = [x["items"] / x["commits"] for x in runs_info if x["commits"]]
        sec.rows.append(
            h.info_row(
                f"durable {size} {SHAPE_TEXT[shape]}",
                h.fmt_rate_spread(rate[shape]),
                sessions=sessions,
                events_per_session=events,
                shape=shape,
                ours_events_per_s=rate[shape].as_dict(),
                events_per_commit=per_commit,
                session_start_ns=[x["start_ns"] for x in runs_info],
                cpu_us_per_event=[x["cpu_us_per_event"] for x in runs_info],
                switches_per_event=[x["switches_per_event"] for x in runs_info],
            )
        )
        for lib in peers.PEERS:
            goal = _peer_goal(shape, lib)
            run = _PEER_FOR[shape][lib]
            what = f"durable {size} {_LETTER[shape]} {shape} vs {_PEER_TEXT[run]}"
            if run not in times:
                sec.rows.append(
                    h.Row(what, h.fmt_rate(rate[shape].median), "peer not installed", "-",
                          f">= {goal:g}x", "info", {"peer": lib, "installed": False})
                )  # fmt: skip
                continue
            q = h.ratios(times[run], times[shape])
            sec.rows.append(
                h.goal_row(
                    "G3",
                    what,
                    ours=h.fmt_rate(rate[shape].median),
                    baseline=h.fmt_rate_spread(rate[run]),
                    ratio=h.fmt_ratio(q.median, q.min, q.max) + " faster",
                    value=q.median,
                    sense=">=",
                    target=goal,
                    goal=f">= {goal:g}x",
                    numbers={
                        "shape": shape,
                        "peer": run,
                        "ours_events_per_s": rate[shape].as_dict(),
                        "peer_events_per_s": rate[run].as_dict(),
                        "ratio": q.as_dict(),
                    },
                )
            )
        if shape != "pipelined":
            continue
        q = h.ratios(times[best_run], times[shape])  # the floor's time / ours: ours / its rate
        sec.rows.append(
            h.goal_row(
                "G3",
                f"durable {size} (a) pipelined vs the floor: raw sqlite3, the same rows "
                f"{schema.ROWS_PER_COMMIT} per transaction ({best} table, the faster)",
                ours=h.fmt_rate(rate[shape].median),
                baseline="floor " + h.fmt_rate_spread(rate[best_run]),
                ratio=h.fmt_ratio(q.median, q.min, q.max) + " the floor's rate",
                value=q.median,
                sense=">=",
                target=FLOOR_GOAL,
                goal=f">= {FLOOR_GOAL:g}x",
                numbers={
                    "shape": shape,
                    "floor": best,
                    "ours_events_per_s": rate[shape].as_dict(),
                    "floor_events_per_s": rate[best_run].as_dict(),
                    "ratio": q.as_dict(),
                },
            )
        )
        for name in FLOOR_LAYOUTS:
            fr = rate[f"floor {name}"]
            qf = h.ratios(times[f"floor {name}"], times[shape])
            sec.rows.append(
                h.info_row(
                    f"floor {size}: raw sqlite3, {schema.layout_named(name).text}",
                    h.fmt_rate_spread(fr),
                    "ours (a) " + h.fmt_rate(rate[shape].median),
                    h.fmt_ratio(qf.median, qf.min, qf.max) + " ours / it",
                    layout=name,
                    floor_events_per_s=fr.as_dict(),
                    ratio=qf.as_dict(),
                )
            )
    pipe = extra["pipelined"]
    cpu = h.Stats.of([x["cpu_us_per_event"] for x in pipe])
    split = _median_split(pipe)
    split_text = ", ".join(f"{k} {v:.1f}" for k, v in split.items()) or "-"
    sec.rows.append(
        h.goal_row(
            "G37",
            f"CPU per durable append, {size} (a) pipelined, all threads together",
            ours=f"{cpu.median:.1f} [{cpu.min:.1f}-{cpu.max:.1f}] us",
            baseline=f"last profile ~{CPU_LAST_PROFILE_US:g} us",
            ratio=h.fmt_ratio(cpu.median / CPU_LAST_PROFILE_US) + " that",
            value=cpu.median,
            sense="<=",
            target=CPU_GOAL_US,
            goal=f"<= {CPU_GOAL_US:g} us",
            unit="us",
            numbers={
                "shape": "pipelined",
                "cpu_us_per_event": cpu.as_dict(),
                "cpu_us_per_event_by_thread": split,
                "by_thread_per_run": [x["cpu_us_per_event_by_thread"] for x in pipe],
            },
        )
    )
    sec.data["peer_pragmas"] = pragmas
    sec.data["ns"] = times

    def cost(shape: Shape) -> str:
        cpu = h.Stats.of([x["cpu_us_per_event"] for x in extra[shape]]).median
        sw = h.Stats.of([x["switches_per_event"] for x in extra[shape]]).median
        pc = [x["items"] / x["commits"] for x in extra[shape] if x["commits"]]
        commit = f", {h.Stats.of(pc).median:.0f} events/commit" if pc else ""
        roles = extra[shape][-1]["cpu_us_per_event_by_thread"]
        split = ", ".join(f"{k} {v:.0f}" for k, v in list(roles.items())[:3])
        return (
            f"{shape} {cpu:.0f} us CPU and {sw:.1f} switches per event{commit} "
            f"(us per event by thread, last run: {split or '-'})"
        )

    missing = [p for p, ok in peers.AVAILABLE.items() if not ok]
    sec.notes += [
        f"{sessions} sessions x {events} appends of {{'content': 'short text <j>'}} into one "
        "SQLite file, fresh per run; events/s from the release of the callers to the last "
        f"acknowledgement (session start untimed); median [min-max] of {repeats} repeats, the "
        "runs alternating order; ratio = peer time / ours in the same repeat (higher is "
        "better). GC on.",
        "ours = Session.start(id, store=SQLiteStore(file, durability='full')) (WAL, "
        "synchronous=FULL); an append's future resolves only after its group commit. (a) "
        f"{PIPELINE_THREADS} threads each issue every append of their sessions, then get every "
        "future; (b) one thread per session doing append(...).get() in a row; (c) one "
        "asyncio loop, one coroutine per session doing `await session.append(...)` in a row.",
        "peers (bench/peers.py), one event per call, same file layout: eventsourcing = "
        "SQLiteApplicationRecorder(SQLiteDatastore(file)).insert_events([StoredEvent]); "
        "for (a) and (b) a thread per session; for (c) a coroutine per session awaiting "
        "loop.run_in_executor(None, insert_events, ...) (the loop's default executor). Agents "
        "= agents.SQLiteSession(id, file) with `await add_items([item])` from a coroutine per "
        "session on one loop (its API is async only, so it is the peer of every shape). "
        f"Files as the peers write them: eventsourcing {pragmas.get('eventsourcing', '-')}; "
        f"agents {pragmas.get('agents', '-')}."
        + (f" Not installed, not measured: {', '.join(missing)}." if missing else ""),
        f"floor = raw sqlite3 (no store, no actors; bench/schema.py), WAL, synchronous=FULL, "
        f"the rows ours writes ({sessions} sessions x {events} appends, pre-encoded as the "
        "store encodes them, its time format included) into a fresh file, "
        f"{schema.ROWS_PER_COMMIT} rows per transaction in multi-row INSERTs (each round gives "
        "every session its next row, in a random order, as a group commit takes them), the "
        "statements made before the clock starts; into two layouts, the library's events "
        "table of schema version 3 ('numbered': sessions numbered, rows clustered on "
        "(number, seq)) and a rowid table with a UNIQUE INDEX (session_id, seq) ('rowid'); the "
        f"faster median is the floor (here: {best}). It runs beside ours in the same repeats, "
        "the order alternating; ratio = the floor's time / ours in the same repeat.",
        "goals (G3): pipelined and asyncio >= "
        f"{PEER_GOAL:g}x both peers; a thread per session >= {THREADS_RECORDER_GOAL:g}x "
        f"eventsourcing and >= {PEER_GOAL:g}x SQLiteSession; pipelined >= {FLOOR_GOAL:g}x "
        "the floor. The events/s of each shape are context.",
        f"G37: CPU per append of (a), every thread of the process together (getrusage "
        f"RUSAGE_SELF over the timed part), median [min-max] of {repeats} repeats; goal <= "
        f"{CPU_GOAL_US:g} us (half of the ~{CPU_LAST_PROFILE_US:g} us of the last profile). "
        "By thread (us per event, the median of each over the repeats; threads alive at the "
        "end from /proc/self/task, the caller threads from their own clocks): " + split_text + ".",
        "where our time goes (whole-process getrusage over the timed part, medians): "
        + "; ".join(cost(s) for s in SHAPES)
        + ".",
        "checked on every run: each session's acknowledged seqs are 0..n-1 in order and "
        "count() = n (ours); every file's rows counted with plain SQL after the run; the "
        "library logged no error.",
    ]
    return sec


# -- G4. throughput vs number of sessions -----------------------------------------------------


def bench_sweep(cfg: h.Config) -> h.Section:
    """Durable events/s with 100, 1,000 and 10,000 live sessions, asyncio callers (G4)."""
    counts = cfg.pick((100, 1_000, 10_000), (10, 30, 100))
    total = cfg.pick(SWEEP_EVENTS, 1_000)
    repeats = cfg.pick(3, 1)
    shape: Shape = "asyncio"
    times: dict[int, list[int]] = {s: [] for s in counts}
    starts: dict[int, list[int]] = {s: [] for s in counts}
    per: dict[int, int] = {s: max(1, total // s) for s in counts}
    prefill = cfg.pick(PREFILL_EVENTS, 20_000)
    filled: dict[int, list[int]] = {s: [] for s in counts}
    with h.problems_logged() as logs, h.scratch("sweep-base") as base_folder:
        base = base_folder / "filled.db"
        _prefill(base, prefill, cfg.pick(PREFILL_SESSIONS, 200))
        for k in range(repeats):
            for s in counts if k % 2 == 0 else tuple(reversed(counts)):
                for series, start_from in (("empty", None), ("pre-filled", base)):
                    h.progress(
                        f"durable.sweep: {s} live sessions x {per[s]} appends (asyncio), "
                        f"{series} file, repeat {k + 1}/{repeats}"
                    )
                    with h.scratch("sweep") as folder:
                        ns, info = ours(folder, shape, s, per[s], start_from)
                    if start_from is None:
                        times[s].append(ns)
                        starts[s].append(info["start_ns"])
                    else:
                        filled[s].append(ns)
                    h.settle()
    errors = [e for e in logs if e.get("log_level") in ("error", "critical")]
    if errors:
        raise AssertionError(f"durable.sweep: the library logged errors: {errors[:3]}")

    def rate(s: int) -> h.Stats:
        return h.Stats.of([s * per[s] * 1e9 / t for t in times[s]])

    def rates(s: int) -> list[float]:
        return [s * per[s] * 1e9 / t for t in times[s]]

    sec = h.Section()
    top, ref = counts[-1], counts[0]
    for s in counts:
        r = rate(s)
        sec.rows.append(
            h.info_row(
                f"sweep {s} live sessions x {per[s]} appends, {shape}",
                h.fmt_rate_spread(r),
                sessions=s,
                events_per_session=per[s],
                shape=shape,
                ours_events_per_s=r.as_dict(),
            )
        )

    def filled_rates(s: int) -> list[float]:
        return [s * per[s] * 1e9 / t for t in filled[s]]

    for s in counts:
        r = h.Stats.of(filled_rates(s))
        sec.rows.append(
            h.info_row(
                f"sweep {s} live sessions x {per[s]} appends, {shape}, file pre-filled "
                f"with {prefill:,} events",
                h.fmt_rate_spread(r),
                sessions=s,
                events_per_session=per[s],
                shape=shape,
                prefilled_events=prefill,
                ours_events_per_s=r.as_dict(),
            )
        )

    def g4(what: str, top_rates: list[float], ours: str, **numbers: Any) -> h.Row:
        """The G4 row of ``top_rates`` (the rates with ``top`` sessions) against the
        rates with ``ref`` sessions on an empty file, repeat by repeat."""
        q = h.ratios(top_rates, rates(ref))
        return h.goal_row(
            "G4",
            what,
            ours=ours,
            baseline=f"{h.fmt_rate(rate(ref).median)} at {ref}",
            ratio=h.fmt_ratio(q.median, q.min, q.max),
            value=q.median,
            sense=">=",
            target=SWEEP_GOAL,
            goal=f">= {SWEEP_GOAL:g}x",
            numbers={"shape": shape, "sessions": top, "vs_sessions": ref, **numbers}
            | {"ratio": q.as_dict()},
        )

    sec.rows.append(
        g4(
            f"sweep {shape}: rate with {top} live sessions on a file pre-filled with "
            f"{prefill:,} events / with {ref} on an empty one",
            filled_rates(top),
            f"{h.fmt_rate(h.Stats.of(filled_rates(top)).median)} at {top}, pre-filled",
            prefilled_events=prefill,
        )
    )
    sec.rows.append(
        g4(
            f"sweep {shape}: rate with {top} live sessions / with {ref}",
            rates(top),
            f"{h.fmt_rate(rate(top).median)} at {top}",
            events_per_run=total,
        )
    )
    same = h.ratios(filled_rates(top), filled_rates(ref))
    sec.rows.append(
        h.info_row(
            f"sweep {shape}: rate with {top} live sessions / with {ref}, both on the "
            "pre-filled file",
            f"{h.fmt_rate(h.Stats.of(filled_rates(top)).median)} at {top}",
            f"{h.fmt_rate(h.Stats.of(filled_rates(ref)).median)} at {ref}",
            h.fmt_ratio(same.median, same.min, same.max),
            shape=shape,
            sessions=top,
            vs_sessions=ref,
            prefilled_events=prefill,
            ratio=same.as_dict(),
        )
    )
    sec.data["sweep"] = {
        "events_per_session": {str(s): per[s] for s in counts},
        "events_per_run": total,
        "repeats": repeats,
        "sessions": list(counts),
        "shapes": {shape: [{"sessions": s, "events_per_s": rate(s).as_dict()} for s in counts]},
        "session_start_ns": {str(s): v for s, v in starts.items()},
    }
    start_text = ", ".join(
        f"{s}: {h.fmt_time(h.Stats.of(v).median / s)}" for s, v in starts.items() if v
    )
    sec.notes += [
        f"{', '.join(map(str, counts))} live sessions in one SQLite file (durability full), "
        f"{total} appends per run shared among them ({', '.join(str(per[s]) for s in counts)} "
        "each), shape (c) of durable.appends: one asyncio loop, a coroutine per session "
        "awaiting each append; every session started (untimed) before the callers are "
        f"released; a fresh file per run; median [min-max] events/s of {repeats} repeats, "
        "counts alternating order. GC on.",
        f"pre-filled: each run starts from a copy of one file holding {prefill:,} events of "
        "other sessions (written beforehand, untimed, in batches that interleave "
        "them), then runs as above.",
        f"goal (G4): rate with {top} live sessions / rate with {ref} on an empty file in the "
        f"same repeat >= {SWEEP_GOAL:g}x, with {top} on the empty file and with {top} on the "
        f"pre-filled one (the ratio of both counts on the pre-filled file is context). "
        f"Session.start per session (untimed, median): {start_text}. The "
        "threads and memory of as many live sessions: runtime.threads (G14), "
        "runtime.idle_memory (G15).",
    ]
    return sec


PREFILL_EVENTS: Final = 1_000_000
"""Events of other sessions in the pre-filled file of the sweep (the issue's "a file that
already holds 1M events")."""
PREFILL_SESSIONS: Final = 10_000
"""Sessions those events belong to (100 each)."""


def _prefill(path: Path, events: int, sessions: int) -> None:
    """A SQLite store holding ``events`` events of ``sessions`` other sessions, written as
    a busy file would have them: each batch gives many sessions a few events each."""
    store = SQLiteStore(path, durability="normal")
    t = datetime.now(UTC)
    per = max(1, events // sessions)
    try:
        written = 0
        for start in range(0, per, 10):
            n = min(10, per - start)
            batch = {
                f"other-{i}": [
                    Event(start + j, "user_message", t, _payload(start + j)) for j in range(n)
                ]
                for i in range(sessions)
            }
            refused = store.write(batch)
            if refused:
                raise AssertionError(f"durable.sweep: the pre-fill was refused: {refused}")
            written += n * sessions
            h.progress(f"durable.sweep: pre-filling the file, {written:,}/{events:,} events")
    finally:
        store.close()


# -- G8. recovery -------------------------------------------------------------------------

_SELECT: Final = "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq"


def _library_decoder() -> tuple[str, Callable[[Any, int], Any]]:
    """The library's own decoder of a stored row's ``data`` (what ``SQLiteStore.load`` runs
    on every row, through ``event_from_row``), named; stdlib ``json.loads`` if it moved."""
    try:
        from nous_actor.core.codec import _load_stored

        return "codec._load_stored", _load_stored
    except ImportError:  # internal API: fall back, and say so in the row
        return "json.loads (library decoder not found)", lambda data, seq: json.loads(data)


DECODER_NAME, DECODE = _library_decoder()


def _floor(path: Path, sid: str, stdlib: bool = False) -> int:
    """A bare ``SELECT`` + the decoder of every row's data, on a fresh connection: the
    library's, called as ``event_from_row`` calls it, or stdlib ``json.loads``."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(_SELECT, (sid,)).fetchall()
        if stdlib:
            loads = json.loads
            datas = [loads(r[3]) for r in rows]
        else:
            decode = DECODE
            datas = [decode(r[3], r[0]) for r in rows]
    finally:
        conn.close()
    return len(datas)


def _recover(path: Path, sid: str) -> tuple[int, Session, SQLiteStore]:
    """``Session.start(sid, store=SQLiteStore(path))`` until ``count()`` answers."""
    store = SQLiteStore(path)
    s = Session.start(sid, store=store, timeout=h.JOIN_TIMEOUT)
    return s.count().get(timeout=h.JOIN_TIMEOUT), s, store


def _phases(path: Path, sid: str) -> dict[str, int] | None:
    """Where recovery's time goes, step by step as the session's reader runs them: SELECT,
    decode each row (its data alone with the floor's decoder, then the whole row into an
    Event), restore the Log, fold it."""
    try:
        from nous_actor.core.codec import event_from_row
    except ImportError:
        return None
    conn = sqlite3.connect(path)
    try:
        rows_ns, rows = h.timed(lambda: conn.execute(_SELECT, (sid,)).fetchall())
    finally:
        conn.close()
    data_ns, _ = h.timed(lambda: [DECODE(r[3], r[0]) for r in rows])
    decode_ns, events = h.timed(lambda: [event_from_row(*r) for r in rows])
    restore_ns, log = h.timed(partial(Log.restore, events))
    fold_ns, _ = h.timed(log._folded)  # what a session does on start: messages stay lazy
    return {
        "select": rows_ns,
        "data column alone": data_ns,
        "rows to events": decode_ns,
        "restore": restore_ns,
        "fold": fold_ns,
    }


def bench_recovery(cfg: h.Config) -> h.Section:
    """``Session.start`` of a 100k-event session from SQLite vs SELECT + stdlib
    ``json.loads`` (G8), the library's own decoder beside it."""
    n = cfg.pick(100_000, 5_000)
    repeats = cfg.pick(5, 1)  # a shared machine: a median of 5, alternating order
    sid = "recovered"
    h.progress(f"durable.recovery: building a {h.fmt_count(n)}-event session")
    log = build(realistic_specs(n, replace_every=100), n, "durable.recovery")
    messages: list[Message] = log.derive_messages()
    times: dict[str, list[int]] = {"ours": [], "floor": [], "stdlib": [], "derive": []}
    gc_off_ns = 0
    phases: list[dict[str, int]] = []
    with h.scratch("recovery") as folder, h.problems_logged() as logs:
        path = folder / "recovery.db"
        store = SQLiteStore(path)
        try:
            refused = store.write({sid: log.events()})
        finally:
            store.close()
        if refused:
            raise AssertionError(f"durable.recovery: the write was refused: {refused}")
        size = path.stat().st_size
        for k in range(repeats + 1):
            last = k == repeats  # one more run, GC off, as a side figure
            h.progress(
                f"durable.recovery: {h.fmt_count(n)} events, "
                + ("one GC-off side run" if last else f"repeat {k + 1}/{repeats}")
            )
            steps = ("ours", "floor", "stdlib")
            for step in steps if k % 2 == 0 else steps[::-1]:
                if step != "ours":
                    if last:
                        continue
                    ns, got = h.timed(partial(_floor, path, sid, step == "stdlib"))
                    if got != n:
                        raise AssertionError(f"durable.recovery: SELECT read {got} rows, not {n}")
                    times[step].append(ns)
                    h.settle()
                    continue
                if last:
                    with h.gc_off():
                        ns, (count, s, st) = h.timed(partial(_recover, path, sid))
                    gc_off_ns = ns
                else:
                    ns, (count, s, st) = h.timed(partial(_recover, path, sid))
                    times["ours"].append(ns)
                try:
                    dns, got_msgs = h.timed(
                        partial(s.derive_messages().get, timeout=h.JOIN_TIMEOUT)
                    )
                    if not last:
                        times["derive"].append(dns)
                finally:
                    s.stop(timeout=h.JOIN_TIMEOUT)
                    st.close()
                if count != log.count() or got_msgs != messages:
                    raise AssertionError("durable.recovery: the recovered session differs")
                h.settle()
        p = _phases(path, sid)
        if p is not None:
            phases.append(p)
    errors = [e for e in logs if e.get("log_level") in ("error", "critical")]
    if errors:
        raise AssertionError(f"durable.recovery: the library logged errors: {errors[:3]}")
    o, f, j, d = (h.Stats.of(times[k]) for k in ("ours", "floor", "stdlib", "derive"))
    q = h.ratios(times["ours"], times["floor"])
    qj = h.ratios(times["ours"], times["stdlib"])
    nums = {
        "n": n,
        "ours_ns": o.as_dict(),
        "floor_ns": f.as_dict(),
        "floor_decoder": DECODER_NAME,
        "stdlib_floor_ns": j.as_dict(),
        "gc_off_ns": gc_off_ns,
    }
    sec = h.Section()
    what = f"recovery {h.fmt_count(n)} ev: Session.start -> count()"
    sec.rows += [
        h.goal_row(
            "G8",
            what + " vs SELECT + stdlib json.loads",
            ours=h.fmt_time_spread(o) + f" (GC off {h.fmt_time(gc_off_ns)})",
            baseline="SELECT+json.loads " + h.fmt_time_spread(j),
            ratio=h.fmt_ratio(qj.median, qj.min, qj.max) + " the floor",
            value=qj.median,
            sense="<=",
            target=RECOVERY_GOAL,
            goal=f"<= {RECOVERY_GOAL:g}x",
            numbers={**nums, "ratio": qj.as_dict()},
        ),
        h.info_row(
            what + " vs SELECT + the library's decoder",
            h.fmt_time(o.median),
            "SELECT+decode " + h.fmt_time_spread(f),
            h.fmt_ratio(q.median, q.min, q.max) + " that",
            **nums,
            ratio=q.as_dict(),
        ),
        h.info_row(
            f"recovery {h.fmt_count(n)} ev: then derive_messages()",
            h.fmt_time_spread(d),
            n=n,
            derive_ns=d.as_dict(),
        ),
    ]
    sec.data["phases_ns"] = phases
    sec.data["file_bytes"] = size
    phase_text = (
        ", ".join(f"{k} {v / 1e6:.0f} ms" for k, v in phases[0].items()) if phases else "-"
    )
    sec.notes += [
        f"a realistic {h.fmt_count(n)}-event session (a replace every 100 events; "
        f"{size / n:.0f} B/event on disk) written in one transaction; ours = the time from "
        "SQLiteStore(path) + Session.start(id, store=...) until count().get() answers (open, "
        "claim, load, rebuild, fold); the count and then derive_messages() are checked equal "
        f"to the log's. Floor = on a fresh sqlite3 connection, `{_SELECT}` fetchall + "
        f"stdlib json.loads on every row's data (the goal's floor, G8: ours <= "
        f"{RECOVERY_GOAL:g}x it); beside it, as context, the same with the library's own JSON "
        f"decoder ({DECODER_NAME}: the decoder SQLiteStore.load runs on each row's data, "
        "freezing as it parses); same file, side by side (alternating order); ratio = ours / "
        f"floor per repeat; median [min-max] of {repeats} repeats, GC on; the GC-off figure "
        "is one extra run beside it. The OS page cache is warm for both.",
        f"where recovery's time goes (one run, each step timed alone): {phase_text}; "
        "'rows to events' includes the data column's decoding, which 'data column alone' "
        "times by itself (with the library's decoder).",
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("durable.appends", "G3 durable 100x100, SQLite full, 3 shapes", bench_appends),
    h.Benchmark("durable.sweep", "G4 durable throughput vs sessions", bench_sweep),
    h.Benchmark("durable.recovery", "G8 recovery of a 100k-event session", bench_recovery),
)
