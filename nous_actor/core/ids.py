"""Session ids: the one rule every entry point checks.

A valid session id is a `str` that:

* is 1 to 256 characters long;
* has no leading or trailing whitespace (as `str.strip` sees it);
* holds no control or format character (Unicode categories Cc and Cf: newline,
  tab, NUL, DEL, the zero-width space, the byte-order mark, ...), no line or
  paragraph separator (Zl, Zp: U+2028, U+2029) and no surrogate code point
  (Cs: a Python `str` can hold a lone surrogate, which no UTF-8 store keeps).

Anything else printable is fine, inner spaces and any script included:
`"chat 42"`, `"ünïcødé-日本"`, `"team/agent:7"`.

Ids are plain text compared code point by code point: no case folding and no
Unicode normalisation, so `"café"` spelled with U+00E9 (NFC) and with
`"e"` + U+0301 (NFD) are two sessions. Normalise ids yourself (e.g.
`unicodedata.normalize("NFC", name)`) if they come from sources that differ.
A `str` subclass is taken as its plain text: `check_session_id` returns an
exact `str`, so an id's own `__hash__`/`__eq__` never makes it a second session.
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MAX_SESSION_ID_LENGTH", "check_session_id", "plain_id"]

MAX_SESSION_ID_LENGTH: Final = 256
"""The longest valid session id, in characters."""

_FORBIDDEN: Final = {
    "Cc": "a control character",
    "Cf": "a format character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Cs": "a surrogate",
}
_RULE: Final = (
    f"a session id is 1 to {MAX_SESSION_ID_LENGTH} characters with no leading or trailing "
    "whitespace and no control, format, line-separator or surrogate characters"
)


def _shown(value: str) -> str:
    if len(value) <= 60:
        return repr(value)
    return f"{value[:40]!r}... ({len(value)} characters)"


def check_session_id(value: object, what: str = "session_id") -> str:
    """Return `value` as a plain `str` if it is a valid session id (see the module
    docs), else raise.

    Guarantee: a returned id is an exact `str` (a subclass's text, its own
    methods never called), one every store keeps and every listing can print on
    one line; the check has no side effect. Use the returned id, not the
    argument.

    Args:
        value: the candidate id.
        what: the argument's name, used in the error message (e.g. `"new_id"`).

    Raises:
        TypeError: `value` is not a `str`.
        ValueError: `value` breaks the rule; the message says which part and
            what a valid id is.
    """
    if type(value) is not str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__}; {_RULE}")
        value = str.__str__(value)  # its plain text: the checks below run str's own code
    reason = None
    if not value:
        reason = "it is empty"
    elif len(value) > MAX_SESSION_ID_LENGTH:
        reason = f"it is {len(value)} characters long"
    elif value != value.strip():
        reason = "it has leading or trailing whitespace"
    elif not value.isprintable():  # the fast path: a printable str holds none of _FORBIDDEN
        for ch in value:
            kind = _FORBIDDEN.get(unicodedata.category(ch))
            if kind is not None:
                reason = f"it holds {kind} (U+{ord(ch):04X})"
                break
    if reason is not None:
        raise ValueError(f"{what} {_shown(value)} is not a valid session id: {reason}; {_RULE}")
    return value


def plain_id(value: str) -> str:
    """``value`` as an exact `str` (a subclass's text; its own methods are not called),
    without checking it: for a store's lookups, which find nothing under an invalid id."""
    if type(value) is not str and isinstance(value, str):
        return str.__str__(value)
    return value
