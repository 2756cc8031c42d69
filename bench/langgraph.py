"""LangGraph's checkpointer: `NousCheckpointSaver` beside LangGraph's `SqliteSaver` and
`AsyncSqliteSaver`.

Every saver runs the same graph: a ``MessagesState`` graph with one plain-Python
node, about 200 characters in and 500 out per turn (one turn = one ``invoke``:
three checkpoints and their writes). Ours on a SQLite file (``durability="full"``),
LangGraph's on theirs (its defaults); timed side by side in one run, GC on.

* ``langgraph.storage``: the file size of one thread after 50, 100, 250 and 500
  turns (the WAL checkpointed into the file first).
* ``langgraph.throughput``: 100 threads x 20 turns from one asyncio loop
  (``ainvoke`` awaited turn after turn in a coroutine per thread), ours vs
  ``AsyncSqliteSaver``, LangGraph's ``InMemorySaver`` as the ceiling (LangGraph
  alone, nothing stored).
* ``langgraph.latest``: ``aget_tuple`` of the latest checkpoint of a 5-turn and a
  500-turn thread, ours (the saver that wrote the threads, as an app's long-lived
  checkpointer reads them; and a fresh saver's first read) and ``AsyncSqliteSaver``.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Final, TypeVar

from bench import harness as h

__all__ = ["BENCHMARKS", "main"]

T = TypeVar("T")

_VOCABULARY: Final = (
    "the of and to in is that for it as was with be by on not this are or from at which "
    "but have an they you were there been one all we their has would when if so no will "
    "more what up out can who some time said about into them than other then these two "
    "could like may first any now such only over new also most region quarter sales grew "
    "figures report customer order price market team plan week month year data model"
)
_WORDS: Final = tuple(_VOCABULARY.split())


def _text(rng: random.Random, size: int) -> str:
    """About ``size`` characters of words drawn at random (text that compresses as prose
    does, not a repeated sentence)."""
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, h.JOIN_TIMEOUT))


def _graph(saver: Any) -> Any:
    """The benchmark's graph: one node that answers (about 500 characters, new words each
    time), compiled with ``saver``."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    rng = random.Random(7)

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(_text(rng, 500))]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile(checkpointer=saver)


_SAYING = random.Random(3)


def _turn() -> dict[str, Any]:
    """One turn's input: about 200 characters of a user's words."""
    from langchain_core.messages import HumanMessage

    return {"messages": [HumanMessage(_text(_SAYING, 200))]}


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def _file_size(path: Path) -> int:
    """The size of a SQLite file once its WAL is checkpointed into it (the WAL kept
    empty), read through a connection of its own while the writer keeps it open."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        con.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


class _Ours:
    """A registry on a SQLite file (``durability="full"``) and a saver over it."""

    def __init__(self, path: Path) -> None:
        from nous_actor import Sessions, SQLiteStore
        from nous_actor.integrations.langgraph import NousCheckpointSaver

        self.path = path
        self.store = SQLiteStore(path, durability="full")
        self.sessions = Sessions(self.store, timeout=120)
        self.saver = NousCheckpointSaver(self.sessions)

    def fresh(self) -> Any:
        from nous_actor.integrations.langgraph import NousCheckpointSaver

        return NousCheckpointSaver(self.sessions)

    def close(self) -> None:
        self.sessions.close()
        self.store.close()

    async def aclose(self) -> None:
        await self.sessions.aclose()
        self.store.close()


def _turns(s: h.Stats) -> str:
    """A rate of turns: median [min-max] turns/s."""
    return f"{s.median:.0f} [{s.min:.0f}-{s.max:.0f}] turns/s"


def bench_storage(cfg: h.Config) -> h.Section:
    """The file size of one thread after 50/100/250/500 turns, ours vs SqliteSaver."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    sec = h.Section()
    marks = cfg.pick((50, 100, 250, 500), (10, 20, 50))
    ours_size: dict[int, int] = {}
    theirs_size: dict[int, int] = {}
    with h.scratch("langgraph-storage") as folder:
        h.progress(f"langgraph.storage: ours, {marks[-1]} turns")
        ours = _Ours(folder / "ours.db")
        try:
            app = _graph(ours.saver)
            for turn in range(1, marks[-1] + 1):
                app.invoke(_turn(), _config("long"))
                if turn in marks:
                    ours_size[turn] = _file_size(ours.path)
        finally:
            ours.close()
        h.progress(f"langgraph.storage: SqliteSaver, {marks[-1]} turns")
        path = folder / "sqlite-saver.db"
        with SqliteSaver.from_conn_string(str(path)) as saver:
            app = _graph(saver)
            for turn in range(1, marks[-1] + 1):
                app.invoke(_turn(), _config("long"))
                if turn in marks:
                    theirs_size[turn] = _file_size(path)
    for turn in marks:
        sec.rows.append(
            h.info_row(
                f"LangGraph thread after {turn} turns, file size",
                _mb(ours_size[turn]),
                f"SqliteSaver {_mb(theirs_size[turn])}",
                h.fmt_ratio(theirs_size[turn] / ours_size[turn]),
                ours_bytes=ours_size[turn],
                sqlite_saver_bytes=theirs_size[turn],
            )
        )
    last, mid = marks[-1], marks[-2]
    smaller = theirs_size[last] / ours_size[last]
    sec.rows.append(
        h.goal_row(
            "G33",
            f"LangGraph thread after {last} turns: SqliteSaver's size / ours",
            ours=_mb(ours_size[last]),
            baseline=f"SqliteSaver {_mb(theirs_size[last])}",
            ratio=h.fmt_ratio(smaller) + " smaller",
            value=smaller,
            sense=">=",
            target=100.0,
            goal=">= 100x smaller",
            numbers={"ours_bytes": ours_size[last], "sqlite_saver_bytes": theirs_size[last]},
        )
    )
    growth = ours_size[last] / ours_size[mid]
    sec.rows.append(
        h.goal_row(
            "G34",
            f"LangGraph thread, ours: size at {last} turns / size at {mid}",
            ours=h.fmt_ratio(growth),
            baseline=f"SqliteSaver {h.fmt_ratio(theirs_size[last] / theirs_size[mid])}",
            ratio=h.fmt_ratio(growth),
            value=growth,
            sense="<=",
            target=2.2,
            goal="<= 2.2x (linear)",
            numbers={
                "ours_growth": growth,
                "sqlite_saver_growth": theirs_size[last] / theirs_size[mid],
            },
        )
    )
    sec.notes.append(
        "langgraph.storage: one thread of a MessagesState graph with one plain node (about "
        "200 characters in, 500 out per turn; 3 checkpoints a turn), one invoke after the "
        "other; the file's size once its WAL is checkpointed into it, read at each mark. "
        "SqliteSaver stores every message in every checkpoint (quadratic); ours a "
        "checkpoint's changes since its parent, the messages list as its new tail."
    )
    return sec


async def _load(app: Any, threads: int, turns: int, prefix: str) -> int:
    """``threads`` coroutines, each awaiting ``turns`` ainvoke on its own thread; ns."""

    async def one(t: int) -> None:
        for _ in range(turns):
            await app.ainvoke(_turn(), _config(f"{prefix}-{t}"))

    start = time.perf_counter_ns()
    await asyncio.gather(*(one(t) for t in range(threads)))
    return time.perf_counter_ns() - start


def bench_throughput(cfg: h.Config) -> h.Section:
    """Turns/s of 100 threads x 20 turns from one loop, ours vs AsyncSqliteSaver."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    sec = h.Section()
    threads = cfg.pick(100, 10)
    turns = cfg.pick(20, 4)
    repeats = cfg.pick(3, 1)
    ours_t: list[int] = []
    theirs_t: list[int] = []
    memory_t: list[int] = []

    async def ours_run(folder: Path, k: int) -> None:
        ours = _Ours(folder / f"ours-{k}.db")
        try:
            ours_t.append(await _load(_graph(ours.saver), threads, turns, "o"))
        finally:
            await ours.aclose()

    async def theirs_run(folder: Path, k: int) -> None:
        async with AsyncSqliteSaver.from_conn_string(str(folder / f"theirs-{k}.db")) as saver:
            theirs_t.append(await _load(_graph(saver), threads, turns, "t"))

    async def memory_run() -> None:
        memory_t.append(await _load(_graph(InMemorySaver()), threads, turns, "m"))

    with h.scratch("langgraph-throughput") as folder:
        for k in range(repeats):
            h.progress(
                f"langgraph.throughput: {threads} threads x {turns} turns, "
                f"repeat {k + 1}/{repeats}"
            )
            order = (ours_run, theirs_run) if k % 2 == 0 else (theirs_run, ours_run)
            for body in order:
                _run(body(folder, k))
                h.settle()
            _run(memory_run())
            h.settle()
    total = threads * turns
    mine = h.Stats.of([total / (t / 1e9) for t in ours_t])
    base = h.Stats.of([total / (t / 1e9) for t in theirs_t])
    ceiling = h.Stats.of([total / (t / 1e9) for t in memory_t])
    q = h.ratios(theirs_t, ours_t)
    sec.rows.append(
        h.goal_row(
            "G35",
            f"LangGraph turns/s, {threads} threads x {turns} turns from one asyncio loop",
            ours=_turns(mine),
            baseline=f"AsyncSqliteSaver {_turns(base)}",
            ratio=h.fmt_ratio(q.median, q.min, q.max),
            value=q.median,
            sense=">=",
            target=5.0,
            goal=">= 5x AsyncSqliteSaver",
            numbers={
                "ours_per_s": mine.as_dict(),
                "async_sqlite_saver_per_s": base.as_dict(),
                "in_memory_saver_per_s": ceiling.as_dict(),
            },
        )
    )
    sec.rows.append(
        h.info_row(
            "LangGraph turns/s, the same load on InMemorySaver (LangGraph alone, nothing stored)",
            _turns(ceiling),
            f"ours {_turns(mine)}",
            h.fmt_ratio(ceiling.median / mine.median),
            in_memory_saver_per_s=ceiling.as_dict(),
        )
    )
    sec.rows.append(
        h.info_row(
            "the ceiling against G35's baseline: InMemorySaver's turns/s / AsyncSqliteSaver's "
            "(no saver can pass this ratio; G35 asks 5x)",
            f"InMemorySaver {_turns(ceiling)}",
            f"AsyncSqliteSaver {_turns(base)}",
            h.fmt_ratio(ceiling.median / base.median),
            ceiling_over_async_sqlite_saver=ceiling.median / base.median,
        )
    )
    sec.notes.append(
        f"langgraph.throughput: {threads} coroutines on one loop, each awaiting {turns} "
        "ainvoke of its own thread one after the other (each turn stores 3 checkpoints and "
        "2 writes; ours also opens and closes the run's turn). InMemorySaver shows what "
        "LangGraph itself costs on this machine: no saver can go faster than it. Median "
        f"[min-max] of {repeats} repeats, alternating order, GC on."
    )
    return sec


def bench_latest(cfg: h.Config) -> h.Section:
    """aget_tuple of the latest checkpoint, 5-turn vs 500-turn thread."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    sec = h.Section()
    short_turns, long_turns = 5, cfg.pick(500, 50)
    reads = cfg.pick(200, 20)
    names = ("warm", "cold", "theirs")
    times: dict[tuple[str, int], list[int]] = {(n, t): [] for n in names for t in (5, long_turns)}

    async def timed_read(saver: Any, thread: str) -> int:
        start = time.perf_counter_ns()
        got = await saver.aget_tuple(_config(thread))
        took = time.perf_counter_ns() - start
        assert got is not None
        return took

    async def body(folder: Path) -> None:
        ours = _Ours(folder / "ours.db")
        try:
            async with AsyncSqliteSaver.from_conn_string(str(folder / "theirs.db")) as theirs:
                for saver in (ours.saver, theirs):
                    app = _graph(saver)
                    for turns in (short_turns, long_turns):
                        h.progress(f"langgraph.latest: a {turns}-turn thread")
                        for _ in range(turns):
                            await app.ainvoke(_turn(), _config(f"t{turns}"))
                for _ in range(reads):
                    for turns in (short_turns, long_turns):
                        thread = f"t{turns}"
                        times["warm", turns].append(await timed_read(ours.saver, thread))
                        times["theirs", turns].append(await timed_read(theirs, thread))
                for _ in range(cfg.pick(10, 3)):
                    for turns in (short_turns, long_turns):
                        times["cold", turns].append(await timed_read(ours.fresh(), f"t{turns}"))
        finally:
            await ours.aclose()

    with h.scratch("langgraph-latest") as folder:
        _run(body(folder))
    stats = {k: h.Stats.of([float(x) for x in v]) for k, v in times.items()}
    for name, label in (
        ("warm", "ours, the saver that wrote it"),
        ("cold", "ours, a fresh saver's first read"),
        ("theirs", "AsyncSqliteSaver"),
    ):
        short, long = stats[name, short_turns], stats[name, long_turns]
        what = (
            f"LangGraph aget_tuple latest, {long_turns}-turn vs {short_turns}-turn thread, {label}"
        )
        if name == "warm":
            sec.rows.append(
                h.goal_row(
                    "G36",
                    what,
                    ours=f"{h.fmt_time(long.median)} vs {h.fmt_time(short.median)}",
                    baseline=f"AsyncSqliteSaver {h.fmt_time(stats['theirs', long_turns].median)}"
                    f" vs {h.fmt_time(stats['theirs', short_turns].median)}",
                    ratio=h.fmt_ratio(long.median / short.median),
                    value=long.median / short.median,
                    sense="<=",
                    target=2.0,
                    goal="<= 2x (long / short)",
                    numbers={"long_ns": long.as_dict(), "short_ns": short.as_dict()},
                )
            )
        else:
            sec.rows.append(
                h.info_row(
                    what,
                    f"{h.fmt_time(long.median)} vs {h.fmt_time(short.median)}",
                    "-",
                    h.fmt_ratio(long.median / short.median),
                    long_ns=long.as_dict(),
                    short_ns=short.as_dict(),
                )
            )
    sec.notes.append(
        f"langgraph.latest: threads of {short_turns} and {long_turns} turns written through "
        "ainvoke, then the latest checkpoint read with aget_tuple, alternating, median of "
        f"{reads} reads (a fresh saver: of {cfg.pick(10, 3)}). Ours keeps each thread's fold "
        "and its latest checkpoint's state; a fresh saver folds the thread's log once."
    )
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark(
        "langgraph.storage",
        "LangGraph: file size of one thread after 50/100/250/500 turns, vs SqliteSaver",
        bench_storage,
    ),
    h.Benchmark(
        "langgraph.throughput",
        "LangGraph: turns/s of 100 threads x 20 turns from one loop, vs AsyncSqliteSaver",
        bench_throughput,
    ),
    h.Benchmark(
        "langgraph.latest",
        "LangGraph: aget_tuple of the latest checkpoint, 5 vs 500 turns, vs AsyncSqliteSaver",
        bench_latest,
    ),
)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.langgraph [--quick]``: run this module alone and print its rows."""
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    sys.exit(main())
