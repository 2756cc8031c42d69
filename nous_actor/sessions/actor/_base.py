"""The bottom of the session's actor: the shapes its calls take, and its state.

`SessionState` is the base of every part of `SessionActor`: it declares the
attributes the actor keeps (its ``__slots__`` are in `SessionActor`) and, for
the type checker, the methods one part calls on another. Nothing here imports
the other modules of the package.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nous_actor.core._frozen import safe_str
from nous_actor.core.event import Event, EventType
from nous_actor.errors import SessionCrashed
from nous_actor.sessions.turns import DEFER
from nous_actor.supervision import DispatchedSupervisedActor

if TYPE_CHECKING:
    from nous_actor.core.log import Log
    from nous_actor.errors import SessionStopped, StoreError
    from nous_actor.runtime.flag import Flag
    from nous_actor.sessions.future import SessionFuture
    from nous_actor.sessions.turns import TurnTable
    from nous_actor.store.base import Store
    from nous_actor.store.committer import Committer
    from nous_actor.store.subscription import Subscription

Handler = Callable[..., Any]


_DEFER: Any = DEFER  # a handler's result meaning "the future is answered later"
_NONE: Any = deque(maxlen=0)  # "no parked call": shared by every session until one parks

EventParts = tuple[EventType, datetime, Any, Any]
"""An event checked and frozen in the caller's thread, waiting for its seq."""


class _Envelope:
    """What Pykka's actor loop reads from the inbox (``message``, ``reply_to``); our calls
    carry their own future, so ``reply_to`` is always ``None``."""

    __slots__ = ("message", "reply_to")

    def __init__(self, message: Any) -> None:
        self.message = message
        self.reply_to = None


class SessionState(DispatchedSupervisedActor):
    """What every part of `SessionActor` sees of the actor (declarations only)."""

    __slots__ = ()

    if TYPE_CHECKING:
        session_id: str
        log: Log
        store: Store | None
        committer: Committer | None
        claim_token: str | None
        next_seq: int
        inflight: deque[Event]
        parked: deque[tuple[Handler, tuple[Any, ...], SessionFuture[Any] | None]]
        failed: StoreError | None
        subscribers: list[Subscription]
        turns: TurnTable | None
        crash: BaseException | None
        crash_on_store_failure: bool
        released: Flag
        _ready: SessionFuture[None] | None
        _trace_links: list[object] | None
        _fut: SessionFuture[Any] | None
        _done: list[tuple[tuple[Event, ...], StoreError | None]]
        _done_lock: threading.Lock
        _want_wake: bool
        _wake_sent: bool
        _store_ops: int
        _shutting: bool
        _feed_error: SessionStopped | None
        _compacting: dict[str, SessionFuture[Any] | None]
        _compaction_ids: dict[str, int] | None
        _compaction_times: dict[str, list[Any]] | None
        _loading: bool
        _closing_subs: list[Subscription]

        # The actor's loop (`SessionActor`).
        def _run(
            self, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any] | None
        ) -> None: ...
        def _park(self) -> deque[tuple[Handler, tuple[Any, ...], SessionFuture[Any] | None]]: ...
        def _adopted(self, log: Log) -> None: ...
        def _start_failed(self, exc: BaseException) -> None: ...
        def _die(
            self, exc: BaseException, event: str = "session.crashed", log: bool = True
        ) -> None: ...

        # The store-facing side (`StoreSide`).
        def h_committed(self) -> None: ...
        def _submit(self, events: tuple[Event, ...], result: Any) -> Any: ...
        def _store_op_done(self) -> None: ...

        # The writes (`Writes`) and the turn table (`TurnHost`).
        def _check_writable(self) -> None: ...
        def _turns_shut(self, err: SessionStopped) -> None: ...


def _compaction_id_of(ev: Event) -> str | None:
    data = ev.data
    if data.get("step") != "compaction":
        return None
    cid = data.get("compaction_id")
    return cid if isinstance(cid, str) else None


_safe_str = safe_str


def _crashed(session_id: str, exc: BaseException) -> SessionCrashed:
    err = SessionCrashed(session_id, f"crashed with {type(exc).__name__}: {_safe_str(exc)}")
    err.__cause__ = exc
    return err
