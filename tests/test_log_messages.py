"""Messages into a log: `Log.append_message` and the event `message_event` makes of one."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_actor import EventType, Log, Message
from nous_actor.core.log import message_event
from nous_actor.testing import json_values

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FLAT = {"id": "c1", "name": "ls", "arguments": "{}"}
NESTED = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
CUSTOM = {"id": "c2", "type": "custom", "custom": {"name": "sh", "input": "ls"}}


def stored(message: Message | dict[str, Any]) -> Mapping[str, Any]:
    """The data ``Log.append_message`` stores for ``message`` (equal to plain JSON)."""
    (ev,) = Log().append_message(message).events()
    return ev.data


@pytest.mark.parametrize(
    ("given_dict", "data"),
    [
        ({"role": "user", "content": "hi"}, {"content": "hi"}),
        ({"role": "system", "content": "s", "name": None}, {"content": "s", "name": None}),
        (
            {"role": "assistant", "content": None, "tool_calls": [NESTED, CUSTOM]},
            {"content": None, "tool_calls": [FLAT, CUSTOM]},
        ),
        ({"role": "assistant", "tool_calls": [FLAT]}, {"tool_calls": [FLAT]}),
        (
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"content": "42", "tool_call_id": "c1"},
        ),
        (
            {"role": "developer", "content": "be brief"},
            {"content": "be brief", "metadata": {"openai_role": "developer"}},
        ),
        (
            {"role": "assistant", "content": "a", "refusal": None},
            {"content": "a", "metadata": {"openai_extra": {"refusal": None}}},
        ),
    ],
    ids=["user", "explicit_null_name", "calls", "no_content", "tool", "developer", "extra"],
)
def test_a_dict_is_stored_with_only_the_keys_it_has(
    given_dict: dict[str, Any], data: dict[str, Any]
) -> None:
    """append_message of an OpenAI dict stores the keys the dict has (function calls flat,
    custom calls as given), and metadata only for what from_openai keeps there."""
    assert stored(given_dict) == data


def test_a_dict_is_stored_as_append_would_store_it() -> None:
    """append_message({"role": "user", "content": "hi"}) stores what append does by hand."""
    by_hand = Log().append("user_message", {"content": "hi"}).events()[0]
    assert stored({"role": "user", "content": "hi"}) == by_hand.data


def test_a_message_keeps_the_seed_shape() -> None:
    """A Message is stored as Log.seed stores it, at its created_at."""
    m = Message.user("hi", created_at=T0)
    (ev,) = Log().append_message(m).events()
    assert (
        ev.data
        == Log.seed([m]).events()[0].data
        == {
            "content": "hi",
            "metadata": {},
            "name": None,
        }
    )
    assert ev.time == T0


def test_message_event_gives_type_data_and_time() -> None:
    """message_event: the type follows the role; a Message's time is its created_at, a
    dict's is None (the time of the append)."""
    m = Message.assistant("a", reasoning_content="r", created_at=T0)
    assert message_event(m) == (
        EventType.ASSISTANT_MESSAGE,
        {"content": "a", "metadata": {}, "name": None, "tool_calls": [], "reasoning_content": "r"},
        T0,
    )
    assert message_event({"role": "developer", "content": "x"}) == (
        EventType.SYSTEM_MESSAGE,
        {"content": "x", "metadata": {"openai_role": "developer"}},
        None,
    )


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (42, TypeError, "append_message takes a Message or an OpenAI message dict, got int"),
        ({"role": "wizard"}, ValueError, "'role' must be one of"),
        ({"role": "tool", "content": "x"}, ValueError, "'tool_call_id' is required"),
    ],
)
def test_message_event_refuses_what_append_message_refuses(
    bad: Any, error: type[Exception], match: str
) -> None:
    """message_event raises the TypeError / ValueError that append_message raises."""
    with pytest.raises(error, match=match):
        message_event(bad)
    with pytest.raises(error, match=match):
        Log().append_message(bad)


_text = st.text(max_size=8)
_calls = st.lists(
    st.sampled_from([FLAT, NESTED, CUSTOM, {**FLAT, "index": 0}]), min_size=0, max_size=3
)


@st.composite
def openai_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """OpenAI chat-completions dicts of every role, each optional key present or not."""
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    d: dict[str, Any] = {"role": role}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "content": st.none() | _text,
        "name": st.none() | _text,
        "x_vendor": json_values(2),
    }
    if role == "assistant":
        optional["tool_calls"] = st.none() | _calls
        optional["reasoning_content"] = st.none() | _text
    if role == "tool":
        d["tool_call_id"] = draw(_text)
    for key, values in optional.items():
        if draw(st.booleans()):
            d[key] = draw(values)
    return d


@given(openai_dicts())
def test_a_stored_dict_derives_to_from_openai_of_it(d: dict[str, Any]) -> None:
    """The message derived from an appended dict equals Message.from_openai(dict) (the
    projection fills what the dict lacked with the defaults), and stores no key more."""
    (ev,) = (log := Log().append_message(d)).events()
    assert log.derive_messages() == [Message.from_openai(d, created_at=ev.time)]
    assert set(ev.data) <= set(d) | {"metadata"}
