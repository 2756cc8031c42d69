"""The bottom of `nous_actor.core.log`: the fold, the position-sorted surface with its
messages, memoised in a `_Fold` that one version of a log owns at a time and keeps current
(a bisect and a splice per append); `_shadow_flags` and `_full_fold`, the fold from scratch.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import compress
from operator import attrgetter
from typing import Final, TypeVar

from nous_actor.core.event import SURFACE_TYPES, Event, Replace, project
from nous_actor.core.message import Message

_seq_of: Final = attrgetter("seq")
_pos_of: Final = attrgetter("_pos")
_op_of: Final = attrgetter("_op")

T = TypeVar("T")


class _Fold:
    """The memoised surface, position-sorted: its events and their messages.

    ``claim`` holds one byte while the fold belongs to the version holding it;
    the first thread to pop it takes the lists over (``bytearray.pop`` is atomic,
    as ``list.pop`` is, and a bytearray is no object for the cyclic collector),
    after which the holder must not trust them.

    Messages are projected lazily: the last ``lazy`` entries of ``msgs`` are
    ``None`` until a read needs them (`settle`), so appends that nobody
    derives cost no ``Message``, and each message is projected once.
    """

    __slots__ = ("claim", "evs", "lazy", "msgs")

    def __init__(self, evs: list[Event], msgs: list[Message | None], lazy: int = 0) -> None:
        self.evs = evs
        self.msgs = msgs
        self.lazy = lazy
        self.claim = bytearray(b"\x01")

    def take(self) -> bool:
        """Claim the lists for exclusive mutation; ``False`` if someone else has."""
        try:
            self.claim.pop()
        except IndexError:
            return False
        return True

    def handed_over(self) -> _Fold:
        """A new, unclaimed fold over the same lists (call after `take`)."""
        return _Fold(self.evs, self.msgs, self.lazy)

    def settle(self) -> None:
        """Project the messages not projected yet (only by the fold's owner)."""
        msgs, evs, n = self.msgs, self.evs, len(self.msgs)
        for k in range(n - self.lazy, n):
            msgs[k] = project(evs[k])
        self.lazy = 0

    def add(self, ev: Event) -> None:
        """Fold in ``ev``, which has a higher seq than every event folded so far."""
        evs = self.evs
        op = ev._op
        if op is not None:
            if self.lazy:
                self.settle()
            # Everything folded so far has a lower seq, so the replace shadows
            # exactly the run of surface entries whose position is in range.
            i = bisect_left(evs, op.start, key=_pos_of)
            j = bisect_right(evs, op.stop, i, key=_pos_of)
            if i < j:
                del evs[i:j], self.msgs[i:j]
        elif ev.type not in SURFACE_TYPES:
            return
        elif not evs or evs[-1]._pos <= ev._pos:  # the common case: it goes last
            evs.append(ev)
            self.msgs.append(None)
            self.lazy += 1
            return
        else:
            if self.lazy:
                self.settle()
            # Ties on position keep seq order: the newcomer goes after them.
            i = bisect_right(evs, ev._pos, key=_pos_of)
        evs.insert(i, ev)
        self.msgs.insert(i, project(ev))


def _shadow_flags(events: Sequence[Event], n: int) -> list[bool]:
    """For each of ``events[:n]`` (seq order), whether a later replace shadows it."""
    return shadowed(events, n, _pos_of, _op_of)


def shadowed(
    items: Sequence[T],
    n: int,
    position: Callable[[T], int],
    op: Callable[[T], Replace | None],
) -> list[bool]:
    """For each of the first ``n`` events of a log (``items``, in seq order; events or
    what stands for them), whether a later replace shadows it, ``position`` and ``op``
    reading an item's position and its `Replace` (``None`` for a plain event).

    One reverse pass over the replaces, keeping the union of the ranges of those
    seen so far (all with a higher seq) as sorted disjoint intervals. Between two
    replaces, the plain events stand at their seqs, in increasing order, so the
    ones an interval covers are found by bisection and flagged as one slice: the
    Python work is per replace and per interval, not per event. O(r log n) for r
    replaces, plus finding the replaces and the flags (in C).
    """
    flags = [False] * n
    starts: list[int] = []
    stops: list[int] = []
    end = n  # the plain events after the replace at hand run up to here
    for k in reversed(list(compress(range(n), map(op, items)))):  # a Replace is true
        if starts and k + 1 < end:
            _flag_plain(items, position, flags, k + 1, end, starts, stops)
        end = k
        item = items[k]
        p = position(item)
        i = bisect_right(starts, p) - 1
        if i >= 0 and stops[i] >= p:
            flags[k] = True
        r = op(item)
        assert r is not None
        s, e = r.start, r.stop  # a shadowed replace still shadows its own range
        lo = bisect_left(stops, s - 1)  # first interval touching [s, e]
        hi = bisect_right(starts, e + 1, lo)
        if lo < hi:
            s = min(s, starts[lo])
            e = max(e, stops[hi - 1])
        starts[lo:hi] = [s]
        stops[lo:hi] = [e]
    if starts and end:
        _flag_plain(items, position, flags, 0, end, starts, stops)
    return flags


def _flag_plain(
    items: Sequence[T],
    position: Callable[[T], int],
    flags: list[bool],
    a: int,
    b: int,
    starts: list[int],
    stops: list[int],
) -> None:
    """Flag the plain events ``items[a:b]`` (their positions, their seqs, increase) that
    stand in an interval of ``starts``/``stops``. Each interval inside their span is
    visited here alone (the spans of different calls are disjoint), plus at most two
    that cross its ends: a fold visits O(r) intervals in all."""
    first, last = position(items[a]), position(items[b - 1])
    i = bisect_left(stops, first)  # the first interval that ends at or after ``first``
    count = len(starts)
    while i < count and starts[i] <= last:
        lo = bisect_left(items, starts[i], a, b, key=position)
        hi = bisect_right(items, stops[i], lo, b, key=position)
        flags[lo:hi] = _TRUE * (hi - lo)
        i += 1


_TRUE: Final = [True]


def _full_fold(events: Sequence[Event], n: int) -> _Fold:
    flags = _shadow_flags(events, n)
    surface = [
        ev
        for ev, hidden in zip(events[:n], flags, strict=True)
        if not hidden and ev.type in SURFACE_TYPES
    ]
    surface.sort(key=_pos_of)  # stable: ties keep seq order
    return _Fold(surface, [None] * len(surface), len(surface))
