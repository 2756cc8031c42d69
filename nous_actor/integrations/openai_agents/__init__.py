"""The OpenAI Agents SDK's `Session`, kept in a supervised, durable nous_actor session.

`NousSession` implements the SDK's session protocol (`session_id`,
`session_settings`, `get_items`, `add_items`, `pop_item`, `clear_session`)
over one session of a `nous_actor.Sessions` registry, on any store. Swap

    session = SQLiteSession("user-1", "chat.db")

for

    session = NousSession("user-1", sessions)        # a registry you run, or
    session = NousSession.sqlite("user-1", "chat.db")  # one opened for you

and the history gains what the registry gives every session: supervision
(a crashed session restarts from the store), durable acknowledgements, safe
concurrent writers, compaction, fork and audit.

**How items are kept.** Each Responses input item becomes one surface event
whose `data["metadata"]["openai_item"]` holds the item verbatim, so every
item round-trips exactly, also item types this module does not know. The
event's other fields are a chat view of the item (see `event_for_item`):
user messages become `user_message`, system and developer messages
`system_message`, assistant messages `assistant_message`, a `function_call`
an `assistant_message` with one tool call, a `function_call_output` a
`tool_result` with its `tool_call_id`, a `reasoning` item an
`assistant_message` with `reasoning_content`.

**Nothing is deleted.** `pop_item` and `clear_session` append a replace (the
only way this log model hides a surface event, DESIGN.md §3): a pop replaces
the range from the previous item to the popped one by a copy of the previous
item; a pop of the only item, and a clear, replace everything by a *cleared
marker* (a `system_message` with no content and
`metadata["openai_cleared"]`), which stands for no item and which the next
`add_items` replaces in turn. The popped and cleared events stay in the log:
`events()`, audit, fork and rewind still show them.

**The rule that ties the two views together**::

    await nous.get_items() == items_from_messages(await handle.derive_messages())

`get_items` is exactly the items of the model-visible surface: messages with
an `openai_item` give it back, cleared markers give none, and messages other
code wrote (a compaction summary, a seeded transcript) give the Responses
items of their chat content.

**Runs.** The SDK's session protocol never says when a run starts or ends:
`Runner.run` just calls `get_items` and `add_items`. So, by itself, this
adapter cannot keep runs apart: each call is serialised (the items of one
`add_items` are contiguous), but two runs on one session may interleave
their items. Wrap each run in `NousSession.turn()` to keep them apart::

    async with session.turn():
        await Runner.run(agent, "hi", session=session)

Inside the block, this `NousSession`'s calls (in that task and the tasks it
starts) go through a turn of the session (`nous_actor.SessionHandle.turn`):
another run's turn waits for it (or applies its policy), and calls outside
any turn wait for it to end (at most the registry's `timeout`, then
`nous_actor.TurnBusy`).

**Layout.** `framework` holds the SDK's names; `records` the keys written;
`items` the mapping between items and events; `surface` the replaces that
hide items; `checks` the checks of what callers pass; `shared` the lock and
state every `NousSession` of one session shares; `registries` the registries
`NousSession.sqlite` opens; `calls` how a `NousSession`'s calls reach its
session (`_Calls`, the collaborator it holds, and `NousSessionClosed`); `turn`
`RunTurn`; `session` `NousSession`.
"""

from __future__ import annotations

from nous_actor.integrations.openai_agents.calls import NousSessionClosed
from nous_actor.integrations.openai_agents.calls import Pending as Pending
from nous_actor.integrations.openai_agents.items import (
    event_for_item,
    items_from_messages,
    items_of_message,
)
from nous_actor.integrations.openai_agents.records import CLEARED_KEY, ITEM_KEY, OP_KEY
from nous_actor.integrations.openai_agents.session import NousSession
from nous_actor.integrations.openai_agents.shared import _Mutex as _Mutex
from nous_actor.integrations.openai_agents.turn import RunTurn

__all__ = [
    "CLEARED_KEY",
    "ITEM_KEY",
    "OP_KEY",
    "NousSession",
    "NousSessionClosed",
    "RunTurn",
    "event_for_item",
    "items_from_messages",
    "items_of_message",
]
