"""Message and Role (DESIGN.md §1): fields, freezing, time, and the OpenAI dict shape."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_actor import FrozenDict, FrozenList, Log, Message, Role
from nous_actor.core.message import UnsendableMessage, tool_call_parts
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
    """A pickled message unpickles equal to itself, as frozen as it was (it is unpickled
    without its checks: every field as it was, of the same types)."""
    back = pickle.loads(pickle.dumps(m))
    assert back == m
    assert type(back) is Message
    assert hash(back) == hash(m)
    for f in dataclasses.fields(Message):
        assert type(getattr(back, f.name)) is type(getattr(m, f.name)), f.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.content = "changed"  # type: ignore[misc]


def test_a_subclass_of_message_pickles_as_itself() -> None:
    back = pickle.loads(pickle.dumps(_Tagged("user", "hi")))
    assert type(back) is _Tagged
    assert back == _Tagged("user", "hi", created_at=back.created_at)


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class _Tagged(Message):
    pass


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


_custom_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": _text,
            "type": st.just("custom"),
            "custom": st.fixed_dictionaries({"name": _text, "input": _text}),
        }
    ),
    min_size=1,
    max_size=2,
)


@st.composite
def openai_messages(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed OpenAI chat-completions message dicts (every role, developer included;
    function and custom tool calls), with optional provider extras."""
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    d: dict[str, Any] = {"role": role}
    if role == "assistant":
        d["content"] = draw(st.none() | _text | _parts)
        if draw(st.booleans()):
            d["tool_calls"] = draw(
                st.lists(_openai_calls | _custom_calls, min_size=1, max_size=2).map(
                    lambda groups: [call for group in groups for call in group]
                )
            )
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
    (
        _with_call(type="code"),
        r"'tool_calls'\[0\]\['type'\] must be 'function' or 'custom', got 'code'",
    ),
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


# -- both tool-call shapes; what cannot be sent is an error, never a guess -----------------

WEATHER: dict[str, Any] = {
    "id": "c1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


def _derived(etype: str, data: dict[str, Any]) -> Message:
    """The message a log projects from one event: its fields straight from ``data``."""
    (m,) = Log().append(etype, data, T0).derive_messages()
    return m


def test_an_openai_shaped_tool_call_appended_to_a_log_is_sent_intact() -> None:
    """The reported case: an OpenAI-shaped call in event data is sent with its name and
    arguments, not as {"name": null, "arguments": "{}"}."""
    m = _derived("assistant_message", {"tool_calls": [WEATHER]})
    assert m.to_openai() == {"role": "assistant", "content": None, "tool_calls": [WEATHER]}


def test_an_openai_shaped_tool_call_on_a_message_is_sent_intact() -> None:
    """Message(tool_calls=[OpenAI's shape]) sends that call as it is."""
    assert Message.assistant(tool_calls=[WEATHER]).to_openai()["tool_calls"] == [WEATHER]


def test_flat_and_openai_shapes_of_one_call_send_the_same_payload() -> None:
    """{"id", "name", "arguments"} and OpenAI's shape of the same call send one payload."""
    flat = {"id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert (
        Message.assistant(tool_calls=[flat]).to_openai()
        == Message.assistant(tool_calls=[WEATHER]).to_openai()
    )


def test_object_arguments_are_sent_as_a_json_string_in_both_shapes() -> None:
    """Arguments given as an object are json.dumps-ed, in the flat and in OpenAI's shape."""
    args = {"city": "Tromsø", "days": [1, 2]}
    flat = {"id": "c1", "name": "f", "arguments": args}
    nested = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
    for call in (flat, nested):
        sent = Message.assistant(tool_calls=[call]).to_openai()["tool_calls"][0]
        assert isinstance(sent["function"]["arguments"], str)
        assert json.loads(sent["function"]["arguments"]) == args


def test_other_keys_of_a_tool_call_are_sent_not_dropped() -> None:
    """Keys of a call beyond id/name/arguments (a provider's extra_content, an index) are
    sent; so are keys of OpenAI's function object beyond name/arguments."""
    flat = {"id": "c1", "name": "f", "arguments": "{}", "extra_content": {"sig": "x"}}
    nested = {
        "id": "c2",
        "type": "function",
        "function": {"name": "g", "arguments": "{}", "strict": True},
        "index": 1,
    }
    sent = Message.assistant(tool_calls=[flat, nested]).to_openai()["tool_calls"]
    assert sent == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "f", "arguments": "{}"},
            "extra_content": {"sig": "x"},
        },
        nested,
    ]


def test_tool_call_id_on_another_role_is_sent_not_dropped() -> None:
    """A tool_call_id set on a message that is not a tool result is still sent."""
    assert Message.user("x", tool_call_id="c1").to_openai()["tool_call_id"] == "c1"


# -- the chat-completions shapes in current use: developer, custom tool calls ---------------

DEVELOPER = {"role": "developer", "content": "Answer in French."}
SHELL: dict[str, Any] = {
    "id": "call_9",
    "type": "custom",
    "custom": {"name": "shell", "input": "ls -la /tmp"},
}


def test_a_developer_message_is_a_system_message_that_remembers_its_role() -> None:
    """from_openai takes role "developer" as a system message with metadata["openai_role"]."""
    m = Message.from_openai(DEVELOPER, created_at=T0)
    assert m == Message.system(
        "Answer in French.", metadata={"openai_role": "developer"}, created_at=T0
    )


def test_a_developer_message_is_sent_as_developer_without_the_marker() -> None:
    """to_openai gives back role "developer" and does not send metadata["openai_role"]."""
    with_extra = {**DEVELOPER, "name": "ops", "x_vendor": 1}
    assert Message.from_openai(with_extra).to_openai() == with_extra
    plain = Message.system("s", metadata={"openai_role": "system"}).to_openai()
    assert plain == {"role": "system", "content": "s"}


def test_the_role_enum_has_no_developer_and_says_how_to_make_one() -> None:
    """Message("developer") stays refused, and the error says what to pass instead."""
    assert "developer" not in {r.value for r in Role}
    with pytest.raises(ValueError, match=r"metadata=\{'openai_role': 'developer'\}"):
        Message("developer", "x")


def test_a_custom_tool_call_is_kept_and_sent_as_given() -> None:
    """An assistant's custom tool call is held as it came and sent back unchanged."""
    d = {"role": "assistant", "content": None, "tool_calls": [SHELL, OPENAI_CALL]}
    m = Message.from_openai(d)
    assert m.tool_calls == [SHELL, CALL]
    assert m.to_openai() == d
    assert tool_call_parts(SHELL) == ("call_9", "shell", "ls -la /tmp")


def test_developer_and_custom_calls_go_through_append_message() -> None:
    """Log.append_message takes both shapes; the derived surface sends them back as given."""
    reply = {"role": "assistant", "content": None, "tool_calls": [SHELL]}
    result = {"role": "tool", "content": "a.txt", "tool_call_id": "call_9"}
    log = Log().append_message(DEVELOPER).append_message(reply).append_message(result)
    assert [e.type.value for e in log.events()] == [
        "system_message",
        "assistant_message",
        "tool_result",
    ]
    assert Message.to_openai_list(log.derive_messages()) == [DEVELOPER, reply, result]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ({**SHELL, "custom": None}, r"'tool_calls'\[0\]\['custom'\] must be an object"),
        ({**SHELL, "custom": {"input": "ls"}}, r"\['custom'\]\['name'\] must be a str, got None"),
        (
            {**SHELL, "custom": {"name": "sh", "input": 1}},
            r"\['custom'\]\['input'\] must be a str",
        ),
        ({**SHELL, "id": 7}, r"'tool_calls'\[0\]\['id'\] must be a str, got 7"),
    ],
    ids=["no_custom", "no_name", "int_input", "int_id"],
)
def test_a_malformed_custom_call_is_a_value_error_naming_the_field(
    call: dict[str, Any], match: str
) -> None:
    """from_openai refuses a custom call without a str id, name or input, naming the field."""
    with pytest.raises(ValueError, match=match):
        Message.from_openai({"role": "assistant", "tool_calls": [call]})


UNSENDABLE: list[tuple[str, Callable[[], Message], str, str]] = [
    # (id, the message, the field named, text of the error)
    (
        "flat_call_without_name",
        lambda: Message.assistant(tool_calls=[{"id": "c1", "arguments": "{}"}]),
        "tool_calls[0]['name']",
        "tool_calls[0]['name'] is missing",
    ),
    (
        "flat_call_with_null_name",
        lambda: Message.assistant(tool_calls=[{"id": "c1", "name": None, "arguments": "{}"}]),
        "tool_calls[0]['name']",
        "tool_calls[0]['name'] is missing",
    ),
    (
        "openai_call_without_name",
        lambda: Message.assistant(
            tool_calls=[{"id": "c1", "type": "function", "function": {"arguments": "{}"}}]
        ),
        "tool_calls[0]['function']['name']",
        "tool_calls[0]['function']['name'] is missing",
    ),
    (
        "call_without_id",
        lambda: Message.assistant(tool_calls=[CALL, {"name": "ls", "arguments": "{}"}]),
        "tool_calls[1]['id']",
        "tool_calls[1]['id'] is missing",
    ),
    (
        "call_with_int_id",
        lambda: Message.assistant(tool_calls=[{"id": 7, "name": "ls", "arguments": "{}"}]),
        "tool_calls[0]['id']",
        "tool_calls[0]['id'] is a int, not a str",
    ),
    (
        "call_with_int_name",
        lambda: Message.assistant(tool_calls=[{"id": "c", "name": 7, "arguments": "{}"}]),
        "tool_calls[0]['name']",
        "is a int, not a str",
    ),
    (
        "call_without_arguments",
        lambda: Message.assistant(tool_calls=[{"id": "c1", "name": "ls"}]),
        "tool_calls[0]['arguments']",
        "tool_calls[0]['arguments'] is missing (send '{}' for a call without arguments)",
    ),
    (
        "openai_call_with_null_arguments",
        lambda: Message.assistant(
            tool_calls=[
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": None}}
            ]
        ),
        "tool_calls[0]['function']['arguments']",
        "['function']['arguments'] is missing",
    ),
    (
        "call_with_list_arguments",
        lambda: Message.assistant(tool_calls=[{"id": "c", "name": "f", "arguments": [1]}]),
        "tool_calls[0]['arguments']",
        "tool_calls[0]['arguments'] is a FrozenList",
    ),
    (
        "call_of_another_type",
        lambda: Message.assistant(tool_calls=[{**CALL, "type": "mcp"}]),
        "tool_calls[0]['type']",
        "is 'mcp', and only 'function' and 'custom' calls can be sent",
    ),
    (
        "custom_call_without_custom",
        lambda: Message.assistant(tool_calls=[{**CALL, "type": "custom"}]),
        "tool_calls[0]['custom']",
        "tool_calls[0]['custom'] must be an object with 'name' and 'input', got None",
    ),
    (
        "custom_call_without_input",
        lambda: Message.assistant(
            tool_calls=[{"id": "c1", "type": "custom", "custom": {"name": "sh"}}]
        ),
        "tool_calls[0]['custom']['input']",
        "tool_calls[0]['custom']['input'] must be a str, got None",
    ),
    (
        "custom_call_without_id",
        lambda: Message.assistant(tool_calls=[{"type": "custom", "custom": SHELL["custom"]}]),
        "tool_calls[0]['id']",
        "tool_calls[0]['id'] must be a str, got None",
    ),
    (
        "openai_role_on_another_role",
        lambda: Message.user("x", metadata={"openai_role": "developer"}),
        "metadata['openai_role']",
        "metadata['openai_role'] is 'developer'; only 'developer' on a system message",
    ),
    (
        "openai_role_unknown",
        lambda: Message.system("x", metadata={"openai_role": "critic"}),
        "metadata['openai_role']",
        "metadata['openai_role'] is 'critic'",
    ),
    (
        "call_in_both_shapes",
        lambda: Message.assistant(tool_calls=[{**WEATHER, "name": "other"}]),
        "tool_calls[0]",
        "has both the flat keys ('name', 'arguments') and OpenAI's 'function'",
    ),
    (
        "function_not_an_object",
        lambda: Message.assistant(tool_calls=[{"id": "c", "function": "ls"}]),
        "tool_calls[0]['function']",
        "tool_calls[0]['function'] is a str, not a JSON object",
    ),
    (
        "tool_without_tool_call_id",
        lambda: Message.tool("42", None),
        "tool_call_id",
        "tool_call_id is missing; a tool message must name the call it answers",
    ),
    (
        "derived_tool_without_tool_call_id",
        lambda: _derived("tool_result", {"content": "42"}),
        "tool_call_id",
        "tool_call_id is missing",
    ),
    (
        "derived_content_an_int",
        lambda: _derived("user_message", {"content": 5}),
        "content",
        "content is a int; send a str, a list of content parts or None",
    ),
    (
        "derived_content_an_object",
        lambda: _derived("user_message", {"content": {"text": "x"}}),
        "content",
        "content is a FrozenDict",
    ),
    (
        "derived_name_an_int",
        lambda: _derived("user_message", {"content": "x", "name": 5}),
        "name",
        "name is a int; send a str or leave it unset (None)",
    ),
    (
        "derived_tool_call_id_a_list",
        lambda: _derived("tool_result", {"content": "x", "tool_call_id": ["c"]}),
        "tool_call_id",
        "tool_call_id is a FrozenList",
    ),
    (
        "derived_reasoning_an_int",
        lambda: _derived("assistant_message", {"reasoning_content": 1}),
        "reasoning_content",
        "reasoning_content is a int",
    ),
    (
        "derived_tool_calls_an_object",
        lambda: _derived("assistant_message", {"tool_calls": {"id": "c1"}}),
        "tool_calls",
        "tool_calls is a FrozenDict, not a list",
    ),
    (
        "derived_tool_calls_a_str",
        lambda: _derived("assistant_message", {"tool_calls": "ls"}),
        "tool_calls",
        "tool_calls is a str, not a list",
    ),
    (
        "derived_call_not_an_object",
        lambda: _derived("assistant_message", {"tool_calls": ["ls"]}),
        "tool_calls[0]",
        "tool_calls[0] is a str, not a JSON object",
    ),
    (
        "openai_extra_not_an_object",
        lambda: Message.user("x", metadata={"openai_extra": [1]}),
        "metadata['openai_extra']",
        "metadata['openai_extra'] is a FrozenList; it must be an object of provider keys",
    ),
    (
        "openai_extra_shadowing_a_field",
        lambda: Message.user("x", metadata={"openai_extra": {"name": "bob"}}),
        "metadata['openai_extra']['name']",
        "would stand in for the message's own field; set the Message field 'name' instead",
    ),
]


@pytest.mark.parametrize(
    ("make", "field", "text"), [u[1:] for u in UNSENDABLE], ids=[u[0] for u in UNSENDABLE]
)
def test_what_cannot_be_sent_is_an_error_naming_the_message_and_the_field(
    make: Callable[[], Message], field: str, text: str
) -> None:
    """to_openai raises UnsendableMessage (a ValueError) naming the role and the field,
    instead of sending a null, a "{}" or nothing in its place."""
    m = make()
    with pytest.raises(
        UnsendableMessage, match=f"^cannot send this {m.role.value} message: .*{re.escape(text)}"
    ) as info:
        m.to_openai()
    assert (info.value.role, info.value.field, info.value.index) == (m.role.value, field, None)
    assert isinstance(info.value, ValueError)


def test_to_openai_list_names_the_index_of_the_message_that_cannot_be_sent() -> None:
    """Sending a list, the error names the position of the bad message too."""
    ms = [Message.user("q"), Message.assistant(tool_calls=[CALL]), Message.tool("a", None)]
    with pytest.raises(
        UnsendableMessage, match=r"^cannot send this message 2 \(tool\): tool_call_id is missing"
    ) as info:
        Message.to_openai_list(ms)
    assert info.value.index == 2


def test_to_openai_list_sends_every_message() -> None:
    """to_openai_list is to_openai of each message, in order."""
    ms = [Message.user("q"), Message.assistant(tool_calls=[WEATHER]), Message.tool("a", "c1")]
    assert Message.to_openai_list(ms) == [m.to_openai() for m in ms]
    with pytest.raises(TypeError, match="to_openai_list takes Messages, got dict at index 0"):
        Message.to_openai_list([{"role": "user"}])  # type: ignore[list-item]


def test_unsendable_message_pickles_with_its_fields() -> None:
    """UnsendableMessage survives pickling (e.g. across a process boundary) with its fields."""
    err = UnsendableMessage("tool", "tool_call_id", "is missing", 3)
    back = pickle.loads(pickle.dumps(err))
    assert (back.role, back.field, back.detail, back.index, str(back)) == (
        "tool",
        "tool_call_id",
        "is missing",
        3,
        str(err),
    )


def test_from_openai_accepts_a_flat_tool_call() -> None:
    """A provider dict whose calls are in the flat shape is read too (and sent as OpenAI's)."""
    flat = {"id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    m = Message.from_openai({"role": "assistant", "content": None, "tool_calls": [flat]})
    assert m.tool_calls == [flat]
    assert m.to_openai()["tool_calls"] == [WEATHER]


def test_from_openai_keeps_the_other_keys_of_a_tool_call() -> None:
    """Keys of a call beyond id/type/function stay on the flat call; a function object with
    keys beyond name/arguments keeps the call in OpenAI's shape; both are sent back."""
    call = {**WEATHER, "extra_content": {"google": {"thought_signature": "abc"}}}
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    d = {"role": "assistant", "content": None, "tool_calls": [call, strict]}
    m = Message.from_openai(d)
    assert m.tool_calls[0] == {
        "id": "c1",
        "name": "get_weather",
        "arguments": '{"city": "Oslo"}',
        "extra_content": {"google": {"thought_signature": "abc"}},
    }
    assert m.tool_calls[1] == strict
    assert m.to_openai() == d


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ({"id": "c1", "name": "ls"}, r"'tool_calls'\[0\]\['arguments'\] is missing"),
        (
            {"id": "c1", "type": "function", "function": {"name": "ls"}},
            r"'tool_calls'\[0\]\['function'\]\['arguments'\] is missing",
        ),
        ({"id": "c1", "arguments": "{}"}, r"'tool_calls'\[0\]\['name'\] must be a str, got None"),
        ({**OPENAI_CALL, "name": "x"}, r"'tool_calls'\[0\] has both the flat keys"),
    ],
    ids=["flat_no_arguments", "openai_no_arguments", "flat_no_name", "both_shapes"],
)
def test_from_openai_refuses_a_tool_call_it_could_not_send(
    call: dict[str, Any], match: str
) -> None:
    """from_openai refuses a call without arguments or name, or in both shapes at once."""
    with pytest.raises(ValueError, match=match):
        Message.from_openai({"role": "assistant", "tool_calls": [call]})


def test_tool_call_parts_reads_both_shapes() -> None:
    """tool_call_parts gives (id, name, arguments) of either shape, None for what is missing."""
    assert tool_call_parts(WEATHER) == ("c1", "get_weather", '{"city": "Oslo"}')
    assert tool_call_parts({"id": "c", "name": "f", "arguments": {"a": 1}}) == (
        "c",
        "f",
        {"a": 1},
    )
    assert tool_call_parts({"function": {}}) == (None, None, None)
    assert tool_call_parts("ls") == (None, None, None)


_call_extras = st.dictionaries(
    st.sampled_from(["index", "extra_content", "x_vendor"]), json_values(3), max_size=2
)
_fn_extras = st.dictionaries(st.sampled_from(["strict", "x_fn"]), json_values(3), max_size=1)
_arguments = _text | st.dictionaries(_text, json_values(3), max_size=2)


@st.composite
def _any_shape_calls(draw: st.DrawFn) -> dict[str, Any]:
    """A tool call in the flat or in OpenAI's shape, with extra keys, arguments a string or
    an object."""
    call_id, name, args = draw(_text), draw(_text), draw(_arguments)
    if draw(st.booleans()):
        return {"id": call_id, "name": name, "arguments": args, **draw(_call_extras)}
    fn = {"name": name, "arguments": args, **draw(_fn_extras)}
    call = {"id": call_id, "function": fn, **draw(_call_extras)}
    if draw(st.booleans()):
        call["type"] = "function"
    return call


@given(st.lists(_any_shape_calls(), min_size=1, max_size=3), _text | st.none())
def test_tool_calls_of_either_shape_round_trip_through_the_openai_shape(
    calls: list[dict[str, Any]], content: str | None
) -> None:
    """For calls of either shape: the payload is valid (str id, name and arguments, every
    given key kept), and from_openai of it sends the very same payload again."""
    m = Message.assistant(content, tool_calls=calls)
    sent = m.to_openai()
    for call, out in zip(calls, sent["tool_calls"], strict=True):
        call_id, name, args = tool_call_parts(call)
        assert out["id"] == call_id
        assert out["type"] == "function"
        assert out["function"]["name"] == name
        assert isinstance(out["function"]["arguments"], str)
        if isinstance(args, str):
            assert out["function"]["arguments"] == args
        else:
            assert json.loads(out["function"]["arguments"]) == args
        for key in set(call) - {"id", "type", "name", "arguments", "function"}:
            assert out[key] == call[key]
        if "function" in call:
            assert out["function"].keys() == call["function"].keys()
    back = Message.from_openai(sent, created_at=m.created_at)
    assert back.to_openai() == sent
    assert Message.from_openai(back.to_openai()).tool_calls == back.tool_calls
