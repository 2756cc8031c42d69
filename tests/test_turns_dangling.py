"""Turns whose holder is gone: what a session does with their half run (``dangling_turns``).

A turn's holder is gone when the process that ran it died (a real SIGKILL of a
child process here) or its lease ran out. The registry's ``dangling_turns``
says what becomes of the half run: ``close_tool_calls`` (the default) answers
each tool call left without a result, ``rollback`` hides the run behind a note,
``keep`` leaves it. A turn whose holder still runs (the session's actor crashed,
the process did not) only ends as interrupted, and its holder goes on.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pytest
from bounds import BOUND, end_child
from hypothesis import given
from hypothesis import strategies as st

from nous_actor import (
    Log,
    MemoryStore,
    Message,
    Session,
    SessionCrashed,
    Sessions,
    SQLiteStore,
    TurnInterrupted,
)
from nous_actor.core.history import turns
from nous_actor.runtime import scheduling
from nous_actor.sessions.faults import crash
from nous_actor.sessions.turns import (
    DANGLING_TURNS,
    DEFAULT_DANGLING_TURNS,
    DEFAULT_ROLLBACK_NOTE,
    INTERRUPTED_TOOL_RESULT,
)
from nous_actor.sessions.turns._rules import dangling_calls

CALLS: Final = {
    "content": None,
    "tool_calls": [
        {"id": "c1", "name": "weather", "arguments": '{"city": "Oslo"}'},
        {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
    ],
}


def unanswered(messages: Sequence[Message]) -> list[str]:
    """Ids of the assistant tool calls that no later tool message answers."""
    open_calls: dict[str, None] = {}
    for m in messages:
        if m.role.value == "assistant":
            for call in m.tool_calls:
                open_calls[str(call["id"])] = None
        elif m.role.value == "tool":
            open_calls.pop(str(m.tool_call_id), None)
    return list(open_calls)


def half_run(turn: Any) -> None:
    """A run cut short between its tool calls and their results: one answered, one not."""
    turn.append("user_message", {"content": "weather and time in Oslo?"}).get(timeout=BOUND)
    turn.append("assistant_message", CALLS).get(timeout=BOUND)
    turn.append("tool_result", {"content": "-3 C", "tool_call_id": "c1", "name": "weather"}).get(
        timeout=BOUND
    )


def check_after(handle: Session, dangling: str, reason: str, later: int = 0) -> None:
    """The surface and the turn's end after a gone holder's turn was ended with
    ``dangling`` (``later``: how many messages were appended after that)."""
    log = handle.log().get()
    messages = log.derive_messages()
    messages = messages[: len(messages) - later]
    end = turns(log)[0]
    if dangling == "close_tool_calls":
        assert [m.content for m in messages] == [
            "before the run",
            "weather and time in Oslo?",
            None,
            "-3 C",
            INTERRUPTED_TOOL_RESULT,
        ]
        closing = messages[-1]
        assert (closing.role.value, closing.tool_call_id, closing.name) == ("tool", "c2", "time")
        assert closing.metadata["interrupted"]["reason"] == reason
        assert (end["dangling"], end["closed_calls"]) == ("close_tool_calls", ["c2"])
        # The closing result comes inside the turn: just before its turn_end.
        kinds = [e.type.value for e in log.events()]
        first_end = kinds.index("turn_end")
        assert kinds[first_end - 1] == "tool_result"
    elif dangling == "rollback":
        assert [m.content for m in messages] == ["before the run", DEFAULT_ROLLBACK_NOTE]
        assert end["dangling"] == "rollback"
        note = log.events()[end["note_seq"]]
        assert note.data["rolled_back_turn"] == end["turn_id"]
        assert note.data["reason"] == reason
        # History is kept: every event of the half run is still in the log.
        results = [e for e in log.events() if e.type.value == "tool_result"]
        assert [e.data["tool_call_id"] for e in results] == ["c1"]
    else:
        assert [m.content for m in messages][-1] == "-3 C"
        assert end["dangling"] is None
        assert unanswered(messages) == ["c2"]
        return
    assert unanswered(messages) == []
    for m in messages:  # the model-visible surface is a valid provider request
        m.to_openai()


# -- the process that ran the turn dies ---------------------------------------------------

_RUNNER = """
import json, sys
from nous_actor import Sessions, SQLiteStore
with Sessions(SQLiteStore(sys.argv[1])) as reg:
    s = reg.open("run")
    s.append("user_message", {"content": "before the run"}).get()
    with s.turn(owner="runner") as turn:
        turn.append("user_message", {"content": "weather and time in Oslo?"}).get()
        turn.append("assistant_message", json.loads(sys.argv[2])).get()
        result = {"content": "-3 C", "tool_call_id": "c1", "name": "weather"}
        turn.append("tool_result", result).get()
        print("mid-turn", flush=True)
        sys.stdin.readline()  # killed here, the turn open, one tool call without its result
"""


def _killed_mid_turn(path: Path) -> None:
    """Run a child process that opens a turn on session ``run`` of the SQLite file at
    ``path``, writes half a run and is killed with SIGKILL in the middle of it."""
    child = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(path), json.dumps(CALLS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "mid-turn\n"
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        end_child(child, 60)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
@pytest.mark.parametrize("dangling", DANGLING_TURNS)
def test_a_turn_whose_process_was_killed_is_ended_as_the_registry_says(
    tmp_path: Path, dangling: str
) -> None:
    """A process killed with SIGKILL in the middle of a turn leaves it open in the store;
    the registry that opens the session next ends it as interrupted (reason restart) and
    does with its half run what ``dangling_turns`` says: with the default no tool call
    is left without a result, with ``rollback`` a note stands for the run, with
    ``keep`` the run stays as it was."""
    path = tmp_path / "app.db"
    _killed_mid_turn(path)
    with Sessions(SQLiteStore(path), timeout=BOUND, dangling_turns=dangling) as reg:  # type: ignore[arg-type]
        handle = reg.open("run")
        (end,) = turns(handle.log().get())
        assert (end["owner"], end["how"], end["reason"]) == ("runner", "interrupted", "restart")
        check_after(handle, dangling, "restart")
        with handle.turn(policy="reject") as turn:  # nothing is open: a new run goes on
            turn.append("user_message", {"content": "again"}).get()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_by_default_no_tool_call_is_left_without_its_result(tmp_path: Path) -> None:
    """The default is ``close_tool_calls``: a standalone session (and a registry made
    without the setting) never leaves a dangling tool call on the surface."""
    assert DEFAULT_DANGLING_TURNS == "close_tool_calls"
    path = tmp_path / "app.db"
    _killed_mid_turn(path)
    store = SQLiteStore(path)
    s = Session.start("run", store=store, timeout=BOUND)
    try:
        check_after(s, "close_tool_calls", "restart")
    finally:
        s.stop()
        store.close()


# -- the lease runs out -------------------------------------------------------------------


@pytest.mark.parametrize("dangling", DANGLING_TURNS)
def test_a_turn_whose_lease_ran_out_is_ended_as_the_registry_says(dangling: str) -> None:
    """A holder that goes silent past its lease is gone: its turn ends as expired and
    ``dangling_turns`` applies to its half run, before the writes that waited for it."""
    with Sessions(MemoryStore(), timeout=BOUND, dangling_turns=dangling) as reg:  # type: ignore[arg-type]
        s = reg.open("lease")
        s.append("user_message", {"content": "before the run"}).get()
        gone = s.turn(owner="silent", lease=0.2).open()
        half_run(gone)
        # A plain write waits for the turn: it runs once the lease has run out.
        s.append("user_message", {"content": "after"}).get()
        (end,) = turns(s.log().get())
        assert (end["owner"], end["how"]) == ("silent", "expired")
        with pytest.raises(TurnInterrupted, match="expired"):
            gone.renew().get()
        assert s.derive_messages().get()[-1].content == "after"
        check_after(s, dangling, "lease", later=1)


def test_a_lease_that_ran_out_while_the_session_was_down_means_the_holder_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reopened in the same process after the turn's lease ran out, the session treats
    its holder as gone: the default closes the dangling tool call."""
    now = [1000.0]
    monkeypatch.setattr(scheduling, "monotonic", lambda: now[0])
    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        s = reg.open("down")
        s.append("user_message", {"content": "before the run"}).get()
        turn = s.turn(owner="slow", lease=30).open()
        half_run(turn)
        s.stop()
        now[0] += 31
        check_after(reg.open("down"), "close_tool_calls", "restart")


# -- the holder still runs ------------------------------------------------------------------


@pytest.mark.parametrize("dangling", DANGLING_TURNS)
def test_a_turn_whose_holder_still_runs_goes_on_after_a_crash(dangling: str) -> None:
    """The actor crashed, the process did not: the restart ends the turn as interrupted
    (reason restart) and leaves its half run alone, whatever ``dangling_turns`` says; its
    holder hears TurnInterrupted, opens a new turn and finishes the run."""
    with Sessions(MemoryStore(), timeout=BOUND, backoff=None, dangling_turns=dangling) as reg:  # type: ignore[arg-type]
        s = reg.open("alive")
        s.append("user_message", {"content": "before the run"}).get()
        turn = s.turn(owner="run-1").open()
        half_run(turn)
        with pytest.raises(SessionCrashed):
            crash(s).get()
        with pytest.raises(TurnInterrupted, match="restart"):  # its turn_end may be in flight
            turn.append("tool_result", {"content": "12:00", "tool_call_id": "c2"}).get()
        (end,) = turns(s.log().get())
        assert (end["how"], end["reason"]) == ("interrupted", "restart")
        assert end["dangling"] is None
        assert unanswered(s.derive_messages().get()) == ["c2"]
        with s.turn(owner="run-1") as again:
            again.append("tool_result", {"content": "12:00", "tool_call_id": "c2"}).get()
        assert unanswered(s.derive_messages().get()) == []


def test_a_turn_stopped_with_its_session_in_this_process_only_ends() -> None:
    """A session stopped with a turn open and reopened in this process while the
    lease runs: the holder still runs here, so the half run is left as it is."""
    with Sessions(MemoryStore(), timeout=BOUND) as reg:
        s = reg.open("stopped")
        s.append("user_message", {"content": "before the run"}).get()
        half_run(s.turn(owner="run-1").open())
        s.stop()
        s = reg.open("stopped")
        assert unanswered(s.derive_messages().get()) == ["c2"]
        assert turns(s.log().get())[0]["dangling"] is None


# -- the setting -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["drop", "", None, 1, "KEEP"])
def test_a_bad_setting_is_refused_naming_the_values(bad: object) -> None:
    """``dangling_turns`` must be one of the three names; nothing is started."""
    with pytest.raises(ValueError, match="'keep', 'rollback', 'close_tool_calls'"):
        Sessions(MemoryStore(), dangling_turns=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dangling_turns must be one of"):
        Session.start("never", dangling_turns=bad)  # type: ignore[arg-type]


# -- which calls dangle ----------------------------------------------------------------------

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.lists(st.sampled_from("abcdef"), max_size=3, unique=True)),
        st.tuples(st.just("result"), st.sampled_from("abcdefz")),
        st.tuples(st.just("user"), st.just("")),
    ),
    max_size=12,
)


@given(before=_steps, during=_steps, committed=st.integers(0, 12))
def test_closing_the_dangling_calls_leaves_none_on_the_surface(
    before: list[tuple[str, Any]], during: list[tuple[str, Any]], committed: int
) -> None:
    """For any run (its calls and results in any order, some of them still in flight),
    answering the calls `dangling_calls` names leaves no call the turn made without its
    result, and answers none the run answered itself."""
    log = Log()
    for kind, arg in before:
        log = _step(log, kind, arg)
    start = log.count()
    log = log.append("turn_start", {"turn_id": "t"})
    for kind, arg in during:
        log = _step(log, kind, arg)
    cut = min(len(log.events()), start + 1 + committed)
    applied = Log.restore(log.events()[:cut])
    named = dangling_calls(applied, start, log.events()[cut:])
    answered_by_run = {
        e.data["tool_call_id"] for e in log.since(start) if e.type.value == "tool_result"
    }
    assert not {cid for cid, _ in named} & answered_by_run
    for cid, _ in named:
        log = log.append("tool_result", {"content": "interrupted", "tool_call_id": cid})
    made = [
        c["id"]
        for e in log.since(start)
        if e.type.value == "assistant_message"
        for c in e.data.get("tool_calls", ())
    ]
    results = {e.data["tool_call_id"] for e in log.since(start) if e.type.value == "tool_result"}
    assert set(made) <= results


def _step(log: Log, kind: str, arg: Any) -> Log:
    if kind == "call":
        calls = [{"id": cid, "name": "f", "arguments": "{}"} for cid in arg]
        return log.append("assistant_message", {"content": None, "tool_calls": calls})
    if kind == "result":
        return log.append("tool_result", {"content": "r", "tool_call_id": arg})
    return log.append("user_message", {"content": "u"})


# -- the turn was opened through another process's session (forwarded there) ---------------

_FORWARDING_RUNNER = """
import json, sys
from nous_actor import Sessions, SQLiteStore, TurnInterrupted
reg = Sessions(SQLiteStore(sys.argv[1]))
s = reg.open("run")  # held by the test's process: every call is forwarded there
turn = s.turn(owner="runner", lease=120).open()
turn.append("user_message", {"content": "weather and time in Oslo?"}).get()
turn.append("assistant_message", json.loads(sys.argv[2])).get()
turn.append("tool_result", {"content": "-3 C", "tool_call_id": "c1", "name": "weather"}).get()
print("mid-turn", flush=True)
sys.stdin.readline()  # killed here, or told that the holder let the session go
try:
    turn.append("tool_result", {"content": "12:00", "tool_call_id": "c2", "name": "time"}).get()
    print(json.dumps({"late_result": "stored"}), flush=True)
except TurnInterrupted:
    print(json.dumps({"late_result": "TurnInterrupted"}), flush=True)
reg.close()
"""


def _forwarding_runner(path: Path) -> subprocess.Popen[str]:
    """A child process that runs half a run through a turn of session ``run``, which this
    process holds (its calls are forwarded here), and waits in the middle of it."""
    child = subprocess.Popen(
        [sys.executable, "-c", _FORWARDING_RUNNER, str(path), json.dumps(CALLS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "mid-turn\n"
    return child


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
@pytest.mark.parametrize("dangling", DANGLING_TURNS)
def test_a_forwarded_turn_whose_process_was_killed_ends_at_once(
    tmp_path: Path, dangling: str
) -> None:
    """A web worker killed inside a turn it opened on a session another, live worker
    holds: the holder hears its connection close and ends the turn at once (reason
    ``holder_gone``), its half run as ``dangling_turns`` says, so the next run goes on
    now (the turn stayed open for its whole lease, 120 s here: every run waited)."""
    path = tmp_path / "app.db"
    with Sessions(SQLiteStore(path), timeout=BOUND, dangling_turns=dangling) as reg:  # type: ignore[arg-type]
        handle = reg.open("run")
        handle.append("user_message", {"content": "before the run"}).get(timeout=BOUND)
        child = _forwarding_runner(path)
        try:
            child.send_signal(signal.SIGKILL)
            assert child.wait(timeout=60) == -signal.SIGKILL
        finally:
            end_child(child, 60)
        with handle.turn(policy="enqueue", owner="next", timeout=BOUND):
            pass  # opened once the killed worker's turn ended (well within its lease)
        end = turns(handle.log().get(timeout=BOUND))[0]
        assert (end["owner"], end["how"], end["reason"]) == (
            "runner",
            "interrupted",
            "holder_gone",
        )
        check_after(handle, dangling, "holder_gone")


def test_a_forwarded_turn_whose_session_moves_to_its_runner_leaves_the_half_run(
    tmp_path: Path,
) -> None:
    """The holder lets the session go (its registry closes: a worker recycled) while
    another process runs a turn of it through forwarded calls; the session moves to that
    process, whose own caller still holds the turn: the turn ends as interrupted (reason
    ``restart``), its half run left as it is, and the runner hears `TurnInterrupted`
    (the half run was taken for a dead holder's: a made-up result closed its open tool
    call, and the runner's real one was refused after it)."""
    path = tmp_path / "app.db"
    reg = Sessions(SQLiteStore(path), timeout=BOUND)
    try:
        handle = reg.open("run")
        handle.append("user_message", {"content": "before the run"}).get(timeout=BOUND)
        child = _forwarding_runner(path)
    finally:
        reg.close()
    try:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write("go on\n")
        child.stdin.flush()
        assert json.loads(child.stdout.readline()) == {"late_result": "TurnInterrupted"}
        assert child.wait(timeout=60) == 0
    finally:
        end_child(child, 60)
    with Sessions(SQLiteStore(path), timeout=BOUND) as after:
        log = after.read("run").log().get(timeout=BOUND)
    end = turns(log)[0]
    assert (end["owner"], end["how"], end["reason"]) == ("runner", "interrupted", "restart")
    assert end["dangling"] is None
    assert [m.content for m in log.derive_messages()] == [
        "before the run",
        "weather and time in Oslo?",
        None,
        "-3 C",
    ]
