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
"""

from __future__ import annotations

import unicodedata
from typing import Final

__all__ = ["MAX_SESSION_ID_LENGTH", "check_session_id"]

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
    """Return `value` if it is a valid session id (see the module docs), else raise.

    Guarantee: a returned id is one every store keeps and every listing can
    print on one line; the check has no side effect.

    Args:
        value: the candidate id.
        what: the argument's name, used in the error message (e.g. `"new_id"`).

    Raises:
        TypeError: `value` is not a `str`.
        ValueError: `value` breaks the rule; the message says which part and
            what a valid id is.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}; {_RULE}")
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
