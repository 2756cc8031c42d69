"""What every benchmark module shares: registration, sizing, timing, statistics, progress.

A benchmark module (``bench/core.py`` today; the session actor and the SQLite
store later) exposes ``BENCHMARKS``, a tuple of :class:`Benchmark`; each one is
a function from a :class:`Config` to a :class:`Section` of table rows. The
list of modules lives in ``bench/__main__.py``.

Timing rules (the machine is shared and noisy): every timed section runs with
the garbage collector disabled and is measured with ``time.perf_counter_ns``;
each figure is repeated and reported as its median with the min-max spread;
ours and the baseline are timed side by side, alternating, in the same run, so
their ratio is the number to trust and absolute times are context.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

__all__ = [
    "Benchmark",
    "Config",
    "Row",
    "Section",
    "Stats",
    "Verdict",
    "fmt_bytes",
    "fmt_count",
    "fmt_rate",
    "fmt_ratio",
    "fmt_rate_spread",
    "fmt_time",
    "fmt_time_spread",
    "gc_paused",
    "progress",
    "time_ns",
    "timed",
]

T = TypeVar("T")

Verdict = Literal["pass", "fail", "info"]
"""``pass``/``fail`` against a DESIGN.md §8 goal; ``info`` for context rows without one."""


@dataclass(frozen=True)
class Config:
    """How big to run: ``quick`` shrinks every size for a smoke run."""

    quick: bool = False

    def pick(self, full: T, quick: T) -> T:
        """``full`` normally, ``quick`` under ``--quick``."""
        return quick if self.quick else full


@dataclass(frozen=True)
class Row:
    """One line of the results table; ``numbers`` holds the raw figures for the JSON file."""

    benchmark: str
    ours: str
    baseline: str
    ratio: str
    goal: str
    verdict: Verdict
    numbers: dict[str, Any] = field(default_factory=dict)


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


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector for the block, restoring its previous state."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def timed(fn: Callable[[], T]) -> tuple[int, T]:
    """Wall time in nanoseconds of one call of ``fn`` (gc paused), and what it returned."""
    with gc_paused():
        t0 = time.perf_counter_ns()
        result = fn()
        t1 = time.perf_counter_ns()
    return t1 - t0, result


def time_ns(fn: Callable[[], object]) -> int:
    """Wall time of one call of ``fn`` in nanoseconds, with the garbage collector paused."""
    return timed(fn)[0]


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
    if lo is not None and hi is not None:
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
