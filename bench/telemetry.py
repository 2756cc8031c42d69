"""What OpenTelemetry costs the hot path (DESIGN.md §9: "without the extra, or with it and
no SDK configured, the hot path pays nothing measurable").

``telemetry.overhead``: the same work three ways, side by side in each repeat:
with no sink installed (as without the extra), with the OpenTelemetry sink on the
API alone (the extra installed, no SDK: no-op instruments), and with the sink on
an SDK ``MeterProvider`` and ``TracerProvider`` (an in-memory reader, so the
export itself costs nothing here). Work: ``append().get()`` one at a time on an
in-memory session (the round trip), pipelined appends to one in-memory session,
and pipelined appends to a session on a SQLite file (a commit per batch). GC on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from bench import harness as h

__all__ = ["BENCHMARKS", "main"]

VARIANTS: Final = ("off", "api", "sdk")


@contextmanager
def _sink(variant: str) -> Iterator[None]:
    from nous_actor.runtime import telemetry

    sink: Any = None
    if variant != "off":
        from nous_actor.runtime.otel import OpenTelemetrySink

        if variant == "api":
            sink = OpenTelemetrySink()
        else:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import InMemoryMetricReader
            from opentelemetry.sdk.trace import TracerProvider

            sink = OpenTelemetrySink(
                MeterProvider(metric_readers=[InMemoryMetricReader()]), TracerProvider()
            )
    old = telemetry.install(sink)
    try:
        yield
    finally:
        telemetry.install(old)


def _round_trip(n: int) -> Callable[[Any], None]:
    def run(s: Any) -> None:
        for k in range(n):
            s.append("user_message", {"content": f"short text {k}"}).get(timeout=60)

    return run


def _pipelined(n: int) -> Callable[[Any], None]:
    def run(s: Any) -> None:
        last = None
        for k in range(n):
            last = s.append("user_message", {"content": f"short text {k}"})
        assert last is not None
        last.get(timeout=120)

    return run


def _time(variant: str, work: Callable[[Any], None], store: Any) -> int:
    from nous_actor import Session

    with _sink(variant):
        s = Session.start(f"telemetry-{variant}", store=store, timeout=60)
        try:
            s.append("user_message", {"content": "warm-up"}).get(timeout=60)
            return h.time_ns(lambda: work(s))
        finally:
            s.stop(timeout=60)


def bench_overhead(cfg: h.Config) -> h.Section:
    """Round trip and pipelined appends with no sink, the API's no-ops, and an SDK."""
    sec = h.Section()
    if not h.installed("opentelemetry.sdk"):
        sec.rows.append(
            h.info_row("telemetry overhead", "skipped: opentelemetry-sdk is not installed")
        )
        return sec
    from nous_actor import SQLiteStore

    repeats = cfg.pick(5, 2)
    shapes: dict[str, tuple[int, Callable[[int], Callable[[Any], None]], bool]] = {
        "append round trip, memory": (cfg.pick(3_000, 300), _round_trip, False),
        "pipelined appends, memory": (cfg.pick(50_000, 3_000), _pipelined, False),
        "pipelined appends, SQLite": (cfg.pick(10_000, 1_000), _pipelined, True),
    }
    with h.scratch("telemetry") as folder:
        for shape, (n, make, durable) in shapes.items():
            times: dict[str, list[int]] = {v: [] for v in VARIANTS}
            for k in range(repeats):
                h.progress(f"telemetry.overhead: {shape}, {n} calls, repeat {k + 1}/{repeats}")
                order = VARIANTS if k % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    store = SQLiteStore(folder / f"{variant}-{k}.db") if durable else None
                    try:
                        times[variant].append(_time(variant, make(n), store))
                    finally:
                        if store is not None:
                            store.close()
                    h.settle()
            off = h.Stats.of([t / n for t in times["off"]])
            for variant in ("api", "sdk"):
                per = h.Stats.of([t / n for t in times[variant]])
                q = h.ratios(times[variant], times["off"])
                label = "API, no SDK" if variant == "api" else "SDK, in-memory reader"
                sec.rows.append(
                    h.info_row(
                        f"telemetry {label}: {shape}",
                        f"{h.fmt_time_spread(per)}/call",
                        f"no sink {h.fmt_time_spread(off)}/call",
                        h.fmt_ratio(q.median, q.min, q.max),
                        variant=variant,
                        shape=shape,
                        calls=n,
                        per_call_ns=per.as_dict(),
                        off_per_call_ns=off.as_dict(),
                        ratio=q.as_dict(),
                    )
                )
    sec.notes.append(
        "telemetry.overhead: the same session work with no telemetry sink, with the "
        "OpenTelemetry sink on the API alone (no SDK: no-op instruments) and on an SDK with "
        f"an in-memory metric reader; alternating order, median [min-max] of {repeats} "
        "repeats; the ratio is per repeat, against no sink. GC on."
    )
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark(
        "telemetry.overhead",
        "OpenTelemetry on the hot path: no sink vs the API's no-ops vs an SDK",
        bench_overhead,
    ),
)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.telemetry [--quick]``: run this module alone and print its rows."""
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    sys.exit(main())
