"""The handle to a session: what callers hold, whose every call returns a future.

The handle never touches the actor's state: it checks and freezes a call's
input in the caller's thread, puts one message in the actor's inbox and
returns a `SessionFuture`. See `nous_actor.sessions.actor` for what the
actor guarantees.

The package's modules, each importing only those above it: ``_checks`` (the
checks made in the caller's thread), ``_calls`` (`SessionCalls`, the call
methods a handle and a turn share), ``_session_handle`` (`SessionHandle`, what
every handle offers: the calls, turns, the session's life) and ``_session``
(`Session`, the handle to a session in this process). The turn itself is
`nous_actor.sessions.turn_handle.Turn`, a `SessionCalls` too.
"""

from __future__ import annotations

from nous_actor.sessions.handle._calls import SessionCalls as SessionCalls
from nous_actor.sessions.handle._checks import _check_handle_args as _check_handle_args
from nous_actor.sessions.handle._checks import _check_seq as _check_seq
from nous_actor.sessions.handle._checks import _off_loop as _off_loop
from nous_actor.sessions.handle._checks import check_placement as check_placement
from nous_actor.sessions.handle._session import Session as Session
from nous_actor.sessions.handle._session_handle import SessionHandle as SessionHandle

__all__ = ["Session", "SessionCalls", "SessionHandle"]

# The public classes are named by this package, where users import them from.
Session.__module__ = __name__
SessionCalls.__module__ = __name__
SessionHandle.__module__ = __name__
