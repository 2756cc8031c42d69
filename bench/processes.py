"""Benchmarks of several processes on one store: hand-off, web workers, reads by non-holders.

``processes`` (``--only processes``), with worker processes of `bench.fleet`:

* ``processes.handoff``: a worker process holds a session and is idle; this
  process opens it with ``open(id, wait=...)``, timed from the call until the
  handle is ready (the worker hands it over, this registry recovers it). Then
  the worker takes it back with a request (this registry hands over) and the
  next round starts. On SQLite (G22: median <= 50 ms) and on PostgreSQL (G23:
  median <= 100 ms; not run without a server).
* ``processes.mix``: 4 worker processes on one SQLite file serve requests for
  20 sessions from 32 concurrent clients in random order (each request reads
  the session without taking it, then writes one turn through ``append_many``
  on the handle ``open(id)`` gives, which calls the worker that holds the
  session): requests per second (G24: >= 500). As context, the same with each
  request moving its session to the worker asked (``open(id, wait=30)``), and
  both on PostgreSQL. Every run's histories are checked (whole turns, in
  order, each request once) before its number counts.
* ``processes.cold_read``: a worker process holds a 1,000-event session; this
  process reads it as a non-holder, a new `SessionReader` each time
  (``derive_messages``: one read of the rows, decoded and folded) (G25: median
  <= 2 ms); then the same while this process holds a big heap (2 million small
  live dicts and lists, the GC on): median <= 2 ms too.

The cyclic GC stays on; stores use ``durability="full"``.

Run alone: ``python -m bench.processes [--quick]``; or ``python -m bench --only processes``.
"""

from __future__ import annotations

import gc
import random
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench import harness as h
from bench.fleet import Fleet, ask, check_histories, open_store, run_clients
from bench.postgres import _schema, server

__all__ = ["BENCHMARKS", "main"]

HANDOFF_SQLITE_ID: Final = "G22"
HANDOFF_PG_ID: Final = "G23"
MIX_ID: Final = "G24"
COLD_READ_ID: Final = "G25"
HANDOFF_SQLITE_GOAL_MS: Final = 50.0
HANDOFF_PG_GOAL_MS: Final = 100.0
MIX_GOAL: Final = 500.0
COLD_READ_GOAL_MS: Final = 2.0
BIG_HEAP_OBJECTS: Final = 2_000_000
"""Small live objects (half dicts, half lists) the reading process holds in G25's second row."""


def _row(goal_id: str, what: str, ours: str, value: float, sense: h.Sense, target: float,
         goal: str, unit: str, numbers: dict[str, Any], valid: bool = True) -> h.Row:  # fmt: skip
    """A goal row when the goal id is known to the suite, else one judged on its own."""
    if goal_id in h.GOALS:
        return h.goal_row(
            goal_id, what, ours=ours, baseline="-", ratio="-", value=value, sense=sense,
            target=target, goal=goal, unit=unit, numbers=numbers, valid=valid,
        )  # fmt: skip
    ok = (value >= target if sense == ">=" else value <= target) and valid
    return h.Row(what, ours, "-", "-", goal, "pass" if ok else "fail", numbers)


def _ms(seconds: float) -> str:
    return h.fmt_time(seconds * 1e9)


# -- hand-off from an idle holder -------------------------------------------------------------


def _handoffs(spec: str, folder: Path, rounds: int) -> list[float]:
    """Seconds each ``open(id, wait=)`` took to take the session from an idle worker."""
    from nous_actor import Sessions

    fleet = Fleet(spec, folder, wait=10.0)
    fleet.start(1)
    (worker,) = fleet.live()
    took: list[float] = []
    store = open_store(spec)
    sessions = Sessions(store, timeout=30.0)
    try:
        for i in range(rounds + 1):
            reply = ask(worker, "handoff", f"w{i}")  # the worker takes it (back)
            if reply is None or not reply.get("ok"):
                raise RuntimeError(f"the worker failed a request: {reply}")
            t0 = time.perf_counter()
            chat = sessions.open("handoff", wait=10.0)
            took.append(time.perf_counter() - t0)
            if chat.count().get() != 4 * (i + 1):
                raise RuntimeError("the session was not recovered whole")
    finally:
        sessions.close()
        store.close()
        fleet.stop()
    return took[1:]  # the first round also started the worker's registry


def _handoff_row(goal_id: str, label: str, took: list[float], target_ms: float) -> h.Row:
    median = statistics.median(took)
    return _row(
        goal_id,
        f"hand-off from an idle holder ({label})",
        f"median {_ms(median)}, max {_ms(max(took))}",
        median * 1000,
        "<=",
        target_ms,
        f"<= {target_ms:g} ms",
        "ms",
        {"seconds": took},
    )


def bench_handoff(cfg: h.Config) -> h.Section:
    sec = h.Section()
    rounds = cfg.pick(30, 5)
    with h.scratch("handoff") as folder:
        took = _handoffs(f"sqlite:{folder / 'handoff.db'}", folder, rounds)
    sec.rows.append(_handoff_row(HANDOFF_SQLITE_ID, "SQLite", took, HANDOFF_SQLITE_GOAL_MS))
    with server() as dsn:
        if dsn is None:
            sec.rows.append(h.info_row("hand-off on PostgreSQL: not run", "no server"))
            return sec
        with _schema(dsn) as schema, h.scratch("handoff-pg") as folder:
            took = _handoffs(f"postgres:{schema}:{dsn}", folder, rounds)
        sec.rows.append(_handoff_row(HANDOFF_PG_ID, "PostgreSQL", took, HANDOFF_PG_GOAL_MS))
    sec.notes.append(
        "hand-off: a worker process holds the session and is idle; timed from "
        "open(id, wait=10) until the handle is ready (asked, handed over, recovered)"
    )
    return sec


# -- the 4-worker mix ---------------------------------------------------------------------------


MOVE_WAIT: Final = 30.0
"""The workers' ``open(id, wait=)`` in the context rows: each request moves its session."""


def _mix(spec: str, folder: Path, requests: int, wait: float) -> tuple[float, list[str]]:
    """Requests per second of 4 workers, and what is wrong with the histories; ``wait``
    0 forwards each call to the session's holder, above 0 moves the session."""
    fleet = Fleet(spec, folder, wait=wait)
    open_store(spec).close()
    fleet.start(4)
    rng = random.Random(24)
    sent = [(f"s{rng.randrange(20)}", f"r{i}") for i in range(requests)]
    try:
        out = run_clients(fleet, sent, 32, seed=24)
    finally:
        fleet.stop()
    store = open_store(spec)
    try:
        histories = {sid: store.load(sid) for sid in store.sessions()}
    finally:
        store.close()
    problems = out.errors + check_histories(histories, out.acked, {r: s for s, r in sent})
    return requests / out.seconds, problems


def bench_mix(cfg: h.Config) -> h.Section:
    sec = h.Section()
    n = cfg.pick(1000, 200)
    with h.scratch("mix") as folder:
        rate, problems = _mix(f"sqlite:{folder / 'mix.db'}", folder, n, 0.0)
    sec.rows.append(
        _row(
            MIX_ID,
            "4 web workers on one SQLite file, 20 sessions, 32 clients",
            f"{h.fmt_count(rate)} req/s",
            rate,
            ">=",
            MIX_GOAL,
            f">= {MIX_GOAL:g} req/s",
            "req/s",
            {"requests": n, "per_s": rate, "problems": problems[:5]},
            valid=not problems,
        )
    )
    with h.scratch("mix-move") as folder:
        rate, problems = _mix(f"sqlite:{folder / 'mix.db'}", folder, n, MOVE_WAIT)
    sec.rows.append(_context_row("SQLite", "each request moving its session", n, rate, problems))
    with server() as dsn:
        if dsn is not None:
            for how, wait in (("", 0.0), ("each request moving its session", MOVE_WAIT)):
                with _schema(dsn) as schema, h.scratch("mix-pg") as folder:
                    rate, problems = _mix(f"postgres:{schema}:{dsn}", folder, n, wait)
                sec.rows.append(_context_row("PostgreSQL", how, n, rate, problems))
    sec.notes.append(
        "mix: each request reads the session without taking it, then opens it and writes "
        "one turn in one append_many; clients pick a worker at random. The goal row uses "
        "open(id): a session another worker holds is called there. 'moving' rows use "
        f"open(id, wait={MOVE_WAIT:g}): the session moves to the worker asked, each request"
    )
    return sec


def _context_row(store: str, how: str, n: int, rate: float, problems: list[str]) -> h.Row:
    return h.info_row(
        f"4 web workers on {store}, 20 sessions, 32 clients" + (f", {how}" if how else ""),
        f"{h.fmt_count(rate)} req/s" + (" (INVALID)" if problems else ""),
        requests=n,
        per_s=rate,
        problems=problems[:5],
    )


# -- a cold read by a non-holder ------------------------------------------------------------


def _big_heap(n: int) -> list[object]:
    """``n`` small live objects the cyclic GC tracks, kept alive by the caller: half
    one-item lists, half two-key dicts (each holding a list, so the GC keeps tracking it:
    a dict of atomic values only is untracked)."""
    shared: list[object] = []
    return [{"k": i, "in": shared} if i % 2 else [i] for i in range(n)]


def _cold_reads(store: Any, repeats: int) -> tuple[list[float], set[int]]:
    """Seconds of ``repeats`` cold reads (a new `SessionReader` each), and the counts read."""
    from nous_actor import SessionReader

    took: list[float] = []
    counts: set[int] = set()
    for _ in range(repeats):
        reader = SessionReader("cold", store)
        t0 = time.perf_counter()
        messages = reader.derive_messages().get()
        took.append(time.perf_counter() - t0)
        counts.add(len(messages))
    return took, counts


BUSY_READS: Final = 10
"""Cold reads made while another thread keeps the GIL busy (each way)."""


def _cold_reads_busy(store: Any, path: Path) -> tuple[list[float], set[int], list[float]]:
    """`_cold_reads` while another thread of this process runs Python without pause (an
    event loop under load), and the seconds of as many row-by-row ``SELECT``s of the
    same rows (``fetchall``, every row a step of SQLite) under the same load, alternating.
    """
    import sqlite3

    stop = threading.Event()

    def spin() -> None:
        n = 0
        while not stop.is_set():
            for _ in range(1_000):
                n += 1

    busy = threading.Thread(target=spin, name="bench-busy", daemon=True)
    conn = sqlite3.connect(path, check_same_thread=False)
    took: list[float] = []
    counts: set[int] = set()
    rowwise: list[float] = []
    busy.start()
    try:
        for k in range(BUSY_READS):
            h.progress(f"processes.cold_read: under load, {k + 1}/{BUSY_READS}")
            t, c = _cold_reads(store, 1)
            took += t
            counts |= c
            t0 = time.perf_counter()
            rows = conn.execute(
                "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq",
                ("cold",),
            ).fetchall()
            rowwise.append(time.perf_counter() - t0)
            if len(rows) != 1_000:
                raise AssertionError(f"processes.cold_read: {len(rows)} rows, not 1,000")
    finally:
        stop.set()
        busy.join(h.JOIN_TIMEOUT)
        conn.close()
    return took, counts, rowwise


def bench_cold_read(cfg: h.Config) -> h.Section:
    from nous_actor import SessionReader
    from nous_actor.core.event import Event

    sec = h.Section()
    repeats = cfg.pick(50, 10)
    heap_size = cfg.pick(BIG_HEAP_OBJECTS, 200_000)
    with h.scratch("cold") as folder:
        spec = f"sqlite:{folder / 'cold.db'}"
        store = open_store(spec)
        t = datetime.now(UTC)
        store.write(
            {
                "cold": [
                    Event(
                        i,
                        "user_message" if i % 2 else "assistant_message",
                        t,
                        {"content": f"message {i} " + "x" * 80},
                    )
                    for i in range(996)
                ]
            }
        )
        fleet = Fleet(spec, folder, wait=10.0)
        fleet.start(1)
        try:
            (worker,) = fleet.live()
            reply = ask(worker, "cold", "hold")  # 4 more events; the worker holds it now
            if reply is None or not reply.get("ok"):
                raise RuntimeError(f"the worker failed a request: {reply}")
            took, counts = _cold_reads(store, repeats)
            h.progress(f"processes.cold_read: building a heap of {h.fmt_count(heap_size)} objects")
            heap = _big_heap(heap_size)
            h.settle()  # the heap's objects now sit in the oldest generation, still tracked
            tracked = len(gc.get_objects())
            with h.gc_watch() as watch:
                heap_took, heap_counts = _cold_reads(store, repeats)
            if len(heap) != heap_size:
                raise AssertionError("processes.cold_read: the heap went away")
            del heap
            h.settle()
            busy_took, busy_counts, rowwise_took = _cold_reads_busy(store, folder / "cold.db")
            holder = SessionReader("cold", store).held_by().get()
        finally:
            fleet.stop()
            store.close()
    h.settle()
    valid = holder == f"process {worker.pid}"
    median = statistics.median(took)
    heap_median = statistics.median(heap_took)
    sec.rows.append(
        _row(
            COLD_READ_ID,
            "cold read of a 1k-event session by a non-holder (derive_messages)",
            f"median {_ms(median)}, max {_ms(max(took))}",
            median * 1000,
            "<=",
            COLD_READ_GOAL_MS,
            f"<= {COLD_READ_GOAL_MS:g} ms",
            "ms",
            {"seconds": took},
            valid=valid and counts == {998},
        )
    )
    sec.rows.append(
        h.goal_row(
            COLD_READ_ID,
            f"the same cold read, the reader's process holding a big heap "
            f"({h.fmt_count(heap_size)} live dicts and lists, GC on)",
            ours=f"median {_ms(heap_median)}, max {_ms(max(heap_took))}",
            baseline=f"no big heap: median {_ms(median)}",
            ratio=h.fmt_ratio(heap_median / median) + " that",
            value=heap_median * 1000,
            sense="<=",
            target=COLD_READ_GOAL_MS,
            goal=f"<= {COLD_READ_GOAL_MS:g} ms",
            unit="ms",
            numbers={
                "seconds": heap_took,
                "heap_objects": heap_size,
                "tracked_objects": tracked,
                "gc_ns_by_generation": watch.ns,
                "gc_collections_by_generation": watch.count,
            },
            valid=valid and heap_counts == {998},
        )
    )
    if busy_counts != {998}:
        raise AssertionError(f"processes.cold_read: read {busy_counts} messages under load")
    busy_median = statistics.median(busy_took)
    rowwise_median = statistics.median(rowwise_took)
    sec.rows.append(
        h.info_row(
            "the same cold read while another thread of the reader's process keeps the GIL "
            "busy (an event loop under load), vs a row-by-row SELECT of the same rows then",
            f"median {_ms(busy_median)}, max {_ms(max(busy_took))}",
            f"row by row: median {_ms(rowwise_median)}",
            h.fmt_ratio(busy_median / rowwise_median),
            seconds=busy_took,
            rowwise_seconds=rowwise_took,
        )
    )
    sec.notes.append(
        f"cold read: a worker process holds a 1,000-event session; this process reads it "
        f"{repeats} times, a new SessionReader each time, derive_messages().get() timed. Then "
        f"the same {repeats} reads after this process built {h.fmt_count(heap_size)} small "
        "live objects ({'k': i, 'in': a list} and [i], alternating) and collected once (so "
        f"they sit in the oldest generation; {tracked:,} objects tracked by the GC), the GC "
        "on; the "
        f"collector ran {watch.count} times by generation (0, 1, 2) during those reads, "
        f"{watch.total_ns() / 1e6:.1f} ms in all."
    )
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("processes.handoff", "hand-off from an idle holder", bench_handoff),
    h.Benchmark("processes.mix", "4 web workers on one store", bench_mix),
    h.Benchmark("processes.cold_read", "cold read by a non-holder", bench_cold_read),
)


def main(argv: list[str] | None = None) -> int:
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
