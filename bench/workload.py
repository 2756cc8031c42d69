"""Deterministic workloads shaped like real agent sessions, and a log builder.

Every workload is generated from a seeded ``random.Random``: turns of
``turn_start``, ``user_message``, tool-using steps (``step_start``,
``request_header``, an ``assistant_message`` with a tool call, ``tool_call``,
``tool_result``, ``step_end``), a final answer and ``turn_end``. Compaction
appends replaces as the compactor of DESIGN.md §7 would: most prune one older
tool result in place (``Replace(p, p)``), the rest summarise everything from
position 1 (after the system prompt) up to the last ``keep`` events into one
``system_message``. Shared by every benchmark module that needs a session.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Final

from bench import harness as h
from nous_actor import Log, Replace

__all__ = ["Spec", "build", "realistic_specs", "summary_spec", "surface_only_specs", "text"]

Spec = tuple[str, dict[str, Any]]
"""An event to append: ``(type, data)``."""


_VOCABULARY: Final = (
    "the agent reads file config yaml returns error line column patch diff test passes fails "
    "summary of previous steps user asked to refactor module function class method value "
    "tokens budget context window tool output stack trace import path build cache result"
)
_WORDS: Final = _VOCABULARY.split()
_TEXT: Final = " ".join(random.Random(1).choice(_WORDS) for _ in range(3000))
_TOOLS: Final = ("read_file", "grep", "run_tests", "edit_file", "list_dir", "web_fetch")


def text(rng: random.Random, lo: int, hi: int) -> str:
    """A slice of filler prose, ``lo..hi`` characters long."""
    k = rng.randint(lo, hi)
    a = rng.randrange(0, len(_TEXT) - k)
    return _TEXT[a : a + k]


def _turns(rng: random.Random) -> Iterator[Spec]:
    """Plain events of an endless session, turn after turn (no replaces)."""
    turn = call = 0
    while True:
        turn += 1
        yield "turn_start", {"turn": turn}
        yield "user_message", {"content": text(rng, 40, 300)}
        for step in range(rng.randint(1, 4)):
            call += 1
            cid = f"call_{call}"
            tool = rng.choice(_TOOLS)
            yield "step_start", {"turn": turn, "step": step}
            yield (
                "request_header",
                {"model": "model-x", "input_tokens": rng.randint(1_000, 100_000), "stream": True},
            )
            yield (
                "assistant_message",
                {
                    "content": text(rng, 0, 200) or None,
                    "reasoning_content": text(rng, 50, 400),
                    "tool_calls": [
                        {
                            "id": cid,
                            "name": tool,
                            "arguments": json.dumps({"arg": text(rng, 5, 40)}),
                        }
                    ],
                },
            )
            yield "tool_call", {"id": cid, "name": tool, "status": "started"}
            yield (
                "tool_result",
                {"content": text(rng, 100, 2_000), "tool_call_id": cid, "name": tool},
            )
            yield "step_end", {"turn": turn, "step": step, "output_tokens": rng.randint(10, 900)}
        yield "step_start", {"turn": turn, "step": "final"}
        yield "request_header", {"model": "model-x", "input_tokens": rng.randint(1_000, 100_000)}
        yield "assistant_message", {"content": text(rng, 50, 600)}
        yield "step_end", {"turn": turn, "step": "final", "output_tokens": rng.randint(10, 900)}
        yield "turn_end", {"turn": turn}


def summary_spec(rng: random.Random, stop: int) -> Spec:
    """A summary ``system_message`` replacing positions ``1..stop``."""
    return (
        "system_message",
        {
            "content": f"Summary of positions 1..{stop}: " + text(rng, 200, 800),
            "surface_op": Replace(1, stop),
        },
    )


def realistic_specs(
    n: int, *, replace_every: int | None, summary_every: int = 4, keep: int = 60, seed: int = 0
) -> Iterator[Spec]:
    """``n`` events of a realistic session: a system prompt, then turns and compaction.

    Every ``replace_every``-th event is a replace (none if ``None``): every
    ``summary_every``-th of them summarises positions ``1..count-keep``, the
    others prune the oldest tool result not yet pruned or summarised (at least
    ten events old), falling back to a summary when there is none.
    """
    rng = random.Random(seed)
    plain = _turns(rng)
    tool_results: deque[tuple[int, str]] = deque()
    summarised = 0  # positions 1..summarised are covered by the latest summary
    replaces = 0
    yield "system_message", {"content": "You are a careful coding agent. " + text(rng, 200, 600)}
    for seq in range(1, n):
        if replace_every and seq % replace_every == 0:
            replaces += 1
            while tool_results and tool_results[0][0] <= summarised:
                tool_results.popleft()
            if replaces % summary_every and tool_results and tool_results[0][0] < seq - 10:
                p, cid = tool_results.popleft()
                yield (
                    "tool_result",
                    {
                        "content": "[tool output pruned]",
                        "tool_call_id": cid,
                        "surface_op": Replace(p, p),
                    },
                )
                continue
            if seq - keep > summarised:
                summarised = seq - keep
                yield summary_spec(rng, summarised)
                continue
        etype, data = next(plain)
        if etype == "tool_result":
            tool_results.append((seq, data["tool_call_id"]))
        yield etype, data


def surface_only_specs(n: int, *, seed: int = 0) -> Iterator[Spec]:
    """``n`` surface events, no bookkeeping, no replaces: the surface is the whole log."""
    rng = random.Random(seed)
    for seq in range(n):
        k = seq % 4
        if k == 0:
            yield "user_message", {"content": text(rng, 40, 300)}
        elif k == 1:
            cid = f"call_{seq}"
            yield (
                "assistant_message",
                {"content": None, "tool_calls": [{"id": cid, "name": "grep", "arguments": "{}"}]},
            )
        elif k == 2:
            yield (
                "tool_result",
                {"content": text(rng, 100, 1_000), "tool_call_id": f"call_{seq - 1}"},
            )
        else:
            yield "assistant_message", {"content": text(rng, 50, 400)}


def build(specs: Iterable[Spec], total: int, label: str) -> Log:
    """A log made by appending ``specs`` (``total`` of them) one by one; progress if large."""
    step = total // 10 if total >= 200_000 else 0
    log = Log()
    for i, (etype, data) in enumerate(specs):
        log = log.append(etype, data)
        if step and i and i % step == 0:
            h.progress(f"{label}: built {h.fmt_count(i)}/{h.fmt_count(total)} events")
    return log
