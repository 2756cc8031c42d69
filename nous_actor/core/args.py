"""Checks of constructor arguments, shared by every layer: each error says what to pass.

A public constructor checks every argument when it is made, before it opens,
starts or claims anything, so a bad argument never leaves a half-made object.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Final

__all__ = [
    "MAX_SECONDS",
    "check_callable",
    "check_count",
    "check_flag",
    "check_bound",
    "check_seconds",
    "check_timeout",
]

MAX_SECONDS: Final = threading.TIMEOUT_MAX
"""The longest bound a wait takes (about 292 years on Linux): a thread's wait refuses a
longer one (``OverflowError``), and a deadline past it overflows a float's arithmetic."""


def check_seconds(
    value: object,
    what: str,
    low: float = 0.0,
    high: float = MAX_SECONDS,
    *,
    low_open: bool = True,
) -> float:
    """``value`` as a float, if it is a finite number of seconds above ``low`` (or from it,
    with ``low_open=False``) and at most ``high`` (by default `MAX_SECONDS`).

    Raises:
        TypeError: ``value`` is not an int or a float (a bool is refused too).
        ValueError: ``value`` is NaN, infinite, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{what} must be a number of seconds (an int or a float), got {type(value).__name__}"
        )
    above = value > low if low_open else value >= low
    if not (above and value <= high and math.isfinite(value)):
        if low_open or high == MAX_SECONDS:
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            top = (
                " and at most threading.TIMEOUT_MAX (about 292 years)"
                if high == MAX_SECONDS
                else f" and <= {high:g}"
            )
        else:  # a closed range
            bound, top = f"from {low}", f" to {high}"
        raise ValueError(f"{what} must be a finite number of seconds {bound}{top}, got {value!r}")
    return float(value)


def check_bound(value: object, what: str) -> float:
    """A call's own bound, in seconds: any number but NaN, checked before anything is sent
    or changed. 0 or less: do not wait (what is there already is answered); infinite, or
    past `MAX_SECONDS`: no practical bound (`MAX_SECONDS`, about 292 years).

    Raises:
        TypeError: ``value`` is not an int or a float (a bool is refused too).
        ValueError: ``value`` is NaN.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{what} must be a number of seconds (an int or a float), got {type(value).__name__}"
        )
    if value != value:
        raise ValueError(f"{what} must be a number of seconds, got NaN")
    return min(float(value), MAX_SECONDS)


def check_timeout(value: object, what: str) -> float | None:
    """`check_bound`, where ``None`` (the default bound) is taken too."""
    return None if value is None else check_bound(value, what)


def check_count(value: object, what: str, low: int = 0) -> int:
    """``value`` if it is an int >= ``low``.

    Raises:
        TypeError: not an int (a bool is refused too).
        ValueError: below ``low``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int >= {low}, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{what} must be an int >= {low}, got {value!r}")
    return value


def check_flag(value: object, what: str) -> bool:
    """``value`` if it is a bool.

    Raises:
        TypeError: not ``True`` or ``False`` (``0``, ``1`` and ``"yes"`` are refused).
    """
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be True or False, got {type(value).__name__}")
    return value


def check_callable(value: Any, what: str, shape: str = "") -> Any:
    """``value`` if it can be called.

    Raises:
        TypeError: it cannot (the message shows how it is called, ``shape``).
    """
    if not callable(value):
        how = f" ({shape})" if shape else ""
        raise TypeError(f"{what} must be callable{how}, got {type(value).__name__}")
    return value
