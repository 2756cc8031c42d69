"""A program that ends without closing anything exits promptly, and loses nothing it was told.

Each case is a real Python process: it prints the time of its last line, then
ends (normally or by an uncaught exception) without closing a registry or
stopping a session. The test measures from that line to the process's exit and
then reads the store file in this process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nous_actor import SQLiteStore

EXIT_BOUND = 1.0
"""Seconds from a program's last line to its exit, with nothing in flight (DESIGN.md 4),
beyond what the interpreter itself takes to exit after the same imports (measured by a
control program in the same test, so that a loaded machine does not fail it)."""

FLUSH_BOUND = 2.0
"""Seconds the runtime may take at exit for commits in flight."""

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
