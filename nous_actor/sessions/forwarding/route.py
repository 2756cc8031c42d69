"""`Route`: where one session's calls go from one registry, and what is held while it moves.

A registry keeps one route per session id it was asked for. The route's
target is either the session's actor in this process (``ref``) or a `Link` to
the process that holds it (``link``). A call is put in the actor's inbox, or
sent over the link, in the order the route receives it.

**While the session moves** (its actor here stopped with calls still queued —
a passivation, a hand-off, a crash — or the holder answered "not held here"),
the route holds every call: first the ones its last target handed back
(never applied), in the order they were sent, then the ones made since. A
mover finds where the session is now (``locate``: opened here, or the process
that holds it) and delivers them there in that order, each exactly once. A
caller learns "not applied" only when it was not: the route fails held calls
only when the session cannot be reached within the route's bound (the error
says so), or when the registry closes.

The only ambiguous case is a holder process that dies (or whose connection
breaks) between receiving a call and answering it: those calls fail with
`nous_actor.SessionCrashed`, whose message says that the call may or may not
have been applied (see `Link`).
"""

from __future__ import annotations

import threading
from collections import deque
from functools import partial
from typing import Any, Protocol

import pykka

from nous_actor._log import get_logger
from nous_actor.errors import SessionStopped
from nous_actor.runtime import scheduling
from nous_actor.runtime.dispatcher import CallEnvelope
from nous_actor.sessions.actor import Handler, session_cell
from nous_actor.sessions.future import SessionFuture
from nous_actor.store.subscription import Subscription

__all__ = ["LIFE", "REGISTRY_CLOSED", "Call", "Link", "Route"]

logger = get_logger("nous_actor.sessions.forwarding")

_FIRST_PAUSE = 0.001
"""Seconds a move waits before it looks for the session again (doubling each time)."""

REGISTRY_CLOSED = "the registry is closed"
"""Why a closed registry's routes refuse calls."""

MAX_TAKEN_BACK = 5
"""How often a call may be handed back by a session that stopped before running it."""

_MAX_PAUSE = 0.1
"""The longest pause between two looks."""

Call = tuple[Handler, tuple[Any, ...], "SessionFuture[Any]"]
"""One call: its handler, its arguments, its future."""


class Link(Protocol):
    """The way to the process (or the other registry) that holds a session."""

    address: str

    @property
    def closed(self) -> bool:
        """Whether the link is gone (its connection broke or closed): calls over it fail."""

    def send(
        self, route: Route, epoch: int, handler: Handler, args: tuple[Any, ...], fut: Any
    ) -> None:
        """Send one call of ``route``'s session; its answer goes to ``fut``. A call the
        other side does not take (it does not hold the session) goes back to
        ``route.refused(epoch, call)``; the link calls ``route.answered()`` once per
        call sent, whatever its outcome."""

    def tell_asked(self, session_id: str) -> None:
        """Tell the holder that this process asked for ``session_id`` in the store (its
        hand-over looks at the requests now); best effort, nothing comes back."""


class Home(Protocol):
    """The registry a route belongs to: what a route and its session's handles ask of it,
    by session id (one object for all the registry's routes, where each route and
    handle would hold bound methods of their own)."""

    def locate(self, session_id: str) -> pykka.ActorRef[Any] | Link:
        """Where the session is now: its actor here (opened, or reopened, by the
        registry) or a link to its holder. Blocks; raises `NousActorError` (or
        `ConflictError`, `StoreError`) when it cannot be reached."""

    def resolve(self, session_id: str) -> pykka.ActorRef[Any]:
        """The session's live actor here, (re)opened if need be."""

    def touch(self, session_id: str) -> None:
        """The session is used now (its passivation's clock)."""

    def watch(self, session_id: str, from_seq: int, buffer: int, timeout: float) -> Subscription:
        """A subscription that follows the session's commits through the store."""


class Route:
    """Where one session's calls go from one registry (see the module docs)."""

    __slots__ = (
        "__weakref__",  # a registry keeps its routes weakly: see `Sessions._route`
        "_cond",
        "_tries",
        "bounced",
        "closed",
        "epoch",
        "followers",
        "held",
        "home",
        "inflight",
        "link",
        "lock",
        "moves",
        "ref",
        "rerouted",
        "session_id",
        "timeout",
    )

    def __init__(self, session_id: str, home: Home, timeout: float) -> None:
        self.session_id = session_id
        self.home = home
        self.timeout = timeout
        self.lock = threading.RLock()
        # What a route needs only while its session moves is made then, not per session
        # (an idle session's memory): the condition a move waits on, the queues, the
        # count of hand-backs.
        self._cond: threading.Condition | None = None
        self.ref: pykka.ActorRef[Any] | None = None
        self.link: Link | None = None
        # While moving: the calls held (made since the move began), and before them
        # the ones the last target handed back unapplied, in the order sent.
        self.held: deque[Call] | None = None
        self.rerouted: deque[Call] | None = None
        self.bounced: deque[Call] | None = None  # refused by the link, in the order sent
        self._tries: dict[int, int] | None = None  # hand-backs of each call still pending
        self.epoch = 0  # grows at every move: a link's refusals of an older one are late
        self.inflight = 0  # calls sent over ``link`` and not answered yet
        self.closed: str | None = None
        # Subscriptions of its handles that follow the session through the store (it
        # stopped here and lives on): they end when the route closes.
        self.followers: list[Any] | None = None
        self.moves = 0  # (for tests and the benchmark)

    # -- sending -----------------------------------------------------------------------------

    def send(self, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any]) -> None:
        """Send one call to wherever the session is, in order; never raises (the future
        carries every failure)."""
        link = None
        move = False
        with self.lock:
            if self.closed is not None:
                fut._fail(SessionStopped(self.session_id, self.closed))
                return
            if self.held is None:
                ref = self.ref
                if ref is not None:
                    if not ref.actor_stopped.is_set():
                        ref.actor_inbox.put(CallEnvelope(handler, args, fut))  # type: ignore[arg-type]
                        return
                elif self.link is not None:
                    link, epoch = self.link, self.epoch
                    self.inflight += 1
                move = link is None and self._begin_move()
            if link is None:
                assert self.held is not None
                self.held.append((handler, args, fut))
        if link is not None:
            link.send(self, epoch, handler, args, fut)
        elif move:
            # Found in another thread: a send never blocks its caller (a coroutine's
            # event loop must go on, e.g. to run a summariser the move waits for).
            scheduling.spawn(self._move, "nous-route")

    def settle(self, found: pykka.ActorRef[Any] | Link) -> None:
        """Calls go to ``found`` from now on (an open located the session), unless a move
        is under way (it locates the session itself)."""
        with self.lock:
            if self.held is not None or self.closed is not None:
                return
            if isinstance(found, pykka.ActorRef):
                old = self.ref
                if old is not None and old is not found:
                    session_cell(old).reroute = None
                self.ref, self.link = found, None
                session_cell(found).reroute = self
            elif found is not self.link:
                self.ref, self.link = None, found
                self.epoch += 1

    def target(self) -> pykka.ActorRef[Any] | Link | None:
        """Where calls go now (``None``: moving, or not located yet)."""
        with self.lock:
            if self.held is not None:
                return None
            return self.ref if self.ref is not None else self.link

    def here(self) -> bool:
        """Whether the session is held by this registry (calls forwarded from another
        process are taken): its actor here runs, or it is moving away from here."""
        with self.lock:
            if self.closed is not None:
                return False
            if self.held is not None:
                return self.link is None and self.ref is not None
            ref = self.ref
            return ref is not None and not ref.actor_stopped.is_set()

    # -- what a target hands back ------------------------------------------------------------

    def take_back(self, calls: list[Call]) -> None:
        """The session's actor here stopped with ``calls`` not applied (called by the
        actor, under this route's lock, with its inbox drained): deliver them where the
        session is now, before anything sent after them."""
        with self.lock:
            kept = [call for call in calls if self._may_try_again(call)]
            if kept:
                if self.rerouted is None:
                    self.rerouted = deque()
                self.rerouted.extendleft(reversed(kept))
            if self.closed is not None:
                self._fail_held(SessionStopped(self.session_id, self.closed))
                return
            if not self._begin_move():
                return  # the move under way delivers them
        scheduling.spawn(self._move, "nous-route")

    def let_go(self, ref: pykka.ActorRef[Any]) -> None:
        """``ref``'s actor stopped and handed back what it had not applied (called by the
        actor, under this route's lock, after `take_back`): the route no longer points
        at it, so a stopped session's actor and log are not kept alive through its
        route (or a handle on it); the next call finds where the session is now."""
        if self.ref is ref:
            self.ref = None

    def _begin_move(self) -> bool:
        """Hold calls from now on (under the lock); whether a move must be started (none
        is under way)."""
        if self.held is not None:
            return False
        self.held = deque()
        self.moves += 1
        return True

    def _may_try_again(self, call: Call) -> bool:
        """Count one more hand-back of ``call``; past `MAX_TAKEN_BACK` it fails (not
        applied) instead of following a session that keeps stopping under it."""
        fut = call[2]
        key = id(fut)
        if self._tries is None:
            self._tries = {}
        tries = self._tries.get(key, 0) + 1
        if tries > MAX_TAKEN_BACK:
            self._tries.pop(key, None)
            fut._fail(
                SessionStopped(
                    self.session_id,
                    f"the session stopped {MAX_TAKEN_BACK} times before this call could "
                    "run (crashing or moving); the call was not applied",
                )
            )
            return False
        self._tries[key] = tries
        if tries == 1:
            # (Runs at once if the future is done already: a call its caller gave up on.)
            fut.add_done_callback(partial(self._forget_tries, key))
        return True

    def _forget_tries(self, key: int) -> None:
        with self.lock:
            tries = self._tries
            if tries is not None:
                tries.pop(key, None)
                if not tries:
                    self._tries = None

    def refused(self, epoch: int, call: Call) -> None:
        """A link's other side did not take ``call`` (it does not hold the session): it
        was not applied; deliver it where the session is now, in order. A link refuses
        every call after the first it refused, until the route moves (``epoch``)."""
        with self.lock:
            if self.bounced is None:
                self.bounced = deque()
            self.bounced.append(call)
            if epoch != self.epoch:
                return  # sent before the last move: the mover waits for it
            self.link = None
            if not self._begin_move():
                return  # the move under way sees it and looks again
        scheduling.spawn(self._move, "nous-route")

    def answered(self) -> None:
        """A call sent over the link is answered (or refused, or lost)."""
        with self.lock:
            self.inflight -= 1
            if self.inflight <= 0:
                self._notify()

    # -- moving --------------------------------------------------------------------------------

    def _move(self) -> None:
        """Find the session and deliver what is held, in order (bounded by ``timeout``)."""
        host = scheduling.current()
        deadline = host.now() + self.timeout
        first = True
        pause = _FIRST_PAUSE
        attempts = 0
        while True:
            attempts += 1
            if attempts > MAX_TAKEN_BACK:
                with self.lock:
                    self._fail_held(
                        SessionStopped(
                            self.session_id,
                            f"the session stopped {MAX_TAKEN_BACK} times as it was reached "
                            "(crashing or moving); the call was not applied",
                        )
                    )
                return
            if not first:
                # The session went away again as it was reached (a crash storm, a holder
                # ending): look again after a pause that doubles, not at once.
                host.wait(
                    self._is_closed,
                    min(pause, max(deadline - host.now(), 0.0)),
                    self._block_closed,
                )
                pause = min(pause * 2, _MAX_PAUSE)
            old = self.ref
            if old is not None and old.actor_stopped.is_set():
                # Its inbox is drained (under this route's lock) before it ends: wait
                # for that, so what it hands back goes first.
                session_cell(old).finished.wait(max(deadline - host.now(), 0.0))
            # Calls still in flight over a link: their refusals come back in order and
            # go before everything not sent yet. (Waited for outside the lock: a
            # simulated wait suspends its thread, which must not hold it.)
            host.wait(self._settled, max(deadline - host.now(), 0.0), self._block_settled)
            with self.lock:
                if self.bounced:
                    if self.rerouted is None:
                        self.rerouted = deque()
                    self.rerouted.extendleft(reversed(self.bounced))
                    self.bounced = None
                if self.closed is not None:
                    self._fail_held(SessionStopped(self.session_id, self.closed))
                    return
                if not first and host.now() >= deadline:
                    self._fail_held(
                        SessionStopped(
                            self.session_id,
                            f"it could not be reached within {self.timeout:g} s while it "
                            "moved between processes; the call was not applied",
                        )
                    )
                    return
            first = False
            try:
                found = self.home.locate(self.session_id)
            except Exception as exc:
                with self.lock:
                    self._fail_held(exc)
                return
            if self._flush(found):
                return

    def _is_closed(self) -> bool:
        return self.closed is not None

    def _block_closed(self, timeout: float | None) -> bool:
        with self.lock:
            return self._condition().wait_for(self._is_closed, timeout)

    def _settled(self) -> bool:
        return self.inflight <= 0

    def _block_settled(self, timeout: float | None) -> bool:
        with self.lock:
            return self._condition().wait_for(self._settled, timeout)

    def _condition(self) -> threading.Condition:
        """The condition a move waits on (under the lock; made at its first wait)."""
        if self._cond is None:
            self._cond = threading.Condition(self.lock)
        return self._cond

    def _notify(self) -> None:
        """Wake a move that waits (under the lock)."""
        if self._cond is not None:
            self._cond.notify_all()

    def _flush(self, found: pykka.ActorRef[Any] | Link) -> bool:
        """Deliver the held calls to ``found`` in order; ``False`` if it went away
        meanwhile (then locate the session again)."""
        local = isinstance(found, pykka.ActorRef)
        with self.lock:
            if local:
                assert isinstance(found, pykka.ActorRef)
                self.ref, self.link = found, None
                session_cell(found).reroute = self
            else:
                assert not isinstance(found, pykka.ActorRef)
                self.ref, self.link = None, found
                self.epoch += 1
            epoch = self.epoch
        while True:
            with self.lock:
                if self.closed is not None:
                    self._fail_held(SessionStopped(self.session_id, self.closed))
                    return True
                if local:
                    if self.ref is not found or found.actor_stopped.is_set():
                        return False
                elif self.link is not found or self.bounced:
                    return False
                queue = self.rerouted if self.rerouted else self.held
                assert queue is not None
                if not queue:
                    self.held = self.rerouted = None
                    return True
                call = queue.popleft()
                if local:
                    # Under the lock: the actor drains its inbox under it too, so a call
                    # put here is either applied or handed back.
                    found.actor_inbox.put(CallEnvelope(*call))  # type: ignore[union-attr,arg-type]
                    continue
                self.inflight += 1
            found.send(self, epoch, *call)  # type: ignore[union-attr]

    def _fail_held(self, exc: BaseException) -> None:
        """Fail every held call with ``exc`` (under the lock): the session could not be
        reached; none of them was applied."""
        for _, _, fut in self._take_held():
            fut._fail(exc)

    def _take_held(self) -> list[Call]:
        """Every held call, in order, taken out of the route (under the lock)."""
        calls = [*(self.bounced or ()), *(self.rerouted or ()), *(self.held or ())]
        self.bounced = self.rerouted = self.held = None
        return calls

    def close(self, reason: str) -> None:
        """The registry closes (or the session was stopped on purpose): calls held now
        or made from now on fail with `SessionStopped` (``reason``); the turns opened
        through a link to another process end there (`SocketLink.let_go_turns`)."""
        with self.lock:
            self.closed = reason
            self._notify()
            ref, self.ref = self.ref, None  # (its registry stops it; nothing is sent to it)
            if ref is not None:
                session_cell(ref).reroute = None
            held = self._take_held()
            followers, self.followers = self.followers, None
            link = self.link
        # (Failed outside the lock: a held call may be another registry's, relayed here
        # by a `LocalLink`, whose answer goes back to that registry's route.)
        stopped = SessionStopped(self.session_id, reason)
        for _, _, fut in held:
            fut._fail(stopped)
        for sub in followers or ():
            sub._finish(None)
        let_go_turns = getattr(link, "let_go_turns", None)
        if let_go_turns is not None:
            let_go_turns(self)

    def follow(self, sub: Any) -> bool:
        """``sub`` follows the session through the store until this route closes (or
        it is closed); ``False`` if the route is closed already."""
        with self.lock:
            if self.closed is not None:
                return False
            if self.followers is None:
                self.followers = []
            self.followers.append(sub)
            return True

    def unfollow(self, sub: Any) -> None:
        with self.lock:
            if self.followers is not None and sub in self.followers:
                self.followers.remove(sub)

    def release_actor(self) -> None:
        """The session here is stopped on purpose (``stop()``): calls still queued fail as
        before, and the next call locates it again."""
        with self.lock:
            ref = self.ref
            if ref is not None:
                session_cell(ref).reroute = None

    def __repr__(self) -> str:
        where = (
            "moving"
            if self.held is not None
            else ("here" if self.ref is not None else getattr(self.link, "address", "nowhere"))
        )
        return f"<Route {self.session_id!r} {where}>"


def __alive__(actor: Any) -> bool:
    """(Run by the session's actor.) It runs: a handle elsewhere asked."""
    return True


def __stop__(actor: Any, timeout: float) -> None:
    """(Run by the session's actor.) Stop on purpose, for a handle elsewhere: what is
    still queued fails as after any ``stop()``; the next call finds it again."""
    actor.cell.reroute = None
    actor._stop()


LIFE: dict[str, Handler] = {"__alive__": __alive__, "__stop__": __stop__}
"""The two questions of a handle's life that travel like calls."""
