"""Message and Role (DESIGN.md §1): fields, freezing, time, and the OpenAI dict shape."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_actor import FrozenDict, FrozenList, Message, Role
from nous_actor.testing import json_values, messages

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
CALL = {"id": "c1", "name": "ls", "arguments": '{"path": "/"}'}
OPENAI_CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "ls", "arguments": '{"path": "/"}'},
}


# -- fields, defaults, Role -------------------------------------------------------------


def test_defaults_of_every_optional_field() -> None:
    """Only role is required; the other fields default to None, empty or now."""
    m = Message("user", created_at=T0)
    assert m.content is None
    assert m.reasoning_content is None
    assert m.tool_calls == []
    assert m.tool_call_id is None
    assert m.name is None
    assert m.metadata == {}


def test_created_at_defaults_to_now_in_utc() -> None:
    """Without created_at the message is stamped with the current UTC time."""
    before = datetime.now(UTC)
    m = Message("user")
    after = datetime.now(UTC)
    assert before <= m.created_at <= after
    assert m.created_at.utcoffset() == timedelta(0)


def test_role_is_a_str_enum_with_the_four_roles() -> None:
    """Role is a str-valued enum of exactly system, user, assistant and tool."""
    assert [r.value for r in Role] == ["system", "user", "assistant", "tool"]
    assert all(isinstance(r, str) for r in Role)
    assert Role("user") is Role.USER
    assert str(Role.USER) == "user"


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_plain_string_role_becomes_the_enum_member(role: str) -> None:
    """A plain string role is stored as the matching Role member."""
    assert Message(role, created_at=T0).role is Role(role)


def test_unknown_role_is_a_value_error_listing_the_roles() -> None:
    """An unknown role raises ValueError naming the accepted roles."""
    with pytest.raises(ValueError, match=r"Message\.role must be one of 'system', 'user'"):
        Message("admin")


def test_all_fields_are_kept() -> None:
    """Every field passed to the constructor is readable back unchanged."""
    m = Message(
        Role.ASSISTANT,
        "hi",
        reasoning_content="thinking",
        tool_calls=[CALL],
        tool_call_id="t1",
        name="bot",
        metadata={"k": 1},
        created_at=T0,
    )
    assert (m.role, m.content, m.reasoning_content) == (Role.ASSISTANT, "hi", "thinking")
    assert (m.tool_calls, m.tool_call_id, m.name) == ([CALL], "t1", "bot")
    assert (m.metadata, m.created_at) == ({"k": 1}, T0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"content": 5}, r"Message\.content must be a str"),
        ({"reasoning_content": 5}, r"Message\.reasoning_content must be a str or None"),
        ({"tool_call_id": 5}, r"Message\.tool_call_id must be a str or None"),
        ({"name": b"x"}, r"Message\.name must be a str or None"),
        ({"tool_calls": "ls"}, r"Message\.tool_calls must be a sequence of JSON objects"),
        ({"tool_calls": {"id": "c1"}}, r"Message\.tool_calls must be a sequence"),
        ({"tool_calls": ["ls"]}, r"Message\.tool_calls\[0\] must be a JSON object"),
        ({"metadata": ["k"]}, r"Message\.metadata must be a JSON object"),
        ({"metadata": {"when": T0}}, r"Message\.metadata\['when'\]"),
        ({"content": [{"x": {1, 2}}]}, r"Message\.content\[0\]\['x'\]"),
        ({"created_at": "2026-01-01"}, r"Message\.created_at must be a datetime"),
    ],
)
def test_wrong_field_type_is_a_type_error_naming_the_field(
    kwargs: dict[str, Any], match: str
) -> None:
    """A field of the wrong type, or holding a non-JSON value, raises TypeError naming it."""
    with pytest.raises(TypeError, match=match):
        Message("user", **kwargs)


# -- equality and immutability -----------------------------------------------------------


def _full(**changes: Any) -> Message:
    fields: dict[str, Any] = {
        "role": "assistant",
        "content": "hi",
        "reasoning_content": "r",
        "tool_calls": [CALL],
        "tool_call_id": "t",
        "name": "n",
        "metadata": {"k": [1]},
        "created_at": T0,
    }
    fields.update(changes)
    return Message(**fields)


def test_messages_with_the_same_fields_are_equal_and_hash_equal() -> None:
    """Two messages built from equal fields are equal and have equal hashes."""
    assert _full() == _full()
    assert hash(_full()) == hash(_full())


@pytest.mark.parametrize(
    "change",
    [
        {"role": "user"},
        {"content": "bye"},
        {"reasoning_content": None},
        {"tool_calls": []},
        {"tool_call_id": None},
        {"name": "other"},
        {"metadata": {"k": [2]}},
        {"created_at": T0 + timedelta(microseconds=1)},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_difference_in_any_one_field_makes_messages_unequal(change: dict[str, Any]) -> None:
    """Equality is field for field: changing any single field breaks it."""
    assert _full(**change) != _full()


def test_created_at_in_another_zone_at_the_same_instant_is_equal() -> None:
    """The same instant given in another timezone yields an equal message."""
    plus_two = T0.astimezone(timezone(timedelta(hours=2)))
    assert Message("user", "x", created_at=plus_two) == Message("user", "x", created_at=T0)


def test_tuple_content_equals_list_content() -> None:
    """Content given as a tuple of parts equals the same content given as a list."""
    parts: Any = ({"type": "text", "text": "a"},)
    assert Message("user", parts, created_at=T0) == Message("user", list(parts), created_at=T0)


def test_message_attributes_cannot_be_assigned() -> None:
    """Assigning to a field of a Message raises FrozenInstanceError."""
    m = _full()
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.content = "changed"  # type: ignore[misc]
    assert m.content == "hi"


def test_dataclasses_replace_revalidates_the_copy() -> None:
    """dataclasses.replace builds a changed message and still validates its fields."""
    assert dataclasses.replace(_full(), content="bye").content == "bye"
    with pytest.raises(ValueError, match="timezone-aware"):
        dataclasses.replace(_full(), created_at=datetime(2026, 1, 1))


@given(messages())
def test_pickle_round_trip(m: Message) -> None:
    """A pickled message unpickles equal to itself."""
    assert pickle.loads(pickle.dumps(m)) == m


# -- convenience constructors ------------------------------------------------------------


def test_system_constructor() -> None:
    """Message.system builds a system message with the given content and fields."""
    m = Message.system("be brief", name="policy", created_at=T0)
    assert m == Message("system", "be brief", name="policy", created_at=T0)


def test_user_constructor() -> None:
    """Message.user builds a user message with the given content."""
    assert Message.user("hi", created_at=T0) == Message("user", "hi", created_at=T0)


def test_assistant_constructor_with_tool_calls() -> None:
    """Message.assistant carries optional content and tool calls."""
    m = Message.assistant(tool_calls=[CALL], created_at=T0)
    assert m == Message("assistant", None, tool_calls=[CALL], created_at=T0)


def test_assistant_constructor_defaults_to_no_tool_calls() -> None:
    """Message.assistant without tool calls has an empty tool_calls sequence."""
    assert Message.assistant("ok").tool_calls == []


def test_tool_constructor() -> None:
    """Message.tool builds a tool result answering tool_call_id."""
    m = Message.tool("42", "c1", created_at=T0)
    assert m == Message("tool", "42", tool_call_id="c1", created_at=T0)


# -- deep freezing -----------------------------------------------------------------------


def test_caller_mutating_content_list_changes_nothing() -> None:
    """Mutating the caller's content list after construction leaves the message unchanged."""
    part = {"type": "text", "text": "a"}
    parts = [part]
    m = Message.user(parts)
    parts.append({"type": "text", "text": "b"})
    part["text"] = "changed"
    assert m.content == [{"type": "text", "text": "a"}]


def test_caller_mutating_tool_calls_changes_nothing() -> None:
    """Mutating the caller's tool_calls list or call dicts leaves the message unchanged."""
    call = dict(CALL)
    calls = [call]
    m = Message.assistant(tool_calls=calls)
    calls.append(dict(CALL))
    call["name"] = "rm"
    assert m.tool_calls == [CALL]


def test_caller_mutating_nested_metadata_changes_nothing() -> None:
    """Mutating a dict nested in the caller's metadata leaves the message unchanged."""
    inner: dict[str, Any] = {"tags": ["a"]}
    meta: dict[str, Any] = {"inner": inner}
    m = Message.user("x", metadata=meta)
    inner["tags"].append("b")
    inner["new"] = 1
    meta["top"] = 2
    assert m.metadata == {"inner": {"tags": ["a"]}}


def test_fields_are_frozen_containers() -> None:
    """content, tool_calls and metadata are stored as FrozenList / FrozenDict at every depth."""
    m = Message.assistant(
        [{"type": "text", "text": "a"}], tool_calls=[CALL], metadata={"k": {"j": [1]}}
    )
    assert isinstance(m.content, FrozenList)
    assert isinstance(m.content[0], FrozenDict)
    assert isinstance(m.tool_calls, FrozenList)
    assert isinstance(m.tool_calls[0], FrozenDict)
    assert isinstance(m.metadata["k"]["j"], FrozenList)


def test_metadata_refuses_mutation_and_says_how_to_copy() -> None:
    """Setting a metadata key raises TypeError that suggests building a changed copy."""
    m = Message.user("x", metadata={"k": 1})
    with pytest.raises(TypeError, match=re.escape("{**value, key: new}")):
        m.metadata["k"] = 2  # type: ignore[index]
    assert m.metadata == {"k": 1}


def test_tool_calls_refuse_mutation_and_say_how_to_copy() -> None:
    """Appending to tool_calls raises TypeError that suggests building a changed copy."""
    m = Message.assistant(tool_calls=[CALL])
    with pytest.raises(TypeError, match=re.escape("[*value, item]")):
        m.tool_calls.append(CALL)  # type: ignore[attr-defined]
    assert m.tool_calls == [CALL]


def test_content_parts_refuse_mutation() -> None:
    """A content part dict of a message cannot be changed in place."""
    m = Message.user([{"type": "text", "text": "a"}])
    with pytest.raises(TypeError, match="FrozenDict is immutable"):
        m.content[0]["text"] = "b"  # type: ignore[index]


# -- created_at --------------------------------------------------------------------------


def test_naive_created_at_is_a_value_error() -> None:
    """A naive created_at raises ValueError saying to attach a timezone."""
    with pytest.raises(ValueError, match="created_at must be timezone-aware"):
        Message("user", created_at=datetime(2026, 1, 1))


def test_created_at_is_normalised_to_utc() -> None:
    """An aware created_at in another zone is stored as the same instant in UTC."""
    local = datetime(2026, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    m = Message("user", created_at=local)
    assert m.created_at.tzinfo is UTC
    assert m.created_at == local
    assert m.created_at.hour == 12


# -- to_openai ---------------------------------------------------------------------------


def test_to_openai_user_message() -> None:
    """A plain user message becomes {"role", "content"} and nothing else."""
    assert Message.user("hi", created_at=T0).to_openai() == {"role": "user", "content": "hi"}


def test_to_openai_includes_name_when_set() -> None:
    """A message with a name sends it."""
    assert Message.user("hi", name="ann").to_openai() == {
        "role": "user",
        "content": "hi",
        "name": "ann",
    }


def test_to_openai_tool_calls_use_the_function_shape() -> None:
    """Tool calls become {"id", "type": "function", "function": {"name", "arguments"}}."""
    out = Message.assistant(None, tool_calls=[CALL]).to_openai()
    assert out == {"role": "assistant", "content": None, "tool_calls": [OPENAI_CALL]}


def test_to_openai_dumps_non_string_arguments_as_json() -> None:
    """Tool-call arguments given as a JSON object are sent as a JSON string."""
    args = {"path": "/", "deep": [1, {"x": None}]}
    out = Message.assistant(tool_calls=[{"id": "c1", "name": "ls", "arguments": args}])
    sent = out.to_openai()["tool_calls"][0]["function"]["arguments"]
    assert isinstance(sent, str)
    assert json.loads(sent) == args


def test_to_openai_tool_message_carries_tool_call_id() -> None:
    """A tool result sends its tool_call_id."""
    assert Message.tool("42", "c1").to_openai() == {
        "role": "tool",
        "content": "42",
        "tool_call_id": "c1",
    }


def test_to_openai_sends_reasoning_content_only_when_set() -> None:
    """reasoning_content appears in the dict when set and is absent when None."""
    assert Message.assistant("a", reasoning_content="why").to_openai()["reasoning_content"] == (
        "why"
    )
    assert "reasoning_content" not in Message.assistant("a").to_openai()


def test_to_openai_does_not_send_metadata_or_created_at() -> None:
    """metadata (other than openai_extra) and created_at are not sent to the provider."""
    out = Message.user("hi", metadata={"trace": "t"}, created_at=T0).to_openai()
    assert out == {"role": "user", "content": "hi"}


def test_to_openai_returns_plain_mutable_values() -> None:
    """The returned dict holds plain lists and dicts, so mutating it leaves the message alone."""
    m = Message.assistant([{"type": "text", "text": "a"}], tool_calls=[CALL])
    out = m.to_openai()
    assert type(out["content"]) is list
    assert type(out["content"][0]) is dict
    out["content"][0]["text"] = "b"
    out["tool_calls"].append("x")
    assert m.content == [{"type": "text", "text": "a"}]
    assert m.tool_calls == [CALL]


# -- from_openai -------------------------------------------------------------------------


def test_from_openai_user_message() -> None:
    """A user dict becomes a user Message with the same content and name."""
    m = Message.from_openai({"role": "user", "content": "hi", "name": "ann"}, created_at=T0)
    assert m == Message("user", "hi", name="ann", created_at=T0)


def test_from_openai_converts_tool_calls_to_the_library_shape() -> None:
    """OpenAI tool calls become {"id", "name", "arguments"} dicts."""
    m = Message.from_openai({"role": "assistant", "content": None, "tool_calls": [OPENAI_CALL]})
    assert m.tool_calls == [CALL]


def test_from_openai_tool_call_type_defaults_to_function() -> None:
    """A tool call without "type" is read as a function call."""
    call = {"id": "c1", "function": {"name": "ls", "arguments": "{}"}}
    m = Message.from_openai({"role": "assistant", "tool_calls": [call]})
    assert m.tool_calls == [{"id": "c1", "name": "ls", "arguments": "{}"}]


def test_from_openai_accepts_object_arguments() -> None:
    """Arguments given as a JSON object are kept as that object."""
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": {"p": 1}}}
    m = Message.from_openai({"role": "assistant", "tool_calls": [call]})
    assert m.tool_calls[0]["arguments"] == {"p": 1}


def test_from_openai_tool_message() -> None:
    """A tool dict becomes a tool Message with its tool_call_id."""
    m = Message.from_openai({"role": "tool", "content": "42", "tool_call_id": "c1"})
    assert (m.role, m.content, m.tool_call_id) == (Role.TOOL, "42", "c1")


def test_from_openai_maps_reasoning_content_to_its_field() -> None:
    """A provider's reasoning_content key lands in the reasoning_content field, not metadata."""
    m = Message.from_openai({"role": "assistant", "content": "a", "reasoning_content": "why"})
    assert m.reasoning_content == "why"
    assert m.metadata == {}


def test_from_openai_keeps_unknown_keys_under_openai_extra() -> None:
    """Provider keys with no Message field are kept in metadata["openai_extra"]."""
    d = {"role": "assistant", "content": "a", "refusal": None, "audio": {"id": "au1"}}
    m = Message.from_openai(d)
    assert m.metadata == {"openai_extra": {"refusal": None, "audio": {"id": "au1"}}}


def test_to_openai_puts_openai_extra_keys_back() -> None:
    """Keys kept under openai_extra are sent again as top-level keys."""
    d = {"role": "assistant", "content": "a", "refusal": None, "audio": {"id": "au1"}}
    assert Message.from_openai(d).to_openai() == d


def test_from_openai_uses_the_given_created_at() -> None:
    """The created_at keyword becomes the message's created_at."""
    assert Message.from_openai({"role": "user", "content": "x"}, created_at=T0).created_at == T0


def test_from_openai_does_not_keep_references_to_the_input() -> None:
    """Mutating the provider dict after conversion leaves the message unchanged."""
    d: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "a"}], "x": [1]}
    m = Message.from_openai(d)
    d["content"][0]["text"] = "b"
    d["x"].append(2)
    assert m.content == [{"type": "text", "text": "a"}]
    assert m.metadata == {"openai_extra": {"x": [1]}}


_text = st.text(max_size=10)
_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2)
_extras = st.dictionaries(
    st.sampled_from(["refusal", "audio", "annotations", "function_call", "x_vendor"]),
    json_values(4),
    max_size=2,
)
_openai_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": _text,
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": _text, "arguments": _text}),
        }
    ),
    min_size=1,
    max_size=3,
)


@st.composite
def openai_messages(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed OpenAI chat-completions message dicts, with optional provider extras."""
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    d: dict[str, Any] = {"role": role}
    if role == "assistant":
        d["content"] = draw(st.none() | _text | _parts)
        if draw(st.booleans()):
            d["tool_calls"] = draw(_openai_calls)
        if draw(st.booleans()):
            d["reasoning_content"] = draw(_text)
    else:
        d["content"] = draw(_text | _parts)
    if role == "tool":
        d["tool_call_id"] = draw(_text)
    if draw(st.booleans()):
        d["name"] = draw(_text)
    d.update(draw(_extras))
    return d


@given(openai_messages())
def test_openai_round_trip(d: dict[str, Any]) -> None:
    """to_openai(from_openai(d)) == d for every well-formed OpenAI message dict."""
    assert Message.from_openai(d).to_openai() == d


_sendable = messages().filter(lambda m: m.role is not Role.TOOL or m.tool_call_id is not None)


@given(_sendable)
def test_message_round_trips_through_openai_shape_on_the_sent_fields(m: Message) -> None:
    """from_openai(m.to_openai()) keeps role, content, name and (for tools) tool_call_id."""
    back = Message.from_openai(m.to_openai(), created_at=m.created_at)
    assert (back.role, back.content, back.name) == (m.role, m.content, m.name)
    if m.role is Role.TOOL:
        assert back.tool_call_id == m.tool_call_id


_GOOD_CALL: dict[str, Any] = {
    "id": "c1",
    "type": "function",
    "function": {"name": "ls", "arguments": "{}"},
}


def _with_call(**changes: Any) -> dict[str, Any]:
    call: dict[str, Any] = {**_GOOD_CALL, **changes}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _with_fn(**changes: Any) -> dict[str, Any]:
    return _with_call(function={**_GOOD_CALL["function"], **changes})


MALFORMED: list[tuple[Any, str]] = [
    (["role", "user"], r"an OpenAI message must be a dict, got list"),
    ({"content": "x"}, r"'role' must be one of 'system', 'user'.*got None"),
    ({"role": "admin", "content": "x"}, r"'role' must be one of .*got 'admin'"),
    ({"role": "user", "content": 5}, r"'content' must be a str, a list of content parts or null"),
    ({"role": "user", "content": ("a",)}, r"'content' must be a str"),
    ({"role": "user", "content": [{"x": {1}}]}, r"content\[0\]\['x'\]"),
    ({"role": "user", "content": "x", "name": 5}, r"'name' must be a str or null, got int"),
    ({"role": "tool", "content": "x", "tool_call_id": 5}, r"'tool_call_id' must be a str"),
    ({"role": "tool", "content": "x"}, r"'tool_call_id' is required on a 'tool' message"),
    ({"role": "assistant", "reasoning_content": 1}, r"'reasoning_content' must be a str"),
    ({"role": "assistant", "tool_calls": "ls"}, r"'tool_calls' must be a list, got str"),
    ({"role": "assistant", "tool_calls": ["ls"]}, r"'tool_calls'\[0\] must be a dict, got str"),
    (_with_call(id=None), r"'tool_calls'\[0\]\['id'\] must be a str, got None"),
    (_with_call(type="code"), r"'tool_calls'\[0\]\['type'\] must be 'function', got 'code'"),
    (_with_call(function="ls"), r"'tool_calls'\[0\]\['function'\] must be a dict"),
    (_with_fn(name=None), r"'tool_calls'\[0\]\['function'\]\['name'\] must be a str"),
    (_with_fn(arguments=[1]), r"'tool_calls'\[0\]\['function'\]\['arguments'\] must be a JSON"),
    (_with_fn(arguments=None), r"'tool_calls'\[0\]\['function'\]\['arguments'\]"),
    (_with_fn(arguments={"x": float("nan")}), r"tool_calls\[0\]\['arguments'\]\['x'\]"),
    ({"role": "user", "content": "x", "audio": {1, 2}}, r"\['openai_extra'\]\['audio'\]"),
]


@pytest.mark.parametrize(("d", "match"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_openai_dict_is_a_value_error_naming_the_field(d: Any, match: str) -> None:
    """Every malformed provider dict raises ValueError whose message names the bad field."""
    with pytest.raises(ValueError, match=match):
        Message.from_openai(d)


@pytest.mark.parametrize("role", [["user"], {"r": "user"}], ids=["list", "dict"])
def test_unhashable_role_is_a_value_error(role: Any) -> None:
    """A role of an unhashable type raises ValueError naming 'role', not TypeError."""
    with pytest.raises(ValueError, match="'role' must be one of"):
        Message.from_openai({"role": role, "content": "x"})


@pytest.mark.parametrize("calls", [{}, "", 0, False], ids=repr)
def test_falsy_non_list_tool_calls_is_a_value_error(calls: Any) -> None:
    """A tool_calls value that is not a list raises ValueError even when it is falsy."""
    with pytest.raises(ValueError, match="'tool_calls' must be a list"):
        Message.from_openai({"role": "assistant", "content": "x", "tool_calls": calls})
