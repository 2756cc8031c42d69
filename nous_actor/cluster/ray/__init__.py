"""Sessions hosted on Ray: shard actors across processes and nodes, one shared store.

Ray decides where a session runs; the store's claim on a session (for
`nous_actor.PostgresStore`, its lease and fencing) alone decides who may
write it::

    from functools import partial

    import ray
    from nous_actor import PostgresStore
    from nous_actor.cluster.ray import RaySessions

    ray.init(address="auto")  # a running cluster (`ray start --head`)
    with RaySessions(partial(PostgresStore, dsn), shards=4) as sessions:
        chat = sessions.open("chat-42")
        chat.append("user_message", {"content": "hi"}).get()

* `RaySessions` starts ``shards`` **shard actors** on Ray (restarted by Ray
  without limit, named and optionally detached), each hosting a
  `nous_actor.Sessions` registry on a store of its own, made in the shard's
  worker process by ``store_factory``. A session id maps to a shard by a
  stable hash (jump consistent hashing of its BLAKE2b digest), the same in
  every process; each session is one actor inside its shard, with every
  guarantee of a local session.
* `RaySessions.open` returns a `RaySession`: a `nous_actor.SessionHandle`
  with every method of a local `nous_actor.Session` handle. Input is checked
  and encoded in the caller's thread, so bad input fails its own call with the
  same typed errors; every call returns a `nous_actor.SessionFuture` (a
  bounded ``get``, awaitable without blocking the event loop).
* Calls to one shard travel in batches: while one batch is in flight, later
  calls (of every session of that shard, from every thread and coroutine of
  this process) queue and go together as the next batch, in one Ray call. A
  session's calls are applied in the order they were made.
* A shard whose worker dies (SIGKILL, ``ray.kill``, a lost node) is restarted
  by Ray, and its sessions recover from the store on their next call. Calls in
  flight at that moment fail with `nous_actor.SessionCrashed` (they may or
  may not have been applied; an acknowledged append is never lost); later
  calls reach the restarted shard through the same handles. A shard stopped
  for good (`RaySessions.shutdown`, ``ray.kill(no_restart=True)``) is not
  restarted: its calls fail with `nous_actor.SessionCrashed` saying so.

The package's modules, each importing only those above it: ``_protocol`` (the
protocol between drivers and shards, `shard_of`, errors across the boundary),
``_shard`` (the shard actor), ``_link`` (links and batching), ``_feed``
(subscriptions across the boundary), ``_session`` (the `RaySession` handle),
``_connect`` (reaching the cluster), ``_placement`` (the shard actors' Ray
options) and ``_driver`` (`RaySessions`).
"""

from __future__ import annotations

from nous_actor.runtime.extras import missing_extra

try:
    import ray  # noqa: F401  (the ray extra: every module below imports it)
except ImportError as exc:
    missing_extra("ray", __name__, exc)

from nous_actor.cluster.ray._connect import _H2_PREFACE as _H2_PREFACE
from nous_actor.cluster.ray._connect import _connect as _connect
from nous_actor.cluster.ray._connect import _probe as _probe
from nous_actor.cluster.ray._connect import _where as _where
from nous_actor.cluster.ray._driver import RaySessions
from nous_actor.cluster.ray._feed import _drop_late as _drop_late
from nous_actor.cluster.ray._feed import _Feed as _Feed
from nous_actor.cluster.ray._link import _Link as _Link
from nous_actor.cluster.ray._placement import _OWN_OPTIONS as _OWN_OPTIONS
from nous_actor.cluster.ray._placement import _kill as _kill
from nous_actor.cluster.ray._placement import _shard_options as _shard_options
from nous_actor.cluster.ray._protocol import _CALLS as _CALLS
from nous_actor.cluster.ray._protocol import _READS as _READS
from nous_actor.cluster.ray._protocol import _WAIT as _WAIT
from nous_actor.cluster.ray._protocol import ALIVE as ALIVE
from nous_actor.cluster.ray._protocol import CALL as CALL
from nous_actor.cluster.ray._protocol import COMPACT as COMPACT
from nous_actor.cluster.ray._protocol import DEFAULT_IN_FLIGHT as DEFAULT_IN_FLIGHT
from nous_actor.cluster.ray._protocol import FAILED as FAILED
from nous_actor.cluster.ray._protocol import LATER as LATER
from nous_actor.cluster.ray._protocol import MAX_BATCH as MAX_BATCH
from nous_actor.cluster.ray._protocol import MAX_POLL as MAX_POLL
from nous_actor.cluster.ray._protocol import MAX_SHARDS as MAX_SHARDS
from nous_actor.cluster.ray._protocol import NOW as NOW
from nous_actor.cluster.ray._protocol import OPEN as OPEN
from nous_actor.cluster.ray._protocol import POLL_WAIT as POLL_WAIT
from nous_actor.cluster.ray._protocol import PROTOCOL as PROTOCOL
from nous_actor.cluster.ray._protocol import RESTARTS as RESTARTS
from nous_actor.cluster.ray._protocol import SEQ as SEQ
from nous_actor.cluster.ray._protocol import STOP as STOP
from nous_actor.cluster.ray._protocol import TURN_WAIT as TURN_WAIT
from nous_actor.cluster.ray._protocol import Op as Op
from nous_actor.cluster.ray._protocol import _gone as _gone
from nous_actor.cluster.ray._protocol import _lost as _lost
from nous_actor.cluster.ray._protocol import _mismatch as _mismatch
from nous_actor.cluster.ray._protocol import _portable as _portable
from nous_actor.cluster.ray._protocol import shard_of
from nous_actor.cluster.ray._session import RaySession
from nous_actor.cluster.ray._shard import _Shard as _Shard

__all__ = ["RaySession", "RaySessions", "shard_of"]
