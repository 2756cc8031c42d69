"""A coroutine summariser and the event loop it runs on (DESIGN.md 7, 4).

A coroutine summariser called from asyncio runs on the caller's loop. If that
loop ends before the summary ran, the compaction fails at once with
``CompactionError`` and the log is unchanged; a blocking ``get()`` from inside
that very loop raises at once, saying to ``await`` instead.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from bounds import BOUND

from nous_actor import CompactionError, Compactor, Session, SessionFuture, SessionStopped


async def summarise(messages: object) -> str:
    await asyncio.sleep(0)
    return "summary"


@pytest.fixture
def long_chat(chat: Session) -> Session:
    """The shared chat with eight long messages: enough for a compaction to summarise."""
    for i in range(8):
        chat.append("user_message", {"content": f"message {i} " * 20}).get()
    return chat


def _compactor() -> Compactor:
    return Compactor(budget=1, keep_recent=2, summarise=summarise)


def test_a_loop_that_ends_before_the_summary_fails_the_compaction_at_once(
    long_chat: Session,
) -> None:
    """compact() inside asyncio.run() that returns before awaiting: CompactionError, fast."""
    before = long_chat.count().get()
    futures: list[SessionFuture[object]] = []

    async def main() -> None:
        futures.append(long_chat.compact(_compactor()))  # never awaited

    asyncio.run(main())
    started = time.monotonic()
    with pytest.raises(CompactionError, match=r"event loop .* ended before the summary ran"):
        futures[0].get(timeout=BOUND)
    assert time.monotonic() - started < BOUND / 2  # at once, not after the bound
    assert long_chat.count().get() == before  # the log is unchanged


def test_a_blocking_get_inside_the_summary_loop_says_to_await(long_chat: Session) -> None:
    """get() from the loop that must run the summary raises at once; await then works."""

    async def main() -> object:
        fut = long_chat.compact(_compactor())
        with pytest.raises(RuntimeError, match="'await' the future instead"):
            fut.get(timeout=BOUND)
        return await fut

    result = asyncio.run(main())
    assert result.summary_seq is not None  # type: ignore[attr-defined]
    assert long_chat.derive_messages().get()[0].content == "summary"


def test_an_awaited_coroutine_summary_applies(long_chat: Session) -> None:
    """The ordinary case still works: awaited on the loop, the summary replaces the range."""

    async def main() -> None:
        await long_chat.compact(_compactor())

    asyncio.run(main())
    assert long_chat.derive_messages().get()[0].content == "summary"


def test_no_summary_needed_leaves_no_task_behind(long_chat: Session) -> None:
    """A compaction that needs no summary ends its waiting task on the loop."""

    async def main() -> int:
        c = Compactor(budget=10**9, keep_recent=2, summarise=summarise)
        await long_chat.compact(c)
        await asyncio.sleep(0)  # let the released task finish its last step
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    assert asyncio.run(main()) == 0


def test_a_compaction_answered_without_a_summary_leaves_no_task_on_the_loop() -> None:
    """A coroutine summariser's place on the caller's loop (a task) ends when its
    compaction is answered without running it, here because the session stopped
    before the call reached it; it stayed pending for the life of the loop."""

    async def main() -> None:
        session = Session.start("gone", timeout=BOUND)
        await session.astop()
        with pytest.raises(SessionStopped):
            await session.compact(_compactor())
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.wait_for(asyncio.gather(*others), BOUND)

    asyncio.run(main())


# -- what the summary must be, on a session ---------------------------------------------


@pytest.mark.parametrize(
    ("summary", "said"),
    [
        (42, r"returned int \(42\), not a str: return the summary text as a str"),
        ("long " * 400, r"would make the surface larger: estimate \d+ before, \d+ after"),
    ],
)
def test_a_session_refuses_a_summary_that_is_no_str_or_too_large(
    long_chat: Session, summary: object, said: str
) -> None:
    """On a session as on a log: a summariser's non-str answer is named, and a summary
    that would make the surface larger is refused; the log is unchanged, the session
    runs on."""
    before = long_chat.log().get()
    with pytest.raises(CompactionError, match=said):
        long_chat.compact(Compactor(budget=1, keep_recent=2, summarise=lambda ms: summary)).get()
    assert long_chat.log().get().events() == before.events()
    assert long_chat.append("user_message", {"content": "still here"}).get().seq == before.count()


def test_a_summariser_that_raises_cancelled_error_itself_is_a_failed_summariser(
    long_chat: Session,
) -> None:
    """A coroutine summariser whose own call was cancelled (it raises ``CancelledError``
    while its loop runs on): the compaction fails as for any summariser's error, naming
    it (it said the loop had ended, which it had not), and the session goes on."""

    async def cancelled(messages: object) -> str:
        raise asyncio.CancelledError("the model call was cancelled")

    async def main() -> str:
        with pytest.raises(CompactionError) as caught:
            await long_chat.compact(Compactor(budget=1, keep_recent=2, summarise=cancelled))
        assert asyncio.get_running_loop().is_running()
        return str(caught.value)

    before = long_chat.count().get(timeout=BOUND)
    said = asyncio.run(main())
    assert "CancelledError: the model call was cancelled" in said
    assert "event loop" not in said
    assert long_chat.count().get(timeout=BOUND) == before  # log unchanged
    assert long_chat.compact(_compactor()).get(timeout=BOUND) is not None  # and it goes on
