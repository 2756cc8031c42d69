"""Google ADK's session service, kept in supervised, durable nous_actor sessions.

`NousSessionService` implements ADK's `BaseSessionService` (``create_session``,
``get_session`` with its config, ``list_sessions``, ``delete_session``,
``append_event``, ``get_user_state``) over the sessions of a
`nous_actor.Sessions` registry, on any store. Swap

    service = DatabaseSessionService("sqlite+aiosqlite:///app.db")

for

    service = NousSessionService(sessions)              # a registry you run, or
    service = NousSessionService.sqlite("app.db")       # one opened for you

and add ``service.plugin()`` to the runner's plugins, so that each ADK run is
a turn of its session (see "Runs" below).

**Ids.** An ADK session is keyed by (app, user, session id). It lives in the
nous_actor session ``adk/s/<app>/<user>/<session>``, each part
percent-encoded where it must be (``/``, ``%``, whitespace and characters
that are not printable become ``%XX`` of their UTF-8 bytes; everything else
stays as it is), so the id obeys `nous_actor.core.ids` and `parse_key` gives
the three parts back. App state lives in ``adk/a/<app>``,
user state in ``adk/u/<app>/<user>``, the directory of a user's sessions (their
ids and state, which `list_sessions` reads) in ``adk/d/<app>/<user>``. A key
longer than the id rule allows (256 characters) is refused with a `ValueError`
naming the part to shorten.

**Events.** Each ADK event becomes one log event whose
``data["metadata"]["adk_event"]`` keeps it verbatim (``model_dump(mode="json",
exclude_none=True)``, as ADK's own database service stores it), so
`get_session` gives back equal events. The other fields are its chat view, so
``derive_messages``, compaction, fork and audit work on the session: a user's
text is a ``user_message``, a model's text (its thoughts as
``reasoning_content``) and function calls an ``assistant_message`` with tool
calls, function responses a ``tool_result``; an event with no content is a
``request_header`` (no message). The session-scoped part of its state delta is
kept beside it (``data["adk_state"]``), so the state folds without decoding
events.

**State** is ADK's: session-scoped keys in the session, ``app:`` and ``user:``
keys in sessions of their own (one per app, one per app and user), written by
the same state deltas and merged into every session `get_session` and
`list_sessions` return; ``temp:`` keys live only in the `Session` object of
the run and are never stored.

**Compaction.** An ADK compaction event (``actions.compaction``) becomes a
``system_message`` holding the summary that *replaces* the range of the
events it covers: the model-visible surface shows the summary, while the
events stay in the log (and `get_session` returns them all, as ADK expects).

**Nothing is deleted.** `delete_session` appends a deletion record: the
session is gone for ADK (``get_session`` gives ``None``, listings leave it
out, its id may be created again), while its history stays for audit.

**Runs.** The service never sees a run start or end, so the plugin does:
``service.plugin()`` opens a turn (`nous_actor.SessionHandle.turn`) on the
session when a run starts (ADK's ``on_user_message_callback``, else
``before_run_callback``) and closes it when the run ends
(``after_run_callback``, ``on_run_error_callback``). A concurrent run on the
same session then waits for it (policy ``enqueue``, the default) instead of
interleaving its events, and its `Session` object is brought up to date with
the first run's events before it goes on (it keeps the events it loaded and
gains every one committed since). A refused run reaches the caller as the
`RuntimeError` ADK's plugin manager raises from the `nous_actor.TurnBusy`:
`refused_by_turn` finds it. A compaction ADK writes after a run (outside its
turn) goes through the turn of the run after it, never waiting for it.

**Stale objects.** Appends of events never fail as stale; outside a run's
turn, an append whose state delta writes a key changed in storage since its
`Session` object was loaded raises ADK's ``StaleSessionError`` (it would lose
that change).

**Layout.** `framework` holds ADK's names; `records` the keys written; `ids`
the ids of sessions, state and directories; `events` the mapping of ADK
events to log events; `folds` what is read from a log. `service` holds
`NousSessionService`, one class with ADK's writes, holding a collaborator per
piece of its state, each in its module: `logs` (a handle per session and the
cached folds of their logs), `loads` (what each `Session` object returned has
seen), `locks` (the locks of a write checked for staleness), `turns` (the runs'
turns, and every write, through a run's turn when one is open), `state` (app
and user state, directories) and `reads` (the objects returned: get, list, a
run's refresh). `runs` holds `NousRunPlugin`, which calls the service through
a two-method protocol.
"""

from __future__ import annotations

from nous_actor.integrations.adk.events import event_data
from nous_actor.integrations.adk.ids import Kind as Kind
from nous_actor.integrations.adk.ids import _part as _part
from nous_actor.integrations.adk.ids import (
    app_key,
    directory_key,
    parse_key,
    session_key,
    user_key,
)
from nous_actor.integrations.adk.logs import CACHE_SIZE as CACHE_SIZE
from nous_actor.integrations.adk.records import ADK_EVENT_KEY
from nous_actor.integrations.adk.records import CHECKPOINT_EVERY as CHECKPOINT_EVERY
from nous_actor.integrations.adk.records import RECORD_KEY as RECORD_KEY
from nous_actor.integrations.adk.records import STATE_KEY as STATE_KEY
from nous_actor.integrations.adk.records import TIME_KEY as TIME_KEY
from nous_actor.integrations.adk.runs import NousRunPlugin, refused_by_turn
from nous_actor.integrations.adk.service import NousSessionService
from nous_actor.integrations.adk.turns import MAX_ATTEMPTS as MAX_ATTEMPTS

__all__ = [
    "ADK_EVENT_KEY",
    "NousRunPlugin",
    "NousSessionService",
    "app_key",
    "directory_key",
    "event_data",
    "parse_key",
    "refused_by_turn",
    "session_key",
    "user_key",
]
