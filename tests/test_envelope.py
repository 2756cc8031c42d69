"""The envelope a call travels in to its session's actor is invisible to the cyclic
collector (`CallEnvelope`, ``gc=False``: one object fewer per queued call for each
collection), and nothing a call refers to leaks because of it: an error stored in the
call's future keeps the frames of the actor's loop through its traceback, and none of
them holds the envelope.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from bounds import BOUND

from nous_actor import Session
from nous_actor.errors import SessionCrashed
from nous_actor.runtime.dispatcher import CallEnvelope, DispatchedActor


class Meltdown(BaseException):
    """Neither an Exception nor an interpreter signal: it crashes the session."""


class Marker:
    """Something a failed call refers to, to see whether it is collected."""


def test_an_envelope_is_not_tracked_by_the_cyclic_collector() -> None:
    envelope = CallEnvelope(len, (), None)
    assert not gc.is_tracked(envelope)
    assert envelope.message == (len, (), None)  # made as it is read
    assert envelope.reply_to is None


def _failing(exc: BaseException, marker: Marker) -> Callable[[Any], None]:
    def handler(_actor: Any) -> None:
        held = marker  # a frame of the call refers to it too
        raise exc from None if held is None else exc

    return handler


@pytest.mark.parametrize(
    ("kind", "raised"), [(ValueError, ValueError), (Meltdown, SessionCrashed)]
)
def test_what_a_failed_call_refers_to_is_collected_once_dropped(
    kind: type[BaseException], raised: type[BaseException]
) -> None:
    """A call that raises (the call fails) or crashes the session (the call fails with
    `SessionCrashed`): its error, the traceback through the actor's loop, and all they
    refer to are collected once the caller lets go of the future and the session."""
    marker = Marker()
    gone = weakref.ref(marker)
    s = Session.start("env-leak", timeout=BOUND)
    s.count().get()
    fut = s._call(_failing(kind("refused"), marker))
    with pytest.raises(raised):
        fut.get()
    s.stop()
    del fut, s, marker
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]


def test_any_dispatched_actor_reads_a_call_envelope_as_its_message() -> None:
    """An actor that does not run such calls itself (not a session's) gets the call as
    Pykka would: the ``(handler, args, future)`` tuple, through its ``on_receive``."""
    got: list[Any] = []
    done = threading.Event()

    class Recorder(DispatchedActor):
        def on_receive(self, message: Any) -> Any:
            got.append(message)
            done.set()
            return None

    ref = Recorder.start()
    try:
        ref.actor_inbox.put(CallEnvelope(len, ("x",), None))  # type: ignore[attr-defined]
        assert done.wait(BOUND)
        assert got == [(len, ("x",), None)]
    finally:
        ref.stop(timeout=BOUND)
