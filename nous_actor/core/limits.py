"""The limits of what an event may hold: one each, checked at the call, read by every reader.

Whatever an append accepts, every reader of the library reads back, whatever
its own settings; so each limit is fixed here, checked where an event is made
(`Log.append`, a session's ``append``, `Event(...)`, JSON Lines import), and
refused there as `nous_actor.InvalidEvent`:

* `MAX_DATA_DEPTH`: ``data`` nests at most 100 containers deep (``data`` itself
  is level 1). The decoder reads that deep under any recursion limit, and a
  writer with a raised recursion limit cannot store deeper.
  Refused as ``unserializable_event_data``, naming the path and the limit.
* `MAX_INT_DIGITS`: an int in ``data`` has at most 4,300 decimal digits
  (CPython's default ``sys.get_int_max_str_digits()``), whatever the writer's
  own setting. Refused as ``unserializable_event_data``.
* `MAX_SEQ`: a seq is at most ``2**63 - 1``, the largest a store's 64-bit
  integer holds. A larger one is ``invalid_event``.
* `max_event_bytes` (default `DEFAULT_MAX_EVENT_BYTES`, 16 MiB): the size of
  ``data`` as stored, the UTF-8 bytes of its compact JSON. Refused as
  ``unserializable_event_data``, naming the limit. Change it for the process
  with `set_max_event_bytes`.

Why 16 MiB: an event is held in memory by its session for as long as the
session lives (a large string costs its size again in every copy a caller
makes), and a JSON object of *n* bytes costs several times *n* while it is
decoded. 16 MiB leaves room for what agents store: a long tool result, a
file read whole, a base64 image of up to 12 MB (most providers take smaller
ones in a request), while a runaway value (a 300 MB tool output) is refused
at the call instead of being carried into memory, the store and every reader.
Store such blobs elsewhere (a file, an object store) and put their reference
in the event; or raise the limit.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "MAX_DATA_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_SEQ",
    "max_event_bytes",
    "set_max_event_bytes",
]

MAX_DATA_DEPTH: Final = 100
"""How many containers deep event ``data`` may nest (``data`` itself is level 1)."""

MAX_INT_DIGITS: Final = 4300
"""The most decimal digits an int in event ``data`` may have."""

MAX_SEQ: Final = 2**63 - 1
"""The largest seq: a store keeps seqs as signed 64-bit integers."""

DEFAULT_MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""The default largest event: 16 MiB of ``data`` as compact UTF-8 JSON."""

INT_BOUND: Final = 10**MAX_INT_DIGITS
"""An int ``n`` has at most `MAX_INT_DIGITS` digits iff ``-INT_BOUND < n < INT_BOUND``."""

_max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES


def max_event_bytes() -> int:
    """The largest event this process accepts: bytes of ``data`` as compact UTF-8 JSON."""
    return _max_event_bytes


def set_max_event_bytes(limit: int) -> int:
    """Accept events of up to ``limit`` bytes (``data`` as compact UTF-8 JSON) from now on,
    in every thread of this process; returns the limit it replaces.

    The check runs in the process that makes the event (a session's handle
    checks in the caller's process), so set it in each process that appends.
    Events already stored are read back whatever the limit.

    Raises:
        TypeError: ``limit`` is not an int (a bool is refused too).
        ValueError: ``limit`` is below 2 (the size of ``{}``).
    """
    global _max_event_bytes
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(
            f"the event size limit must be an int number of bytes, got {type(limit).__name__}"
        )
    if limit < 2:
        raise ValueError(
            f"the event size limit must be at least 2 bytes (an empty object), got {limit}"
        )
    old, _max_event_bytes = _max_event_bytes, int(limit)
    return old


def describe_bytes(n: int) -> str:
    """``"16 MiB (16777216 bytes)"``, or ``"100 bytes"`` below a KiB."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            whole = n / size
            shown = f"{whole:g}" if whole == int(whole) else f"{whole:.1f}"
            return f"{shown} {unit} ({n} bytes)"
    return f"{n} bytes"
