"""A holder that lets its sessions go while other processes call them through it.

A web worker recycled (``uvicorn --limit-max-requests``, a deploy) closes its
registry and exits at once, while other workers' calls to its sessions are in
flight. Its endpoint says goodbye on each connection (`GOODBYE`): the calls it
took are answered as they complete, the later ones go where the session is next.
No caller hears `CallOutcomeUnknown` (meant for a holder that died before
answering) for a call that was never taken, and every acknowledged append is
stored once, in order.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from bounds import BOUND, SLOW_BOUND, end_child

from nous_actor import Sessions, SQLiteStore

SESSIONS = 20
PACE = 0.02
"""Seconds between two requests of one caller thread: web traffic, which keeps coming
while the holder exits (calls back to back all wait for the move together instead)."""
AFTER = 10
"""Requests each caller thread makes after the holder exited."""


_HOLDER = """
import sys
from nous_actor import Sessions, SQLiteStore
store = SQLiteStore(sys.argv[1])
sessions = Sessions(store)
for i in range({n}):
    sessions.open(f"u{{i}}").append("user_message", {{"content": "hello"}}).get()
print("held", flush=True)
sys.stdin.readline()
sessions.close()  # while the callers' calls are in flight
store.close()
"""  # (and the process ends at once, as a recycled web worker's does)


def test_a_holder_that_closes_and_exits_under_forwarded_calls_fails_none(
    tmp_path: Path,
) -> None:
    """20 threads append through forwarding to 20 sessions a child process holds, a
    request every 20 ms each; the child closes its registry and exits at once: every
    call is acknowledged (those in flight as it exited failed with `CallOutcomeUnknown`,
    though it never took them: 3 to 20 a run), and each session holds exactly the
    acknowledged appends, in order."""
    path = tmp_path / "web.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(n=SESSIONS), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        assert holder.stdout.readline() == "held\n"
        acked: dict[str, list[tuple[int, str]]] = {f"u{i}": [] for i in range(SESSIONS)}
        errors: list[BaseException] = []
        started = threading.Barrier(SESSIONS + 1, timeout=SLOW_BOUND)
        exited = threading.Event()
        paced = threading.Event()
        with Sessions(SQLiteStore(path), timeout=SLOW_BOUND) as callers:

            def call(sid: str) -> None:
                chat = callers.open(sid)
                k, after = 0, 0
                try:
                    while after < AFTER:
                        content = f"m{k}"
                        acked[sid].append(
                            (chat.append("user_message", {"content": content}).get().seq, content)
                        )
                        k += 1
                        if k == 10:
                            started.wait()
                        if exited.is_set():
                            after += 1
                        paced.wait(PACE)  # (never set: the pace of the next request)
                except BaseException as exc:
                    errors.append(exc)
                    if k < 10:
                        started.abort()

            threads = [threading.Thread(target=call, args=(sid,)) for sid in acked]
            for t in threads:
                t.start()
            started.wait()  # every thread is calling through the holder now
            holder.stdin.write("close\n")
            holder.stdin.flush()
            assert holder.wait(timeout=SLOW_BOUND) == 0
            exited.set()
            for t in threads:
                t.join(SLOW_BOUND * 2)
            assert not any(t.is_alive() for t in threads)
            assert errors == []
            for sid, mine in acked.items():
                stored = callers.read(sid).events().get(timeout=BOUND)
                assert [(e.seq, e.data["content"]) for e in stored] == [(0, "hello"), *mine]
                assert [seq for seq, _ in mine] == list(range(1, len(mine) + 1))
    finally:
        end_child(holder, BOUND)
