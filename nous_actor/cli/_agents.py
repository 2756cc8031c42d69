"""The demo's agents at work: each in its own session, user and assistant turns with tool
calls from a deterministic fake model, appends one by one or pipelined, crashes injected
at random and calls sent again after them, a compaction every few turns; then every
acknowledged event checked against the store, and the report (`DemoReport`,
`format_report`)."""

from __future__ import annotations

import hashlib
import json
import random
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from nous_actor.core.compaction import Compactor
from nous_actor.core.event import Event
from nous_actor.core.message import Message
from nous_actor.errors import SessionCrashed, SessionStopped
from nous_actor.sessions.faults import crash, crash_amid
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import Store
from nous_actor.supervision import Backoff

__all__ = ["DemoReport", "format_report", "summarise"]

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
    crashes_in_flight: int = 0  # crashes with this agent's appends queued or committing
    acked_after_crash: int = 0  # appends acknowledged after their session had crashed
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
    crashes_in_flight: int
    acked_after_crash: int
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


def _record(agent: _Agent, ev: Event, t0: float) -> None:
    agent.latencies.append(time.perf_counter() - t0)
    agent.acked.append((ev.seq, ev.type.value, _digest(ev.data)))
    agent.events += 1


def _acked(agent: _Agent, make: Callable[[], SessionFuture[Event]], attempts: int = 20) -> Event:
    """Append (retrying a call a crash answered), record latency and the acknowledged event."""
    for _ in range(attempts):
        t0 = time.perf_counter()
        fut = make()
        try:
            ev = fut.get()
        except SessionCrashed:  # this call crashed it: whether it was applied is unknown
            raise
        except SessionStopped:  # the session crashed under this call: it was not applied
            agent.retries += 1
            continue
        _record(agent, ev, t0)
        return ev
    raise RuntimeError(f"{agent.session_id}: gave up after {attempts} attempts")


Step = tuple[str, dict[str, Any]]


def _one_by_one(
    agent: _Agent, handle: Session, steps: Sequence[Step], crash_rate: float, rng: random.Random
) -> None:
    """Append each step and wait for it; a crash may come before any of them."""
    for etype, data in steps:
        if rng.random() < crash_rate:
            try:
                crash(handle).get()
            except SessionCrashed:
                agent.crashes += 1
            except SessionStopped:  # it was down already; the next call reopens it
                pass
        _acked(agent, partial(handle.append, etype, data))


def _send(etype: str, data: dict[str, Any], session: Session) -> SessionFuture[Event]:
    return session.append(etype, data)


def _pipelined(
    agent: _Agent, handle: Session, steps: Sequence[Step], crash_rate: float, rng: random.Random
) -> None:
    """Send every step at once; a crash may land amid them, while earlier ones commit.

    The appends before the crash are acknowledged (the store is the truth); the
    registry holds the ones after it and delivers them, in order, to the restarted
    session. One refused with ``SessionStopped`` (a crash storm outlasting the
    handle's bound) would be sent again here, in order, with every one after it.
    """
    t0 = time.perf_counter()
    at = next((k for k in range(len(steps)) if rng.random() < crash_rate), None)
    calls = [partial(_send, etype, data) for etype, data in steps]
    if at is None:
        futures = [call(handle) for call in calls]
    else:
        futures, crashed = crash_amid(handle, calls, at)
        try:
            crashed.get()
        except SessionCrashed:
            agent.crashes += 1
            pending = sum(not f.done() for f in futures[:at])
            agent.crashes_in_flight += int(pending > 0)
            agent.acked_after_crash += pending
        except SessionStopped:  # it was down already
            pass
    refused = None
    for k, fut in enumerate(futures):
        try:
            ev = fut.get()
        except SessionCrashed:
            raise
        except SessionStopped:
            refused = k if refused is None else refused
            continue
        if refused is not None:
            raise RuntimeError(
                f"{agent.session_id}: pipelined append {k} was applied after append "
                f"{refused} was refused: the order broke"
            )
        _record(agent, ev, t0)
    for etype, data in steps[len(futures) if refused is None else refused :]:
        agent.retries += 1
        _acked(agent, partial(handle.append, etype, data))


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
            steps: list[Step] = [
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
            # Half the turns are recorded as a model's reply usually is: all at once.
            record = _pipelined if rng.random() < 0.5 else _one_by_one
            record(agent, handle, steps, crash_rate, rng)
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


def _check_counts(agents: int, turns: int, crash_rate: float) -> None:
    if agents < 1 or turns < 1 or not 0 <= crash_rate < 1:
        raise ValueError("agents and turns must be >= 1 and 0 <= crash_rate < 1")


def _run(
    store: Store,
    agents: int,
    turns: int,
    crash_rate: float,
    seed: int,
    progress: TextIO | None,
) -> DemoReport:
    """The demo on ``store``: agents, crashes, restarts, then every acknowledgement checked."""
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
        try:
            while not finished.is_set():
                alive = [t for t in threads if t.is_alive()]
                if progress is not None:
                    done = sum(a.turns_done for a in crew)
                    crashes = sum(a.crashes for a in crew)
                    events = sum(a.events for a in crew)
                    progress.write(
                        _bar(done, agents * turns, f"{events} events, {crashes} crashes")
                    )
                    progress.flush()
                if not alive:
                    finished.set()
                else:
                    alive[0].join(0.1)
        finally:  # (Ctrl-C too: what is said next starts on a line of its own)
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
    latencies = sorted(x for a in crew for x in a.latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    return DemoReport(
        agents=agents,
        turns=turns,
        events=sum(a.events for a in crew),
        compactions=sum(a.compactions for a in crew),
        crashes=sum(a.crashes for a in crew),
        crashes_in_flight=sum(a.crashes_in_flight for a in crew),
        acked_after_crash=sum(a.acked_after_crash for a in crew),
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
        ("  with appends in flight", f"{r.crashes_in_flight}"),
        ("restarts (from the store)", f"{r.restarts}"),
        ("acknowledged after the crash", f"{r.acked_after_crash}"),
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
