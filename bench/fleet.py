"""A web app with several worker processes on one store, and the clients that drive it.

Used by tests/test_processes.py (with workers SIGKILLed in the middle) and by
`bench.processes` (the requests per second). Each worker is a process running
``python -m bench.fleet worker STORE SOCKET WAIT [SERVER]``: a `nous_actor.Sessions`
on the store, serving requests on a Unix socket, one thread per connection, as a
threaded web server would (SERVER ``threads``, the default), or every connection
from one asyncio loop, as an ASGI server (``uvicorn --workers N``) would
(``asyncio``). A request names a session and a request id; the worker reads the
session without taking it, then opens it (``wait=``: asking the worker that holds
it for it) and writes one turn: a ``turn_start``, a user and an assistant message
and a ``turn_end``, through one ``append_many``. A request already in the history
(a client's retry after its worker died) is answered without writing it again; the
request's steps are written once (`_request`) and driven by either server.

STORE is ``sqlite:PATH`` or ``postgres:SCHEMA:DSN``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from nous_actor.core.event import Event

__all__ = ["Fleet", "Outcome", "check_histories", "open_store", "run_clients"]

ROOT: Final = Path(__file__).resolve().parent.parent
TRACE: Final = bool(os.environ.get("FLEET_TRACE"))
COLD: Final = 100
"""The answers counted as a cold start's in `Outcome.p99_warm`."""
REPLY_TIMEOUT: Final = 60.0
"""A client's bound on one reply (a live worker always answers well within it)."""

TURN: Final = 4
"""Events per request: turn_start, user_message, assistant_message, turn_end."""


def open_store(spec: str) -> Any:
    """The store ``spec`` names (``sqlite:PATH`` or ``postgres:SCHEMA:DSN``)."""
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        from nous_actor.store import SQLiteStore

        return SQLiteStore(rest)
    if kind == "postgres":
        from nous_actor.store.postgres import PostgresStore

        schema, _, dsn = rest.partition(":")
        return PostgresStore(dsn, schema=schema, lease=5.0)
    raise ValueError(f"unknown store spec {spec!r}: give sqlite:PATH or postgres:SCHEMA:DSN")


# -- the worker process ---------------------------------------------------------------------


SERVERS: Final = ("threads", "asyncio")
"""How a worker serves its connections: a thread per connection (a threaded web server's
way: every wait on a session blocks its thread), or one asyncio loop for all of them (an
ASGI server's way, as ``uvicorn --workers N`` runs: every wait is awaited)."""


@dataclass(frozen=True)
class _Open:
    """A request's step: open the session (``sessions.open``, or ``aopen`` in a loop)."""

    sid: str


def _request(req: dict[str, Any], sessions: Any) -> Generator[Any, Any, dict[str, Any]]:
    """One request's steps, written once for both servers: yields what it waits for (a
    session's future, or `_Open`), is sent its value (or thrown its error), and returns
    the reply."""
    from nous_actor.errors import CallOutcomeUnknown, SessionCrashed, SessionStopped

    sid, rid = req["sid"], req["rid"]
    seen = yield sessions.read(sid).count()  # read without taking the session
    counts = {"seen": seen, "refused": 0, "ambiguous": 0, "found": 0}
    # A request sent again (its first worker died before answering), or whose holder died
    # before answering: it may be stored already; look first.
    check = bool(req.get("retry"))
    for _attempt in range(20):
        chat = yield _Open(sid)
        try:
            events = (yield chat.events()) if check else []
            done = [e.seq for e in events if e.type == "turn_start" and e.data.get("rid") == rid]
            if done:
                return {"ok": True, "seq": done[0], "dup": True, **counts}
            turn = yield chat.append_many(
                [
                    ("turn_start", {"rid": rid}),
                    ("user_message", {"content": f"question {rid}", "rid": rid}),
                    ("assistant_message", {"content": f"answer {rid}", "rid": rid}),
                    ("turn_end", {"rid": rid}),
                ]
            )
        except CallOutcomeUnknown as exc:
            # The worker holding it died between taking the call and answering: its
            # record tells whether it was applied (asked of the session's next holder).
            counts["ambiguous"] += 1
            seqs = yield (yield _Open(sid)).applied(exc.call_id)
            if seqs is not None:
                counts["found"] += 1
                return {"ok": True, "seq": seqs[0], "dup": True, **counts}
            continue  # not applied: make it again
        except SessionCrashed:
            # The session crashed here before answering: maybe applied. The store is the
            # truth: look again (the loop's first read) before writing.
            counts["ambiguous"] += 1
            check = True
            continue
        except SessionStopped:  # handed over between two calls: not applied, again
            counts["refused"] += 1
            continue
        return {"ok": True, "seq": turn[0].seq, "dup": False, **counts}
    raise RuntimeError("the session kept moving away")


def _advance(
    steps: Generator[Any, Any, dict[str, Any]],
    value: Any = None,
    error: BaseException | None = None,
) -> tuple[bool, Any]:
    """Send ``value`` (or throw ``error``) into a request's steps: ``(True, reply)`` once it
    returned, else ``(False, what it waits for next)``."""
    try:
        return False, (steps.send(value) if error is None else steps.throw(error))
    except StopIteration as stop:
        return True, stop.value


def _reply_line(reply: dict[str, Any] | Exception) -> bytes:
    """The line that answers a request: its reply, or the error it raised."""
    if isinstance(reply, Exception):
        reply = {"ok": False, "error": f"{type(reply).__name__}: {reply}"}
    return json.dumps({**reply, "pid": os.getpid()}).encode() + b"\n"


def _serve(store_spec: str, path: str, wait: float, server: str = "threads") -> None:
    from nous_actor import Sessions

    # wait > 0: a session held by another worker is asked for (moved here, the hand-off);
    # wait == 0: the call goes to the worker that holds it (forwarding).
    sessions = Sessions(
        open_store(store_spec), handoff_wait=wait or None, timeout=max(wait, 10.0) + 30
    )
    if server == "asyncio":
        asyncio.run(_serve_loop(sessions, path, wait))
    else:
        _serve_threads(sessions, path, wait)
    sessions.close()


def _serve_threads(sessions: Any, path: str, wait: float) -> None:
    """Serve on a thread per connection until stdin closes."""

    def take(step: Any) -> Any:
        if not isinstance(step, _Open):
            return step.get()
        t0 = time.perf_counter()
        chat = sessions.open(step.sid, wait=wait or None)
        if TRACE:
            print(f"open {time.perf_counter() - t0:.4f}", file=sys.stderr, flush=True)
        return chat

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        steps = _request(req, sessions)
        done, step = _advance(steps)
        while not done:
            try:
                value = take(step)
            except Exception as exc:
                done, step = _advance(steps, error=exc)
            else:
                done, step = _advance(steps, value)
        return step  # type: ignore[no-any-return]

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            line = self.rfile.readline()
            if not line:
                return
            try:
                reply: dict[str, Any] | Exception = handle(json.loads(line))
            except Exception as exc:
                reply = exc
            self.wfile.write(_reply_line(reply))

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True
        request_queue_size = 128

    with Server(path, Handler) as server:
        print("ready", flush=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        sys.stdin.readline()  # the parent closes stdin (or kills us) to end the worker
        server.shutdown()


async def _serve_loop(sessions: Any, path: str, wait: float) -> None:
    """Serve every connection from one asyncio loop until stdin closes."""

    async def handle(req: dict[str, Any]) -> dict[str, Any]:
        steps = _request(req, sessions)
        done, step = _advance(steps)
        while not done:
            opening = isinstance(step, _Open)
            try:
                value = await (sessions.aopen(step.sid, wait=wait or None) if opening else step)
            except Exception as exc:
                done, step = _advance(steps, error=exc)
            else:
                done, step = _advance(steps, value)
        return step  # type: ignore[no-any-return]

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if line:
                try:
                    reply: dict[str, Any] | Exception = await handle(json.loads(line))
                except Exception as exc:
                    reply = exc
                writer.write(_reply_line(reply))
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_unix_server(connection, path, backlog=128)
    print("ready", flush=True)
    # The parent closes stdin (or kills us) to end the worker.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    server.close()
    await server.wait_closed()


# -- the parent's side ----------------------------------------------------------------------


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    socket: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Fleet:
    """Worker processes on one store: start, kill, replace, stop (every wait bounded)."""

    store_spec: str
    folder: Path
    wait: float = 10.0
    server: str = "threads"  # one of SERVERS
    workers: list[Worker] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: int = 0

    def start(self, n: int) -> None:
        procs = [self._spawn() for _ in range(n)]
        for w in procs:
            self._ready(w)
        with self.lock:
            self.workers.extend(procs)

    def _spawn(self) -> Worker:
        self.started += 1
        path = str(self.folder / f"w{self.started}.sock")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.fleet",
                "worker",
                self.store_spec,
                path,
                str(self.wait),
                self.server,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(ROOT),
        )
        return Worker(proc, path)

    @staticmethod
    def _ready(w: Worker) -> None:
        assert w.proc.stdout is not None
        ready: queue.Queue[str] = queue.Queue()
        t = threading.Thread(target=lambda: ready.put(w.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        try:
            line = ready.get(timeout=60)
        except queue.Empty:
            w.proc.kill()
            raise RuntimeError("a worker did not start within 60 s") from None
        if line.strip() != "ready":
            w.proc.kill()
            raise RuntimeError(f"a worker failed to start: {line!r}")

    def live(self) -> list[Worker]:
        with self.lock:
            return list(self.workers)

    def kill_one(self, rng: random.Random) -> int:
        """SIGKILL a random worker and start another in its place; the pid killed."""
        with self.lock:
            victim = rng.choice(self.workers)
            self.workers.remove(victim)
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(30)
        self._close_pipes(victim)
        fresh = self._spawn()
        self._ready(fresh)
        with self.lock:
            self.workers.append(fresh)
        return victim.pid

    def stop(self) -> None:
        with self.lock:
            workers, self.workers = self.workers, []
        for w in workers:
            with contextlib.suppress(OSError):
                assert w.proc.stdin is not None
                w.proc.stdin.close()
        for w in workers:
            try:
                w.proc.wait(30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(30)
            self._close_pipes(w)

    @staticmethod
    def _close_pipes(w: Worker) -> None:
        for pipe in (w.proc.stdin, w.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def ask(worker: Worker, sid: str, rid: str, retry: bool = False) -> dict[str, Any] | None:
    """One request (``retry``: sent before, to a worker that died before answering); its
    reply, or ``None`` if the worker died before answering."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(REPLY_TIMEOUT)
            s.connect(worker.socket)
            s.sendall(json.dumps({"sid": sid, "rid": rid, "retry": retry}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return None  # the worker died
                data += chunk
    except (ConnectionError, FileNotFoundError):
        return None
    except TimeoutError:
        if worker.proc.poll() is not None:
            return None
        raise
    reply: dict[str, Any] = json.loads(data)
    return reply


@dataclass
class Outcome:
    acked: dict[str, str] = field(default_factory=dict)  # rid -> sid
    retried: int = 0
    refused: list[str] = field(default_factory=list)  # replies refused, then sent again
    stopped: int = 0  # calls a live worker saw refused (SessionStopped), then made again
    ambiguous: int = 0  # calls whose holder died before answering (checked, then made)
    found: int = 0  # of those, the ones `applied(call_id)` found applied (not made again)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    replies: int = 0
    latencies: list[float] = field(default_factory=list)
    """Seconds of each answered request, from its first send to the reply that ended it
    (a resend to another worker after one died included)."""
    answered: list[float] = field(default_factory=list)
    """When each answer came (seconds since the clients started), in that order."""

    @property
    def per_s_warm(self) -> float:
        """Requests per second after the first `COLD` answers (a cold start's: each
        worker's first opens, claims, links and connections); over the whole run when
        it had no more answers than that."""
        if len(self.answered) <= COLD or self.seconds <= self.answered[COLD - 1]:
            return self.replies / self.seconds
        return (len(self.answered) - COLD) / (self.seconds - self.answered[COLD - 1])

    def percentile(self, q: float) -> float:
        """The ``q`` quantile (0..1, nearest rank) of :attr:`latencies`, in seconds."""
        if not self.latencies:
            raise ValueError("no request was answered")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    @property
    def p99_warm(self) -> float:
        """The p99 of the latencies after the first `COLD` answers (a cold start's: each
        worker's first opens, links and connections), in seconds."""
        warm = Outcome(latencies=self.latencies[COLD:])
        return warm.percentile(0.99) if warm.latencies else self.percentile(0.99)

    @property
    def p50(self) -> float:
        """The median latency of a request, in seconds."""
        return self.percentile(0.5)

    @property
    def p99(self) -> float:
        """The 99th percentile latency of a request, in seconds."""
        return self.percentile(0.99)


def run_clients(
    fleet: Fleet,
    requests: Sequence[tuple[str, str]],
    clients: int,
    *,
    seed: int = 0,
    on_progress: Callable[[int], None] | None = None,
    retry_refused: bool = False,
    sticky: bool = False,
) -> Outcome:
    """Send ``requests`` ((session id, request id) pairs) from ``clients`` threads, each to
    a random live worker (``sticky``: each conversation's to one worker, picked by its id,
    as a load balancer hashing on the conversation does); a request whose worker died is
    sent again to another, and with ``retry_refused`` one answered with a `ConflictError`
    too (noted in ``refused``). Each answered request's latency goes to ``latencies``
    (see `Outcome.p50`, ``p99``)."""
    out = Outcome()
    todo: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
    for r in requests:
        todo.put(r)
    lock = threading.Lock()

    def client(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        while True:
            try:
                sid, rid = todo.get_nowait()
            except queue.Empty:
                return
            first_sent = time.perf_counter()
            sent = False
            for _ in range(50):
                live = fleet.live()
                if not live:
                    continue
                pick = live[zlib.crc32(sid.encode()) % len(live)] if sticky else rng.choice(live)
                reply = ask(pick, sid, rid, retry=sent)
                sent = True
                if reply is not None and not (
                    retry_refused and str(reply.get("error", "")).startswith("ConflictError")
                ):
                    break
                with lock:
                    if reply is None:
                        out.retried += 1
                    else:
                        out.refused.append(f"{rid}: {reply.get('error')}")
            else:
                with lock:
                    out.errors.append(f"{rid}: no worker answered")
                continue
            took = time.perf_counter() - first_sent
            with lock:
                out.latencies.append(took)
                out.answered.append(time.perf_counter() - t0)
                out.replies += 1
                out.stopped += int(reply.get("refused", 0))
                out.ambiguous += int(reply.get("ambiguous", 0))
                out.found += int(reply.get("found", 0))
                if reply.get("ok"):
                    out.acked[rid] = sid
                else:
                    out.errors.append(f"{rid}: {reply.get('error')}")
                done = out.replies
            if on_progress is not None:
                on_progress(done)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(REPLY_TIMEOUT * 3)
    out.seconds = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        out.errors.append("a client thread hung")
    return out


def check_histories(
    histories: dict[str, list[Event]], acked: dict[str, str], sent: dict[str, str]
) -> list[str]:
    """What is wrong with the stored histories (``[]``: every session whole, in order,
    never interleaved; every acknowledged request there exactly once)."""
    problems: list[str] = []
    found: dict[str, str] = {}
    for sid, events in histories.items():
        seqs = [e.seq for e in events]
        if seqs != list(range(len(seqs))):
            problems.append(f"{sid}: seqs are not 0..{len(seqs) - 1}")
        if len(events) % TURN:
            problems.append(f"{sid}: {len(events)} events is not whole turns")
        for i in range(0, len(events) - TURN + 1, TURN):
            turn = events[i : i + TURN]
            types = [str(e.type) for e in turn]
            rids = {e.data.get("rid") for e in turn}
            if types != ["turn_start", "user_message", "assistant_message", "turn_end"]:
                problems.append(f"{sid}: turn at seq {i} is {types}")
            if len(rids) != 1:
                problems.append(f"{sid}: turn at seq {i} mixes requests {sorted(map(str, rids))}")
            rid = str(turn[0].data.get("rid"))
            if rid in found:
                problems.append(f"{sid}: request {rid} stored twice")
            if sent.get(rid) != sid:
                problems.append(f"{sid}: request {rid} was sent for {sent.get(rid)}")
            found[rid] = sid
    for rid, sid in acked.items():
        if found.get(rid) != sid:
            problems.append(f"acknowledged request {rid} of {sid} is not stored")
    return problems


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) in (4, 5) and args[0] == "worker" and set(args[4:]) <= set(SERVERS):
        _serve(args[1], args[2], float(args[3]), *args[4:])
    else:
        sys.exit(f"usage: python -m bench.fleet worker STORE SOCKET WAIT [{'|'.join(SERVERS)}]")
