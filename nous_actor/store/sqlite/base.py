"""The bottom of `nous_actor.store.sqlite`: its limits, and the check of the path.

Holds the constants its parts share (how many ids one ``IN (...)`` binds, how
a write transaction waits for another process's write lock, the longest
``timeout``) and `_check_path`, the constructor's check of ``path``. Imports
nothing of the package: every other module of it builds on this one.
"""

from __future__ import annotations

import os
from typing import Final

_IN_CHUNK: Final = 500
"""Ids bound in one ``IN (...)`` (far below SQLite's bound on parameters)."""

_BUSY_FIRST_S: Final = 0.0002
_BUSY_STEP_S: Final = 0.002
"""How long a write transaction waits, at first and at most, before it looks again
for another process's write lock (see `SQLiteStore._begin`)."""

_MAX_TIMEOUT_S: Final = 2_147_483
"""The longest `timeout`: SQLite's busy timeout is a 32-bit count of milliseconds."""


def _check_path(path: object) -> str:
    """``path`` as a str, if it names a file (or is ``":memory:"``).

    Raises:
        TypeError: not a str or an `os.PathLike` of str (bytes paths are refused).
        ValueError: empty, or holding a NUL character.
    """
    if isinstance(path, os.PathLike):
        text = os.fspath(path)
        if not isinstance(text, str):
            raise TypeError(
                "path must be a str or an os.PathLike of str, not bytes: decode it "
                "(os.fsdecode) or give a pathlib.Path"
            )
    elif isinstance(path, str):
        text = path
    else:
        raise TypeError(
            "path must be a str or an os.PathLike (e.g. a pathlib.Path) naming the database "
            f"file, or ':memory:', got {type(path).__name__}"
        )
    if not text:
        raise ValueError("path must not be empty: give a database file path, or ':memory:'")
    if "\x00" in text:
        raise ValueError(f"path must not hold a NUL character, got {text!r}")
    return text
