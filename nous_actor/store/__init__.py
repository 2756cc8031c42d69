"""Durable stores: the `Store` protocol, `MemoryStore`, `SQLiteStore`, helpers for any store.

`PostgresStore` (sessions shared by processes and machines) is here too, loaded
on first use: it needs the ``postgres`` extra (psycopg 3), which importing this
package never imports.
"""

from typing import TYPE_CHECKING, Any

from nous_actor.store.base import (
    SessionInfo,
    Store,
    export_session,
    import_session,
    list_sessions,
)
from nous_actor.store.memory import MemoryStore
from nous_actor.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from nous_actor.store.postgres import PostgresStore as PostgresStore

__all__ = [
    "MemoryStore",
    "SQLiteStore",
    "SessionInfo",
    "Store",
    "export_session",
    "import_session",
    "list_sessions",
]

_LAZY = ("PostgresStore",)


def __getattr__(name: str) -> Any:
    """`PostgresStore`, imported on first use (with psycopg, which nothing else needs).

    Raises:
        ImportError: psycopg 3 is not installed; the message says how to get it.
    """
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from nous_actor.store import postgres
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "psycopg":
            raise
        raise ImportError(
            f"{name} needs psycopg 3, which is not installed: "
            "pip install 'nous-actor[postgres]' (or 'psycopg[binary]>=3.1')",
            name=exc.name,
        ) from exc
    return getattr(postgres, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
