"""A `nous_actor.store.Store` shared by processes and machines: PostgreSQL (psycopg 3).

Install the extra: ``pip install 'nous-actor[postgres]'``. Nothing else in the
library imports this module or psycopg.

What it guarantees, beyond the `Store` protocol:

* **Acknowledged means committed.** `write` returns only after PostgreSQL
  committed the transaction holding every session's events of the call
  (one transaction for all of them: group commit). An event is never
  reported stored unless it is; a write is wholly stored or wholly absent.
  If the connection is lost during ``COMMIT``, the outcome is read back from
  the server (the transaction's status, then the rows with their epoch),
  never guessed.
* **One writer per session, by lease and fencing.** `claim` takes a lease
  on the session with an epoch that only grows (a database sequence); the
  database's clock decides when a lease expires. Every write transaction
  reads the claim row (``FOR KEY SHARE``) in the same transaction as its
  inserts, so a writer that was paused or partitioned and wakes up after
  its lease was taken over stores nothing and gets `FencedError`.
  Leases renew in the background (one thread per store, for all its
  claims); a session whose lease could not be renewed is failed closed
  before the lease runs out (its writes are refused with `StoreError`
  until a renewal finds the lease unchanged).
* **A dead writer is taken over at once.** Each claim also holds a
  session-level advisory lock on the store's lease connection; when a
  writer's process dies, the server drops its connection and that lock,
  and a new claim takes the session over without waiting for the lease
  (a paused or partitioned writer keeps its lock, so that one is taken
  over when its lease expires). A server restart (or reinitialisation after
  a crash) drops every lock: a lock taken before the server last started
  tells nothing, and that claim is taken over when its lease expires, until
  its holder renews it (taking its lock back). Pass ``detect_dead_holders=False`` behind a
  transaction-pooling proxy (PgBouncer in transaction mode), which cannot
  keep session-level locks.
* **Live subscriptions across processes.** `PostgresStore.watch`
  delivers every committed event of a session with ``seq >= from_seq``,
  exactly once, in seq order, also in a process that never writes it:
  ``LISTEN``/``NOTIFY`` wakes the reader, rows are read by seq.
* **Lost connections are survived.** A lost connection (a restarted server,
  ``pg_terminate_backend``) is reopened with backoff; reads and writes known
  not to have committed are retried within ``timeout``, and anything else
  is a `StoreError`, never a psycopg exception.
* **A server that stops answering is cut off.** Every call ends within
  ``timeout`` (plus ``min(timeout, 0.5)`` s), whatever the server or the
  network does: a watchdog cuts a connection whose call has no answer by
  then (a partition, a stopped server), and a commit cut that way is read
  back, never acknowledged unless it committed. Connections are made within
  the call's deadline too; on TCP they have keepalives and a
  ``tcp_user_timeout``.
* **Someone else's schema is left alone.** Every table lives in ``schema``,
  created (in one transaction) if missing or empty; a schema holding
  another application's tables is refused without changing anything.
* **Every process writes the schema's version.** A store of an older
  version is migrated in one transaction when opened (a process killed
  during it leaves the old version, whole); a trigger of the schema
  refuses inserted events and taken claims of a process of another version
  (an older release still running), which gets a `StoreError` saying to
  upgrade.
* **Forwarding.** `PostgresStore.advertise` writes where this process
  answers into its claims, `PostgresStore.holder_address` reads a live
  holder's, and `PostgresStore.forwarding_key` is the store's shared
  secret (a row of the schema's ``meta`` table: whoever reads the schema
  reads it).

Event data is stored as JSON text, not ``jsonb``: ``jsonb`` turns ``-0.0``
into ``0``, ``1e308`` into a 309-digit integer, refuses ``"\\u0000"`` and
reorders keys, so events would not load back equal (and text is faster,
see docs/persistence.md). Times are ``timestamptz`` (microseconds, UTC).

The package keeps its parts in modules whose names say what they hold,
imported one way, from the bottom up: `failures` (how what went wrong is
worded: a server named without its password, a lost connection, a claim held
elsewhere or fenced), `connection` (a connection reopened with backoff, the
watchdog bounding every call, transactions, the one place psycopg's errors are
translated), `schema` (the
tables, their statements, and opening a schema), `leases` (claims, takeovers
and the renewer), `writes` (fencing, one write transaction and its
settlement), `watch` (`PostgresWatch` and the listener), and `store`
(`PostgresStore`, the face, with the checks of its arguments).
"""

from nous_actor.runtime.extras import missing_extra

try:
    import psycopg  # noqa: F401  (the postgres extra: every module below imports it)
except ImportError as exc:
    missing_extra("postgres", __name__, exc)

from nous_actor.errors import FencedError
from nous_actor.store.postgres.schema import (
    APPLICATION as APPLICATION,
)
from nous_actor.store.postgres.schema import (
    MIN_SERVER_VERSION as MIN_SERVER_VERSION,
)
from nous_actor.store.postgres.schema import (
    SCHEMA_VERSION as SCHEMA_VERSION,
)
from nous_actor.store.postgres.store import PostgresStore
from nous_actor.store.postgres.watch import PostgresWatch
from nous_actor.store.postgres.writes import _Unknown as _Unknown
from nous_actor.store.postgres.writes import _Write as _Write

__all__ = ["FencedError", "PostgresStore", "PostgresWatch"]

# The public classes are named by this package, where users import them from.
PostgresStore.__module__ = __name__
PostgresWatch.__module__ = __name__
