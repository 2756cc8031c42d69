"""Benchmark of what a snapshot leaves on disk (G26).

``vacuum.snapshot``: a SQLite file of many sessions, their events appended
interleaved through sessions (as group commits write them): user and
assistant messages, a large tool result every fifth event, and at the end,
per session, a few tool results replaced by short stubs and a summary that
replaces the first 60% of the session. Each session is then snapshotted
through the public path (``Session.snapshot()``), which drops well over half
of the file's events. The goal: the file is then at most 1.2x a ``VACUUM``ed
copy of it (``VACUUM INTO``, made after the store is closed).

Checked before the number counts: every session holds exactly what its
snapshot kept (counted with plain SQL), and at least half the events were
dropped. Context rows: the file against its packed copy before the snapshots
(what interleaved appends leave), how long the snapshots took in all and the
slowest one (a snapshot that vacuums holds the write lock while it copies the
file), and how many vacuums ran.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, Final

import structlog.testing

from bench import harness as h
from nous_actor import Replace, Session, SQLiteStore

__all__ = ["BENCHMARKS", "main"]

GOAL_ID: Final = "G26"
GOAL: Final = 1.2
SUMMARISED: Final = 0.6
"""The share of each session its summary replaces."""


def _session_events(sid: str, n: int, rng_seed: int) -> list[tuple[str, dict[str, Any]]]:
    """The (type, data) of one session's ``n`` events, the replacing ones last."""
    out: list[tuple[str, dict[str, Any]]] = []
    tools: list[int] = []
    for i in range(n - 4):
        if i % 5 == 4:
            tools.append(i)
            body = f"{sid} result {i} " + "r" * (1500 + (i * rng_seed) % 1000)
            out.append(("tool_result", {"content": body, "tool_call_id": f"c{i}"}))
        elif i % 2:
            out.append(("assistant_message", {"content": f"{sid} answer {i} " + "a" * 300}))
        else:
            out.append(("user_message", {"content": f"{sid} question {i} " + "q" * 120}))
    for i in tools[-3:]:  # late tool results shrunk to stubs: drops between kept events
        stub = {"content": "[elided]", "tool_call_id": f"c{i}", "surface_op": Replace(i, i)}
        out.append(("tool_result", stub))
    cut = int((n - 4) * SUMMARISED)
    out.append(("system_message", {"content": f"summary of {sid}", "surface_op": Replace(0, cut)}))
    return out


def _build(store: SQLiteStore, sessions: int, events: int) -> int:
    """Append every session's events, interleaved, through sessions; returns the count."""
    plans = {f"s{s:04d}": _session_events(f"s{s:04d}", events, s + 1) for s in range(sessions)}
    handles = {sid: Session.start(sid, store=store, timeout=60.0) for sid in plans}
    try:
        futures = []
        for i in range(events):
            for sid, plan in plans.items():
                if i < len(plan):
                    futures.append(handles[sid].append(*plan[i]))
            if len(futures) > 20_000:
                futures[-1].get(timeout=60.0)
        for f in futures:
            f.get(timeout=60.0)
    finally:
        for s in handles.values():
            s.stop()
    return sum(len(p) for p in plans.values())


def _mb(size: float) -> str:
    return f"{size / 1e6:.2f} MB"


def _packed(path: Path, folder: Path) -> int:
    copy = folder / f"packed-{time.monotonic_ns()}.db"
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("VACUUM INTO ?", (str(copy),))
    conn.close()
    size = copy.stat().st_size
    copy.unlink()
    return size


def _on_disk(path: Path) -> int:
    """The database file and its WAL, if any."""
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _stored(path: Path) -> tuple[int, dict[str, int]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT session_id, count(*) FROM events GROUP BY 1").fetchall()
    conn.close()
    counts = {str(sid): int(n) for sid, n in rows}
    return sum(counts.values()), counts


def bench_snapshot(cfg: h.Config) -> h.Section:
    sec = h.Section()
    sessions = cfg.pick(200, 20)
    events = cfg.pick(400, 150)
    with h.scratch("vacuum") as folder:
        path = folder / "store.db"
        h.progress(f"vacuum: building {sessions} sessions x {events} events")
        with SQLiteStore(path, durability="normal") as store:
            total = _build(store, sessions, events)
        before = _on_disk(path)
        packed_before = _packed(path, folder)
        h.progress(f"vacuum: {_mb(before)} file; snapshotting each session")
        took: list[float] = []
        dropped: dict[str, int] = {}
        with (
            SQLiteStore(path, durability="normal") as store,
            structlog.testing.capture_logs() as logs,
        ):
            for sid in store.sessions():
                chat = Session.start(sid, store=store, timeout=60.0)
                try:
                    t0 = time.perf_counter()
                    dropped[sid] = chat.snapshot().get(timeout=60.0)
                    took.append(time.perf_counter() - t0)
                finally:
                    chat.stop()
        vacuums = sum(1 for e in logs if e.get("event") == "store.vacuumed")
        after = _on_disk(path)
        packed = _packed(path, folder)
        kept, counts = _stored(path)
    gone = sum(dropped.values())
    problems = []
    if kept + gone != total:
        problems.append(f"{kept} kept + {gone} dropped != {total} appended")
    if gone < total / 2:
        problems.append(f"the snapshots dropped {gone} of {total} events, under half")
    per = {sid: events_of - dropped[sid] for sid, events_of in _plan_sizes(sessions, events)}
    if counts != per:
        problems.append("a session's stored events differ from what its snapshot kept")
    ratio = after / packed
    sec.rows.append(
        h.goal_row(
            GOAL_ID,
            f"vacuum: file after snapshots dropping {gone / total:.0%} of {h.fmt_count(total)} "
            f"events ({sessions} sessions)",
            ours=_mb(after),
            baseline=f"VACUUMed copy {_mb(packed)}",
            ratio=f"{ratio:.3f}x",
            value=ratio,
            sense="<=",
            target=GOAL,
            goal=f"<= {GOAL}x a VACUUMed copy",
            numbers={
                "file_bytes": after,
                "packed_bytes": packed,
                "events": total,
                "dropped": gone,
                "sessions": sessions,
                "vacuums": vacuums,
                "problems": problems,
            },
            valid=not problems,
        )
    )
    sec.rows.append(
        h.info_row(
            "vacuum: the file before the snapshots (interleaved appends)",
            _mb(before),
            f"VACUUMed copy {_mb(packed_before)}",
            f"{before / packed_before:.3f}x",
            file_bytes=before,
            packed_bytes=packed_before,
        )
    )
    sec.rows.append(
        h.info_row(
            f"vacuum: {sessions} snapshots, {vacuums} of them vacuuming the file",
            f"{sum(took):.2f} s in all",
            f"slowest {max(took) * 1000:.0f} ms",
            "-",
            seconds=sum(took),
            slowest_s=max(took),
            vacuums=vacuums,
        )
    )
    sec.notes.append(
        "vacuum: a snapshot vacuums the file once the bytes snapshots dropped since the last "
        "vacuum reach a tenth of it (files up to 128 MiB; larger ones: SQLiteStore.vacuum()); "
        "the slowest snapshot is one that vacuumed, holding the write lock while it copied"
    )
    for p in problems:
        sec.notes.append(f"vacuum: PROBLEM: {p}")
    return sec


def _plan_sizes(sessions: int, events: int) -> list[tuple[str, int]]:
    return [
        (f"s{s:04d}", len(_session_events(f"s{s:04d}", events, s + 1))) for s in range(sessions)
    ]


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("vacuum.snapshot", "a snapshot's file against a packed copy", bench_snapshot),
)


def main(argv: list[str] | None = None) -> int:
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
