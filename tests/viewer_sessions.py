"""Sessions for the viewer's tests: a compacted one (turns, a pruned tool result, nested
summaries, a compaction record), a fork of it, a small one, and a long one."""

from __future__ import annotations

import json
from pathlib import Path

from nous_actor import Log
from nous_actor.store import SQLiteStore, Store

PRUNE_SEQ = 37  # the tool result put in place of seq 4
INNER_SUMMARY_SEQ = 38  # replaces positions 1..18
OUTER_SUMMARY_SEQ = 40  # replaces positions 1..30, the inner summary among them
FORK_THROUGH = 12


def compacted_log() -> Log:
    """41 events: a system prompt, six turns of user / tool call / tool result / answer,
    then a prune of seq 4, a summary of 1..18, a compaction record, a summary of 1..30."""
    log = Log().append("system_message", {"content": "You are helpful."})
    for i in range(6):
        log = log.append("turn_start", {"turn_id": f"t{i}", "owner": "agent", "policy": "enqueue"})
        log = log.append("user_message", {"content": f"question {i}"})
        call = {"id": f"c{i}", "name": "search", "arguments": json.dumps({"q": i})}
        log = log.append("assistant_message", {"content": None, "tool_calls": [call]})
        log = log.append(
            "tool_result", {"content": f"result {i} " + "x" * 80, "tool_call_id": f"c{i}"}
        )
        log = log.append("assistant_message", {"content": f"answer {i}"})
        log = log.append("turn_end", {"turn_id": f"t{i}", "how": "closed"})
    log = log.append(
        "tool_result",
        {"content": "[pruned]", "tool_call_id": "c0", "surface_op": ("replace", 4, 4)},
    )
    log = log.append(
        "system_message", {"content": "Summary of turns 0-2", "surface_op": ("replace", 1, 18)}
    )
    log = log.append(
        "step_end",
        {"step": "compaction", "estimate_before": 900, "estimate_after": 300, "pruned": [4]},
    )
    log = log.append(
        "system_message", {"content": "Summary of turns 0-4", "surface_op": ("replace", 1, 30)}
    )
    assert log.count() == OUTER_SUMMARY_SEQ + 1
    return log


def fill(store: Store) -> Log:
    """Write ``chat`` (the compacted session), ``chat-fork`` (its fork through seq 12) and
    ``hello`` (one message) into ``store``; returns the compacted log."""
    log = compacted_log()
    fork = log.as_of(FORK_THROUGH).append(
        "request_header", {"forked_from": {"session_id": "chat", "through_seq": FORK_THROUGH}}
    )
    hello = Log().append("user_message", {"content": "hello"})
    assert (
        store.write({"chat": log.events(), "chat-fork": fork.events(), "hello": hello.events()})
        == {}
    )
    return log


def sqlite_file(path: Path) -> Log:
    """A SQLite store at ``path`` holding `fill`'s sessions (closed again)."""
    store = SQLiteStore(path)
    try:
        return fill(store)
    finally:
        store.close()


def long_log(events: int, every: int) -> Log:
    """``events`` events; every ``every`` events a summary replaces everything before the
    last ten (each summary covering the one before it), and a tool result is pruned."""
    log = Log().append("system_message", {"content": "You are helpful."})
    k = 0
    while log.count() < events:
        n = log.count()
        if n % every == every - 1 and n > 20:
            log = log.append(
                "tool_result", {"content": "[pruned]", "surface_op": ("replace", n - 5, n - 5)}
            )
            log = log.append(
                "system_message", {"content": f"summary {k}", "surface_op": ("replace", 1, n - 10)}
            )
            k += 1
        elif n % 3 == 0:
            log = log.append("user_message", {"content": f"question {n}"})
        elif n % 3 == 1:
            log = log.append("assistant_message", {"content": f"answer {n}"})
        else:
            log = log.append("tool_result", {"content": f"result {n}", "tool_call_id": "c"})
    return log
