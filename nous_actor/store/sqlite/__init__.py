"""The embedded default `nous_actor.store.Store`: SQLite (stdlib ``sqlite3``), WAL.

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

The package keeps its parts in modules whose names say what they hold,
imported one way, from the bottom up: `schema` (the tables, what makes a file
a store, and `_Opening`: opening one, and whether it is still ours at each
write), `connection` (`_Connection`, the object that owns the store's
connection: its lock, whether the store is closed or failed, the one place
sqlite3's errors are translated, write transactions), `writelock` (the
queue processes writing one file take turns in, a ``flock`` on
``<file>-wlock``), `claims` (taking
claims, the claims this process holds, whether a holder lives, where it
answers), `writes` (how a write's rows go in), `follower` (`SQLiteFollower`:
one per store's connection, following its file for its watches and waits),
`keys` (the store's forwarding key), `vacuum` (giving dropped space back), and
`store` (`SQLiteStore`, the face, with the optional
methods of `nous_actor.store.shared`, holding its `_Connection`).
"""

from nous_actor.store.sqlite.claims import _live_lock as _live_lock
from nous_actor.store.sqlite.claims import _live_tokens as _live_tokens
from nous_actor.store.sqlite.claims import _pid_alive as _pid_alive
from nous_actor.store.sqlite.schema import APPLICATION_ID as APPLICATION_ID
from nous_actor.store.sqlite.schema import SCHEMA_VERSION as SCHEMA_VERSION
from nous_actor.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]

# The public class is named by this package, where users import it from.
SQLiteStore.__module__ = __name__
