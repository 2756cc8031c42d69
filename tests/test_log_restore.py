"""Log.restore: a log of stored events in one step, equal to appending them one by one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from nous_actor import Event, InvalidEvent, Log

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _events(*seqs: int) -> list[Event]:
    return [Event(s, "user_message", T0, {"content": f"m{s}"}) for s in seqs]


def test_restore_equals_appending_each_event() -> None:
    """Restoring events with gaps gives the log `append_event` builds, count included."""
    evs = [*_events(0, 2, 3), Event(7, "system_message", T0, {"surface_op": ["replace", 0, 2]})]
    one_by_one = Log()
    for ev in evs:
        one_by_one = one_by_one.append_event(ev)
    restored = Log.restore(evs)
    assert restored == one_by_one
    assert restored.count() == 8
    assert restored.derive_messages() == one_by_one.derive_messages()


def test_restore_of_nothing_is_an_empty_log() -> None:
    """Restoring no events gives an empty log."""
    log = Log.restore([])
    assert (log.count(), log.events()) == (0, [])


@pytest.mark.parametrize("seqs", [(0, 1, 1), (0, 3, 2), (5, 4), (0, 1, 2, 0)])
def test_restore_refuses_seqs_that_do_not_increase(seqs: tuple[int, ...]) -> None:
    """A seq not above the one before it is refused as seq_behind_head, naming it."""
    with pytest.raises(InvalidEvent, match=r"append_at\(seq=\d+\) is behind the head") as info:
        Log.restore(_events(*seqs))
    assert info.value.reason == "seq_behind_head"


def test_restore_refuses_what_is_not_an_event() -> None:
    """An item that is not an Event is refused with a TypeError naming its type."""
    with pytest.raises(TypeError, match="restore takes Events, got dict"):
        Log.restore([*_events(0), {"seq": 1}])  # type: ignore[list-item]


def test_restore_names_the_first_problem_in_order() -> None:
    """Items are checked in order: a seq going back before a non-Event is the error."""
    with pytest.raises(InvalidEvent):
        Log.restore([*_events(3, 1), "not an event"])  # type: ignore[list-item]


def test_restore_accepts_a_subclass_of_event() -> None:
    """Instances of a subclass of Event are events too."""

    class Tagged(Event):
        pass

    evs = [Tagged(0, "user_message", T0, {"content": "a"}), *_events(1)]
    assert Log.restore(evs).events() == evs
