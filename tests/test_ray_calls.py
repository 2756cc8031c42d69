"""The calls a Ray shard runs are derived from the session actor's declarations (no
cluster needed): a handler's traits, including that a driver in another process may
send it, are declared once, by ``@call`` where it is defined."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from nous_actor.cluster.ray import _CALLS, _READS
from nous_actor.sessions.actor import SessionActor
from nous_actor.sessions.actor._calls import REMOTE, TURN_READS, handlers_with

# What a shard ran when the names were listed by hand: deriving them changes nothing.
SENT_BEFORE = {
    "h_append",
    "h_append_many",
    "h_append_at",
    "h_snapshot",
    "h_fork",
    "h_read",
    "h_log",
    "h_turn_open",
    "h_turn_call",
    "h_turn_read",
    "h_turn_end",
}


def test_a_shard_runs_the_handlers_declared_remote() -> None:
    assert {h.__name__: h for h in handlers_with(REMOTE)} == _CALLS
    # ... and what was declared since: the check of a forwarded call's record.
    assert set(_CALLS) == SENT_BEFORE | {"h_applied"}
    for name, handler in _CALLS.items():
        assert getattr(SessionActor, name) is handler


def test_a_shard_reads_what_a_turn_may_read() -> None:
    assert TURN_READS[SessionActor.h_read] == _READS
    assert {
        "derive_messages",
        "derive_indexed",
        "surface",
        "events",
        "since",
        "count",
        "as_of",
    } == _READS


def test_a_compaction_and_a_ping_are_not_sent_as_calls() -> None:
    """A compaction travels as its own kind (its compactor pickled); a turn's ping goes
    through ``h_turn_call``."""
    assert "h_compact" not in _CALLS
    assert "h_ping" not in _CALLS
