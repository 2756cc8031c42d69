"""Subscriptions across the process boundary: the shard holds the session's
subscriber, and a local `Subscription` is fed from it by long polls."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from nous_actor.cluster.ray._link import _Link
from nous_actor.cluster.ray._protocol import NOW, POLL_WAIT, _disconnected, _lost
from nous_actor.store.subscription import Subscription


class _Feed:
    """Feeds a local `Subscription` from its shard by long polls, each sent when the
    last one answered (no thread of its own)."""

    __slots__ = ("closed", "link", "session_id", "sub", "token")

    def __init__(self, link: _Link, session_id: str, sub: Subscription, token: int) -> None:
        self.link = link
        self.session_id = session_id
        self.sub = sub
        self.token = token
        self.closed = False

    def poll(self) -> None:
        if self.closed:
            return
        why = _disconnected()
        if why is not None:
            self._end(None)
            return
        try:
            ref = self.link.actor.poll.remote(self.token, POLL_WAIT, self.session_id)
        except Exception as exc:
            self._end(exc)
            return
        ref.future().add_done_callback(self._polled)

    def _polled(self, answer: Future[Any]) -> None:
        if self.closed:  # ended meanwhile (closed, or its registry was): nothing more
            return
        try:
            events, ended, error = answer.result()
        except Exception as exc:
            self._end(exc)
            return
        for ev in events:
            if not self.sub._push(ev):  # closed here, or this reader lags behind
                self.close(self.sub)
                return
        if ended:
            self.closed = True
            self.link.detach(self)
            self.sub._finish(error)
            return
        self.poll()

    def _end(self, exc: BaseException | None) -> None:
        """The shard cannot be polled (``exc``: why; ``None``: this process is no longer
        connected to Ray, which ends every subscription of the registry normally)."""
        self.closed = True
        self.link.detach(self)
        why = _disconnected()
        if why is not None:
            self.link.close(why)
        if self.link.closed is not None or exc is None:
            self.sub._finish(None)
        else:
            self.sub._finish(_lost(self.session_id, self.link.index, exc))

    def unlinked(self) -> None:
        """The registry was closed (`_Link.close`): the subscription ends as a local
        registry's close ends it, normally, after the events already delivered (its
        ``get`` then raises `nous_actor.SessionStopped`), and the shard drops its
        subscriber (the shards may keep serving other drivers)."""
        self.close(self.sub)
        self.sub._finish(None)

    def close(self, sub: Subscription) -> None:
        if self.closed:
            return
        self.closed = True
        self.link.detach(self)
        if _disconnected() is not None:
            return  # the shard is out of reach (and Ray must not be started again)
        try:
            self.link.actor.unsubscribe.remote(self.token)
        except Exception:  # the shard is gone: so is its subscriber
            pass


def _drop_late(actor: Any, answer: Future[Any]) -> None:
    try:
        state, value = answer.result()
    except Exception:
        return
    if state == NOW and _disconnected() is None:
        try:
            actor.unsubscribe.remote(value[0])
        except Exception:
            pass
