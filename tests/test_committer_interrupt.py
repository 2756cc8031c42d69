"""A store whose ``write`` raises ``KeyboardInterrupt`` or ``SystemExit``: each item of the
batch is answered once (failed), and the session goes on as after any failed write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from bounds import BOUND
from structlog.testing import capture_logs

from nous_actor import Event, MemoryStore, Session, StoreError
from nous_actor.testing import DelegatingStore


class InterruptedWrite(DelegatingStore):
    """Raises ``exc`` from its first ``write``; later writes pass."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(MemoryStore())
        self.exc: BaseException | None = exc

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        exc, self.exc = self.exc, None
        if exc is not None:
            raise exc
        return super().write(appends)


@pytest.mark.parametrize("exc", [KeyboardInterrupt("in a write"), SystemExit(3)])
def test_each_append_of_an_interrupted_write_is_answered_once(exc: BaseException) -> None:
    store = InterruptedWrite(exc)
    s = Session.start("interrupted", store=store, timeout=BOUND)
    answers: list[str] = []
    with capture_logs() as logs:
        fut = s.append("user_message", {"content": "lost"})
        fut.add_done_callback(lambda: answers.append("answered"))
        with pytest.raises(StoreError):
            fut.get(timeout=BOUND)
        with pytest.raises(StoreError, match="after a store failure"):
            s.append("user_message", {"content": "refused"}).get(timeout=BOUND)
        assert s.count().get(timeout=BOUND) == 0
        s.stop(timeout=BOUND)  # its commit count is not left off by a second answer
    assert answers == ["answered"]
    assert [e["reason"] for e in logs if e["event"] == "store.committer_failed"] == [
        type(exc).__name__
    ]
    assert not [e for e in logs if e["event"] in ("session.crashed", "dispatcher.turn_failed")]
    assert store.load("interrupted") == []
