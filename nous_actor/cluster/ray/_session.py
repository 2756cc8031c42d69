"""The `RaySession` handle: a `nous_actor.SessionHandle` whose calls go to its shard."""

from __future__ import annotations

import operator
from functools import partial
from typing import Any

import ray
import ray.exceptions
from ray import cloudpickle

from nous_actor.cluster.ray._feed import _drop_late, _Feed
from nous_actor.cluster.ray._link import _Link
from nous_actor.cluster.ray._protocol import (
    _CALLS,
    ALIVE,
    CALL,
    COMPACT,
    FAILED,
    STOP,
    _disconnected,
    _lost,
)
from nous_actor.core._frozen import short_repr
from nous_actor.errors import CallTimeout, NousActorError, SessionStopped
from nous_actor.sessions.actor import Handler, SessionActor, _Compaction
from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle import SessionHandle, _check_handle_args
from nous_actor.store.subscription import Subscription

_EXACT: frozenset[type] = frozenset({int, str, bool})


def _exact(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each instance of a subclass of int or str replaced by the exact int
    or str it stands for (``args`` itself when there is none, the usual case).

    The handle's checks accept such an argument (a user's ``MyStr`` call id, a
    ``MyInt`` seq), but it would be pickled by reference to its class, which the shard
    may not be able to import (a class of ``__main__``): its batch would be unreadable
    there. The session uses the value alone, so the value goes.
    """
    if all(type(a) in _EXACT or not isinstance(a, (int, str)) for a in args):
        return args
    return tuple(_plain(a) for a in args)


def _plain(a: Any) -> Any:
    """``a`` as the exact int or str it stands for, if it is of a subclass of either."""
    if type(a) in _EXACT:
        return a
    if isinstance(a, int):
        return operator.index(a)  # the exact int (Python 3.10 and later)
    if isinstance(a, str):
        return str.__str__(a)  # the exact str, whatever the subclass's __str__ says
    return a


class RaySession(SessionHandle):
    """The handle to a session hosted in a shard of `RaySessions`.

    Every method of `nous_actor.SessionHandle`, with the same checks (in the
    caller's thread), futures and typed errors as a local `nous_actor.Session`.
    The differences come from the process boundary:

    * A compactor given to `compact` runs in the shard, so it must be
      picklable (its summariser too); refused with ``TypeError`` otherwise.
    * Results are copies: a `nous_actor.Log` from `log` or `fork` is the
      session's value at that moment, sent over.
    * Calls in flight when the shard is lost fail with
      `nous_actor.SessionCrashed` (they may or may not have been applied);
      later calls reach the restarted shard. A subscription ends with that
      error too: subscribe again from the next seq you need. A shard stopped
      for good (by `RaySessions.shutdown`, ``ray.kill(no_restart=True)``, or
      the exit of the driver that created it without ``detached``) is not
      restarted, and every call fails with a `nous_actor.SessionCrashed` that
      says so.

    Get one from `RaySessions.open` (or ``aopen``). A handle belongs to the
    process that opened it; open the session id again in another process.
    """

    __slots__ = ("_link",)

    def __init__(self, session_id: str, link: _Link, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.session_id = _check_handle_args(session_id, timeout)
        self.timeout = float(timeout)
        self._link = link

    def _send(self, kind: int, name: str = "", args: tuple[Any, ...] = ()) -> SessionFuture[Any]:
        fut: SessionFuture[Any] = SessionFuture(self.session_id, self.timeout)
        self._link.submit((kind, self.session_id, name, args), fut)
        return fut

    def _call(self, handler: Handler, *args: Any) -> SessionFuture[Any]:
        if handler is SessionActor.h_compact:
            return self._compact(args[0], None)
        name = getattr(handler, "__name__", "")
        if name not in _CALLS:
            return self._failed(NousActorError(f"a RaySession cannot send {name!r}"))
        return self._send(CALL, name, _exact(args))

    def _compact(self, req: _Compaction, turn_id: str | None) -> SessionFuture[Any]:
        """Send compaction ``req`` to the shard (through open turn ``turn_id``, if one):
        the compactor travels pickled, and runs there."""
        try:
            blob = cloudpickle.dumps(req.compactor)  # type: ignore[no-untyped-call]
        except Exception as exc:
            return self._failed(
                TypeError(
                    "the compactor runs in the session's shard, so it (and its "
                    "summariser) must be picklable: "
                    f"{type(exc).__name__}: {short_repr(exc)}"
                )
            )
        return self._send(COMPACT, "", (blob, req.time, req.force, req.cid, req.explicit, turn_id))

    def _register(self, sub: Subscription, timeout: float) -> None:
        """The shard holds the session's subscriber; ``sub`` is fed from it by long polls."""
        why = _disconnected()
        if why is not None:
            self._link.close(why)
        if self._link.closed is not None:
            raise SessionStopped(self.session_id, self._link.closed)
        actor = self._link.actor
        try:
            ref = actor.subscribe.remote(self.session_id, sub.from_seq, sub.buffer, timeout)
            state, value = ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            # Registered late, if at all: let the shard drop that subscriber.
            ref.future().add_done_callback(partial(_drop_late, actor))
            raise CallTimeout(
                self.session_id, f"the subscription was not registered within {timeout:g} s"
            ) from None
        except Exception as exc:
            raise _lost(self.session_id, self._link.index, exc) from None
        if state == FAILED:
            raise value
        token, events = value
        sub._catch_up(events)
        feed = _Feed(self._link, self.session_id, sub, token)
        sub._on_close = feed.close
        if not self._link.attach(feed):  # the registry was closed meanwhile
            feed.close(sub)
            raise SessionStopped(self.session_id, str(self._link.closed))
        feed.poll()

    def is_alive(self) -> bool:
        """Whether the session is running in its shard now (a ``False`` is not final:
        the next call starts it there again)."""
        return bool(self._send(ALIVE).get())

    def stop(self, timeout: float | None = None) -> None:
        """Stop the session in its shard after the calls already queued; waits at most
        ``timeout`` (plus one round trip to the shard).

        The next call on a handle starts the session again, recovering it from
        the store.

        Raises:
            CallTimeout: not stopped within ``timeout``.
        """
        bound = self.timeout if timeout is None else timeout
        self._send(STOP, "", (bound,)).get(timeout=bound + min(self.timeout, 5.0))

    async def astop(self, timeout: float | None = None) -> None:
        """`stop` for asyncio code: awaited without blocking the loop (and with no thread)."""
        bound = self.timeout if timeout is None else timeout
        await self._send(STOP, "", (bound,))

    def __reduce__(self) -> Any:
        raise TypeError(
            "a RaySession belongs to the process that opened it; send the session id "
            "and open it with RaySessions there"
        )
