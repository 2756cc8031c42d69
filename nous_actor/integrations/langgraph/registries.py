"""The registries a saver runs over: `Registry`, what the saver calls of one, and
`Journal`, the registry with the store its threads are read from.

Two registries have what it takes: `nous_actor.Sessions` (its ``store`` is read)
and ``nous_actor.cluster.ray.RaySessions`` (a store made here by its
``store_factory``, the journal its shards write to). They are told apart by what
they have, not by their class: this package does not import the cluster layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from nous_actor.sessions.future import DEFAULT_TIMEOUT, SessionFuture
from nous_actor.sessions.handle import SessionHandle
from nous_actor.sessions.reader import SessionReader
from nous_actor.store import MemoryStore, Store, list_sessions
from nous_actor.store.base import is_store

__all__ = ["Journal", "Registry"]

_NEEDED = ("open", "aopen")


class Registry(Protocol):
    """What `NousCheckpointSaver` calls of a registry of sessions: `open` and `aopen`
    (a thread's session, started or found wherever it runs). Besides these it reads
    the registry's store: its ``store`` attribute (`nous_actor.Sessions`), or else a
    store made by its ``store_factory`` (``RaySessions``), which must reach the
    journal the sessions are written to."""

    def open(self, session_id: str) -> SessionHandle: ...

    async def aopen(self, session_id: str) -> SessionHandle: ...


def _what_to_pass(got: object) -> str:
    return (
        "NousCheckpointSaver takes a registry of sessions (a nous_actor.Sessions, or a "
        f"RaySessions of nous_actor.cluster.ray), got {type(got).__name__}"
    )


class Journal:
    """A registry and the store its threads are read from without opening them: whether
    a thread has events (`count`), which threads there are (`listing`).

    Args:
        registry: a `Registry` with a ``store`` (read as it is) or a
            ``store_factory`` (called once here: the store made is this object's,
            closed by `close`).

    Raises:
        TypeError: ``registry`` lacks ``open`` or ``aopen``, or has neither a
            ``store`` nor a ``store_factory``, or its factory makes no store (the
            message names what is missing).
        ValueError: its factory makes a `nous_actor.MemoryStore` (a store of each
            shard's own, which no other process reads).
        StoreError: the factory's store cannot be opened here.
    """

    def __init__(self, registry: object) -> None:
        missing = [name for name in _NEEDED if not callable(getattr(registry, name, None))]
        if missing:
            raise TypeError(
                f"{_what_to_pass(registry)}, which has no {' or '.join(missing)}; for a SQLite "
                "file use NousCheckpointSaver.from_conn_string(path), for a store "
                "NousCheckpointSaver(Sessions(store))"
            )
        store = getattr(registry, "store", None)
        factory: Callable[[], object] | None = getattr(registry, "store_factory", None)
        self.registry: Registry = registry  # type: ignore[assignment]
        self.made = False
        if not is_store(store):
            if not callable(factory):
                raise TypeError(
                    f"{_what_to_pass(registry)}, which has neither a store (as Sessions "
                    "has) nor a store_factory (as RaySessions has): the saver reads the "
                    "threads' journal through one of them"
                )
            store = factory()
            if not is_store(store):
                raise TypeError(
                    f"the registry's store_factory made a {type(store).__name__}, not a "
                    "nous_actor store; pass e.g. functools.partial(PostgresStore, dsn)"
                )
            if isinstance(store, MemoryStore):
                store.close()
                raise ValueError(
                    "the registry's store_factory makes a MemoryStore: each shard keeps its "
                    "own, and the saver cannot read the threads from this process; give "
                    "the registry a store every process reaches, e.g. "
                    "functools.partial(PostgresStore, dsn)"
                )
            self.made = True
        self.store: Store = store
        timeout = getattr(registry, "timeout", DEFAULT_TIMEOUT)
        self.timeout = float(timeout) if isinstance(timeout, (int, float)) else DEFAULT_TIMEOUT
        reader: Callable[[str], Any] | None = getattr(registry, "read", None)
        self._read = reader if callable(reader) and not self.made else None

    def count(self, key: str) -> SessionFuture[int]:
        """The next seq of session ``key`` in the store (0: it has no events), read
        without opening the session (through the registry's ``read`` when it has one,
        which refuses once the registry is closed)."""
        if self._read is not None:
            return self._read(key).count()  # type: ignore[no-any-return]
        return SessionReader(key, self.store, timeout=self.timeout).count()

    def listing(self, prefix: str) -> list[str]:
        """The ids of the stored sessions (with an event) whose ids start with ``prefix``."""
        return [info.session_id for info in list_sessions(self.store, prefix=prefix)]

    def close(self) -> None:
        """Close the store made by the registry's ``store_factory`` (a registry's own
        ``store`` is the registry's)."""
        if self.made:
            self.made = False
            self.store.close()
