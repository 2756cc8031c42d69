"""What the `Session` objects a service returned have seen: `_Load`, one object's, and
`_Loads`, the service's, each kept for as long as its object lives (what tells a stale
write outside a run's turn, and where a run's refreshed object starts)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Literal

from nous_actor.integrations.adk.framework import AdkSession

Scope = Literal["session", "user", "app"]


@dataclass
class _Load:
    """What a `Session` object this service returned has seen of the logs it reads: each
    log's count when it was loaded (``seen``), the seq of the first event it was given
    (``first``), and the keys it wrote since, each with the count after its write."""

    seen: dict[Scope, int]
    first: int
    own: dict[tuple[Scope, str], int] = field(default_factory=dict)
    ref: weakref.ref[AdkSession] | None = None

    def since(self, scope: Scope, key: str) -> int:
        """The first seq of ``scope``'s log whose write of ``key`` this object has not seen."""
        return self.own.get((scope, key), self.seen[scope])


class _Loads:
    """The `_Load` of each live `Session` object a service returned, by the object: an
    entry goes when its object is collected, and an object's entry is never another's
    (an id reused by a new object finds nothing)."""

    def __init__(self) -> None:
        self._loads: dict[int, _Load] = {}  # by id() of the objects

    def remember(self, session: AdkSession, load: _Load) -> None:
        """Keep what ``session`` has seen (``load``), for as long as it lives."""
        key = id(session)
        known = self._loads.get(key)
        if known is not None and known.ref is not None and known.ref() is session:
            load.ref = known.ref
        else:
            loads = self._loads

            def forget(_: object) -> None:
                loads.pop(key, None)

            load.ref = weakref.ref(session, forget)
        self._loads[key] = load

    def of(self, session: AdkSession) -> _Load | None:
        """What ``session`` has seen; ``None`` if this service did not return it."""
        load = self._loads.get(id(session))
        if load is None or load.ref is None or load.ref() is not session:
            return None
        return load
