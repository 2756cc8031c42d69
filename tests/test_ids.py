"""The one session-id rule (nous_actor.core.ids.check_session_id)."""

from __future__ import annotations

import pytest

from nous_actor.core.ids import MAX_SESSION_ID_LENGTH, check_session_id


@pytest.mark.parametrize(
    "session_id",
    [
        "s",
        "chat-42",
        "chat 42",  # inner spaces are fine
        "ünïcødé-日本",
        "team/agent:7",
        "a\u00a0b",  # a no-break space inside
        "x" * MAX_SESSION_ID_LENGTH,
        "'; DROP TABLE events; --",
    ],
)
def test_a_valid_id_is_returned_as_it_is(session_id: str) -> None:
    """A valid id comes back unchanged."""
    assert check_session_id(session_id) == session_id


@pytest.mark.parametrize(
    ("session_id", "reason"),
    [
        ("", "it is empty"),
        (" ", "leading or trailing whitespace"),
        (" chat", "leading or trailing whitespace"),
        ("chat\n", "leading or trailing whitespace"),
        ("\u3000chat", "leading or trailing whitespace"),
        ("a\nb", r"a control character \(U\+000A\)"),
        ("a\tb", r"a control character \(U\+0009\)"),
        ("nul\x00inside", r"a control character \(U\+0000\)"),
        ("del\x7f", r"a control character \(U\+007F\)"),
        ("zero\u200bwidth", r"a format character \(U\+200B\)"),
        ("bom\ufeff-x", r"a format character \(U\+FEFF\)"),
        ("line\u2028sep", r"a line separator \(U\+2028\)"),
        ("para\u2029sep", r"a paragraph separator \(U\+2029\)"),
        ("lone-\udc80", r"a surrogate \(U\+DC80\)"),
        ("x" * (MAX_SESSION_ID_LENGTH + 1), "it is 257 characters long"),
        ("x" * 100_000, "it is 100000 characters long"),
    ],
)
def test_an_invalid_id_is_a_value_error_saying_why_and_what_is_valid(
    session_id: str, reason: str
) -> None:
    """Each broken part of the rule is named, followed by the whole rule."""
    with pytest.raises(ValueError, match=reason) as info:
        check_session_id(session_id)
    assert "a session id is 1 to 256 characters" in str(info.value)


@pytest.mark.parametrize("value", [None, 42, b"chat", ["chat"]])
def test_a_non_str_is_a_type_error(value: object) -> None:
    """Only a str can be a session id."""
    with pytest.raises(TypeError, match=f"session_id must be a str, got {type(value).__name__}"):
        check_session_id(value)


def test_the_message_names_the_argument() -> None:
    """`what` names the argument in the message."""
    with pytest.raises(ValueError, match=r"^new_id '' is not a valid session id"):
        check_session_id("", "new_id")
    with pytest.raises(TypeError, match=r"^new_id must be a str"):
        check_session_id(1, what="new_id")


def test_a_huge_id_is_shown_cut_short() -> None:
    """A 100,000-character id is not copied whole into the message."""
    with pytest.raises(ValueError, match=r"\.\.\. \(100000 characters\)") as info:
        check_session_id("y" * 100_000)
    assert len(str(info.value)) < 400
