"""The figures as PNGs: ``python -m bench.plot [JSON [FOLDER]]``.

Read from the JSON file :mod:`bench.report` writes (or the same document in memory):

* ``goals.png``: every goal row of the run as a horizontal bar of its margin
  against its goal (figure / target for a ">=" goal, target / figure for a
  "<=" goal, log scale), so the goal is the line at 1 and every bar reaching
  past it passes; colored by verdict, labelled with the figure and the goal.
* ``scaling.png``: the sessions sweep (G4: durable events/s vs live sessions,
  asyncio callers) and the long session (G5: events/s and compact + derive
  latency per 10% window), when those ran.

matplotlib (in the ``bench`` extra) is imported only when a plot is drawn,
with the non-interactive Agg backend.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from bench.report import DEFAULT_JSON

__all__ = ["GOALS_PNG", "SCALING_PNG", "draw_all", "main"]

GOALS_PNG: Final = "goals.png"
SCALING_PNG: Final = "scaling.png"
COLORS: Final = {"pass": "#2e8b3a", "fail": "#c62828"}
GOAL_COLOR: Final = "0.15"


def _goal_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for section in doc.get("benchmarks", {}).values():
        for r in section["rows"]:
            if r.get("goal_id") and r.get("value") is not None and r.get("target"):
                rows.append(r)
    rows.sort(key=lambda r: int(r["goal_id"][1:]))  # G1, G2, ... G37, in order
    return rows


def _margin(r: dict[str, Any]) -> float:
    """How far past its goal a row is: > 1 meets it, whatever the goal's direction."""
    v, t = float(r["value"]), float(r["target"])
    raw = v / t if r["sense"] == ">=" else (t / v if v > 0 else 1e3)
    return min(max(raw, 1e-3), 1e3)


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _figure(r: dict[str, Any]) -> str:
    unit = r.get("unit") or ""
    v, t = float(r["value"]), float(r["target"])

    def num(x: float) -> str:
        if unit == "ev/s":
            return f"{x / 1e3:.3g}k"
        return f"{x:.3g}"

    sep = "" if unit == "x" else " "
    return f"{num(v)}{sep}{unit}  (goal {r['sense']} {num(t)}{sep}{unit})"


def _title(meta: dict[str, Any]) -> str:
    started = str(meta.get("started", "?")).replace("T", " ").replace("+00:00", " UTC")
    load = meta.get("loadavg_before") or meta.get("loadavg")
    bits = [
        f"nous-actor benchmarks, {started}",
        f"{meta.get('cpu_count', '?')} CPUs",
        f"load {load[0]:.1f}" if load else None,
        f"Python {meta.get('python', '?')}",
        f"commit {str(meta['git_commit'])[:8]}" if meta.get("git_commit") else None,
        "+ uncommitted library changes" if meta.get("library_dirty") else None,
        "GC on",
    ]
    title = " · ".join(b for b in bits if b)
    if meta.get("quick"):
        title += "\n--quick run: reduced sizes, not the DESIGN.md §8 sizes"
    return title


def plot_goals(doc: dict[str, Any], png: Path) -> Path | None:
    """The goals figure; ``None`` (nothing drawn) when the run judged no goal."""
    rows = _goal_rows(doc)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    margins = [_margin(r) for r in rows]
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.36 * len(rows)), layout="constrained")
    try:
        ys = list(range(len(rows)))[::-1]
        colors = [COLORS.get(r["verdict"], "0.5") for r in rows]
        ax.barh(ys, [m - 1 for m in margins], left=1, color=colors, height=0.7)
        ax.axvline(1, color=GOAL_COLOR, lw=1.6, ls="-")
        ax.set_xscale("log")
        lo = min(0.5, min(margins) / 1.5)
        hi = max(4.0, max(margins) * 12)
        ax.set_xlim(lo, hi)
        ax.set_yticks(ys)
        ax.set_yticklabels([f"{r['goal_id']}  {_short(r['benchmark'])}" for r in rows], fontsize=9)
        for y, m, r in zip(ys, margins, rows, strict=True):
            ax.text(
                max(m, 1) * 1.08,
                y,
                _figure(r),
                va="center",
                ha="left",
                fontsize=8.5,
                color=COLORS.get(r["verdict"], "0.2"),
                fontweight="bold",
            )
        ax.set_xlabel(
            "margin against the goal (log scale): figure/goal for a '>=' goal, goal/figure for "
            "a '<=' goal; right of the line = meets it"
        )
        goals = doc.get("goals", {})
        passed = sum(1 for g in goals.values() if g["verdict"] == "pass")
        judged = sum(1 for g in goals.values() if g["verdict"] != "not run")
        ax.set_title(
            f"DESIGN.md §8 goals: {passed} of {judged} met ({len(rows)} rows)",
            fontsize=12,
            loc="left",
        )
        ax.legend(
            handles=[
                Patch(color=COLORS["pass"], label="PASS"),
                Patch(color=COLORS["fail"], label="FAIL"),
            ],
            loc="lower right",
            fontsize=9,
        )
        ax.grid(True, axis="x", which="major", alpha=0.3)
        fig.suptitle(_title(doc.get("meta", {})), fontsize=10)
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=100)
    finally:
        plt.close(fig)
    return png


def _count_label(x: float) -> str:
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def plot_scaling(doc: dict[str, Any], png: Path) -> Path | None:
    """The sweep and long-session figure; ``None`` when neither ran."""
    benches = doc.get("benchmarks", {})
    sweep = benches.get("durable.sweep", {}).get("data", {}).get("sweep")
    series = benches.get("lifetime.long", {}).get("data", {}).get("series")
    if not sweep and not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 5.6), layout="constrained")
    try:
        if sweep:
            for shape, pts in sweep["shapes"].items():
                xs = [p["sessions"] for p in pts]
                med = [p["events_per_s"]["median"] for p in pts]
                lo = [p["events_per_s"]["median"] - p["events_per_s"]["min"] for p in pts]
                hi = [p["events_per_s"]["max"] - p["events_per_s"]["median"] for p in pts]
                a.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, lw=2, label=shape)
                for x, y in zip(xs, med, strict=True):
                    a.annotate(_count_label(y), (x, y), textcoords="offset points",
                               xytext=(5, 6), fontsize=8)  # fmt: skip
            a.set_xscale("log")
            a.set_yscale("log")
            sessions = sweep["sessions"]
            a.xaxis.set_major_locator(FixedLocator(sessions))
            a.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            a.xaxis.set_minor_formatter(NullFormatter())
            a.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _count_label(y)))
            ymin, ymax = a.get_ylim()
            a.set_ylim(10 ** math.floor(math.log10(max(ymin, 1.0))), ymax * 1.5)
            per = sweep["events_per_session"]
            a.set_xlabel(
                f"live sessions ({sweep['events_per_run']} appends per run shared among them, "
                "log scale)"
                if isinstance(per, dict)
                else f"sessions ({per} events each, log scale)"
            )
            a.set_ylabel("events/s acked after commit (SQLite, durability full)")
            a.set_title(
                f"G4 sessions sweep: goal at {sessions[-1]} >= 0.9x at {sessions[0]}",
                loc="left",
                fontsize=11,
            )
            a.grid(True, alpha=0.3)
            a.legend(fontsize=9)
        else:
            a.set_axis_off()
        if series:
            for where, s in series.items():
                k = list(range(10, 10 * len(s["window_events_per_s"]) + 1, 10))
                b.plot(k, s["window_events_per_s"], marker="o", lw=2, label=where)
                c.plot(k, [x / 1e6 for x in s["window_compact_derive_median_ns"]], marker="o",
                       lw=2, label=where)  # fmt: skip
            b.set_yscale("log")
            for fmt_axis in (b.yaxis.set_major_formatter, b.yaxis.set_minor_formatter):
                fmt_axis(FuncFormatter(lambda y, _: _count_label(y)))
            b.set_xlabel("window of the session's life (% of its events)")
            b.set_ylabel("events/s (appends + compact + derive)")
            b.set_title("G5 long session: events/s per 10% window", loc="left", fontsize=11)
            c.set_yscale("log")
            for fmt_axis in (c.yaxis.set_major_formatter, c.yaxis.set_minor_formatter):
                fmt_axis(FuncFormatter(lambda y, _: f"{y:.3g}"))
            c.set_xlabel("window of the session's life (% of its events)")
            c.set_ylabel("compact().get() + derive_messages().get(), median (ms)")
            c.set_title("G5 long session: compact + derive latency", loc="left", fontsize=11)
            for ax in (b, c):
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=9)
        else:
            b.set_axis_off()
            c.set_axis_off()
        fig.suptitle(_title(doc.get("meta", {})), fontsize=10)
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=100)
    finally:
        plt.close(fig)
    return png


def draw_all(doc: dict[str, Any], folder: Path) -> list[Path]:
    """Draw every figure ``doc`` has data for into ``folder``; the files written."""
    out = [plot_goals(doc, folder / GOALS_PNG), plot_scaling(doc, folder / SCALING_PNG)]
    return [p for p in out if p is not None]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.plot [JSON [FOLDER]]``: redraw the figures from a results file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 2 or any(a.startswith("-") for a in args):
        print("usage: python -m bench.plot [JSON [FOLDER]]", file=sys.stderr)
        return 2
    src = Path(args[0]) if args else DEFAULT_JSON
    dst = Path(args[1]) if len(args) > 1 else src.parent
    for p in draw_all(json.loads(src.read_text(encoding="utf-8")), dst):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
