"""`unique_hex`: the ids the runtime makes per actor, claim and turn, without a random
draw each."""

from __future__ import annotations

import itertools
import os

__all__ = ["unique_hex"]


class _Draws:
    """Where `unique_hex` draws from: this process's random prefix and a counter."""

    prefix: str = ""
    counter: itertools.count[int] = itertools.count()


def _reseed(prefix: str | None = None) -> tuple[str, itertools.count[int]]:
    """Draw this process's prefix (or take ``prefix``) and restart the counter; return
    the previous pair (the simulation puts it back when it ends)."""
    saved = (_Draws.prefix, _Draws.counter)
    _Draws.prefix = os.urandom(8).hex() if prefix is None else prefix
    _Draws.counter = itertools.count()
    return saved


def _restore(saved: tuple[str, itertools.count[int]]) -> None:
    _Draws.prefix, _Draws.counter = saved


_reseed()
if hasattr(os, "register_at_fork"):  # a forked child draws a prefix of its own
    os.register_at_fork(after_in_child=_reseed)


def unique_hex() -> str:
    """32 hex digits no other call returns, in this process or another: a prefix of 64
    random bits drawn once per process, then a 64-bit counter.

    For the ids the runtime makes per actor, claim and turn. ``uuid.uuid4()`` draws
    from ``os.urandom`` each time, which lets go of the GIL: with other threads busy,
    the caller waits for it back (~0.2 ms where the draw takes 1 µs), and opening
    10,000 sessions paid that twice per session (the actor's name on the registry's
    thread, the claim's token on a reader's).

    >>> a, b = unique_hex(), unique_hex()
    >>> len(a), a != b, a[:16] == b[:16]
    (32, True, True)
    """
    return f"{_Draws.prefix}{next(_Draws.counter):016x}"
