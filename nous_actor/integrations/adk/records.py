"""What the adapter writes into a log: the keys of its events' data and of its own
records, and how often a session's state is written whole.
"""

from __future__ import annotations

from typing import Final

ADK_EVENT_KEY: Final = "adk_event"
"""Key of ``data["metadata"]`` under which a log event keeps its ADK event verbatim."""

RECORD_KEY: Final = "adk"
"""Top-level ``data`` key of the service's own records (``request_header`` events):
``{"op": "create", "state": {...}}``, ``{"op": "delete"}``, ``{"op": "state",
"delta": {...}}``, ``{"op": "checkpoint", "upto": seq, "state": {...}}`` (in app and
user state, also ``"writes": {key: seq}`` and ``"writers": {key: [session key, seq] or
null}``: each key's last write and the event it completes, as of ``upto``) and, in a
user's directory, ``{"op": "session", "id": ..., "seq": ..., "ts": ..., "state": {...}}``
(what `list_sessions` reads: ``ts`` the session's last update time as of the event at
``seq``, ``state`` present when it is written whole). A ``state`` record written for an
event of a session's log (a create record, an ADK event) has ``"source": [session key,
seq]``, the event it completes."""

SCOPED_KEY: Final = "adk_scoped"
"""Top-level ``data`` key of a create record or an ADK event whose state (delta) has
``app:`` or ``user:`` keys: ``{"app": {...}, "user": {...}, "seen": {"app": n, "user":
m}}``, those parts (prefixes stripped) and the counts of the app's and user's logs read
before the event was written. The session's log is written first and is the source of
truth: a call whose process died before it wrote these parts (or the directory entry) is
completed from it by the next read of the session, a key only where nothing wrote it
since those counts (see `_ScopedState.settle`)."""

STATE_KEY: Final = "adk_state"
"""Top-level ``data`` key holding the session-scoped part of an event's state delta."""

TIME_KEY: Final = "adk_ts"
"""Top-level ``data`` key holding the ADK timestamp (a float, exactly as given)."""

CHECKPOINT_EVERY: Final = 256
"""A session's state is written whole (a checkpoint record) after this many events, so
that a recent-events read folds only the deltas since the last one."""

STATE_CHECKPOINT_EVERY: Final = 256
"""An app's or a user's state is written whole (a checkpoint record, with each key's last
write and the event that write completes) by the writer whose write is this many past the
last one, so that a fresh service folds only the writes since the latest one (the user's
log grows with every session of the user)."""
