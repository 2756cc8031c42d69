"""The scaling figures as a PNG: ``python -m bench.plot [JSON] [PNG]``.

Two panels, read from the JSON file :mod:`bench.report` writes (or the same
document in memory):

* (a) ``core.append_derive``: time of one ``append`` + ``derive_messages`` on a
  materialized log vs the log's size (log-log), for a compacted session and for
  the worst case whose surface is the whole log, with the refold each derive
  would cost without the incremental fold, and the 1 ms goal of DESIGN.md §8;
* (b) ``durable.sweep``: durable events/s vs the number of sessions (SQLite,
  durability full), ours and the baselines, with the 20k events/s goal (if the
  sweep did not run, the ``durable.appends`` points at its one size).

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

__all__ = ["DEFAULT_PNG", "has_scaling", "main", "plot", "plot_file"]

DEFAULT_PNG: Final = DEFAULT_JSON.with_name("scaling.png")
DERIVE_GOAL_S: Final = 1e-3
RATE_GOAL: Final = 20_000.0

_SHAPES: Final = {
    "a": ("(a) compacted session (surface ≈ a few hundred messages)", "tab:blue", "o"),
    "b": ("(b) no compaction (surface = the whole log)", "tab:orange", "s"),
}
_SWEEP_STYLE: Final = {
    # name: (label, color, marker, linestyle, linewidth)
    "ours full pipelined": (
        "ours, pipelined ({threads} client threads)",
        "tab:blue",
        "o",
        "-",
        2.2,
    ),
    "ours full threads": ("ours, a thread per session, append().get()", "tab:cyan", "D", "-", 1.6),
    "eventsourcing": (
        "eventsourcing SQLite recorder (a thread per session)",
        "0.35",
        "^",
        "--",
        1.4,
    ),
    "agents": ("OpenAI Agents SQLiteSession (a task per session)", "0.6", "v", ":", 1.6),
}
_DODGE: Final = {"ours full threads": 0.95, "agents": 1.05}
"""Horizontal nudges (factors on the log axis) of the lower, crowded series."""
GOAL_COLOR: Final = "tab:red"


def has_scaling(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` holds either panel's figures (else a plot would be empty)."""
    return bool(_derive_points(doc) or _rate_points(doc)[0])


def _derive_points(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``core.append_derive``'s per-size rows, by shape, sorted by log size."""
    section = doc.get("benchmarks", {}).get("core.append_derive")
    out: dict[str, list[dict[str, Any]]] = {}
    if not section:
        return out
    for row in section["rows"]:
        nums = row["numbers"]
        if "append_derive_ns" in nums:
            out.setdefault(nums["shape"], []).append(nums)
    for points in out.values():
        points.sort(key=lambda p: p["n"])
    return out


def _rate_points(doc: dict[str, Any]) -> tuple[dict[str, list[tuple[int, dict[str, float]]]], str]:
    """Events/s by variant as ``(sessions, stats)`` points, and where they come from."""
    benches = doc.get("benchmarks", {})
    sweep = benches.get("durable.sweep", {}).get("data", {}).get("sweep")
    if sweep:
        points = {
            name: [(p["sessions"], p["events_per_s"]) for p in pts]
            for name, pts in sweep["variants"].items()
        }
        return points, f"{sweep['events_per_session']} events per session, durable.sweep"
    section = benches.get("durable.appends")
    if not section:
        return {}, ""
    out: dict[str, list[tuple[int, dict[str, float]]]] = {}
    events = 0
    for row in section["rows"]:
        nums = row["numbers"]
        if nums.get("store") != "full":
            continue
        s, events = nums["sessions"], nums["events_per_session"]
        out[f"ours full {nums['shape']}"] = [(s, nums["ours_events_per_s"])]
        out["eventsourcing"] = [(s, nums["eventsourcing_events_per_s"])]
    for row in section["rows"]:
        if "agents" in row["baseline"] and "baseline_events_per_s" in row["numbers"]:
            out["agents"] = [(out["eventsourcing"][0][0], row["numbers"]["baseline_events_per_s"])]
    return out, f"{events} events per session, durable.appends only: no sweep"


def _count_label(x: float) -> str:
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _time_label(seconds: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= scale * 0.999:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def _title(meta: dict[str, Any]) -> str:
    started = str(meta.get("started", "?")).replace("T", " ").replace("+00:00", " UTC")
    load = meta.get("loadavg_before") or meta.get("loadavg")
    bits = [
        f"nous-actor benchmarks, {started}",
        f"{meta.get('cpu_count', '?')} CPUs",
        f"load {load[0]:.1f}" if load else None,
        f"Python {meta.get('python', '?')}",
        str(meta.get("platform", "")).split("-with-")[0] or None,
        f"commit {str(meta['git_commit'])[:8]}" if meta.get("git_commit") else None,
        "+ uncommitted library changes" if meta.get("library_dirty") else None,
    ]
    title = " · ".join(b for b in bits if b)
    if meta.get("quick"):
        title += "\n--quick run: reduced sizes, not the DESIGN.md §8 sizes"
    return title


def _empty(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}\nnot measured in this run", ha="center", va="center", fontsize=12)
    ax.set_xticks([])
    ax.set_yticks([])


def _panel_derive(ax: Any, doc: dict[str, Any]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    points = _derive_points(doc)
    if not points:
        _empty(ax, "(a) append + derive vs log size (core.append_derive)")
        return
    sizes = sorted({p["n"] for pts in points.values() for p in pts})
    handles: list[Any] = []
    for shape, pts in sorted(points.items()):
        label, color, marker = _SHAPES.get(shape, (shape, "k", "o"))
        xs = [p["n"] for p in pts]
        med = [p["append_derive_ns"]["median"] / 1e9 for p in pts]
        p99 = [p["append_derive_ns"]["p99"] / 1e9 for p in pts]
        refold = [p["refold_ns"]["median"] / 1e9 for p in pts]
        up = [q - m for q, m in zip(p99, med, strict=True)]
        handles.append(
            ax.errorbar(xs, med, yerr=[[0.0] * len(xs), up], marker=marker, color=color, lw=2.2,
                        ms=7, capsize=4, label=f"{label}: median, whisker to p99")
        )  # fmt: skip
        handles += ax.plot(xs, refold, marker=marker, color=color, lw=1, ls="--", ms=4,
                           alpha=0.5, label=f"{label[:3]} refold: one derive without the "
                           "incremental fold (materialize)")  # fmt: skip
        for x, y in zip(xs, med, strict=True):
            ax.annotate(
                _time_label(y),
                (x, y),
                textcoords="offset points",
                xytext=(0, -15) if shape == "a" else (-7, 7),
                ha="center" if shape == "a" else "right",
                fontsize=9,
                color=color,
                fontweight="bold",
            )
    handles.append(
        ax.axhline(
            DERIVE_GOAL_S,
            color=GOAL_COLOR,
            lw=1.5,
            ls="-.",
            label="goal (DESIGN.md §8): ≤ 1 ms at 100k events, flat as the log grows",
        )
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(sizes[0] / 3, sizes[-1] * 2)
    ymin, ymax = ax.get_ylim()
    ax.set_ylim(min(ymin, 1e-6), max(ymax, 1e-2))
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _count_label(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _time_label(y)))
    ax.set_xlabel("events in the log (log scale)")
    ax.set_ylabel("time per append + derive_messages() (log scale)")
    ax.set_title("(a) append + derive on a materialized log vs log size", fontsize=12, loc="left")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(handles=handles, fontsize=8.5, loc="upper center", bbox_to_anchor=(0.5, -0.12))


def _panel_rate(ax: Any, doc: dict[str, Any]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    points, source = _rate_points(doc)
    sweep = doc["benchmarks"].get("durable.sweep", {}).get("data", {}).get("sweep", {})
    threads = sweep.get("pipeline_threads", 4)  # the fallback: durable.appends uses 4 too
    if not points:
        _empty(ax, "(b) durable events/s vs sessions (durable.sweep)")
        return
    sessions = sorted({s for pts in points.values() for s, _ in pts})
    for name in [*_SWEEP_STYLE, *sorted(set(points) - set(_SWEEP_STYLE))]:
        if name not in points:
            continue
        label, color, marker, ls, lw = _SWEEP_STYLE.get(name, (name, "k", "o", "-", 1.0))
        label = label.format(threads=threads)
        pts = sorted(points[name])
        xs = [s * _DODGE.get(name, 1.0) for s, _ in pts]  # apart, so whiskers don't overlap
        med = [st["median"] for _, st in pts]
        lo = [st["median"] - st["min"] for _, st in pts]
        hi = [st["max"] - st["median"] for _, st in pts]
        ax.errorbar(xs, med, yerr=[lo, hi], color=color, marker=marker, ls=ls, lw=lw, ms=6,
                    capsize=3, label=label)  # fmt: skip
        if name == "ours full pipelined":
            for x, y in zip(xs, med, strict=True):
                ax.annotate(
                    _count_label(y),
                    (x, y),
                    textcoords="offset points",
                    xytext=(7, -13),
                    ha="left",
                    fontsize=9,
                    color=color,
                    fontweight="bold",
                )
    ax.axhline(
        RATE_GOAL,
        color=GOAL_COLOR,
        lw=1.5,
        ls="-.",
        label="goal (DESIGN.md §8): ≥ 20k events/s at 100 sessions x 100",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(sessions[0] / 1.6, sessions[-1] * 1.6)
    lowest = min(st["min"] for pts in points.values() for _, st in pts)
    ymax = ax.get_ylim()[1]
    ax.set_ylim(10 ** math.floor(math.log10(min(lowest, 1e3))), max(ymax * 1.5, 1e5))
    ax.xaxis.set_major_locator(FixedLocator(sessions))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _count_label(y)))
    ax.set_xlabel(f"sessions ({source}; log scale)")
    ax.set_ylabel("events/s acknowledged after commit (log scale)")
    ax.set_title(
        "(b) durable appends vs sessions: SQLite file, durability full",
        fontsize=12,
        loc="left",
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8.5, loc="upper center", bbox_to_anchor=(0.5, -0.12))


def plot(doc: dict[str, Any], png: Path) -> Path:
    """Draw both panels of ``doc`` (the JSON document) into ``png``; returns ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 7.4), layout="constrained")
    try:
        _panel_derive(left, doc)
        _panel_rate(right, doc)
        fig.suptitle(_title(doc.get("meta", {})), fontsize=11)
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=110)
    finally:
        plt.close(fig)
    return png


def plot_file(json_path: Path, png: Path) -> Path:
    """Plot the JSON file at ``json_path`` into ``png``."""
    return plot(json.loads(json_path.read_text(encoding="utf-8")), png)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.plot [JSON [PNG]]``: redraw the plot from a results file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 2 or any(a.startswith("-") for a in args):
        print("usage: python -m bench.plot [JSON [PNG]]", file=sys.stderr)
        return 2
    src = Path(args[0]) if args else DEFAULT_JSON
    dst = Path(args[1]) if len(args) > 1 else src.with_name("scaling.png")
    print(plot_file(src, dst))
    return 0


if __name__ == "__main__":
    sys.exit(main())
