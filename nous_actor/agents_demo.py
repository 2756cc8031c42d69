"""The main job of ``make demo``: supervised agent sessions on an embedded SQLite file.

N agents talk concurrently, each in its own session under one
:class:`~nous_actor.Sessions` registry: user and assistant turns with tool
calls and tool results from a deterministic fake model (no network), some
tool results oversized. A :class:`~nous_actor.Compactor` with a deterministic
summariser keeps every surface under budget. Crashes are injected at random
(a ``BaseException`` inside the session's actor); the registry restarts the
session from the store and the agent carries on through the same handle.

At the end it prints a summary table and checks, against the SQLite file,
that every acknowledged event is there, intact.
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from nous_actor.compaction import Compactor
from nous_actor.errors import SessionCrashed, SessionStopped
from nous_actor.event import Event
from nous_actor.faults import crash
from nous_actor.future import SessionFuture
from nous_actor.message import Message
from nous_actor.registry import Sessions
from nous_actor.session import Session
from nous_actor.store.sqlite import SQLiteStore
from nous_actor.supervision import Backoff

__all__ = ["DemoReport", "run_demo"]

TOPICS = ["flaky test", "slow query", "memory leak", "broken build", "race condition", "timeout"]
TOOLS = ["grep", "run_tests", "read_file", "profile"]


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def summarise(messages: Sequence[Message]) -> str:
    """A deterministic summariser: what was asked, which tools ran, how it ended."""
    asked = [m.content for m in messages if m.role == "user" and isinstance(m.content, str)]
    tools = sorted({c.get("name", "?") for m in messages for c in m.tool_calls})
    earlier = [m for m in messages if m.role == "system"]
    head = f"(includes {len(earlier)} earlier summaries) " if earlier else ""
    return (
        f"{head}Summary of {len(messages)} messages: the user asked about "
        f"{'; '.join(str(a)[:40] for a in asked[-3:]) or 'nothing'}; tools used: "
        f"{', '.join(tools) or 'none'}."
    )


@dataclass
class _Agent:
    index: int
    session_id: str
    turns_done: int = 0
    events: int = 0
    compactions: int = 0
    crashes: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    acked: list[tuple[int, str, str]] = field(default_factory=list)  # seq, type, digest
    error: BaseException | None = None


@dataclass
class DemoReport:
    """What a demo run did and what it verified."""

    agents: int
    turns: int
    events: int
    compactions: int
    crashes: int
    restarts: int
    retries: int
    seconds: float
    p50_ms: float
    p99_ms: float
    verified: int
    missing: list[str]
    sessions_in_store: int
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.missing and not self.errors and self.verified == self.events

    @property
    def events_per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0


def _acked(agent: _Agent, make: Any, attempts: int = 20) -> Event:
    """Append (retrying a call a crash answered), record latency and the acknowledged event."""
    for _ in range(attempts):
        t0 = time.perf_counter()
        fut: SessionFuture[Event] = make()
        try:
            ev = fut.get()
        except SessionStopped:  # the session crashed under this call: it was not applied
            agent.retries += 1
            continue
        agent.latencies.append(time.perf_counter() - t0)
        agent.acked.append((ev.seq, ev.type.value, _digest(ev.data)))
        agent.events += 1
        return ev
    raise RuntimeError(f"{agent.session_id}: gave up after {attempts} attempts")


def _agent_main(
    agent: _Agent,
    handle: Session,
    turns: int,
    crash_rate: float,
    seed: int,
    compactor: Compactor,
) -> None:
    rng = random.Random(seed * 1000 + agent.index)
    try:
        if handle.count().get() == 0:
            _acked(
                agent,
                lambda: handle.append(
                    "system_message", {"content": f"You are agent {agent.index}, a debugger."}
                ),
            )
        for turn in range(turns):
            topic = rng.choice(TOPICS)
            tool = rng.choice(TOOLS)
            call_id = f"call-{agent.index}-{turn}"
            big = rng.random() < 0.3
            output = (
                "\n".join(f"{tool}: line {i} about the {topic}" for i in range(400))
                if big
                else f"{tool}: 3 matches for the {topic}"
            )
            steps: list[tuple[str, dict[str, Any]]] = [
                ("turn_start", {"turn": turn}),
                ("user_message", {"content": f"Turn {turn}: please look into the {topic}."}),
                (
                    "assistant_message",
                    {
                        "content": None,
                        "tool_calls": [
                            {"id": call_id, "name": tool, "arguments": json.dumps({"q": topic})}
                        ],
                    },
                ),
                ("tool_result", {"content": output, "tool_call_id": call_id, "name": tool}),
                (
                    "assistant_message",
                    {"content": f"The {topic} comes from step {rng.randint(1, 9)}; fixed."},
                ),
                ("turn_end", {"turn": turn}),
            ]
            for etype, data in steps:
                if rng.random() < crash_rate:
                    try:
                        crash(handle).get()
                    except SessionCrashed:
                        agent.crashes += 1
                    except SessionStopped:  # it was down already; the next call reopens it
                        pass
                _acked(agent, lambda etype=etype, data=data: handle.append(etype, data))
            if turn % 4 == 3:
                result = handle.compact(compactor).get()
                agent.compactions += int(result.changed)
            agent.turns_done = turn + 1
    except BaseException as exc:  # reported in the summary, never swallowed
        agent.error = exc


def _bar(done: int, total: int, extra: str, width: int = 30) -> str:
    filled = width * done // max(total, 1)
    pct = 100 * done // max(total, 1)
    return f"\r  [{'#' * filled}{'.' * (width - filled)}] {pct:3d}% {done}/{total} turns  {extra}"


def run_demo(
    db: str | Path,
    *,
    agents: int = 4,
    turns: int = 12,
    crash_rate: float = 0.02,
    seed: int = 7,
    progress: TextIO | None = sys.stderr,
) -> DemoReport:
    """Run the supervised multi-agent demo on the SQLite file ``db`` and verify it.

    Raises:
        ValueError: a bad count or rate.
    """
    if agents < 1 or turns < 1 or not 0 <= crash_rate < 1:
        raise ValueError("agents and turns must be >= 1 and 0 <= crash_rate < 1")
    store = SQLiteStore(db)
    compactor = Compactor(budget=600, keep_recent=6, prune_over=200, summarise=summarise)
    crew = [_Agent(i, f"agent-{i}") for i in range(agents)]
    started = time.perf_counter()
    with Sessions(store, backoff=Backoff(0.001, 0.05, 0.1), max_restarts=1000) as registry:
        handles = [registry.open(a.session_id) for a in crew]
        threads = [
            threading.Thread(
                target=_agent_main,
                args=(a, h, turns, crash_rate, seed, compactor),
                name=f"agent-{a.index}",
            )
            for a, h in zip(crew, handles, strict=True)
        ]
        for t in threads:
            t.start()
        finished = threading.Event()
        while not finished.is_set():
            alive = [t for t in threads if t.is_alive()]
            if progress is not None:
                done = sum(a.turns_done for a in crew)
                crashes = sum(a.crashes for a in crew)
                events = sum(a.events for a in crew)
                progress.write(_bar(done, agents * turns, f"{events} events, {crashes} crashes"))
                progress.flush()
            if not alive:
                finished.set()
            else:
                alive[0].join(0.1)
        if progress is not None:
            progress.write("\n")
        seconds = time.perf_counter() - started
        restarts = sum(registry.restart_count(a.session_id) for a in crew)
    missing: list[str] = []
    verified = 0
    for a in crew:
        stored = {ev.seq: ev for ev in store.load(a.session_id)}
        for seq, etype, digest in a.acked:
            ev = stored.get(seq)
            if ev is None or ev.type.value != etype or _digest(ev.data) != digest:
                missing.append(f"{a.session_id}#{seq}")
            else:
                verified += 1
    sessions_in_store = len(store.sessions())
    store.close()
    latencies = sorted(x for a in crew for x in a.latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    return DemoReport(
        agents=agents,
        turns=turns,
        events=sum(a.events for a in crew),
        compactions=sum(a.compactions for a in crew),
        crashes=sum(a.crashes for a in crew),
        restarts=restarts,
        retries=sum(a.retries for a in crew),
        seconds=seconds,
        p50_ms=1000 * statistics.median(latencies) if latencies else 0.0,
        p99_ms=1000 * p99,
        verified=verified,
        missing=missing,
        sessions_in_store=sessions_in_store,
        errors=[f"{a.session_id}: {type(a.error).__name__}: {a.error}" for a in crew if a.error],
    )


def format_report(r: DemoReport, db: str | Path) -> str:
    """The summary table a person reads at the end of the demo."""
    rows = [
        ("agents x turns", f"{r.agents} x {r.turns}"),
        ("events acknowledged", f"{r.events}"),
        ("compactions", f"{r.compactions}"),
        ("crashes injected", f"{r.crashes}"),
        ("restarts (from the store)", f"{r.restarts}"),
        ("calls retried after a crash", f"{r.retries}"),
        ("events/s", f"{r.events_per_second:,.0f}"),
        ("append latency p50 / p99", f"{r.p50_ms:.2f} ms / {r.p99_ms:.2f} ms"),
        ("sessions in the store", f"{r.sessions_in_store}"),
        (
            "acknowledged events in the store",
            f"{r.verified}/{r.events}" + (" all present" if not r.missing else " MISSING"),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"Supervised agents on {db}", "-" * (width + 24)]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    for err in r.errors:
        lines.append(f"  error: {err}")
    if r.missing:
        lines.append(f"  missing: {', '.join(r.missing[:10])}")
    lines.append("OK: nothing acknowledged was lost." if r.ok else "FAILED: see above.")
    return "\n".join(lines)
