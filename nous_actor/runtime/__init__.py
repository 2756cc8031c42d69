"""The runtime under every actor of the library: dispatchers, worker pools, flags, exit.

It knows nothing of sessions, stores or supervision, and the store layer may
use it (the committer runs on its threads too). `dispatcher` holds
`Dispatcher` and `DispatchedActor` (a Pykka actor type without a thread of its
own) and `Workers` (a bounded pool for blocking work); `flag` the light
one-way `Flag`; `exit` what runs when a program ends without closing anything.
"""

from nous_actor.runtime.dispatcher import (
    DEFAULT_THROUGHPUT,
    DispatchedActor,
    Dispatcher,
    Workers,
    default_dispatcher,
    default_threads,
)
from nous_actor.runtime.exit import SLOW_EXIT, at_exit
from nous_actor.runtime.flag import Flag

__all__ = [
    "DEFAULT_THROUGHPUT",
    "SLOW_EXIT",
    "DispatchedActor",
    "Dispatcher",
    "Flag",
    "Workers",
    "at_exit",
    "default_dispatcher",
    "default_threads",
]
