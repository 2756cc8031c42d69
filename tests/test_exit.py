"""A program that ends without closing anything exits promptly, and loses nothing it was told.

Each case is a real Python process: it prints the time of its last line, then
ends (normally or by an uncaught exception) without closing a registry or
stopping a session. The test measures from that line to the process's exit and
then reads the store file in this process.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from postgres_server import Server, _binaries, _unavailable, start_server, stop_server

from nous_actor import SQLiteStore
from nous_actor.errors import StoreError
from nous_actor.sessions.actor._ledger import CommitLedger
from nous_actor.store.committer import Committer

EXIT_BOUND = 1.0
"""Seconds from a program's last line to its exit, with nothing in flight (DESIGN.md 4),
beyond what the interpreter itself takes to exit after the same imports (measured by a
control program in the same test, so that a loaded machine does not fail it)."""

FLUSH_BOUND = 2.0
"""Seconds within which the commits in flight at exit land in the tests below that time
the exit (a few hundred small appends on a local file)."""

SLOW_EXIT = 2.0
"""Seconds after which a program still waiting at exit for its commits says so."""

STALL = 30.0
"""Seconds without an answer from its stores after which a program gives up at exit."""

WAIT = 60.0
"""How long the test waits for the child at all (a hang fails, never blocks the suite)."""


def _run(code: str, *, expect_rc: int = 0) -> tuple[float, str]:
    """Run ``code``; returns (seconds from its ``LAST <t>`` line to its exit, stderr)."""
    prog = textwrap.dedent(code)
    proc = subprocess.Popen(
        [sys.executable, "-c", prog],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the program did not exit within {WAIT:g} s; stderr:\n{err[-3000:]}")
    ended = time.time()
    assert proc.returncode == expect_rc, err[-3000:]
    last = [line for line in out.splitlines() if line.startswith("LAST ")]
    assert last, f"no LAST line; stdout: {out!r}"
    return ended - float(last[-1].split()[1]), err


def _interpreter_exit(imports: str) -> float:
    """Seconds a program that only imports ``imports`` takes from its last line to exit."""
    took, _ = _run(f"import time\n{imports}\nprint('LAST', time.time(), flush=True)\n")
    return took


def test_an_uncaught_exception_with_an_open_registry_exits() -> None:
    """A registry never closed, then an uncaught exception: the traceback, then exit."""
    took, err = _run(
        """
        import time
        from nous_actor import Sessions
        s = Sessions()
        s.open("chat").append("user_message", {"content": "hi"}).get(timeout=10)
        print("LAST", time.time(), flush=True)
        raise RuntimeError("bug")
        """,
        expect_rc=1,
    )
    assert "RuntimeError: bug" in err
    assert took < EXIT_BOUND + _interpreter_exit("import nous_actor")


def test_a_standalone_session_never_stopped_exits(tmp_path: Path) -> None:
    """``Session.start`` on a store and no ``stop()``: the program ends at its last line."""
    db = tmp_path / "s.db"
    took, _ = _run(
        f"""
        import time
        from nous_actor import Session, SQLiteStore
        chat = Session.start("x", store=SQLiteStore({str(db)!r}))
        chat.append("user_message", {{"content": "hi"}}).get(timeout=10)
        pinned = Session.start("y", pinned=True)
        pinned.append("user_message", {{"content": "hi"}}).get(timeout=10)
        print("LAST", time.time(), flush=True)
        """
    )
    assert took < EXIT_BOUND + _interpreter_exit("import nous_actor")


def test_a_program_on_postgres_with_nothing_in_flight_exits_promptly(
    request: pytest.FixtureRequest,
) -> None:
    """A `PostgresStore` never closed, its appends all acknowledged: the program ends at its
    last line (nothing of the store runs at exit: its connections end with the process)."""
    pg = request.getfixturevalue("pg_stores")
    took, err = _run(
        f"""
        import time
        from nous_actor import Sessions
        from nous_actor.store.postgres import PostgresStore
        s = Sessions(PostgresStore({pg.dsn!r}, schema={pg.schema!r}))
        chat = s.open("chat")
        chat.append("user_message", {{"content": "hi"}}).get(timeout=30)
        print("LAST", time.time(), flush=True)
        """
    )
    assert "session.exit" not in err
    assert took < EXIT_BOUND + _interpreter_exit(
        "from nous_actor import Sessions\nfrom nous_actor.store.postgres import PostgresStore"
    )


def test_appends_not_awaited_are_committed_before_the_process_goes(tmp_path: Path) -> None:
    """Appends whose calls returned, never waited for, are all in the file after exit."""
    db = tmp_path / "s.db"
    took, _ = _run(
        f"""
        import time
        from nous_actor import Sessions, SQLiteStore
        s = Sessions(SQLiteStore({str(db)!r}))
        chats = [s.open(f"c{{i}}") for i in range(5)]
        for k in range(200):
            for chat in chats:
                chat.append("user_message", {{"content": str(k)}})
        print("LAST", time.time(), flush=True)
        """
    )
    assert took < EXIT_BOUND + FLUSH_BOUND + _interpreter_exit("import nous_actor")
    with SQLiteStore(db) as store:
        for i in range(5):
            events = store.load(f"c{i}")
            assert [e.data["content"] for e in events] == [str(k) for k in range(200)]


def test_asyncio_appends_not_awaited_are_committed(tmp_path: Path) -> None:
    """A coroutine that appends without awaiting and returns: everything it sent is stored."""
    db = tmp_path / "a.db"
    took, _ = _run(
        f"""
        import asyncio, time
        from nous_actor import Sessions, SQLiteStore

        async def main():
            s = Sessions(SQLiteStore({str(db)!r}))
            chat = await s.aopen("a")
            for k in range(300):
                chat.append("user_message", {{"content": str(k)}})

        asyncio.run(main())
        print("LAST", time.time(), flush=True)
        """
    )
    assert took < EXIT_BOUND + FLUSH_BOUND + _interpreter_exit("import asyncio, nous_actor")
    with SQLiteStore(db) as store:
        assert [e.data["content"] for e in store.load("a")] == [str(k) for k in range(300)]


def test_an_agents_sdk_session_never_closed_exits(tmp_path: Path) -> None:
    """``NousSession.sqlite`` used like the SDK's ``SQLiteSession`` (no close) exits."""
    pytest.importorskip("agents")
    db = tmp_path / "sdk.db"
    took, _ = _run(
        f"""
        import asyncio, time
        from nous_actor.integrations.openai_agents import NousSession

        async def main():
            session = NousSession.sqlite("conv", {str(db)!r})
            await session.add_items([{{"role": "user", "content": "hi"}}])
            assert len(await session.get_items()) == 1

        asyncio.run(main())
        print("LAST", time.time(), flush=True)
        """
    )
    assert took < EXIT_BOUND + _interpreter_exit(
        "import asyncio\nfrom nous_actor.integrations.openai_agents import NousSession"
    )


# -- nothing whose call returned is lost, however long the store takes ----------------------

SESSIONS, APPENDS = 10, 200
"""The program below makes ``SESSIONS x APPENDS`` appends without waiting (enough that
many are still in flight at its last line, small enough for a test)."""

APPENDING = """
import sys, time
{imports}
store = {store}
s = Sessions(store)
chats = [s.open(f"c{{i}}") for i in range({sessions})]
for chat in chats:
    chat.append("user_message", {{"content": "ready"}}).get(timeout=30)
print("READY", flush=True)
sys.stdin.readline()
for k in range({appends}):
    for chat in chats:
        chat.append("user_message", {{"content": str(k)}})
print("LAST", time.time(), flush=True)
{ending}
"""

ENDINGS = {
    "normally": ("", 0),
    "uncaught": ("raise RuntimeError('bug')", 1),
    "exit": ("sys.exit(3)", 3),
}


class _Child:
    """A program run with its stdin, stdout and stderr piped; its lines read as they come."""

    def __init__(self, code: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        self.err_lines: queue.Queue[str | None] = queue.Queue()
        self.pumps = [
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err_lines))
        ]
        for pump in self.pumps:
            pump.start()

    def __enter__(self) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        for pump in self.pumps:
            pump.join(WAIT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _pump(self, stream: Any, sink: queue.Queue[str | None]) -> None:
        for line in stream:
            if sink is self.err_lines:
                self.err.append(line)
            sink.put(line)
        sink.put(None)

    def expect(self, prefix: str, timeout: float = WAIT) -> str:
        """The next stdout line, which must start with ``prefix``."""
        try:
            line = self.out.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no {prefix!r} line within {timeout:g} s; stderr:\n{self.stderr()}")
        assert line is not None, f"no {prefix!r} line; stderr:\n{self.stderr()}"
        assert line.startswith(prefix), (line, self.stderr())
        return line

    def stderr_until(self, needle: str, timeout: float) -> bool:
        """Wait until a stderr line holds ``needle`` (``False``: the program ended first,
        or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.err_lines.get(timeout=left)
            except queue.Empty:
                return False
            if line is None:
                return False
            if needle in line:
                return True
        return False

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.close()

    def wait(self, rc: int, timeout: float = WAIT) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the program did not exit within {timeout:g} s:\n{self.stderr()}")
        for pump in self.pumps:
            pump.join(WAIT)
        assert self.proc.returncode == rc, self.stderr()

    def stderr(self) -> str:
        return "".join(self.err)[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=WAIT)


def _appending(store: str, ending: str, imports: str = "", **options: Any) -> str:
    return APPENDING.format(
        imports="from nous_actor import MemoryStore, Sessions, SQLiteStore\n" + imports,
        store=store,
        ending=ending,
        sessions=options.get("sessions", SESSIONS),
        appends=options.get("appends", APPENDS),
    )


def _stored(load: Callable[[str], list[Any]], sessions: int = SESSIONS) -> list[list[str]]:
    return [[e.data["content"] for e in load(f"c{i}")] for i in range(sessions)]


EVERY = [["ready"] + [str(k) for k in range(APPENDS)]] * SESSIONS


class _Store:
    """One store kind for the child: how it makes the store, how the test reads it back,
    and how the test holds the store's write lock (a real slow commit)."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        if kind == "postgres":
            self.pg = request.getfixturevalue("pg_stores")
            self.imports = "from nous_actor.store.postgres import PostgresStore"
            self.expr = f"PostgresStore({self.pg.dsn!r}, schema={self.pg.schema!r}, timeout=60)"
        elif kind == "sqlite":
            self.path = tmp_path / "s.db"
            self.imports = ""
            self.expr = f"SQLiteStore({str(self.path)!r}, timeout=60)"
        else:
            self.imports = ""
            self.expr = "MemoryStore()"

    def stored(self) -> list[list[str]] | None:
        if self.kind == "postgres":
            return _stored(self.pg().load)
        if self.kind == "sqlite":
            with SQLiteStore(self.path) as store:
                return _stored(store.load)
        return None  # nothing outlives the process

    @contextlib.contextmanager
    def write_locked(self) -> Iterator[None]:
        """Hold the store's write lock from this process until the block ends."""
        if self.kind == "postgres":
            with self.pg.server.connect() as conn, conn.transaction():
                conn.execute(f'LOCK TABLE "{self.pg.schema}".events IN EXCLUSIVE MODE')
                yield
        else:
            conn = sqlite3.connect(self.path, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield
                conn.execute("COMMIT")
            finally:
                conn.close()


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_every_append_whose_call_returned_is_stored_however_the_program_ends(
    kind: str, ending: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Appends never waited for, then the program ends (normally, by an uncaught exception,
    by ``sys.exit``): every one is in the store, and no session crashed on the way out
    (a store closed at exit before the appends in flight were committed lost most of them)."""
    store = _Store(kind, tmp_path, request)
    code, rc = ENDINGS[ending]
    with _Child(_appending(store.expr, code, store.imports)) as child:
        child.expect("READY")
        child.go()
        child.expect("LAST")
        child.wait(rc)
    assert "session.crashed" not in child.stderr()
    assert "session.exit_lost" not in child.stderr()
    stored = store.stored()
    if stored is not None:
        assert stored == EVERY


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_commits_slower_than_the_warning_are_waited_for_and_the_wait_is_logged(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Another connection holds the store's write lock while the program ends: the exit
    waits past `SLOW_EXIT`, says so (a warning), and once the lock goes every append
    whose call had returned is stored."""
    store = _Store(kind, tmp_path, request)
    with _Child(_appending(store.expr, "", store.imports)) as child:
        child.expect("READY")
        with store.write_locked():
            child.go()
            child.expect("LAST")
            waited = child.stderr_until("session.exit_waiting", timeout=SLOW_EXIT + WAIT / 2)
        child.wait(0)
    assert waited, child.stderr()
    assert "session.crashed" not in child.stderr()
    assert store.stored() == EVERY


def test_an_unreachable_store_at_exit_is_given_up_and_the_loss_is_counted(
    tmp_path: Path,
) -> None:
    """The PostgreSQL server is down when the program ends: the exit ends once the store
    has failed the appends (its own ``timeout``), and says at error level how many were
    lost, never hanging."""
    server = _throwaway_server()
    try:
        dsn = server.dsn
        code = _appending(
            f"PostgresStore({dsn!r}, timeout=2)",
            "",
            "from nous_actor.store.postgres import PostgresStore",
        )
        with _Child(code) as child:
            child.expect("READY")
            server.down()
            child.go()
            last = float(child.expect("LAST").split()[1])
            child.wait(0)
            took = time.time() - last
            err = child.stderr()
        lost = [line for line in err.splitlines() if "session.exit_lost" in line]
        assert lost, err
        assert f"lost={SESSIONS * APPENDS}" in lost[0], lost[0]
        assert "reason='store error'" in lost[0], lost[0]
        assert took < STALL, f"gave up after {took:.1f} s, not when the store failed"
    finally:
        server.stop()


class _OwnServer(Server):
    """A throwaway PostgreSQL server of this test's own, which it may stop (never the
    shared one: other tests use it)."""

    def stop(self) -> None:
        assert self.folder is not None
        stop_server(self.folder)


def _throwaway_server() -> _OwnServer:
    if not _binaries():
        _unavailable("no PostgreSQL server binaries (apt-get install -y postgresql)")
    return _OwnServer(*start_server())


# -- the questions the exit hook asks (public answers of the committer and the ledger) ------


class _RefusingStore:
    """A store whose every write fails."""

    def write(self, writes: dict[str, list[Any]]) -> dict[str, Any]:
        raise StoreError("the disk is full")


def test_the_committer_says_which_session_it_fails_until_that_session_is_reset() -> None:
    """After a failed write the committer names the session's error (every later item of
    it fails unwritten) and no other session's, until the session is reset."""
    store = _RefusingStore()
    committer = Committer(store)  # type: ignore[arg-type]
    answered: queue.SimpleQueue[StoreError | None] = queue.SimpleQueue()
    try:
        assert committer.failed("s") is None
        committer.submit("s", ["e"], answered.put)  # type: ignore[list-item]
        err = answered.get(timeout=FLUSH_BOUND * 5)
        assert isinstance(err, StoreError)
        kept = committer.failed("s")
        # The session's error as it was answered, without the frames that would keep
        # the store alive.
        assert type(kept) is type(err)
        assert str(kept) == str(err)
        assert kept.__traceback__ is None
        assert committer.failed("t") is None
        assert committer.commits == 1
        committer.reset("s")
        assert committer.failed("s") is None
    finally:
        committer.close(FLUSH_BOUND * 5)


def test_the_ledger_counts_the_events_stored_also_once_the_session_stopped() -> None:
    """`CommitLedger.stored` counts every event recorded as committed (never a failed
    one), taken or not, and also those committed after the session stopped (which no
    actor applies), and `in_flight` the operations not yet ended."""
    ledger = CommitLedger()
    assert (ledger.stored(), ledger.in_flight()) == (0, 0)
    for _ in range(4):
        ledger.begin()
    ledger.committed(("a", "b"), None)  # type: ignore[arg-type]
    ledger.committed(("c",), StoreError("refused"))  # type: ignore[arg-type]
    assert (ledger.stored(), ledger.in_flight()) == (2, 2)
    assert ledger.stored_untaken() == (2, 2)
    ledger.take()
    assert ledger.stored_untaken() == (2, 0)
    ledger._shut([], None)
    ledger.committed(("d",), None)  # type: ignore[arg-type]
    assert (ledger.stored(), ledger.in_flight()) == (3, 1)
    ledger.finished()
    assert ledger.in_flight() == 0
