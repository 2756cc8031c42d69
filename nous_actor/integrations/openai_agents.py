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
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import os
import threading
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import coerce_session_settings
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "nous_actor.integrations.openai_agents needs the OpenAI Agents SDK; "
        "install it with: pip install 'nous-actor[openai-agents]'"
    ) from exc

from nous_actor.core._frozen import NotJSON, freeze, thaw
from nous_actor.core.event import Event, EventType, InvalidEvent
from nous_actor.core.ids import check_session_id
from nous_actor.core.message import Message, Role, tool_call_parts
from nous_actor.errors import CallTimeout, SessionCrashed, SessionStopped
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle import Session, SessionHandle
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import Turn, check_turn_args
from nous_actor.sessions.turns import DEFAULT_LEASE, Policy
from nous_actor.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from agents.memory import Session as AgentsSession

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

T = TypeVar("T")

ITEM_KEY: Final = "openai_item"
"""Key of `metadata` under which an item's event keeps the item verbatim."""

CLEARED_KEY: Final = "openai_cleared"
"""Key of `metadata` that marks a cleared marker (it stands for no item); its value
names the call that wrote it, `"clear_session"` or `"pop_item"`."""

OP_KEY: Final = "openai_session_op"
"""Top-level `data` key (not projected, kept in the log) recording which call wrote a
replace and what it hid, for audit: `{"op": "pop_item", "popped_seq": 7}`, ..."""

MAX_ATTEMPTS: Final = 5
"""How often a call is sent again when its session stopped before applying it."""

_TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})

Pending = list[tuple[EventType, dict[str, Any]]]


class NousSessionClosed(SessionStopped, RuntimeError):
    """A call on a `NousSession` after its `close()`.

    A `SessionStopped` like every stopped call of this library, and a
    `RuntimeError` like a call on a closed session of the SDK's own
    (`SQLiteSession` raises ``RuntimeError("SQLiteSession is closed")``), so
    code written for either catches it. Nothing was applied: make a new
    `NousSession` to go on.
    """


# -- items -> events ------------------------------------------------------------------------


def event_for_item(item: Mapping[str, Any]) -> tuple[EventType, dict[str, Any]]:
    """The event type and data that keep `item` (a Responses input item).

    `data["metadata"]["openai_item"]` is `item` itself; the other fields are
    its chat view:

    * a message with role `user`: a `user_message` with its `content`;
    * a message with role `system` or `developer`: a `system_message`;
    * a message with role `assistant`: an `assistant_message`;
    * a `function_call`: an `assistant_message` with one tool call
      `{"id": call_id, "name", "arguments"}`;
    * a `function_call_output`: a `tool_result` with the output as `content`
      and `tool_call_id = call_id`;
    * a `reasoning` item: an `assistant_message` whose `reasoning_content` is
      the text of its summary (else of its content);
    * any other `*_call` with a `call_id`: an `assistant_message` with one tool
      call named by its `name` (or its type);
    * any other `*_output` with a `call_id`: a `tool_result`;
    * anything else: an `assistant_message` with no content.

    `content` is the item's string, or the text of its parts joined when every
    part is text (`input_text`, `output_text`, `refusal`), or else its parts in
    the chat-completions shape (`{"type": "text"}`, `{"type": "image_url"}`,
    other parts as they are). Every field has the type `Message` requires,
    whatever the item holds, so no item can make the surface unreadable.
    """
    kind = item.get("type")
    role = item.get("role")
    data: dict[str, Any] = {"metadata": {ITEM_KEY: item}}
    call_id = item.get("call_id")
    if kind in (None, "message") and role in ("user", "system", "developer", "assistant"):
        data["content"] = _chat_content(item.get("content"))
        if role == "user":
            return EventType.USER_MESSAGE, data
        if role == "assistant":
            return EventType.ASSISTANT_MESSAGE, data
        return EventType.SYSTEM_MESSAGE, data
    if kind == "function_call":
        data["content"] = None
        data["tool_calls"] = [
            {"id": call_id, "name": item.get("name"), "arguments": item.get("arguments")}
        ]
        return EventType.ASSISTANT_MESSAGE, data
    if kind == "reasoning":
        data["content"] = None
        data["reasoning_content"] = _joined_text(item.get("summary")) or _joined_text(
            item.get("content")
        )
        return EventType.ASSISTANT_MESSAGE, data
    if isinstance(kind, str) and isinstance(call_id, str):
        if kind.endswith("_output"):
            data["content"] = _output_content(item.get("output"))
            data["tool_call_id"] = call_id
            return EventType.TOOL_RESULT, data
        if kind.endswith("_call"):
            name = item.get("name")
            data["content"] = None
            data["tool_calls"] = [
                {
                    "id": call_id,
                    "name": name if isinstance(name, str) else kind,
                    "arguments": _call_arguments(item),
                }
            ]
            return EventType.ASSISTANT_MESSAGE, data
    if kind == "function_call_output":  # without a str call_id
        data["content"] = _output_content(item.get("output"))
        return EventType.TOOL_RESULT, data
    data["content"] = None
    return EventType.ASSISTANT_MESSAGE, data


def _part_text(part: Any) -> str | None:
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        text = part.get("text")
    elif kind == "refusal":
        text = part.get("refusal")
    else:
        return None
    return text if isinstance(text, str) else None


def _chat_part(part: Any) -> Any:
    text = _part_text(part)
    if text is not None:
        if part.get("type") == "refusal":
            return {"type": "refusal", "refusal": text}
        return {"type": "text", "text": text}
    if isinstance(part, Mapping) and part.get("type") == "input_image":
        url = part.get("image_url")
        if isinstance(url, str):
            image: dict[str, Any] = {"url": url}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            return {"type": "image_url", "image_url": image}
    return part


def _chat_content(value: Any) -> str | list[Any] | None:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return None
    texts = [_part_text(p) for p in value]
    if all(t is not None for t in texts):
        return "".join(cast(list[str], texts))
    return [_chat_part(p) for p in value]


def _joined_text(parts: Any) -> str | None:
    if not isinstance(parts, list):
        return None
    texts = [p["text"] for p in parts if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
    return "\n".join(cast(list[str], texts)) if texts else None


def _output_content(output: Any) -> str | list[Any] | None:
    if output is None or isinstance(output, (str, list)):
        return _chat_content(output)
    return json.dumps(output, ensure_ascii=False)


def _call_arguments(item: Mapping[str, Any]) -> str:
    for key in ("arguments", "input"):
        if isinstance(item.get(key), str):
            return cast(str, item[key])
    rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status", "name")}
    return json.dumps(rest, ensure_ascii=False)


# -- messages -> items ----------------------------------------------------------------------


def items_of_message(message: Message) -> list[dict[str, Any]]:
    """The Responses input items one surface message stands for (fresh, plain dicts).

    * a message with `metadata["openai_item"]` (written by `NousSession`): that item;
    * a cleared marker (`metadata["openai_cleared"]`): none;
    * any other message (a compaction summary, a pruned tool result, a seeded
      transcript): its chat content as items: a system or user message, an
      assistant message (when it has content) followed by one `function_call`
      per tool call, a tool message as a `function_call_output`. An assistant
      message with neither gives one empty assistant message.
    """
    meta = message.metadata
    if CLEARED_KEY in meta:
        return []
    item = meta.get(ITEM_KEY)
    if isinstance(item, Mapping):
        return [thaw(item)]
    return _foreign_items(message)


def items_from_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The items of a surface: `items_of_message` of each message, in order.

    For a `NousSession` on a session, `await nous.get_items()` equals
    `items_from_messages(await handle.derive_messages())` of that session.
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        out.extend(items_of_message(m))
    return out


def _foreign_items(m: Message) -> list[dict[str, Any]]:
    if m.role is Role.TOOL:
        return [
            {
                "type": "function_call_output",
                "call_id": m.tool_call_id,
                "output": _responses_content(m.content, "input_text"),
            }
        ]
    if m.role is not Role.ASSISTANT:
        return [{"role": m.role.value, "content": _responses_content(m.content, "input_text")}]
    out: list[dict[str, Any]] = []
    if m.content not in (None, "", []):
        out.append({"role": "assistant", "content": _responses_content(m.content, "output_text")})
    for call in m.tool_calls:
        cid, name, args = tool_call_parts(call)
        arguments = args if isinstance(args, str) else json.dumps(thaw(args), ensure_ascii=False)
        out.append({"type": "function_call", "call_id": cid, "name": name, "arguments": arguments})
    return out or [{"role": "assistant", "content": ""}]


def _responses_content(content: Any, text_type: str) -> Any:
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    texts = [_part_text(p) for p in content]
    if all(t is not None for t in texts):
        return "".join(cast(list[str], texts))
    parts: list[Any] = []
    for p, text in zip(content, texts, strict=True):
        if text is not None:
            parts.append({"type": text_type, "text": text})
        elif isinstance(p, Mapping) and p.get("type") == "image_url":
            image = p.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            detail = image.get("detail") if isinstance(image, Mapping) else None
            parts.append({"type": "input_image", "image_url": url, "detail": detail or "auto"})
        else:
            parts.append(thaw(p))
    return parts


def _is_marker(ev: Event) -> bool:
    meta = ev.data.get("metadata")
    return isinstance(meta, Mapping) and CLEARED_KEY in meta


def _marker(op: str, start: int, stop: int, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": None,
        "metadata": {CLEARED_KEY: op},
        "surface_op": ["replace", start, stop],
        OP_KEY: record,
    }


# -- one lock per session, for coroutines on any loop in any thread ---------------------------


class _Mutex:
    """A lock that coroutines hold across awaits, from any event loop in any thread.

    Waiters are served first come, first served. A waiter cancelled (or timed
    out) while the lock is handed to it passes the lock on: it is never lost.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = False
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def acquire(self, timeout: float, session_id: str) -> None:
        """Wait at most `timeout` seconds for the lock.

        Raises:
            CallTimeout: not acquired in time (the lock is not taken).
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._held:
                self._held = True
                return
            waiter: asyncio.Future[None] = loop.create_future()
            entry = (loop, waiter)
            self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except BaseException as exc:
            with self._lock:
                try:
                    self._waiters.remove(entry)
                    handed = False
                except ValueError:
                    handed = True
            if handed and waiter.done() and not waiter.cancelled():
                self.release()  # it was ours already: pass it on
            # (handed but cancelled: _wake finds it cancelled and passes it on)
            if isinstance(exc, TimeoutError):
                raise CallTimeout(
                    session_id,
                    f"another call on this session held it for more than {timeout:g} s",
                ) from None
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, waiter = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._wake, waiter)
                except RuntimeError:  # its loop is closed: the next one
                    continue
                return
            self._held = False

    def _wake(self, waiter: asyncio.Future[None]) -> None:
        if waiter.cancelled():
            self.release()
        else:
            waiter.set_result(None)


@dataclass(eq=False)
class _Shared:
    """What every `NousSession` of one session id in one registry shares."""

    lock: _Mutex = field(default_factory=_Mutex)
    # Whether the surface may end in a cleared marker that the next add_items
    # replaces: None unknown (read the surface), False no.
    marker: bool | None = None
    # Whether a turn was ever opened on it here: then a call outside any turn first
    # waits for an open turn to end, before it takes the lock.
    turns: bool = False


# The turns the running task is in: which session (its `_Shared`) and through what.
_IN_TURN: contextvars.ContextVar[tuple[tuple[_Shared, Turn], ...]] = contextvars.ContextVar(
    "nous_actor_openai_turns", default=()
)


def _turn_of(shared: _Shared) -> Turn | None:
    for key, turn in _IN_TURN.get():
        if key is shared:
            return turn
    return None


_SHARED_LOCK = threading.Lock()
_SHARED: weakref.WeakKeyDictionary[Sessions, weakref.WeakValueDictionary[str, _Shared]] = (
    weakref.WeakKeyDictionary()
)


def _shared_for(sessions: Sessions, session_id: str) -> _Shared:
    with _SHARED_LOCK:
        by_id = _SHARED.get(sessions)
        if by_id is None:
            by_id = _SHARED[sessions] = weakref.WeakValueDictionary()
        shared = by_id.get(session_id)
        if shared is None:
            shared = by_id[session_id] = _Shared()
        return shared


# -- registries opened by NousSession.sqlite, one per file ----------------------------------


@dataclass(eq=False)
class _Owned:
    key: str | None
    store: SQLiteStore
    sessions: Sessions
    users: int = 1


_OWNED_LOCK = threading.Lock()
_OWNED: dict[str, _Owned] = {}


def _acquire_registry(path: str | Path) -> _Owned:
    if str(path) == ":memory:":
        store = SQLiteStore(":memory:")
        return _Owned(None, store, Sessions(store))
    key = str(Path(path).expanduser().resolve())
    with _OWNED_LOCK:
        owned = _OWNED.get(key)
        if owned is not None:
            owned.users += 1
            return owned
        store = SQLiteStore(key)
        owned = _OWNED[key] = _Owned(key, store, Sessions(store))
        return owned


def _release_registry(owned: _Owned) -> None:
    with _OWNED_LOCK:
        owned.users -= 1
        if owned.users > 0:
            return
        if owned.key is not None and _OWNED.get(owned.key) is owned:
            del _OWNED[owned.key]
    try:
        owned.sessions.close()
    finally:
        owned.store.close()


# -- the session ------------------------------------------------------------------------------


class NousSession:
    """The Agents SDK's `Session` protocol over session `session_id` of `sessions`.

    Pass it wherever the SDK takes a session (`Runner.run(agent, input,
    session=...)`). Any number of `NousSession` objects, coroutines, event
    loops and threads may use one session at once: within one registry, the
    calls on one session id run one at a time, in arrival order.

    Guarantees:

    * When `add_items` returns, every item is durably stored (committed by
      the registry's store), after everything stored before it, and the items
      of one call are contiguous: no other `NousSession` call lands between
      them.
    * Items round-trip exactly: `get_items` returns plain dicts equal to the
      ones given (JSON values: a tuple comes back as a list).
    * `get_items() == items_from_messages(handle.derive_messages())`, always.
    * Nothing is ever deleted: `pop_item` and `clear_session` append replaces.
    * A crash of the session is survived: the registry restarts it from the
      store, and a call it refused (`SessionStopped`, not applied) is sent
      again, up to `MAX_ATTEMPTS` times, keeping the items' order.
    * Calls never block the event loop (opening or reopening the session runs
      in a worker thread); every wait is bounded by the registry's `timeout`.
    * A mutation that is cancelled (`add_items`, `pop_item`, `clear_session`)
      finishes first, as the SDK's own sessions do, then raises
      `CancelledError`; one cancelled while waiting for its turn does nothing.

    Args:
        session_id: the session's id (see `nous_actor.core.ids`).
        sessions: the registry that runs the session; its store keeps it.
        session_settings: the SDK's `SessionSettings` (or a dict of them); its
            `limit` is the default of `get_items`.

    Every argument is checked here, before anything is opened.

    Raises:
        TypeError: `session_id` is not a str; `sessions` is not a
            `nous_actor.Sessions`; `session_settings` is not a
            `SessionSettings`, a dict or None, holds a key `SessionSettings`
            does not have (``Unknown session settings: limitt``, as the SDK
            says), or a `limit` that is not an int or None.
        ValueError: `session_id` is not a valid id, or the settings' `limit`
            is below 1 (give None for every item).
    """

    session_id: str
    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        sessions: Sessions,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = check_session_id(session_id)
        if not isinstance(sessions, Sessions):
            raise TypeError(
                "NousSession takes a nous_actor.Sessions registry, got "
                f"{type(sessions).__name__}; or use NousSession.sqlite(session_id, path)"
            )
        self.session_settings = _settings(session_settings)
        self.sessions = sessions
        self._shared = _shared_for(sessions, self.session_id)
        self._handle: Session | None = None
        self._owned: _Owned | None = None
        self._closed = False

    @classmethod
    def sqlite(
        cls,
        session_id: str,
        path: str | Path,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> NousSession:
        """A session on the SQLite store at `path`, under a registry opened for it.

        The drop-in for `SQLiteSession(session_id, path)`. Every
        `NousSession.sqlite` on one file in this process shares one store and
        one registry (so the same id may be opened twice); `close()` of the
        last one closes them. `":memory:"` opens a store of its own each time.
        To choose the registry's settings, or run many sessions, open a
        `Sessions` yourself and pass it to `NousSession(...)`.

        Every argument is checked before the file is opened.

        Raises:
            TypeError: `session_id` is not a str, `path` is not a str or a
                path, or `session_settings` is not what `NousSession` takes.
            ValueError: `session_id` is not a valid id, `path` is empty, or
                the settings' `limit` is below 1.
            StoreError: the file cannot be opened as a store (for instance,
                another application's database, which is left unchanged).
        """
        check_session_id(session_id)
        settings = _settings(session_settings)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(
                f"NousSession.sqlite takes the SQLite file as a str or a pathlib.Path "
                f"(or ':memory:'), got {type(path).__name__}"
            )
        if not str(path):
            raise ValueError(
                "NousSession.sqlite got an empty path; give the SQLite file, e.g. "
                "'chat.db', or ':memory:' for a store in memory"
            )
        owned = _acquire_registry(path)
        try:
            session = cls(session_id, owned.sessions, session_settings=settings)
        except BaseException:
            _release_registry(owned)
            raise
        session._owned = owned
        return session

    def close(self) -> None:
        """Stop using this object; later calls raise `NousSessionClosed`.

        For `NousSession.sqlite`, the last one of a file closes its registry
        (stopping its sessions; blocks until they stopped) and its store. A
        registry passed in stays open: it is yours.
        """
        if self._closed:
            return
        self._closed = True
        owned, self._owned = self._owned, None
        if owned is not None:
            _release_registry(owned)

    def __repr__(self) -> str:
        return f"<NousSession {self.session_id!r}>"

    # -- the SDK's protocol -----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with `limit`, only the latest `limit` of them.

        `limit=None` takes `session_settings.limit`; `0` gives `[]`; a negative
        limit gives every item (as `SQLiteSession`). The items are fresh plain
        dicts, the caller's to change. They are exactly
        `items_from_messages(derive_messages())` of the session, read after
        every call made on it before this one. While this process does not
        hold the session (another web worker does, or nobody), the committed
        history is read from the store without taking it (`Sessions.read`).

        Raises:
            TypeError: `limit` is not an int or `None`.
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            CallTimeout: no answer within the registry's `timeout`.
        """
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
        self._check_open()
        await self._shared.lock.acquire(self.sessions.timeout, self.session_id)
        try:
            handle = self._handle
            if _turn_of(self._shared) is None and (handle is None or not handle.is_alive()):
                # Not held here (another worker process may hold it): read the committed
                # history without taking the session.
                messages = await self.sessions.read(self.session_id).derive_messages()
            else:
                messages = await self._read(SessionHandle.derive_messages)
        finally:
            self._shared.lock.release()
        if limit is None or limit < 0:
            items = items_from_messages(messages)
        elif limit == 0:
            items = []
        else:  # map only the tail that holds the latest `limit` items
            tail: list[list[dict[str, Any]]] = []
            found = 0
            for m in reversed(messages):
                its = items_of_message(m)
                tail.append(its)
                found += len(its)
                if found >= limit:
                    break
            items = [it for its in reversed(tail) for it in its][-limit:]
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append `items` to the session, in order, as one contiguous run.

        Every item is checked before anything is sent: a bad one stores
        nothing. When this returns, every item is durably stored (with a
        store, committed). Items are appended pipelined, so a batch usually
        shares one commit.

        If the session crashes meanwhile, the items it had applied stay, and
        the ones it refused (not applied) are sent again, in order, to the
        restarted session; if it still fails, the error is raised and the
        leading items that were acknowledged stay stored (`get_items` shows
        which).

        Raises:
            TypeError: `items` is not a list, or an item is not a dict (the
                message names its index); nothing was stored.
            InvalidEvent: an item holds a value JSON cannot carry (a set,
                bytes, NaN, a non-str key, ...; reason
                `unserializable_event_data`, the message names the path, e.g.
                `items[2]['content']`); nothing was stored.
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            StoreError: the store failed; the items not acknowledged may or
                may not be stored.
            CallTimeout: no answer within the registry's `timeout`.
        """
        pending = _prepare(items)
        self._check_open()
        if not pending:
            return

        async def body() -> None:
            shared = self._shared
            if shared.marker is not False:
                surface = await self._read(SessionHandle.surface)
                if surface and _is_marker(surface[-1]):
                    last = surface[-1]
                    etype, data = pending[0]
                    pending[0] = (
                        etype,
                        {
                            **data,
                            "surface_op": ["replace", last.position, last.position],
                            OP_KEY: {"op": "add_items", "replaces_seq": last.seq},
                        },
                    )
            await self._append(pending, datetime.now(UTC))
            shared.marker = False

        await self._mutate(body)

    async def pop_item(self) -> TResponseInputItem | None:
        """Hide the most recent item and return it (as added), or `None` if there is none.

        Nothing is deleted: this appends one replace, durably stored when this
        returns. It covers the range from the previous surface message to the
        popped one and holds a copy of the previous message (same data, same
        time), so the surface loses exactly the popped item; popping the only
        item appends a cleared marker instead. An empty session appends nothing.
        A message written by other code that stands for several items (an
        assistant message with tool calls) is replaced by itself without its
        last tool call.

        Raises:
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            StoreError: the store failed; the pop may or may not be stored.
            CallTimeout: no answer within the registry's `timeout`.
            RuntimeError: the surface holds events of other code that share
                the popped item's position, so it cannot be hidden alone;
                nothing was appended.
        """
        self._check_open()

        async def body() -> dict[str, Any] | None:
            surface = await self._read(SessionHandle.surface)
            plan = _plan_pop(surface)
            if plan is None:
                return None
            popped, etype, data, time = plan
            await self._append([(etype, data)], time)
            meta = data.get("metadata")
            if isinstance(meta, Mapping) and CLEARED_KEY in meta:
                self._shared.marker = True
            return popped

        return cast("TResponseInputItem | None", await self._mutate(body))

    async def clear_session(self) -> None:
        """Hide every item; the session's history stays in the log.

        Appends one cleared marker that replaces every surface message
        (durably stored when this returns); a session with no item appends
        nothing. The next `add_items` replaces the marker, so the surface holds
        only what was added after the clear.

        Raises:
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            StoreError: the store failed; the clear may or may not be stored.
            CallTimeout: no answer within the registry's `timeout`.
        """
        self._check_open()

        async def body() -> None:
            surface = await self._read(SessionHandle.surface)
            count = sum(len(items_of_message(_message(ev))) for ev in surface)
            if not count:
                return
            stop = max(ev.position for ev in surface)
            record = {"op": "clear_session", "items": count}
            data = _marker("clear_session", 0, stop, record)
            await self._append([(EventType.SYSTEM_MESSAGE, data)], datetime.now(UTC))
            self._shared.marker = True

        await self._mutate(body)

    # -- beyond the protocol -------------------------------------------------------------

    async def open(self) -> Session:
        """The `nous_actor` handle of this session, for compaction, fork, audit, reads.

        Opens (or reopens) the session in a worker thread if it is not running.

        Raises:
            NousSessionClosed: this object is closed (a `SessionStopped` and a
                `RuntimeError`, as the SDK's own sessions raise).
            SessionStopped: the registry is closed, or it gave the session up.
            TooManySessions, ConflictError, StoreError: as `Sessions.open`.
        """
        self._check_open()
        await self._shared.lock.acquire(self.sessions.timeout, self.session_id)
        try:
            return await self._live()
        finally:
            self._shared.lock.release()

    def turn(
        self,
        policy: Policy = "enqueue",
        *,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        note: str | None = None,
    ) -> RunTurn:
        """A turn for one run: ``async with session.turn(): await Runner.run(...)``.

        Inside the block, this object's calls (in this task and the tasks it
        starts) go through one turn of the session (see
        `nous_actor.SessionHandle.turn` for ``policy``, ``owner``, ``lease``,
        ``timeout`` and ``note``), so no other run's items come between the
        run's own. Without it, each call is serialised but runs may
        interleave (the SDK never says when a run starts or ends).

        Raises:
            ValueError, TypeError: bad arguments (raised here).
            NousSessionClosed: this object is closed.
        """
        check_turn_args(policy, owner, lease, timeout, note)
        self._check_open()
        return RunTurn(self, policy, owner, lease, timeout, note)

    # -- plumbing ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise NousSessionClosed(
                self.session_id, "this NousSession is closed; make a new one to go on"
            )

    async def _mutate(self, body: Callable[[], Awaitable[T]]) -> T:
        """Run `body` holding the session's lock; once started, it finishes even if the
        caller is cancelled (then the cancellation is raised)."""
        shared = self._shared
        if shared.turns and _turn_of(shared) is None:
            # Outside any turn, while turns are used here: wait for the open one to
            # end before taking the lock (a write waiting for it would hold the lock
            # the turn's own calls need).
            await self._wait_for_turn()
        await shared.lock.acquire(self.sessions.timeout, self.session_id)

        async def locked() -> T:
            try:
                return await body()
            except BaseException:
                shared.marker = None  # what was stored is not known for sure
                raise
            finally:
                shared.lock.release()

        task = asyncio.ensure_future(locked())
        cancelled: BaseException | None = None
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError as exc:
                cancelled = cancelled or exc
        if cancelled is not None:
            if not task.cancelled():
                task.exception()  # observed
            raise cancelled
        return task.result()

    async def _live(self) -> Session:
        """The handle, with its session running (started or restarted off the loop)."""
        handle = self._handle
        if handle is None:
            handle = self._handle = await asyncio.to_thread(self._open_handle)
        elif not handle.is_alive():
            await asyncio.to_thread(_reopen, handle)
        return handle

    def _open_handle(self) -> Session:
        handle = self.sessions.open(self.session_id)
        handle.is_alive()  # resolves its actor here, in the worker thread
        return handle

    async def _wait_for_turn(self) -> None:
        """Answered once no turn is open (an empty append waits like a write)."""
        await self._read(lambda h: h.append_many([]))

    async def _read(self, read: Callable[[SessionHandle], SessionFuture[T]]) -> T:
        turn = _turn_of(self._shared)
        if turn is not None:
            return await read(turn)
        for attempt in range(MAX_ATTEMPTS):
            handle = await self._live()
            try:
                return await read(handle)
            except SessionStopped as exc:
                if not _refused(exc) or attempt == MAX_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _append(self, pending: Pending, time: datetime) -> None:
        """Append `pending` in order; resend the part a stopped session refused."""
        turn = _turn_of(self._shared)
        if turn is not None:  # one atomic batch through the turn; never sent again
            await turn.append_many([(etype, data, time) for etype, data in pending])
            return
        for attempt in range(MAX_ATTEMPTS):
            handle = await self._live()
            done, error, clean = await _append_pinned(handle, pending, time)
            if error is None:
                return
            if not (clean and _refused(error)) or attempt == MAX_ATTEMPTS - 1:
                raise error
            pending = pending[done:]


class RunTurn:
    """What `NousSession.turn` returns: ``async with`` it around one run.

    Entering opens a turn on the session (waiting, per its policy, for one
    open already) and makes the `NousSession`'s calls in this task (and the
    tasks it starts) go through it; leaving closes it (``how: "failed"`` if
    the block raised). ``turn`` is the `nous_actor.Turn` while open.
    """

    def __init__(
        self,
        session: NousSession,
        policy: str,
        owner: str | None,
        lease: float,
        timeout: float | None,
        note: str | None,
    ) -> None:
        self._session = session
        self._args = (policy, owner, lease, timeout, note)
        self.turn: Turn | None = None
        self._token: contextvars.Token[tuple[tuple[_Shared, Turn], ...]] | None = None

    async def __aenter__(self) -> RunTurn:
        session = self._session
        session._check_open()
        if self.turn is not None:
            raise RuntimeError("a RunTurn is used once: call session.turn() for each run")
        policy, owner, lease, timeout, note = self._args
        shared = session._shared
        if _turn_of(shared) is not None:
            raise RuntimeError(
                f"this task is in a turn of session {session.session_id!r} already; "
                "turns do not nest"
            )
        shared.turns = True
        handle = await session._live()
        turn = handle.turn(policy, owner=owner, lease=lease, timeout=timeout, note=note)  # type: ignore[arg-type]
        await turn.aopen()
        self.turn = turn
        self._token = _IN_TURN.set((*_IN_TURN.get(), (shared, turn)))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        token, self._token = self._token, None
        if token is not None:
            _IN_TURN.reset(token)
        if self.turn is not None:
            await self.turn.__aexit__(exc_type, *exc)


def _reopen(handle: Session) -> None:
    handle.count().get()  # any call restarts a stopped session of a registry


def _refused(exc: BaseException) -> bool:
    """Whether the call was refused before it was applied (so sending it again is safe)."""
    return isinstance(exc, SessionStopped) and not isinstance(exc, SessionCrashed)


async def _append_pinned(
    handle: Session, pending: Pending, time: datetime
) -> tuple[int, BaseException | None, bool]:
    """Send every append of `pending` to the session's current actor, pipelined.

    Returns how many leading appends were acknowledged, the first error, and
    whether every append after the first error failed too (the ones a stopped
    session refused); then resending the rest keeps the order.
    """
    # The one place this module reaches inside a handle: the appends are pinned
    # to the actor the session has now, as nous_actor.sessions.faults.crash_amid does. A
    # registry handle re-resolves a stopped actor on each call, so without the
    # pin an append sent after a crash would reach the restarted session while
    # earlier ones were refused, and the items would land out of order. The pin
    # keeps the handle's touch, so that the registry sees the session in use.
    try:
        ref = handle._actor()
    except SessionStopped as exc:
        return 0, exc, True
    if ref is None:
        return 0, SessionStopped(handle.session_id, "the session is stopped"), True
    pinned = Session(handle.session_id, lambda: ref, timeout=handle.timeout, touch=handle._touch)
    futures = [pinned.append(etype, data, time) for etype, data in pending]
    done = 0
    error: BaseException | None = None
    clean = True
    for fut in futures:  # every future is awaited, so none is left unobserved
        try:
            await fut
        except Exception as exc:
            if error is None:
                error = exc
            clean = clean and _refused(exc)
        else:
            if error is None:
                done += 1
            else:
                clean = False
    return done, error, clean


def _message(ev: Event) -> Message:
    m = ev.to_message()
    assert m is not None  # surface events project
    return m


def _plan_pop(
    surface: Sequence[Event],
) -> tuple[dict[str, Any], EventType, dict[str, Any], datetime] | None:
    """What `pop_item` appends: `(popped item, type, data, time)`, or `None` if empty."""
    per = [items_of_message(_message(ev)) for ev in surface]
    last = next((i for i in range(len(per) - 1, -1, -1) if per[i]), None)
    if last is None:
        return None
    ev, items = surface[last], per[last]
    popped = items[-1]
    keep: Event | None
    if len(items) > 1:  # another writer's assistant message: drop its last tool call
        keep, lo = ev, ev.position
        data = thaw(ev.data)
        data["tool_calls"] = data["tool_calls"][:-1]
        etype, time = ev.type, ev.time
    elif last > 0:  # a copy of the previous message stands in for both
        keep = surface[last - 1]
        lo = keep.position
        data = thaw(keep.data)
        etype, time = keep.type, keep.time
    else:
        keep, lo = None, ev.position
        data = _marker("pop_item", 0, 0, {})
        etype, time = EventType.SYSTEM_MESSAGE, datetime.now(UTC)
    hi = ev.position
    for other, its in zip(surface, per, strict=True):
        if other is not ev and other is not keep and its and lo <= other.position <= hi:
            raise RuntimeError(
                f"cannot pop the item of seq {ev.seq}: event seq {other.seq}, written by other "
                f"code, shares its surface position range {lo}..{hi}; nothing was appended"
            )
    data["surface_op"] = ["replace", lo, hi]
    data[OP_KEY] = {"op": "pop_item", "popped_seq": ev.seq}
    return popped, etype, data, time


def _prepare(items: object) -> Pending:
    """Check every item and build its event; raise before anything is sent."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes, bytearray)):
        raise TypeError(
            f"add_items takes a list of items (dicts), got {type(items).__name__}; "
            "nothing was stored"
        )
    pending: Pending = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TypeError(
                f"add_items: item {i} is a {type(item).__name__}, not a dict "
                "(a Responses input item); nothing was stored"
            )
        try:
            frozen = freeze(item, f"items[{i}]")
        except NotJSON as exc:
            raise InvalidEvent(
                "unserializable_event_data", f"add_items: item {i}: {exc}; nothing was stored"
            ) from None
        pending.append(event_for_item(frozen))
    return pending


def _settings(value: SessionSettings | Mapping[str, Any] | None) -> SessionSettings:
    """The checked settings: unknown keys and bad limits refused, as the SDK's
    `coerce_session_settings` refuses them (and more strictly for `limit`)."""
    if value is None:
        settings = SessionSettings()
    elif isinstance(value, SessionSettings):
        settings = value
    elif isinstance(value, Mapping):
        known = {f.name for f in dataclasses.fields(SessionSettings) if f.init}
        unknown = sorted(str(k) for k in value if k not in known)
        if unknown:
            raise TypeError(
                f"Unknown session settings: {', '.join(unknown)}; SessionSettings takes "
                f"{', '.join(sorted(known))}"
            )
        _check_limit(value.get("limit"))
        settings = coerce_session_settings(dict(value))
    else:
        raise TypeError(
            f"session_settings must be an agents SessionSettings, a dict or None, "
            f"got {type(value).__name__}"
        )
    _check_limit(settings.limit)
    return settings


def _check_limit(limit: object) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(
            f"session_settings limit must be an int (how many of the latest items "
            f"get_items returns) or None (every item), got {type(limit).__name__}"
        )
    if limit < 1:
        raise ValueError(
            f"session_settings limit must be at least 1, got {limit}; give None for every "
            "item (get_items(limit=0) still gives none for one call)"
        )


if TYPE_CHECKING:  # mypy checks that NousSession is a Session of the SDK

    def _is_a_session(session: NousSession) -> AgentsSession:
        return session
