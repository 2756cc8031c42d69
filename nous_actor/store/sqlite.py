"""The embedded default :class:`~nous_actor.store.Store`: SQLite (stdlib ``sqlite3``), WAL.

Durability (``durability=``):

* ``"full"`` (default): ``synchronous=FULL``. Each commit is fsynced before
  it is acknowledged, so an acknowledged append survives a process crash
  (SIGKILL) *and* a power loss or OS crash.
* ``"normal"``: ``synchronous=NORMAL``. The WAL is fsynced only at
  checkpoints: an acknowledged append survives a process crash, but a power
  loss may lose the last commits (the file stays consistent).

Either way a transaction is atomic: an append that was not acknowledged is
wholly stored or wholly absent. The table's ``PRIMARY KEY (session_id, seq)``
makes the database itself refuse a second writer's seq.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Literal

from nous_actor.codec import CodecError, encode_data, event_from_row, format_time
from nous_actor.errors import ConflictError, StoreError
from nous_actor.event import Event

__all__ = ["SQLiteStore"]

SCHEMA_VERSION: Final = 1
APPLICATION_ID: Final = 0x6E6F7573  # "nous": marks the file as a nous_actor store
_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS writers (
    session_id TEXT PRIMARY KEY,
    pid INTEGER NOT NULL,
    token TEXT NOT NULL,
    since TEXT NOT NULL
);
"""
_INSERT = "INSERT INTO events (session_id, seq, type, time, data) VALUES (?, ?, ?, ?, ?)"

# Claim tokens held by live writers of this process, whatever store object made them.
_live_tokens: set[str] = set()
_live_lock = threading.Lock()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class SQLiteStore:
    """Sessions' events in one SQLite file (or ``":memory:"``).

    Safe to share between threads: calls are serialised on one connection.
    Open the same file from several processes freely; each session still
    has one live writer (``claim``), enforced in the database.

    Args:
        path: the database file (created if missing), or ``":memory:"``.
        durability: ``"full"`` (default) or ``"normal"``; see the module docs.
        timeout: seconds to wait for another process's write lock.

    Raises:
        StoreError: the file cannot be opened or is not a nous_actor store.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Literal["full", "normal"] = "full",
        timeout: float = 5.0,
    ) -> None:
        if durability not in ("full", "normal"):
            raise ValueError(f"durability must be 'full' or 'normal', got {durability!r}")
        self.path = str(path) if str(path) == ":memory:" else str(Path(path))
        self.durability = durability
        self._lock = threading.Lock()
        self._closed = False
        with self._translate(None, "open the store"):
            self._conn = sqlite3.connect(
                self.path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(f"PRAGMA synchronous = {durability.upper()}")
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
            tables = {
                r[0]
                for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            ours = app_id == APPLICATION_ID or (
                app_id == 0 and version == SCHEMA_VERSION and {"events", "writers"} <= tables
            )
            if not ours and (app_id != 0 or tables):
                raise StoreError(
                    f"{self.path} is another application's SQLite database, not a "
                    "nous_actor store; use a new file"
                )
            if version not in (0, SCHEMA_VERSION):
                raise StoreError(
                    f"{self.path} has schema version {version}; this nous_actor reads "
                    f"version {SCHEMA_VERSION}: upgrade nous_actor"
                )
            self._conn.executescript(_SCHEMA)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    # -- one place to translate sqlite3 errors -----------------------------------------

    @contextlib.contextmanager
    def _translate(self, session_id: str | None, doing: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except sqlite3.Error as exc:
            kind = type(exc).__name__
            hint = ""
            text = str(exc)
            if "locked" in text or "busy" in text:
                hint = "; another process holds the write lock: retry, or raise timeout="
            elif "readonly" in text or "read-only" in text:
                hint = "; the file or its folder is read-only: fix permissions"
            elif "full" in text:
                hint = "; the disk is full: free space, then restart the session"
            elif "not a database" in text or "malformed" in text:
                hint = "; the file is not a (healthy) SQLite database"
            raise StoreError(
                f"could not {doing} in {self.path}: {kind}: {text}{hint}", session_id=session_id
            ) from exc
        except CodecError as exc:
            raise StoreError(
                f"stored event is malformed in {self.path}: {exc}", session_id=session_id
            ) from exc
        except (UnicodeEncodeError, OverflowError) as exc:  # what sqlite3 cannot bind
            raise StoreError(
                f"could not {doing} in {self.path}: {type(exc).__name__}: {exc}; session ids "
                "must be valid Unicode text and seqs below 2**63",
                session_id=session_id,
            ) from exc

    @contextlib.contextmanager
    def _locked(self, session_id: str | None, doing: str) -> Iterator[sqlite3.Connection]:
        with self._lock, self._translate(session_id, doing):
            if self._closed:
                raise StoreError(f"the store {self.path} is closed; open a new one")
            yield self._conn

    @contextlib.contextmanager
    def _transaction(self, session_id: str | None, doing: str) -> Iterator[sqlite3.Connection]:
        with self._locked(session_id, doing) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- the Store protocol --------------------------------------------------------------

    def load(self, session_id: str) -> list[Event]:
        with self._locked(session_id, "load the session") as conn:
            rows = conn.execute(
                "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq",
                (session_id,),
            ).fetchall()
            return [event_from_row(*row) for row in rows]

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        batches = [
            (
                sid,
                [
                    (sid, ev.seq, ev.type.value, format_time(ev.time), encode_data(ev))
                    for ev in evs
                ],
            )
            for sid, evs in appends.items()
            if evs
        ]
        refused: dict[str, StoreError] = {}
        if not batches:
            return refused
        only = batches[0][0] if len(batches) == 1 else None
        with self._transaction(only, "append events") as conn:
            for sid, rows in batches:
                conn.execute("SAVEPOINT session_write")
                try:
                    conn.executemany(_INSERT, rows)
                except sqlite3.IntegrityError:
                    conn.execute("ROLLBACK TO session_write")
                    refused[sid] = ConflictError(
                        "a seq in this write is already stored (a second writer?); "
                        "reopen the session to continue from the store",
                        session_id=sid,
                    )
                conn.execute("RELEASE session_write")
        return refused

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        with self._transaction(session_id, "drop snapshotted events") as conn:
            conn.executemany(
                "DELETE FROM events WHERE session_id = ? AND seq = ?",
                [(session_id, s) for s in seqs],
            )

    def sessions(self) -> list[str]:
        with self._locked(None, "list sessions") as conn:
            rows = conn.execute("SELECT DISTINCT session_id FROM events ORDER BY session_id")
            return [r[0] for r in rows]

    def delete(self, session_id: str) -> None:
        with self._transaction(session_id, "delete the session") as conn:
            conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM writers WHERE session_id = ?", (session_id,))

    def claim(self, session_id: str) -> str:
        token = uuid.uuid4().hex
        pid = os.getpid()
        with self._transaction(session_id, "claim the session") as conn, _live_lock:
            row = conn.execute(
                "SELECT pid, token FROM writers WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is not None:
                holder_pid, holder_token = row
                alive = (
                    holder_token in _live_tokens if holder_pid == pid else _pid_alive(holder_pid)
                )
                if alive:
                    where = "this process" if holder_pid == pid else f"process {holder_pid}"
                    raise ConflictError(
                        f"already has a live writer in {where}; use that session's handle, "
                        "or stop it first",
                        session_id=session_id,
                    )
            conn.execute(
                "INSERT OR REPLACE INTO writers (session_id, pid, token, since) "
                "VALUES (?, ?, ?, ?)",
                (session_id, pid, token, datetime.now(UTC).isoformat()),
            )
            _live_tokens.add(token)
        return token

    def release(self, session_id: str, token: str) -> None:
        with _live_lock:
            _live_tokens.discard(token)
        if self._closed:
            return
        with self._transaction(session_id, "release the session") as conn:
            conn.execute(
                "DELETE FROM writers WHERE session_id = ? AND token = ?", (session_id, token)
            )

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    # -- extras --------------------------------------------------------------------------

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` result (``"ok"`` when healthy)."""
        with self._locked(None, "check integrity") as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r} durability={self.durability}>"
