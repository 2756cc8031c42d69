"""`Feeds`: a session's subscriptions, each fed every event the session applies."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from nous_actor.core.event import Event
from nous_actor.store.subscription import Subscription


class Feeds:
    """The live subscriptions of a session (kept by its actor only while it has one).

    Invariants: a subscription gets its catch-up and is registered in one step (no
    gap, no duplicate); each applied event goes to every live subscription in seq
    order; one that is done (closed, cut off as lagging, or dropped by its reader
    without being closed: it is held weakly, and freed) is dropped at its next event.
    A session keeps a `Feeds` only while it holds a subscription (`push` and `remove`
    say when none is left), so its truth is ``feeds is not None``.
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Subscription]] = []

    @property
    def subs(self) -> list[Subscription]:
        """The subscriptions still held by their readers, at one moment."""
        return [sub for ref in self._refs if (sub := ref()) is not None]

    def add(self, sub: Subscription, past: Iterable[Event]) -> None:
        """Register ``sub`` after giving it ``past`` (the retained events it asked for)."""
        sub._catch_up(past)
        # The entries of subscriptions freed meanwhile go now (a session that applies
        # nothing, subscribed to over and over, keeps the live ones only).
        refs = self._refs = [ref for ref in self._refs if ref() is not None]
        refs.append(weakref.ref(sub))

    def remove(self, sub: Subscription) -> bool:
        """Stop feeding ``sub``; ``False`` once none is left."""
        refs = self._refs = [
            ref for ref in self._refs if (s := ref()) is not None and s is not sub
        ]
        return bool(refs)

    def push(self, ev: Event) -> bool:
        """Feed ``ev`` to each subscription; ``False`` once none is left."""
        refs = self._refs = [
            ref for ref in self._refs if (sub := ref()) is not None and sub._push(ev)
        ]
        return bool(refs)
