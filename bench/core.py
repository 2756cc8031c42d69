"""Benchmarks of the pure core: full fold (G7), append + derive (G6), append, codec.

Each compares ours with a baseline measured side by side in the same run, GC
on (see :mod:`bench.harness`); workloads come from :mod:`bench.workload`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

from bench import harness as h
from bench.workload import build, realistic_specs, summary_spec, surface_only_specs, text
from nous_actor import Log, Replace
from nous_actor.core.codec import event_to_dict, from_jsonl, to_jsonl
from nous_actor.testing.reference import reference_derive_indexed

__all__ = ["BENCHMARKS"]

FOLD_GOAL: Final = 20.0
DERIVE_GOAL_NS: Final = 1_000_000
FLAT_GOAL: Final = 1.5
COPY_GOAL: Final = 3.0
KEEP: Final = 500
"""Events a compacted session keeps unsummarised in core.append_derive (a)."""


def _size(n: int, r: int | None = None) -> str:
    return f"{h.fmt_count(n)} ev" if r is None else f"{h.fmt_count(n)} ev x {h.fmt_count(r)} repl"


# -- G7. full fold vs the reference ------------------------------------------------------


def bench_fold(cfg: h.Config) -> h.Section:
    """Full fold (``derive_messages`` on a fresh log) vs the O(n*r) reference fold (G7)."""
    n, r = cfg.pick((100_000, 1_000), (10_000, 100))
    repeats = cfg.pick(5, 2)
    specs = list(realistic_specs(n, replace_every=n // r))
    n_replaces = sum(1 for _, d in specs if "surface_op" in d)
    ours: list[int] = []
    ref: list[int] = []
    gc_off_ns: list[int] = []
    for k in range(repeats):
        h.progress(f"core.fold: {_size(n, r)}, repeat {k + 1}/{repeats} (fresh log each)")
        log = build(specs, n, "core.fold")
        h.settle()
        run_ref = partial(reference_derive_indexed, log.events())
        if k % 2:  # alternate which of the two runs first
            ref_ns, want = h.timed(run_ref)
            ours_ns, got = h.timed(log.derive_messages)
        else:
            ours_ns, got = h.timed(log.derive_messages)
            ref_ns, want = h.timed(run_ref)
        if got != [m for _, m in want]:
            raise AssertionError("core.fold: Log and reference folds differ")
        ours.append(ours_ns)
        ref.append(ref_ns)
        del log, got, want
        h.settle()
        if k == 0:  # a GC-off figure beside the GC-on one, on another fresh log
            log = build(specs, n, "core.fold")
            h.settle()
            with h.gc_off():
                gc_off_ns.append(h.time_ns(log.derive_messages))
            del log
            h.settle()
    o, b, q = h.Stats.of(ours), h.Stats.of(ref), h.ratios(ref, ours)
    sec = h.Section()
    sec.rows.append(
        h.goal_row(
            "G7",
            f"full fold {_size(n, r)}" + (" (quick size)" if cfg.quick else ""),
            ours=h.fmt_time_spread(o) + f" (GC off {h.fmt_time(gc_off_ns[0])})",
            baseline="ref " + h.fmt_time_spread(b),
            ratio=h.fmt_ratio(q.median, q.min, q.max) + " faster",
            value=q.median,
            sense=">=",
            target=FOLD_GOAL,
            goal=f">= {FOLD_GOAL:g}x",
            numbers={
                "n": n,
                "r": n_replaces,
                "ours_ns": o.as_dict(),
                "ours_gc_off_ns": gc_off_ns[0],
                "reference_ns": b.as_dict(),
                "ratio": q.as_dict(),
            },
        )
    )
    sec.notes += [
        "ours = Log.derive_messages() on a fresh, never-derived log built by appends (a full "
        "fold); baseline = reference_derive_indexed(log.events()) (nous_actor.testing) on the "
        f"same log; median [min-max] of {repeats} repeats, alternating which runs first; "
        "ratio = reference/ours per repeat (higher is better); outputs checked equal each "
        "repeat. GC on; the GC-off figure beside it is one extra run on another fresh log.",
        f"workload: a realistic session (bench/workload.py) with one replace every {n // r} "
        f"events ({n_replaces} replaces): 3 in 4 prune one tool result (Replace(p, p)), "
        "1 in 4 summarise 1..count-60.",
    ]
    return sec


# -- G6. append + derive on a materialized log ---------------------------------------------


def _append_derive_samples(
    log: Log, iterations: int, compact_every: int | None, keep: int, copy_of: list[Any] | None
) -> tuple[list[int], list[int], Log]:
    """Time ``log = log.append(user_message); log.derive_messages()`` per iteration, GC on.

    With ``compact_every``, an untimed summary replace of positions ``1..count-keep``
    is appended after every ``compact_every`` timed iterations. With ``copy_of``,
    each iteration also times ``copy_of[:]`` (a bare copy of a list that long),
    alternating which goes first.
    """
    rng = random.Random(7)
    summary = summary_spec(rng, 1)[1]["content"]
    datas = [{"content": text(rng, 40, 300)} for _ in range(64)]
    samples: list[int] = []
    copies: list[int] = []
    clock = time.perf_counter_ns
    for i in range(iterations):
        data = datas[i % 64]
        if copy_of is not None and i % 2:
            t0 = clock()
            copy_of[:]
            copies.append(clock() - t0)
        t0 = clock()
        log = log.append("user_message", data)
        log.derive_messages()
        samples.append(clock() - t0)
        if copy_of is not None and not i % 2:
            t0 = clock()
            copy_of[:]
            copies.append(clock() - t0)
        if compact_every and i % compact_every == compact_every - 1:
            stop = log.count() - keep
            log = log.append(
                "system_message", {"content": summary, "surface_op": Replace(1, stop)}
            )
    return samples, copies, log


def bench_append_derive(cfg: h.Config) -> h.Section:
    """``append`` + ``derive_messages`` on a materialized log: compacted and worst case (G6)."""
    sizes = cfg.pick((1_000, 10_000, 100_000), (1_000, 10_000))
    goal_n = sizes[-1]
    iterations = cfg.pick(3_000, 400)
    sec = h.Section()
    medians: list[tuple[int, float]] = []
    points: list[dict[str, Any]] = []
    for shape, shape_text in (("a", "compacted"), ("b", "no compaction")):
        for n in sizes if shape == "a" else (goal_n,):
            label = f"({shape}) {shape_text}, {_size(n)}"
            h.progress(f"core.append_derive: {label}: build, materialize, {iterations} iterations")
            if shape == "a":
                specs = realistic_specs(n, replace_every=50, summary_every=4, keep=KEEP)
            else:
                specs = surface_only_specs(n)
            log = build(specs, n, f"core.append_derive {label}")
            h.settle()
            refold_ns, (msgs, log) = h.timed(log.materialize)
            surface = len(msgs)
            samples, copies, log = _append_derive_samples(
                log,
                iterations,
                200 if shape == "a" else None,
                KEEP,
                msgs if shape == "b" else None,
            )
            s = h.Stats.of(samples)
            nums: dict[str, Any] = {
                "shape": shape,
                "n": n,
                "iterations": iterations,
                "surface_before": surface,
                "append_derive_ns": s.as_dict(),
                "refold_ns": {"median": refold_ns},
            }
            points.append(nums)
            del log
            h.settle()
            if shape == "a":
                medians.append((n, s.median))
                row_what = f"append+derive {label}, surface {h.fmt_count(surface)}"
                if n != goal_n:
                    sec.rows.append(
                        h.info_row(
                            row_what,
                            f"med {h.fmt_time(s.median)}, p99 {h.fmt_time(s.p99)}",
                            "refold " + h.fmt_time(refold_ns),
                            h.fmt_ratio(refold_ns / s.median) + " faster",
                            **nums,
                        )
                    )
                    continue
                sec.rows.append(
                    h.goal_row(
                        "G6",
                        row_what,
                        ours=f"med {h.fmt_time(s.median)}, p99 {h.fmt_time(s.p99)}",
                        baseline="refold " + h.fmt_time(refold_ns),
                        ratio=f"{s.median / DERIVE_GOAL_NS:.3g} of 1 ms",
                        value=s.median / 1e6,
                        sense="<=",
                        target=DERIVE_GOAL_NS / 1e6,
                        goal="median <= 1 ms",
                        unit="ms",
                        numbers=nums,
                    )
                )
            else:
                c = h.Stats.of(copies)
                q = s.median / c.median
                nums["list_copy_ns"] = c.as_dict()
                sec.rows.append(
                    h.goal_row(
                        "G6",
                        f"append+derive {label}, surface {h.fmt_count(surface)} vs list copy",
                        ours=f"med {h.fmt_time(s.median)}, p99 {h.fmt_time(s.p99)}",
                        baseline=f"list[:] med {h.fmt_time(c.median)}",
                        ratio=h.fmt_ratio(q) + " the copy",
                        value=q,
                        sense="<=",
                        target=COPY_GOAL,
                        goal=f"<= {COPY_GOAL:g}x a bare copy",
                        numbers=nums,
                    )
                )
    (n0, m0), (n1, m1) = medians[0], medians[-1]
    growth = m1 / m0
    sec.rows.append(
        h.goal_row(
            "G6",
            f"append+derive (a) flatness {h.fmt_count(n0)} -> {h.fmt_count(n1)} ev",
            ours=f"{h.fmt_time(m0)} -> {h.fmt_time(m1)}",
            baseline="-",
            ratio=h.fmt_ratio(growth) + " growth",
            value=growth,
            sense="<=",
            target=FLAT_GOAL,
            goal=f"<= {FLAT_GOAL:g}x growth (flat)",
            numbers={"shape": "a", "n_from": n0, "n_to": n1, "growth": growth},
        )
    )
    sec.data["points"] = points
    sec.notes += [
        "ours = per-iteration time of `log = log.append('user_message', {...}); "
        f"log.derive_messages()` after `msgs, log = log.materialize()`; {iterations} "
        "iterations, median and p99, GC on.",
        "(a) a realistic session compacted as it runs (a replace every 50 events, a summary "
        f"every 200 keeping the last {KEEP}; in the timed loop an untimed summary every 200 "
        "iterations): the surface stays at a few hundred messages at any length. Baseline = "
        "the refold, i.e. the first materialize() of the fresh log (n=1): what each derive "
        "would cost without the incremental fold. Flat = median at the largest size / at "
        f"the smallest <= {FLAT_GOAL:g}x.",
        "(b) worst case: surface events only, no replaces, so the surface is the whole log and "
        "derive_messages() must copy it (returned lists are the caller's). Baseline = "
        "msgs[:] of a list that long, timed in the same loop, alternating with ours; "
        "ratio = median ours / median copy.",
    ]
    return sec


# -- append throughput (context) -----------------------------------------------------------


def bench_append(cfg: h.Config) -> h.Section:
    """Pure ``Log.append`` throughput for small events vs a plain list (context)."""
    n = cfg.pick(100_000, 10_000)
    repeats = cfg.pick(5, 2)
    datas = [{"content": f"short text {i}"} for i in range(n)]

    def plain_list() -> None:
        out: list[dict[str, Any]] = []
        for d in datas:
            out.append(d)

    def naive_records() -> None:
        out: list[dict[str, Any]] = []
        for i, d in enumerate(datas):
            out.append(
                {"seq": i, "type": "user_message", "time": datetime.now(UTC), "data": dict(d)}
            )

    def plain_log() -> None:
        log = Log()
        for d in datas:
            log = log.append("user_message", d)

    def materialized_log() -> None:
        _, log = Log().append("system_message", {"content": "prompt"}).materialize()
        for d in datas:
            log = log.append("user_message", d)

    runs: dict[str, Callable[[], None]] = {
        "list": plain_list,
        "naive": naive_records,
        "plain": plain_log,
        "materialized": materialized_log,
    }
    times: dict[str, list[int]] = {k: [] for k in runs}
    for k in range(repeats):
        h.progress(f"core.append: {h.fmt_count(n)} appends per variant, repeat {k + 1}/{repeats}")
        for name in list(runs) if k % 2 == 0 else list(reversed(runs)):
            times[name].append(h.time_ns(runs[name]))
            h.settle()
    rate = {k: h.Stats.of([n * 1e9 / t for t in v]) for k, v in times.items()}
    sec = h.Section()
    for title, ours, base, base_text in (
        ("append, plain Log", "plain", "list", "list.append"),
        ("append, materialized Log", "materialized", "list", "list.append"),
        ("append, plain Log vs dict records", "plain", "naive", "records"),
    ):
        slow = h.ratios(times[ours], times[base])
        sec.rows.append(
            h.info_row(
                title,
                h.fmt_rate_spread(rate[ours]),
                base_text + " " + h.fmt_rate_spread(rate[base]),
                h.fmt_ratio(slow.median, slow.min, slow.max) + " slower",
                n=n,
                ours_events_per_s=rate[ours].as_dict(),
                baseline_events_per_s=rate[base].as_dict(),
                slowdown=slow.as_dict(),
            )
        )
    sec.notes += [
        f"{h.fmt_count(n)} events {{'content': 'short text <i>'}} per repeat, GC on; ratio = "
        "our time / baseline time in the same repeat (how many times slower).",
        "list.append = the same dicts appended to a list (no copy, no validation): a floor. "
        "records = {'seq', 'type', 'time': datetime.now(UTC), 'data': dict(d)} appended to a "
        "list. materialized = every append also keeps the memoised fold current.",
    ]
    return sec


# -- codec throughput (context) --------------------------------------------------------------


def bench_codec(cfg: h.Config) -> h.Section:
    """JSON Lines encode/decode throughput vs bare ``json`` on the same records (context)."""
    n = cfg.pick(50_000, 5_000)
    repeats = cfg.pick(3, 2)
    h.progress(f"core.codec: building a {h.fmt_count(n)}-event session")
    log = build(realistic_specs(n, replace_every=50), n, "core.codec")
    records = [event_to_dict(ev) for ev in log.events()]
    jsonl = to_jsonl(log)
    if from_jsonl(jsonl) != log:
        raise AssertionError("core.codec: JSONL round trip changed the log")
    lines = jsonl.splitlines()

    def enc_base() -> None:
        "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records)

    def dec_base() -> None:
        [json.loads(line) for line in lines]

    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "encode": (partial(to_jsonl, log), enc_base),
        "decode": (partial(from_jsonl, jsonl), dec_base),
    }
    times: dict[str, tuple[list[int], list[int]]] = {k: ([], []) for k in pairs}
    for k in range(repeats):
        h.progress(f"core.codec: encode/decode {h.fmt_count(n)} events, repeat {k + 1}/{repeats}")
        for name, (ours, base) in pairs.items():
            for who, fn in ((0, ours), (1, base)) if k % 2 == 0 else ((1, base), (0, ours)):
                times[name][who].append(h.time_ns(fn))
                h.settle()
    sec = h.Section()
    titles = {"encode": "JSONL encode (to_jsonl)", "decode": "JSONL decode (from_jsonl)"}
    for name, (ours_t, base_t) in times.items():
        o = h.Stats.of([n * 1e9 / t for t in ours_t])
        b = h.Stats.of([n * 1e9 / t for t in base_t])
        slow = h.ratios(ours_t, base_t)
        sec.rows.append(
            h.info_row(
                titles[name],
                h.fmt_rate_spread(o),
                "bare json " + h.fmt_rate_spread(b),
                h.fmt_ratio(slow.median, slow.min, slow.max) + " slower",
                n=n,
                ours_events_per_s=o.as_dict(),
                baseline_events_per_s=b.as_dict(),
                slowdown=slow.as_dict(),
            )
        )
    sec.notes += [
        f"a realistic {h.fmt_count(n)}-event session, GC on; encode baseline = json.dumps of "
        "the same records as plain dicts; decode baseline = json.loads per line (no "
        "validation, no Event, no Log); ratio = our time / baseline time in the same repeat.",
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("core.fold", "G7 full fold vs the O(n*r) reference", bench_fold),
    h.Benchmark(
        "core.append_derive", "G6 append + derive on a materialized log", bench_append_derive
    ),
    h.Benchmark("core.append", "Log.append throughput, small events", bench_append),
    h.Benchmark("core.codec", "JSON Lines codec throughput", bench_codec),
)
