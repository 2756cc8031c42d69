"""Compaction inside an open turn (DESIGN.md §3, §11): what it may replace, and what a
snapshot, a restart, a rollback and an interrupted holder see afterwards.

A compaction made while a turn is open replaces only what that turn wrote
(positions after its ``turn_start``): the ``turn_start`` is never shadowed, so a
snapshot never drops it and a restart after a crash still finds the turn open and
ends it; a rollback's one replace over the turn's range hides the compaction
with the rest of the run, leaving what came before the turn as it was.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest
from bounds import BOUND, SLOW_BOUND, end_child
from hypothesis import given
from hypothesis import strategies as st

from nous_actor import (
    Compactor,
    Log,
    MemoryStore,
    Message,
    Session,
    Sessions,
    SQLiteStore,
    StoreError,
    TurnBusy,
    TurnInterrupted,
)
from nous_actor.core.history import turns
from nous_actor.runtime import scheduling
from nous_actor.sessions.turns import (
    DEFAULT_ROLLBACK_NOTE,
    INTERRUPTED_TOOL_RESULT,
    TurnRequest,
    TurnTable,
)

CALL: Final = {"content": None, "tool_calls": [{"id": "c1", "name": "weather", "arguments": "{}"}]}
LONG: Final = "thinking " * 60


def squeeze(keep_recent: int = 1, snapshot: bool = False) -> Compactor:
    """A compactor that always has something to do (budget 1)."""
    return Compactor(
        budget=1, keep_recent=keep_recent, summarise=lambda ms: "SUMMARY", snapshot=snapshot
    )


def contents(s: Session) -> list[object]:
    return [m.content for m in s.derive_messages().get(timeout=BOUND)]


def unanswered(messages: Sequence[Message]) -> list[str]:
    """Ids of the assistant tool calls that no later tool message answers."""
    open_calls: dict[str, None] = {}
    for m in messages:
        for call in m.tool_calls if m.role.value == "assistant" else ():
            open_calls[str(call["id"])] = None
        if m.role.value == "tool":
            open_calls.pop(str(m.tool_call_id), None)
    return list(open_calls)


def before_the_run(s: Any) -> None:
    for role, text in [("system", "be brief"), ("user", "q0"), ("assistant", "a0 " * 40)]:
        s.append(f"{role}_message", {"content": text}).get(timeout=BOUND)


# -- what a compaction inside a turn replaces -----------------------------------------------


def test_a_compaction_through_a_turn_replaces_only_what_the_turn_wrote() -> None:
    """Through an open turn, the summary covers the turn's own messages (from just after
    its ``turn_start``); what came before the turn stays on the surface as it was."""
    s = Session.start("own", timeout=BOUND)
    try:
        before_the_run(s)
        with s.turn(owner="run") as turn:
            turn.append("user_message", {"content": "q1"}).get(timeout=BOUND)
            turn.append("assistant_message", {"content": LONG}).get(timeout=BOUND)
            turn.append("assistant_message", {"content": "a1"}).get(timeout=BOUND)
            result = turn.compact(squeeze()).get(timeout=BOUND)
            assert result.summarised == (turn.start_seq + 1, turn.start_seq + 2)
        assert contents(s) == ["be brief", "q0", "a0 " * 40, "SUMMARY", "a1"]
    finally:
        s.stop()


def test_an_open_tool_call_of_the_turn_is_never_summarised() -> None:
    """A tool call the open turn made and has not answered yet stays on the surface
    (with ``keep_recent=0`` too): the result that comes next answers it."""
    s = Session.start("call", timeout=BOUND)
    try:
        with s.turn(owner="run") as turn:
            turn.append("user_message", {"content": LONG}).get(timeout=BOUND)
            turn.append("assistant_message", CALL).get(timeout=BOUND)
            turn.append("user_message", {"content": LONG}).get(timeout=BOUND)
            turn.compact(squeeze(keep_recent=0)).get(timeout=BOUND)
            result = {"content": "-3 C", "tool_call_id": "c1", "name": "weather"}
            turn.append("tool_result", result).get(timeout=BOUND)
        messages = s.derive_messages().get(timeout=BOUND)
        assert [m.content for m in messages] == ["SUMMARY", None, LONG, "-3 C"]
        assert unanswered(messages) == []
    finally:
        s.stop()


def test_a_compaction_between_turns_still_summarises_the_earlier_turns() -> None:
    """Through the plain handle (no turn open) a compaction summarises across turns, as
    before: the fence is only the open turn's start."""
    s = Session.start("between", timeout=BOUND)
    try:
        before_the_run(s)
        with s.turn(owner="run") as turn:
            turn.append("user_message", {"content": "q1"}).get(timeout=BOUND)
            turn.append("assistant_message", {"content": "a1"}).get(timeout=BOUND)
        s.compact(squeeze()).get(timeout=BOUND)
        assert contents(s) == ["be brief", "SUMMARY", "a1"]
    finally:
        s.stop()


@given(
    st.lists(st.sampled_from(["user", "assistant", "call", "result", "tool"]), max_size=12),
    st.lists(st.sampled_from(["user", "assistant", "call", "result", "tool"]), max_size=12),
    st.integers(0, 4),
    st.booleans(),
)
def test_a_snapshot_after_a_compaction_in_a_turn_keeps_the_turn_start(
    before: list[str], inside: list[str], keep: int, prune: bool
) -> None:
    """Whatever stands before and inside the open turn, the plan made with its start
    replaces nothing at or before it: after the compaction and a snapshot the
    ``turn_start`` is still there, and what stood before the turn is unchanged."""
    log = Log()
    calls = 0

    def add(log: Log, kind: str) -> Log:
        nonlocal calls
        if kind == "call":
            calls += 1
            made = [{"id": f"c{calls}", "name": "f", "arguments": "{}"}]
            return log.append("assistant_message", {"content": None, "tool_calls": made})
        if kind == "result":
            return log.append("tool_result", {"content": LONG, "tool_call_id": f"c{calls}"})
        if kind == "tool":  # a result that answers no call of this log
            return log.append("tool_result", {"content": LONG, "tool_call_id": "other"})
        return log.append(f"{kind}_message", {"content": LONG})

    for kind in before:
        log = add(log, kind)
    start = log.count()
    log = log.append("turn_start", {"turn_id": "t", "owner": "o", "policy": "enqueue"})
    outside = log.derive_messages()
    for kind in inside:
        log = add(log, kind)
    c = Compactor(budget=1, keep_recent=keep, prune_over=0 if prune else None, summarise=str)
    plan = c.plan(log.surface(), log.count(), force=True, turn_start=start)
    assert all(lo > start for lo, _ in plan.ranges)
    if plan.empty:
        return
    summary = "S" if plan.needs_summary else None
    after = c.apply(log, plan, summary).log.snapshot()
    assert [e.seq for e in after.events() if e.type.value == "turn_start"] == [start]
    assert after.derive_messages()[: len(outside)] == outside


# -- after a crash, the restart ends the turn ----------------------------------------------

_RUNNER = """
import json, sys
from nous_actor import Compactor, Sessions, SQLiteStore
with Sessions(SQLiteStore(sys.argv[1])) as reg:
    s = reg.open("run")
    s.append("user_message", {"content": "before the run"}).get()
    with s.turn(owner="runner") as turn:
        turn.append("user_message", {"content": "weather?"}).get()
        turn.append("assistant_message", {"content": "thinking " * 60}).get()
        turn.append("assistant_message", json.loads(sys.argv[2])).get()
        squeeze = Compactor(budget=1, keep_recent=0, summarise=lambda ms: "SUMMARY")
        turn.compact(squeeze).get()
        turn.snapshot().get()
        print("mid-turn", flush=True)
        sys.stdin.readline()  # killed here, the turn open, its tool call without a result
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_a_turn_compacted_and_snapshotted_then_killed_is_ended_by_the_restart(
    tmp_path: Path,
) -> None:
    """A process that compacts and snapshots inside its turn and is killed with SIGKILL
    leaves the turn's ``turn_start`` in the store: the next registry ends the turn as
    interrupted (reason restart) and answers its open tool call, so the surface is a
    request a provider takes."""
    path = tmp_path / "app.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(path), json.dumps(CALL)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "mid-turn\n"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=SLOW_BOUND) == -signal.SIGKILL
    finally:
        end_child(child, SLOW_BOUND)
    with Sessions(SQLiteStore(path), timeout=BOUND) as reg:
        handle = reg.open("run")
        log = handle.log().get(timeout=BOUND)
        (end,) = turns(log)
        assert (end["owner"], end["how"], end["reason"]) == ("runner", "interrupted", "restart")
        assert end["closed_calls"] == ["c1"]
        messages = log.derive_messages()
        assert [m.content for m in messages] == [
            "before the run",
            "SUMMARY",
            None,
            INTERRUPTED_TOOL_RESULT,
        ]
        assert unanswered(messages) == []
        for m in messages:
            m.to_openai()
        with handle.turn(policy="reject") as turn:  # nothing is open: a new run goes on
            turn.append("user_message", {"content": "again"}).get(timeout=BOUND)


# -- a rollback undoes the run's compactions -------------------------------------------------


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_rollback_hides_the_compactions_of_the_run_it_rolls_back(snapshot: bool) -> None:
    """Run A compacts through its turn (and snapshots); run B rolls A back: the surface is
    what it was before A, and the note; A's summary is hidden with the rest of A, and
    stays in the log."""
    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        s = reg.open("rb")
        before_the_run(s)
        surface_before = contents(s)
        a = s.turn(owner="A").open()
        a.append("user_message", {"content": "q1"}).get(timeout=BOUND)
        a.append("assistant_message", {"content": LONG}).get(timeout=BOUND)
        a.append("assistant_message", {"content": "a1"}).get(timeout=BOUND)
        result = a.compact(squeeze(snapshot=snapshot)).get(timeout=BOUND)
        assert "SUMMARY" in contents(s)
        with s.turn(policy="rollback", owner="B"):
            pass
        assert contents(s) == [*surface_before, DEFAULT_ROLLBACK_NOTE]
        assert result.summary_seq in [e.seq for e in s.events().get(timeout=BOUND)]
        with pytest.raises(TurnInterrupted, match="rolled_back"):
            a.close()


def test_a_dangling_turn_rolled_back_hides_its_compactions_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dangling_turns="rollback"``: a turn whose lease ran out after it compacted is
    hidden whole behind the note, its summary included."""
    now = [1000.0]
    monkeypatch.setattr(scheduling, "monotonic", lambda: now[0])
    with Sessions(MemoryStore(), timeout=BOUND, dangling_turns="rollback") as reg:
        s = reg.open("gone")
        before_the_run(s)
        surface_before = contents(s)
        gone = s.turn(owner="silent", lease=30).open()
        gone.append("user_message", {"content": "q1"}).get(timeout=BOUND)
        gone.append("assistant_message", {"content": LONG}).get(timeout=BOUND)
        gone.append("assistant_message", {"content": "a1"}).get(timeout=BOUND)
        gone.compact(squeeze()).get(timeout=BOUND)
        now[0] += 31  # the holder went silent past its lease
        s.append("user_message", {"content": "after"}).get(timeout=BOUND)
        assert contents(s) == [*surface_before, DEFAULT_ROLLBACK_NOTE, "after"]
        assert [t["how"] for t in turns(s.log().get(timeout=BOUND))] == ["expired"]


# -- what TurnInterrupted names ------------------------------------------------------------


class _Gate(MemoryStore):
    """A store whose next write, once armed, waits for ``gate`` and then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def write(self, appends: Any, calls: Any = None) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.gate.wait(BOUND)
            raise StoreError("the disk is full (once)")
        return super().write(appends, calls)


def test_turn_interrupted_names_no_seq_of_a_turn_end_not_stored() -> None:
    """A call through a turn that another turn just interrupted, whose ``turn_end`` is
    still on its way to the store (and is then never stored): the error says how it
    ended and names no seq."""
    store = _Gate()
    s = Session.start("gate", store=store, timeout=BOUND)
    try:
        a = s.turn(owner="A").open()
        a.append("user_message", {"content": "hi"}).get(timeout=BOUND)
        store.armed = True
        b = s.turn(policy="interrupt", owner="B")._send_open()
        assert store.entered.wait(BOUND)
        with pytest.raises(TurnInterrupted) as err:
            a.append("user_message", {"content": "late"}).get(timeout=BOUND)
        assert "not stored yet" in str(err.value)
        assert "seq" not in str(err.value)
        store.gate.set()
        with pytest.raises(StoreError):
            b.get(timeout=BOUND)
        assert [e.seq for e in store.load("gate")] == [0, 1]
    finally:
        store.gate.set()
        s.stop()


def test_turn_interrupted_names_the_stored_turn_end() -> None:
    """Once the interrupted turn's ``turn_end`` is stored, the error names its seq, which
    the store holds as that turn's end."""
    store = MemoryStore()
    s = Session.start("named", store=store, timeout=BOUND)
    try:
        a = s.turn(owner="A").open()
        with s.turn(policy="interrupt", owner="B"):
            pass
        with pytest.raises(TurnInterrupted) as err:
            a.append("user_message", {"content": "late"}).get(timeout=BOUND)
        (end,) = [e for e in store.load("named") if e.data.get("turn_id") == a.turn_id][1:]
        assert f"turn_end at seq {end.seq}" in str(err.value)
        assert end.type.value == "turn_end"
    finally:
        s.stop()


# -- the lease while the turn's summary is written -------------------------------------------


def test_a_lease_does_not_run_out_while_the_turns_summary_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compaction through a turn whose summary (a model call) takes longer than the
    turn's lease: the turn stays open meanwhile (its holder waits for the session's own
    work), the compaction lands, and the lease runs again from then."""
    now = [1000.0]
    monkeypatch.setattr(scheduling, "monotonic", lambda: now[0])
    started, release = threading.Event(), threading.Event()

    def slow(messages: Sequence[Message]) -> str:
        started.set()
        assert release.wait(BOUND)
        return "SUMMARY"

    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        s = reg.open("slow")
        turn = s.turn(owner="run", lease=30).open()
        for text in ("q1", LONG, "a1"):
            turn.append("user_message", {"content": text}).get(timeout=BOUND)
        fut = turn.compact(Compactor(budget=1, keep_recent=1, summarise=slow))
        assert started.wait(BOUND)
        now[0] += 100  # far past the lease
        with pytest.raises(TurnBusy):  # still open: the summary is being written
            s.turn(policy="reject", owner="other").open()
        release.set()
        assert fut.get(timeout=BOUND).changed
        now[0] += 20  # within the lease renewed when the summary came back
        assert turn.close() is not None
        assert [t["how"] for t in turns(s.log().get(timeout=BOUND))] == ["closed"]


def test_a_lease_runs_out_once_the_turns_summary_came_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the summary came back, a silent holder's lease runs out as usual."""
    now = [1000.0]
    monkeypatch.setattr(scheduling, "monotonic", lambda: now[0])
    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        s = reg.open("silent")
        turn = s.turn(owner="run", lease=30).open()
        for text in ("q1", LONG, "a1"):
            turn.append("user_message", {"content": text}).get(timeout=BOUND)
        assert turn.compact(squeeze()).get(timeout=BOUND).changed
        now[0] += 31
        with s.turn(policy="reject", owner="next"):
            pass
        assert [t["how"] for t in turns(s.log().get(timeout=BOUND))] == ["expired", "closed"]


# -- a snapshot while a turn is open --------------------------------------------------------


def test_a_snapshot_keeps_the_open_turns_start_that_a_replace_of_the_turn_shadows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replace written through the turn over the whole history (the application's own
    compaction) shadows the turn's ``turn_start``; a snapshot while the turn is open
    keeps it all the same, so the session reopened after the holder is gone ends the
    turn and answers its open tool call."""
    now = [1000.0]
    monkeypatch.setattr(scheduling, "monotonic", lambda: now[0])
    store = MemoryStore()
    with Sessions(store, timeout=BOUND) as reg:
        s = reg.open("own-replace")
        before_the_run(s)
        turn = s.turn(owner="run", lease=30).open()
        reset = {"content": "context so far", "surface_op": ["replace", 0, 10**6]}
        turn.append("system_message", reset).get(timeout=BOUND)
        turn.append("assistant_message", CALL).get(timeout=BOUND)
        assert turn.snapshot().get(timeout=BOUND) > 0
        assert turn.start_seq in [e.seq for e in store.load("own-replace")]
        s.stop()
        now[0] += 31  # the holder is gone
        log = reg.open("own-replace").log().get(timeout=BOUND)
        (end,) = turns(log)
        assert (end["how"], end["reason"], end["closed_calls"]) == (
            "interrupted",
            "restart",
            ["c1"],
        )
        assert unanswered(log.derive_messages()) == []


def test_a_snapshot_keeping_a_turn_start_is_the_snapshot_plus_that_event() -> None:
    """`Log._snapshot_keeping(seq)` keeps the one shadowed bookkeeping event named and
    is otherwise `snapshot` (surface, count, later replaces); a surface event named is
    dropped as by `snapshot` (its surface must not change)."""
    log = Log().append("user_message", {"content": "q0"})
    log = log.append("turn_start", {"turn_id": "t", "owner": "o", "policy": "enqueue"})
    log = log.append("user_message", {"content": "q1"})
    log = log.append("system_message", {"content": "S", "surface_op": ["replace", 0, 2]})
    plain, kept = log.snapshot(), log._snapshot_keeping(1)
    assert [e.seq for e in plain.events()] == [3]
    assert [e.seq for e in kept.events()] == [1, 3]
    assert kept.count() == plain.count() == 4
    assert kept.derive_indexed() == plain.derive_indexed()
    later = {"content": "T", "surface_op": ["replace", 0, 3]}
    t = datetime.now(UTC)
    assert (
        kept.append("system_message", later, t).surface()
        == plain.append("system_message", later, t).surface()
    )
    assert [e.seq for e in log._snapshot_keeping(2).events()] == [3]


def test_a_snapshot_never_leaves_a_closed_turn_open_to_the_next_restart() -> None:
    """A run whose first message is a system message (kept by a summary as a leading
    one) has its ``turn_start`` kept and its ``turn_end`` shadowed by a later summary;
    the snapshot after it keeps the newest turn event, so the restart finds no turn
    open and appends nothing."""
    store = MemoryStore()
    with Sessions(store, timeout=BOUND) as reg:
        s = reg.open("closed")
        with s.turn(owner="run-1") as turn:
            turn.append("system_message", {"content": "you are helpful"}).get(timeout=BOUND)
            turn.append("user_message", {"content": "q1"}).get(timeout=BOUND)
            turn.append("assistant_message", {"content": LONG}).get(timeout=BOUND)
        with s.turn(owner="run-2") as turn:
            turn.append("user_message", {"content": "q2"}).get(timeout=BOUND)
        s.append("user_message", {"content": "after the runs"}).get(timeout=BOUND)
        s.compact(squeeze(keep_recent=0, snapshot=True)).get(timeout=BOUND)
        s.snapshot().get(timeout=BOUND)  # (after the compaction's own)
        stored = [e.seq for e in store.load("closed")]
        s.stop()
        reopened = reg.open("closed")
        assert [e.seq for e in reopened.events().get(timeout=BOUND)] == stored
        assert "interrupted" not in [t["how"] for t in turns(reopened.log().get(timeout=BOUND))]


class _RefusingSession:
    """What a turn table needs of its session (`TurnSession`), refusing appends once
    ``failed`` is set, as a session whose store failed does."""

    session_id = "refusing"
    dangling_turns = "keep"
    inflight: tuple[Any, ...] = ()

    def __init__(self) -> None:
        self.next_seq = 0
        self.log = Log()
        self.failed: StoreError | None = None
        self.turns: TurnTable | None = None
        self.actor_ref = self
        self.submitted: list[Any] = []

    def tell(self, message: object) -> None:  # (the alarm's tick: nothing to do here)
        pass

    def _submit(self, events: tuple[Any, ...], result: Any, fut: Any) -> Any:
        self.next_seq = events[-1].seq + 1
        self.submitted += events
        return result

    def _check_writable(self) -> None:
        if self.failed is not None:
            raise StoreError(f"refuses appends after a store failure ({self.failed})")

    def _resume(self, waiter: Any) -> None:
        pass

    def _keep_turns(self, table: TurnTable | None) -> None:
        self.turns = table

    def h_turn_tick(self) -> None:
        pass


def test_closing_a_turn_on_a_session_refusing_appends_names_no_unstored_turn_end() -> None:
    """A session that refuses appends after a store failure cannot store the closing
    turn's ``turn_end``: the close fails with the store's error instead of resolving to
    an event that was never stored, and the turn is no longer open."""
    s = _RefusingSession()
    table = TurnTable(s)  # type: ignore[arg-type]
    s._keep_turns(table)
    req = TurnRequest("t1", "run", "enqueue", 30.0, 1.0, DEFAULT_ROLLBACK_NOTE)
    table.arrive(req, None, scheduling.monotonic())
    s.failed = StoreError("the disk is full")
    with pytest.raises(StoreError, match="refuses appends"):
        table.end("t1", "closed", None, None, scheduling.monotonic())
    assert table.open is None
    assert [e.type.value for e in s.submitted] == ["turn_start"]
