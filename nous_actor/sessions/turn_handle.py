"""The caller's side of a turn: what ``session.turn(...)`` returns.

See `nous_actor.sessions.turns` for what the session's actor keeps and
guarantees. A `Turn` has every call method of the handle it came from (both
are `nous_actor.sessions.handle.SessionCalls`), with the same checks in the
caller's thread; each call is sent through the turn, so it fails with
`nous_actor.TurnInterrupted` once the turn is no longer open, and renews
the turn's lease. A turn is no handle: it opens no turn and stops no session
(`TurnSender` is what it needs of the handle it was opened on).
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any, NoReturn, Protocol

from nous_actor.core.args import MAX_SECONDS
from nous_actor.core.event import Event
from nous_actor.runtime import scheduling, telemetry
from nous_actor.runtime.unique import unique_hex
from nous_actor.sessions.actor import (
    _WAIT_FOR_COMMITS,
    THROUGH,
    Handler,
    SessionActor,
    _Compaction,
)
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.handle._calls import SessionCalls
from nous_actor.sessions.turns import (
    DEFAULT_LEASE,
    DEFAULT_ROLLBACK_NOTE,
    POLICIES,
    TurnRequest,
)
from nous_actor.sessions.turns._blocks import entered, left
from nous_actor.sessions.turns._granted import not_running, running
from nous_actor.store.subscription import Subscription

__all__ = ["Turn", "TurnSender", "check_turn_args", "default_owner"]

_HOST = socket.gethostname()
_READ_LIKE = frozenset(h.__name__ for h in _WAIT_FOR_COMMITS)

_NEW, _OPENING, _OPEN, _ENDED = range(4)


def default_owner() -> str:
    """Who opens a turn, unless told: host, process, thread (and asyncio task)."""
    who = f"{_HOST} pid {os.getpid()} {threading.current_thread().name}"
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return who if task is None else f"{who} task {task.get_name()}"


def _seconds(value: object, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value <= MAX_SECONDS
        or value != value
    ):
        raise ValueError(
            f"{what} must be a finite number of seconds > 0 and at most "
            f"threading.TIMEOUT_MAX (about 292 years), got {value!r}"
        )
    return float(value)


def check_turn_args(
    policy: object, owner: object, lease: object, timeout: object, note: object
) -> None:
    """Raise ``TypeError``/``ValueError`` (saying what to pass) unless these are the
    arguments ``turn()`` takes."""
    if not isinstance(policy, str) or policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(map(repr, POLICIES))}; got {policy!r}")
    if owner is not None:
        if not isinstance(owner, str):
            raise TypeError(f"owner must be a str naming the turn's holder, got {owner!r}")
        if not owner.strip():
            raise ValueError("owner must be a non-empty str (or None for this thread's name)")
    _seconds(lease, "lease")
    if timeout is not None:
        _seconds(timeout, "timeout")
    if note is not None and (not isinstance(note, str) or not note.strip()):
        raise ValueError(
            f"note must be a non-empty str (the rollback's system note), got {note!r}"
        )


class TurnSender(Protocol):
    """What a turn needs of the handle it is opened on (a `nous_actor.SessionHandle`)."""

    session_id: str
    timeout: float

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]: ...

    def _register(self, sub: Subscription, timeout: float) -> None: ...

    def _compact_in_turn(self, req: _Compaction, turn_id: str) -> SessionFuture[Any]: ...

    def is_alive(self) -> bool: ...


class Turn(SessionCalls):
    """One turn on a session: a run that writes the session while no other run does.

    Get one from ``session.turn(...)`` and use it as a context manager::

        with session.turn(owner="run-7") as turn:       # or: async with
            turn.append_message(Message.user("hi")).get()
            ...

    Entering opens the turn (waiting, per its policy, for one already open);
    leaving closes it (``how: "closed"``, or ``"failed"`` when the block
    raised). Inside, write and read through the turn: it has every call
    method of the session's handle. While it is open, writes through the
    plain handle wait for it to end; reads never wait. A plain write from the
    thread (in asyncio, the task) inside this block would wait for its own
    turn: it fails at once with `nous_actor.TurnBusy` (other threads' and
    tasks' writes wait as said).

    Every call through it renews its lease (so does `renew`). Once the turn
    is no longer open — interrupted or rolled back by another turn, expired,
    or the session restarted — every call through it fails with
    `nous_actor.TurnInterrupted` and applies nothing, and so does leaving the
    block normally (its work may have been hidden by a rollback: the error
    says so). A turn is used once.

    A turn whose holder is gone (its process died, or its lease ran out) is
    ended by the session, which does with its half run what the registry's
    ``dangling_turns`` says (by default, each tool call it left without a
    result is answered as interrupted; see `nous_actor.Sessions`).

    Attributes:
        turn_id: the turn's id (in its ``turn_start``/``turn_end`` events).
        owner, policy, lease, wait, note: as given to ``turn()``.
        start_seq: the seq of its ``turn_start``, once open.
    """

    __slots__ = (
        "__weakref__",  # (the turns this process runs: `_granted.running`)
        "_handle",
        "_state",
        "_until",
        "lease",
        "note",
        "owner",
        "policy",
        "start_seq",
        "turn_id",
        "wait",
    )

    def __init__(
        self,
        handle: TurnSender,
        policy: str = "enqueue",
        *,
        owner: str | None = None,
        lease: float = DEFAULT_LEASE,
        timeout: float | None = None,
        note: str | None = None,
    ) -> None:
        # A handle is the one other kind of SessionCalls (a turn's calls go through it).
        if not isinstance(handle, SessionCalls) or isinstance(handle, Turn):
            raise TypeError(
                f"a Turn is opened on a session's handle, got {type(handle).__name__}; "
                "get one with session.turn(...)"
            )
        check_turn_args(policy, owner, lease, timeout, note)
        self._handle: TurnSender = handle
        self.session_id = handle.session_id
        self.timeout = handle.timeout
        self.policy = policy
        self.owner = default_owner() if owner is None else owner
        self.lease = float(lease)
        self.wait = handle.timeout if timeout is None else float(timeout)
        self.note = DEFAULT_ROLLBACK_NOTE if note is None else note
        self.turn_id = unique_hex()
        self.start_seq: int | None = None
        self._state = _NEW
        self._until = 0.0  # while open: when its lease runs out, unless renewed

    # -- opening and closing -------------------------------------------------------------

    def _send_open(self) -> SessionFuture[Event]:
        if self._state != _NEW:
            raise RuntimeError(
                f"turn {self.turn_id!r} was opened already; a turn is used once: "
                "open a new one with session.turn(...)"
            )
        self._state = _OPENING
        req = TurnRequest(
            self.turn_id,
            self.owner,
            self.policy,
            self.lease,
            self.wait,
            self.note,
            telemetry.context(),  # the caller's, for the turn's span
        )
        fut: SessionFuture[Event] = self._handle._call(SessionActor.h_turn_open, req)
        # The wait for the turn, then a call's bound (together, never past a wait's limit).
        fut._timeout = min(self.wait + self.timeout, MAX_SECONDS)
        return fut

    def _opened(self, ev: Event) -> Turn:
        self.start_seq = ev.seq
        self._state = _OPEN
        self._until = scheduling.monotonic() + self.lease  # (renewed by each call)
        running(self.turn_id, self)  # (this process runs it, wherever it was granted)
        return self

    def _not_opened(self, fut: SessionFuture[Event]) -> None:
        self._state = _ENDED
        if not fut.failed():
            # The caller stopped waiting before the session answered (a timeout, a
            # cancel, Ctrl-C, any error of the wait itself), or as it answered: the
            # session may open it still, or did. Have it let go at once, not at the
            # end of the lease (nobody would hold the turn meanwhile).
            self._handle._call(SessionActor.h_turn_end, self.turn_id, "abandoned", None)

    def open(self) -> Turn:
        """Open the turn, waiting (per its policy, at most ``wait`` seconds plus the
        handle's bound) for one already open; returns the turn. ``with`` calls it.

        Raises:
            TurnBusy: another turn is open (policy ``reject``), or stayed open
                for all of ``wait`` (``enqueue``); this turn is not opened.
            CallTimeout: no answer in time (the session lets the turn go).
            RuntimeError: this turn was opened before (a turn is used once).
        """
        fut = self._send_open()
        try:
            ev = fut.get()
        except BaseException:
            self._not_opened(fut)
            raise
        return self._opened(ev)

    async def aopen(self) -> Turn:
        """`open` for asyncio code: awaited without blocking the loop. ``async with``
        calls it; a cancelled open lets the turn go."""
        fut = self._send_open()
        try:
            ev = await fut
        except BaseException:
            self._not_opened(fut)
            raise
        return self._opened(ev)

    def _send_close(self, how: str, error: str | None) -> SessionFuture[Event] | None:
        if self._state != _OPEN:
            return None
        self._state = _ENDED
        not_running(self.turn_id)
        fut: SessionFuture[Event] = self._handle._call(
            SessionActor.h_turn_end, self.turn_id, how, error
        )
        return fut

    def close(self) -> Event | None:
        """Close the turn; returns its ``turn_end`` event (``None`` if it was not open
        from this object's view: never opened, or closed already).

        Raises:
            TurnInterrupted: the turn had ended already (interrupted, rolled
                back, expired, the session restarted): what it wrote after that
                was refused, and a rollback hid what it wrote before. Its message
                names the seq of the turn's ``turn_end`` once that is stored, and
                no seq before (a ``turn_end`` still on its way to the store may
                never be stored).
            StoreError: the session refuses appends after a store failure: the
                turn ends here, no ``turn_end`` could be stored (the session's
                restart ends the turn it finds open in the store).
        """
        fut = self._send_close("closed", None)
        return None if fut is None else fut.get()

    async def aclose(self) -> Event | None:
        """`close` for asyncio code: awaited without blocking the loop."""
        fut = self._send_close("closed", None)
        return None if fut is None else await fut

    def _failed_close(self, exc_type: type[BaseException]) -> SessionFuture[Event] | None:
        return self._send_close("failed", exc_type.__name__)

    def __enter__(self) -> Turn:
        self.open()
        entered(self.turn_id)  # this thread's plain writes now fail at once (see _turn_holds)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        left(self.turn_id)
        if exc_type is None:
            self.close()
            return
        fut = self._failed_close(exc_type)
        if fut is not None:
            try:  # the block's own error is what the caller hears
                fut.get()
            except Exception:
                pass

    async def __aenter__(self) -> Turn:
        await self.aopen()
        entered(self.turn_id)  # this task's plain writes now fail at once
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        left(self.turn_id)
        if exc_type is None:
            await self.aclose()
            return
        fut = self._failed_close(exc_type)
        if fut is not None:
            try:
                await fut
            except Exception:
                pass

    def renew(self) -> SessionFuture[None]:
        """Renew the lease (every call through the turn does so too); resolves to ``None``.

        Raises (through the future):
            TurnInterrupted: the turn is no longer open.
        """
        return self._call(SessionActor.h_ping)

    # -- plumbing --------------------------------------------------------------------------

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]:
        if self._state != _OPEN:
            what = "was not opened" if self._state in (_NEW, _OPENING) else "is closed"
            return self._failed(
                RuntimeError(
                    f"turn {self.turn_id!r} {what}: call through it inside "
                    "'with session.turn(...) as turn:' (or 'async with'); after it ends, "
                    "open a new turn"
                )
            )
        name = handler.__name__
        if name not in THROUGH:
            return self._failed(TypeError(f"{name!r} cannot be called through a turn"))
        self._until = scheduling.monotonic() + self.lease  # (the session renews it too)
        if name == "h_compact":  # the handle knows where the compactor runs
            return self._handle._compact_in_turn(args[0], self.turn_id)
        via = SessionActor.h_turn_read if name in _READ_LIKE else SessionActor.h_turn_call
        return self._handle._call(via, self.turn_id, name, args)

    def _register(self, sub: Subscription, timeout: float) -> None:
        self._handle._register(sub, timeout)

    def is_alive(self) -> bool:
        """Whether the session (not the turn) runs now."""
        return self._handle.is_alive()

    # -- what a handle does and a turn does not: each says where to do it ---------------------

    def turn(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Turns do not nest."""
        raise RuntimeError(
            "a turn cannot open another turn: open it on the session's handle "
            "(session.turn(...)) once this one is closed"
        )

    def stop(self, timeout: float | None = None) -> NoReturn:
        """Not through a turn."""
        raise RuntimeError("stop the session through its handle, not through a turn")

    def __repr__(self) -> str:
        state = ("new", "opening", "open", "ended")[self._state]
        return f"<Turn {self.turn_id!r} of {self.owner!r} on {self.session_id!r} {state}>"
