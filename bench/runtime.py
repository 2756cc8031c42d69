"""Benchmarks of the runtime as a process sees it: threads (G14), memory per idle session
(G15), opening many stored sessions at once (G16), exit without closing (G17).

``runtime.threads``: a fresh process opens 100, 1,000 and 10,000 sessions on one
SQLite file (``Sessions.aopen`` from one asyncio loop), each appends a few
events, and ``threading.active_count()`` is sampled from the loop the whole
time. ``runtime.idle_memory``: a fresh process opens N idle sessions in memory
and measures what they hold (tracemalloc and RSS), beside Pykka's
``ThreadingActor`` per session (``pinned=True``). ``runtime.open_many``: 10,000
sessions of 10 events each, stored beforehand, opened at once with
``asyncio.gather(*(sessions.aopen(id) ...))``. ``runtime.exit``: a program that
appends on a registry and ends without closing it, timed from its last line to
its exit, against the same interpreter ending after the same imports; the file
is checked for every acknowledged append.

The measurements that describe a whole process run in a child process of
their own (``python -m bench.runtime probe KIND ARGS``), so that nothing the
rest of the suite left behind is counted. The cyclic GC stays on.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any, Final

from bench import harness as h

__all__ = ["BENCHMARKS"]

THREADS_GOAL: Final = 64
IDLE_MEMORY_GOAL: Final = 4096.0
OPEN_GOAL_S: Final = 1.0
EXIT_GOAL_S: Final = 1.0
ROOT: Final = Path(__file__).resolve().parent.parent
PROBE_TIMEOUT: Final = 600.0


def _role(name: str) -> str:
    """A thread's role: its name without the numbers that tell its instances apart."""
    return re.sub(r"[-_ .]?\d+(\.\d+)?$", "", re.sub(r"\(.*\)$", "", name).strip()) or name


def _roles() -> dict[str, int]:
    return dict(Counter(_role(t.name) for t in threading.enumerate()))


def _rss() -> int:
    """Resident set size of this process in bytes (Linux; 0 elsewhere)."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


# -- probes: run in a fresh child process, print one JSON line ------------------------------


def probe_threads(path: str, count: int, events: int) -> dict[str, Any]:
    """Open ``count`` sessions on a SQLite file from one asyncio loop, append, sample threads."""
    from nous_actor import Sessions, SQLiteStore

    before = threading.active_count()
    peak_n = [before]
    peak_roles = [_roles()]
    samples: list[int] = []

    async def main() -> dict[str, Any]:
        store = SQLiteStore(path, durability="full")
        sessions = Sessions(store, max_sessions=count + 10)
        done = asyncio.Event()

        async def sampler() -> None:
            while not done.is_set():
                n = threading.active_count()
                samples.append(n)
                if n > peak_n[0]:
                    peak_n[0], peak_roles[0] = n, _roles()
                await asyncio.sleep(0.005)

        task = asyncio.create_task(sampler())
        t0 = time.perf_counter_ns()
        handles = await asyncio.gather(*(sessions.aopen(f"s-{i}") for i in range(count)))
        t1 = time.perf_counter_ns()

        async def one(i: int) -> list[int]:
            s = handles[i]
            return [
                (await s.append("user_message", {"content": f"m {j}"})).seq for j in range(events)
            ]

        seqs = await asyncio.gather(*(one(i) for i in range(count)))
        t2 = time.perf_counter_ns()
        live = threading.active_count()
        live_roles = _roles()
        counts = await asyncio.gather(*(s.count() for s in handles))
        done.set()
        await task
        if any(x != list(range(events)) for x in seqs) or set(counts) != {events}:
            raise AssertionError("runtime.threads: an acknowledged seq or a count() is off")
        await sessions.aclose(timeout=60)
        store.close()
        return {
            "count": count,
            "events": events,
            "before": before,
            "peak": max(peak_n[0], live),
            "peak_roles": peak_roles[0] if peak_n[0] >= live else live_roles,
            "live": live,
            "live_roles": live_roles,
            "samples": len(samples),
            "open_ns": t1 - t0,
            "append_ns": t2 - t1,
        }

    return asyncio.run(main())


def probe_memory(kind: str, count: int, trace: bool) -> dict[str, Any]:
    """Bytes held per idle session: ``count`` sessions opened in memory, then idle.

    ``kind``: ``registry`` (``Sessions().open(id)``), ``standalone``
    (``Session.start(id)``) or ``pinned`` (``Session.start(id, pinned=True)``: a
    Pykka ``ThreadingActor``, a thread each). ``trace``: measure with tracemalloc
    (Python heap) rather than RSS (everything, thread stacks included).
    """
    from nous_actor import Session, Sessions

    warm = 50
    registry = Sessions(max_sessions=count + warm + 10) if kind == "registry" else None
    held: list[Any] = []

    def start(i: int) -> Any:
        if registry is not None:
            return registry.open(f"s-{i}")
        return Session.start(f"s-{i}", pinned=kind == "pinned")

    if trace:
        tracemalloc.start()
    held += [start(i) for i in range(warm)]  # threads, pools and caches exist before
    for s in held:
        s.count().get(timeout=60)
    time.sleep(0.2)
    gc.collect()
    heap0 = tracemalloc.get_traced_memory()[0] if trace else 0
    rss0 = _rss()
    threads0 = threading.active_count()
    held += [start(warm + i) for i in range(count)]
    for s in held[warm:]:
        s.count().get(timeout=60)  # each one live and answering, then left idle
    time.sleep(0.5)
    gc.collect()
    heap1 = tracemalloc.get_traced_memory()[0] if trace else 0
    rss1 = _rss()
    threads1 = threading.active_count()
    if trace:
        tracemalloc.stop()
    out = {
        "kind": kind,
        "count": count,
        "trace": trace,
        "bytes_per_session": ((heap1 - heap0) if trace else (rss1 - rss0)) / count,
        "threads_before": threads0,
        "threads_after": threads1,
    }
    # The process ends here: the sessions are left open (as a program may), the
    # runtime's threads are daemons.
    return out


def probe(argv: list[str]) -> int:
    """``python -m bench.runtime probe KIND JSON``: one probe, its result as a JSON line."""
    kind, args = argv[0], json.loads(argv[1])
    with h.problems_logged():
        if kind == "threads":
            out = probe_threads(**args)
        elif kind == "memory":
            out = probe_memory(**args)
        else:
            raise SystemExit(f"unknown probe {kind!r}")
    print("RESULT " + json.dumps(out), flush=True)
    return 0


def _child(kind: str, /, **args: Any) -> dict[str, Any]:
    """Run one probe in a fresh interpreter; its result."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.runtime", "probe", kind, json.dumps(args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=False,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    raise AssertionError(
        f"runtime probe {kind} {args} failed (exit {done.returncode}): {done.stderr[-2000:]}"
    )


# -- G14. threads with many live sessions ----------------------------------------------------


def bench_threads(cfg: h.Config) -> h.Section:
    """Threads in a process with 100, 1,000, 10,000 live durable sessions (G14)."""
    counts = cfg.pick((100, 1_000, 10_000), (10, 100))
    events = cfg.pick(3, 2)
    sec = h.Section()
    results: list[dict[str, Any]] = []
    with h.scratch("threads") as folder:
        for n in counts:
            h.progress(f"runtime.threads: a process with {n} live sessions on SQLite")
            results.append(
                _child("threads", path=str(folder / f"threads-{n}.db"), count=n, events=events)
            )
    for r in results:
        roles = ", ".join(f"{k} {v}" for k, v in sorted(r["peak_roles"].items()))
        sec.rows.append(
            h.goal_row(
                "G14",
                f"threads with {r['count']} live sessions (asyncio, SQLite)",
                ours=f"{r['peak']} threads at the peak, {r['live']} live",
                baseline=f"{r['before']} before the store",
                ratio=f"{r['peak'] / THREADS_GOAL:.2g} of {THREADS_GOAL}",
                value=float(r["peak"]),
                sense="<=",
                target=float(THREADS_GOAL),
                goal=f"<= {THREADS_GOAL}",
                unit="threads",
                numbers={**r, "roles_at_peak": roles},
            )
        )
    peak = results[-1]
    sec.notes += [
        f"a fresh process per count: Sessions(SQLiteStore(file, durability='full')), "
        "asyncio.gather(*(sessions.aopen(id) ...)) for every session, then a coroutine per "
        f"session awaiting {events} appends; threading.active_count() sampled every 5 ms "
        "from the loop over the whole run, and once more with every session live after the "
        "appends; the figure judged is the peak (main thread included).",
        f"threads at the peak with {peak['count']} sessions, by role: "
        + ", ".join(f"{k} {v}" for k, v in sorted(peak["peak_roles"].items()))
        + "; open "
        + ", ".join(f"{r['count']}: {h.fmt_time(r['open_ns'])}" for r in results)
        + "; appends "
        + ", ".join(
            f"{r['count']}: {h.fmt_rate(r['count'] * r['events'] * 1e9 / r['append_ns'])}"
            for r in results
        )
        + ".",
    ]
    sec.data["runs"] = results
    return sec


# -- G15. memory per live idle session -------------------------------------------------------


def bench_idle_memory(cfg: h.Config) -> h.Section:
    """Bytes per live idle session: registry and standalone, vs a thread per session (G15)."""
    counts = cfg.pick((2_000, 10_000), (200,))
    pinned_count = cfg.pick(300, 50)
    repeats = cfg.pick(3, 1)
    got: dict[tuple[str, int, bool], list[float]] = {}
    plan = [("registry", n) for n in counts] + [("standalone", counts[-1])]
    plan.append(("pinned", pinned_count))
    for k in range(repeats):
        for kind, n in plan if k % 2 == 0 else plan[::-1]:
            for trace in (True, False):
                h.progress(
                    f"runtime.idle_memory: {n} {kind} sessions, "
                    f"{'tracemalloc' if trace else 'RSS'}, repeat {k + 1}/{repeats}"
                )
                r = _child("memory", kind=kind, count=n, trace=trace)
                got.setdefault((kind, n, trace), []).append(r["bytes_per_session"])
    pinned_heap = h.Stats.of(got[("pinned", pinned_count, True)])
    pinned_rss = h.Stats.of(got[("pinned", pinned_count, False)])

    def kb(x: float) -> str:
        return f"{x / 1024:.2g} KB"

    def spread(s: h.Stats) -> str:
        if s.n == 1:
            return kb(s.median)
        return f"{s.median / 1024:.2g} [{s.min / 1024:.2g}-{s.max / 1024:.2g}] KB"

    sec = h.Section()
    for kind, n in plan[:-1]:
        heap = h.Stats.of(got[(kind, n, True)])
        rss = h.Stats.of(got[(kind, n, False)])
        what = (
            f"idle session, {n} via Sessions().open(id)"
            if kind == "registry"
            else f"idle session, {n} via Session.start(id)"
        )
        judged = max(heap.median, rss.median)
        sec.rows.append(
            h.goal_row(
                "G15",
                what,
                ours=f"heap {spread(heap)}, RSS {spread(rss)}",
                baseline=f"thread each: heap {kb(pinned_heap.median)}, RSS "
                f"{kb(pinned_rss.median)}",
                ratio=f"{pinned_rss.median / judged:.3g}x less than a thread each (RSS)"
                if judged > 0
                else "-",
                value=judged / 1024,
                sense="<=",
                target=IDLE_MEMORY_GOAL / 1024,
                goal=f"<= {IDLE_MEMORY_GOAL / 1024:g} KB",
                unit="KB",
                numbers={
                    "kind": kind,
                    "sessions": n,
                    "tracemalloc_bytes": heap.as_dict(),
                    "rss_bytes": rss.as_dict(),
                    "pinned_sessions": pinned_count,
                    "pinned_tracemalloc_bytes": pinned_heap.as_dict(),
                    "pinned_rss_bytes": pinned_rss.as_dict(),
                },
            )
        )
    sec.notes += [
        "a fresh process per figure: 50 sessions opened first (so that the dispatcher, "
        "pools and caches exist), then N more opened in memory (no store, no event), each "
        "answering count() once, then left idle 0.5 s and gc.collect(); bytes per session = "
        "(after - before) / N, measured with tracemalloc (every Python allocation, in a run "
        "of its own) and as the RSS delta from /proc/self/statm (everything, in another "
        f"run); the figure judged is the larger of the two medians, of {repeats} repeats. "
        "GC on.",
        f"baseline: Session.start(id, pinned=True), a Pykka ThreadingActor per session (the "
        f"runtime before the dispatcher), {pinned_count} sessions the same way, per session; "
        "a thread's stack is outside tracemalloc, its touched pages are in the RSS.",
    ]
    sec.data["bytes_per_session"] = {
        f"{kind} {n} {'tracemalloc' if t else 'rss'}": v for (kind, n, t), v in got.items()
    }
    return sec


# -- G16. opening 10,000 stored sessions at once ---------------------------------------------


def _prepare(path: Path, count: int, events: int) -> None:
    """A SQLite file holding ``count`` sessions of ``events`` events each (progress shown)."""
    from bench.workload import build, realistic_specs
    from nous_actor import SQLiteStore

    evs = build(realistic_specs(events, replace_every=None), events, "runtime.open_many").events()
    store = SQLiteStore(path)
    try:
        chunk = 1_000
        for lo in range(0, count, chunk):
            hi = min(count, lo + chunk)
            refused = store.write({f"s-{i}": evs for i in range(lo, hi)})
            if refused:
                raise AssertionError(f"runtime.open_many: the write was refused: {refused}")
            h.progress(f"runtime.open_many: preparing the file, {hi}/{count} sessions written")
    finally:
        store.close()


def _open_all(path: Path, count: int, events: int) -> tuple[int, int, int, h.GcWatch, int]:
    """Open every stored session at once from one loop: (open ns, close ns, threads seen,
    what the collector did meanwhile, the objects it tracked at the start)."""
    from nous_actor import Sessions, SQLiteStore

    store = SQLiteStore(path)
    sessions = Sessions(store, max_sessions=count + 10)
    # (With the objects a smoke run froze out of the collector's sight: tracked all the same.)
    tracked = len(gc.get_objects()) + gc.get_freeze_count()
    collector = h.GcWatch()
    try:

        async def main() -> tuple[int, int]:
            gc.callbacks.append(collector)
            try:
                t0 = time.perf_counter_ns()
                handles = await asyncio.wait_for(
                    asyncio.gather(*(sessions.aopen(f"s-{i}") for i in range(count))),
                    h.JOIN_TIMEOUT,
                )
                ns = time.perf_counter_ns() - t0
            finally:
                gc.callbacks.remove(collector)
            threads = threading.active_count()
            counts = await asyncio.gather(*(s.count() for s in handles))
            if set(counts) != {events}:
                raise AssertionError(f"runtime.open_many: a session's count() is not {events}")
            return ns, threads

        ns, threads = asyncio.run(main())
    finally:
        close_ns = h.time_ns(lambda: sessions.close(timeout=60))
        store.close()
    return ns, close_ns, threads, collector, tracked


def bench_open_many(cfg: h.Config) -> h.Section:
    """``asyncio.gather`` of ``aopen`` over 10,000 stored sessions of 10 events (G16)."""
    count = cfg.pick(10_000, 500)
    events = 10
    repeats = cfg.pick(3, 1)
    opens: list[int] = []
    closes: list[int] = []
    threads: list[int] = []
    collectors: list[tuple[h.GcWatch, int]] = []
    with h.scratch("open") as folder, h.problems_logged() as logs:
        path = folder / "stored.db"
        _prepare(path, count, events)
        for k in range(repeats):
            h.progress(f"runtime.open_many: opening {count} sessions at once, {k + 1}/{repeats}")
            h.settle()
            ns, cns, th, coll, tracked = _open_all(path, count, events)
            collectors.append((coll, tracked))
            opens.append(ns)
            closes.append(cns)
            threads.append(th)
    errors = [e for e in logs if e.get("log_level") in ("error", "critical")]
    if errors:
        raise AssertionError(f"runtime.open_many: the library logged errors: {errors[:3]}")
    o, c = h.Stats.of(opens), h.Stats.of(closes)
    sec = h.Section()
    sec.rows.append(
        h.goal_row(
            "G16",
            f"open {count} stored sessions ({events} ev) at once, asyncio",
            ours=h.fmt_time_spread(o),
            baseline=f"{h.fmt_time(o.median / count)} per session",
            ratio=f"{o.median / 1e9 / OPEN_GOAL_S:.2g} of {OPEN_GOAL_S:g} s",
            value=o.median / 1e9,
            sense="<=",
            target=OPEN_GOAL_S,
            goal=f"<= {OPEN_GOAL_S:g} s",
            unit="s",
            numbers={
                "sessions": count,
                "events_per_session": events,
                "open_ns": o.as_dict(),
                "close_ns": c.as_dict(),
                "threads": threads,
            },
        )
    )
    sec.rows.append(
        h.info_row(
            f"then Sessions.close() of the {count}",
            h.fmt_time_spread(c),
            close_ns=c.as_dict(),
        )
    )
    sec.rows.append(
        h.info_row(
            "the cyclic collector during each open: time in it, full collections, "
            "objects it tracked at the start",
            ", ".join(f"{h.fmt_time(k.total_ns())} ({k.count[2]} full)" for k, _ in collectors),
            ", ".join(f"{tracked:,} objects" for _, tracked in collectors),
            collectors=[
                {"gc_ns": k.total_ns(), "collections": k.count, "tracked": tracked}
                for k, tracked in collectors
            ],
        )
    )
    sec.notes += [
        f"a SQLite file with {count} sessions of {events} realistic events each, written "
        "beforehand (untimed); each repeat: SQLiteStore(file) + Sessions(store) (untimed), "
        "then asyncio.gather(*(sessions.aopen(id) for every id)) timed until every open has "
        f"answered; count() = {events} checked for each; then close() (timed apart). Median "
        f"[min-max] of {repeats} repeats, GC on; threads in the process after the opens: "
        f"{', '.join(map(str, threads))}.",
    ]
    return sec


# -- G17. a program that ends without closing its registry -----------------------------------

_EXIT_SCRIPT: Final = textwrap.dedent(
    """
    import json, sys, time
    import nous_actor
    from nous_actor import Sessions, SQLiteStore
    mode, path, n_sessions, n_events = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if mode == "ours" or mode == "ours-raise":
        sessions = Sessions(SQLiteStore(path, durability="full"))
        acked = {}
        pending = []
        for i in range(n_sessions):
            s = sessions.open(f"s-{i}")
            futs = [s.append("user_message", {"content": f"m {j}"}) for j in range(n_events)]
            acked[f"s-{i}"] = [f.get(timeout=60).seq for f in futs]
            pending.append(s.append("user_message", {"content": "in flight at the end"}))
        print("ACKED " + json.dumps(acked), flush=True)
    print("LAST " + repr(time.monotonic()), flush=True)
    if mode.endswith("raise"):
        raise RuntimeError("an uncaught exception ends the program")
    """
)


def _exit_once(mode: str, path: Path, sessions: int, events: int) -> tuple[float, dict[str, Any]]:
    """Seconds from the program's last line to its exit; what it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXIT_SCRIPT, mode, str(path), str(sessions), str(events)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=120)
    ended = time.monotonic()
    last = [ln for ln in out.splitlines() if ln.startswith("LAST ")]
    if not last:
        raise AssertionError(f"runtime.exit: {mode} printed no last line: {err[-2000:]}")
    acked_lines = [ln for ln in out.splitlines() if ln.startswith("ACKED ")]
    acked = json.loads(acked_lines[0][6:]) if acked_lines else {}
    return ended - float(last[0][5:]), acked


def _stored(path: Path) -> dict[str, set[int]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT session_id, seq FROM events").fetchall()
    finally:
        conn.close()
    out: dict[str, set[int]] = {}
    for sid, seq in rows:
        out.setdefault(sid, set()).add(seq)
    return out


def bench_exit(cfg: h.Config) -> h.Section:
    """Exit time after the last line without closing the registry, vs a bare exit (G17)."""
    repeats = cfg.pick(5, 2)
    sessions, events = cfg.pick((5, 20), (3, 5))
    cases = (("ours", "bare", "ends normally"), ("ours-raise", "bare-raise", "uncaught exception"))
    got: dict[str, list[float]] = {m: [] for c in cases for m in c[:2]}
    lost: dict[str, list[int]] = {c[0]: [] for c in cases}
    landed: dict[str, list[int]] = {c[0]: [] for c in cases}
    with h.scratch("exit") as folder:
        for k in range(repeats):
            for ours, bare, _ in cases:
                h.progress(f"runtime.exit: {ours} vs {bare}, repeat {k + 1}/{repeats}")
                order = (ours, bare) if k % 2 == 0 else (bare, ours)
                for mode in order:
                    path = folder / f"exit-{mode}-{k}.db"
                    secs, acked = _exit_once(mode, path, sessions, events)
                    got[mode].append(secs)
                    if mode == ours:
                        stored = _stored(path)
                        missing = sum(
                            1 for sid, seqs in acked.items() for q in seqs
                            if q not in stored.get(sid, set())
                        )  # fmt: skip
                        if len(acked) != sessions:
                            raise AssertionError(f"runtime.exit: {mode} acknowledged {acked}")
                        lost[ours].append(missing)
                        landed[ours].append(
                            sum(len(v) for v in stored.values()) - sessions * events + missing
                        )
    sec = h.Section()
    for ours, bare, text in cases:
        diff = h.Stats.of([a - b for a, b in zip(got[ours], got[bare], strict=True)])
        o, b = h.Stats.of(got[ours]), h.Stats.of(got[bare])
        n_lost = sum(lost[ours])
        sec.rows.append(
            h.goal_row(
                "G17",
                f"exit without closing the registry, {text}: last line -> exit, minus bare",
                ours=f"{h.fmt_time_spread(h.Stats.of([x * 1e9 for x in got[ours]]))}, "
                f"{n_lost} acked lost",
                baseline=f"bare {h.fmt_time_spread(h.Stats.of([x * 1e9 for x in got[bare]]))}",
                ratio=f"+{h.fmt_time(diff.median * 1e9)}",
                value=max(diff.median, 1e-6),
                sense="<=",
                target=EXIT_GOAL_S,
                goal=f"<= {EXIT_GOAL_S:g} s, none lost",
                unit="s",
                numbers={
                    "ours_s": o.as_dict(),
                    "bare_s": b.as_dict(),
                    "extra_s": diff.as_dict(),
                    "acked_lost": lost[ours],
                    "in_flight_landed": landed[ours],
                    "in_flight": sessions,
                },
                valid=n_lost == 0,
            )
        )
    sec.notes += [
        "a child process (python -c): Sessions(SQLiteStore(file, durability='full')); for "
        f"each of {sessions} sessions open, {events} pipelined appends each waited for "
        "(acknowledged), then one more append not waited for (in flight); print the "
        "acknowledged seqs and time.monotonic() (its last line), then end without closing "
        "anything (or raise an uncaught exception). The parent reads the time the child's "
        "exit was reaped (time.monotonic, the same clock); bare = the same interpreter, same "
        "imports (nous_actor), the same last line, no registry. Figure = median over "
        f"{repeats} repeats of (ours - bare) in the same repeat; every acknowledged seq is "
        "then looked up in the file with plain SQL (the row fails if one is missing). "
        "In-flight appends that landed anyway: "
        + ", ".join(f"{k} {landed[k]} of {sessions}" for k in landed)
        + ".",
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("runtime.threads", "G14 threads with 100..10,000 live sessions", bench_threads),
    h.Benchmark("runtime.idle_memory", "G15 memory per live idle session", bench_idle_memory),
    h.Benchmark("runtime.open_many", "G16 open 10,000 stored sessions at once", bench_open_many),
    h.Benchmark("runtime.exit", "G17 exit without closing the registry", bench_exit),
)


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        sys.exit(probe(sys.argv[2:]))
    sys.exit(h.run_module(BENCHMARKS))
