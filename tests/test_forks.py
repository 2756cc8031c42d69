"""A process forked after it made a registry (``gunicorn --preload``, Celery's prefork
pool, ``multiprocessing``'s ``fork``): what the child inherited refuses at once, saying
to make it again after the fork; what the child makes works (its calls to the parent's
sessions go to the parent); the child exits without waiting for the parent's sessions;
and the parent goes on, its store untouched by the child.

Each case is a real program that forks (never this test process, whose threads would be
copied); every wait on it is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

WAIT = 120.0
"""How long the test waits for the program at all (a hang fails, never blocks the suite)."""

TIMEOUT = 30.0
"""The registries' bound in the program: a refusal that waited it out took this long."""

_PROGRAM = """
import json, os, sys, time
from nous_actor import Sessions, SessionStopped, StoreError
{imports}

def store():
    return {store}

sessions = Sessions(store(), timeout={timeout})
chat = sessions.open("held-by-parent")
chat.append("user_message", {{"content": "before the fork"}}).get()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    out = {{}}
    t = time.monotonic()
    attempts = [
        ("open", lambda: sessions.open("child-chat")),
        ("read", lambda: sessions.read("held-by-parent")),
        ("handle", lambda: chat.append("user_message", {{"content": "lost"}}).get()),
        ("store", lambda: sessions.store.load("held-by-parent")),
    ]
    for name, attempt in attempts:
        try:
            attempt()
            out[name] = "worked"
        except (SessionStopped, StoreError) as exc:
            out[name] = f"{{type(exc).__name__}}: {{exc}}"
    out["refused_in"] = time.monotonic() - t
    # What the refusal says to do: a registry and a store made after the fork.
    own = Sessions(store(), timeout={timeout})
    mine = own.open("child-chat")
    out["own"] = mine.append("user_message", {{"content": "child"}}).get().seq
    theirs = own.open("held-by-parent")  # held by the parent: called there
    out["forwarded"] = theirs.append("user_message", {{"content": "from the child"}}).get().seq
    own.close()
    sessions.close()  # the inherited copy: nothing of the parent's is touched
    os.write(w, json.dumps(out).encode())
    os.close(w)
    sys.exit(0)  # a normal exit: the exit hooks run
os.close(w)
chunks = []
while chunk := os.read(r, 65536):
    chunks.append(chunk)
t = time.monotonic()  # the child closed its end: it is exiting now
_, status = os.waitpid(pid, 0)
exit_s = time.monotonic() - t
after = chat.append("user_message", {{"content": "after the fork"}}).get().seq
contents = [m.content for m in chat.derive_messages().get()]
sessions.close()
print(json.dumps({{
    "child": json.loads(b"".join(chunks) or b"null"), "status": status, "exit_s": exit_s,
    "after": after, "contents": contents,
}}))
"""


def _run(program: str) -> dict[str, Any]:
    """Run ``program``; what its last line printed (JSON)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(program)],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["child"] is not None, proc.stderr  # (the child wrote what it saw)
    return result


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_forked_child_refuses_what_it_inherited_and_uses_what_it_makes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Any
) -> None:
    """Forked after its parent made a registry and opened a session: in the child the
    registry, the handle and the store refuse at once (`SessionStopped`, `StoreError`)
    naming the parent and what to do, where each waited out its whole bound; a registry
    the child makes works, and its call to the parent's session is applied there; the
    child exits at once (it waited 30 s for commits of the parent's sessions); the
    parent's session has every event, and its store still works after the child is gone
    (a PostgreSQL connection the child closed would be closed for the parent too)."""
    if kind == "sqlite":
        imports, store = "from nous_actor import SQLiteStore", repr(str(tmp_path / "f.db"))
        store = f"SQLiteStore({store})"
    else:
        pg = request.getfixturevalue("pg_stores")
        imports = "from nous_actor.store.postgres import PostgresStore"
        store = f"PostgresStore({pg.dsn!r}, schema={pg.schema!r})"
    result = _run(_PROGRAM.format(imports=imports, store=store, timeout=TIMEOUT))
    child = result["child"]
    for name, kind_of in (
        ("open", "SessionStopped"),
        ("read", "SessionStopped"),
        ("handle", "SessionStopped"),
        ("store", "StoreError"),
    ):
        said = child[name]
        assert said.startswith(f"{kind_of}: "), (name, said)
        assert "was forked from it" in said, said
        assert "after the fork" in said, said
    assert child["refused_in"] < TIMEOUT / 3  # at once, not at the end of a bound
    assert (child["own"], child["forwarded"]) == (0, 1)
    assert result["status"] == 0
    assert result["exit_s"] < TIMEOUT / 3
    assert result["after"] == 2
    assert result["contents"] == ["before the fork", "from the child", "after the fork"]


_AGENTS_PROGRAM = """
import asyncio, json, os, sys
from nous_actor import SessionStopped
from nous_actor.integrations.openai_agents import NousSession

path = {path!r}
before = NousSession.sqlite("parent", path)
asyncio.run(before.add_items([{{"role": "user", "content": "before the fork"}}]))
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    out = {{}}
    try:
        asyncio.run(before.get_items())
        out["inherited"] = "worked"
    except SessionStopped as exc:
        out["inherited"] = f"SessionStopped: {{exc}}"
    mine = NousSession.sqlite("child", path)  # made in the child: a registry of its own
    asyncio.run(mine.add_items([{{"role": "user", "content": "child"}}]))
    theirs = NousSession.sqlite("parent", path)  # held by the parent: called there
    asyncio.run(theirs.add_items([{{"role": "assistant", "content": "from the child"}}]))
    out["mine"] = asyncio.run(mine.get_items())
    mine.close(); theirs.close()
    os.write(w, json.dumps(out).encode())
    os.close(w)
    sys.exit(0)
os.close(w)
chunks = []
while chunk := os.read(r, 65536):
    chunks.append(chunk)
_, status = os.waitpid(pid, 0)
items = asyncio.run(before.get_items())
before.close()
print(json.dumps({{"child": json.loads(b"".join(chunks) or b"null"), "status": status,
                  "items": items}}))
"""


def test_the_agents_sessions_registry_is_made_again_in_a_forked_child(tmp_path: Any) -> None:
    """`NousSession.sqlite` shares one registry per file in a process: in a child forked
    after its parent used it, a session made before the fork refuses at once, and one
    made in the child gets a registry of the child's own (its call to the parent's
    session goes to the parent)."""
    pytest.importorskip("agents")
    result = _run(_AGENTS_PROGRAM.format(path=str(tmp_path / "agents.db")))
    child = result["child"]
    assert child["inherited"].startswith("SessionStopped: "), child["inherited"]
    assert "was forked from it" in child["inherited"]
    assert child["mine"] == [{"role": "user", "content": "child"}]
    assert result["status"] == 0
    assert result["items"] == [
        {"role": "user", "content": "before the fork"},
        {"role": "assistant", "content": "from the child"},
    ]


_REGISTRY_PROGRAM = """
import json, os, sys, threading, time
import pykka
from nous_actor import Sessions, SQLiteStore
from nous_actor.runtime import forks

sessions = Sessions(SQLiteStore({path!r}))
chat = sessions.open("held-by-parent")
chat.append("user_message", {{"content": "before the fork"}}).get()
ours = [ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all()]
class Plain(pykka.ThreadingActor):  # an actor of the user's own, on Pykka's thread
    def on_receive(self, message):
        return message
plain = Plain.start()
session_ref = next(
    r for r in pykka.ActorRegistry.get_all() if r.actor_class.__name__ == "SessionActor"
)
# A thread of the parent holds Pykka's registry lock and every lock of the library's
# modules (its futures', its flags', its stores' tables...) as the process forks.
held, release = threading.Event(), threading.Event()
def hold():
    with pykka.ActorRegistry._actor_refs_lock:
        for lock in forks._locks:
            lock.acquire()
        held.set()
        release.wait(30)
        for lock in forks._locks:
            lock.release()
holder = threading.Thread(target=hold, daemon=True)
holder.start()
held.wait(30)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    out = {{}}
    t = time.monotonic()
    out["listed"] = sorted(ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all())
    try:
        session_ref.tell("anything")
        out["tell"] = "accepted"
    except pykka.ActorDeadError:
        out["tell"] = "ActorDeadError"
    pykka.ActorRegistry.unregister(plain)  # (the user's own: theirs to deal with)
    pykka.ActorRegistry.stop_all(timeout=5)
    own = Sessions(SQLiteStore({path!r}))
    mine = own.open("child-chat")
    out["own"] = mine.append("user_message", {{"content": "child"}}).get(timeout=10).seq
    theirs = own.open("held-by-parent")  # forwarded to the parent
    out["forwarded"] = theirs.append("user_message", {{"content": "child"}}).get(timeout=10).seq
    out["listed_own"] = sorted(ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all())
    own.close()
    out["took"] = time.monotonic() - t
    os.write(w, json.dumps(out).encode())
    os.close(w)
    os._exit(0)
os.close(w)
release.set()
chunks = []
while chunk := os.read(r, 65536):
    chunks.append(chunk)
_, status = os.waitpid(pid, 0)
after = chat.append("user_message", {{"content": "after the fork"}}).get(timeout=10).seq
listed = sorted(ref.actor_class.__name__ for ref in pykka.ActorRegistry.get_all())
plain.stop()
sessions.close()
print(json.dumps({{"child": json.loads(b"".join(chunks) or b"null"), "status": status,
                  "after": after, "ours": sorted(ours), "listed": listed}}))
"""


def test_a_forked_child_sees_none_of_its_parents_actors_in_pykkas_registry(
    tmp_path: Any,
) -> None:
    """In a child forked while its parent ran a registry (a thread of the parent holding
    Pykka's registry lock and every module lock of the library at that moment: the child
    hung at its first use of one), Pykka's registry lists none of the parent's actors of
    this library (they have no thread in the child): ``stop_all`` returns at once where
    it waited for ever on them, a message to the parent's session actor fails with
    `pykka.ActorDeadError` at once, and the child's own registry and session work (a call
    to the parent's session is forwarded there) and are listed; the parent's actors are
    untouched."""
    result = _run(_REGISTRY_PROGRAM.format(path=str(tmp_path / "f.db")))
    child = result["child"]
    assert result["ours"] == ["RegistryActor", "SessionActor"]
    assert child["listed"] == ["Plain"]  # the user's own thread actor stays Pykka's
    assert child["tell"] == "ActorDeadError"
    assert (child["own"], child["forwarded"]) == (0, 1)
    assert child["listed_own"] == ["RegistryActor", "SessionActor"]
    assert child["took"] < TIMEOUT / 3
    assert result["status"] == 0
    assert result["after"] == 2
    assert result["listed"] == ["Plain", "RegistryActor", "SessionActor"]
