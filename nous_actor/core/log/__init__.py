"""The pure core: `Log`, an immutable append-only event log and its fold.

No locks, no threads, no I/O. A ``Log`` is a value: every operation returns a
new ``Log`` and leaves the old one valid and unchanged, so many versions can be
held at once (fork, rewind) and shared between threads.

How it stays cheap while immutable:

* Retained events live in a list shared by a chain of versions; each version
  sees the prefix ``[:n]`` it was made with. Appending to the newest version
  extends the list in place; appending to an older one (a branch) copies it.
* The fold (the position-sorted surface with its messages) is memoised in a
  `_Fold` owned by one version at a time. Appending to the owner hands
  the fold to the new version, which updates it in place (a bisect and a
  splice); the old version notices it lost the fold and refolds on demand.
  Ownership moves by an atomic claim, so readers in other threads never see a
  half-updated fold.

The package's modules, each importing only those above it: ``_fold`` (the
fold, and the fold from scratch), ``_events`` (messages as events, new events,
the refusals of a seq or a boundary) and ``_log`` (`Log` itself).
"""

from __future__ import annotations

from nous_actor.core.log._events import _behind_head as _behind_head
from nous_actor.core.log._events import _check_boundary as _check_boundary
from nous_actor.core.log._events import _seed_data as _seed_data
from nous_actor.core.log._events import _utcnow as _utcnow
from nous_actor.core.log._events import as_message as as_message
from nous_actor.core.log._events import message_event as message_event
from nous_actor.core.log._events import new_event as new_event
from nous_actor.core.log._fold import _Fold as _Fold
from nous_actor.core.log._fold import _full_fold as _full_fold
from nous_actor.core.log._fold import _shadow_flags as _shadow_flags
from nous_actor.core.log._fold import shadowed as shadowed
from nous_actor.core.log._log import Log as Log
from nous_actor.core.log._log import _branch as _branch
from nous_actor.core.log._log import _rebuild as _rebuild

__all__ = ["Log"]
