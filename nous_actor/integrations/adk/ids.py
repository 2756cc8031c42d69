"""Ids: where an ADK session, a user's and an app's state, and a user's directory live.

An ADK session (app, user, id) is the nous_actor session
``adk/s/<app>/<user>/<id>``; user state ``adk/u/<app>/<user>``, a user's
directory of sessions ``adk/d/<app>/<user>``, app state ``adk/a/<app>``; each
part percent-encoded where it must be, and `parse_key` gives the parts back.
"""

from __future__ import annotations

from typing import Final, Literal
from urllib.parse import quote, unquote

from nous_actor.core.ids import check_session_id

__all__ = ["app_key", "directory_key", "parse_key", "session_key", "user_key"]

Kind = Literal["session", "user", "directory", "app"]
"""What an id names: a session, a user's state, a user's directory, or an app's state."""


def _escape(ch: str) -> str:
    if ch in "/%" or ch.isspace() or not ch.isprintable():
        return quote(ch, safe="")
    return ch


def _part(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if value.isprintable() and "/" not in value and "%" not in value and " " not in value:
        return value
    try:
        return "".join(_escape(ch) for ch in value)
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {value!r} holds a lone surrogate, which no store keeps"
        ) from None


def _checked(key: str, what: str) -> str:
    try:
        return check_session_id(key)
    except ValueError:
        raise ValueError(
            f"the nous_actor session id of this {what} ({len(key)} characters once encoded) "
            "is longer than the 256 a session id may have; use a shorter app name, user id "
            "or session id (each '/', '%', whitespace or unprintable character costs 3 to 12 "
            "once encoded)"
        ) from None


def session_key(app_name: str, user_id: str, session_id: str) -> str:
    """The nous_actor session id of ADK session (``app_name``, ``user_id``, ``session_id``).

    >>> session_key("shop", "ann", "chat 1")
    'adk/s/shop/ann/chat%201'
    >>> parse_key(session_key("a/b", "ü", "%"))
    ('session', ('a/b', 'ü', '%'))

    Raises:
        TypeError: a part is not a str.
        ValueError: a part holds a lone surrogate, or the id would be too long.
    """
    app, user, sid = (
        _part(app_name, "app_name"),
        _part(user_id, "user_id"),
        _part(session_id, "session_id"),
    )
    return _checked(f"adk/s/{app}/{user}/{sid}", "session")


def user_key(app_name: str, user_id: str) -> str:
    """The id of the session holding ``user:`` state of one user of an app."""
    return _checked(f"adk/u/{_part(app_name, 'app_name')}/{_part(user_id, 'user_id')}", "user")


def directory_key(app_name: str, user_id: str) -> str:
    """The id of the session holding the directory of one user's sessions of an app (each
    session's id and state, for `NousSessionService.list_sessions`)."""
    return _checked(
        f"adk/d/{_part(app_name, 'app_name')}/{_part(user_id, 'user_id')}", "directory"
    )


def app_key(app_name: str) -> str:
    """The id of the session holding an app's ``app:`` state."""
    return _checked(f"adk/a/{_part(app_name, 'app_name')}", "app")


_KINDS: Final[dict[str, tuple[Kind, int]]] = {
    "s": ("session", 3),
    "u": ("user", 2),
    "a": ("app", 1),
}


def parse_key(key: str) -> tuple[Kind, tuple[str, ...]]:
    """The kind and decoded parts of a key made here (the inverse of the ``*_key`` functions).

    Raises:
        ValueError: ``key`` was not made by `session_key`, `user_key` or `app_key`.
    """
    parts = key.split("/") if isinstance(key, str) else []
    if len(parts) >= 2 and parts[0] == "adk" and parts[1] in _KINDS:
        kind, n = _KINDS[parts[1]]
        if len(parts) == n + 2:
            return kind, tuple(unquote(p) for p in parts[2:])
    raise ValueError(f"{key!r} is not the id of an ADK session, user or app kept by this adapter")
