"""A walkthrough of the pure core: run ``python -m nous_actor.cli.tour``.

It builds one small session log, derives what the model sees, prunes an
oversized tool result, compacts the older turn into a summary, snapshots the
log and round-trips it through JSON Lines, printing each step. Timestamps are
fixed, so the output is the same on every run. Every fact it states is also
checked: the exit status is 0 only if all checks hold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from nous_actor.core.codec import from_jsonl, to_jsonl
from nous_actor.core.event import Event, Replace
from nous_actor.core.log import Log

__all__ = ["main"]

WIDTH = 79
T0 = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)

SYSTEM_PROMPT = "You are a careful coding assistant."
SUMMARY = (
    "Summary of turn 1: the user asked which files under src/ exceed 1 MB; "
    "`du -k src` showed src/data.bin (3072 kB) and src/model.pt (1436 kB)."
)
PRUNED = "[pruned: 400 lines of `du -k src`; over 1 MB: src/data.bin, src/model.pt]"


def _du_output() -> str:
    """A deterministic, oversized tool result: 400 lines of ``du -k`` output."""
    lines = [f"{(i * 37) % 900 + 4}\tsrc/pkg{i // 20:02d}/mod{i % 20:02d}.py" for i in range(398)]
    lines += ["3072\tsrc/data.bin", "1436\tsrc/model.pt"]
    return "\n".join(lines)


class _Clock:
    """Fixed timestamps: one second apart, starting at 2026-01-01 09:00 UTC."""

    def __init__(self) -> None:
        self._ticks = 0

    def __call__(self) -> datetime:
        t = T0 + timedelta(seconds=self._ticks)
        self._ticks += 1
        return t


class _Checks:
    """Records every fact the demo states, so a wrong one fails the run."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.total = 0

    def __call__(self, ok: bool, what: str) -> bool:
        self.total += 1
        if not ok:
            self.failed.append(what)
            print(f"  CHECK FAILED: {what}")
        return ok


# -- formatting ---------------------------------------------------------------------


def _clip(text: str, width: int) -> str:
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= width else text[: width - 3] + "..."


def _heading(number: int, title: str) -> None:
    line = f"{number}. {title}"
    print()
    print(line)
    print("-" * len(line))


def _para(text: str) -> None:
    """Print ``text`` wrapped at the page width, indented by two spaces."""
    print(textwrap.fill(text, WIDTH, initial_indent="  ", subsequent_indent="  "))


def _summary(data: Any) -> str:
    """What an event's data says, in one short line."""
    if not data:
        return "{}"
    parts: list[str] = []
    calls = data.get("tool_calls")
    if calls:
        parts.append(", ".join(f"-> {c['name']}({c['arguments']})" for c in calls))
    content = data.get("content")
    if isinstance(content, str):
        if content.count("\n") >= 3:
            lines = content.count("\n") + 1
            parts.append(f"<{lines} lines, {len(content):,} chars>")
        else:
            parts.append(repr(content))
    if data.get("tool_call_id"):
        parts.insert(0, f"[{data['tool_call_id']}]")
    return " ".join(parts)


def _show_surface(log: Log) -> None:
    """Print ``log.derive_messages()``, each with the seq and position it came from."""
    messages = log.derive_messages()
    print(f"  derive_messages(): {len(messages)} messages")
    print("    pos  seq  role       content")
    for ev, msg in zip(log.surface(), messages, strict=True):
        data = {"content": msg.content, "tool_calls": msg.tool_calls}
        if msg.tool_call_id:
            data["tool_call_id"] = msg.tool_call_id
        text = _clip(_summary(data), WIDTH - 25)
        print(f"    {ev.position:>3}  {ev.seq:>3}  {msg.role.value:<9}  {text}")


def _rows(*rows: tuple[str, object]) -> None:
    """Print label/value pairs as two aligned columns."""
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"    {label:<{width}}  {value}")


def _op_text(ev: Event) -> str:
    op = ev.surface_op
    return "" if op is None else f"replace {op.start}..{op.stop}"


def _shadowers(events: Sequence[Event]) -> dict[int, list[int]]:
    """For each seq, the seqs of the replaces that shadow it (the rule, written out).

    ``c`` is shadowed by ``r`` iff ``c.seq < r.seq`` and ``r.start <= position(c) <= r.stop``.
    """
    replaces = [(r.seq, r.surface_op) for r in events if r.surface_op is not None]
    return {
        c.seq: [seq for seq, op in replaces if c.seq < seq and op.start <= c.position <= op.stop]
        for c in events
    }


# -- the walkthrough ------------------------------------------------------------------


def _conversation() -> Iterator[tuple[str, dict[str, Any] | None]]:
    """Two turns: the first calls a tool whose result is far too large."""
    yield "system_message", {"content": SYSTEM_PROMPT}
    yield "turn_start", None
    yield "user_message", {"content": "Which files under src/ are larger than 1 MB?"}
    call = {"id": "call_1", "name": "shell", "arguments": json.dumps({"cmd": "du -k src"})}
    yield "assistant_message", {"content": None, "tool_calls": [call]}
    yield "tool_result", {"content": _du_output(), "tool_call_id": "call_1"}
    yield "assistant_message", {"content": "Two: src/data.bin (3 MB), src/model.pt (1.4 MB)."}
    yield "turn_end", None
    yield "turn_start", None
    yield "user_message", {"content": "Is src/data.bin safe to delete?"}
    yield "assistant_message", {"content": "Yes: `make data` regenerates it."}
    yield "turn_end", None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the walkthrough; return 0 if every fact it printed was checked true."""
    parser = argparse.ArgumentParser(
        prog="python -m nous_actor.cli.tour",
        description="A walkthrough of the nous_actor core: log, surface, replace, "
        "snapshot, JSON Lines. Takes no options.",
    )
    parser.parse_args(argv)
    check = _Checks()
    clock = _Clock()

    title = "nous_actor: the pure core in seven steps"
    print(title)
    print("=" * len(title))
    _para(
        "A Log is an immutable, append-only sequence of events. The messages a "
        "model sees (the surface) are derived from it by a fold. Pruning and "
        "compaction delete nothing: they append events that replace a range of "
        "positions, and the replaced events stay in the log until snapshot()."
    )

    # 1. append ---------------------------------------------------------------------
    _heading(1, "Append a conversation")
    _para("log.append(type, data, time) returns a new Log; the event's seq is count().")
    log = Log()
    for etype, data in _conversation():
        log = log.append(etype, data, clock())
    print()
    print("    seq  type               data")
    for ev in log.events():
        print(f"    {ev.seq:>3}  {ev.type.value:<17}  {_clip(_summary(ev.data), WIDTH - 28)}")
    check(log.count() == 11, "11 events appended")

    # 2. derive -----------------------------------------------------------------------
    _heading(2, "What the model sees")
    _show_surface(log)
    _para(
        "turn_start and turn_end are bookkeeping: they stay in the log but project "
        "to no message. to_openai() turns each message into a provider dict."
    )
    messages = log.derive_messages()
    check(len(messages) == 7, "7 messages before pruning")
    check(
        messages[2].to_openai()["tool_calls"][0]["function"]["name"] == "shell",
        "to_openai() carries the tool call",
    )

    # 3. prune --------------------------------------------------------------------------
    _heading(3, "Prune the oversized tool result in place")
    big = log.events()[4]
    _para(
        f"The tool result at seq 4 is {len(big.data['content']):,} chars. Append a "
        "short tool_result with surface_op=Replace(4, 4): it shadows position 4 and "
        "stands there itself."
    )
    before_prune = log
    log = log.append(
        "tool_result",
        {"content": PRUNED, "tool_call_id": "call_1", "surface_op": Replace(4, 4)},
        clock(),
    )
    print()
    _show_surface(log)
    pruned = log.derive_indexed()
    check([seq for seq, _ in pruned] == [0, 2, 3, 11, 5, 8, 9], "seq 11 stands at position 4")
    check(pruned[3][1].tool_call_id == "call_1", "the pruned result still answers call_1")
    _para(
        "The old value is untouched: before_prune.derive_messages() still holds "
        f"the {len(big.data['content']):,}-char output. Every Log is a value."
    )
    check(before_prune.derive_messages() == messages, "the log before pruning is unchanged")

    # 4. compact ------------------------------------------------------------------------
    _heading(4, "Compact turn 1 into a summary")
    _para(
        "Append one system_message with surface_op=Replace(1, 6): it shadows "
        "positions 1..6 (the whole first turn, the pruned result at position 4 "
        "included) and stands at position 1, after the system prompt, not at the end."
    )
    print()
    print("  before:")
    _show_surface(log)
    log = log.append("system_message", {"content": SUMMARY, "surface_op": Replace(1, 6)}, clock())
    print("  after:")
    _show_surface(log)
    compacted = log.derive_indexed()
    check([seq for seq, _ in compacted] == [0, 12, 8, 9], "surface after compaction: 0, 12, 8, 9")
    check(compacted[1][1].content == SUMMARY, "the summary is the second message")

    # 5. events ------------------------------------------------------------------------
    _heading(5, "events(): nothing was deleted")
    shadowers = _shadowers(log.events())
    print("    seq  type               pos  surface_op      shadowed by")
    for ev in log.events():
        by = ", ".join(str(s) for s in shadowers[ev.seq]) or "-"
        print(f"    {ev.seq:>3}  {ev.type.value:<17}  {ev.position:>3}  {_op_text(ev):<14}  {by}")
    shadowed = sorted(seq for seq, by in shadowers.items() if by)
    _para(
        f"events() holds all {len(log.events())} events; {len(shadowed)} are shadowed "
        "(4 by two replaces). The pruning replace 11 is one of them: any event "
        "can be shadowed, replaces and bookkeeping included."
    )
    check(len(log.events()) == log.count() == 13, "events() holds all 13 events")
    check(shadowed == [1, 2, 3, 4, 5, 6, 11], "shadowed: 1..6 and 11")

    # 6. snapshot ------------------------------------------------------------------------
    _heading(6, "snapshot(): drop what is shadowed")
    snap = log.snapshot()
    kept = [ev.seq for ev in snap.events()]
    dropped = sorted(set(range(log.count())) - set(kept))
    same_surface = snap.derive_indexed() == log.derive_indexed()
    next_seq = snap.append("user_message", {"content": "Thanks."}, clock()).events()[-1].seq
    _rows(
        ("retained events", f"{len(log.events())} -> {len(snap.events())}"),
        ("count()", f"{log.count()} -> {snap.count()}"),
        ("kept seqs", kept),
        ("dropped seqs", dropped),
        ("derive_indexed()", "unchanged" if same_surface else "CHANGED"),
        ("next append", f"seq {next_seq}"),
    )
    _para(
        "count() is the next seq, so it does not shrink; surviving events keep "
        "their seqs, leaving gaps where the dropped ones were."
    )
    check(snap.count() == log.count(), "count() unchanged by snapshot")
    check(dropped == shadowed, "snapshot dropped exactly the shadowed events")
    check(same_surface, "surface unchanged by snapshot, seqs included")
    check(next_seq == 13, "the next append after the snapshot gets seq 13")

    # 7. JSON Lines ----------------------------------------------------------------------
    _heading(7, "Export to JSON Lines and read it back")
    text = to_jsonl(snap)
    for line in text.splitlines():
        print("    " + _clip(line, WIDTH - 4))
    back = from_jsonl(text)
    same_messages = back.derive_messages() == snap.derive_messages()
    full_back = from_jsonl(to_jsonl(log))
    marker = '"surface_op":["replace",1,6]'
    _para(
        f"One record a line: seq, type, time (ISO-8601, microseconds, offset) and "
        f"data; the summary at seq 12 carries {marker}."
    )
    print()
    _rows(
        ("from_jsonl(to_jsonl(snap)) == snap", back == snap),
        ("same count(), same seqs with gaps", back.count() == snap.count()),
        ("same derive_messages()", same_messages),
        (f"full log ({log.count()} lines) round trip", full_back == log),
    )
    check(marker in text.splitlines()[-1], "the replace is persisted as a JSON list")
    check(back == snap, "snapshot round trip is equal")
    check(back.count() == snap.count(), "round trip keeps count()")
    check(same_messages, "round trip keeps the surface")
    check(full_back == log, "full log round trip is equal")

    print()
    if check.failed:
        print(f"{len(check.failed)} of {check.total} checks FAILED.")
        return 1
    print(f"All {check.total} checks passed.")
    return 0


def _run() -> int:
    """``main()`` for the command line: quiet when the reader closes the pipe (``| head``),
    an error when standard output is closed (the walkthrough would go nowhere)."""
    if sys.stdout is None:
        if sys.stderr is not None:
            print(
                "python -m nous_actor.cli.tour: standard output is closed; redirect it to a file "
                "or /dev/null instead of closing it",
                file=sys.stderr,
            )
        return 1
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(_run())
