"""Ids: the nous_actor session that keeps a LangGraph thread.

Thread ``t`` lives in the session ``langgraph/<t>``, ``t`` percent-encoded
where it must be (``/``, ``%``, whitespace and characters that are not
printable), so any thread id is a valid session id and `thread_of` gives it
back. A thread id that is not a str (an int, a UUID) is its ``str``.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, unquote

from nous_actor.core.ids import check_session_id

__all__ = ["PREFIX", "thread_key", "thread_of"]

PREFIX: Final = "langgraph/"
"""What every thread's session id starts with."""


def _escape(ch: str) -> str:
    if ch in "/%" or ch.isspace() or not ch.isprintable():
        return quote(ch, safe="")
    return ch


def thread_key(thread_id: object) -> str:
    """The nous_actor session id of LangGraph thread ``thread_id``.

    >>> thread_key("chat 1")
    'langgraph/chat%201'
    >>> thread_of(thread_key("a/b"))
    'a/b'

    Raises:
        TypeError: ``thread_id`` is None, a bool, or not a str, an int or a UUID-like
            value with a plain ``str``.
        ValueError: ``thread_id`` is empty, holds a lone surrogate, or is too long once
            encoded (a session id has at most 256 characters).
    """
    if thread_id is None or isinstance(thread_id, bool):
        raise TypeError(
            f"thread_id must be a str (or an int or UUID), got {thread_id!r}; pass "
            "config={'configurable': {'thread_id': ...}}"
        )
    text = thread_id if isinstance(thread_id, str) else str(thread_id)
    if not text:
        raise ValueError("thread_id is empty; give each conversation a non-empty id")
    if text.isprintable() and "/" not in text and "%" not in text and " " not in text:
        part = text
    else:
        try:
            part = "".join(_escape(ch) for ch in text)
        except UnicodeEncodeError:
            raise ValueError(
                f"thread_id {text!r} holds a lone surrogate, which no store keeps"
            ) from None
    key = PREFIX + part
    try:
        return check_session_id(key)
    except ValueError:
        raise ValueError(
            f"thread_id is too long: its session id would have {len(key)} characters, more "
            "than the 256 a session id may have; use a shorter thread id (each '/', '%', "
            "whitespace or unprintable character costs 3 to 12 once encoded)"
        ) from None


def thread_of(key: str) -> str:
    """The thread id kept in session ``key`` (the inverse of `thread_key`).

    Raises:
        ValueError: ``key`` is not a thread's session id.
    """
    if not key.startswith(PREFIX) or len(key) == len(PREFIX):
        raise ValueError(f"{key!r} is not the session id of a LangGraph thread")
    return unquote(key[len(PREFIX) :])
