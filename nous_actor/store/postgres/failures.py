"""How `nous_actor.store.postgres` words what went wrong: a server named without its
password, a lost connection (logged) told from a refusal, and the errors of a claim
held elsewhere or fenced.
"""

from __future__ import annotations

import re
import urllib.parse
from datetime import UTC, datetime
from typing import Any, Final

import psycopg
import psycopg.conninfo

from nous_actor._log import get_logger
from nous_actor.errors import ConflictError, FencedError, StoreError

# One logger for every module of the package, named for the package.
logger = get_logger("nous_actor.store.postgres")

# Connection-level errors a retry on a new connection may cure (the server's own codes).
_TRANSIENT_SQLSTATES: Final = frozenset(
    {"57P01", "57P02", "57P03", "53300", "08000", "08003", "08006", "08001", "08004"}
)
_PERMANENT_CONNECT_SQLSTATES: Final = frozenset({"28000", "28P01", "3D000", "42501"})


# -- naming the server without its password ------------------------------------------------


def _describe(dsn: str) -> str:
    """The server, database and role of ``dsn``, for messages; never the password.

    Raises:
        StoreError: ``dsn`` is not a valid connection string.
    """
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        why = _redacted(_first_line(exc), dsn)  # (libpq may quote the string, password too)
        raise StoreError(
            f"not a valid PostgreSQL connection string ({why}); give a URI "
            "such as postgresql://user@host/dbname or key=value pairs such as "
            "'host=/run/postgresql dbname=agents'"
        ) from None
    host = str(params.get("host") or params.get("hostaddr") or "the default socket")
    port = params.get("port")
    where = f"{host}:{port}" if port else host
    db = params.get("dbname") or params.get("user") or "the default database"
    user = params.get("user")
    return f"database {db!s} on {where}" + (f" as {user}" if user else "")


_URI_PASSWORD: Final = re.compile(r"://[^:/@?#\s]*:([^@\s]*)@")
_KEY_PASSWORD: Final = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)", re.IGNORECASE)


def _redacted(text: str, dsn: str) -> str:
    """``text`` (libpq's words about ``dsn``, which may quote it) without the password
    ``dsn`` holds, as written or percent-decoded: each is shown as ``***``."""
    secrets = {m.group(1) for m in _URI_PASSWORD.finditer(dsn)}
    secrets |= {m.group(1).strip("'") for m in _KEY_PASSWORD.finditer(dsn)}
    secrets |= {urllib.parse.unquote(x) for x in secrets}
    for secret in sorted((x for x in secrets if x), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URI_PASSWORD.sub(lambda m: m.group(0).replace(m.group(1), "***"), text)
    return _KEY_PASSWORD.sub("password=***", text)


def _connection_lost(where: str, connection: str, doing: str, exc: BaseException) -> None:
    """Log that a connection was lost (the caller reconnects with backoff)."""
    logger.warning(
        "store.connection_lost",
        store=where,
        connection=connection,
        doing=doing,
        reason=_first_line(exc),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


def _lost_connection(exc: BaseException, conn: psycopg.Connection[Any] | None) -> bool:
    """Whether ``exc`` means the connection is gone (a retry on a new one may work)."""
    if conn is not None and (conn.broken or conn.closed):
        return True
    if _sqlstate(exc) in _TRANSIENT_SQLSTATES:
        return True
    return isinstance(exc, psycopg.InterfaceError | psycopg.OperationalError) and (
        _sqlstate(exc) is None
    )


# -- what a claim held elsewhere, or lost, is called -------------------------------------------


def _parse_time(value: object) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return when.astimezone(UTC) if when.tzinfo is not None else None


def _lease_end(until: object) -> tuple[datetime | None, str]:
    """A lease's end as the server gave it: the time (`None` if unreadable), and as shown."""
    when = _parse_time(until)
    return when, when.isoformat(timespec="milliseconds") if when else str(until)


def _held_elsewhere(session_id: str, holder: object, until: object, what: str) -> ConflictError:
    when, shown = _lease_end(until)
    return ConflictError(
        f"{what}: {holder} holds its lease until {shown} (renewed while it lives); send "
        "the session's work there, or claim it after that writer stops",
        session_id=session_id,
        holder=str(holder),
        lease_until=when,
    )


def _fenced(session_id: str, epoch: int, row: Any) -> FencedError:
    if row is None:
        why = "its claim was removed (the session was deleted or released elsewhere)"
        holder = until = None
    elif row[1] != epoch:
        when, shown = _lease_end(row[4])
        why = f"{row[3]} took it over (epoch {row[1]}, lease until {shown})"
        holder, until = str(row[3]), when
    else:
        why = "its lease expired (by the database's clock) before it was renewed"
        holder = until = None
    return FencedError(
        f"this writer's claim (epoch {epoch}) is no longer current: {why}; nothing of this "
        "write was stored. Stop the session here: its current writer reloads it from the store",
        session_id=session_id,
        holder=holder,
        lease_until=until,
    )


def _again(err: StoreError, session_id: str) -> StoreError:
    """``err`` once more, for a later write under the same lost claim."""
    if isinstance(err, ConflictError):
        return type(err)(
            err._message,
            session_id=session_id,
            holder=err.holder,
            lease_until=err.lease_until,
        )
    return StoreError(err._message, session_id=session_id)
