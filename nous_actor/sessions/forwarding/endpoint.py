"""`Endpoint`: where this process answers calls for the sessions it holds on one store.

One endpoint per store object, shared by the registries on it. Its address is
written with every claim the store takes (``advertise``), so a process that
finds a session held finds where to send its calls (``holder_address``).

* On a store with a secret (``forwarding_key``: `SQLiteStore`,
  `PostgresStore`), the endpoint listens on a Unix-domain socket in a folder
  of its own, readable by this user alone (mode 0700), and admits a peer only
  after both sides proved they know the store's secret (HMAC-SHA256 over both
  sides' fresh nonces, in one round trip: `nous_actor.sessions.forwarding.auth`).
  **Who can call**: a process of the same OS user (or root) on the same host
  that can read the store. **What it can do**: what a handle can do on the
  sessions this process holds (the session actor's calls declared `REMOTE`, a
  compaction, a stop); calls and answers travel pickled, so a peer is trusted
  as the user's own code is (as with `multiprocessing`'s managers): never
  expose the socket to anyone else.
* On a store without one (`MemoryStore`), the endpoint is reachable from this
  process only: two registries on one store object hand calls to each other
  directly (a simulation's two "processes").

A call for a session no registry here holds is answered "not held" (it was not
applied): the caller's route finds the session where it is now.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Container
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Final

from nous_actor._log import get_logger
from nous_actor.errors import NousActorError, SessionStopped
from nous_actor.runtime import forks, scheduling
from nous_actor.runtime.exit import at_exit
from nous_actor.sessions.actor import HELD, Handler, SessionActor
from nous_actor.sessions.actor._calls import ANSWERS, REMOTE, TRAITS, call, handlers_with
from nous_actor.sessions.forwarding.auth import PROTOCOL, holder_side
from nous_actor.sessions.forwarding.links import (
    ASKED,
    FAILED,
    GOODBYE,
    HOST,
    NOT_HELD,
    OK,
    SEQ,
    FrameReader,
    LocalLink,
    Sender,
    arrived,
    call_id,
    portable,
)
from nous_actor.sessions.forwarding.route import LIFE, REGISTRY_CLOSED, Route
from nous_actor.sessions.future import ForwardedFuture, SessionFuture
from nous_actor.sessions.turns import DEFER
from nous_actor.sessions.turns._blocks import HeldFuture
from nous_actor.store import shared
from nous_actor.store.base import Store

__all__ = ["CALLS", "LOCAL", "Endpoint", "endpoint_for", "local_endpoint"]

logger = get_logger("nous_actor.sessions.forwarding")

CALLS: Final[dict[str, Handler]] = {
    **{h.__name__: h for h in handlers_with(REMOTE)},
    "h_compact": SessionActor.h_compact,
    "h_turn_gone": SessionActor.h_turn_gone,
    **LIFE,
}
"""The calls another process may send, by name: the session actor's handlers declared
`REMOTE`, a compaction (its summariser runs here), and the end of the turns a registry
that closed opened (`SocketLink.let_go_turns`)."""

_BY_SEQ: Final = frozenset({"h_append", "h_append_at", "h_append_many"})
"""The calls answered with the (first) seq of what they appended."""

ENDING: Final = "ending:"
"""The address a closing endpoint leaves on the claims it still holds: their holder is
letting them go (a caller waits for that, rather than take the claim's refusal as final,
as it does for a holder that never answers calls from other processes)."""

ANSWER_BOUND: Final = 3600.0
"""How long a forwarded call's answer is waited for here, at most (the caller's own bound
applies at the caller; this only keeps a lost answer from being kept for ever)."""

LIVE_REF_WAIT: Final = 5.0
"""How long a registry is asked, at most, for a session it restarted behind its route."""

Registry = Any  # a `Sessions` (its ``_routes``: its routes by session id)


WATCH_EVERY: Final = 60.0
"""Seconds between two looks of an endpoint at its socket file (`Endpoint._watch`)."""

_FOLDER: Final = "nous-actor-"
"""How the name of an endpoint's socket folder begins (then its process id and ``-``)."""

_swept = False


LOCAL: Final = "local:"
"""How the address of an endpoint without a socket begins: reachable from its own process
only (a store without a secret, or a socket that could not be made)."""

_PATH_MAX: Final = 107
"""Bytes a Unix-domain socket's path may have on Linux (``sun_path`` holds 108, its
last a NUL); fewer elsewhere (104 on macOS), which ``bind`` refuses as too long."""


def _roots() -> list[str]:
    """Where this process may make its socket folder, in order: the temp folder, then
    ``/tmp`` if that is another (a temp folder whose path is too long for a socket's, as
    a nested one can be)."""
    first = tempfile.gettempdir()
    return [first] if first == "/tmp" or not os.path.isdir("/tmp") else [first, "/tmp"]


def _listen() -> tuple[str, socket.socket, str]:
    """A socket listening in a new folder of this process's (mode 0700), in the first of
    `_roots` where one can be made: the folder, the socket, its path.

    Raises:
        OSError: no root would do (the last root's error).
    """
    failed: OSError = OSError("no folder to make the socket in")
    for root in _roots():
        folder = ""
        try:
            # mode 0700: this user's; named for this process, so that once it is gone
            # (SIGKILLed: no exit hook ran) a later process can tell and remove it
            folder = tempfile.mkdtemp(prefix=f"{_FOLDER}{os.getpid()}-", dir=root)
            path = os.path.join(folder, "calls")
            if len(os.fsencode(path)) > _PATH_MAX:
                raise OSError(f"the socket's path {path!r} is too long for a Unix socket")
            sock = _bound_at(path)
        except OSError as exc:
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
            failed = exc
            continue
        return folder, sock, path
    raise failed


def _bound_at(path: str) -> socket.socket:
    """A socket listening at ``path`` (mode 0600), which waits at most `WATCH_EVERY` for a
    caller (its endpoint looks at its file that often: `Endpoint._watch`).

    Raises:
        OSError: it could not be made.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(64)
        sock.settimeout(WATCH_EVERY)
    except BaseException:
        sock.close()
        raise
    return sock


def _our_folder(folder: str) -> None:
    """Make ``folder`` again (mode 0700) if it is gone; if it is there, check that it is
    still this user's alone.

    Raises:
        OSError: it could not be made, or it is not (a link, another user's, or open to
            others): the endpoint does not listen there.
    """
    try:
        os.mkdir(folder, 0o700)
        return
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{folder!r} is no longer a folder of this user's alone (mode 0700)")


def _sweep_once() -> None:
    """Remove the socket folders this user's dead processes left (once per process).

    A process that ends normally removes its own; one that is SIGKILLed cannot. A
    folder is removed only if it is this user's and no process has its id (a reused id
    keeps it: it goes once that process ends too)."""
    global _swept
    if _swept:
        return
    _swept = True
    for root in _roots():
        _sweep(root)


def _sweep(root: str) -> None:
    try:
        names = os.listdir(root)
    except OSError:
        return
    uid = os.getuid()
    for name in names:
        if not name.startswith(_FOLDER):
            continue
        pid_text, named, _ = name[len(_FOLDER) :].partition("-")
        if not (named and pid_text.isdigit()):
            continue
        path = os.path.join(root, name)
        try:
            if os.lstat(path).st_uid != uid:
                continue
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            logger.info("forwarding.folder_removed", path=path, reason="its process is gone")
        except OSError:
            continue  # not ours to look at, or a live process of another user


class Endpoint:
    """This process's door for one store object (see the module docs)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.registries: list[Registry] = []
        self._lock = threading.Lock()
        self._dir: str | None = None
        self._sock: socket.socket | None = None
        self._path = ""  # the socket's path (``_dir``'s ``calls``)
        self._file: tuple[int, int] | None = None  # the socket file's device and inode
        self._key: bytes | None = None
        self.closed = False
        self.born = forks.born()  # a forked child's copy is its parent's (`close`)
        self.served = 0  # calls taken from other processes (for tests and the benchmark)
        self._peers: set[_Peer] = set()  # the processes connected now
        key = shared.forwarding_key(store)
        self.address = f"{LOCAL}{uuid.uuid4().hex}"  # (this process's registries only)
        if key is not None:
            _sweep_once()
            try:
                self._dir, self._sock, path = _listen()
            except OSError as exc:
                # The sessions here still work; other processes cannot call them (an
                # open of one there is refused, as a holder of an older release's is).
                logger.warning(
                    "forwarding.unavailable",
                    reason=type(exc).__name__,
                    error=str(exc),
                    effect="other processes cannot call this process's sessions: an "
                    "open of one there raises ConflictError (or, with wait=, moves it)",
                    fix="set TMPDIR to a short folder this user can write",
                )
            else:
                self._key = key
                self._path = path
                self._file = _file_of(path)
                self.address = f"unix:{HOST}:{path}"
                _io_thread(self._accept, "nous-endpoint")
        _local[self.address] = self
        shared.advertise(store, self.address)

    # -- this process ----------------------------------------------------------------------------

    def dispatch(
        self, session_id: str, handler: Handler, args: tuple[Any, ...], fut: SessionFuture[Any]
    ) -> bool:
        """Hand a call to the registry here that holds ``session_id``; ``False`` if none
        does (nothing was done)."""
        route = self.route_here(session_id)
        if route is None:
            return False
        route.send(handler, args, fut)
        return True

    def route_here(self, session_id: str) -> Route | None:
        """The route of the registry here that holds ``session_id`` (``None``: none).

        A registry may have restarted the session behind its route's back (a crash),
        and routes nothing refers to are let go: then the running actor is asked of
        the registry, and its route (made again if need be) pointed at it first."""
        for registry in list(self.registries):
            route: Route | None = registry._routes.get(session_id)
            if route is not None and route.here():
                return route
            ref = registry._live_ref(session_id, LIVE_REF_WAIT)
            if ref is not None:
                try:
                    route = registry._route(session_id)
                except SessionStopped:  # the registry closed meanwhile
                    continue
                route.settle(ref)
                if route.here():
                    return route
        return None

    def link(self) -> LocalLink:
        """A link to this endpoint from this process."""
        return LocalLink(self.address, self.route_here, self.asked)

    def asked(self, session_id: str) -> None:
        """A process asked for ``session_id`` in the store: the hand-over of each registry
        here looks at the requests now (those that hold it offer it)."""
        for registry in list(self.registries):
            registry._handover.tell()

    def join(self, registry: Registry) -> None:
        with self._lock:
            self.registries.append(registry)

    def leave(self, registry: Registry) -> bool:
        """``registry`` closes; ``True`` if it was the last (the endpoint closed)."""
        with self._lock:
            if registry in self.registries:
                self.registries.remove(registry)
            if self.registries:
                return False
        self.close()
        return True

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if forks.forked_since(self.born):
            return  # a forked child's copy: the socket and its folder are the parent's
        _local.pop(self.address, None)
        _endpoints.pop(id(self.store), None)
        try:
            shared.advertise(self.store, ENDING)
        except Exception:  # the store closed first: its claims went with it
            pass
        with self._lock:  # (not while `_watch` swaps it)
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        # Each connected process hears which of its calls were taken here: those after
        # them were not (they go where the session is next), and the connection stays
        # for the answers of those taken, which come as the sessions here stop. (Without
        # it, a call in flight as this process exited was for its caller one whose
        # holder died before answering: `CallOutcomeUnknown`, though never taken.)
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            peer.goodbye()

    # -- other processes -------------------------------------------------------------------------

    def _accept(self) -> None:
        sock = self._sock
        look = time.monotonic() + WATCH_EVERY
        while sock is not None and not self.closed:
            try:
                client, _ = sock.accept()
            except TimeoutError:  # (`WATCH_EVERY` seconds without a caller)
                client = None
            except OSError:
                return  # closed
            if client is not None:
                client.settimeout(None)
                _io_thread(partial(self._serve, client), "nous-endpoint-peer")
            if time.monotonic() >= look:
                sock = self._watch(sock)
                look = time.monotonic() + WATCH_EVERY

    def _watch(self, sock: socket.socket) -> socket.socket | None:
        """(The accepting thread, every `WATCH_EVERY` seconds.) Keep the
        socket reachable: refresh its file's and its folder's times (a temp-folder
        cleaner removes what it finds old), and if the file is gone or is another (a
        cleaner removed it, or its folder), listen again at the same path, so the
        address the claims carry is this process's still. The socket to accept on next
        (``None``: the endpoint closed)."""
        folder, path = self._dir, self._path
        assert folder is not None
        if _file_of(path) == self._file:
            try:
                os.utime(path)
                os.utime(folder)
            except OSError:
                pass
            return sock
        if self.closed:
            return None
        try:
            _our_folder(folder)
            if os.path.lexists(path):
                os.unlink(path)  # (in a folder of this user's alone: not another's file)
            made = _bound_at(path)
        except OSError as exc:
            logger.warning(
                "forwarding.unavailable",
                reason=type(exc).__name__,
                error=str(exc),
                effect="its socket file was removed and could not be made again: other "
                "processes cannot call this process's sessions until it can",
                fix="keep temp-folder cleaners away from nous-actor-* folders",
            )
            return sock  # (looked at again at the next look)
        with self._lock:
            if self.closed or self._sock is not sock:
                made.close()
                shutil.rmtree(folder, ignore_errors=True)  # (made again after `close`)
                return None
            self._sock, self._file = made, _file_of(path)
        sock.close()
        return made

    def _serve(self, client: socket.socket) -> None:
        """One peer process: authenticate it, then take its calls in the order sent."""
        conn = Connection(client.detach())
        try:
            assert self._key is not None
            hello = pickle.loads(holder_side(conn, self._key))
        except Exception as exc:
            logger.warning("forwarding.peer_refused", reason=type(exc).__name__, error=str(exc))
            conn.close()
            return
        if not (type(hello) is tuple and len(hello) == 2 and hello[0] == PROTOCOL):
            protocol = hello[0] if type(hello) is tuple and hello else hello
            logger.warning("forwarding.peer_refused", reason="protocol", protocol=protocol)
            conn.close()
            return
        token = str(hello[1])
        sender = Sender(conn, "nous-endpoint-writer")
        peer = _Peer(sender)
        with self._lock:
            self._peers.add(peer)
        refused: dict[str, int] = {}  # the last epoch refused, per session
        # The turns the peer opened here, by id: its session's. When the peer goes, a
        # turn it still holds has no holder any more (its process died, or let go of
        # everything it held here): it ends at once, not when its lease runs out.
        turns = peer.turns
        try:
            # Until the peer goes: after this endpoint closed, its calls are answered
            # as not held (and those taken before are answered as they complete).
            frames = FrameReader(conn)
            while True:
                for frame in frames.frames():
                    for cid, blob in pickle.loads(frame):
                        with peer.lock:
                            if peer.closing:
                                continue  # after the goodbye: the peer sends it elsewhere
                            if cid >= 0:
                                peer.last = cid
                        self._take(sender, refused, turns, token, cid, blob)
        except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
            pass
        finally:
            with self._lock:
                self._peers.discard(peer)
            sender.close()
            conn.close()
            self._peer_gone(turns)

    def peer_turns(self, session_ids: Container[str]) -> list[str]:
        """The turns that the processes connected now opened here on ``session_ids``
        and did not end through their link (some may have ended otherwise: their lease
        ran out, another turn took over), by id."""
        with self._lock:
            peers = list(self._peers)
        return [
            turn_id
            for peer in peers
            for turn_id, session_id in peer.turns.copy().items()
            if session_id in session_ids
        ]

    def _peer_gone(self, turns: dict[str, str]) -> None:
        """End the turns a peer that is gone opened here and may still hold (one that
        ended already is passed over by its session)."""
        for turn_id, session_id in turns.items():
            fut: SessionFuture[Any] = SessionFuture(session_id, ANSWER_BOUND)
            self.dispatch(session_id, SessionActor.h_turn_gone, (turn_id,), fut)

    def _take(
        self,
        sender: Sender,
        refused: dict[str, int],
        turns: dict[str, str],
        token: str,
        cid: int,
        blob: bytes,
    ) -> None:
        try:
            # (A caller of protocol 5 sent no bound and no turn blocks: its calls wait
            # as long as their answer is kept here.)
            session_id, epoch, name, args, *more = pickle.loads(blob)
            bound, blocks = more if more else (ANSWER_BOUND, None)
            if name == ASKED:
                self.asked(session_id)
                return
            args = arrived(name, args)
            if name == "h_turn_open":
                turns[args[0].turn_id] = session_id
            elif name in ("h_turn_end", "h_turn_gone"):
                turns.pop(args[0], None)
        except (ImportError, AttributeError) as exc:  # (pickle's: a name not found here)
            sender.put((cid, FAILED, _dump(_not_importable(exc))))
            return
        except Exception as exc:
            sender.put((cid, FAILED, _dump(NousActorError(f"the call could not be read: {exc}"))))
            return
        if refused.get(session_id, -1) >= epoch:
            sender.put((cid, NOT_HELD, b""))
            return
        # The caller's bound, as its own future has it: a write held by an open turn waits
        # for it a little less than that, then fails with `TurnBusy` (not applied), as a
        # write made here does, rather than be applied after its caller gave up on it.
        wait = (
            float(bound)
            if type(bound) in (int, float) and 0 < bound < ANSWER_BOUND
            else ANSWER_BOUND
        )
        fut: SessionFuture[Any] = ForwardedFuture(session_id, wait, call_id(token, cid))
        handler = CALLS.get(name)
        route = None if handler is None else self.route_here(session_id)
        if handler is not None and route is None:
            refused[session_id] = epoch
            sender.put((cid, NOT_HELD, b""))
            return
        answer = partial(_answer, sender, cid, fut, refused, epoch, name in _BY_SEQ, route)
        fut.add_done_callback(answer)
        if handler is None or route is None:
            fut._fail(NousActorError(f"a session takes no call {name!r} from another process"))
            return
        if blocks is not None and name in HELD:
            # A plain write made from inside turn blocks of the caller's: it fails at once
            # if one of them is the session's open turn (`h_unless_own_turn`).
            turn_ids, from_task = blocks
            args = (frozenset(turn_ids), bool(from_task), name, args)
            handler = h_unless_own_turn
        route.send(handler, args, fut)
        self.served += 1


@call(ANSWERS)
def h_unless_own_turn(
    actor: SessionActor,
    fut: SessionFuture[Any],
    turn_ids: frozenset[str],
    from_task: bool,
    name: str,
    args: tuple[Any, ...],
) -> Any:
    """(Run by the session's actor.) The plain write ``name`` another process sent from
    inside the blocks of turns ``turn_ids`` (by an asyncio task if ``from_task``): if one
    of them is the session's open turn, it would wait for its own turn to end, so it
    fails at once with `TurnBusy` (nothing applied), as the same write made here does;
    else it runs (or waits for the open turn) as any plain write."""
    handler = CALLS[name]
    table = actor.turns
    if table is not None and table.open is not None:
        now = scheduling.monotonic()
        table = actor._turns_now(now)
        cur = None if table is None else table.open
        if table is not None and cur is not None and cur.req.turn_id in turn_ids:
            # The session's own refusal of it (its words), for this call's future.
            mine: HeldFuture[Any] = HeldFuture(actor.session_id, fut._timeout, turn_ids, from_task)
            table.hold(handler, args, mine, now)
            fut._fail(mine._value)
            return DEFER
    actor._run(handler, args, fut, TRAITS.get(handler, 0))
    return DEFER


CALLS[h_unless_own_turn.__name__] = h_unless_own_turn  # (it may go on to the next holder)


class _Peer:
    """A process connected to an endpoint: the writer of its answers, the number of the
    last call taken from it (until the goodbye: then none is taken), and the turns it
    opened here (`Endpoint.peer_turns`)."""

    __slots__ = ("closing", "last", "lock", "sender", "turns")

    def __init__(self, sender: Sender) -> None:
        self.sender = sender
        self.lock = threading.Lock()
        self.closing = False
        self.last = -1
        self.turns: dict[str, str] = {}  # the turns it opened here, by id: their session's

    def goodbye(self) -> None:
        """Take no call from it any more, and tell it so (`GOODBYE`)."""
        with self.lock:
            if self.closing:
                return
            self.closing = True
            last = self.last
        self.sender.put((GOODBYE, NOT_HELD, last))


def _peers_now() -> list[_Peer]:
    return [peer for endpoint in list(_local.values()) for peer in list(endpoint._peers)]


def _goodbyes_at_exit() -> None:
    """At exit, first: an endpoint left open takes no call any more, and tells each
    connected process which it took (the rest go where their sessions are next); those
    it took are committed by the exit's flush of the sessions, which comes after,
    except those that wait for a turn: they were not applied, and never will be here,
    so they are answered "not held" and follow their sessions too (`h_hand_back`).
    Its claims say `ENDING` meanwhile: a caller waits for them to go (this process to
    end), rather than call this one again."""
    endpoints = [endpoint for endpoint in list(_local.values()) if endpoint._peers]
    for endpoint in endpoints:
        if not forks.forked_since(endpoint.born):
            try:
                shared.advertise(endpoint.store, ENDING)
            except Exception:  # the store closed first: its claims went with it
                pass
    for peer in _peers_now():
        peer.goodbye()
    deadline = time.monotonic() + EXIT_FLUSH
    handing: list[SessionFuture[Any]] = []
    for endpoint in endpoints:
        for registry in list(endpoint.registries):
            for route in registry._routes.values():
                if route.here():
                    fut: SessionFuture[Any] = SessionFuture(route.session_id, EXIT_FLUSH)
                    route.send(h_hand_back, (), fut)
                    handing.append(fut)
    for fut in handing:
        try:
            fut.get(timeout=max(deadline - time.monotonic(), 0.0))
        except Exception:  # (stopped, or slow: its calls are answered as before)
            pass


@call(ANSWERS)
def h_hand_back(actor: SessionActor, fut: SessionFuture[Any]) -> int:
    """(Run by the session's actor, as its process ends without closing its registry.)
    The calls other processes sent that wait here for a turn (plain writes, turns that
    queued) are answered "not held" (not applied): they follow the session to its next
    holder, as after a registry's close. How many."""
    table = actor.turns
    if table is None:
        return 0
    return table.hand_back(_forwarded, SessionStopped(actor.session_id, REGISTRY_CLOSED))


def _forwarded(fut: SessionFuture[Any]) -> bool:
    return isinstance(fut, ForwardedFuture)


def _answers_sent_at_exit() -> None:
    """At exit, last: let every connected process's answers still queued go out (bounded
    by `EXIT_FLUSH`): a call taken and answered here is not left for its caller to take
    as one whose holder died before answering."""
    deadline = time.monotonic() + EXIT_FLUSH
    for peer in _peers_now():
        if not peer.sender.flushed(max(deadline - time.monotonic(), 0.0)):
            return


at_exit(_goodbyes_at_exit, first=True)
at_exit(_answers_sent_at_exit)


EXIT_FLUSH: Final = 1.0
"""Seconds a program that ends waits, at most, for its answers to other processes to go
out (written to their sockets, which hold them for the peer after this process ends)."""


def _not_importable(exc: BaseException) -> TypeError:
    """Why a call whose arguments name what this process cannot import was not taken."""
    return TypeError(
        "the call goes to the process that holds the session, which could not read it "
        f"({type(exc).__name__}: {exc}): what a call carries (a compactor's summariser, "
        "its estimate) travels pickled, by name; define it in a module both processes "
        "import, not in the script run as __main__ nor inside a function; nothing was "
        "applied"
    )


def _file_of(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at ``path`` (``None``: there is none)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _io_thread(fn: Callable[[], None], name: str) -> None:
    """A thread that waits on a socket: a plain daemon thread, never a simulation's task
    (a simulated run has no other process to talk to)."""
    threading.Thread(target=fn, name=name, daemon=True).start()


def _dump(value: Any) -> bytes:
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return pickle.dumps(portable(exc), pickle.HIGHEST_PROTOCOL)


def _answer(
    sender: Sender,
    cid: int,
    fut: SessionFuture[Any],
    refused: dict[str, int],
    epoch: int,
    by_seq: bool,
    route: Route | None,
) -> None:
    value = fut._value
    if fut.failed():
        if type(value) is SessionStopped and (
            value.message == REGISTRY_CLOSED
            or (route is not None and route.closed == REGISTRY_CLOSED)
        ):
            # Not applied: this registry closed before the call ran (a worker shutting
            # down), or as it waited (for an open turn: the session stopped under it).
            # The caller sends it, and every later call of this move (the closed
            # registry refuses them all), where the session is next.
            session_id = fut._session_id
            refused[session_id] = max(refused.get(session_id, -1), epoch)
            sender.put((cid, NOT_HELD, b""))
            return
        sender.put((cid, FAILED, _dump(portable(value))))
        return
    if by_seq:
        # An append is answered with its seq: the caller rebuilds the event from the
        # parts it sent (no event crosses back, nor is frozen again there).
        first = (value[0].seq if value else -1) if isinstance(value, list) else value.seq
        sender.put((cid, SEQ, first))
        return
    try:
        blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        sender.put((cid, FAILED, _dump(portable(exc))))
        return
    sender.put((cid, OK, blob))


_local: dict[str, Endpoint] = {}
"""This process's endpoints by address (a link to one of them stays in the process)."""

_endpoints: dict[int, Endpoint] = {}
_endpoints_lock = threading.Lock()


def local_endpoint(address: str) -> Endpoint | None:
    """This process's endpoint at ``address``, if it is one of ours."""
    return _local.get(address)


def let_go(store: Store) -> None:
    """After a closing registry let its claims go: the claims ``store`` takes from now on
    carry no address (not `ENDING`), unless an endpoint of it was made meanwhile."""
    with _endpoints_lock:
        found = _endpoints.get(id(store))
        if found is not None and found.store is store and not found.closed:
            return
        try:
            shared.advertise(store, None)
        except Exception:  # the store closed: nothing more is claimed through it
            pass


def _forget_endpoints() -> None:
    """(In a forked child.) The parent's endpoints answer in the parent: a registry the
    child makes gets an endpoint (and a socket) of its own."""
    global _endpoints_lock
    _endpoints_lock = threading.Lock()
    _local.clear()
    _endpoints.clear()


forks.after_fork(_forget_endpoints)


def endpoint_for(store: Store) -> Endpoint | None:
    """The endpoint of ``store`` in this process (made on first use); ``None`` when the
    store cannot carry holders' addresses."""
    if not shared.supports_forwarding(store):
        return None
    with _endpoints_lock:
        found = _endpoints.get(id(store))
        if found is not None and found.store is store and not found.closed:
            return found
        made = Endpoint(store)
        _endpoints[id(store)] = made
        return made
