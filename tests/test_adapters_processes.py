"""Both adapters from two worker processes on one store: a child process holds sessions
through the adapter, this process uses the same sessions through the adapter too, with no
extra argument (each call goes to the process that holds the session); writes of both
interleave, reads in either process see both, and when the child is SIGKILLed this
process goes on with every acknowledged write.

The child (`_CHILD`) is a real process on the same SQLite file or PostgreSQL schema; it
reads one JSON command a line on its standard input and answers one JSON line. Every
wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import end_child
from google.adk.events import Event as AdkEvent
from google.adk.events import EventActions
from google.genai import types

from nous_actor import Sessions
from nous_actor.errors import SessionCrashed
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.openai_agents import NousSession
from nous_actor.store import shared

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60.0
"""Seconds any answer of the child may take."""

PG_LEASE = 3.0
"""The PostgreSQL claims' lease in both processes: how long a SIGKILLed holder keeps its
sessions before another process takes them over."""

_CHILD = r"""
import asyncio, json, sys, time

from google.adk.events import Event as AdkEvent
from google.adk.events import EventActions
from google.genai import types

from nous_actor import Sessions
from nous_actor.integrations.adk import NousSessionService
from nous_actor.integrations.openai_agents import NousSession

spec = sys.argv[1]
kind, _, rest = spec.partition(":")
if kind == "sqlite":
    service = NousSessionService.sqlite(rest)
    def nous(sid):
        return NousSession.sqlite(sid, rest)
else:
    from nous_actor.store.postgres import PostgresStore
    schema, _, dsn = rest.partition(":")
    sessions = Sessions(PostgresStore(dsn, schema=schema, lease=float(sys.argv[2])))
    service = NousSessionService(sessions)
    def nous(sid):
        return NousSession(sid, sessions)

def user(text):
    return {"role": "user", "content": text}

def adk_event(text, delta=None):
    return AdkEvent(
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=delta or {}),
    )

async def run(cmd):
    op = cmd["op"]
    if op == "add":
        s = nous(cmd["sid"])
        for i in range(cmd["n"]):
            await s.add_items([user(f"{cmd['tag']}-{i}-{j}") for j in range(cmd["per"])])
        return None
    if op == "items":
        return [it["content"] for it in await nous(cmd["sid"]).get_items()]
    if op == "pops":
        s = nous(cmd["sid"])
        return [(await s.pop_item())["content"] for _ in range(cmd["n"])]
    if op == "creates":
        for sid in cmd["sids"]:
            await service.create_session(app_name="app", user_id=cmd["user"], session_id=sid)
        return None
    if op == "create":
        s = await service.create_session(
            app_name="app", user_id=cmd["user"], session_id=cmd["sid"], state=cmd["state"]
        )
        return s.id
    if op == "append":
        s = await service.get_session(app_name="app", user_id=cmd["user"], session_id=cmd["sid"])
        for i in range(cmd["n"]):
            await service.append_event(s, adk_event(f"{cmd['tag']}-{i}", cmd.get("delta")))
        return None
    if op == "get":
        s = await service.get_session(app_name="app", user_id=cmd["user"], session_id=cmd["sid"])
        if s is None:
            return None
        return {"texts": [e.content.parts[0].text for e in s.events], "state": s.state}
    if op == "list":
        got = await service.list_sessions(app_name="app", user_id=cmd.get("user"))
        return sorted([s.user_id, s.id] for s in got.sessions)
    if op == "user_state":
        return await service.get_user_state(app_name="app", user_id=cmd["user"])
    raise ValueError(op)

async def main():
    print(json.dumps({"ready": True}), flush=True)
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            return
        cmd = json.loads(line)
        try:
            out = {"ok": True, "value": await run(cmd)}
        except Exception as exc:
            out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(out), flush=True)

asyncio.run(main())
"""


class Child:
    """The child process: `ask` sends one command and waits (bounded) for its answer;
    `send` and `answer` split the two, so that this process works meanwhile."""

    def __init__(self, spec: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, spec, str(PG_LEASE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.pid = self.proc.pid
        assert self._line() == {"ready": True}

    def _line(self) -> Any:
        assert self.proc.stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(BOUND)
        assert got, f"the child did not answer within {BOUND:g} s"
        assert got[0], "the child ended"
        return json.loads(got[0])

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> Any:
        reply = self._line()
        assert reply["ok"], reply["error"]
        return reply["value"]

    def ask(self, **cmd: Any) -> Any:
        self.send(**cmd)
        return self.answer()

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        assert self.proc.wait(BOUND) == -signal.SIGKILL

    def close(self) -> None:
        end_child(self.proc, BOUND)


# -- the two stores ------------------------------------------------------------------------


class Here:
    """This process's side on one store: its adapters (as an application would make
    them, no extra argument), and a child process on the same store."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        kind, _, rest = spec.partition(":")
        self.path: str | None = rest if kind == "sqlite" else None
        self.sessions: Sessions | None = None
        if self.path is None:
            from nous_actor.store.postgres import PostgresStore

            schema, _, dsn = rest.partition(":")
            self.sessions = Sessions(PostgresStore(dsn, schema=schema, lease=PG_LEASE))
        self.nouses: list[NousSession] = []
        self.services: list[NousSessionService] = []
        self.children: list[Child] = []

    def child(self) -> Child:
        child = Child(self.spec)
        self.children.append(child)
        return child

    def nous(self, sid: str) -> NousSession:
        made = (
            NousSession.sqlite(sid, self.path)
            if self.path is not None
            else NousSession(sid, self.sessions)  # type: ignore[arg-type]
        )
        self.nouses.append(made)
        return made

    def service(self) -> NousSessionService:
        made = (
            NousSessionService.sqlite(self.path)
            if self.path is not None
            else NousSessionService(self.sessions)  # type: ignore[arg-type]
        )
        self.services.append(made)
        return made

    @property
    def store(self) -> Any:
        if self.sessions is not None:
            return self.sessions.store
        return (self.nouses[0].sessions if self.nouses else self.services[0].sessions).store

    def close(self) -> None:
        for child in self.children:
            child.close()
        for nous in self.nouses:
            nous.close()
        for service in self.services:
            asyncio.run(service.close())
        if self.sessions is not None:
            self.sessions.close()
            self.sessions.store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def here(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Here]:
    if request.param == "sqlite":
        spec = f"sqlite:{tmp_path / 'app.db'}"
        made = Here(spec)
        yield made
        made.close()
        return
    server = request.getfixturevalue("pg_server")
    schema = server.fresh_schema()
    made = Here(f"postgres:{schema}:{server.dsn}")
    try:
        yield made
    finally:
        made.close()
        server.drop_schema(schema)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def adk_event(text: str, delta: dict[str, Any] | None = None) -> AdkEvent:
    return AdkEvent(
        author="user",
        content=types.Content(role="user", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=delta or {}),
    )


def held_by(here: Here, sid: str) -> int | None:
    """The pid of the process that holds ``sid`` (as the store names it), or ``None``."""
    text = shared.held_by(here.store, sid)
    if text is None:
        return None
    if text == "this process":
        return os.getpid()
    found = re.search(r"(\d+)$", text)
    assert found is not None, text
    return int(found.group(1))


def batches_whole_and_in_order(contents: list[str], tag: str, n: int, per: int) -> None:
    """The ``n`` batches of ``per`` items tagged ``tag`` are each contiguous, in order."""
    mine = [c for c in contents if c.startswith(f"{tag}-")]
    assert mine == [f"{tag}-{i}-{j}" for i in range(n) for j in range(per)]
    for i in range(n):
        at = contents.index(f"{tag}-{i}-0")
        assert contents[at : at + per] == [f"{tag}-{i}-{j}" for j in range(per)]


# -- the Agents SDK's session --------------------------------------------------------------


def test_nous_session_of_two_processes_interleaves_and_survives_the_holders_kill(
    here: Here,
) -> None:
    """A child process holds a session through `NousSession`; this process's
    `NousSession` on the same id (no extra argument) writes and reads it through the
    child; both write at once, each `add_items` whole and in order, reads in either
    process see both; then the child is SIGKILLed and this process goes on, with every
    acknowledged item."""
    child = here.child()
    child.ask(op="add", sid="chat", tag="c0", n=1, per=2)
    nous = here.nous("chat")

    async def main() -> None:
        # Reads and writes while the child holds the session: nothing refused.
        assert [i["content"] for i in await nous.get_items()] == ["c0-0-0", "c0-0-1"]
        await nous.add_items([user("p0-0-0"), user("p0-0-1")])
        assert held_by(here, "chat") == child.pid
        assert child.ask(op="items", sid="chat") == ["c0-0-0", "c0-0-1", "p0-0-0", "p0-0-1"]
        # Both write at once.
        child.send(op="add", sid="chat", tag="c1", n=20, per=3)
        for i in range(20):
            await nous.add_items([user(f"p1-{i}-{j}") for j in range(3)])
        assert child.answer() is None
        mine = [i["content"] for i in await nous.get_items()]
        theirs = child.ask(op="items", sid="chat")
        assert mine == theirs
        assert len(mine) == 4 + 120
        batches_whole_and_in_order(mine, "c1", 20, 3)
        batches_whole_and_in_order(mine, "p1", 20, 3)
        assert held_by(here, "chat") == child.pid
        # A pop made here goes through the holder too.
        popped = await nous.pop_item()
        assert popped is not None
        assert popped["content"] == mine[-1]
        assert child.ask(op="items", sid="chat") == mine[:-1]
        # The holder is SIGKILLed: this process goes on with every acknowledged item.
        child.kill()
        await nous.add_items([user("after-0"), user("after-1")])
        assert [i["content"] for i in await nous.get_items()] == [
            *mine[:-1],
            "after-0",
            "after-1",
        ]
        assert held_by(here, "chat") == os.getpid()

    asyncio.run(main())


def test_nous_session_writes_from_both_processes_while_the_holder_is_killed(
    here: Here,
) -> None:
    """This process writes a session the child holds while the child writes it too, and
    the child is SIGKILLed mid-traffic: every `add_items` here returns (one in flight to
    the holder as it died is looked up by its call's id, and sent again only if it was
    not applied); the stored history holds each batch once, whole, in order."""
    child = here.child()
    child.ask(op="add", sid="chat", tag="c0", n=1, per=1)
    nous = here.nous("chat")
    acked: list[int] = []
    crashed: list[int] = []

    async def main() -> None:
        child.send(op="add", sid="chat", tag="c1", n=200, per=3)
        for i in range(60):
            if i == 20:
                child.kill()
            try:
                await nous.add_items([user(f"p-{i}-{j}") for j in range(3)])
            except SessionCrashed:
                crashed.append(i)
            else:
                acked.append(i)

    asyncio.run(main())
    assert crashed == []
    assert acked == list(range(60))
    contents = [i["content"] for i in asyncio.run(nous.get_items())]
    mine = [c for c in contents if c.startswith("p-")]
    assert mine == [f"p-{i}-{j}" for i in range(60) for j in range(3)]
    theirs = [c for c in contents if c.startswith("c1-")]
    assert len(theirs) % 3 == 0  # the child's batches whole too (a batch commits at once)
    assert held_by(here, "chat") == os.getpid()


def test_nous_session_pops_of_two_processes_each_pop_a_different_item(here: Here) -> None:
    """Both processes pop items of one session at once: each pop hides and returns a
    different item (a pop planned on a surface another process changed meanwhile is
    planned again), and the session ends empty."""
    child = here.child()
    child.ask(op="add", sid="chat", tag="c", n=40, per=1)
    nous = here.nous("chat")

    async def main() -> list[str]:
        child.send(op="pops", sid="chat", n=20)
        popped = []
        for _ in range(20):
            item = await nous.pop_item()
            assert item is not None
            popped.append(item["content"])
        return popped

    mine = asyncio.run(main())
    theirs = child.answer()
    assert sorted(mine + theirs) == sorted(f"c-{i}-0" for i in range(40))
    assert asyncio.run(nous.get_items()) == []
    assert child.ask(op="items", sid="chat") == []


# -- Google ADK's session service ----------------------------------------------------------


def test_adk_service_of_two_processes_shares_sessions_state_and_listings(here: Here) -> None:
    """A child process's `NousSessionService` holds an ADK session, its app and user
    state and its user's directory; this process's service (no extra argument) reads and
    writes them all through the child: events of both in one session, app- and
    user-state written in either seen in both, `list_sessions` listing the sessions of
    both; then the child is SIGKILLed and this process goes on."""
    child = here.child()
    service = here.service()
    assert (
        child.ask(op="create", user="u1", sid="s1", state={"k": 1, "app:a": 1, "user:u": 1})
        == "s1"
    )
    child.ask(op="append", user="u1", sid="s1", tag="c0", n=2)
    for key in ("adk/s/app/u1/s1", "adk/a/app", "adk/u/app/u1", "adk/d/app/u1"):
        assert held_by(here, key) == child.pid, key

    async def main() -> None:
        s1 = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert s1 is not None
        assert [e.content.parts[0].text for e in s1.events] == ["c0-0", "c0-1"]  # type: ignore[union-attr,index]
        assert s1.state == {"k": 1, "app:a": 1, "user:u": 1}
        await service.append_event(s1, adk_event("p0", {"k": 2, "app:a": 2, "user:u": 2}))
        # A session created here, for the same user (whose directory the child holds).
        await service.create_session(app_name="app", user_id="u1", session_id="s2")
        listed = await service.list_sessions(app_name="app", user_id="u1")
        assert sorted(s.id for s in listed.sessions) == ["s1", "s2"]
        assert child.ask(op="list", user="u1") == [["u1", "s1"], ["u1", "s2"]]
        got = child.ask(op="get", user="u1", sid="s1")
        assert got == {"texts": ["c0-0", "c0-1", "p0"], "state": {"k": 2, "app:a": 2, "user:u": 2}}
        assert child.ask(op="user_state", user="u1") == {"u": 2}
        # Both append to s1 at once.
        child.send(op="append", user="u1", sid="s1", tag="c1", n=15)
        s1 = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert s1 is not None
        for i in range(15):
            await service.append_event(s1, adk_event(f"p1-{i}"))
        assert child.answer() is None
        mine = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert mine is not None
        texts = [e.content.parts[0].text for e in mine.events]  # type: ignore[union-attr,index]
        assert child.ask(op="get", user="u1", sid="s1")["texts"] == texts
        assert [t for t in texts if t.startswith("c1-")] == [f"c1-{i}" for i in range(15)]  # type: ignore[union-attr]
        assert [t for t in texts if t.startswith("p1-")] == [f"p1-{i}" for i in range(15)]  # type: ignore[union-attr]
        assert held_by(here, "adk/s/app/u1/s1") == child.pid
        # The holder is SIGKILLed: this process goes on.
        child.kill()
        await service.append_event(mine, adk_event("after", {"user:u": 3}))
        again = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert again is not None
        assert [e.content.parts[0].text for e in again.events] == [*texts, "after"]  # type: ignore[union-attr,index]
        assert again.state["user:u"] == 3
        listed = await service.list_sessions(app_name="app", user_id="u1")
        assert sorted(s.id for s in listed.sessions) == ["s1", "s2"]
        assert held_by(here, "adk/s/app/u1/s1") == os.getpid()

    asyncio.run(main())


def test_adk_lookups_of_unknown_ids_from_another_process_stop_nothing(here: Here) -> None:
    """A lookup here of an id that is not created (or not yet) never stops the session in
    the process that holds it: the child's session goes on with its writes."""
    child = here.child()
    service = here.service()
    child.ask(op="create", user="u1", sid="s1", state={})

    async def main() -> None:
        child.send(op="append", user="u1", sid="s1", tag="c", n=30)
        for _ in range(30):
            assert (
                await service.get_session(app_name="app", user_id="u1", session_id="nope") is None
            )
        assert child.answer() is None
        s1 = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert s1 is not None
        assert [e.content.parts[0].text for e in s1.events] == [f"c-{i}" for i in range(30)]  # type: ignore[union-attr,index]

    asyncio.run(main())


def test_adk_lookups_here_never_fail_creates_in_the_holders_process(here: Here) -> None:
    """This process looks up ids while the child creates them: a lookup finds the
    session or ``None`` and never stops the child's session under its create (every
    create succeeds, nothing is sent again), and every session is found at the end."""
    child = here.child()
    service = here.service()
    sids = [f"s{i}" for i in range(40)]

    async def main() -> None:
        child.send(op="creates", user="u1", sids=sids)
        done: set[str] = set()
        for _ in range(3):
            for sid in sids:
                got = await service.get_session(app_name="app", user_id="u1", session_id=sid)
                if got is not None:
                    done.add(sid)
        assert child.answer() is None
        for sid in sids:
            assert await service.get_session(app_name="app", user_id="u1", session_id=sid)
        listed = await service.list_sessions(app_name="app", user_id="u1")
        assert sorted(s.id for s in listed.sessions) == sorted(sids)

    asyncio.run(main())


def test_adk_reads_of_a_session_another_process_holds_carry_only_new_events(
    here: Here,
) -> None:
    """Each `append_event` here to a session the child holds reads that session's log,
    its app and user state and its user's directory through the child: only the events
    appended since the last read cross (a read of the whole log at every call made 250
    appends cost 14 ms each at first and 148 ms each after 1,000), so the events read
    grow with the appends, not with their square."""
    child = here.child()
    service = here.service()
    child.ask(op="create", user="u1", sid="s1", state={})
    n = 200

    async def main() -> None:
        s1 = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert s1 is not None
        before = service._logs.fetched
        for i in range(n):
            await service.append_event(s1, adk_event(f"p{i}", {"k": i}))
        # Per append: its own event, and the directory's entry, read back; a checkpoint
        # now and then. The whole logs would be n * n / 2 events and more.
        assert service._logs.fetched - before <= 4 * n
        again = await service.get_session(app_name="app", user_id="u1", session_id="s1")
        assert again is not None
        assert [e.content.parts[0].text for e in again.events] == [f"p{i}" for i in range(n)]  # type: ignore[union-attr,index]
        assert again.state == {"k": n - 1}
        assert held_by(here, "adk/s/app/u1/s1") == child.pid

    asyncio.run(main())
    assert child.ask(op="get", user="u1", sid="s1")["state"] == {"k": n - 1}
