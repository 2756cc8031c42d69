"""`Feeds`: a session's subscriptions, each fed every event the session applies."""

from __future__ import annotations

from collections.abc import Iterable

from nous_actor.core.event import Event
from nous_actor.store.subscription import Subscription


class Feeds:
    """The live subscriptions of a session (kept by its actor only while it has one).

    Invariants: a subscription gets its catch-up and is registered in one step (no
    gap, no duplicate); each applied event goes to every live subscription in seq
    order; one that is done (closed, or cut off as lagging) is dropped at its next
    event. A session keeps a `Feeds` only while it holds a subscription (`push` and
    `remove` say when none is left), so its truth is ``feeds is not None``.
    """

    __slots__ = ("subs",)

    def __init__(self) -> None:
        self.subs: list[Subscription] = []

    def add(self, sub: Subscription, past: Iterable[Event]) -> None:
        """Register ``sub`` after giving it ``past`` (the retained events it asked for)."""
        sub._catch_up(past)
        self.subs.append(sub)

    def remove(self, sub: Subscription) -> bool:
        """Stop feeding ``sub``; ``False`` once none is left."""
        if sub in self.subs:
            self.subs.remove(sub)
        return bool(self.subs)

    def push(self, ev: Event) -> bool:
        """Feed ``ev`` to each subscription; ``False`` once none is left."""
        subs = self.subs = [s for s in self.subs if s._push(ev)]
        return bool(subs)
