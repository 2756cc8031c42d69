"""The Agents SDK's compaction session wrapped around a NousSession keeps history.

`OpenAIResponsesCompactionSession` compacts the session it wraps by
``clear_session`` then ``add_items`` of the compacted items; on a
`NousSession` both are replaces, so the surface holds the compacted items
while the log keeps every item, and audit shows what the compaction hid.
The ``responses.compact`` call is faked (no network).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest
from agents.memory import OpenAIResponsesCompactionSession
from bounds import run

from nous_actor import MemoryStore, Sessions
from nous_actor.core.history import replaced
from nous_actor.integrations.openai_agents import ITEM_KEY, OP_KEY, NousSession

T = TypeVar("T")

SUMMARY = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "Summary: ann asked twice, got two answers."}],
}


class FakeResponses:
    """Stands in for ``client.responses``: ``compact`` answers with one summary item."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def compact(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return SimpleNamespace(output=[SUMMARY], usage=None)


@pytest.fixture
def sessions() -> Iterator[Sessions]:
    registry = Sessions(MemoryStore(), timeout=20)
    yield registry
    registry.close()


def test_compaction_keeps_history_and_audit_names_it(sessions: Sessions) -> None:
    """After a forced compaction the session's items are the compacted ones, every item
    added before stays in the log, and the replaces record the clear and the add."""
    nous = NousSession("chat", sessions)
    fake = FakeResponses()
    compacting = OpenAIResponsesCompactionSession(
        "chat", nous, client=cast(Any, SimpleNamespace(responses=fake)), model="gpt-4.1"
    )
    items: list[Any] = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "second answer"},
    ]

    async def body() -> None:
        await compacting.add_items(items)
        await compacting.run_compaction({"force": True, "compaction_mode": "input"})
        assert len(fake.calls) == 1
        assert [i["content"] for i in fake.calls[0]["input"]] == [i["content"] for i in items]
        after = await nous.get_items()
        assert [i["content"] for i in after] == [SUMMARY["content"]]
        handle = await nous.open()
        log = await handle.log()
        kept = [e for e in log.events() if ITEM_KEY in e.data.get("metadata", {})]
        originals = [e.data["metadata"][ITEM_KEY]["content"] for e in kept[: len(items)]]
        assert originals == [i["content"] for i in items]
        ops = [e for e in log.events() if OP_KEY in e.data]
        assert [e.data[OP_KEY]["op"] for e in ops] == ["clear_session", "add_items"]
        clear, add = ops
        assert replaced(log, clear.seq) == [e.seq for e in kept[: len(items)]]
        assert clear.seq in replaced(log, add.seq)  # the add replaces the cleared marker
        assert add.data["metadata"][ITEM_KEY]["content"] == SUMMARY["content"]

    run(body())
    nous.close()
