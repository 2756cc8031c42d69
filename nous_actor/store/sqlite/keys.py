"""A SQLite store's secrets, in its ``keys`` table (schema version 2): the
forwarding key every process on the store shares (`forwarding_key`).

The key is made by the first process that asks, in a write transaction that
inserts a new key only where none is stored and reads back the one stored, so
two processes asking at once get the same bytes. Whoever can read the file can
read the key.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Final

from nous_actor.errors import StoreError
from nous_actor.store.sqlite.connection import _Connection

KEY_BYTES: Final = 32
"""The length of the forwarding key (``os.urandom``)."""

_FORWARDING: Final = "forwarding"
_READ: Final = "SELECT value FROM keys WHERE name = ?"


def forwarding_key(connection: _Connection) -> bytes:
    """The store's forwarding key, made (32 random bytes) if none is stored yet.

    Raises:
        StoreError: the store is closed or failed, it could not be made (a
            store opened read-only at schema version 1), or the stored key is
            malformed.
    """
    with connection.locked(None, "read the forwarding key") as conn:
        try:
            row = conn.execute(_READ, (_FORWARDING,)).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" not in str(exc):  # a store read-only at version 1
                raise
            row = None
    if row is None:
        with connection.transaction(None, "make the forwarding key") as conn:
            conn.execute(
                "INSERT OR IGNORE INTO keys (name, value) VALUES (?, ?)",
                (_FORWARDING, os.urandom(KEY_BYTES)),
            )
            row = conn.execute(_READ, (_FORWARDING,)).fetchone()
    value = row[0]
    if not isinstance(value, bytes) or len(value) != KEY_BYTES:
        shown = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise StoreError(
            f"the forwarding key stored in {connection.path} is malformed ({shown}, not "
            f"{KEY_BYTES} bytes); delete its row from the keys table (DELETE FROM keys "
            "WHERE name = 'forwarding') so that the next process that asks makes a new "
            "one, then restart every process that uses the store"
        )
    return value
