"""Benchmarks of the session actor: round trip, pipelined appends, 8 callers, derive.

Every figure is ours (a :class:`~nous_actor.Session` in memory) against a bare
Pykka ``ThreadingActor`` whose ``on_receive`` returns ``None``, measured side
by side in the same run and alternating which goes first (see
:mod:`bench.harness`). Each benchmark checks what it measured (every seq
present, in order) before it reports a number, and stops every actor when it
is done.

Thread placement matters here more than anywhere else in the suite. A round
trip wakes the actor thread and then the caller, and the two hand the GIL to
each other. With both threads on one CPU every wake-up is a context switch on
that CPU (about three per thread per call, counting the GIL hand-offs); on two
CPUs each thread sleeps once per call but every wake-up crosses CPUs and waits
for whatever else runs on the other one. The scheduler picks one or the other
and tends to keep it for a while, so unpinned times fall into two groups.
:func:`bench_round_trip` therefore also pins both threads to one CPU, and to
different CPUs (Linux only), reports all three placements, and counts context
switches per call (``/proc``) to tell which regime each unpinned block was in.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, Final

import pykka

from bench import harness as h
from bench.workload import build, surface_only_specs
from nous_actor import Log, Message, Session

__all__ = ["BENCHMARKS"]

ROUND_TRIP_GOAL: Final = 1.2
PIPELINED_GOAL: Final = 3.0
"""DESIGN.md §8: pipelined appends >= 3x Pykka's pipelined asks to a no-op actor."""
THREADS: Final = 8
JOIN_TIMEOUT: Final = h.JOIN_TIMEOUT

CAN_PIN: Final = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


class NoOpActor(pykka.ThreadingActor):
    """The baseline: a bare Pykka actor that answers every message with ``None``.

    ``pin``, ``native_id`` and ``thread_cpu_ns`` are reached through its proxy, so Pykka handles
    them before ``on_receive``, which stays a plain ``return None``.
    """

    def on_receive(self, message: Any) -> Any:
        return None

    def pin(self, cpus: set[int]) -> None:
        """Pin the actor's thread to ``cpus``."""
        os.sched_setaffinity(0, cpus)

    def native_id(self) -> int:
        """The actor thread's id, as the kernel knows it."""
        return threading.get_native_id()

    def thread_cpu_ns(self) -> int:
        """CPU time the actor's thread has used so far."""
        return time.thread_time_ns()


@contextmanager
def _actors(
    session_id: str, log: Log | None = None
) -> Iterator[tuple[Session, pykka.ActorRef[NoOpActor]]]:
    """A fresh session (holding ``log``) and a fresh no-op actor; every actor stopped after."""
    try:
        yield Session.start(session_id, log), NoOpActor.start()
    finally:
        pykka.ActorRegistry.stop_all()


def _payloads(n: int) -> list[dict[str, Any]]:
    return [{"content": f"short text {i}"} for i in range(n)]


def _check_seqs(seqs: Sequence[int], start: int, what: str) -> int:
    """``seqs`` must be ``start, start+1, ...``; returns the next seq."""
    if list(seqs) != list(range(start, start + len(seqs))):
        raise AssertionError(f"{what}: seqs are not {start}..{start + len(seqs) - 1} in order")
    return start + len(seqs)


def _check_nones(results: Sequence[Any], n: int, what: str) -> None:
    if len(results) != n or any(r is not None for r in results):
        raise AssertionError(f"{what}: expected {n} None answers from the no-op actor")


def _quantiles(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    last = len(ordered) - 1
    return {f"p{q}": ordered[round(q / 100 * last)] for q in (10, 50, 90, 99)}


def _us(q: dict[str, float]) -> str:
    return "/".join(f"{q[k] / 1e3:.3g}" for k in ("p10", "p50", "p90", "p99"))


# -- thread placement (Linux) -----------------------------------------------------------------


def _set_affinity(actor: object, cpus: set[int]) -> None:
    """A session handler: pin the session's actor thread to ``cpus``."""
    os.sched_setaffinity(0, cpus)


def _session_native_id(actor: object) -> int:
    """A session handler: the actor thread's kernel id."""
    return threading.get_native_id()


def _switches(tid: int) -> int | None:
    """Context switches (voluntary + involuntary) of thread ``tid`` so far (Linux ``/proc``)."""
    try:
        status = Path(f"/proc/self/task/{tid}/status").read_text()
    except OSError:
        return None
    return sum(
        int(v)
        for k, _, v in (ln.partition(":") for ln in status.splitlines())
        if k.endswith("ctxt_switches")
    )


# -- 1. round trip -----------------------------------------------------------------------------


def _round_trips(
    call: Callable[[Any], Any], payloads: Sequence[Any]
) -> tuple[list[int], list[Any]]:
    """``call(p)`` for each payload, one at a time: per-call wall times (ns) and answers."""
    clock = time.perf_counter_ns
    lat: list[int] = []
    got: list[Any] = []
    for p in payloads:
        t0 = clock()
        got.append(call(p))
        lat.append(clock() - t0)
    return lat, got


def _placements(cpus: Sequence[int], k: int) -> dict[str, tuple[set[int], set[int]] | None]:
    """Mode -> (caller CPUs, actor CPUs) for repeat ``k``; ``None`` = unpinned.

    The pinned CPUs alternate between repeats, so neither CPU's other load
    decides a row alone.
    """
    modes: dict[str, tuple[set[int], set[int]] | None] = {"unpinned": None}
    if CAN_PIN and cpus:
        a = cpus[k % len(cpus)]
        modes["same CPU"] = ({a}, {a})
        if len(cpus) >= 2:
            b = cpus[(k + 1) % len(cpus)]
            modes["cross CPU"] = ({a}, {b})
    return modes


@dataclass(frozen=True)
class _Block:
    """One timed block of round trips: wall time, and context switches per call."""

    ns: int
    caller_switches: float | None
    actor_switches: float | None


def _per_call(before: int | None, after: int | None, n: int) -> float | None:
    return None if before is None or after is None else (after - before) / n


def _one_block(
    side: int,
    payloads: Sequence[Any],
    warm: int,
    place: tuple[set[int], set[int]] | None,
    cpus: Sequence[int],
) -> tuple[_Block, list[int]]:
    """One timed block of round trips to a fresh actor, the only actor alive meanwhile.

    ``side`` 0 is a session (``append(...).get()``), 1 the no-op Pykka actor
    (``ask``). One actor at a time, so that ours and the baseline meet the same
    scheduler: with two actor threads and a caller on two CPUs, whichever actor
    happens to share the caller's CPU is the fast one.
    """
    me = threading.get_native_id()
    call: Callable[[Any], Any]
    if side == 0:
        s = Session.start("bench-round-trip", timeout=JOIN_TIMEOUT)
        tid = s._call(_session_native_id).get()

        def call(d: Any) -> Any:
            return s.append("user_message", d).get().seq

        def pin(where: set[int]) -> None:
            s._call(_set_affinity, where).get()

        stop: Callable[[], object] = partial(s.stop, timeout=JOIN_TIMEOUT)
    else:
        ref = NoOpActor.start()
        px = ref.proxy()
        tid = px.native_id().get()
        call = ref.ask

        def pin(where: set[int]) -> None:
            px.pin(where).get()

        stop = partial(ref.stop, timeout=JOIN_TIMEOUT)
    try:
        if CAN_PIN:
            caller, actor = place or (set(cpus), set(cpus))
            os.sched_setaffinity(0, caller)
            pin(actor)
        _round_trips(call, payloads[:warm])
        sw0 = _switches(me), _switches(tid)
        ns, (lat, got) = h.timed(partial(_round_trips, call, payloads[warm:]))
        sw1 = _switches(me), _switches(tid)
    finally:
        stop()
    n = len(payloads) - warm
    if side == 0:
        _check_seqs(got, warm, "session.round_trip")
    else:
        _check_nones(got, n, "session.round_trip")
    return _Block(ns, _per_call(sw0[0], sw1[0], n), _per_call(sw0[1], sw1[1], n)), lat


def bench_round_trip(cfg: h.Config) -> h.Section:
    """``append(...).get()`` one at a time vs a bare Pykka ``ask``: unpinned, same, cross CPU."""
    n = cfg.pick(3_000, 800)
    repeats = cfg.pick(9, 2)
    warm = 100
    cpus = sorted(os.sched_getaffinity(0)) if CAN_PIN else []
    datas = _payloads(n + warm)
    msgs = [("user_message", d) for d in datas]
    modes = list(_placements(cpus, 0))
    blocks: dict[str, tuple[list[_Block], list[_Block]]] = {m: ([], []) for m in modes}
    calls: dict[str, tuple[list[int], list[int]]] = {m: ([], []) for m in modes}
    original = os.sched_getaffinity(0) if CAN_PIN else None
    sides = (datas, msgs)
    try:
        for k in range(repeats):
            h.progress(f"session.round_trip: {n} calls per block, repeat {k + 1}/{repeats}")
            for i, (mode, place) in enumerate(_placements(cpus, k).items()):
                for side in (0, 1) if (k + i) % 2 == 0 else (1, 0):
                    block, lat = _one_block(side, sides[side], warm, place, cpus)
                    blocks[mode][side].append(block)
                    calls[mode][side].extend(lat)
                    h.settle()
    finally:
        if original is not None:
            os.sched_setaffinity(0, original)

    sec = h.Section()
    for mode in modes:
        ours_b, base_b = blocks[mode]
        ours_ns, base_ns = [x.ns for x in ours_b], [x.ns for x in base_b]
        o = h.Stats.of([t / n for t in ours_ns])
        b = h.Stats.of([t / n for t in base_ns])
        q = h.ratios(ours_ns, base_ns)
        qo, qb = _quantiles(calls[mode][0]), _quantiles(calls[mode][1])
        nums = {
            "placement": mode,
            "calls_per_block": n,
            "ours_ns_per_call": o.as_dict(),
            "baseline_ns_per_call": b.as_dict(),
            "ratio": q.as_dict(),
            "ratio_per_repeat": [x / y for x, y in zip(ours_ns, base_ns, strict=True)],
            "ours_call_quantiles_ns": qo,
            "baseline_call_quantiles_ns": qb,
            "ours_blocks": [asdict(x) for x in ours_b],
            "baseline_blocks": [asdict(x) for x in base_b],
        }
        cells = (
            h.fmt_time_spread(o),
            "pykka ask " + h.fmt_time_spread(b),
            h.fmt_ratio(q.median, q.min, q.max) + " the time",
        )
        if mode == "unpinned":
            sec.rows.append(
                h.goal_row(
                    "G1",
                    f"append round trip, {mode}",
                    ours=cells[0],
                    baseline=cells[1],
                    ratio=cells[2],
                    value=q.median,
                    sense="<=",
                    target=ROUND_TRIP_GOAL,
                    goal=f"<= {ROUND_TRIP_GOAL:g}x",
                    numbers=nums,
                )
            )
        else:
            sec.rows.append(h.info_row(f"append round trip, {mode} (explains G1)", *cells, **nums))
        sec.notes.append(
            f"{mode}: per call p10/p50/p90/p99 over all repeats: ours {_us(qo)} us, pykka "
            f"{_us(qb)} us; context switches per call (caller+actor, median): "
            f"ours {_sw(ours_b)}, pykka {_sw(base_b)}."
        )
    if CAN_PIN:
        sec.notes.append(_regime_note(blocks["unpinned"], n))
    sec.notes += [
        f"ours = s.append('user_message', {{'content': ...}}).get(), {n} calls one at a time "
        "per block (after 100 untimed), each block on a fresh actor that is the only one "
        "alive (with two actor threads and the caller on two CPUs, whichever actor shares the "
        "caller's CPU is the fast one: both sides must meet the same scheduler); baseline = "
        "ref.ask(('user_message', {...})) to a pykka.ThreadingActor "
        "whose on_receive returns None; median [min-max] over repeats of the mean time per "
        "call; ratio = our block time / pykka's in the same repeat and placement (lower is "
        "better). Every seq is checked consecutive.",
        "placements, alternated within each repeat: unpinned (the scheduler's choice); same "
        "CPU = caller and both actor threads pinned to one CPU; cross CPU = caller on one, "
        "actor threads on the other (the pinned CPU alternates by repeat). Goal (DESIGN.md "
        f"§8) <= {ROUND_TRIP_GOAL:g}x; verdict on the unpinned row, the pinned rows explain it.",
    ]
    if not CAN_PIN:
        sec.notes.append("no sched_setaffinity here: only the unpinned placement was measured.")
    return sec


def _sw(blocks: Sequence[_Block]) -> str:
    known = [x for x in blocks if x.caller_switches is not None and x.actor_switches is not None]
    if not known:
        return "unknown"
    caller = h.Stats.of([x.caller_switches or 0.0 for x in known]).median
    actor = h.Stats.of([x.actor_switches or 0.0 for x in known]).median
    return f"{caller:.2g}+{actor:.2g}"


def _regime_note(blocks: tuple[list[_Block], list[_Block]], n: int) -> str:
    """Split the unpinned blocks by how often the caller was switched out per call.

    One switch per call is the two-CPU pattern (the caller sleeps once while
    the actor runs elsewhere); more means both threads shared a CPU for most of
    the block (see the pinned rows' switch counts).
    """
    parts = []
    for name, side in zip(("ours", "pykka"), blocks, strict=True):
        known = [x for x in side if x.caller_switches is not None]
        if not known:
            return "unpinned regimes unknown (no /proc/self/task)."
        one = [x.ns / n for x in known if (x.caller_switches or 0.0) >= 1.5]
        two = [x.ns / n for x in known if (x.caller_switches or 0.0) < 1.5]
        parts.append(
            f"{name} {len(one)} one-CPU-like ({_median_time(one)}/call), "
            f"{len(two)} two-CPU-like ({_median_time(two)}/call)"
        )
    return (
        "unpinned blocks split by the caller's context switches per call (>= 1.5 = both threads "
        "mostly on one CPU, as in the same-CPU row; ~1 = on two CPUs, as in the cross-CPU row): "
        + "; ".join(parts)
        + "."
    )


def _median_time(ns: Sequence[float]) -> str:
    return h.fmt_time(h.Stats.of(ns).median) if ns else "-"


# -- 2. pipelined appends --------------------------------------------------------------------


def _pipeline(send: Callable[[Any], Any], payloads: Sequence[Any]) -> list[Any]:
    """Send every payload without waiting, then wait for the last answer."""
    futs = [send(p) for p in payloads]
    futs[-1].get(timeout=JOIN_TIMEOUT)
    return futs


def _thread_cpu_ns(actor: object) -> int:
    """A session handler: CPU time the actor thread has used so far."""
    return time.thread_time_ns()


def _session_cpu_ns(s: Session) -> int:
    return s._call(_thread_cpu_ns).get()  # type: ignore[no-any-return]


def _noop_cpu_ns(px: Any) -> int:
    return px.thread_cpu_ns().get()  # type: ignore[no-any-return]


def bench_pipelined(cfg: h.Config) -> h.Section:
    """N appends issued without waiting, then the last awaited, vs pipelined Pykka asks."""
    n = cfg.pick(100_000, 5_000)  # the goal's size: 100k appends (DESIGN.md §8)
    repeats = cfg.pick(5, 3)
    datas = _payloads(n)
    msgs = [("user_message", d) for d in datas]
    names = ("append", "count", "ask")
    times: dict[str, list[int]] = {k: [] for k in names}
    cpu: dict[str, list[int]] = {k: [] for k in names}  # caller + actor thread CPU time
    for k in range(repeats):
        h.progress(
            f"session.pipelined: {h.fmt_count(n)} calls per variant, repeat {k + 1}/{repeats}"
        )
        with _actors(f"bench-pipelined-{k}") as (s, ref):
            runs: dict[str, Callable[[], list[Any]]] = {
                "append": partial(_pipeline, partial(s.append, "user_message"), datas),
                "count": partial(_pipeline, lambda _: s.count(), datas),
                "ask": partial(_pipeline, partial(ref.ask, block=False), msgs),
            }
            actor_cpu: dict[str, Callable[[], int]] = {
                "append": partial(_session_cpu_ns, s),
                "count": partial(_session_cpu_ns, s),
                "ask": partial(_noop_cpu_ns, ref.proxy()),
            }
            for name in names if k % 2 == 0 else tuple(reversed(names)):
                cpu0 = time.thread_time_ns() + actor_cpu[name]()
                ns, futs = h.timed(runs[name])
                cpu1 = time.thread_time_ns() + actor_cpu[name]()
                if name == "append":
                    _check_seqs([f.get(timeout=0).seq for f in futs], 0, "session.pipelined")
                elif name == "count":
                    counts = [f.get(timeout=0) for f in futs]
                    if len(set(counts)) != 1 or counts[0] not in (0, n):
                        raise AssertionError("session.pipelined: count() changed under no appends")
                else:
                    _check_nones([f.get(timeout=0) for f in futs], n, "session.pipelined")
                times[name].append(ns)
                cpu[name].append(cpu1 - cpu0)
                del futs
                h.settle()
    rate = {k: h.Stats.of([n * 1e9 / t for t in v]) for k, v in times.items()}
    cpu_rate = {k: h.Stats.of([n * 1e9 / t for t in v]) for k, v in cpu.items()}
    sec = h.Section()
    rows: tuple[tuple[str, dict[str, list[int]], dict[str, h.Stats], str], ...] = (
        ("pipelined appends, one session", times, rate, "append"),
        ("pipelined appends, per CPU-second", cpu, cpu_rate, "append"),
        ("pipelined count() (messaging, no append)", times, rate, "count"),
    )
    for i, (title, samples, rates, name) in enumerate(rows):
        slow = h.ratios(samples[name], samples["ask"])
        cells = (
            h.fmt_rate_spread(rates[name]),
            "pykka ask " + h.fmt_rate_spread(rates["ask"]),
            h.fmt_ratio(slow.median, slow.min, slow.max) + " the time",
        )
        nums = {
            "n": n,
            "clock": "cpu" if samples is cpu else "wall",
            "ours_events_per_s": rates[name].as_dict(),
            "baseline_events_per_s": rates["ask"].as_dict(),
            "slowdown": slow.as_dict(),
        }
        if i:
            sec.rows.append(h.info_row(title, *cells, **nums))
            continue
        speed = h.ratios(samples["ask"], samples[name])  # pykka's time / ours: x faster
        sec.rows.append(
            h.goal_row(
                "G2",
                title + " vs pipelined pykka asks",
                ours=cells[0],
                baseline=cells[1],
                ratio=h.fmt_ratio(speed.median, speed.min, speed.max) + " pykka's rate",
                value=speed.median,
                sense=">=",
                target=PIPELINED_GOAL,
                goal=f">= {PIPELINED_GOAL:g}x",
                numbers={**nums, "speedup": speed.as_dict()},
            )
        )
    sec.data["cpu_us_per_event"] = {
        k: h.Stats.of([t / n / 1e3 for t in v]).as_dict() for k, v in cpu.items()
    }
    sec.notes += [
        f"{h.fmt_count(n)} calls per repeat into a fresh session: futs = "
        "[s.append('user_message', d) for d in datas]; futs[-1].get(); events/s from the "
        "first send to the last answer; every seq checked 0..n-1 in order afterwards (untimed).",
        "baseline = the same number of ref.ask(('user_message', d), block=False) to the no-op "
        "actor, the last one awaited; ratio = our time / pykka's in the same repeat (below 1: "
        "ours is faster), except in the G2 row: pykka's time / ours (our rate as a multiple "
        "of pykka's, higher is better).",
        "per CPU-second = n / (CPU time of the caller thread + CPU time of the actor thread) "
        "over the same run (time.thread_time_ns in each thread): the CPU cost per event of "
        "both threads together (work outside the GIL included): other processes' load moves "
        "it less than the wall rate, though it still counts every wake-up the two threads "
        "cause each other; a wall rate far below it means the run waited for a CPU.",
        "count() = the same pipeline through the session with no append: the session's "
        "messaging alone (handle, SessionFuture, actor dispatch), so append - count is the "
        "cost of Log.append (materialized) in the actor thread.",
        f"goal G2 (DESIGN.md §8): pipelined appends to one in-memory session >= "
        f"{PIPELINED_GOAL:g}x the rate of pipelined pykka asks to the no-op actor in the same "
        "run; verdict on the median over repeats of pykka's time / ours in the same repeat "
        "(the events/s are context).",
    ]
    return sec


# -- 3. eight caller threads ---------------------------------------------------------------------


def _check_threaded_seqs(per_thread: Sequence[Sequence[int]], total: int, label: str) -> None:
    """Each thread's seqs increase (its calls apply in order); together they are 0..total-1."""
    for seqs in per_thread:
        if any(a >= b for a, b in pairwise(seqs)):
            raise AssertionError(f"{label}: one thread's appends were applied out of order")
    if sorted(x for seqs in per_thread for x in seqs) != list(range(total)):
        raise AssertionError(f"{label}: seqs are not exactly 0..{total - 1}")


def _thread_work(
    kind: str,
    s: Session,
    ref: pykka.ActorRef[NoOpActor],
    datas: Sequence[dict[str, Any]],
    msgs: Sequence[tuple[str, dict[str, Any]]],
) -> dict[str, Callable[[int], list[Any]]]:
    """What one caller thread does, ours and the baseline's: pipelined or round trips.

    Pipelined work returns the futures (answered, since each thread awaits its
    last); round trips return the answers (our events, pykka's ``None``).
    """
    if kind == "pipelined":
        return {
            "ours": lambda _: _pipeline(partial(s.append, "user_message"), datas),
            "ask": lambda _: _pipeline(partial(ref.ask, block=False), msgs),
        }
    return {
        "ours": lambda _: [s.append("user_message", d).get() for d in datas],
        "ask": lambda _: [ref.ask(m) for m in msgs],
    }


def bench_threads(cfg: h.Config) -> h.Section:
    """8 caller threads into one session (pipelined, and round trips) vs the no-op actor."""
    m = cfg.pick(5_000, 1_000)
    r = cfg.pick(500, 150)
    repeats = cfg.pick(3, 1)
    datas = _payloads(max(m, r))
    msgs = [("user_message", d) for d in datas]
    kinds = ("pipelined", "round trip")
    per = {"pipelined": m, "round trip": r}
    times: dict[tuple[str, str], list[int]] = {(k, w): [] for k in kinds for w in ("ours", "ask")}
    for k in range(repeats):
        h.progress(
            f"session.threads: {THREADS} threads x ({m} pipelined, {r} round trips), "
            f"repeat {k + 1}/{repeats}"
        )
        for kind in kinds:
            count = per[kind]
            label = f"session.threads {kind}"
            with _actors(f"bench-threads-{k}") as (s, ref):
                work = _thread_work(kind, s, ref, datas[:count], msgs[:count])
                for who in ("ours", "ask") if k % 2 == 0 else ("ask", "ours"):
                    ns, results = h.run_threads(work[who], THREADS, label)
                    if kind == "pipelined":  # all answered: every thread awaited its last
                        results = [[f.get(timeout=0) for f in futs] for futs in results]
                    if who == "ours":
                        seqs = [[ev.seq for ev in res] for res in results]
                        _check_threaded_seqs(seqs, THREADS * count, label)
                    else:
                        _check_nones([x for res in results for x in res], THREADS * count, label)
                    times[(kind, who)].append(ns)
                    del results
                    h.settle()
    sec = h.Section()
    for kind in kinds:
        total = THREADS * per[kind]
        o = h.Stats.of([total * 1e9 / t for t in times[(kind, "ours")]])
        b = h.Stats.of([total * 1e9 / t for t in times[(kind, "ask")]])
        slow = h.ratios(times[(kind, "ours")], times[(kind, "ask")])
        sec.rows.append(
            h.Row(
                f"{THREADS} threads, {kind}, one session",
                h.fmt_rate_spread(o),
                "pykka ask " + h.fmt_rate_spread(b),
                h.fmt_ratio(slow.median, slow.min, slow.max) + " the time",
                "- (context)",
                "info",
                {
                    "threads": THREADS,
                    "calls_per_thread": per[kind],
                    "ours_events_per_s": o.as_dict(),
                    "baseline_events_per_s": b.as_dict(),
                    "slowdown": slow.as_dict(),
                },
            )
        )
    sec.notes += [
        f"{THREADS} threads released by one barrier, each making {m} pipelined appends (the "
        f"last awaited) or {r} round trips (append(...).get()) into one session; total "
        "events/s from the release to the last join (join bounded, a hung thread fails the "
        "run); fresh actors per repeat and kind.",
        "checked after timing: each thread's seqs increase (calls from one thread apply in "
        "order) and together they are exactly 0..total-1; baseline = the same calls as "
        "pykka asks to the no-op actor, all answered None. Ratio = our time / pykka's in the "
        "same repeat. Context (DESIGN.md §8 sets no goal for many callers).",
    ]
    return sec


# -- 4. derive over the actor --------------------------------------------------------------------


def _derives(derive: Callable[[], list[Message]], k: int) -> list[Message]:
    """Call ``derive`` ``k`` times, one after the other; the last answer."""
    got: list[Message] = []
    for _ in range(k):
        got = derive()
    return got


def bench_derive(cfg: h.Config) -> h.Section:
    """``s.derive_messages().get()`` on a ~200-message surface vs ``log.derive_messages()``."""
    size = 200
    k = cfg.pick(2_000, 400)
    repeats = cfg.pick(5, 2)
    log = build(surface_only_specs(size), size, "session.derive")
    _, pure = log.materialize()
    want = pure.derive_messages()
    if len(want) != size:
        raise AssertionError(f"session.derive: expected a {size}-message surface")
    ours_t: list[int] = []
    pure_t: list[int] = []
    with _actors("bench-derive", log) as (s, _):
        if s.derive_messages().get() != want:
            raise AssertionError("session.derive: the session's surface differs from the log's")
        runs: dict[str, Callable[[], list[Message]]] = {
            "ours": lambda: s.derive_messages().get(),
            "pure": pure.derive_messages,
        }
        for rep in range(repeats):
            h.progress(f"session.derive: {k} derives per side, repeat {rep + 1}/{repeats}")
            order = ("ours", "pure") if rep % 2 == 0 else ("pure", "ours")
            for who in order:
                ns, got = h.timed(partial(_derives, runs[who], k))
                if got != want:
                    raise AssertionError(f"session.derive: {who} derived other messages")
                (ours_t if who == "ours" else pure_t).append(ns)
            h.settle()
    o = h.Stats.of([t / k for t in ours_t])
    b = h.Stats.of([t / k for t in pure_t])
    slow = h.ratios(ours_t, pure_t)
    sec = h.Section()
    sec.rows.append(
        h.Row(
            f"derive_messages over the actor, surface {size}",
            h.fmt_time_spread(o),
            "Log.derive_messages " + h.fmt_time_spread(b),
            h.fmt_ratio(slow.median, slow.min, slow.max) + " the time",
            "- (context)",
            "info",
            {
                "surface": size,
                "calls_per_block": k,
                "ours_ns_per_call": o.as_dict(),
                "baseline_ns_per_call": b.as_dict(),
                "slowdown": slow.as_dict(),
            },
        )
    )
    sec.notes += [
        f"a {size}-event session of surface events only (surface = {size} messages), started "
        "with Session.start(id, log); ours = s.derive_messages().get() one at a time; "
        "baseline = derive_messages() on the same log materialized, in the caller's thread "
        "(no actor); median [min-max] of the mean per call; ratio = our time / the pure call's "
        "in the same repeat; outputs checked equal.",
        "the difference is one round trip to the actor; compare session.round_trip.",
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("session.round_trip", "append round trip vs a bare Pykka ask", bench_round_trip),
    h.Benchmark("session.pipelined", "pipelined appends to one session", bench_pipelined),
    h.Benchmark("session.threads", f"{THREADS} caller threads, one session", bench_threads),
    h.Benchmark("session.derive", "derive_messages over the actor", bench_derive),
)
