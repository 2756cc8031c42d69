"""A session: one `nous_actor.Log` owned by one Pykka actor, and the handle to it.

Callers never touch the actor. They hold a `Session` handle whose
methods send a message to the actor and return a `SessionFuture`.

Guarantees, for every call on a handle:

* Calls from one thread are applied in the order they were made; calls from
  several threads are applied one at a time, each seeing the effects of all
  that were applied before it.
* Bad input fails that call's future with ``InvalidEvent`` (or, for an
  argument checked before sending, raises at the call) and changes nothing;
  the session keeps running.
* No call waits forever. A call on a stopped session fails at once with
  `nous_actor.SessionStopped`; a call queued when the session stops
  is answered with it (Pykka leaves such asks unanswered); every ``get``
  has a bound (`nous_actor.CallTimeout` after it).
* A ``BaseException`` raised while handling a call stops only this session
  (Pykka's default would stop every actor in the process); the call fails
  with `nous_actor.SessionCrashed`.

The package's modules, each importing only those before it: ``_calls`` (what a
call is: its envelope, and the declaration of what its handler is),
``_ledger`` (`CommitLedger`, what the actor and its store's committer share),
``_feeds`` (`Feeds`, the subscriptions), ``_summary`` (what a ``compact`` call
carries; `SummarySlot`), ``_compactions`` (`Compactions`, those in flight and
those in the log), ``_session_actor`` (`SessionActor`: the loop and every
call, holding those collaborators and the turn table of
`nous_actor.sessions.turns`) and ``_exit`` (the exit hook).
"""

from __future__ import annotations

from nous_actor.sessions.actor._calls import EventParts as EventParts
from nous_actor.sessions.actor._calls import Handler as Handler
from nous_actor.sessions.actor._calls import _crashed as _crashed
from nous_actor.sessions.actor._calls import _safe_str as _safe_str
from nous_actor.sessions.actor._compactions import MAX_COMPACTION_RETRIES as MAX_COMPACTION_RETRIES
from nous_actor.sessions.actor._exit import _flush_at_exit as _flush_at_exit
from nous_actor.sessions.actor._session_actor import _WAIT_FOR_COMMITS as _WAIT_FOR_COMMITS
from nous_actor.sessions.actor._session_actor import HELD as HELD
from nous_actor.sessions.actor._session_actor import THROUGH as THROUGH
from nous_actor.sessions.actor._session_actor import Releases as Releases
from nous_actor.sessions.actor._session_actor import SessionActor as SessionActor
from nous_actor.sessions.actor._session_actor import SessionCell as SessionCell
from nous_actor.sessions.actor._session_actor import session_cell as session_cell
from nous_actor.sessions.actor._summary import Deliver as Deliver
from nous_actor.sessions.actor._summary import SummarySlot as SummarySlot
from nous_actor.sessions.actor._summary import _Compaction as _Compaction
from nous_actor.sessions.actor._summary import summary_slot as summary_slot

__all__ = ["MAX_COMPACTION_RETRIES", "SessionActor", "SummarySlot", "summary_slot"]

# The public classes are named by this package, where users import them from.
SessionActor.__module__ = __name__
SummarySlot.__module__ = __name__
