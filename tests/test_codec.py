"""nous_actor.core.codec: events and logs as JSON records and JSON Lines, plus v1 import."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nous_actor import CodecError, Event, FrozenDict, Log, Message, Replace
from nous_actor.core import codec
from nous_actor.testing import logs, messages

T0 = datetime(2026, 1, 1, 12, 30, 45, 123456, tzinfo=UTC)
GOOD = '{"seq":0,"type":"user_message","time":"2026-01-01T00:00:00.000000+00:00","data":{}}'
UNICODE_LINE_BREAKS = "\x85\u2028\u2029"


def _record(**changes: Any) -> str:
    rec: dict[str, Any] = {
        "seq": 1,
        "type": "user_message",
        "time": "2026-01-01T00:00:00.000000+00:00",
        "data": {"content": "x"},
    }
    rec.update(changes)
    return json.dumps(rec)


def _replaced_log() -> Log:
    log = Log()
    for i in range(6):
        log = log.append("user_message" if i % 2 == 0 else "assistant_message", {"content": i}, T0)
    log = log.append("turn_end", {"usage": {"tokens": 12}}, T0)
    log = log.append("system_message", {"content": "sum", "surface_op": Replace(0, 3)}, T0)
    log = log.append("tool_result", {"content": "cut", "surface_op": ("replace", 5, 5)}, T0)
    return log.append("user_message", {"content": "last"}, T0)


# -- one event ------------------------------------------------------------------------


def test_event_to_dict_shape() -> None:
    """An event becomes {seq, type, time, data} with ISO time and the replace as a list."""
    local = T0.astimezone(timezone(timedelta(hours=5, minutes=30)))
    ev = Event(4, "system_message", local, {"content": "s", "surface_op": Replace(1, 2)})
    assert codec.event_to_dict(ev) == {
        "seq": 4,
        "type": "system_message",
        "time": "2026-01-01T12:30:45.123456+00:00",
        "data": {"content": "s", "surface_op": ["replace", 1, 2]},
    }


def test_time_always_has_microseconds_and_offset() -> None:
    """A time on a whole second is written with .000000 and +00:00."""
    ev = Event(0, "turn_start", datetime(2026, 1, 1, tzinfo=UTC), {})
    assert codec.event_to_dict(ev)["time"] == "2026-01-01T00:00:00.000000+00:00"


def test_event_to_dict_returns_plain_mutable_values() -> None:
    """The dict is the caller's: plain dicts and lists, and mutating it leaves the event alone."""
    ev = Event(0, "user_message", T0, {"metadata": {"tags": ["a"]}})
    d = codec.event_to_dict(ev)
    assert type(d["data"]) is dict
    assert type(d["data"]["metadata"]["tags"]) is list
    d["data"]["metadata"]["tags"].append("b")
    assert ev.data == {"metadata": {"tags": ["a"]}}


def test_dumps_event_is_one_json_line() -> None:
    """dumps_event gives one line of JSON, without a newline, equal to event_to_dict."""
    ev = Event(3, "user_message", T0, {"content": "a\nb", "surface_op": ("replace", 0, 2)})
    line = codec.dumps_event(ev)
    assert "\n" not in line
    assert json.loads(line) == codec.event_to_dict(ev)


def test_dumps_event_keeps_non_ascii_text() -> None:
    """Non-ASCII text is written as itself, not as \\u escapes."""
    assert "héllo ✓" in codec.dumps_event(Event(0, "user_message", T0, {"content": "héllo ✓"}))


def test_event_dict_round_trip() -> None:
    """event_from_dict(event_to_dict(e)) == e, including the replace."""
    ev = Event(7, "tool_result", T0, {"content": "x", "surface_op": ("replace", 2, 900)})
    back = codec.event_from_dict(codec.event_to_dict(ev))
    assert back == ev
    assert back.surface_op == Replace(2, 900)


def test_event_line_round_trip() -> None:
    """loads_event(dumps_event(e)) == e."""
    ev = Event(2, "assistant_message", T0, {"tool_calls": [{"id": "c", "arguments": {"a": 1}}]})
    assert codec.loads_event(codec.dumps_event(ev)) == ev


def test_decoded_time_in_another_offset_is_normalised_to_utc() -> None:
    """A record time with a non-UTC offset decodes to the same instant in UTC."""
    ev = codec.loads_event(_record(time="2026-01-01T05:30:00.000000+05:30"))
    assert ev.time == datetime(2026, 1, 1, tzinfo=UTC)
    assert ev.time.tzinfo is UTC


# -- whole logs -----------------------------------------------------------------------


def test_to_jsonl_writes_one_line_per_retained_event() -> None:
    """to_jsonl writes each retained event on its own line, every line ending in a newline."""
    log = _replaced_log()
    text = codec.to_jsonl(log)
    assert text.endswith("\n")
    lines = text.split("\n")[:-1]
    assert [json.loads(line)["seq"] for line in lines] == [e.seq for e in log.events()]


def test_empty_log_is_empty_text_and_back() -> None:
    """An empty log encodes to "" and "" decodes to an empty log."""
    assert codec.to_jsonl(Log()) == ""
    assert codec.loads("") == Log()


def test_iter_jsonl_yields_lines_without_newlines() -> None:
    """iter_jsonl yields each event line without a trailing newline."""
    lines = list(codec.iter_jsonl(_replaced_log()))
    assert len(lines) == len(_replaced_log().events())
    assert not any("\n" in line for line in lines)


def test_log_round_trip_is_lossless() -> None:
    """A log with replaces decodes equal, with the same surface and count."""
    log = _replaced_log()
    back = codec.loads(codec.to_jsonl(log))
    assert back == log
    assert back.count() == log.count()
    assert back.derive_indexed() == log.derive_indexed()


def test_snapshot_gaps_survive_the_round_trip() -> None:
    """A snapshot's seq gaps, count and surface survive encoding and decoding."""
    snap = _replaced_log().snapshot()
    assert len(snap.events()) < snap.count()  # the snapshot really has gaps
    back = codec.loads(codec.to_jsonl(snap))
    assert [e.seq for e in back.events()] == [e.seq for e in snap.events()]
    assert back.count() == snap.count()
    assert back.derive_indexed() == snap.derive_indexed()
    assert back == snap


def test_decoded_snapshot_appends_at_the_original_next_seq() -> None:
    """Appending to a decoded snapshot takes the same seq as appending to the original."""
    snap = _replaced_log().snapshot()
    back = codec.loads(codec.to_jsonl(snap))
    after = back.append("user_message", {"content": "n"}, T0)
    assert after.events()[-1].seq == snap.count()
    assert after == snap.append("user_message", {"content": "n"}, T0)


def test_from_jsonl_accepts_an_iterable_of_lines() -> None:
    """from_jsonl reads an iterable of lines (e.g. a file), trailing newlines included."""
    log = _replaced_log()
    lines = codec.to_jsonl(log).splitlines(keepends=True)
    assert codec.from_jsonl(iter(lines)) == log


def test_blank_lines_are_ignored() -> None:
    """Blank and whitespace-only lines between records are skipped."""
    log = _replaced_log()
    text = "\n  \n".join(codec.iter_jsonl(log)) + "\n\n"
    assert codec.from_jsonl(text) == log


def test_first_record_may_start_after_seq_zero() -> None:
    """A JSONL log whose first seq is 5 decodes with count() == 6 (a leading gap)."""
    back = codec.loads(_record(seq=5) + "\n")
    assert back.count() == 6
    assert [e.seq for e in back.events()] == [5]


@given(logs())
def test_jsonl_round_trip_property(log: Log) -> None:
    """For any log, loads(to_jsonl(log)) == log and the surfaces match."""
    back = codec.loads(codec.to_jsonl(log))
    assert back == log
    assert back.count() == log.count()
    assert [e.seq for e in back.surface()] == [e.seq for e in log.surface()]
    assert back.derive_indexed() == log.derive_indexed()


@pytest.mark.parametrize("ch", list(UNICODE_LINE_BREAKS), ids=["NEL", "LSEP", "PSEP"])
def test_unicode_line_separator_round_trips(ch: str) -> None:
    """Text holding a Unicode line separator survives to_jsonl then loads."""
    log = Log().append("user_message", {"content": f"a{ch}b"}, T0)
    assert codec.loads(codec.to_jsonl(log)) == log


# -- errors ---------------------------------------------------------------------------

CODEC_ERRORS: list[tuple[str, str, str | None, str]] = [
    ("invalid_json", '{"seq": 1,', None, "not valid JSON"),
    ("not_object_list", "[1, 2]", None, "must be a JSON object, got list"),
    ("not_object_str", '"text"', None, "must be a JSON object, got str"),
    ("not_object_num", "5", None, "must be a JSON object, got int"),
    ("missing_seq", '{"type":"user_message","time":"2026-01-01T00:00:00+00:00","data":{}}', "seq",
     "lacks seq"),
    ("missing_data", '{"seq":1,"type":"user_message","time":"2026-01-01T00:00:00+00:00"}', "data",
     "lacks data"),
    ("unknown_field", _record(extra=1), "extra", "unknown field.*extra.*exactly seq, type, time"),
    ("seq_negative", _record(seq=-1), "seq", "'seq' must be an int >= 0"),
    ("seq_float", _record(seq=1.0), "seq", "'seq' must be an int"),
    ("seq_string", _record(seq="1"), "seq", "'seq' must be an int"),
    ("seq_bool", _record(seq=True), "seq", "'seq' must be an int"),
    ("seq_null", _record(seq=None), "seq", "'seq' must be an int"),
    ("type_not_str", _record(type=3), "type", "'type' must be a string"),
    ("type_unknown", _record(type="chat"), "type", "unknown_event_type"),
    ("time_not_str", _record(time=1767225600), "time", "'time' must be an ISO-8601 string"),
    ("time_naive", _record(time="2026-01-01T00:00:00.000000"), "time", "no UTC offset"),
    ("time_date_only", _record(time="2026-01-01"), "time", "no UTC offset"),
    ("time_not_iso", _record(time="yesterday"), "time", "not ISO-8601: 'yesterday'"),
    ("data_not_object", _record(data=["x"]), "data", "'data' must be a JSON object, got list"),
    ("data_null", _record(data=None), "data", "'data' must be a JSON object"),
    ("data_bad_op", _record(data={"surface_op": ["replace", 3, 1]}), "data",
     "invalid_surface_op"),
    ("data_op_on_bookkeeping", _record(type="turn_end", data={"surface_op": "append"}), "data",
     "surface_op_on_non_surface_event"),
    ("data_overflow_to_inf", _record(data={"x": 1}).replace('"x": 1', '"x": 1e999'), None,
     "1e999 overflows to infinity"),
    ("nan_constant", _record(data={"x": 1}).replace('"x": 1', '"x": NaN'), None,
     "NaN is not valid JSON"),
    ("infinity_constant", _record(data={"x": 1}).replace('"x": 1', '"x": -Infinity'), None,
     "-Infinity is not valid JSON"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "field", "match"),
    [c[1:] for c in CODEC_ERRORS],
    ids=[c[0] for c in CODEC_ERRORS],
)
def test_bad_record_is_a_codec_error_with_line_and_field(
    text: str, field: str | None, match: str
) -> None:
    """A bad record on line 2 raises CodecError with .line == 2, the field, and a clear message."""
    with pytest.raises(CodecError, match=f"^line 2: .*{match}") as info:
        codec.from_jsonl(GOOD + "\n" + text + "\n")
    assert info.value.line == 2
    assert info.value.field == field


def test_repeated_seq_is_a_codec_error() -> None:
    """A record repeating the previous record's seq raises CodecError on seq."""
    with pytest.raises(CodecError, match="records must be in increasing seq order") as info:
        codec.loads(GOOD + "\n" + _record(seq=0) + "\n")
    assert (info.value.line, info.value.field) == (2, "seq")


def test_decreasing_seq_is_a_codec_error() -> None:
    """A record whose seq is below the previous one raises CodecError at its line."""
    text = _record(seq=3) + "\n" + _record(seq=4) + "\n" + _record(seq=2) + "\n"
    with pytest.raises(CodecError, match="seq 2 is not after the previous event") as info:
        codec.loads(text)
    assert (info.value.line, info.value.field) == (3, "seq")


def test_line_numbers_count_blank_lines() -> None:
    """CodecError.line is the physical 1-based line number, blank lines included."""
    with pytest.raises(CodecError) as info:
        codec.from_jsonl(GOOD + "\n\n\nnot json\n")
    assert info.value.line == 4


def test_codec_error_is_a_value_error() -> None:
    """CodecError is a ValueError, so generic handlers catch it."""
    with pytest.raises(ValueError, match="not valid JSON"):
        codec.loads("{oops")


def test_event_from_dict_without_line_has_no_line_prefix() -> None:
    """Decoding a lone record reports .line None and no "line N:" prefix."""
    with pytest.raises(CodecError, match=r"^'seq' must be") as info:
        codec.event_from_dict(json.loads(_record(seq=-1)))
    assert info.value.line is None


# -- v1 input -------------------------------------------------------------------------


def test_v1_library_shape_decodes_through_seed() -> None:
    """A v1 list of this library's message dicts decodes to Log.seed of those messages."""
    ms = [
        Message.system("be brief", created_at=T0),
        Message.user("hi", name="ann", metadata={"k": [1]}, created_at=T0),
        Message.assistant(
            "let me look",
            tool_calls=[{"id": "c1", "name": "ls", "arguments": "{}"}],
            reasoning_content="why",
            created_at=T0,
        ),
        Message.tool("a b", "c1", created_at=T0),
    ]
    text = json.dumps([codec.message_to_dict(m) for m in ms])
    back = codec.loads(text)
    assert back == Log.seed(ms)
    assert back.derive_messages() == ms


@given(st.lists(messages(), max_size=6))
def test_v1_round_trip_property(ms: list[Message]) -> None:
    """For any messages, loads of their v1 JSON list derives the same messages."""
    text = json.dumps([codec.message_to_dict(m) for m in ms], ensure_ascii=False)
    assert codec.loads(text).derive_messages() == ms


def test_v1_openai_shape_decodes_through_seed() -> None:
    """A v1 list in the OpenAI shape decodes, tool calls converted, via Log.seed."""
    transcript = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list /"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "content": "a b", "tool_call_id": "c1"},
        {"role": "assistant", "content": "a and b"},
    ]
    log = codec.loads(json.dumps(transcript))
    assert [m.to_openai() for m in log.derive_messages()] == transcript
    assert [e.type.value for e in log.events()] == [
        "system_message",
        "user_message",
        "assistant_message",
        "tool_result",
        "assistant_message",
    ]


def test_v1_openai_developer_message_decodes_as_a_system_message_that_keeps_its_role() -> None:
    """``{"role": "developer", ...}`` has no other key of OpenAI's: it was taken for this
    library's shape, whose roles have no ``developer``, and refused (DESIGN.md §1: a
    developer message is a system message that remembers its role)."""
    transcript = [{"role": "developer", "content": "be terse"}, {"role": "user", "content": "hi"}]
    log = codec.loads(json.dumps(transcript))
    assert [e.type.value for e in log.events()] == ["system_message", "user_message"]
    assert [m.to_openai() for m in log.derive_messages()] == transcript
    first = log.derive_messages()[0]
    assert first == Message.from_openai(transcript[0], created_at=first.created_at)


def test_v1_openai_shape_keeps_created_at_and_metadata() -> None:
    """An OpenAI-shape v1 message with created_at and metadata keeps both."""
    rec = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}
        ],
        "metadata": {"k": 1},
        "created_at": "2026-01-01T12:30:45.123456+00:00",
    }
    (m,) = codec.loads(json.dumps([rec])).derive_messages()
    assert m.created_at == T0
    assert m.metadata == {"k": 1}


def test_v1_message_without_created_at_is_stamped_now() -> None:
    """A v1 message without created_at gets the current UTC time."""
    before = datetime.now(UTC)
    (m,) = codec.loads('[{"role": "user", "content": "hi"}]').derive_messages()
    assert before <= m.created_at <= datetime.now(UTC)


def test_v1_openai_message_with_provider_keys_and_no_tool_calls_decodes() -> None:
    """An OpenAI assistant message carrying refusal/annotations but no tool calls decodes."""
    rec: dict[str, Any] = {
        "role": "assistant",
        "content": "hi",
        "refusal": None,
        "annotations": [],
    }
    (m,) = codec.loads(json.dumps([rec])).derive_messages()
    assert m.to_openai() == rec


@pytest.mark.parametrize(
    ("record", "field", "match"),
    [
        (5, None, "a message must be a JSON object, got int"),
        ({"role": "admin", "content": "x"}, None, "Message.role must be one of"),
        ({"role": "user", "created_at": "noon"}, "created_at", "'created_at' is not ISO-8601"),
        ({"role": "user", "created_at": 5}, "created_at", "'created_at' is not ISO-8601"),
        ({"role": "user", "created_at": "2026-01-01T00:00:00"}, None, "timezone-aware"),
        ({"role": "user", "content": 5}, None, "Message.content must be a str"),
    ],
    ids=["not_object", "bad_role", "time_text", "time_int", "naive", "content"],
)
def test_bad_v1_message_is_a_codec_error_at_its_index(
    record: Any, field: str | None, match: str
) -> None:
    """A malformed v1 message raises CodecError whose .line is its 1-based position."""
    text = json.dumps([{"role": "user", "content": "ok"}, record])
    with pytest.raises(CodecError, match=f"^line 2: .*{match}") as info:
        codec.loads(text)
    assert (info.value.line, info.value.field) == (2, field)


def test_v1_message_keys_without_a_field_are_kept_as_provider_extras() -> None:
    """A v1 message key that is no Message field is kept under metadata["openai_extra"]."""
    (m,) = codec.loads(
        json.dumps([{"role": "user", "content": "x", "extra": 1}])
    ).derive_messages()
    assert m.metadata == {"openai_extra": {"extra": 1}}
    assert m.to_openai() == {"role": "user", "content": "x", "extra": 1}


def test_v1_invalid_json_is_a_codec_error() -> None:
    """A v1 list that is not valid JSON raises CodecError."""
    with pytest.raises(CodecError, match="not valid JSON"):
        codec.loads('[{"role": "user"')


def test_loads_detects_v1_after_leading_whitespace() -> None:
    """Input whose first non-space character is "[" is read as a v1 message list."""
    log = codec.loads('\n  [{"role": "user", "content": "hi"}]')
    assert [m.content for m in log.derive_messages()] == ["hi"]
    assert log.events()[0].type.value == "user_message"


def test_loads_detects_jsonl() -> None:
    """Input starting with "{" is read as JSON Lines, keeping persisted seqs."""
    log = codec.loads(_record(seq=3) + "\n" + _record(seq=8) + "\n")
    assert [e.seq for e in log.events()] == [3, 8]


def test_empty_v1_list_is_an_empty_log() -> None:
    """The v1 input "[]" decodes to an empty log."""
    assert codec.loads("[]") == Log()


def test_message_dict_round_trip() -> None:
    """message_from_dict(message_to_dict(m)) == m, with created_at kept to the microsecond."""
    m = Message.assistant(
        [{"type": "text", "text": "a"}],
        tool_calls=[{"id": "c", "name": "n", "arguments": {"x": 1}}],
        reasoning_content="r",
        name="bot",
        metadata={"k": {"j": [1]}},
        created_at=T0,
    )
    d = codec.message_to_dict(m)
    assert d["created_at"] == "2026-01-01T12:30:45.123456+00:00"
    assert codec.message_from_dict(json.loads(json.dumps(d))) == m


def test_message_to_dict_returns_plain_values() -> None:
    """message_to_dict returns plain dicts and lists, not frozen ones."""
    d = codec.message_to_dict(Message.user("x", metadata={"k": [1]}))
    assert type(d["metadata"]) is dict
    assert type(d["metadata"]["k"]) is list
    assert not isinstance(d["tool_calls"], FrozenDict)
    assert type(d["tool_calls"]) is list


@example("[1]")
@given(st.text(max_size=30))
def test_loads_of_arbitrary_text_raises_only_codec_error(text: str) -> None:
    """Any text either decodes to a Log or raises CodecError, never another exception."""
    try:
        assert isinstance(codec.loads(text), Log)
    except CodecError:
        pass


def test_deeply_nested_record_decodes_or_is_a_codec_error() -> None:
    """A valid record whose data nests 600 lists deep decodes or raises CodecError only."""
    depth = 600
    text = _record(data={"x": 0}).replace('"x": 0', '"x": ' + "[" * depth + "]" * depth)
    try:
        assert codec.loads(text).count() == 2
    except CodecError:
        pass


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ('{"content": "a"} trailing', "text after its JSON value"),
        ("", "not valid JSON"),
        ("nope", "not valid JSON"),
        ('{"content": "a"', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"x": NaN}', "not valid JSON"),
    ],
)
def test_a_stored_row_with_malformed_data_is_refused(data: str, match: str) -> None:
    """event_from_row refuses data that is not exactly one JSON object, naming the field."""
    from nous_actor.core.codec import event_from_row

    with pytest.raises(CodecError, match=match) as info:
        event_from_row(3, "user_message", "2026-01-01T00:00:00.000000+00:00", data)
    assert info.value.field == "data"


def test_a_stored_row_may_end_in_white_space() -> None:
    """Trailing white space after the JSON object is not an error."""
    from nous_actor.core.codec import event_from_row

    ev = event_from_row(3, "user_message", "2026-01-01T00:00:00.000000+00:00", '{"a": [1]} \n')
    assert ev.data == {"a": [1]}
    assert type(ev.data["a"]).__name__ == "FrozenList"


# -- stored rows (event_from_row): every rule checked when the row is read ------------------

_TIME = "2026-01-01T00:00:00.000000+00:00"


def _row_error(seq: int, etype: str, time: Any, data: Any) -> CodecError:
    with pytest.raises(CodecError) as info:
        codec.event_from_row(seq, etype, time, data)
    return info.value


@given(logs())
def test_every_event_survives_its_stored_row(log: Log) -> None:
    """Each event decodes from its stored columns to an equal event, seq, op and position
    included, with the same data types as the JSON Lines decoder gives."""
    for ev in log.events():
        got = codec.event_from_row(
            ev.seq, ev.type.value, codec.format_time(ev.time), codec.encode_data(ev)
        )
        assert got == ev
        assert (got.surface_op, got.position) == (ev.surface_op, ev.position)
        assert got.time.tzinfo is UTC
        assert got == codec.loads_event(codec.dumps_event(ev))


@pytest.mark.parametrize(
    ("etype", "time", "field", "match"),
    [
        ("user", _TIME, "type", "unknown event type 'user'"),
        ("user_message", "yesterday", "time", "'time' is not ISO-8601: 'yesterday'"),
        ("user_message", None, "time", "'time' is not ISO-8601: None"),
        ("user_message", "2026-01-01T00:00:00", "time", "'time' has no UTC offset"),
    ],
)
def test_a_stored_row_with_a_bad_column_is_refused(
    etype: str, time: Any, field: str, match: str
) -> None:
    """A row whose type or time column is malformed is refused, naming the column and seq."""
    err = _row_error(4, etype, time, '{"content": "a"}')
    assert err.field == field
    assert "seq 4: " + match in str(err)


@pytest.mark.parametrize(
    ("etype", "op", "match"),
    [
        ("tool_call", '["replace", 0, 1]', "surface_op_on_non_surface_event"),
        ("turn_start", '"append"', "surface_op_on_non_surface_event"),
        ("user_message", '["replace", 3, 1]', "invalid_surface_op"),
        ("user_message", '["replace", -1, 1]', "invalid_surface_op"),
        ("user_message", '["swap", 0, 1]', "invalid_surface_op"),
        ("user_message", "7", "invalid_surface_op"),
    ],
)
def test_a_stored_row_with_a_bad_surface_op_is_refused(etype: str, op: str, match: str) -> None:
    """A row's surface_op obeys the rules of a new event, checked when the row is read."""
    err = _row_error(9, etype, _TIME, '{"surface_op": ' + op + "}")
    assert err.field == "data"
    assert f"seq 9: {match}" in str(err)


def test_a_stored_replace_row_decodes_to_a_replace() -> None:
    """A row holding ["replace", start, stop] is a replace standing at its start."""
    ev = codec.event_from_row(9, "system_message", _TIME, '{"surface_op": ["replace", 2, 5]}')
    assert (ev.surface_op, ev.position, ev.seq) == (Replace(2, 5), 2, 9)


def test_a_stored_row_with_surface_op_append_is_a_plain_event() -> None:
    """A surface row whose surface_op is "append" is a plain append at its own seq."""
    ev = codec.event_from_row(6, "user_message", _TIME, '{"surface_op": "append"}')
    assert (ev.surface_op, ev.position) == (None, 6)


def test_a_stored_time_with_an_offset_is_kept_in_utc() -> None:
    """A time stored with a non-zero offset is the same instant, in UTC."""
    ev = codec.event_from_row(0, "user_message", "2026-01-01T02:00:00.000000+02:00", "{}")
    assert ev.time.tzinfo is UTC
    assert ev.time == datetime(2026, 1, 1, tzinfo=UTC)


def test_stored_data_as_bytes_decodes_like_text() -> None:
    """A data column read as UTF-8 bytes decodes as its text does."""
    text = '{"content": "héllo", "x": [1, {"y": null}]}'
    ev = codec.event_from_row(0, "user_message", _TIME, text.encode())
    assert ev == codec.event_from_row(0, "user_message", _TIME, text)
    assert ev.data == {"content": "héllo", "x": [1, {"y": None}]}


def test_a_stored_number_too_large_for_a_float_is_refused() -> None:
    """A number that overflows to infinity is refused at decoding, like NaN."""
    err = _row_error(0, "user_message", _TIME, '{"x": 1e999}')
    assert err.field == "data"
    assert "overflows to infinity" in str(err)


@pytest.mark.parametrize("escape", ["\\ud800", "\\uDC00", "\\ude00\\ud83d"])
def test_a_stored_lone_surrogate_is_refused_when_read(escape: str) -> None:
    """A row or a JSON line whose data escapes a surrogate that pairs with nothing is
    refused when read (an event may not hold one: no UTF-8 text can)."""
    data = '{"content": "a' + escape + '"}'
    err = _row_error(2, "user_message", _TIME, data)
    assert (err.field, "seq 2: 'data' holds a lone surrogate" in str(err)) == ("data", True)
    line = f'{{"seq": 2, "type": "user_message", "time": "{_TIME}", "data": {data}}}'
    with pytest.raises(CodecError, match="line 1: the record holds a lone surrogate"):
        codec.loads(line)
    key = '{"k' + escape + '": 1}'
    assert _row_error(2, "user_message", _TIME, key).field == "data"


def test_escaped_surrogate_pairs_and_backslashes_are_read() -> None:
    """A surrogate pair escape is the character it spells; an escaped backslash before
    "ud800" is plain text."""
    data = '{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}'
    ev = codec.event_from_row(0, "user_message", _TIME, data)
    assert ev.data == {"a": "\U0001f600", "b": "\\ud800"}


@pytest.mark.parametrize("seq", ["3", 3.0, None, -1, True])
def test_a_stored_row_with_a_seq_that_is_not_an_int_is_refused(seq: Any) -> None:
    """A row whose seq column is not an int >= 0 is refused when read, naming the column."""
    err = _row_error(seq, "user_message", _TIME, "{}")
    assert err.field == "seq"
    assert "'seq' must be an int >= 0" in str(err)
