"""Hand-off between processes: a registry asks another process for a session it holds,
and hands over the sessions others ask it for.

Both sides work through the store's optional methods (`nous_actor.store.shared`):

* **Asking** (`acquire`, behind ``Sessions.open(id, wait=...)``): while another
  live process holds the session, leave a request for it in the store
  (``ask_handoff``), wait for the store to change (``wait_changed``: on SQLite
  the file is followed, on PostgreSQL a ``NOTIFY`` wakes the waiter), and open
  the session as soon as its holder has let go. The claim decides who writes
  (on PostgreSQL, the lease and its fencing): nothing here can make two writers.
* **Handing over** (`HandOver`, one thread per registry, started with its first
  session): whenever the store changes, read which of this registry's sessions
  others asked for (``handoff_requests``) and ask each of them to stop if it is
  idle: nothing in flight, nothing waiting (`SessionActor.h_handoff`). A busy
  session is asked again at the store's next change, so it goes as soon as its
  last commit lands. On a store whose changes are only seen by polling (SQLite:
  ``handoff_poll``), an asker also **tells** the holder, at the address it
  advertises with its claim (`HandOver.tell`): a holder others can tell looks at
  the requests when told (and every `TOLD_REST` seconds, for a word lost on the
  way), so an idle process that holds sessions does no work at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import pykka

from nous_actor._log import get_logger
from nous_actor.errors import ConflictError, NousActorError, SessionStopped, StoreError
from nous_actor.runtime import scheduling
from nous_actor.runtime.dispatcher import CallEnvelope
from nous_actor.runtime.tables import Sweep
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.future import SessionFuture
from nous_actor.store import shared
from nous_actor.store.base import Store

__all__ = ["HandOver", "acquire"]

logger = get_logger(__name__)

T = TypeVar("T")

REASK: Final = 0.5
"""An asker asks again this often (a holder that was not listening yet, on PostgreSQL,
missed the first request)."""

RETRY_OPEN: Final = 0.25
"""An asker tries to open the session at least this often, whatever the store says
about its holder (a PostgreSQL holder whose process died still has a lease)."""

GRACE: Final = 0.005
"""A session called this recently is not offered yet: a caller's next call (a request's
write after its read) usually follows within it, and handing over in between would only
send the session back and forth."""

GRACE_FOR: Final = 0.05
"""How long after a request was first seen `GRACE` applies; after that, a session in
steady use here goes at its next idle moment (nothing in flight, nothing queued)."""

OFFER_WAIT: Final = 1.0
"""How long the hand-over thread waits for the registry or a session to answer an offer
(then it moves on; the session is offered again at the store's next change)."""

REST: Final = 0.25
"""How often a holder's thread sees whether its registry still holds any session (and,
while it holds none, how often it looks again, unless an open wakes it first)."""

GIVEN_FOR: Final = 2.0
"""For this long after a session was handed to a process that asked for it, this
registry's own calls go to that process (once it has taken the session) instead of
claiming it back."""

_GIVEN_SWEEP: Final = 64
"""The least size at which the sessions handed over more than `GIVEN_FOR` seconds ago are
let go of (`Sweep`)."""


def _given_long_ago(session_id: str, at: float) -> bool:
    return scheduling.monotonic() - at > GIVEN_FOR


TOLD_REST: Final = 1.0
"""How often a holder that askers tell (`HandOver.told`) looks at the requests untold."""

IDLE_PAUSE: Final = 0.005
"""The least time between two looks at the requests by a holder (caps how often a busy
store wakes the hand-over thread)."""


def acquire(
    store: Store,
    session_id: str,
    wait: float,
    open_now: Callable[[], T],
    refused: ConflictError | None = None,
    tell: Callable[[str], None] | None = None,
) -> T:
    """Open ``session_id`` with ``open_now``, asking its live holder for it (through
    ``store``) and waiting at most ``wait`` seconds for it to let go. ``refused``:
    the `ConflictError` of an attempt the caller just made (then the first step is
    to ask). ``tell``: tells the holder of a session that it was asked for (best
    effort), after each request.

    Raises:
        ConflictError: the holder kept the session for ``wait`` seconds (the message
            and ``holder`` name it).
        Whatever ``open_now`` raises, other than `ConflictError`.
    """
    deadline = scheduling.monotonic() + wait
    version = shared.wait_changed(store, -1, 0.0)
    asked: tuple[str | None, float] | None = None
    last = refused
    last_try = scheduling.monotonic() if refused is not None else -RETRY_OPEN
    if refused is None and _held_elsewhere(store, session_id):
        last_try = scheduling.monotonic()  # ask first: an attempt now would only be refused
        last = ConflictError("is held by another process", session_id=session_id)
    while True:
        if last is None or scheduling.monotonic() - last_try >= RETRY_OPEN or last_try == 0.0:
            try:
                got = open_now()
            except ConflictError as exc:
                last = exc
                last_try = scheduling.monotonic()
            else:
                if asked is not None:
                    _withdraw(store, session_id)
                return got
        assert last is not None
        while True:
            now = scheduling.monotonic()
            if now >= deadline:
                who = shared.held_by(store, session_id) or last.holder
                if asked is not None:
                    _withdraw(store, session_id)
                raise ConflictError(
                    f"is still held by {who or 'another live writer'} after waiting "
                    f"{wait:g} s for a hand-off (it stays busy: an open turn, or calls "
                    "in flight); retry later, or route the request to that process",
                    session_id=session_id,
                    holder=who or last.holder,
                    lease_until=last.lease_until,
                ) from last
            who = shared.held_by(store, session_id)
            if who is None or now - last_try >= RETRY_OPEN:
                last_try = 0.0  # let go (or perhaps dead): try to open it
                break
            if asked is None or asked[0] != who or now - asked[1] >= REASK:
                shared.ask_handoff(store, session_id, max(deadline - now, 0.001))
                asked = (who, now)
                if tell is not None:
                    tell(session_id)
            version = shared.wait_changed(store, version, min(deadline - now, RETRY_OPEN, REASK))


def _held_elsewhere(store: Store, session_id: str) -> bool:
    """Whether the store says another process holds ``session_id`` now."""
    who = shared.held_by(store, session_id)
    return who is not None and who not in ("this process", getattr(store, "holder", None))


def _withdraw(store: Store, session_id: str) -> None:
    """Take the request back (best effort: it lapses by itself)."""
    try:
        shared.withdraw_handoff(store, session_id)
    except StoreError:
        pass


class HandOver:
    """The hand-over side of one registry: a thread that hands its sessions to the
    processes that ask for them (see the module docs). Started on demand, ended by
    `stop` (the registry's close).

    What it knows of its registry is what it is given: the ``store`` the requests
    arrive in, the bound of a call (``timeout``), and three questions it asks:
    ``holds_any()`` (whether a session runs there; raises `NousActorError` when the
    registry cannot tell), ``live_ref(id, timeout)`` (the running actor of a
    session, or ``None``) and ``idle_for(id)`` (seconds since its last use, ``None``
    if never).
    """

    def __init__(
        self,
        store: Store,
        *,
        timeout: float,
        holds_any: Callable[[], bool],
        live_ref: Callable[[str, float], pykka.ActorRef[Any] | None],
        idle_for: Callable[[str], float | None],
    ) -> None:
        self._store = store
        self._timeout = timeout
        self._holds = holds_any
        self._live_ref = live_ref
        self._idle_for = idle_for
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.handed = 0  # sessions handed over (for tests and the benchmark)
        self._given: dict[str, float] = {}  # when each session was last handed over
        self._given_sweep: Sweep[str, float] = Sweep(_given_long_ago, _GIVEN_SWEEP)
        self._seen: dict[str, float] = {}  # when each standing request was first seen
        self._opened = threading.Event()  # a session opened since the thread last looked
        self._taking: dict[str, int] = {}  # sessions this registry is asking for (`taking`)
        self.resting = False  # the thread rests: this registry holds no session
        # Askers tell this registry when they ask (its process advertises where it
        # answers): on a polled store it looks at the requests when told (`tell`).
        self.told = False
        self._told = threading.Event()

    def start(self) -> None:
        """Start the thread unless it runs (or the store carries no requests); called
        at every open (it wakes a thread that rests while nothing is held)."""
        if self._thread is not None:
            if not self._opened.is_set():  # (set once per rest: an open burst sets it once)
                self._opened.set()
            return
        if not shared.supports_handoff(self._store):
            return
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = scheduling.current().service(
                    self._run, "nous-handover", 0.25, self._poll_once
                )

    def _poll_once(self) -> bool:
        """Where the hand-over is a timer (a simulation's): look for requests once;
        whether to look again."""
        if self._stop.is_set():
            return False
        try:
            asked = shared.handoff_requests(self._store)
        except StoreError:
            return False
        for session_id in asked:
            self._offer(session_id)
        return True

    def stop(self) -> None:
        """End the thread (the registry closes: it hands nothing over any more)."""
        self._stop.set()
        self._told.set()

    def tell(self) -> None:
        """A process asked for a session in the store: look at the requests now (any
        thread)."""
        self._told.set()

    def _rest(self, seconds: float) -> bool:
        """Wait until told, or for ``seconds``; whether the registry closed meanwhile."""
        self._told.wait(seconds)
        self._told.clear()  # (before the look: a request told of from now on is seen next)
        return self._stop.is_set()

    def _run(self) -> None:
        store = self._store
        poll = shared.handoff_poll(store)  # None: look when the store changes
        version = -1
        waiting = False  # a session asked for was busy: look again soon
        next_look = 0.0  # when to see again whether this registry holds anything
        while not self._stop.is_set():
            if not waiting and time.monotonic() >= next_look:
                # Rest while this registry holds no session: nothing to hand over, and
                # no reason to keep the store followed (on SQLite, a poll of the file
                # every few ms). An open wakes it.
                self._opened.clear()
                while not self._holds_any():
                    self.resting = True
                    if self._opened.wait(REST) or self._stop.is_set():
                        break
                self.resting = False
                next_look = time.monotonic() + (TOLD_REST if self.told else REST)
            try:
                if poll is None:
                    version = shared.wait_changed(store, version, GRACE if waiting else 0.25)
                elif self._rest(GRACE if waiting else TOLD_REST if self.told else poll):
                    return
                asked = shared.handoff_requests(store)
            except StoreError:
                return  # the store closed (or failed): there is nothing to hand over
            waiting = False
            now = time.monotonic()
            seen = {sid: self._seen.get(sid, now) for sid in asked}  # first seen asked
            self._seen = seen
            for session_id in asked:
                if self._stop.is_set():
                    return
                waiting |= not self._offer(session_id, now - seen[session_id] < GRACE_FOR)
            if poll is None:
                self._stop.wait(IDLE_PAUSE)

    def _holds_any(self) -> bool:
        """Whether this registry runs a session now (also when it cannot tell)."""
        try:
            return self._holds()
        except NousActorError:
            return not self._stop.is_set()

    def _offer(self, session_id: str, grace: bool = True) -> bool:
        """Ask the live actor of ``session_id`` in this registry, if any, to hand over;
        ``False`` if it is busy (ask again soon). With ``grace``, a session called
        within `GRACE` is left alone for now."""
        if session_id in self._taking:
            return False  # asked for by this registry: its request is not withdrawn yet
        if grace:
            idle = self._idle_for(session_id)
            if idle is not None and idle < GRACE:
                return False
        ref = self._live_ref(session_id, OFFER_WAIT)
        if ref is None:
            return True
        fut: SessionFuture[Any] = SessionFuture(session_id, self._timeout)
        # Marked given before it is offered: the actor lets go of its claim before this
        # thread hears so, and a call of this registry made in between must wait for
        # the asker rather than claim the session back.
        self._given[session_id] = scheduling.monotonic()
        try:
            ref.actor_inbox.put(CallEnvelope(SessionActor.h_handoff, (), fut))  # type: ignore[arg-type]
            handed = bool(fut.get(timeout=OFFER_WAIT))
        except (NousActorError, SessionStopped):
            self._given.pop(session_id, None)
            return True  # stopped meanwhile (or slow): nothing to hand over now
        if handed:
            self.handed += 1
            self._given[session_id] = scheduling.monotonic()
            # Those handed over long ago and never asked about since go (a worker that
            # hands over ever new sessions keeps the recent ones only).
            self._given_sweep.after(self._given)
        else:
            self._given.pop(session_id, None)
        return handed

    @contextmanager
    def taking(self, session_id: str) -> Iterator[None]:
        """While this registry asks for ``session_id`` (`acquire`): its own request may
        still stand for a moment after it took the session, and must not make it hand
        the session straight over (to nobody). A store that knows the asker ignores a
        holder's own request (SQLite, PostgreSQL); one that does not (`MemoryStore`,
        where registries stand for processes) relies on this."""
        with self._lock:
            self._taking[session_id] = self._taking.get(session_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._taking.pop(session_id) - 1
                if left:
                    self._taking[session_id] = left

    def given_away(self, session_id: str) -> bool:
        """Whether ``session_id`` was handed to a process that asked for it within
        `GIVEN_FOR` seconds: then this registry's next call waits for the asker to take
        it (and calls it there) rather than claim it back."""
        at = self._given.get(session_id)
        if at is None:
            return False
        if scheduling.monotonic() - at > GIVEN_FOR:
            self._given.pop(session_id, None)
            return False
        return True
