"""Benchmarks of a session as it lives: a long compacted session (G5), a slow summariser
(G9), and the memory a live session holds per event (G10).

* ``lifetime.long``: 100k appends to one session, a compaction every 100
  (``session.compact(compactor).get()`` with a small budget and an instant
  summariser, then ``derive_messages().get()``), in memory and on SQLite
  (durability full); per 10% window the events/s and the compact + derive latency.
* ``lifetime.slow_summary``: a summariser that takes 2 s (``time.sleep`` in a
  callable, and ``asyncio.sleep`` in a coroutine function from an asyncio
  caller); while the compaction runs, the caller keeps calling the session
  (append, derive_messages, count, one at a time) and records each latency.
* ``lifetime.memory``: tracemalloc bytes per small event held by a live
  session, right after the appends and after one ``derive_messages``, vs a plain
  list of dicts holding the same events.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from itertools import cycle
from typing import Any, Final

import pykka

from bench import harness as h
from nous_actor import Compactor, Log, Message, Session, SQLiteStore, Store

__all__ = ["BENCHMARKS"]

THROUGHPUT_GOAL: Final = 0.8
FLAT_GOAL: Final = 1.5
LATENCY_GOAL_MS: Final = 10.0
MEMORY_GOAL: Final = 1.0
CYCLE: Final = 100
"""Appends between two compactions in lifetime.long."""


def _instant_summary(ms: Sequence[Message]) -> str:
    return f"summary of {len(ms)} messages"


def _payload(i: int) -> tuple[str, dict[str, Any]]:
    if i % 2:
        return "assistant_message", {"content": f"answer {i}: the tests pass after the patch"}
    return "user_message", {"content": f"question {i}: please refactor the module"}


@contextmanager
def _session(sid: str, store: Store | None) -> Iterator[Session]:
    s = Session.start(sid, store=store, timeout=h.JOIN_TIMEOUT)
    try:
        yield s
    finally:
        s.stop(timeout=h.JOIN_TIMEOUT)


# -- G5. a long session ------------------------------------------------------------------------


def _long_run(s: Session, n: int, compactor: Compactor, label: str) -> dict[str, list[float]]:
    """``n`` appends in cycles of :data:`CYCLE` pipelined appends + compact + derive.

    Returns, per cycle: the wall ns of the appends (first send to last answer),
    of ``compact().get()``, of the following ``derive_messages().get()``,
    whether the compaction changed the log, and the GC's own time within the cycle.
    """
    out: dict[str, list[float]] = {
        "append": [],
        "compact": [],
        "derive": [],
        "changed": [],
        "gc": [],
    }
    datas = [_payload(i) for i in range(CYCLE)]
    step = max(1, n // CYCLE // 10)
    with h.gc_watch() as watch:
        for c in range(n // CYCLE):
            _cycle(s, c, datas, compactor, label, out, watch)
            if c % step == step - 1:
                h.progress(f"{label}: {h.fmt_count((c + 1) * CYCLE)}/{h.fmt_count(n)} events")
    return out


def _cycle(
    s: Session,
    c: int,
    datas: Sequence[tuple[str, dict[str, Any]]],
    compactor: Compactor,
    label: str,
    out: dict[str, list[float]],
    watch: h.GcWatch,
) -> None:
    """One cycle of :func:`_long_run`, its figures appended to ``out``."""
    clock = time.perf_counter_ns
    seq = s.count().get(timeout=h.JOIN_TIMEOUT)
    gc0 = watch.total_ns()
    t0 = clock()
    futs = [s.append(t, d) for t, d in datas]
    last = futs[-1].get(timeout=h.JOIN_TIMEOUT)
    t1 = clock()
    result = s.compact(compactor).get(timeout=h.JOIN_TIMEOUT)
    t2 = clock()
    msgs = s.derive_messages().get(timeout=h.JOIN_TIMEOUT)
    t3 = clock()
    if futs[0].get(timeout=0).seq != seq or last.seq != seq + CYCLE - 1:
        raise AssertionError(f"{label}: appends of cycle {c} got other seqs")
    if len(msgs) > 4 * CYCLE:
        raise AssertionError(f"{label}: the surface grew to {len(msgs)}: no compaction")
    out["append"].append(t1 - t0)
    out["compact"].append(t2 - t1)
    out["derive"].append(t3 - t2)
    out["changed"].append(1.0 if result.changed else 0.0)
    out["gc"].append(watch.total_ns() - gc0)


def _windows(xs: Sequence[float], k: int = 10) -> list[list[float]]:
    size = max(1, len(xs) // k)
    return [list(xs[i * size : (i + 1) * size]) for i in range(k) if xs[i * size : (i + 1) * size]]


def bench_long(cfg: h.Config) -> h.Section:
    """100k events, a compaction every 100, in memory and on SQLite (G5)."""
    n = cfg.pick(100_000, 5_000)
    compactor = Compactor(budget=200, keep_recent=20, summarise=_instant_summary)
    sec = h.Section()
    series: dict[str, Any] = {}
    for where in ("memory", "SQLite"):
        label = f"lifetime.long {where}"
        h.progress(f"{label}: {h.fmt_count(n)} events, a compaction every {CYCLE}")
        with h.scratch("long") as folder, h.problems_logged():
            store = (
                SQLiteStore(folder / "long.db", durability="full") if where == "SQLite" else None
            )
            try:
                with _session(f"long-{where}", store) as s:
                    out = _long_run(s, n, compactor, label)
                    final_count = s.count().get(timeout=h.JOIN_TIMEOUT)
            finally:
                if store is not None:
                    store.close()
        h.settle()
        cycles = len(out["append"])
        total = [
            a + b + c for a, b, c in zip(out["append"], out["compact"], out["derive"], strict=True)
        ]
        cd = [b + c for b, c in zip(out["compact"], out["derive"], strict=True)]
        k30 = max(1, round(0.3 * cycles))
        first = CYCLE * k30 * 1e9 / sum(total[:k30])
        last = CYCLE * k30 * 1e9 / sum(total[-k30:])
        win_rate = [CYCLE * len(w) * 1e9 / sum(w) for w in _windows(total)]
        win_cd = [h.Stats.of(w).median for w in _windows(cd)]
        changed = sum(out["changed"]) / cycles
        valid = changed >= 0.9
        flat = win_cd[-1] / win_cd[0]
        gc_first, gc_last = sum(out["gc"][:k30]), sum(out["gc"][-k30:])
        med_first = CYCLE * 1e9 / h.Stats.of(total[:k30]).median
        med_last = CYCLE * 1e9 / h.Stats.of(total[-k30:]).median
        nums = {
            "store": where,
            "events": n,
            "final_count": final_count,
            "compactions_changed": changed,
            "events_per_s_first_30": first,
            "events_per_s_last_30": last,
            "window_events_per_s": win_rate,
            "window_compact_derive_median_ns": win_cd,
            "gc_ns_first_30": gc_first,
            "gc_ns_last_30": gc_last,
            "median_cycle_events_per_s_first_30": med_first,
            "median_cycle_events_per_s_last_30": med_last,
            "slowest_cycle_ns": max(total),
        }
        series[where] = nums
        tag = "" if valid else f" (only {changed:.0%} compactions changed the log)"
        sec.rows += [
            h.goal_row(
                "G5",
                f"long session {h.fmt_count(n)} ev, {where}: last 30% / first 30%",
                ours=h.fmt_rate(last) + " last 30%",
                baseline=h.fmt_rate(first) + " first 30%",
                ratio=h.fmt_ratio(last / first) + tag,
                value=last / first,
                sense=">=",
                target=THROUGHPUT_GOAL,
                goal=f">= {THROUGHPUT_GOAL:g}x",
                numbers=nums,
                valid=valid,
            ),
            h.goal_row(
                "G5",
                f"long session {where}: compact+derive, last / first 10%",
                ours=f"med {h.fmt_time(win_cd[-1])} last 10%",
                baseline=f"med {h.fmt_time(win_cd[0])} first 10%",
                ratio=h.fmt_ratio(flat) + tag,
                value=flat,
                sense="<=",
                target=FLAT_GOAL,
                goal=f"<= {FLAT_GOAL:g}x (flat)",
                numbers={"store": where, "ratio": flat, "window_medians_ns": win_cd},
                valid=valid,
            ),
        ]
        sec.notes.append(
            f"{where}: per 10% window, events/s "
            + " ".join(h.fmt_count(r) for r in win_rate)
            + "; compact+derive median "
            + " ".join(h.fmt_time(x) for x in win_cd)
            + f"; append phase alone {h.fmt_rate(CYCLE * 1e9 / h.Stats.of(out['append']).median)} "
            f"(median cycle); final count {h.fmt_count(final_count)}. The GC's own time "
            f"(gc.callbacks, all generations, measured not changed): first 30% "
            f"{h.fmt_time(gc_first)}, last 30% {h.fmt_time(gc_last)}; median cycle first 30% "
            f"{h.fmt_rate(med_first)}, last 30% {h.fmt_rate(med_last)}; slowest cycle "
            f"{h.fmt_time(max(total))}."
        )
    sec.data["series"] = series
    sec.notes[:0] = [
        f"one session, {h.fmt_count(n)} events in cycles of {CYCLE} pipelined appends "
        "(alternating user/assistant messages, the last one awaited), then "
        "session.compact(Compactor(budget=200, keep_recent=20, summarise=instant)).get(), "
        "then session.derive_messages().get(); GC on. Memory = Session.start(id); SQLite = "
        "a SQLiteStore file, durability full. Events/s = events / wall time of whole cycles "
        "(appends + compact + derive) over the first and the last 30% of cycles; latency = "
        "compact().get() + the next derive_messages().get(), median per 10% window, last "
        "window / first. Every cycle's seqs and the surface size (a compaction happened) are "
        "checked; a run where under 90% of compactions changed the log fails.",
    ]
    return sec


# -- G9. a slow summariser ------------------------------------------------------------------------


def _calls(s: Session) -> Iterator[tuple[str, Callable[[], Any]]]:
    return cycle(
        (
            ("append", lambda: s.append("user_message", {"content": "meanwhile"})),
            ("derive_messages", s.derive_messages),
            ("count", s.count),
        )
    )


def _preload(s: Session, n: int) -> None:
    futs = [s.append(*_payload(i)) for i in range(n)]
    futs[-1].get(timeout=h.JOIN_TIMEOUT)


def _slow_threads(seconds: float) -> dict[str, Any]:
    """A callable summariser that sleeps; the caller thread calls the session meanwhile."""

    def summarise(ms: Sequence[Message]) -> str:
        time.sleep(seconds)  # the workload: a model call that takes this long
        return f"summary of {len(ms)} messages"

    compactor = Compactor(budget=200, keep_recent=20, summarise=summarise)
    bound = seconds + 10.0
    lat: list[int] = []
    error = ""
    with _session("slow-summary-threads", None) as s:
        _preload(s, 200)
        t0 = time.perf_counter_ns()
        fut = s.compact(compactor)
        deadline = time.monotonic() + bound
        calls = _calls(s)
        while not fut.done() and time.monotonic() < deadline:
            _, call = next(calls)
            c0 = time.perf_counter_ns()
            try:
                call().get(timeout=bound)
            except Exception as exc:  # a timeout counts as the bound, and is reported
                error = error or f"{type(exc).__name__}: {exc}"
            lat.append(time.perf_counter_ns() - c0)
        try:
            result = fut.get(timeout=max(0.1, deadline - time.monotonic()))
            changed = bool(result.changed)
        except Exception as exc:
            changed = False
            error = error or f"compaction failed: {type(exc).__name__}: {exc}"
        compact_ns = time.perf_counter_ns() - t0
    return {"latencies_ns": lat, "compact_ns": compact_ns, "changed": changed, "error": error}


def _slow_asyncio(seconds: float) -> dict[str, Any]:
    """A coroutine summariser (``await asyncio.sleep``), an asyncio caller calling meanwhile."""

    async def summarise(ms: Sequence[Message]) -> str:
        await asyncio.sleep(seconds)  # the workload: an async model call
        return f"summary of {len(ms)} messages"

    compactor = Compactor(budget=200, keep_recent=20, summarise=summarise)
    bound = seconds + 10.0

    async def main(s: Session) -> dict[str, Any]:
        lat: list[int] = []
        error = ""
        t0 = time.perf_counter_ns()

        async def compact() -> Any:
            return await s.compact(compactor)

        task = asyncio.ensure_future(compact())
        await asyncio.sleep(0)  # the compaction is sent before the first call
        deadline = time.monotonic() + bound
        calls = _calls(s)
        while not task.done() and time.monotonic() < deadline:
            _, call = next(calls)
            c0 = time.perf_counter_ns()
            try:
                fut: Awaitable[Any] = call()
                await asyncio.wait_for(fut, bound)
            except Exception as exc:
                error = error or f"{type(exc).__name__}: {exc}"
            lat.append(time.perf_counter_ns() - c0)
        changed = False
        try:
            result = await asyncio.wait_for(task, max(0.1, deadline - time.monotonic()))
            changed = bool(result.changed)
        except Exception as exc:
            error = error or f"compaction failed: {type(exc).__name__}: {exc}"
        return {
            "latencies_ns": lat,
            "compact_ns": time.perf_counter_ns() - t0,
            "changed": changed,
            "error": error,
        }

    with _session("slow-summary-asyncio", None) as s:
        _preload(s, 200)
        return asyncio.run(main(s))


class _NoOp(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return None


def _floor(seconds: float) -> list[int]:
    """The machine's own floor for the same window: a thread asking a no-op Pykka actor
    in a loop (no session, no summariser); each ask's latency."""
    ref = _NoOp.start()
    lat: list[int] = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            c0 = time.perf_counter_ns()
            ref.ask(None, timeout=h.JOIN_TIMEOUT)
            lat.append(time.perf_counter_ns() - c0)
    finally:
        ref.stop(timeout=h.JOIN_TIMEOUT)
    return lat


def bench_slow_summary(cfg: h.Config) -> h.Section:
    """Latency of other calls on a session while a 2 s summariser runs (G9)."""
    seconds = cfg.pick(2.0, 0.5)
    sec = h.Section()
    runs: dict[str, Callable[[float], dict[str, Any]]] = {
        "callable summariser, thread caller": _slow_threads,
        "coroutine summariser, asyncio caller": _slow_asyncio,
    }
    for what, run in runs.items():
        h.progress(f"lifetime.slow_summary: {what}, summariser takes {seconds:g} s")
        h.settle()
        with h.problems_logged(), h.gc_watch() as collector:
            got = run(seconds)
        pykka.ActorRegistry.stop_all(timeout=h.JOIN_TIMEOUT)
        h.settle()
        lat = got["latencies_ns"] or [0]
        s = h.Stats.of(lat)
        ran = got["compact_ns"] >= 0.9 * seconds * 1e9
        valid = bool(got["changed"]) and ran
        why = ""
        if not got["changed"]:
            why = got["error"] or "the compaction did not change the log"
        elif not ran:
            why = "the compaction finished before its summariser could have"
        sec.rows.append(
            h.goal_row(
                "G9",
                f"slow summariser ({seconds:g} s), {what}",
                ours=f"max {h.fmt_time(s.max)}, p99 {h.fmt_time(s.p99)} ({s.n} calls)",
                baseline=f"compact {h.fmt_time(got['compact_ns'])}; {collector.summary()}",
                ratio=f"{s.max / 1e6 / LATENCY_GOAL_MS:.3g} of 10 ms"
                + (" INVALID" if why else ""),
                value=s.max / 1e6,
                sense="<=",
                target=LATENCY_GOAL_MS,
                goal=f"max <= {LATENCY_GOAL_MS:g} ms",
                unit="ms",
                numbers={
                    "summariser_s": seconds,
                    "latency_ns": s.as_dict(),
                    "compact_ns": got["compact_ns"],
                    "gc_collections": collector.count,
                    "gc_longest_ns": collector.longest,
                    "compaction_changed": got["changed"],
                    "error": got["error"],
                    "invalid_because": why,
                },
                valid=valid,
            )
        )
        if why:
            sec.notes.append(f"{what}: FAIL whatever the latency: {why}.")
    h.progress(
        f"lifetime.slow_summary: the machine's floor, a bare Pykka ask loop for {seconds:g} s"
    )
    with h.gc_watch() as collector:
        floor = _floor(seconds)
    h.settle()
    f = h.Stats.of(floor or [0])
    sec.rows.append(
        h.info_row(
            f"the machine's floor for the same {seconds:g} s: a thread asking a no-op Pykka "
            "actor in a loop (no session), and the collector's longest pause meanwhile",
            f"max {h.fmt_time(f.max)}, p99 {h.fmt_time(f.p99)} ({f.n} asks)",
            collector.summary(),
            latency_ns=f.as_dict(),
            gc_collections=collector.count,
            gc_longest_ns=collector.longest,
        )
    )
    sec.notes[:0] = [
        "a session in memory preloaded with 200 messages; session.compact(Compactor(budget=200, "
        f"keep_recent=20, summarise=<takes {seconds:g} s>)) is sent, then until it answers the "
        "caller keeps making calls one at a time (append, derive_messages, count, in turn), "
        "each awaited, and records each call's latency; max and p99 of those calls, goal max "
        f"<= {LATENCY_GOAL_MS:g} ms. Callable = time.sleep inside it, calls from the thread "
        "with .get(); coroutine = `async def summarise(ms): await asyncio.sleep(...)`, calls "
        "from coroutines on one loop with `await`. Every wait is bounded (summariser + 10 s). "
        "Valid only if the compaction changed the log and took at least 90% of the "
        "summariser's time (else the summariser did not really run).",
    ]
    return sec


# -- G10. memory per stored event in a live session ----------------------------------------------


def _traced_now() -> int:
    h.settle()
    return tracemalloc.get_traced_memory()[0]


def bench_memory(cfg: h.Config) -> h.Section:
    """tracemalloc bytes per small event in a live session vs a plain list of dicts (G10)."""
    n = cfg.pick(100_000, 10_000)
    # Made before tracing, so the strings count on neither side; each side makes
    # its own per-event dict (a session copies and freezes the caller's data).
    contents = [f"short text {i}" for i in range(n)]
    datas = [{"content": c} for c in contents]

    h.progress(f"lifetime.memory: {h.fmt_count(n)} events as a list of dicts (baseline)")
    tracemalloc.start()
    try:
        before = _traced_now()
        records = [
            {"seq": i, "type": "user_message", "time": datetime.now(UTC), "data": {"content": c}}
            for i, c in enumerate(contents)
        ]
        base = (_traced_now() - before) / n
        del records

        h.progress(f"lifetime.memory: {h.fmt_count(n)} appends through a live session")
        with h.problems_logged(), _session("memory", None) as s:
            before = _traced_now()
            for k in range(0, n, 1000):
                futs = [s.append("user_message", d) for d in datas[k : k + 1000]]
                futs[-1].get(timeout=h.JOIN_TIMEOUT)
                del futs
            if s.count().get(timeout=h.JOIN_TIMEOUT) != n:
                raise AssertionError("lifetime.memory: the session lost appends")
            after_appends = (_traced_now() - before) / n
            got = len(s.derive_messages().get(timeout=h.JOIN_TIMEOUT))
            if got != n:
                raise AssertionError("lifetime.memory: the surface is not every event")
            after_derive = (_traced_now() - before) / n

        h.progress("lifetime.memory: the pure Log, for context")
        before = _traced_now()
        log = Log()
        for d in datas:
            log = log.append("user_message", d)
        pure = (_traced_now() - before) / n
        del log
    finally:
        tracemalloc.stop()
    sec = h.Section()
    for what, per in (
        ("live session, right after the appends", after_appends),
        ("live session, after one derive_messages", after_derive),
    ):
        sec.rows.append(
            h.goal_row(
                "G10",
                f"memory {h.fmt_count(n)} small ev, {what}",
                ours=h.fmt_bytes(per),
                baseline="list of dicts " + h.fmt_bytes(base),
                ratio=h.fmt_ratio(per / base) + " the bytes",
                value=per / base,
                sense="<=",
                target=MEMORY_GOAL,
                goal=f"<= {MEMORY_GOAL:g}x",
                numbers={"n": n, "ours_bytes_per_event": per, "baseline_bytes_per_event": base},
            )
        )
    sec.rows.append(
        h.info_row(
            "memory, the pure Log (no actor, never derived)",
            h.fmt_bytes(pure),
            "list of dicts " + h.fmt_bytes(base),
            h.fmt_ratio(pure / base) + " the bytes",
            n=n,
            ours_bytes_per_event=pure,
            baseline_bytes_per_event=base,
        )
    )
    sec.notes += [
        f"tracemalloc (every thread, the actor's included), {h.fmt_count(n)} events "
        "{'content': 'short text <i>'} (strings and the callers' dicts made before tracing, "
        "counted on neither side); bytes still allocated after a gc.collect(), per event; "
        "ratio = ours / baseline (lower is better). Baseline = a list of {'seq': i, 'type': "
        "'user_message', 'time': datetime.now(UTC), 'data': {'content': ...}}.",
        "ours = Session.start(id) (memory, no store), the events appended through it "
        "(pipelined in chunks of 1000); measured right after the appends, and again after "
        "one derive_messages().get() (the session then also holds its memoised fold and a "
        "Message per event; the returned list is dropped first). Both rows are judged: the "
        "goal holds only if the worse one does.",
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("lifetime.long", "G5 a long session with a compaction every 100", bench_long),
    h.Benchmark("lifetime.slow_summary", "G9 calls during a 2 s summariser", bench_slow_summary),
    h.Benchmark("lifetime.memory", "G10 memory per event in a live session", bench_memory),
)
