"""A PostgreSQL server for the tests: fixtures that tests/conftest.py makes available.

Run as a program (``python tests/postgres_server.py '{"dsn": ..., "schema": ...}'``)
it is the other process of the multi-process tests: a `Worker` (see below).

The server is the one ``NOUS_ACTOR_TEST_PG_DSN`` names (``.ci/run`` starts one
and sets it, with ``NOUS_ACTOR_TEST_PG_DIR``, its folder), or else a throwaway
cluster these tests start themselves with ``.ci/postgres.sh`` when the server
binaries are installed. Without either the tests skip, saying why, except
under CI (``CI`` set), where a missing server fails them.

Each test isolates in a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "postgres.sh"
WORKER = Path(__file__).resolve()
DSN_ENV = "NOUS_ACTOR_TEST_PG_DSN"
DIR_ENV = "NOUS_ACTOR_TEST_PG_DIR"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _binaries() -> bool:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return bool(found) or any(
        (Path(d) / "initdb").is_file() for d in os.environ.get("PATH", "").split(os.pathsep) if d
    )


@dataclass
class Server:
    """A running server: its DSN, and its folder when these tests may restart it."""

    dsn: str
    folder: Path | None

    def connect(self) -> Any:
        """An autocommit connection as the DSN's role (the cluster's superuser here)."""
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh connection; its rows (``[]`` if it returns none)."""
        with self.connect() as conn:
            cur = conn.execute(query, params)
            return list(cur.fetchall()) if cur.description else []

    def restart(self) -> None:
        """Stop the server (fast: every session is cut) and start it again, waiting for it."""
        self._script("restart")

    def down(self) -> None:
        """Stop the server, keeping its data (an outage); `up` starts it again."""
        self._script("down")

    def up(self) -> None:
        self._script("up")

    def _script(self, command: str) -> None:
        if self.folder is None:
            pytest.skip(f"stopping the server needs one these tests started ({DIR_ENV} unset)")
        subprocess.run(
            [str(SCRIPT), command, str(self.folder)], check=True, timeout=90, capture_output=True
        )

    def drop_schema(self, schema: str) -> None:
        self.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    @staticmethod
    def fresh_schema() -> str:
        """A schema name no other test uses."""
        return f"test_{uuid.uuid4().hex[:12]}"

    def terminate(self, application_name: str | None = None, pid: int | None = None) -> int:
        """``pg_terminate_backend`` on the backends matching; how many were ended. Waits
        (at most 10 s each) until they are gone, so their locks are released on return."""
        rows = self.sql(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND (%s::int IS NULL OR pid = %s::int) "
            "AND (%s::text IS NULL OR application_name = %s::text)",
            (pid, pid, application_name, application_name),
        )
        return int(rows[0][0])


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The PostgreSQL server of this test run (see the module docs)."""
    try:
        import psycopg
    except ImportError:
        _unavailable("psycopg is not installed (pip install -e '.[test]')")
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        folder = os.environ.get(DIR_ENV)
        server = Server(dsn, Path(folder) if folder else None)
        try:
            server.sql("SELECT 1")
        except psycopg.Error as exc:
            pytest.fail(f"{DSN_ENV} names a server that does not answer: {exc}", pytrace=False)
        yield server
        return
    if not _binaries():
        _unavailable(
            f"no PostgreSQL server: set {DSN_ENV}, or install the server binaries "
            "(apt-get install -y postgresql) so that the tests start one"
        )
    try:
        dsn, folder = start_server()
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        _unavailable(f"could not start a PostgreSQL server: {exc} {detail}".strip())
    try:
        yield Server(dsn, folder)
    finally:
        stop_server(folder)


def start_server() -> tuple[str, Path]:
    """Start a PostgreSQL server of its own in a new folder: its DSN and the folder.

    Raises:
        subprocess.SubprocessError, OSError: the server did not start.
    """
    folder = Path(f"/tmp/nous-pg-{uuid.uuid4().hex[:8]}")  # a socket path must stay short
    out = subprocess.run(
        [str(SCRIPT), "start", str(folder)],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    ).stdout
    env = dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in out.splitlines()
        if line.startswith("export ")
    )
    return env[DSN_ENV], folder


def stop_server(folder: Path) -> None:
    """Stop the server `start_server` started in ``folder``."""
    subprocess.run([str(SCRIPT), "stop", str(folder)], timeout=90, check=False)


@dataclass
class Stores:
    """Makes `PostgresStore` objects in one test's schema and closes them all afterwards."""

    server: Server
    schema: str
    made: list[Any] = field(default_factory=list)

    @property
    def dsn(self) -> str:
        return self.server.dsn

    def __call__(self, **kwargs: Any) -> Any:
        from nous_actor.store.postgres import PostgresStore

        kwargs.setdefault("schema", self.schema)
        store = PostgresStore(self.dsn, **kwargs)
        self.made.append(store)
        return store

    def close(self) -> None:
        from nous_actor.errors import StoreError

        for store in self.made:
            with contextlib.suppress(StoreError):
                store.close()


@pytest.fixture
def schema(pg_server: Server) -> Iterator[str]:
    """A schema name of this test's own on the test server (dropped after the test)."""
    name = pg_server.fresh_schema()
    yield name
    pg_server.drop_schema(name)


@pytest.fixture
def pg_stores(pg_server: Server) -> Iterator[Stores]:
    """``pg_stores(**kwargs)`` -> a new `PostgresStore` in this test's own schema."""
    stores = Stores(pg_server, pg_server.fresh_schema())
    try:
        yield stores
    finally:
        stores.close()
        pg_server.drop_schema(stores.schema)


# -- another process, driven line by line ----------------------------------------------------


class Worker:
    """A child process running this module (see `_worker_main`): JSON commands in, JSON out.

    Every read has a deadline; a worker left running is killed at the end.
    """

    def __init__(self, dsn: str, schema: str, **options: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps({"dsn": dsn, "schema": schema, **options})],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.pid = self.proc.pid
        self._buffer = ""
        hello = self.read(timeout=60)
        assert hello.get("ready"), hello

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next line the worker writes, as a dict (fails after ``timeout`` seconds)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while "\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"worker {self.pid} said nothing within {timeout} s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536).decode()
                if not chunk:
                    err = self.proc.stderr.read() if self.proc.stderr else ""
                    raise AssertionError(f"worker {self.pid} exited: {err[-3000:]}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split("\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, timeout: float = 30.0, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return self.read(timeout)

    def read_until(
        self, done: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Lines until one satisfies ``done`` (included), within ``timeout`` seconds overall."""
        deadline = time.monotonic() + timeout
        lines = []
        while True:
            line = self.read(max(0.0, deadline - time.monotonic()))
            lines.append(line)
            if done(line):
                return lines

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


@pytest.fixture
def pg_workers(pg_stores: Stores) -> Iterator[Callable[..., Worker]]:
    """``pg_workers(**options)`` -> a `Worker` process on this test's schema."""
    workers: list[Worker] = []

    def make(**options: Any) -> Worker:
        w = Worker(pg_stores.dsn, pg_stores.schema, **options)
        workers.append(w)
        return w

    try:
        yield make
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.pid, 18)  # SIGCONT, should a test have stopped it
            w.kill()


# -- the worker's side ------------------------------------------------------------------------


def _worker_main(config: dict[str, Any]) -> None:  # pragma: no cover - runs in the child
    """Open a store, then run one command per line of stdin, answering in JSON lines.

    Commands: ``claim`` (``sid``), ``release`` (``sid``), ``write`` (``sid``, ``seqs``,
    ``tag``), ``load`` (``sid``), ``pipeline`` (``sessions``, ``n``, ``tag``: sessions
    on the store, appends pipelined, one ``{"ack": [sid, seq]}`` line per acknowledged
    append), ``watch`` (``sid``, ``from``: one ``{"event": [seq, content]}`` line per
    event), ``exit``.
    """
    import threading
    from datetime import UTC, datetime

    from nous_actor.core.event import Event
    from nous_actor.errors import ConflictError, StoreError
    from nous_actor.sessions.handle import Session
    from nous_actor.store.postgres import PostgresStore

    out_lock = threading.Lock()

    def say(**reply: Any) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()

    def error(exc: BaseException) -> dict[str, Any]:
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "holder": getattr(exc, "holder", None),
        }

    dsn, schema = config.pop("dsn"), config.pop("schema")
    store = PostgresStore(dsn, schema=schema, **config)
    tokens: dict[str, str] = {}
    say(ready=True, pid=os.getpid())

    def pipeline(sid: str, n: int, tag: str) -> None:
        try:
            deadline = time.monotonic() + 10
            while True:  # a dead writer's claim goes once the server has seen it die
                try:
                    session = Session.start(sid, store=store, timeout=60)
                    break
                except ConflictError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            start = session.count().get()
            futures = [
                session.append("user_message", {"content": f"{tag}-{start + i}"}) for i in range(n)
            ]
            for fut in futures:
                ev = fut.get()
                say(ack=[sid, ev.seq, ev.data["content"]])
            say(finished=sid)
        except BaseException as exc:
            say(failed=sid, **error(exc))

    def watch(sid: str, start: int) -> None:
        w = store.watch(sid, from_seq=start)
        for ev in w:
            say(event=[ev.seq, ev.data.get("content")])

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "claim":
                tokens[cmd["sid"]] = store.claim(cmd["sid"])
                say(ok=True)
            elif op == "release":
                store.release(cmd["sid"], tokens.pop(cmd["sid"]))
                say(ok=True)
            elif op == "write":
                now = datetime.now(UTC)
                events = [
                    Event(s, "user_message", now, {"content": f"{cmd['tag']}-{s}"})
                    for s in cmd["seqs"]
                ]
                refused = store.write({cmd["sid"]: events})
                say(refused={k: type(v).__name__ for k, v in refused.items()})
            elif op == "load":
                say(seqs=[ev.seq for ev in store.load(cmd["sid"])])
            elif op == "pipeline":
                for sid in cmd["sessions"]:
                    threading.Thread(
                        target=pipeline, args=(sid, cmd["n"], cmd["tag"]), daemon=True
                    ).start()
                say(started=True)
            elif op == "watch":
                threading.Thread(target=watch, args=(cmd["sid"], cmd["from"]), daemon=True).start()
                say(watching=True)
            elif op == "exit":
                store.close()
                say(bye=True)
                return
        except (ConflictError, StoreError) as exc:
            say(**error(exc))


if __name__ == "__main__":
    _worker_main(json.loads(sys.argv[1]))
