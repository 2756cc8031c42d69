"""What every benchmark module shares: registration, sizing, timing, goals, threads, output.

A benchmark module exposes ``BENCHMARKS``, a tuple of :class:`Benchmark`; each
one is a function from a :class:`Config` to a :class:`Section` of table rows.
The list of modules lives in ``bench/__main__.py``. Modules import this one as
``from bench import harness as h``.

Timing rules (DESIGN.md §8, "measure as users run"): the cyclic garbage
collector stays ON in every timed section (a GC-off figure may be shown
beside a GC-on one, never instead of it); times come from
``time.perf_counter_ns``; each figure is repeated and reported as its median
with the min-max spread; ours and the baseline are timed side by side,
alternating, in the same run, so their ratio is the number to trust and
absolute times are context. ``gc.collect()`` runs only between timed runs.

A row that judges a DESIGN.md §8 goal carries the goal's id (:data:`GOALS`),
the figure it judges, the target and the sense of the comparison; its verdict
is computed from those (:func:`goal_row`), so the table, the JSON file and the
plot all say the same thing.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import structlog
import structlog.testing

__all__ = [
    "GOALS",
    "JOIN_TIMEOUT",
    "Benchmark",
    "Config",
    "Row",
    "Section",
    "Sense",
    "Stats",
    "Verdict",
    "fmt_bytes",
    "fmt_count",
    "fmt_rate",
    "fmt_rate_spread",
    "fmt_ratio",
    "fmt_time",
    "fmt_time_spread",
    "gc_off",
    "gc_watch",
    "goal_row",
    "info_row",
    "installed",
    "progress",
    "ratios",
    "run_threads",
    "scratch",
    "problems_logged",
    "settle",
    "time_ns",
    "timed",
]

T = TypeVar("T")

Verdict = Literal["pass", "fail", "info"]
"""``pass``/``fail`` against a DESIGN.md §8 goal; ``info`` for context rows without one."""

Sense = Literal[">=", "<="]
"""How a judged figure compares with its target to pass."""

JOIN_TIMEOUT: Final = 300.0
"""Seconds any wait of the suite lasts at most before it calls the run broken."""

GOALS: Final[dict[str, str]] = {
    "G1": "session append round trip (memory) <= 1.2x a bare Pykka ask to a no-op actor",
    "G2": "pipelined appends to one in-memory session, 100k appends >= 3x Pykka's pipelined "
    "ask to a no-op actor in the same run",
    "G3": "durable 100 sessions x 100 events, SQLite file, durability full, acked after "
    "commit, three caller shapes (pipelined; a thread per session; one asyncio loop with 100 "
    "coroutines): pipelined and asyncio >= 10x both eventsourcing's SQLite recorder and the "
    "Agents SDK SQLiteSession on the same work; threads >= 5x the recorder and >= 10x "
    "SQLiteSession; pipelined >= 0.5x raw sqlite3 inserting the same pre-encoded rows 100 "
    "per transaction (the floor, same run)",
    "G4": "100, 1,000, 10,000 live sessions in one process, asyncio callers, durable (SQLite): "
    "throughput at 10,000 >= 0.9x that at 100, on an empty file and on one that already "
    "holds 1M events of other sessions",
    "G5": "a long session, 100k events, a compaction every 100: events/s over the last 30% "
    ">= 0.8x the first 30% (in memory and on SQLite); compact + next derive latency flat "
    "(last/first window <= 1.5x)",
    "G6": "derive_messages after one append on a 100k-event materialized log: <= 1 ms and "
    "flat on a compacted log; <= 3x a bare copy of a list that long uncompacted",
    "G7": "full fold, 100k events with 1k replaces >= 20x the O(n*r) reference fold",
    "G8": "recovery of a 100k-event session from SQLite, GC on: <= 1.0x a bare SELECT + "
    "stdlib json.loads of the same rows (the library's own decoder reported beside it)",
    "G9": "a summariser that takes 2 s: the session's other calls answered in <= 10 ms meanwhile",
    "G10": "memory per stored small event in a live session <= 1.0x a plain list of dicts",
    "G11": "durable 100 sessions x 100 events on PostgresStore (local server), acked after "
    "commit: >= 20k events/s",
    "G12": "sessions on Ray, 4 shards on PostgresStore, 100 sessions x 100 appends from one "
    "asyncio loop (a coroutine per session awaiting each append): cost per append <= 1.5x "
    "a bare no-op Ray actor call awaited the same way",
    "G13": "a shard of sessions on Ray killed while idle (SIGKILL of its worker; ray.kill "
    "with restart): its sessions' first call answered <= 3 s after the kill",
    "G14": "100, 1,000, 10,000 live sessions in one process (asyncio callers, durable "
    "SQLite): threads in the process <= 64 whatever the count",
    "G15": "a live idle session <= 4 KB of memory beyond its events",
    "G16": "opening 10,000 stored sessions (10 events each, SQLite) at once from asyncio "
    "<= 1 s (sessions open in parallel, not one after another)",
    "G17": "a program that ends without closing its registry exits <= 1 s after its last "
    "line; nothing acknowledged lost",
    "G18": "ADK get_session of a 10k-event session, whole, on SQLite: >= 10x ADK's "
    "DatabaseSessionService on the same data",
    "G19": "ADK get_session of a 10k-event session with a recent-events config: <= 10 ms",
    "G20": "ADK list_sessions of 10k sessions: <= 200 ms",
    "G21": "ADK appends from 50 concurrent runs on 50 sessions: >= 5x ADK's "
    "DatabaseSessionService",
    "G22": "several processes on one SQLite file: hand-off of a session from an idle "
    "holder (open(id, wait=) until ready) <= 50 ms",
    "G23": "the same hand-off on PostgreSQL <= 100 ms",
    "G24": "4 web-worker processes on one SQLite file, 20 sessions, 32 concurrent clients in "
    "random order (read, then write one turn): >= 500 requests/s",
    "G25": "a cold read of a 1k-event session by a process that does not hold it <= 2 ms, "
    "also inside a process with a big heap (millions of live objects, GC on)",
    "G26": "a snapshot that drops >= 50% of a SQLite file's events leaves the file <= 1.2x "
    "a VACUUMed copy of it",
    "G27": "the viewer's page of a 100k-event session: first rows drawn in a real browser "
    "<= 1 s while another process keeps both CPUs busy",
    "G28": "one session flooded by 50 threads: the other sessions' p99 append latency "
    "<= 5 ms meanwhile",
    "G29": "4 web-worker processes on one store (SQLite, PostgreSQL) whose calls go to the "
    "process holding the session (forwarding), 32 clients, one turn a request (20 "
    "conversations at random; 4 hot ones): >= 1.5x the requests/s of one worker alone",
    "G30": "the same 4 forwarding workers: p99 request latency <= 1.5x one worker alone's",
    "G31": "0 calls refused by a live worker among forwarding workers on either store, "
    "through hand-offs, restarts and two SIGKILLed workers",
    "G32": "an awaited append forwarded to the process holding the session (another "
    "process of this host, SQLite): round trip <= 3x a local one",
    "G33": "LangGraph checkpointer: one thread's file after 500 turns of a messages graph "
    "<= 1/100 of SqliteSaver's",
    "G34": "LangGraph checkpointer: storage linear, size at 500 turns <= 2.2x size at 250",
    "G35": "LangGraph checkpointer: 100 threads x 20 turns from one asyncio loop >= 5x "
    "AsyncSqliteSaver's turns/s",
    "G36": "LangGraph checkpointer: the latest checkpoint of a 500-turn thread read (aget_tuple) "
    "in <= 2x the time of a 5-turn one's",
    "G37": "CPU per durable append (SQLite, 100x100 pipelined), all threads together "
    "<= 29.5 us (half of the ~59 us of the last profile), reported per thread",
}
"""The DESIGN.md §8 goals the suite judges, by id, in the order of the brief."""


@dataclass(frozen=True)
class Config:
    """How big to run: ``quick`` shrinks every size for a smoke run."""

    quick: bool = False

    def pick(self, full: T, quick: T) -> T:
        """``full`` normally, ``quick`` under ``--quick``."""
        return quick if self.quick else full


@dataclass(frozen=True)
class Row:
    """One line of the results table; ``numbers`` holds the raw figures for the JSON file.

    A goal row also has ``goal_id`` (a key of :data:`GOALS`), ``value`` (the
    figure judged, in ``unit``), ``target`` and ``sense``: it passes when
    ``value sense target`` holds (and nothing else made it fail, see
    :func:`goal_row`).
    """

    benchmark: str
    ours: str
    baseline: str
    ratio: str
    goal: str
    verdict: Verdict
    numbers: dict[str, Any] = field(default_factory=dict)
    goal_id: str = ""
    value: float | None = None
    target: float | None = None
    sense: Sense | None = None
    unit: str = ""


def goal_row(
    goal_id: str,
    what: str,
    *,
    ours: str,
    baseline: str,
    ratio: str,
    value: float,
    sense: Sense,
    target: float,
    goal: str,
    unit: str = "x",
    numbers: dict[str, Any] | None = None,
    valid: bool = True,
) -> Row:
    """A row that judges goal ``goal_id``: pass iff ``value sense target`` and ``valid``.

    ``valid`` is ``False`` when the run did not measure what the goal is about
    (e.g. the compaction under a slow summariser failed): then it fails whatever
    the figure.
    """
    if goal_id not in GOALS:
        raise ValueError(f"unknown goal id {goal_id!r}")
    ok = value >= target if sense == ">=" else value <= target
    return Row(
        what,
        ours,
        baseline,
        ratio,
        goal,
        "pass" if ok and valid else "fail",
        dict(numbers or {}),
        goal_id,
        float(value),
        float(target),
        sense,
        unit,
    )


def info_row(
    what: str, ours: str, baseline: str = "-", ratio: str = "-", /, **numbers: Any
) -> Row:
    """A context row: no goal, verdict ``info``."""
    return Row(what, ours, baseline, ratio, "- (context)", "info", dict(numbers))


@dataclass
class Section:
    """What one benchmark returns: its rows, footnotes, and any extra raw data."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Benchmark:
    """A named benchmark; ``name`` is ``module.short`` (``--only`` takes either part)."""

    name: str
    title: str
    run: Callable[[Config], Section]

    @property
    def short(self) -> str:
        """The name without its module prefix."""
        return self.name.rpartition(".")[2]

    @property
    def module(self) -> str:
        """The module prefix of the name (``--only`` takes it for the whole module)."""
        return self.name.partition(".")[0]


def run_module(benchmarks: Sequence[Benchmark], argv: Sequence[str] | None = None) -> int:
    """``python -m bench.<module> [--quick]``: run one module's benchmarks alone and print
    their rows and notes."""
    args = sys.argv[1:] if argv is None else list(argv)
    cfg = Config(quick="--quick" in args)
    for sec in (b.run(cfg) for b in benchmarks):
        for row in sec.rows:
            print(f"{row.benchmark:72} {row.ours:28} {row.baseline:24} {row.ratio:20} "
                  f"{row.verdict}")  # fmt: skip
        for note in sec.notes:
            print(f"  note: {note}")
    return 0


@dataclass(frozen=True)
class Stats:
    """Summary of repeated samples (nanoseconds, bytes or rates: any one unit)."""

    n: int
    min: float
    median: float
    max: float
    p99: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        """Summarise ``samples`` (at least one)."""
        if not samples:
            raise ValueError("Stats.of needs at least one sample")
        ordered = sorted(samples)
        k = min(len(ordered) - 1, max(0, round(0.99 * (len(ordered) - 1))))
        return cls(
            n=len(ordered),
            min=ordered[0],
            median=statistics.median(ordered),
            max=ordered[-1],
            p99=ordered[k],
        )

    def as_dict(self) -> dict[str, float]:
        """The fields, for the JSON file."""
        return {
            "n": self.n,
            "min": self.min,
            "median": self.median,
            "max": self.max,
            "p99": self.p99,
        }


def ratios(num: Sequence[float], den: Sequence[float]) -> Stats:
    """Per repeat ``num[i] / den[i]`` (side by side in the same repeat), summarised."""
    return Stats.of([a / b for a, b in zip(num, den, strict=True)])


# -- timing (GC on) -------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[int, T]:
    """Wall time in nanoseconds of one call of ``fn`` (GC on, as users run), and its result."""
    t0 = time.perf_counter_ns()
    result = fn()
    t1 = time.perf_counter_ns()
    return t1 - t0, result


def time_ns(fn: Callable[[], object]) -> int:
    """Wall time of one call of ``fn`` in nanoseconds, GC on."""
    return timed(fn)[0]


@contextmanager
def gc_off() -> Iterator[None]:
    """The cyclic GC disabled for the block: only for a side figure shown BESIDE a GC-on one."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class GcWatch:
    """Wall time the cyclic GC spent collecting, by generation, while installed (all threads)."""

    def __init__(self) -> None:
        self.ns = [0, 0, 0]
        self.count = [0, 0, 0]
        self.longest = 0  # the longest single collection
        self._t0 = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter_ns()
        else:
            gen = info.get("generation", 0)
            took = time.perf_counter_ns() - self._t0
            self.ns[gen] += took
            self.count[gen] += 1
            self.longest = max(self.longest, took)

    def summary(self) -> str:
        """``"GC: <n> collections, longest <time>"``."""
        return f"GC: {sum(self.count)} collections, longest {fmt_time(self.longest)}"

    def total_ns(self) -> int:
        """GC time so far, every generation."""
        return sum(self.ns)


@contextmanager
def gc_watch() -> Iterator[GcWatch]:
    """Measure (never change) the GC's own time over the block, through ``gc.callbacks``."""
    watch = GcWatch()
    gc.callbacks.append(watch)
    try:
        yield watch
    finally:
        gc.callbacks.remove(watch)


@contextmanager
def problems_logged() -> Iterator[list[MutableMapping[str, Any]]]:
    """What the library logs at ``warning`` or above over the block (a run checks that
    it logged no error), as a service that logs warnings sees them: lower levels are
    dropped by the logger, not kept. (Capturing every level kept each ``info`` line as
    a dict: opening 10,000 sessions paid for 10,000 of them, which no user's process
    keeps.)"""
    capture = structlog.testing.LogCapture()
    before = structlog.get_config()
    structlog.configure(
        processors=[capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    try:
        yield capture.entries
    finally:
        structlog.configure(processors=before["processors"], wrapper_class=before["wrapper_class"])


def settle() -> None:
    """Between timed runs (never inside one): collect the previous run's garbage."""
    gc.collect()


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (the peers are optional)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# -- threads and files ------------------------------------------------------------------------


def run_threads(
    work: Callable[[int], T], threads: int, label: str, timeout: float = JOIN_TIMEOUT
) -> tuple[int, list[T]]:
    """Run ``work(i)`` in ``threads`` threads released together by a barrier.

    Returns the wall ns from the release to the last join, and each thread's
    result. Every wait is bounded: a thread still running after ``timeout``
    seconds, or one that raised, fails the run with an ``AssertionError``.
    """
    barrier = threading.Barrier(threads + 1)
    results: list[Any] = [None] * threads
    done = [False] * threads
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=timeout)
            results[i] = work(i)
            done[i] = True
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool = [
        threading.Thread(target=body, args=(i,), name=f"{label}-{i}", daemon=True)
        for i in range(threads)
    ]
    for t in pool:
        t.start()
    barrier.wait(timeout=timeout)
    t0 = time.perf_counter_ns()
    deadline = time.monotonic() + timeout
    for t in pool:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    t1 = time.perf_counter_ns()
    if any(t.is_alive() for t in pool):
        raise AssertionError(f"{label}: threads still running after {timeout:g} s")
    if errors:
        raise AssertionError(f"{label}: a thread failed: {errors[0]!r}") from errors[0]
    if not all(done):
        raise AssertionError(f"{label}: a thread returned nothing")
    return t1 - t0, results


@contextmanager
def scratch(label: str) -> Iterator[Path]:
    """A fresh folder for one run's database files, removed after."""
    folder = Path(tempfile.mkdtemp(prefix=f"nous-bench-{label}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_START = time.perf_counter()


def progress(message: str) -> None:
    """One progress line on stderr, stamped with the seconds since start."""
    print(f"[bench {time.perf_counter() - _START:6.1f}s] {message}", file=sys.stderr, flush=True)


# -- formatting (ASCII only: the table must read the same in any terminal) --------------

_TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "us"), (1.0, "ns"))
_COUNT_UNITS = ((1e6, "M"), (1e3, "k"), (1.0, ""))


def _unit(value: float, units: Sequence[tuple[float, str]]) -> tuple[float, str]:
    for scale, suffix in units:
        if abs(value) >= scale:
            return scale, suffix
    return units[-1]


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def fmt_time(ns: float) -> str:
    """``ns`` nanoseconds in the largest unit that keeps it >= 1: ``93.6 ms``."""
    scale, unit = _unit(ns, _TIME_UNITS)
    return f"{_num(ns / scale)} {unit}"


def fmt_count(n: float) -> str:
    """``n`` with a k/M suffix: ``100k``, ``1M``, ``1.5M``."""
    scale, unit = _unit(n, _COUNT_UNITS)
    return f"{_num(n / scale)}{unit}"


def fmt_rate(per_s: float) -> str:
    """Events per second: ``245k ev/s``."""
    return f"{fmt_count(per_s)} ev/s"


def fmt_bytes(b: float) -> str:
    """Bytes per event: ``312 B/ev``."""
    return f"{b:.0f} B/ev"


def fmt_ratio(r: float, lo: float | None = None, hi: float | None = None) -> str:
    """A ratio with an optional min-max range: ``36.2x [33-38.1]``."""
    text = f"{_num(r)}x"
    if lo is not None and hi is not None and (lo, hi) != (r, r):
        text += f" [{_num(lo)}-{_num(hi)}]"
    return text


def fmt_time_spread(s: Stats) -> str:
    """``median [min-max] unit`` of nanosecond samples: ``93.6 [91-95.2] ms``."""
    scale, unit = _unit(s.median, _TIME_UNITS)
    if s.n == 1:
        return f"{_num(s.median / scale)} {unit} (n=1)"
    return f"{_num(s.median / scale)} [{_num(s.min / scale)}-{_num(s.max / scale)}] {unit}"


def fmt_rate_spread(s: Stats) -> str:
    """``median [min-max]`` of events/s samples: ``245 [231-250] k ev/s``."""
    scale, unit = _unit(s.median, _COUNT_UNITS)
    if s.n == 1:
        return f"{_num(s.median / scale)}{unit} ev/s (n=1)"
    return f"{_num(s.median / scale)} [{_num(s.min / scale)}-{_num(s.max / scale)}]{unit} ev/s"
