"""NousSession used as a user would from several worker processes on one store: what
another process wrote between two calls of this one is taken into account (a cleared
marker written elsewhere is replaced by the next add_items here, as a local one is).

The other process is real (a child interpreter with a registry of its own on the SQLite
file); its call goes to the session where this process holds it. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from bounds import INTERPRETER_BOUND, run

from nous_actor import Sessions, SQLiteStore
from nous_actor.integrations.openai_agents import NousSession

OTHER_PROCESS = """
import asyncio, sys
from nous_actor.integrations.openai_agents import NousSession

async def main():
    session = NousSession.sqlite(sys.argv[2], sys.argv[1])
    try:
        if sys.argv[3] == "clear":
            await session.clear_session()
        else:
            print(repr(await session.pop_item()), flush=True)
    finally:
        session.close()

asyncio.run(main())
"""


async def in_other_process(path: Path, session_id: str, call: str) -> str:
    """Run ``call`` (``clear`` or ``pop``) on the session from a child process; its output."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        OTHER_PROCESS,
        str(path),
        session_id,
        call,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), INTERPRETER_BOUND)
    assert child.returncode == 0, err.decode()
    return out.decode()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_marker_cleared_in_another_process_is_replaced_by_the_next_add(
    tmp_path: Path,
) -> None:
    """This process adds items, another process clears the session (or pops its only
    item), then this process adds again: the surface holds only the new items, no
    cleared marker before them (as when the clear was made here), and get_items agrees
    with it."""
    path = tmp_path / "chat.db"

    async def body() -> None:
        store = SQLiteStore(path)
        registry = Sessions(store, timeout=20)
        session = NousSession("s", registry)
        try:
            await session.add_items([user("a"), user("b")])
            await in_other_process(path, "s", "clear")
            await session.add_items([user("c")])
            handle = await session.open()
            messages = await handle.derive_messages()
            assert [(m.role.value, m.content) for m in messages] == [("user", "c")]
            assert await session.get_items() == [user("c")]
            popped = await in_other_process(path, "s", "pop")
            assert popped.strip() == repr(user("c"))
            await session.add_items([user("d")])
            messages = await handle.derive_messages()
            assert [(m.role.value, m.content) for m in messages] == [("user", "d")]
            assert await session.get_items() == [user("d")]
        finally:
            session.close()
            await registry.aclose()
            store.close()

    run(body())
