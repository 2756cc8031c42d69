"""Links: the way from a route to the process (or the registry) that holds its session.

Two kinds, one interface (`nous_actor.sessions.forwarding.route.Link`):

* `LocalLink`: the holder is another registry of this process on the same store
  object (two registries on one `MemoryStore` stand for two processes in a
  simulation). A call is handed to that registry's route at once, with a future
  that relays its answer to the caller's (or, not applied because that registry
  closed, hands the call back to the caller's route).
* `SocketLink`: the holder is another process on this host. Calls go over one
  Unix-domain socket per holder (`multiprocessing.connection`, authenticated
  by the store's secret: see `nous_actor.sessions.forwarding.auth`), in
  batches, in the order sent; a reader thread answers their futures.

A call sent over a socket whose answer never comes back because the holder
died or the connection broke fails with `CallOutcomeUnknown` (a `SessionCrashed`):
it may or may not have been applied. The holder records each call's id with what
it appends, in the same transaction, so ``session.applied(err.call_id)`` tells which.
A read is the exception: it changed nothing, so it goes back to its route like a call
never written (`RESENT_IF_LOST`).
A call that was not yet written to the socket was not applied: it goes back to its
route, which delivers it where the session is next.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pickle
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Final

from nous_actor._log import get_logger
from nous_actor.core._frozen import short_repr
from nous_actor.core.event import Event, EventType
from nous_actor.errors import CallOutcomeUnknown, NousActorError, SessionStopped
from nous_actor.runtime import forks
from nous_actor.runtime.exit import at_exit
from nous_actor.sessions.actor import EventParts, Handler, SessionActor
from nous_actor.sessions.forwarding.auth import PROTOCOL, caller_side
from nous_actor.sessions.forwarding.route import REGISTRY_CLOSED, Call, Route
from nous_actor.sessions.future import ForwardedFuture, SessionFuture
from nous_actor.sessions.turns._blocks import HeldFuture

__all__ = [
    "ASKED",
    "GOODBYE",
    "NOT_HELD",
    "OK",
    "FAILED",
    "SEQ",
    "FrameReader",
    "LocalLink",
    "SocketLink",
    "portable",
    "socket_path",
]

logger = get_logger("nous_actor.sessions.forwarding")

OK, FAILED, NOT_HELD, SEQ = range(4)
"""What comes back for a call: its value, its error, "this process does not hold the
session" (not applied: send it where the session is), or the (first) seq of what an
append appended (the caller rebuilds the events from the parts it sent)."""


ASKED: Final = "__asked__"
"""What a process sends the holder of a session it asked for in the store (`ask_handoff`):
the holder's hand-over looks at the requests now (a holder others can tell so waits
for this, not polling the store). Sent with no call id: nothing comes back."""

_NO_ANSWER: Final = -1
"""The call id of what the endpoint answers nothing to (`ASKED`)."""

GOODBYE: Final = -2
"""The call id of a holder's last word on a link, ``(GOODBYE, NOT_HELD, last)``: its
endpoint closed (its last registry is closing), so it took no call after the one
numbered ``last`` (-1: none), and takes none any more: every later call was not applied
and goes back to its route. The calls up to ``last`` are answered as they complete."""


_TURN_ENDS: Final = frozenset({"h_turn_end", "h_turn_gone"})
"""The calls that end a turn (by its id, their first argument)."""

RESENT_IF_LOST: Final = frozenset({"h_read", "h_log", "h_applied"})
"""The calls that only read (the log's reads, the log, a call's record): one whose holder
went away before answering is sent where the session is next, never answered with
`CallOutcomeUnknown` (nothing it could have done needs checking)."""


def call_id(token: str, number: int) -> str:
    """The id of call ``number`` of the link whose token is ``token``: what the holder
    records with the call's events, and what `CallOutcomeUnknown` names."""
    return f"{token}-{number:x}"


HOST: Final = socket.gethostname()


def socket_path(address: str) -> str | None:
    """The socket path of ``address`` when it is a socket of this host, else ``None``."""
    kind, _, rest = address.partition(":")
    if kind != "unix":
        return None
    host, _, path = rest.partition(":")
    return path if host == HOST and path else None


def portable(exc: BaseException) -> Exception:
    """``exc`` if it survives a trip to another process, else a `NousActorError` saying
    what it was."""
    if isinstance(exc, Exception):
        try:
            pickle.loads(pickle.dumps(exc))
            return exc
        except Exception:
            pass
    return NousActorError(f"{type(exc).__name__}: {short_repr(exc)}")


class LocalLink:
    """The holder is another registry of this process: a call is handed to its route
    (``route_here``: ``None`` when none here holds the session) with a future of its own
    that relays the answer to the caller's, or, if the holder's registry closed before
    the call was applied, hands the call back to the caller's route (not applied), as
    the holder's endpoint answers another process "not held"."""

    __slots__ = ("address", "asked", "route_here")

    closed: Final = False  # a registry of this process is never out of reach

    def __init__(
        self,
        address: str,
        route_here: Callable[[str], Route | None],
        asked: Callable[[str], None],
    ):
        self.address = address
        self.route_here = route_here
        self.asked = asked

    def tell_asked(self, session_id: str) -> None:
        self.asked(session_id)

    def send(
        self, route: Route, epoch: int, handler: Handler, args: tuple[Any, ...], fut: Any
    ) -> None:
        target = self.route_here(route.session_id)
        if target is None:
            try:
                route.refused(epoch, (handler, args, fut))
            finally:
                route.answered()
            return
        relay = _relay_for(fut)
        relay.add_done_callback(
            partial(_relayed, route, epoch, (handler, args, fut), relay, target)
        )
        target.send(handler, args, relay)


def _relay_for(fut: Any) -> SessionFuture[Any]:
    """The future a call to another registry of this process is answered through: of the
    kind of the caller's (the turn blocks of a write made inside them, a forwarded call's
    id), with its bound."""
    kind = type(fut)
    if kind is HeldFuture:
        return HeldFuture(fut._session_id, fut._timeout, fut.turn_ids, fut.from_task)
    if kind is ForwardedFuture:
        return ForwardedFuture(fut._session_id, fut._timeout, fut.call_id)
    return SessionFuture(fut._session_id, fut._timeout)


def _relayed(
    route: Route, epoch: int, call: Call, relay: SessionFuture[Any], target: Route
) -> None:
    """``relay`` is answered: answer the caller's future with it, unless the call was not
    applied because the holder's registry closed (then it goes back to ``route``)."""
    value = relay._value
    try:
        if not relay.failed():
            call[2]._resolve(value)
        elif type(value) is SessionStopped and (
            value.message == REGISTRY_CLOSED or target.closed == REGISTRY_CLOSED
        ):
            route.refused(epoch, call)
        else:
            call[2]._fail(value)
    finally:
        route.answered()


class Sender:
    """Writes to one connection, in the order put.

    A put finds the connection idle (nothing queued, nobody writing) most of the
    time: it then writes its frame at once, in the putting thread, without waiting
    for the socket (``MSG_DONTWAIT``): a call or an answer costs no wake-up of
    another thread. What the socket does not take at once (a full buffer: a slow
    reader), and whatever is put while a write is under way, goes to the writer
    thread, which sends it, the rest of a cut frame first, then in batches: no
    caller or committer thread ever blocks on the socket, and frames go out whole,
    in the order put.
    """

    __slots__ = (
        "_closed",
        "_cond",
        "_conn",
        "_cut",
        "_on_lost",
        "_pending",
        "_sock",
        "_thread",
        "_writing",
        "broken",
    )

    def __init__(
        self, conn: Connection, name: str, on_lost: Callable[[list[Any]], None] | None = None
    ) -> None:
        self._conn = conn
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[Any] = []
        self._on_lost = on_lost
        self._closed = False
        self._writing = False  # a putting thread writes a frame now
        self._cut: tuple[bytes, Any] | None = None  # the rest of a frame, and its item
        self.broken: BaseException | None = None
        # The same socket, for writes that never wait (its own descriptor; the
        # connection's stays as it was, blocking, for the writer thread).
        self._sock: socket.socket | None = _nonblocking_twin(conn)
        # A plain daemon thread (it waits on a socket; never a simulation's task).
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: Any) -> bool:
        """Queue ``item`` (or write it at once); ``False`` if the connection is broken
        (nothing queued)."""
        with self._cond:
            if self.broken is not None or self._closed:
                return False
            sock = self._sock
            if sock is None or self._writing or self._pending or self._cut is not None:
                self._pending.append(item)
                if len(self._pending) == 1:
                    self._cond.notify()
                return True
            self._writing = True  # others queue behind this frame
        cut: tuple[bytes, Any] | None = None
        try:
            frame = _frame(pickle.dumps([item], pickle.HIGHEST_PROTOCOL))
            try:
                sent = sock.send(frame, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent < len(frame):
                cut = (frame[sent:], item) if sent else None
        except Exception:
            sent = 0  # not written: the writer thread sends it (and meets the error)
        with self._cond:
            self._writing = False
            if cut is not None:
                self._cut = cut
            elif sent == 0:
                self._pending.insert(0, item)  # first: everything else was put after it
            if self._cut is not None or self._pending or self._closed or self.broken:
                self._cond.notify()  # (only then: the writer thread sleeps on)
        return True

    def flushed(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until everything put is written (or the
        connection broke, or it closed); whether it was."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._writing or self._pending or self._cut is not None:
                if self.broken is not None or self._closed:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.005))  # (the writer notifies nobody: it polls)
        return True

    def close(self) -> None:
        """Stop writing (what is queued is not written)."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        try:
            self._write_all()
        finally:
            with self._cond:  # a put writing now still holds the descriptor: let it end
                while self._writing:
                    self._cond.wait()
                sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()

    def _write_all(self) -> None:
        while True:
            with self._cond:
                while (
                    self._writing or not (self._pending or self._cut is not None)
                ) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch, self._pending = self._pending, []
                cut, self._cut = self._cut, None
                self._writing = True
            try:
                if cut is not None and self._sock is not None:  # (a cut needs the twin)
                    self._sock.sendall(cut[0])  # the rest of the frame a put began
                    cut = None
                if batch:
                    self._conn.send_bytes(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL))
            except (OSError, ValueError) as exc:
                with self._cond:
                    self._writing = False
                    self.broken = exc
                    lost = ([cut[1]] if cut is not None else []) + batch + self._pending
                    self._pending = []
                if self._on_lost is not None and lost:
                    self._on_lost(lost)
                return
            with self._cond:
                self._writing = False


_CHUNK: Final = 1 << 16
"""Bytes a `FrameReader` asks the socket for at least, in one read."""


class FrameReader:
    """Reads the frames of one connection (`multiprocessing.connection`'s: a 4-byte
    big-endian length, or -1 and an 8-byte one, then the bytes) as they come: every whole
    frame the socket holds, in one read of up to `_CHUNK` bytes (a frame's rest in as
    many as it takes), where ``recv_bytes`` reads twice a frame. Under load calls and
    answers come several at a time: each read costs a system call and a hand-back of the
    GIL, taken again after it."""

    __slots__ = ("_buf", "_end", "_fd", "_start")

    def __init__(self, conn: Connection) -> None:
        self._fd = conn.fileno()
        self._buf = bytearray(_CHUNK)
        self._start = 0  # the first byte not yet handed out
        self._end = 0  # the end of the bytes read

    def frames(self) -> list[bytes]:
        """The frames received whole, at least one (waiting for it).

        Raises:
            EOFError: the peer closed the connection.
            OSError: reading failed.
            ValueError: a frame's length is not one.
        """
        while True:
            out = self._whole()
            if out:
                return out
            self._fill()

    def _head(self) -> tuple[int, int] | None:
        """The length of the frame at the start and of its head, if read that far."""
        buf, at, have = self._buf, self._start, self._end - self._start
        if have < 4:
            return None
        size = int.from_bytes(buf[at : at + 4], "big", signed=True)
        if size >= 0:
            return size, 4
        if size != -1:
            raise ValueError(f"a frame's length is {size}")
        return (int.from_bytes(buf[at + 4 : at + 12], "big"), 12) if have >= 12 else None

    def _whole(self) -> list[bytes]:
        out: list[bytes] = []
        with memoryview(self._buf) as view:
            while (found := self._head()) is not None:
                size, head = found
                at = self._start + head
                if self._end - at < size:
                    break
                out.append(view[at : at + size].tobytes())
                self._start = at + size
        if self._start == self._end:  # all handed out: read from the front again
            self._start = self._end = 0
            if len(self._buf) > _CHUNK:  # (a big frame's room is not kept)
                self._buf = bytearray(_CHUNK)
        return out

    def _fill(self) -> None:
        """Read once more: at least what the frame begun needs, at least `_CHUNK`."""
        found = self._head()
        want = _CHUNK if found is None else max(_CHUNK, sum(found) - (self._end - self._start))
        buf, start, end = self._buf, self._start, self._end
        if len(buf) - end < want:  # the bytes not handed out to the front, room after them
            kept = buf[start:end]
            if len(buf) < len(kept) + want:
                buf.extend(bytes(len(kept) + want - len(buf)))
            buf[: len(kept)] = kept
            self._start, self._end = start, end = 0, len(kept)
        with memoryview(buf) as view, view[end:] as room:
            n = os.readv(self._fd, [room])
        if not n:
            raise EOFError("the peer closed the connection")
        self._end = end + n


def _frame(payload: bytes) -> bytes:
    """``payload`` framed as `multiprocessing.connection` frames a message (a 4-byte
    big-endian length, then the bytes), for a reader that calls ``recv_bytes``."""
    return len(payload).to_bytes(4, "big", signed=True) + payload


def _nonblocking_twin(conn: Connection) -> socket.socket | None:
    """A socket on a duplicate of ``conn``'s descriptor, or ``None`` if it has none."""
    try:
        fd = os.dup(conn.fileno())
    except (OSError, ValueError):
        return None
    try:
        return socket.socket(fileno=fd)
    except OSError:  # not a socket (a pipe): the writer thread writes everything
        os.close(fd)
        return None


class SocketLink:
    """The way to another process of this host that holds sessions (see the module)."""

    __slots__ = (
        "_answered",
        "_calls",
        "_conn",
        "_ids",
        "_lock",
        "_sender",
        "_token",
        "_turns",
        "address",
        "closed",
        "sent",
    )

    def __init__(self, address: str, key: bytes, timeout: float) -> None:
        path = socket_path(address)
        if path is None:
            raise NousActorError(f"{address!r} is not a socket of this host")
        self.address = address
        self._token = secrets.token_hex(8)  # this link's calls' ids begin with it
        self._conn = _connect(path, key, timeout, pickle.dumps((PROTOCOL, self._token)))
        self._sender = Sender(self._conn, "nous-link-writer", self._unsent)
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[Route, int, Call]] = {}
        # The turns opened over this link and not ended through it, by id: their route's
        # (`let_go_turns`).
        self._turns: dict[str, weakref.ref[Route]] = {}
        self._ids = itertools.count()
        self.closed = False
        self.sent = 0
        self._answered = threading.Event()  # set at every batch of answers (exit waits)
        # A plain daemon thread (it waits on a socket; never a simulation's task).
        threading.Thread(target=self._read, name="nous-link", daemon=True).start()

    def send(
        self, route: Route, epoch: int, handler: Handler, args: tuple[Any, ...], fut: Any
    ) -> None:
        call: Call = (handler, args, fut)
        try:
            blob = pickle.dumps(
                (
                    route.session_id,
                    epoch,
                    handler.__name__,
                    _travelling(handler, args),
                    fut._timeout,
                    _blocks_of(fut),
                ),
                pickle.HIGHEST_PROTOCOL,
            )
        except Exception as exc:
            route.answered()
            fut._fail(
                TypeError(
                    "the call goes to the process that holds the session, so its "
                    f"arguments must be picklable: {type(exc).__name__}: {short_repr(exc)}"
                )
            )
            return
        cid = next(self._ids)
        with self._lock:
            if self.closed:
                cid = -1
            else:
                self._calls[cid] = (route, epoch, call)
                if handler.__name__ in _TURN_ENDS:
                    self._turns.pop(args[0], None)
        if cid < 0 or not self._sender.put((cid, blob)):
            if cid >= 0:
                with self._lock:
                    self._calls.pop(cid, None)
            route.refused(epoch, call)  # never written: not applied
            route.answered()
            return
        self.sent += 1

    def tell_asked(self, session_id: str) -> None:
        blob = pickle.dumps((session_id, 0, ASKED, ()), pickle.HIGHEST_PROTOCOL)
        self._sender.put((_NO_ANSWER, blob))  # (a broken link: the holder looks anyway)

    def _unsent(self, items: list[Any]) -> None:
        """Items never written (the connection broke first): not applied."""
        for cid, _ in items:
            with self._lock:
                entry = self._calls.pop(cid, None)
            if entry is not None:
                route, epoch, call = entry
                route.refused(epoch, call)
                route.answered()

    def _read(self) -> None:
        frames = FrameReader(self._conn)
        try:
            while True:
                batch = [item for frame in frames.frames() for item in pickle.loads(frame)]
                for cid, state, blob in batch:
                    if cid == GOODBYE:
                        self._goodbye(blob)
                        continue
                    with self._lock:
                        entry = self._calls.pop(cid, None)
                    if entry is None:
                        continue
                    route, epoch, call = entry
                    fut = call[2]
                    try:
                        if state == NOT_HELD:
                            route.refused(epoch, call)
                            continue
                        if state == SEQ:
                            fut._resolve(_appended(call, blob))
                            continue
                        try:
                            value = pickle.loads(blob)
                        except Exception as exc:
                            state, value = (
                                FAILED,
                                NousActorError(
                                    f"the answer could not be read: {type(exc).__name__}: "
                                    f"{short_repr(exc)}"
                                ),
                            )
                        if state == OK:
                            if call[0].__name__ == "h_turn_open":
                                self._opened(call[1][0].turn_id, route)
                            fut._resolve(value)
                        else:
                            fut._fail(value)
                    finally:
                        route.answered()
                self._answered.set()
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError) as exc:
            self._lost(exc)

    def _opened(self, turn_id: str, route: Route) -> None:
        """Turn ``turn_id`` was opened over this link, through ``route``."""
        with self._lock:
            if not self.closed:
                self._turns[turn_id] = weakref.ref(route)

    def let_go_turns(self, route: Route) -> None:
        """``route`` closed (its registry closes): the turns opened through it and still
        open have no holder any more (nobody can write through them, nor close them),
        so the holder ends them as a gone holder's, at once, as when this process ends,
        not when their leases run out. Best effort: nothing comes back."""
        with self._lock:
            mine = [t for t, ref in self._turns.items() if ref() is route]
            for turn_id in mine:
                del self._turns[turn_id]
        for turn_id in mine:
            with route.lock:
                route.inflight += 1  # (`send` answers it)
            fut: SessionFuture[Any] = SessionFuture(route.session_id, route.timeout)
            self.send(route, route.epoch, SessionActor.h_turn_gone, (turn_id,), fut)

    def _goodbye(self, last: int) -> None:
        """The holder took no call after number ``last``, and takes none any more: those
        go back to their routes (not applied), and no call goes out on this link again
        (the routes find where their sessions are next); the answers of the calls it took
        still come in on it."""
        with self._lock:
            self.closed = True
            later = sorted(n for n in self._calls if n > last)
            handed = [self._calls.pop(n) for n in later]
        with _links_lock:  # (the exit still waits for the answers to come: `_closing`)
            _closing.add(self)
        _forget(self)
        for route, epoch, call in handed:  # (in the order sent)
            route.refused(epoch, call)
            route.answered()

    def _lost(self, exc: BaseException) -> None:
        """The connection broke: every write still waiting may or may not have been
        applied by the holder; say so. A read still waiting (`RESENT_IF_LOST`) changed
        nothing wherever it got to: it goes back to its route, which delivers it where
        the session is next (`session.applied(call_id)`, asked right after a holder
        died, is answered there instead of failing the same way)."""
        with self._lock:
            self.closed = True
            calls, self._calls = self._calls, {}
            self._turns.clear()  # (the holder ends them: `Endpoint._peer_gone`)
        self._answered.set()
        self._sender.close()
        _forget(self)
        with _links_lock:
            _closing.discard(self)
        try:
            self._conn.close()
        except OSError:
            pass
        for number, (route, epoch, call) in calls.items():
            if call[0].__name__ in RESENT_IF_LOST:
                route.refused(epoch, call)
                route.answered()
                continue
            fut = call[2]
            cid = call_id(self._token, number)
            fut._fail(
                CallOutcomeUnknown(
                    route.session_id,
                    f"the process holding it ({self.address}) went away before "
                    f"answering ({type(exc).__name__}); the call may or may not have "
                    f"been applied: session.applied({cid!r}) tells which",
                    cid,
                )
            )
            route.answered()

    def close(self) -> None:
        self._sender.close()
        try:
            self._conn.close()
        except OSError:
            pass


def _blocks_of(fut: Any) -> tuple[frozenset[str], bool] | None:
    """The turn blocks a plain write was made from inside (their ids, and whether by an
    asyncio task), as they travel: the holder fails it at once if one of them is the
    session's open turn (`HeldFuture`), as where the session is held; ``None`` for a call
    made from none (the common case)."""
    if type(fut) is HeldFuture:
        return fut.turn_ids, fut.from_task
    return None


def _appended(call: Call, first: int) -> Any:
    """What an append answered with ``first`` (its seq) appended: its event(s), made from
    the parts the caller sent, as the holder made them."""
    handler, args, _ = call
    name = handler.__name__
    if name == "h_append":
        return Event._trusted(first, *args[0])
    if name == "h_append_at":
        return Event._trusted(args[0], *args[1])
    return [Event._trusted(first + k, *parts) for k, parts in enumerate(args[0])]


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_KINDS: Final = {kind.value: kind for kind in EventType}


def _flat(parts: EventParts) -> tuple[str, int, Any, Any]:
    """An event's parts as they travel: its type's name and its time in microseconds
    since the epoch (a datetime and its time zone cost pickle 3 to 4 us each)."""
    kind, t, data, op = parts
    d = t - _EPOCH
    return kind.value, (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds, data, op


def _parts(flat: tuple[str, int, Any, Any]) -> EventParts:
    """The parts `_flat` made travel, as they were."""
    kind, micros, data, op = flat
    return _KINDS[kind], _EPOCH + timedelta(microseconds=micros), data, op


def _each_event(
    name: str, args: tuple[Any, ...], each: Callable[[Any], Any]
) -> tuple[Any, ...] | None:
    """The arguments of append call ``name`` with ``each`` applied to every event's
    parts; ``None`` for any other call."""
    if name == "h_append_many":
        return (tuple(map(each, args[0])),)
    if name == "h_append":
        return (each(args[0]),)
    if name == "h_append_at":
        return (args[0], each(args[1]))
    return None


def arrived(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments of call ``name`` as they were sent (`_travelling` undone).

    Raises:
        KeyError, ValueError, TypeError: they are not what `_travelling` makes.
    """
    made = _each_event(name, args, _parts)
    return args if made is None else made


def _travelling(handler: Handler, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` as they can travel: a compaction leaves its caller's event loop, its slot
    and its trace context behind (its summariser runs where the session is); an
    append's events travel flat (`_flat`)."""
    name = handler.__name__
    flat = _each_event(name, args, _flat)
    if flat is not None:
        return flat
    if name == "h_compact":
        return (_plain_compaction(args[0]),)
    if name == "h_turn_call" and args[1] == "h_compact":
        return (args[0], args[1], (_plain_compaction(args[2][0]),))
    if name == "h_turn_open" and getattr(args[0], "context", None) is not None:
        return (dataclasses.replace(args[0], context=None), *args[1:])
    return args


def _plain_compaction(req: Any) -> Any:
    return dataclasses.replace(req, loop=None, slot=None, context=None)


def _connect(path: str, key: bytes, timeout: float, opening: bytes) -> Connection:
    """A connection to the socket at ``path``, authenticated with ``key`` both ways
    (`auth`), ``opening`` sent with this side's proof."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        sock.settimeout(None)
        conn = Connection(sock.detach())
    except BaseException:
        sock.close()
        raise
    try:
        caller_side(conn, key, opening, timeout)
    except BaseException:
        conn.close()
        raise
    return conn


_links: dict[str, SocketLink] = {}
_links_lock = threading.Lock()


class _Connecting:
    """A link being made to an address: the other threads that want one wait for it."""

    __slots__ = ("done", "link")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.link: SocketLink | None = None  # None once done: it failed


_connecting: dict[str, _Connecting] = {}  # under _links_lock

_closing: set[SocketLink] = set()  # under _links_lock
"""Links whose holder said goodbye (`GOODBYE`) with calls still to answer: no longer this
process's link to their address, still waited for at exit."""


def link_to(address: str, key: bytes, timeout: float) -> SocketLink:
    """This process's link to ``address`` (made on first use, shared by its routes).

    One thread makes it; the others that want it meanwhile wait for that one (at most
    ``timeout``) instead of each connecting and authenticating, to keep one link: a
    web worker's first requests all want the same few links at once. If that one
    fails, each tries for itself (and says why).

    Raises:
        OSError: no process answers there (it ended, or never listened).
        multiprocessing.AuthenticationError: it does not know this store's secret.
    """
    with _links_lock:
        link = _links.get(address)
        if link is not None and not link.closed:
            return link
        pending = _connecting.get(address)
        mine = pending is None
        if mine:
            pending = _connecting[address] = _Connecting()
    assert pending is not None
    if not mine:
        pending.done.wait(timeout)
        link = pending.link
        if link is not None and not link.closed:
            return link
        return _made(address, SocketLink(address, key, timeout))
    try:
        made = _made(address, SocketLink(address, key, timeout))
    except BaseException:
        with _links_lock:
            _connecting.pop(address, None)
        pending.done.set()
        raise
    with _links_lock:
        _connecting.pop(address, None)
    pending.link = made
    pending.done.set()
    return made


def _forget_links() -> None:
    """(In a forked child.) The parent's links are its own (their threads stayed there,
    and a frame written here would go out on its connection): the child connects anew."""
    global _links_lock
    _links_lock = threading.Lock()
    _links.clear()
    _connecting.clear()
    _closing.clear()


forks.after_fork(_forget_links)


def _made(address: str, made: SocketLink) -> SocketLink:
    """Keep ``made`` as the link to ``address``, unless one is kept already (then that
    one, and ``made`` is closed)."""
    with _links_lock:
        link = _links.get(address)
        if link is not None and not link.closed:
            made.close()
            return link
        _links[address] = made
    return made


def _forget(link: SocketLink) -> None:
    with _links_lock:
        if _links.get(link.address) is link:
            del _links[link.address]


EXIT_BOUND: Final = 30.0
"""Seconds a program that ends waits, at most, for the answers of calls it forwarded."""


def _answers_at_exit() -> None:
    """At exit: wait until every call this process forwarded is answered (its holder
    committed it, refused it, or died), so an append whose call returned is stored
    before the program goes, as a local one is; bounded by `EXIT_BOUND`."""
    deadline = time.monotonic() + EXIT_BOUND
    with _links_lock:  # (a forked child's are its own: `_forget_links`)
        links = [*_links.values(), *_closing]
    for link in links:
        while time.monotonic() < deadline:
            with link._lock:
                if not link._calls:  # (a lost link has none left)
                    break
            link._answered.wait(min(0.05, max(deadline - time.monotonic(), 0.0)))
            link._answered.clear()


at_exit(_answers_at_exit)
