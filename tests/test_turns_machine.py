"""Turn policies as a stateful test: runs (threads and coroutines) against a plain model.

Each run writes messages tagged with its id through its turn, and compacts
through it (a summary of what it wrote). The machine opens turns with every
policy, queues turns as coroutines, writes through the plain handle while a
turn is open, closes, lets a holder vanish (its lease runs out) and restarts
the session; the model says what the surface must show. Invariants: the
surface equals the model's, no two runs interleave on it, a rollback keeps
every event (and hides the run's compactions with the run) and audit
explains it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from bounds import BOUND
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nous_actor import (
    Compactor,
    MemoryStore,
    Sessions,
    SessionStopped,
    Turn,
    TurnBusy,
    TurnInterrupted,
)
from nous_actor.core.history import explain, turns
from nous_actor.sessions.turns import DEFAULT_ROLLBACK_NOTE

_ids = itertools.count()


@dataclass
class Run:
    rid: int
    turn: Turn
    how: str | None = None  # None while open (or queued); then how its turn ended
    by: int | None = None  # the run that interrupted or rolled it back
    written: list[str] = field(default_factory=list)
    shown: int = 0  # how many surface entries it has (a summary of its own stands for some)


class TurnMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store = MemoryStore()
        self.reg = Sessions(self.store, timeout=BOUND)
        self.sid = f"turns-{next(_ids)}"
        self.handle = self.reg.open(self.sid)
        self.runs: dict[int, Run] = {}
        self.open_run: int | None = None
        # Calls waiting for the open turn, in arrival order: a queued turn (its
        # run and its opening task) or a plain write (its content and future).
        self.waiting: deque[tuple[str, Any, Any]] = deque()
        self.surface: list[str] = []  # the model of the surface's contents
        self.plain = itertools.count()

    # -- helpers ---------------------------------------------------------------------------

    def _new_run(self, policy: str, **kw: Any) -> Run:
        rid = len(self.runs)
        run = Run(rid, self.handle.turn(policy=policy, owner=f"run-{rid}", **kw))  # type: ignore[arg-type]
        self.runs[rid] = run
        return run

    def _step_loop(self) -> None:
        """Let every ready task run to its next await (no time passes)."""
        self.loop.run_until_complete(asyncio.sleep(0))

    def _ended(self, rid: int, how: str, by: int | None = None) -> None:
        run = self.runs[rid]
        run.how, run.by = how, by
        if how == "rolled_back":  # its messages are the surface's tail: one note instead
            del self.surface[len(self.surface) - run.shown :]
            self.surface.append(DEFAULT_ROLLBACK_NOTE)

    def _drain(self) -> None:
        """The open turn ended: waiting writes apply in order, the first queued turn opens."""
        while self.waiting and self.open_run is None:
            kind, what, waiter = self.waiting.popleft()
            if kind == "write":
                waiter.get(timeout=BOUND)
                self.surface.append(what)
            else:
                self.loop.run_until_complete(asyncio.wait_for(waiter, BOUND))
                self.open_run = what

    # -- rules -----------------------------------------------------------------------------

    @rule(policy=st.sampled_from(["reject", "enqueue", "interrupt", "rollback"]))
    def open_turn(self, policy: str) -> None:
        run = self._new_run(policy)
        cur = self.open_run
        if cur is None:
            run.turn.open()
            self.open_run = run.rid
        elif policy == "reject":
            try:
                run.turn.open()
            except TurnBusy as exc:
                assert exc.holder == f"run-{cur}"
                run.how = "refused"
            else:
                raise AssertionError("reject opened a turn while another was open")
        elif policy == "enqueue":
            task = self.loop.create_task(run.turn.aopen())
            self._step_loop()  # its open is sent: it queues behind every earlier waiter
            assert not task.done()
            self.waiting.append(("turn", run.rid, task))
        else:
            run.turn.open()
            self._ended(cur, "interrupted" if policy == "interrupt" else "rolled_back", run.rid)
            self.open_run = run.rid

    @precondition(lambda self: self.open_run is not None)
    @rule(via=st.sampled_from(["get", "await", "thread"]), many=st.booleans())
    def write_through_turn(self, via: str, many: bool) -> None:
        assert self.open_run is not None
        run = self.runs[self.open_run]
        k = len(run.written)
        texts = [f"r{run.rid}.{k}", f"r{run.rid}.{k + 1}"] if many else [f"r{run.rid}.{k}"]
        if many:
            fut = run.turn.append_many([("assistant_message", {"content": t}) for t in texts])
        else:
            fut = run.turn.append("assistant_message", {"content": texts[0]})
        if via == "get":
            fut.get()
        elif via == "await":

            async def wait() -> Any:
                return await fut

            self.loop.run_until_complete(wait())
        else:
            t = threading.Thread(target=fut.get)
            t.start()
            t.join(BOUND)
            assert fut.done()
            fut.get(timeout=0)
        run.written += texts
        run.shown += len(texts)
        self.surface += texts

    @precondition(lambda self: self.open_run is not None)
    @rule()
    def compact_through_turn(self) -> None:
        """A compaction through the open turn summarises what the turn wrote but its newest
        message; what came before the turn stays as it was."""
        assert self.open_run is not None
        run = self.runs[self.open_run]
        summary = f"r{run.rid}.s"  # (no longer than a message it replaces)
        squeeze = Compactor(budget=0, keep_recent=1, summarise=lambda ms: summary)
        result = run.turn.compact(squeeze, force=True).get()
        mine = self.surface[len(self.surface) - run.shown :]
        lone_summary = run.shown == 2 and mine[0] == summary
        assert result.changed == (run.shown >= 2 and not lone_summary)
        if result.changed:
            self.surface[len(self.surface) - run.shown :] = [summary, mine[-1]]
            run.shown = 2

    @precondition(
        lambda self: any(
            r.how in ("interrupted", "rolled_back", "expired", "restart")
            for r in self.runs.values()
        )
    )
    @rule(data=st.data())
    def write_through_ended_turn(self, data: st.DataObject) -> None:
        stale = [
            r
            for r in self.runs.values()
            if r.how in ("interrupted", "rolled_back", "expired", "restart")
        ]
        run = data.draw(st.sampled_from(stale))
        try:
            run.turn.append("assistant_message", {"content": "never"}).get()
        except TurnInterrupted as exc:
            assert exc.turn_id == run.turn.turn_id
        else:
            raise AssertionError(f"a call through ended turn {run.rid} was applied")

    @rule()
    def plain_write(self) -> None:
        text = f"p{next(self.plain)}"
        fut = self.handle.append("user_message", {"content": text})
        if self.open_run is None:
            fut.get()
            self.surface.append(text)
            return
        self.handle.count().get()  # a read: handled after the write arrived, never waits
        assert not fut.done(), "a plain write ran while a turn was open"
        self.waiting.append(("write", text, fut))

    @precondition(lambda self: self.open_run is not None)
    @rule(via=st.sampled_from(["sync", "async"]))
    def close_turn(self, via: str) -> None:
        assert self.open_run is not None
        run = self.runs[self.open_run]
        if via == "sync":
            run.turn.close()
        else:
            self.loop.run_until_complete(run.turn.aclose())
        self._ended(run.rid, "closed")
        self.open_run = None
        self._drain()

    @precondition(lambda self: self.open_run is None and not self.waiting)
    @rule()
    def holder_vanishes(self) -> None:
        gone = self._new_run("enqueue", lease=0.05)
        gone.turn.open()
        nxt = self._new_run("enqueue")
        nxt.turn.open()  # waits for the lease to run out
        self._ended(gone.rid, "expired")
        self.open_run = nxt.rid

    @rule()
    def restart(self) -> None:
        self.handle.stop()
        while self.waiting:
            kind, _, waiter = self.waiting.popleft()
            try:
                if kind == "write":
                    waiter.get(timeout=BOUND)
                else:
                    self.loop.run_until_complete(asyncio.wait_for(waiter, BOUND))
            except SessionStopped:
                pass
            else:
                raise AssertionError("a call waiting for a turn was applied after a stop")
        if self.open_run is not None:
            self._ended(self.open_run, "restart")
            self.open_run = None
        self.handle.count().get()  # reopens it

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def surface_is_the_models(self) -> None:
        got = [m.content for m in self.handle.derive_messages().get()]
        assert got == self.surface

    @invariant()
    def no_two_runs_interleave(self) -> None:
        tags = [
            str(m.content).split(".")[0]
            for m in self.handle.derive_messages().get()
            if str(m.content).startswith("r")
        ]
        blocks = [tag for tag, _ in itertools.groupby(tags)]
        assert len(blocks) == len(set(blocks)), f"runs interleave on the surface: {tags}"

    @invariant()
    def history_and_audit_explain_every_turn(self) -> None:
        log = self.handle.log().get()
        kept = {ev.data.get("content") for ev in log.events()}
        recs = {r["owner"]: r for r in turns(log)}
        ids = {run.turn.turn_id: rid for rid, run in self.runs.items()}
        for run in self.runs.values():
            assert set(run.written) <= kept  # nothing acknowledged is ever lost
            rec = recs.get(f"run-{run.rid}")
            if run.how in (None, "refused"):
                assert rec is None or rec["how"] is None
                continue
            assert rec is not None
            if run.how == "restart":
                assert (rec["how"], rec["reason"]) == ("interrupted", "restart")
                continue
            assert rec["how"] == run.how
            if run.by is not None:
                assert ids[rec["by"]] == run.by
            if run.how == "rolled_back":
                hidden = explain(log, rec["note_seq"])["replaces"]
                assert hidden == list(range(rec["start_seq"], rec["end_seq"] + 1))

    def teardown(self) -> None:
        for _, _, waiter in self.waiting:
            if isinstance(waiter, asyncio.Task):
                waiter.cancel()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()
        self.reg.close()


TestTurnMachine = TurnMachine.TestCase
TestTurnMachine.settings = settings(
    settings.default, stateful_step_count=20, max_examples=min(settings.default.max_examples, 40)
)
