"""asyncio is a first-class caller, and messages go in as they are.

Opening, stopping, closing and subscribing never block the event loop; a
`Message` or an OpenAI dict is appended without hand-translation; a fork never
splits a tool call from its result.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from bounds import SLOW_BOUND as BOUND

from nous_actor import CallTimeout, Log, MemoryStore, Message, Session, Sessions, StoreError

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def ticks_while(work: Any, gate: threading.Event | None = None) -> tuple[Any, int]:
    """Run ``work`` while a probe counts how often the loop got to run it; with a
    ``gate``, the probe opens it after 20 ticks (work that waits for the gate can end
    only if the loop kept running while it waited)."""
    count = 0
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal count
        while not done.is_set():
            count += 1
            if gate is not None and count == 20:
                gate.set()
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    try:
        result = await work
    finally:
        done.set()
        await task
    return result, count


class _Gated(MemoryStore):
    """A store whose loads, and (once ``writes`` is set) writes, wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.writes = False

    def _wait(self) -> None:
        if not self.gate.wait(BOUND):
            raise StoreError("the gate was never opened: the event loop was blocked")

    def load(self, session_id: str) -> list[Any]:
        self._wait()
        return super().load(session_id)

    def write(self, appends: Any) -> Any:
        if self.writes:
            self._wait()
        return super().write(appends)


def test_opening_stopping_and_closing_sessions_leave_the_loop_free() -> None:
    """aopen/astop/aclose wait off the loop: while a store holds each of them up (a
    load, then a commit a stop must wait for), the loop keeps running coroutines,
    and only a coroutine lets the store go on."""

    async def main() -> tuple[int, int, int]:
        store = _Gated()
        async with Sessions(store, timeout=BOUND) as reg:
            handles, opened = await ticks_while(
                asyncio.gather(*(reg.aopen(f"s{k}") for k in range(20))), store.gate
            )
            assert len(reg.live()) == 20
            store.gate.clear()
            store.writes = True
            pending = [h.append("user_message", {"content": "hi"}, T0) for h in handles[:3]]
            _, stopped = await ticks_while(
                asyncio.gather(*(h.astop() for h in handles[:10])), store.gate
            )
            assert [(await p).seq for p in pending] == [0, 0, 0]  # committed before the stop
            store.gate.clear()
            pending = [h.append("user_message", {"content": "again"}, T0) for h in handles[10:]]
            _, closed = await ticks_while(reg.aclose(), store.gate)
            assert [(await p).seq for p in pending] == [0] * 10
            return opened, stopped, closed

    opened, stopped, closed = asyncio.run(main())
    assert min(opened, stopped, closed) >= 20  # (the probe opened each gate)


def test_an_async_subscription_reads_catch_up_then_live_events() -> None:
    """asubscribe + async with + aget: catch-up, then live, bounded waits."""

    async def main() -> list[str]:
        s = Session.start("feed", timeout=BOUND)
        await s.append("user_message", {"content": "before"}, T0)
        got = []
        async with await s.asubscribe() as feed:
            got.append((await feed.aget(BOUND)).data["content"])
            await s.append("user_message", {"content": "after"}, T0)
            got.append((await feed.aget(BOUND)).data["content"])
            with pytest.raises(CallTimeout):
                await feed.aget(0.01)
        await s.astop()
        return got

    assert asyncio.run(main()) == ["before", "after"]


# -- messages in as they are ------------------------------------------------------------


def test_append_message_takes_a_message_and_both_openai_tool_call_shapes() -> None:
    """A Message, an OpenAI dict with OpenAI-shaped calls and one with flat calls: the event
    type follows the role and the surface gives the messages back."""
    s = Session.start("msgs", timeout=BOUND)
    sent = [
        Message.system("be brief", created_at=T0),
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c2", "name": "ls", "arguments": "{}"}],
        },
    ]
    events = [s.append_message(m).get() for m in sent]
    assert [e.type.value for e in events] == [
        "system_message",
        "user_message",
        "assistant_message",
        "tool_result",
        "assistant_message",
    ]
    derived = s.derive_messages().get()
    assert derived[0] == sent[0]
    payload = Message.to_openai_list(derived)
    assert payload[2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
    }
    assert payload[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert payload[4]["tool_calls"][0]["function"]["name"] == "ls"
    s.stop()


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (42, TypeError, "Message or an OpenAI message dict"),
        ({"role": "wizard", "content": "x"}, ValueError, "'role' must be one of"),
        ({"content": "no role"}, ValueError, "'role'"),
    ],
)
def test_append_message_refuses_what_is_not_a_message(
    bad: Any, error: type[Exception], match: str
) -> None:
    """Bad input fails the call's future with a clear error and appends nothing."""
    s = Session.start("bad-msgs", timeout=BOUND)
    with pytest.raises(error, match=match):
        s.append_message(bad).get()
    with pytest.raises(error, match=match):
        Log().append_message(bad)
    assert s.count().get() == 0
    s.stop()


def test_log_append_message_round_trips() -> None:
    """Log.append_message(m).derive_messages()[-1] == m, for every role."""
    log = Log()
    ms = [
        Message.system("s", created_at=T0),
        Message.user("u", created_at=T0),
        Message.assistant("a", reasoning_content="r", created_at=T0),
        Message.tool("t", tool_call_id="c9", created_at=T0),
    ]
    for m in ms:
        log = log.append_message(m)
    assert log.derive_messages() == ms


# -- fork never splits a tool call from its result ----------------------------------------


def calls_log() -> Log:
    log = Log().append("user_message", {"content": "go"}, T0)  # 0
    call = {"id": "c1", "name": "ls", "arguments": "{}"}
    log = log.append("assistant_message", {"tool_calls": [call]}, T0)  # 1
    log = log.append("step_start", {"step": "tool"}, T0)  # 2
    log = log.append("tool_result", {"content": "a.py", "tool_call_id": "c1"}, T0)  # 3
    return log.append("assistant_message", {"content": "done"}, T0)  # 4


@pytest.mark.parametrize("through", [1, 2])
def test_fork_refuses_a_boundary_between_a_tool_call_and_its_result(through: int) -> None:
    """Through the call but before its result (matched by tool_call_id): ValueError
    naming the call and the result's seq; the log is unchanged."""
    log = calls_log()
    with pytest.raises(ValueError, match=r"split the tool call 'c1' from its result at seq 3"):
        log.fork(through)
    assert log.count() == 5


@pytest.mark.parametrize("through", [0, 3, 4])
def test_fork_before_the_call_or_after_its_result_is_fine(through: int) -> None:
    """A boundary before the call, at its result or later forks."""
    assert calls_log().fork(through).count() == through + 1


def test_a_session_fork_refuses_the_split_too() -> None:
    """Session.fork fails its future the same way."""
    s = Session.start("forks", calls_log(), timeout=BOUND)
    with pytest.raises(ValueError, match="split the tool call"):
        s.fork(2).get()
    assert s.fork(3).get().count() == 4
    s.stop()


# -- batches ---------------------------------------------------------------------------


def test_append_many_commits_one_batch_under_consecutive_seqs() -> None:
    """append_many: consecutive seqs, one write to the store, nothing between them."""
    writes: list[list[int]] = []

    class Recording(MemoryStore):
        def write(self, appends: Any) -> Any:
            writes.extend([e.seq for e in evs] for evs in appends.values())
            return super().write(appends)

    s = Session.start("batch", store=Recording(), timeout=BOUND)
    s.append("user_message", {"content": "first"}, T0).get()
    out = s.append_many(
        [("user_message", {"content": "a"}), ("assistant_message", {"content": "b"}, T0)]
    ).get()
    assert [e.seq for e in out] == [1, 2]
    assert [1, 2] in writes
    assert s.append_many([]).get() == []
    s.stop()


def test_append_many_refuses_the_whole_batch_for_one_bad_item() -> None:
    """One refused item fails the call naming its index; nothing is appended."""
    s = Session.start("batch-bad", timeout=BOUND)
    with pytest.raises(ValueError, match="item 1: "):
        s.append_many([("user_message", {"content": "ok"}), ("user_message", {"x": {1, 2}})]).get()
    with pytest.raises(TypeError, match="item 0 is str"):
        s.append_many(["user_message"]).get()  # type: ignore[list-item]
    assert s.count().get() == 0
    s.stop()
