"""`has_key`: a look for one top-level key of an event's data that leaves a held text
undecoded when the text cannot hold the key (the turn rules' walk back through a
recovered history)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nous_actor import Log, SQLiteStore
from nous_actor.core.codec import event_from_row
from nous_actor.core.event import has_key
from nous_actor.sessions.turns._rules import open_turn

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIME = "2026-01-01T00:00:00+00:00"

keys = st.sampled_from(["turn_id", "content", "turn", "id", "turn_id_x", "x"])
values = st.recursive(
    st.none() | st.integers() | st.text(max_size=8) | keys,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(keys, values, max_size=4), st.booleans())
def test_has_key_answers_as_the_decoded_data_does(data: dict[str, object], escape: bool) -> None:
    """Whatever the data (the key nested in values, as a value, as a prefix of another
    key; the text written with \\u escapes or not), the answer is the decoded data's."""
    text = json.dumps(data, ensure_ascii=True)
    if escape:  # a text spelling every underscore with an escape
        text = text.replace("_", "\\u005f")
    ev = event_from_row(0, "turn_start", TIME, text)
    assert has_key(ev, "turn_id") == ("turn_id" in json.loads(text))


def test_the_open_turn_walk_decodes_no_unmanaged_turn_event(tmp_path: Path) -> None:
    """A recovered history of turns without a turn id (unmanaged ones): the walk back
    for an open managed turn reads each turn event's text and decodes none of them."""
    log = Log()
    for i in range(50):
        log = log.append("turn_start", {"run": i}, T0)
        log = log.append("user_message", {"content": f"q{i}"}, T0)
        log = log.append("turn_end", {"run": i}, T0)
    store = SQLiteStore(tmp_path / "t.db")
    store.write({"s": log.events()})
    recovered = Log.restore(store.load("s"))
    store.close()
    assert open_turn(recovered) is None
    held = [ev for ev in recovered.events() if isinstance(ev._data, str)]
    assert len(held) == len(recovered.events())  # none was decoded
    managed = recovered.append("turn_start", {"turn_id": "t1", "policy": "reject"}, T0)
    found = open_turn(managed)
    assert found is not None
    assert found.data["turn_id"] == "t1"
